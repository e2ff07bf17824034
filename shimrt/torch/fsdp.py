"""FSDP2 under :func:`shimrt.torch.overlap`: the adapter :class:`~shimrt.torch.training.Overlap`
drives a model ``fully_shard`` made an FSDP2 module (its root) through.

FSDP2 all-gathers each group's parameters before its forward and backward and reduce-scatters
its gradients after, on the shard process group of each group's mesh information, read again
for every collective (``FSDPParamGroup._all_gather_process_group`` and
``_reduce_scatter_process_group``). So, as under DDP, a policy's communication is a
ProcessGroupNCCL over the same ranks with the policy's NCCL channels (:mod:`shimrt.torch.groups`),
set on every group between steps: no custom collective and no Python on FSDP2's path. FSDP2 runs
those collectives on streams of its own (all-gather and reduce-scatter, made at its first
forward at priority -1), not ProcessGroupNCCL's, so a policy's stream priority is given by
swapping them for streams of the greatest priority (and back for the plain job); the first step,
before FSDP2 made its streams, runs on FSDP2's. Gradients are divided as FSDP2 divides them: its
own reduce-scatter does it.

Refused, with the reason: an HSDP (2-D) mesh, CPU offload, ``reshard_after_forward`` as an int (its
post-forward mesh is another group's), and a torch whose FSDP2 keeps its groups elsewhere.
``windowed-carveout`` is not offered: FSDP2 sets its sharded gradients itself, after the
reduce-scatter, so no gradient hook marks the window's start.

torch internals touched: ``FSDPModule._get_fsdp_state()`` and its ``_fsdp_param_group`` (torch
2.11) or ``_fsdp_param_groups``; each group's ``mesh_info.shard_process_group`` (the move),
``_reduce_scatter_process_group``, ``post_forward_mesh_info``, ``fsdp_params[i].offload_to_cpu``,
``reduce_grads`` and ``comm_ctx.all_gather_stream``/``reduce_scatter_stream`` (the streams).
"""

from __future__ import annotations

from typing import Any

from .. import validate
from ..errors import UsageError
from .groups import one_cuda_device, require_nccl

__all__ = ["is_fsdp", "Fsdp"]


def is_fsdp(model: Any) -> bool:
    """Whether ``model`` is a module ``fully_shard`` made an FSDP2 module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def param_groups(model: Any) -> list[Any]:
    """Every FSDPParamGroup under ``model`` (its own and its submodules'), in module order; torch
    2.11 keeps one per module state (``_fsdp_param_group``), later versions a list."""
    from torch.distributed.fsdp import FSDPModule
    found: list[Any] = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            many = getattr(state, "_fsdp_param_groups", None)
            groups = list(many) if many is not None else [getattr(state, "_fsdp_param_group", None)]
            found += [g for g in groups if g is not None]
    return found


def moveable(groups: list[Any]) -> str | None:
    """Why the collectives of FSDPParamGroups ``groups`` cannot move to another process group
    (None: they can)."""
    for g in groups:
        info = g.mesh_info
        if getattr(info, "replicate_process_group", None) is not None:
            return "its HSDP (2-D) mesh (the replicas' all-reduce is not placed by a policy)"
        if not hasattr(info, "shard_process_group") or not hasattr(g, "_reduce_scatter_process_group"):
            return "this torch's FSDP2 keeps its process groups where shimrt does not set them"
        post = getattr(g, "post_forward_mesh_info", None)
        if post is not None and post is not info:
            return "reshard_after_forward as an int (its post-forward mesh is another group's)"
        if any(getattr(p, "offload_to_cpu", False) for p in getattr(g, "fsdp_params", ())):
            return "CPU offload (its gradients leave the GPU right after their reduce-scatter)"
    return None


def use(groups: list[Any], group: Any) -> None:
    """The all-gathers and reduce-scatters of FSDPParamGroups ``groups`` on ``group`` (the same
    ranks, in the same order) from their next collective: between steps, on every rank alike."""
    for g in groups:
        g.mesh_info.shard_process_group = group


class Fsdp:
    """An FSDP2 root module as :class:`~shimrt.torch.training.Overlap` drives it (the
    :class:`~shimrt.torch.placement.Wrapped` protocol)."""

    kind = "FSDP2"

    def __init__(self, model: Any):
        import torch
        import torch.distributed as dist
        self.model = model
        self.groups = param_groups(model)
        if not self.groups:
            raise UsageError("this FSDP2 module has no parameters to shard (fully_shard its submodules or itself)")
        self.group = self.groups[0].mesh_info.shard_process_group
        require_nccl(dist, self.group, "FSDP2")
        self.index = one_cuda_device({g.device for g in self.groups}, "every FSDP2 group")
        ranks = dist.get_process_group_ranks(self.group)
        for g in self.groups:
            if dist.get_process_group_ranks(g.mesh_info.shard_process_group) != ranks:
                raise UsageError("overlap() needs every FSDP2 module sharded over the same ranks")
        self._torch = torch
        self._own_streams: tuple[Any, Any] | None = None   # FSDP2's all-gather and reduce-scatter streams
        self._high_streams: tuple[Any, Any] | None = None  # shimrt's, of the greatest priority
        self._high = False

    def moveable(self) -> str | None:
        return moveable(self.groups)

    def use(self, group: Any, high: bool) -> None:
        use(self.groups, group)
        self._high = validate.boolean(high, "high")
        self.streams()

    def before_step(self) -> None:
        self.streams()

    def streams(self) -> None:
        """FSDP2's all-gather and reduce-scatter streams as the policy in force wants them: of
        the greatest priority, or FSDP2's own (once FSDP2 has made them, at its first forward)."""
        ctx = self.groups[0].comm_ctx
        current = (getattr(ctx, "all_gather_stream", None), getattr(ctx, "reduce_scatter_stream", None))
        if current[0] is None or current[1] is None:
            return
        if self._own_streams is None:
            self._own_streams = current
        wanted = self._own_streams
        if self._high:
            if self._high_streams is None:
                torch = self._torch
                greatest = min(torch.cuda.Stream.priority_range())  # lower is greater
                device = torch.device("cuda", self.index)
                self._high_streams = (torch.cuda.Stream(device=device, priority=greatest),
                                      torch.cuda.Stream(device=device, priority=greatest))
            wanted = self._high_streams
        if current != wanted:
            # Between steps: what ran on the streams before is waited for by the next step's copies
            # (FSDP2's events), and the new streams start after the current one.
            for s in wanted:
                s.wait_stream(self._torch.cuda.current_stream(self._torch.device("cuda", self.index)))
            ctx.all_gather_stream, ctx.reduce_scatter_stream = wanted

    def synced(self) -> bool:
        return all(getattr(g, "reduce_grads", True) for g in self.groups)

    def last_parameter(self) -> Any:
        return None
