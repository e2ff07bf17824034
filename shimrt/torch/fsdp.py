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

Two routes to the groups (``route``): ``"mesh"`` writes each group's
``mesh_info.shard_process_group``; ``"custom"`` gives FSDP2, through its public
``set_custom_all_gather``/``set_custom_reduce_scatter``, an all-gather and a reduce-scatter of
shimrt's (:class:`GroupAllGather`, :class:`GroupReduceScatter`) that run torch's own collective on
the policy's group instead of the one FSDP2 passes: one Python call per collective. They are put
in when a policy's group is first used and FSDP2's own put back for the plain job and at close;
refused there: a module with several parameter groups per state, or with collectives of its own.
Which costs less per step is bench torch ``--fsdp --fsdp-route``'s to measure (issue 42). Only the
custom route can run ``zero-sm``: its all-gather allocates FSDP2's all-gather outputs (through the
``allocate`` FSDP2 calls) from torch's symmetric-memory pool on NCCL's backend and registers each
with the policy's group (``rendezvous``), so that NCCL, on that group's CTA policy ZERO, can
all-gather on the copy engines (:func:`symmetric_refusal` says where torch cannot).

Refused, with the reason: an HSDP (2-D) mesh, CPU offload, ``reshard_after_forward`` as an int (its
post-forward mesh is another group's), and a torch whose FSDP2 keeps its groups elsewhere.
``windowed-carveout`` is not offered: FSDP2 sets its sharded gradients itself, after the
reduce-scatter, so no gradient hook marks the window's start.

About 490 lines: the FSDP2 parts a policy changes (process groups, custom collectives, prefetch,
resharding, streams, symmetric memory) are each a few functions the one adapter drives; apart,
each would be a module of a function or two importing :func:`param_groups` back.

torch internals touched: ``FSDPModule._get_fsdp_state()`` and its ``_fsdp_param_group`` (torch
2.11) or ``_fsdp_param_groups``; each group's ``mesh_info.shard_process_group`` (the move),
``_reduce_scatter_process_group``, ``post_forward_mesh_info``, ``fsdp_params[i].offload_to_cpu``,
``reduce_grads`` and ``comm_ctx.all_gather_stream``/``reduce_scatter_stream`` (the streams). Public
API used: ``set_custom_all_gather``/``set_custom_reduce_scatter`` (the custom route) and
``set_modules_to_forward_prefetch``/``set_modules_to_backward_prefetch`` (a policy's prefetch; the
model's own lists are read and put back through each state's ``_states_to_forward_prefetch`` and
``_states_to_backward_prefetch``); for ``no-reshard``, each group's ``post_forward_mesh_info``
(what ``set_reshard_after_forward`` writes, read and put back per group); for ``zero-sm``,
``torch.distributed._symmetric_memory`` (``set_backend``, ``get_mem_pool``, ``rendezvous``: private
in torch 2.11) and ``torch.cuda.use_mem_pool``.
"""

from __future__ import annotations

from typing import Any

from .. import validate
from ..errors import UsageError
from .groups import one_cuda_device, require_nccl

__all__ = ["ROUTES", "is_fsdp", "param_groups", "moveable", "Fsdp", "GroupAllGather", "GroupReduceScatter",
           "install", "uninstall", "prefetch", "top_blocks", "held_prefetch", "restore_prefetch", "below_root",
           "resharding", "keep_gathered", "reshard_again", "gathered_bytes", "symmetric_refusal",
           "nccl_symmetric_memory", "settings"]

#: How a policy's process group reaches FSDP2's collectives (see the module's docstring).
ROUTES = ("mesh", "custom")
#: Why FSDP2 takes no ``sequential`` policy.
NO_SEQUENTIAL = ("sequential all-reduces a DDP's gradients after backward; FSDP2 reduce-scatters each module's as its "
                 "backward ends")


def is_fsdp(model: Any) -> bool:
    """Whether ``model`` is a module ``fully_shard`` made an FSDP2 module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(model, FSDPModule)


def param_groups(model: Any, below: bool = True) -> list[Any]:
    """Every FSDPParamGroup under ``model`` (its own and, ``below``, its submodules'), in module
    order; torch 2.11 keeps one per module state (``_fsdp_param_group``), later versions a list."""
    from torch.distributed.fsdp import FSDPModule
    found: list[Any] = []
    for module in model.modules() if below else [model]:
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


#: What :func:`install` replaced: (FSDP2 module, its all-gather, its reduce-scatter) per module.
Installed = list[tuple[Any, Any, Any]]


def install(model: Any, comms: tuple[GroupAllGather, GroupReduceScatter]) -> Installed:
    """``comms`` as every FSDP2 module's all-gather and reduce-scatter under ``model``, through
    FSDP2's public ``set_custom_all_gather``/``set_custom_reduce_scatter`` (the custom route);
    returns what they replace (FSDP2 keeps it in each group's ``_all_gather_comm`` and
    ``_reduce_scatter_comm``; no public getter), for :func:`uninstall`. UsageError, with nothing
    changed, where this torch or this model cannot take them, or a module has collectives of its
    own (set by its user: replacing them would change what they do)."""
    from torch.distributed.fsdp import FSDPModule
    if not hasattr(FSDPModule, "set_custom_all_gather") or not hasattr(FSDPModule, "set_custom_reduce_scatter"):
        raise UsageError("this torch's FSDP2 has no set_custom_all_gather/set_custom_reduce_scatter: use the mesh "
                         "route")
    held: Installed = []
    for module in model.modules():
        if isinstance(module, FSDPModule) and (groups := param_groups(module, below=False)):
            gather, scatter = groups[0]._all_gather_comm, groups[0]._reduce_scatter_comm
            for comm in (gather, scatter):
                if not type(comm).__name__.startswith("Default"):
                    raise UsageError(f"this FSDP2 model has a collective of its own ({type(comm).__name__}): the "
                                     "custom route would replace it; use the mesh route")
            held.append((module, gather, scatter))
    try:
        for module, _, _ in held:
            try:
                module.set_custom_all_gather(comms[0])
                module.set_custom_reduce_scatter(comms[1])
            except ValueError as exc:  # several parameter groups per state (per-parameter meshes)
                raise UsageError(f"FSDP2 refuses custom collectives on this model ({exc}): use the mesh "
                                 "route") from None
    except BaseException:
        uninstall(held)
        raise
    return held


def uninstall(held: Installed) -> None:
    """The collectives :func:`install` replaced, put back (FSDP2's own: the plain job)."""
    for module, gather, scatter in held:
        module.set_custom_all_gather(gather)
        module.set_custom_reduce_scatter(scatter)


def prefetch(model: Any, depth: int | None) -> None:
    """FSDP2's explicit prefetch under ``model``: each of its top FSDP2 blocks (:func:`top_blocks`)
    all-gathers the next ``depth`` blocks (in module order, their forward order in a stack of
    blocks) when its forward starts, and the ``depth`` before it when its backward starts (None: no
    explicit lists, FSDP2's own prefetch of one). The lists held before are replaced:
    :class:`Fsdp` keeps them (:func:`held_prefetch`) and puts them back for the plain job."""
    for i, block in enumerate(blocks := top_blocks(model)):
        ahead = [] if depth is None else blocks[i + 1:i + 1 + depth]
        behind = [] if depth is None else blocks[max(0, i - depth):i][::-1]
        block.set_modules_to_forward_prefetch(ahead)
        block.set_modules_to_backward_prefetch(behind)


def top_blocks(model: Any) -> list[Any]:
    """The FSDP2 modules under ``model`` (the root) with no FSDP2 module between them and the root,
    in module order: a stack's blocks, not the modules nested in them (whose prefetch their block's
    forward already covers)."""
    from torch.distributed.fsdp import FSDPModule
    names = [(n, m) for n, m in model.named_modules() if isinstance(m, FSDPModule) and m is not model]
    return [m for n, m in names if not any(n.startswith(f"{other}.") for other, _ in names)]


def held_prefetch(model: Any) -> list[tuple[Any, list, list]]:
    """Each FSDP2 state under ``model`` with the forward and backward prefetch lists it holds now
    (FSDP2 keeps them as ``_states_to_forward_prefetch``/``_states_to_backward_prefetch``; no
    public getter), to be put back as they were (:func:`restore_prefetch`)."""
    from torch.distributed.fsdp import FSDPModule
    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
    return [(s, list(s._states_to_forward_prefetch), list(s._states_to_backward_prefetch)) for s in states]


def restore_prefetch(held: list[tuple[Any, list, list]]) -> None:
    """The prefetch lists :func:`held_prefetch` read, put back."""
    for state, forward, backward in held:
        state._states_to_forward_prefetch, state._states_to_backward_prefetch = list(forward), list(backward)


def settings(model: Any) -> dict:
    """What of FSDP2 model ``model`` a policy changes and puts back, as values two models compare
    by (two on one mesh, neither under a policy, compare equal): each group's process group (its
    id), kept all-gathered after forward ("k") or resharded ("r"), each state's explicit prefetch
    lists' lengths, its collectives' kinds (FSDP2's own, or custom) and the priorities of FSDP2's
    all-gather and reduce-scatter streams (None before its first forward made them)."""
    from torch.distributed.fsdp import FSDPModule
    groups = param_groups(model)
    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)]
    ctx = groups[0].comm_ctx if groups else None
    streams = [getattr(getattr(ctx, n, None), "priority", None) for n in ("all_gather_stream", "reduce_scatter_stream")]
    # getattr throughout: a torch without custom collectives (or prefetch lists) still compares
    return {"groups": [id(getattr(getattr(g, "mesh_info", None), "shard_process_group", None)) for g in groups],
            "gathered": "".join("k" if getattr(g, "post_forward_mesh_info", None) is None else "r" for g in groups),
            "prefetch": [[len(getattr(s, name, ())) for name in ("_states_to_forward_prefetch",
                                                                  "_states_to_backward_prefetch")] for s in states],
            "collectives": [[type(getattr(g, name, None)).__name__ for name in ("_all_gather_comm",
                                                                                 "_reduce_scatter_comm")]
                            for g in groups],
            "streams": streams}


#: What :func:`keep_gathered` changed: each FSDPParamGroup with the post-forward mesh it held.
Resharding = list[tuple[Any, Any]]


def below_root(model: Any) -> list[Any]:
    """The FSDPParamGroups of every FSDP2 module under ``model`` but ``model`` itself (the root,
    which FSDP2 already keeps all-gathered after forward unless its user said otherwise)."""
    from torch.distributed.fsdp import FSDPModule
    return [g for m in model.modules() if isinstance(m, FSDPModule) and m is not model
            for g in param_groups(m, below=False)]


def resharding(groups: list[Any]) -> list[Any]:
    """Those of FSDPParamGroups ``groups`` that reshard after forward (a post-forward mesh)."""
    return [g for g in groups if g.post_forward_mesh_info is not None]


def keep_gathered(groups: list[Any]) -> Resharding:
    """Every one of FSDPParamGroups ``groups`` (:func:`below_root`'s) keeps its parameters
    all-gathered from its forward to its backward (what ``set_reshard_after_forward(False)`` sets:
    no post-forward mesh), from the next step; returns what it changed, for :func:`reshard_again`.
    Set per group, not through ``set_reshard_after_forward``, so that putting it back restores
    each group's own (the root's, which FSDP2 sets at its first forward, is never touched)."""
    held = [(g, g.post_forward_mesh_info) for g in resharding(groups)]
    for g, _ in held:
        g.post_forward_mesh_info = None
    return held


def reshard_again(held: Resharding) -> None:
    """The post-forward meshes :func:`keep_gathered` took, put back (between steps; a group taken
    twice ends with what it held the second time: its user's latest)."""
    for g, info in held:
        g.post_forward_mesh_info = info


def gathered_bytes(groups: list[Any]) -> int:
    """The bytes :func:`keep_gathered` holds at most beyond plain FSDP2: the parameters, whole, of
    those of ``groups`` (:func:`below_root`'s) that reshard after forward now, each in the dtype
    FSDP2 all-gathers it in (a mixed-precision policy's ``param_dtype`` once FSDP2 has read it at
    its first forward, the parameter's own before)."""
    total = 0
    for g in resharding(groups):
        for fp in g.fsdp_params:
            whole = fp.sharded_param  # a DTensor: its numel is the whole parameter's
            dtype = getattr(fp, "param_dtype", None) or whole.dtype
            total += whole.numel() * dtype.itemsize
    return total


def use(groups: list[Any], group: Any) -> None:
    """The all-gathers and reduce-scatters of FSDPParamGroups ``groups`` on ``group`` (the same
    ranks, in the same order) from their next collective: between steps, on every rank alike."""
    for g in groups:
        g.mesh_info.shard_process_group = group


class _OnGroup:
    """A collective of FSDP2's on :attr:`group` (set between steps), whatever group FSDP2 passes;
    its buffers allocated as FSDP2's own collectives allocate them. ``names``: torch.distributed's
    function for it, newest name first (torch 2.14 renamed them, and warns at the old names)."""

    names: tuple[str, ...] = ()

    def __init__(self, group: Any):
        import torch.distributed as dist
        self.group = group
        self.collective = next(getattr(dist, n) for n in self.names if hasattr(dist, n))

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        import torch
        return torch.empty(*size, dtype=dtype, device=device)


#: Why zero-sm is refused where ranks share a GPU: seen on an H100 (NCCL 2.32.3 with
#: NCCL_MULTI_RANK_GPU_ENABLE=1, torch 2.11, two ranks under MPS, tree 71ad7d8), both ranks' first
#: all-gather failed in torch's NCCL device-communicator set-up (symm_mem/nccl_devcomm_manager.hpp:82,
#: ncclInvalidUsage) instead of running.
SHARED_GPU_ZERO_SM = ("zero-sm needs NCCL's symmetric memory, which NCCL refused (invalid usage) with {} ranks on one "
                      "GPU (NCCL 2.32.3, torch 2.11); it is for one rank per GPU")


def symmetric_refusal() -> str | None:
    """Why this torch cannot put FSDP2's all-gather outputs in symmetric memory on NCCL's backend
    (None: it can), without changing anything."""
    import torch
    try:
        from torch.distributed import _symmetric_memory as symm_mem
    except ImportError as exc:
        return f"this torch has no torch.distributed._symmetric_memory ({exc})"
    missing = [n for n in ("set_backend", "get_mem_pool", "rendezvous") if not hasattr(symm_mem, n)]
    if missing or not hasattr(torch.cuda, "use_mem_pool"):
        return (f"this torch's symmetric memory lacks {', '.join(missing or ['torch.cuda.use_mem_pool'])} "
                "(torch 2.11's has them)")
    return None


def nccl_symmetric_memory() -> None:
    """torch's symmetric memory on NCCL's backend (its windows registered with a group's
    communicator), for this process: torch starts on its own CUDA backend, and takes another until
    a symmetric allocation is made; UsageError once one was made on another."""
    from torch.distributed import _symmetric_memory as symm_mem
    try:
        symm_mem.set_backend("NCCL")
    except RuntimeError as exc:
        raise UsageError(f"zero-sm needs torch's symmetric memory on NCCL's backend, and this process has used "
                         f"another ({exc})") from None


class GroupAllGather(_OnGroup):
    """FSDP2's all-gather (its ``AllGather`` interface: ``allocate`` and the call) on the group;
    with :attr:`symmetric` (zero-sm), its outputs from the symmetric-memory pool, each registered
    with the group before NCCL gathers into it."""

    names = ("all_gather_single", "all_gather_into_tensor")

    def __init__(self, group: Any):
        super().__init__(group)
        self.symmetric = False

    def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
        if not self.symmetric:
            return super().allocate(size, dtype=dtype, device=device)
        import torch
        from torch.distributed import _symmetric_memory as symm_mem
        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device), device=device):
            return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, async_op: bool = False) -> Any:
        if self.symmetric:
            from torch.distributed import _symmetric_memory as symm_mem
            symm_mem.rendezvous(output_tensor, group=self.group.group_name)  # once per allocation: torch keeps it
        return self.collective(output_tensor, input_tensor, group=self.group, async_op=async_op)


class GroupReduceScatter(_OnGroup):
    """FSDP2's reduce-scatter (its ``ReduceScatter`` interface) on the group."""

    names = ("reduce_scatter_single", "reduce_scatter_tensor")

    def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> Any:
        return self.collective(output_tensor, input_tensor, op=op, group=self.group, async_op=async_op)


class Fsdp:
    """An FSDP2 root module as :class:`~shimrt.torch.training.Overlap` drives it (the
    :class:`~shimrt.torch.placement.Wrapped` protocol); ``route``: one of :data:`ROUTES`."""

    kind = "FSDP2"

    def __init__(self, model: Any, route: str = "mesh"):
        import torch
        import torch.distributed as dist
        self.route = validate.one_of(route, "route", ROUTES)
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
        # The custom route's collectives: installed when a policy's group is first used, taken out
        # for the plain job (and at close), so a refused overlap() and the plain job change nothing.
        self.comms: tuple[GroupAllGather, GroupReduceScatter] | None = None
        self._installed: Installed | None = None
        if self.route == "custom":
            self.comms = (GroupAllGather(self.group), GroupReduceScatter(self.group))
        self._own_streams: tuple[Any, Any] | None = None   # FSDP2's all-gather and reduce-scatter streams
        self._high_streams: tuple[Any, Any] | None = None  # shimrt's, of the greatest priority
        self._high = False
        self._prefetch: int | None = None  # the explicit prefetch depth set (None: the model's own lists)
        self._own_prefetch: list | None = None  # those lists, once a policy changed them
        self._resharding: Resharding | None = None  # what keep_gathered changed, while a policy keeps it
        self.below = below_root(model)  # the groups no-reshard keeps gathered (read once: a step walks none)
        self._symmetric_backend = False  # torch's symmetric memory set to NCCL's backend (zero-sm)

    def moveable(self) -> str | None:
        return moveable(self.groups)

    def use(self, group: Any, high: bool, symmetric: bool = False) -> None:
        if validate.boolean(symmetric, "symmetric") and (self.comms is None or group is self.group):
            raise UsageError("symmetric all-gather outputs need the custom route and a policy's group (zero-sm)")
        if self.comms is None:
            use(self.groups, group)
        elif group is self.group:
            if self._installed is not None:
                uninstall(self._installed)
                self._installed = None
        else:
            for comm in self.comms:
                comm.group = group
            if symmetric and not self._symmetric_backend:  # once: at overlap(), not inside a step
                nccl_symmetric_memory()
                self._symmetric_backend = True
            self.comms[0].symmetric = symmetric
            if self._installed is None:
                self._installed = install(self.model, self.comms)
        self._high = validate.boolean(high, "high")
        self.streams()

    def refusal(self, policy: Any, ranks_per_gpu: int) -> str | None:
        if policy.sequential:
            return NO_SEQUENTIAL
        if policy.window:
            return "FSDP2 gives no gradient hook to open the window at"
        if policy.no_reshard and not resharding(self.below):
            return ("no FSDP2 module below the root reshards after forward here: no-reshard would change nothing "
                    "(it would be priority)")
        if policy.zero_sm:
            if self.route != "custom":
                return ("zero-sm needs overlap(..., fsdp_route='custom'): its all-gather outputs come from symmetric "
                        "memory, which only FSDP2's custom all-gather allocates")
            if ranks_per_gpu > 1:
                return SHARED_GPU_ZERO_SM.format(ranks_per_gpu)
            return symmetric_refusal()
        return None

    def prefetch(self, depth: int | None) -> None:
        if depth == self._prefetch:
            return
        if self._own_prefetch is None:  # the model's own lists, before the first policy changes them
            self._own_prefetch = held_prefetch(self.model)
        if depth is None:
            restore_prefetch(self._own_prefetch)
        else:
            prefetch(self.model, depth)
        self._prefetch = depth

    def keep_gathered(self, on: bool) -> None:
        if validate.boolean(on, "on"):
            # Again each time: a group set to reshard since (FSDP2's set_reshard_after_forward(True),
            # after an eval that set it False) is kept gathered too, and what it held is put back last.
            self._resharding = (self._resharding or []) + keep_gathered(self.below)
        elif self._resharding is not None:
            reshard_again(self._resharding)
            self._resharding = None

    def held_bytes(self, policy: Any) -> int:
        return gathered_bytes(self.below) if policy.no_reshard else 0

    def after_backward(self, on: bool) -> None:
        if validate.boolean(on, "on"):
            raise UsageError(NO_SEQUENTIAL)

    def before_step(self) -> None:
        self.streams()
        if self._resharding is not None:
            self.keep_gathered(True)

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
