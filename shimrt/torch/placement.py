"""Where a data-parallel model's collectives run under :func:`shimrt.torch.overlap`: the policies'
process groups (:class:`~shimrt.torch.groups.Groups`), the one in force, and the gradient hook
that opens a windowed carveout (:func:`~shimrt.torch.resources.window_hook`).
:class:`~shimrt.torch.training.Overlap` asks a :class:`Placement` to put the model on a policy's
group between steps, to let go of what the coming steps cannot use, and to put the model back on
its own group at the end; the model itself is driven through its adapter (:class:`Wrapped`:
:class:`shimrt.torch.ddp.Ddp`, :class:`shimrt.torch.fsdp.Fsdp`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from ..errors import UsageError
from .groups import Groups
from .policies import Policy
from .resources import Window, window_hook

__all__ = ["Wrapped", "Placement"]


class Wrapped(Protocol):
    """A data-parallel model as :class:`~shimrt.torch.training.Overlap` drives it: ``kind``
    ("DDP", "FSDP2"), ``group`` (its own process group), ``index`` (its GPU)."""

    kind: str
    group: Any
    index: int

    def moveable(self) -> str | None:
        """Why its collectives cannot move to another process group (None: they can)."""

    def use(self, group: Any, high: bool, symmetric: bool = False) -> None:
        """Its collectives on ``group`` from the next step, on streams of the greatest priority
        where ``high`` and the model's streams carry them (between steps, on every rank alike);
        ``symmetric``: the all-gathers' outputs in symmetric memory registered with ``group``
        (FSDP2 over its custom collectives; :meth:`refusal` says where it cannot be)."""

    def refusal(self, policy: Policy, ranks_per_gpu: int) -> str | None:
        """Why this model cannot run ``policy`` (None: it can), for what the model's kind or set-up
        rules out (a window without a gradient hook, prefetch or zero-sm without FSDP2's parts,
        zero-sm where ``ranks_per_gpu`` ranks share a GPU)."""

    def prefetch(self, depth: int | None) -> None:
        """FSDP2: all-gather the next ``depth`` modules ahead, in forward and backward, from the
        next step (None: FSDP2's own prefetch); UsageError for a depth where there is nothing to
        prefetch (DDP)."""

    def keep_gathered(self, on: bool) -> None:
        """FSDP2: the modules below the root keep their parameters all-gathered from forward to
        backward from the next step (``on``), or reshard after forward as the model says; UsageError
        for ``on`` where nothing is sharded (DDP)."""

    def held_bytes(self, policy: Any) -> int:
        """The bytes ``policy`` holds at most beyond what the plain model holds: FSDP2's
        ``no-reshard``, its parameters kept all-gathered; DDP's ``sequential``, its flat buffer of
        gradients; 0 for the others."""

    def after_backward(self, on: bool) -> None:
        """DDP: its gradients all-reduced after backward (``on``: the ``sequential`` policy, no
        overlap) from the next step, or by its reducer during backward; UsageError for ``on`` where
        the collectives are not all-reduces of gradients (FSDP2)."""

    def before_step(self) -> None:
        """What the policy in force needs done at each step's start (FSDP2: its streams, which
        it makes at its first forward)."""

    def synced(self) -> bool:
        """Whether the coming step reduces gradients (not a ``no_sync()`` step)."""

    def last_parameter(self) -> Any:
        """The parameter whose accumulated gradient opens a window (the one registered last,
        whose gradient comes first), or None where no gradient hook can mark it."""


class Placement:
    """``model``'s collectives on the policies' ``groups``: the group of each policy (its stream
    priority and NCCL channels for ``ranks_per_gpu`` ranks per GPU; the model's own for the plain
    job), the one in force (``current``), and the window's gradient hook while a policy of the
    run has a window."""

    def __init__(self, model: Wrapped, groups: Groups, ranks_per_gpu: int):
        self.model, self.groups, self.ranks_per_gpu = model, groups, ranks_per_gpu
        self.current: Any = model.group
        self.hook: Any = None

    def group_of(self, policy: Policy) -> Any:
        """The process group ``policy``'s collectives run on (made on first asking)."""
        if policy.plain or policy.sequential:  # sequential: the model's own all-reduces, after backward
            return self.model.group
        return self.groups.get((policy.priority, policy.channels(self.ranks_per_gpu), policy.zero_sm))

    def use(self, policy: Policy) -> None:
        """The model's collectives on ``policy``'s group (and streams) from the next step;
        UsageError, before anything moves, where they cannot move now (a Join made since)."""
        group = self.group_of(policy)
        if group is not self.current and (why := self.model.moveable()):
            raise UsageError(f"auto would move this {self.model.kind}'s collectives to {policy.name}'s process "
                             f"group, and they cannot move now: {why}")
        self.model.use(group, not policy.plain and policy.priority == "high", policy.zero_sm)
        self.model.prefetch(policy.prefetch)
        self.model.keep_gathered(policy.no_reshard)
        self.model.after_backward(policy.sequential)
        self.current = group

    def hook_window(self, window: Window) -> None:
        """Open ``window`` at each step's first accumulated gradient (the model's last parameter's)."""
        if self.hook is None:
            self.hook = window_hook(self.model.last_parameter(), window)

    def release(self, staying: list[Policy]) -> None:
        """Only ``staying`` (and the plain job, on the model's own group) run from the next step:
        the other policies' groups go (their NCCL communicators and buffers), and the window's
        hook unless one of ``staying`` has a window. The group in force stays."""
        self.groups.close(keep=[self.group_of(p) for p in staying] + [self.current])
        if not any(p.window for p in staying):
            self._unhook()

    def close(self) -> None:
        """The model back on its own group, the hook removed, every policy group destroyed (each
        whatever the others do)."""
        # Each put back whatever the others do: the stack runs every callback (last first), an error
        # raised on through the rest.
        with contextlib.ExitStack() as undo:
            undo.callback(self.groups.close)
            undo.callback(self._unhook)
            undo.callback(self.model.after_backward, False)
            undo.callback(self.model.keep_gathered, False)
            undo.callback(self.model.prefetch, None)
            self.model.use(self.model.group, False)
            self.current = self.model.group

    def _unhook(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook.remove()
