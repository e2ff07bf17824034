"""torch beside shimrt: a shimrt Stream as torch's, cuBLAS told how many SMs to leave free, and
ProcessGroupNCCL's high-priority streams (re-exported by :mod:`shimrt.torch`; the modules of this
package import them from here, never from the package, so no import loop runs through it).
torch is imported when a function is called, never at import."""

from __future__ import annotations

import contextlib
import datetime
from typing import Any, Iterator

from .. import validate
from ..errors import UsageError
from ..targets import MAX_SMS

__all__ = ["require_torch", "stream", "sm_carveout", "accumulation_across_streams", "process_group_options",
           "release_cached"]


def require_torch() -> Any:
    """torch, or a UsageError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise UsageError("shimrt.torch needs PyTorch: pip install 'shimrt[torch]'") from None
    return torch


def stream(s: Any) -> Any:
    """The shimrt Stream ``s`` as a ``torch.cuda.ExternalStream`` on its device (torch does not
    own it: keep ``s`` open while torch uses it)."""
    torch = require_torch()
    if not hasattr(s, "handle") or not hasattr(s, "device") or getattr(s, "closed", True):
        raise UsageError(f"stream() takes an open shimrt Stream, not {s!r:.100}")
    return torch.cuda.ExternalStream(s.handle, device=torch.device("cuda", s.device.index))


@contextlib.contextmanager
def sm_carveout(sms: int | None) -> Iterator[None]:
    """Matmuls launched inside the block leave ``sms`` SMs free (None: torch's default), as
    ``torch._C._set_sm_carveout_experimental`` sets it, with cuBLASLt as torch's preferred BLAS
    (torch applies the carveout on its cuBLASLt paths only); both are restored at the end.
    UsageError where this torch lacks the knob."""
    torch = require_torch()
    if sms is not None:
        sms = validate.integer(sms, "sms", least=0, most=MAX_SMS)
    setter = getattr(torch._C, "_set_sm_carveout_experimental", None)
    getter = getattr(torch._C, "_get_sm_carveout_experimental", None)
    if setter is None or getter is None:
        raise UsageError(f"torch {torch.__version__} has no SM carveout for cuBLAS "
                         "(torch._C._set_sm_carveout_experimental)")
    # torch applies the carveout on its cuBLASLt paths only; plain matmuls (bf16 Linear without a
    # bias) go through cuBLAS unless cuBLASLt is preferred, so it is, inside the block.
    prefer = getattr(torch.backends.cuda, "preferred_blas_library", None)
    previous, previous_blas = getter(), prefer() if prefer is not None else None
    setter(sms)
    if prefer is not None and sms is not None:
        prefer("cublaslt")
    try:
        yield
    finally:
        setter(previous)
        if prefer is not None:
            prefer(previous_blas)


@contextlib.contextmanager
def accumulation_across_streams() -> Iterator[None]:
    """A backward inside the block may run on another stream than its parameters' gradient
    accumulators (a partition's compute under DDP, whose reducer keeps each parameter's
    AccumulateGrad node from its construction, on the stream current then): torch then has each
    accumulation wait on the producing stream and run on the accumulator's, which is correct,
    and warns once that DDP should be made on the stream of the forwards, which a user of
    ``partition:K`` cannot do. The warning is off inside the block and set back as it was after
    (where this torch cannot say how it was set, to torch's default: on); a torch without the
    switch warns as it does."""
    torch = require_torch()
    setter = getattr(torch._C, "_set_warn_on_accumulate_grad_stream_mismatch", None)
    if setter is None:
        yield
        return
    getter = getattr(torch._C, "_warn_on_accumulate_grad_stream_mismatch", None)  # private, as the setter
    previous = bool(getter()) if getter is not None else True
    setter(False)
    try:
        yield
    finally:
        setter(previous)


def process_group_options(high_priority: bool = True, ctas: int | None = None,
                          timeout: datetime.timedelta | None = None) -> Any:
    """Options for ``torch.distributed.init_process_group("nccl", pg_options=...)`` (or
    ``new_group``) that put ProcessGroupNCCL's collectives on streams of the greatest priority
    (its ``is_high_priority_stream``), as shimrt's Communicator does by default, and hold NCCL to
    ``ctas`` channels (None: NCCL's choice), as a policy's process group under DDP does. Give the
    ``timeout`` the group is made with, if not torch's default: the options carry one of their
    own, and torch warns where the two differ (the group's is used)."""
    require_torch()
    high_priority = validate.boolean(high_priority, "high_priority")
    import torch.distributed as dist

    from .groups import options
    return options(dist, "high" if high_priority else "low", ctas, timeout=timeout)


def release_cached() -> None:
    """Give the GPU back what torch caches and no tensor holds: the caching allocator's free
    blocks (of every stream: a stream's blocks serve that stream only) and cuBLAS's workspaces
    (one per handle and stream; torch makes the next on first use), as torch's own leak checks
    do. Only between steps: a workspace freed while a matmul is queued is freed stream-ordered.
    Process-wide: the caches of every model in the process go (each allocates afresh, once), and
    a CUDA graph captured before it that used a cuBLAS workspace of torch's would replay on memory
    given back (torch's own graph trees clear the workspaces before they capture)."""
    torch = require_torch()
    if not torch.cuda.is_initialized():
        return
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # private; absent: the workspaces stay
    if clear is not None:
        clear()
    torch.cuda.empty_cache()
