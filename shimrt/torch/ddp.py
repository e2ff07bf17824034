"""DDP under :func:`shimrt.torch.overlap`: the adapter :class:`~shimrt.torch.training.Overlap`
drives a ``DistributedDataParallel`` through.

A policy's all-reduces run where DDP's reducer already sends them, through a process group, with
nothing of shimrt's on the path for a bucket: the DDP is pointed at a ProcessGroupNCCL over the
same ranks made with the policy's options (NCCL on streams of the greatest priority, its channels
held to the SMs the policy keeps for it; :mod:`shimrt.torch.groups`). No comm hook is registered,
so DDP keeps its C++ path, its gradient scaling into the buckets, and its host cost. ``no_sync()``
steps, DDP's bucket rebuild, ``gradient_as_bucket_view`` and sparse gradients are DDP's own and
need nothing more; ``mixed_precision``'s comm hook is DDP's own too, and all-reduces through the
reducer's process group, so it follows the move. ``sequential`` (no overlap) leaves the reducer
out of a step instead: DDP's own ``no_sync`` switch, turned off for the forward of each synced
step and back on after it, and the gradients all-reduced on the DDP's process group once backward
has ended (one of DDP's bucket size or more alone, in place; the others in one flat all-reduce per
dtype), divided by the ranks first as DDP's are (:class:`AfterBackward`). Refused, with the reason: a DDP with any other
comm hook, Python (``register_comm_hook``) or built-in (``_register_builtin_comm_hook``; its
all-reduces run in the hook, out of a group's reach), one over another backend than NCCL, one
whose parameters span devices, and, for any policy but ``ddp``, one whose all-reduces cannot move
(:func:`moveable`: no C++ reducer, delayed all-reduces, a ``Join`` made for
it) or whose ranks are a sub-group of a device-bound world (:func:`shimrt.torch.groups.subgroup_refusal`).

torch internals touched: ``DDP.reducer._update_process_group`` and ``DDP.process_group`` (the
move), ``DDP._comm_hooks`` and ``DDP._get_ddp_logging_data()["comm_hook"]`` (hooks; its
``rebuilt_bucket_sizes``, what bench torch records of a DDP's buckets: :func:`bucket_bytes`),
``DDP._join_config`` (Join), ``DDP._use_python_reducer`` and ``_delay_all_reduce_params``, and the
default group's ``bound_device_id``; under ``sequential``, ``DDP.require_backward_grad_sync`` and
``require_forward_param_sync`` (``no_sync``'s switch, and DDP's note to broadcast its buffers at
the next forward, set as a synced step leaves it), ``DDP._module_parameters``, ``mixed_precision``,
``buffer_hook`` and a parameter's ``_in_backward_optimizers`` (refusals), and the autograd
engine's ``queue_callback`` (what DDP's and FSDP's own end-of-backward work is queued with).
"""

from __future__ import annotations

from typing import Any

from .. import validate
from ..errors import UsageError
from .groups import one_cuda_device, require_nccl

__all__ = ["Ddp", "AfterBackward", "settings", "bucket_bytes", "DEFAULT_BUCKET_MB", "reduced_params", "alone",
           "flat_bytes"]

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
        self.deferred: AfterBackward | None = None  # while sequential is in force

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
        if policy.sequential:
            return after_backward_refusal(self.ddp)
        return None

    def after_backward(self, on: bool) -> None:
        if validate.boolean(on, "on") and self.deferred is None:
            self.deferred = AfterBackward(self.ddp)
        elif not on and self.deferred is not None:
            deferred, self.deferred = self.deferred, None
            deferred.close()

    def prefetch(self, depth: int | None) -> None:
        if depth is not None:
            raise UsageError(f"prefetch is FSDP2's (it all-gathers parameters ahead); a DDP has none to prefetch, "
                             f"not prefetch={depth}")

    def keep_gathered(self, on: bool) -> None:
        if on:
            raise UsageError("no-reshard is FSDP2's (it keeps sharded parameters all-gathered); a DDP's parameters are "
                             "never sharded")

    def held_bytes(self, policy: Any) -> int:
        return flat_bytes(self.ddp) if policy.sequential else 0

    def before_step(self) -> None:
        pass

    def synced(self) -> bool:
        return bool(self.ddp.require_backward_grad_sync)

    def last_parameter(self) -> Any:
        params = [p for p in self.ddp.module.parameters() if p.requires_grad]
        if not params:
            raise UsageError("this DDP's module has no parameter with requires_grad=True")
        return params[-1]


class AfterBackward:
    """``ddp``'s gradients all-reduced after backward, on ``ddp.process_group`` as it is then, in
    place of its reducer's all-reduces per bucket during backward: the ``sequential`` policy, no
    overlap (two ranks sharing a GPU ran plain DDP with one bucket 0.78-0.96x plain DDP, about as
    fast as the best policy: H200, e41cccb, docs/ddp.md). A step is taken where DDP would reduce
    (grad enabled, not in the user's own ``no_sync()``): its forward runs with DDP's ``no_sync``
    switch off, a hook on the forward's output tensors (on its parameters' accumulated gradients
    where the output holds none) queues the all-reduce at the end of the backward that reaches
    it, and, where that backward accumulated a gradient (not ``torch.autograd.grad``, which plain
    DDP does not reduce either), the gradients of DDP's parameters (zeros for one without: every
    rank all-reduces the same sizes) are divided by the ranks and summed: each of DDP's
    ``bucket_bytes_cap`` or more alone, in place, the others in one flat buffer per dtype, then
    copied back. Gradients accumulated over the user's ``no_sync()`` steps are reduced
    at the synced step, as DDP does. :func:`after_backward_refusal` says which DDPs it cannot take,
    checked again at each synced forward. ``close()`` removes its hooks: the reducer all-reduces
    again from the next forward."""

    def __init__(self, ddp: Any):
        import torch
        import torch.distributed as dist
        if why := after_backward_refusal(ddp):
            raise UsageError(f"policy 'sequential' cannot take this DDP: {why}")
        self._torch, self._dist, self.ddp = torch, dist, ddp
        self._queued = False  # the coming backward's all-reduce is queued
        self._taken = False  # this forward is one DDP would have reduced after
        self._params: list[Any] = []  # DDP's parameters at the taken forward
        self._seen: list[tuple[Any, int]] = []  # each one's gradient and its version then; [] once reduced
        self._grad_hooks: list[Any] = []  # where the output held no tensor: on the parameters, this step
        self._hooks = [ddp.register_forward_pre_hook(self._before),
                       ddp.register_forward_hook(self._after, always_call=True)]

    def _before(self, module: Any, args: Any) -> None:
        self._taken = self._torch.is_grad_enabled() and bool(self.ddp.require_backward_grad_sync)
        if self._taken:
            if why := _later_refusal(self.ddp):  # a Join made since, say
                self._taken = False
                raise UsageError(f"policy 'sequential' cannot go on with this DDP: {why}; close the Overlap first")
            self._queued = False  # a backward that failed before its end left it set
            self.ddp.require_backward_grad_sync = False

    def _after(self, module: Any, args: Any, output: Any) -> None:
        if not self._taken:
            return
        self._taken = False
        # As a synced step leaves them: syncing on, and the buffers broadcast at the next forward.
        self.ddp.require_backward_grad_sync = True
        self.ddp.require_forward_param_sync = True
        params = self._params = reduced_params(self.ddp)
        self._seen = [(p.grad, -1 if p.grad is None else p.grad._version) for p in params]
        tensors = [t for t in _tensors(output) if t.requires_grad]
        for t in tensors:
            t.register_hook(self._reached)
        if not tensors:  # this step only: the first gradient accumulated queues the all-reduce
            self._grad_hooks = [p.register_post_accumulate_grad_hook(self._reached) for p in params]

    def _reached(self, _: Any) -> None:
        if not self._queued:
            self._queued = True
            self._torch.autograd.Variable._execution_engine.queue_callback(self._reduce)

    def _reduce(self) -> None:
        """At backward's end (the autograd engine has synced the caller's stream with the
        gradients'): every gradient divided by the ranks and summed across them, one all-reduce
        per dtype, where this backward accumulated any."""
        self._queued = False
        for hook in self._grad_hooks:
            hook.remove()
        self._grad_hooks = []
        params, seen = self._params, self._seen
        if seen and all(p.grad is g and (g is None or g._version == v) for p, (g, v) in zip(params, seen, strict=True)):
            return  # torch.autograd.grad: nothing accumulated, nothing for DDP to reduce
        self._seen = []  # no gradient held past its step
        torch, group = self._torch, self.ddp.process_group
        size = self._dist.get_world_size(group)
        by_dtype: dict[Any, list[Any]] = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if alone(self.ddp, p):
                self._all_reduce(p.grad, size, group)
            else:
                by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self._all_reduce(flat, size, group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def _all_reduce(self, grad: Any, size: int, group: Any) -> None:
        """``grad`` divided by the ``size`` ranks, then summed over them, in place (through a
        contiguous copy where it is not contiguous)."""
        buffer = grad if grad.is_contiguous() else grad.contiguous()
        buffer.div_(size)
        self._dist.all_reduce(buffer, group=group)
        if buffer is not grad:
            grad.copy_(buffer)

    def close(self) -> None:
        for hook in self._hooks + self._grad_hooks:
            hook.remove()
        self._hooks, self._grad_hooks = [], []


def reduced_params(ddp: Any) -> list[Any]:
    """The parameters ``ddp``'s reducer all-reduces (its module's, less those it ignores)."""
    params = getattr(ddp, "_module_parameters", None) or list(ddp.module.parameters())
    return [p for p in params if p.requires_grad]


def alone(ddp: Any, param: Any) -> bool:
    """Whether ``sequential`` all-reduces ``param``'s gradient alone and in place: one of ``ddp``'s
    ``bucket_bytes_cap`` or more, as DDP gives it a bucket of its own. No copy in and out of a
    flat buffer (with every gradient copied, comm-heavy's 2 GiB, sequential ran 1.041x plain DDP
    where one bucket ran 0.976x: H100, 8eb640b), no launch worth saving. By sizes alone, the
    same on every rank, so the ranks' collectives match."""
    return param.numel() * param.element_size() >= getattr(ddp, "bucket_bytes_cap", DEFAULT_BUCKET_MB << 20)


def flat_bytes(ddp: Any) -> int:
    """The bytes ``sequential``'s flat buffers take at the end of a backward, beyond the
    gradients: those of ``ddp``'s gradients that are not all-reduced :func:`alone`."""
    return sum(p.numel() * p.element_size() for p in reduced_params(ddp) if not alone(ddp, p))


def _tensors(value: Any) -> list[Any]:
    """The tensors in ``value``: itself, or those in its tuples, lists, dicts' values and
    dataclasses' fields (as DDP finds its output's)."""
    import dataclasses

    import torch
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name))]
    return []


def after_backward_refusal(ddp: Any) -> str | None:
    """Why ``ddp`` cannot all-reduce after backward (:class:`AfterBackward`; None: it can)."""
    import torch
    if why := _later_refusal(ddp):
        return why
    if _delayed(ddp):
        return "its all-reduces are not all its reducer's (torch.compile's Python reducer, or delayed all-reduces)"
    if getattr(ddp, "find_unused_parameters", False):
        return ("its find_unused_parameters (DDP leaves a gradient no rank made untouched; one all-reduce of every "
                "gradient would not)")
    if getattr(ddp, "static_graph", False):
        return "its static_graph (DDP counts its synced steps to learn the graph)"
    if getattr(ddp, "mixed_precision", None) is not None:
        return "its mixed_precision (its comm hook all-reduces and casts the parameters back, in the reducer)"
    if any(hasattr(p, "_in_backward_optimizers") for p in ddp.module.parameters()):
        return "an optimizer applied in backward (DDP runs it from the reducer, which sits out the step)"
    sparse = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    if any(isinstance(m, sparse) and m.sparse for m in ddp.module.modules()):
        return "an embedding with sparse gradients (one flat all-reduce takes dense gradients only)"
    return None


def _later_refusal(ddp: Any) -> str | None:
    """What of :func:`after_backward_refusal` can come after the DDP was made (a Join, a comm hook,
    torch.compile's Python reducer): cheap enough to check at each synced forward."""
    if _no_cpp_reducer(ddp):
        return "its all-reduces are not all its reducer's (torch.compile's Python reducer, or delayed all-reduces)"
    if _join_made(ddp):
        return "a Join made for it (Join's joined ranks shadow the reducer's all-reduces, not one after backward)"
    if getattr(ddp, "_comm_hooks", None) or hasattr(ddp, "buffer_hook"):
        return "a comm hook (it runs in the reducer, which sits out the step)"
    return None


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
    if _no_cpp_reducer(ddp):
        return "it has no C++ reducer (torch.compile's Python reducer, or every all-reduce delayed)"
    if not hasattr(ddp.reducer, "_update_process_group"):
        return "this torch's reducer cannot change its process group (Reducer._update_process_group)"
    if _delayed(ddp):
        return "its delay_all_reduce_named_params (those all-reduces run outside the reducer)"
    if _join_made(ddp):
        # torch's Join keeps the group it found when made, for its joined ranks' shadow all-reduces,
        # while the others follow the DDP's: a move inside its block leaves them waiting on two
        # groups.
        return ("a torch.distributed.algorithms.Join was made for it (Join keeps the process group it found; "
                "moving the DDP inside its block hangs the ranks that ran out of inputs); make the Join after "
                "auto has decided (ov.report()['policy'] is not None), or use a fixed policy")
    return None


def _no_cpp_reducer(ddp: Any) -> bool:
    return getattr(ddp, "reducer", None) is None or bool(getattr(ddp, "_use_python_reducer", False))


def _delayed(ddp: Any) -> bool:
    return bool(getattr(ddp, "_delay_all_reduce_params", None))


def _join_made(ddp: Any) -> bool:
    # DDP keeps Join's config after the block: a Join made at all counts.
    return bool(getattr(getattr(ddp, "_join_config", None), "enable", False))


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
