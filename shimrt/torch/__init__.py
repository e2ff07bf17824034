"""PyTorch beside shimrt (``pip install 'shimrt[torch]'``): torch's work on shimrt's streams and
SM partitions, and cuBLAS told how many SMs to leave free.

- :func:`stream`: a shimrt Stream (a partition's, or one of a given priority) as a
  ``torch.cuda.ExternalStream``, so that ``with torch.cuda.stream(shimrt.torch.stream(s)):``
  runs torch's kernels there (on a partition's SMs, for a green context's stream);
- :func:`sm_carveout`: matmuls inside the block leave ``sms`` SMs free
  (``torch._C._set_sm_carveout_experimental``, where this torch has it, with cuBLASLt preferred:
  torch applies the carveout there only), both restored after;
- :func:`process_group_options`: torch.distributed's NCCL process group with its collectives on
  a stream of the greatest priority, for users who keep ProcessGroupNCCL (or DDP) rather than a
  shimrt Communicator;
- :class:`shimrt.overlap.interpose.Interposer` shapes torch's kernels themselves;
- :func:`overlap`: a DistributedDataParallel's all-reduces, or an FSDP2 model's all-gathers and
  reduce-scatters, beside its compute under a policy or
  auto: the policy's process group (stream priority, NCCL channels) and its compute side
  (:mod:`shimrt.torch.training`, DDP's and FSDP2's adapters :mod:`shimrt.torch.ddp` and
  :mod:`shimrt.torch.fsdp`; the policies: :mod:`shimrt.torch.policies`); :class:`Auto`, auto's
  options; :class:`Policy` and its compute sides (:class:`Shaping`, :class:`Partition`,
  :class:`Carveout`) for a policy of your own.

torch is imported when a function is called, never at shimrt's import.
"""

from __future__ import annotations

from .interop import process_group_options, sm_carveout, stream
from .policies import Auto, Carveout, Partition, Policy, Shaping
from .training import overlap

__all__ = ["stream", "sm_carveout", "process_group_options", "overlap", "Auto", "Policy", "Shaping", "Partition",
           "Carveout"]
