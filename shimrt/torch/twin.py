"""A twin of the user's DistributedDataParallel: the same module, ranks and buckets, with shimrt's
comm hook, so that auto can time hooked policies beside hookless DDP and leave the user's DDP
without any hook when plain DDP wins.

torch gives a DDP one comm hook for good: ``Reducer::register_comm_hook`` refuses a second and
nothing removes one. A hook also costs host time per bucket that hookless DDP does not pay (the
hook's Python, two GIL acquisitions, a CUDA future whose tensors torch extracts by pickling), and
DDP scales gradients while copying them into its buckets only when no hook is registered. So
the reference auto must beat is hookless DDP, and registering the hook is deferred until a policy
that needs it has won.

Two DDPs over one module take turns by whose forward runs: a reducer acts in backward only after
its own forward prepared the step (its autograd hooks return at once otherwise), so the user's
DDP stays hookless while :meth:`Twin.routed` sends one step's forward to the twin. The twin is
built like the user's DDP (its constructor's arguments, read back from the DDP; the parameters
are not broadcast again) and holds buckets of its own: one more copy of the gradients in GPU
memory while auto tries policies, freed by :meth:`Twin.close` once it decides.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

from ..errors import UsageError

#: DDP's constructor arguments the twin copies, as (argument, attribute of the DDP holding it).
_MIRRORED = (("device_ids", "device_ids"), ("output_device", "output_device"), ("dim", "dim"),
             ("process_group", "process_group"), ("find_unused_parameters", "find_unused_parameters"),
             ("gradient_as_bucket_view", "gradient_as_bucket_view"), ("static_graph", "static_graph"),
             ("skip_all_reduce_unused_params", "skip_all_reduce_unused_params"),
             ("batched_grad_copy", "batched_grad_copy"))


def unsupported(ddp: Any) -> str | None:
    """Why a twin of ``ddp`` would not train as ``ddp`` does (None: it would)."""
    if getattr(ddp, "mixed_precision", None) is not None:
        return "its mixed_precision (DDP's own parameter casts are not mirrored)"
    if getattr(ddp, "_delay_all_reduce_params", None):
        return "its delay_all_reduce_named_params"
    if getattr(ddp, "_use_python_reducer", False):
        return "torch.compile's Python reducer"
    if getattr(ddp, "reducer", None) is None:
        return "no reducer (every parameter's all-reduce is delayed)"
    return None


def constructor_arguments(ddp: Any, signature: inspect.Signature) -> dict:
    """The keyword arguments that build a DDP like ``ddp`` (those ``signature`` takes), without
    broadcasting the parameters again."""
    taken = signature.parameters
    out = {arg: getattr(ddp, attr) for arg, attr in _MIRRORED if arg in taken and hasattr(ddp, attr)}
    # Buffers synced in forward: forward_sync_buffers from torch 2.13, broadcast_buffers before.
    if "forward_sync_buffers" in taken and hasattr(ddp, "forward_sync_buffers"):
        out["forward_sync_buffers"] = ddp.forward_sync_buffers
    elif hasattr(ddp, "broadcast_buffers"):
        out["broadcast_buffers"] = ddp.broadcast_buffers
    # DDP's default (25 MiB and a small first bucket) only where the user's DDP took it.
    if not getattr(ddp, "bucket_bytes_cap_default", False):
        out["bucket_cap_mb"] = ddp.bucket_bytes_cap / 2**20
    caps = getattr(ddp, "bucket_bytes_cap_list", None)
    if caps and "bucket_cap_mb_list" in taken:
        out["bucket_cap_mb_list"] = [c / 2**20 for c in caps]
    if "init_sync" in taken:
        out["init_sync"] = False  # the module's parameters are the user's DDP's, already the same
    return out


class Twin:
    """A DDP like ``ddp`` over the same module, with ``hook(state, bucket)`` registered as its
    comm hook. Collective: every rank builds it at the same point (DDP's constructor checks the
    parameters' shapes across the ranks)."""

    def __init__(self, ddp: Any, state: Any, hook: Callable[[Any, Any], Any]):
        from torch.nn.parallel import DistributedDataParallel as DDP
        if (why := unsupported(ddp)) is not None:
            raise UsageError(f"auto cannot time its policies beside this DDP: {why}; give overlap() a fixed policy")
        self.ddp = ddp
        self.twin: Any = DDP(ddp.module, **constructor_arguments(ddp, inspect.signature(DDP.__init__)))
        self.twin.register_comm_hook(state, hook)

    @contextlib.contextmanager
    def routed(self) -> Iterator[None]:
        """The user's DDP's forward runs as the twin's inside the block (one step: forward and
        backward), so the twin's reducer, hook and buckets reduce that step; ``no_sync()`` on the
        user's DDP, entered before or inside the block, holds for the twin too."""
        twin, ddp = self.twin, self.ddp
        if twin is None:
            raise UsageError("the twin is closed")

        def forward(*inputs: Any, **kwargs: Any) -> Any:
            twin.require_backward_grad_sync = ddp.require_backward_grad_sync
            twin.require_forward_param_sync = ddp.require_forward_param_sync
            return twin.forward(*inputs, **kwargs)
        ddp.forward = forward  # an instance attribute: nn.Module.__call__ looks it up first
        try:
            yield
        finally:
            del ddp.forward

    def close(self) -> None:
        """Take the twin's autograd hooks off the parameters and let its buckets go."""
        twin, self.twin = self.twin, None
        if twin is not None and getattr(twin, "reducer", None) is not None:
            remove = getattr(twin.reducer, "_remove_autograd_hooks", None)
            if remove is not None:
                remove()
