"""DDP under :func:`shimrt.torch.overlap`: the adapter :class:`~shimrt.torch.training.Overlap`
drives a ``DistributedDataParallel`` through.

A policy's all-reduces run where DDP's reducer already sends them, through a process group, with
nothing of shimrt's on the path for a bucket: the DDP is pointed at a ProcessGroupNCCL over the
same ranks made with the policy's options (NCCL on streams of the greatest priority, its channels
held to the SMs the policy keeps for it; :mod:`shimrt.torch.groups`). No comm hook is registered,
so DDP keeps its C++ path, its gradient scaling into the buckets, and its host cost. ``no_sync()``
steps, DDP's bucket rebuild, ``gradient_as_bucket_view`` and sparse gradients are DDP's own and
need nothing more; ``mixed_precision``'s comm hook is DDP's own too, and all-reduces through the
reducer's process group, so it follows the move. Refused, with the reason: a DDP with any other
comm hook, Python (``register_comm_hook``) or built-in (``_register_builtin_comm_hook``; its
all-reduces run in the hook, out of a group's reach), one over another backend than NCCL, one
whose parameters span devices, and, for any policy but ``ddp``, one whose all-reduces cannot move
(:func:`moveable`: no C++ reducer, delayed all-reduces, a ``Join`` made for
it) or whose ranks are a sub-group of a device-bound world (:func:`shimrt.torch.groups.subgroup_refusal`).

torch internals touched: ``DDP.reducer._update_process_group`` and ``DDP.process_group`` (the
move), ``DDP._comm_hooks`` and ``DDP._get_ddp_logging_data()["comm_hook"]`` (hooks; its
``rebuilt_bucket_sizes``, what bench torch records of a DDP's buckets: :func:`bucket_bytes`),
``DDP._join_config`` (Join), ``DDP._use_python_reducer`` and ``_delay_all_reduce_params``, and the
default group's ``bound_device_id``.
"""

from __future__ import annotations

from typing import Any

from .. import validate
from ..errors import UsageError
from .groups import one_cuda_device, require_nccl

__all__ = ["Ddp", "settings", "bucket_bytes", "DEFAULT_BUCKET_MB"]

#: DDP's own bucket_cap_mb where none is given (it then makes the first bucket 1 MiB): what bench
#: torch cuts the gradients into where it builds its buckets itself.
DEFAULT_BUCKET_MB = 25


class Ddp:
    """A DDP as :class:`~shimrt.torch.training.Overlap` drives it (the
    :class:`~shimrt.torch.placement.Wrapped` protocol)."""

    kind = "DDP"

    def __init__(self, ddp: Any):
        import torch
        import torch.distributed as dist
        self.index = _check_ddp(torch, dist, ddp)
        self.ddp, self.group = ddp, ddp.process_group

    def moveable(self) -> str | None:
        return moveable(self.ddp)

    def use(self, group: Any, high: bool, symmetric: bool = False) -> None:
        # DDP's collectives run on ProcessGroupNCCL's own streams: the group's options carry ``high``.
        if symmetric:
            raise UsageError("a DDP all-gathers nothing: symmetric all-gather outputs are FSDP2's (zero-sm)")
        use(self.ddp, group)

    def refusal(self, policy: Any, ranks_per_gpu: int) -> str | None:
        if policy.prefetch is not None:
            return "prefetch is FSDP2's: a DDP has no parameters to all-gather ahead"
        if policy.no_reshard:
            return "no-reshard is FSDP2's: a DDP's parameters are never sharded"
        if policy.zero_sm:
            return ("zero-sm is FSDP2's: a DDP only all-reduces, which NCCL's copy engines cannot do (they copy, "
                    "they do not add)")
        if policy.window:
            try:
                self.last_parameter()
            except UsageError as exc:
                return str(exc)
        return None

    def prefetch(self, depth: int | None) -> None:
        if depth is not None:
            raise UsageError(f"prefetch is FSDP2's (it all-gathers parameters ahead); a DDP has none to prefetch, "
                             f"not prefetch={depth}")

    def keep_gathered(self, on: bool) -> None:
        if on:
            raise UsageError("no-reshard is FSDP2's (it keeps sharded parameters all-gathered); a DDP's parameters are "
                             "never sharded")

    def gathered_bytes(self) -> int:
        return 0

    def before_step(self) -> None:
        pass

    def synced(self) -> bool:
        return bool(self.ddp.require_backward_grad_sync)

    def last_parameter(self) -> Any:
        params = [p for p in self.ddp.module.parameters() if p.requires_grad]
        if not params:
            raise UsageError("this DDP's module has no parameter with requires_grad=True")
        return params[-1]


def _check_ddp(torch: Any, dist: Any, ddp: Any) -> int:
    """The CUDA device index of ``ddp``'s parameters; UsageError for what overlap() cannot take."""
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        raise UsageError(f"overlap() takes a torch.nn.parallel.DistributedDataParallel, not {validate.shown(ddp)}")
    require_nccl(dist, ddp.process_group, "a DDP")
    why = hook_refusal(ddp)
    if why:
        raise UsageError(f"this DDP has {why}: its all-reduces run in the hook, where a policy's process group "
                         "does not reach; overlap() needs a DDP without one")
    index = one_cuda_device({p.device for p in ddp.module.parameters()}, "every parameter")
    if ddp.device_ids and list(ddp.device_ids) != [index]:
        raise UsageError(f"the DDP's device_ids {ddp.device_ids} must be its parameters' device, [{index}]")
    return index


#: DDP's own comm hook for ``mixed_precision``: it all-reduces through the reducer's process group.
MIXED_PRECISION_HOOK = ("torch.distributed.algorithms.ddp_comm_hooks.mixed_precision_hooks",
                        "_reducer_allreduce_and_upcast_hook")


def hook_refusal(ddp: Any) -> str | None:
    """The comm hook that keeps ``ddp``'s all-reduces out of a policy's reach, said in words
    (None: none, or only ``mixed_precision``'s). A built-in (C++) hook is not in ``_comm_hooks``;
    DDP's logging data names Python and built-in hooks alike."""
    for hook, _state in getattr(ddp, "_comm_hooks", None) or []:
        if (getattr(hook, "__module__", None), getattr(hook, "__qualname__", None)) != MIXED_PRECISION_HOOK:
            return f"a comm hook ({getattr(hook, '__qualname__', hook)!s:.80}, register_comm_hook)"
    named = _logging_data(ddp).get("comm_hook")
    if named and not getattr(ddp, "_comm_hooks", None):
        return f"a built-in comm hook ({named}, _register_builtin_comm_hook)"
    return None


def moveable(ddp: Any) -> str | None:
    """Why ``ddp``'s all-reduces cannot be moved to another process group now (None: they can)."""
    reducer = getattr(ddp, "reducer", None)
    if reducer is None or getattr(ddp, "_use_python_reducer", False):
        return "it has no C++ reducer (torch.compile's Python reducer, or every all-reduce delayed)"
    if not hasattr(reducer, "_update_process_group"):
        return "this torch's reducer cannot change its process group (Reducer._update_process_group)"
    if getattr(ddp, "_delay_all_reduce_params", None):
        return "its delay_all_reduce_named_params (those all-reduces run outside the reducer)"
    if getattr(getattr(ddp, "_join_config", None), "enable", False):
        # torch's Join keeps the group it found when made, for its joined ranks' shadow all-reduces,
        # while the others follow the DDP's: a move inside its block leaves them waiting on two
        # groups. DDP keeps Join's config after the block, so a Join made at all counts.
        return ("a torch.distributed.algorithms.Join was made for it (Join keeps the process group it found; "
                "moving the DDP inside its block hangs the ranks that ran out of inputs); make the Join after "
                "auto has decided (ov.report()['policy'] is not None), or use a fixed policy")
    return None


def use(ddp: Any, group: Any) -> None:
    """Make ``group`` the process group of ``ddp`` and of its reducer. Call it between steps, on
    every rank at the same step. Unlike ``DDP._update_process_group`` the reducer's state is kept:
    the ranks are the same, so its buckets and their order still hold, and no rebuild (with its
    host synchronisation) falls into the next step."""
    if ddp.process_group is group:
        return
    ddp.reducer._update_process_group(group)
    ddp.process_group = group


def settings(ddp: Any) -> dict:
    """What of ``ddp`` a policy changes and puts back, as values two DDPs compare by (two over one
    group, neither under a policy, compare equal): its process group (its id; the reducer's follows
    it, :func:`use`) and how many comm hooks it has (a policy registers none)."""
    return {"group": id(ddp.process_group), "comm_hooks": len(getattr(ddp, "_comm_hooks", ()))}


def bucket_bytes(ddp: Any) -> list[int] | None:
    """The bytes of each of ``ddp``'s gradient buckets as its reducer built them after its first
    step (DDP's logging data), or as it made them at construction where it has not rebuilt them
    (one rank); None where this torch does not say."""
    data = _logging_data(ddp)
    said = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes")
    try:
        return [int(x) for x in str(said).split(",")] if said else None
    except ValueError:  # another torch's format: not a list of sizes
        return None


def _logging_data(ddp: Any) -> dict:
    """DDP's logging data (its comm hook's name, its buckets' sizes), {} where this torch has none."""
    logged = getattr(ddp, "_get_ddp_logging_data", None)
    return (logged() or {}) if callable(logged) else {}
