"""What the overlap engine runs: a :class:`Schedule` of :class:`Op` s in launch order.

Compute launches, and collectives that may wait for a compute launch (an event dependency: the
all-reduce of layer i's gradients waits for layer i's backward compute, and runs beside layer
i-1's). :meth:`Schedule.pair` and :meth:`Schedule.backward` build the two common shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, cast

from .. import validate
from ..errors import UsageError

__all__ = ["KINDS", "ComputeWork", "CommWork", "Op", "Schedule"]

if TYPE_CHECKING:
    import numpy as np

    from ..kernel import Kernel
    from ..memory import Buffer
    from ..occupancy import Footprint

KINDS = ("compute", "comm")


class ComputeWork(Protocol):
    """What the engine and the benches use of a compute op's work (a
    :class:`~shimrt.overlap.workloads.ComputeWorkload`)."""

    @property
    def label(self) -> str: ...
    @property
    def kernel(self) -> Kernel: ...
    @property
    def block(self) -> tuple[int, int, int]: ...
    @property
    def blocks(self) -> int: ...

    def prepare(self, stream: Any = None, *, dynamic_smem: int = 0, stamps: Buffer | None = None,
                kernel: Kernel | None = None) -> Callable[[], None]: ...

    def result(self) -> np.ndarray: ...


class CommWork(Protocol):
    """What the engine uses of a comm op's work (a :class:`~shimrt.overlap.standin.CommStandIn` or
    an :class:`~shimrt.overlap.collective.NcclCollective`)."""

    @property
    def kind(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def kernel(self) -> Kernel | None: ...  # None: NCCL brings its own kernels
    @property
    def max_blocks(self) -> int: ...

    def footprint(self, threads: int | None = None) -> Footprint: ...

    def blocks(self, blocks: int | None = None) -> int: ...

    def prepare(self, stream: Any = None, *, stamps: Any = None, kernel: Kernel | None = None,
                blocks: int | None = None, threads: int | None = None) -> Callable[[], None]: ...

    def raise_if_stalled(self) -> None: ...

    def observe(self, record: dict) -> None: ...


@dataclass(frozen=True)
class Op:
    """One launch: ``work`` is a compute workload or a communication (stand-in or NCCL);
    ``after`` the index of an earlier compute op it must wait for (None: none)."""

    kind: str
    work: ComputeWork | CommWork
    after: int | None = None

    def __post_init__(self) -> None:
        validate.one_of(self.kind, "op kind", KINDS)
        if self.work is None:
            raise UsageError(f"op work must be a compute workload or a collective, not {self.work!r}")
        if self.after is not None:
            object.__setattr__(self, "after", validate.integer(self.after, "after (an op index, or None)", least=0))

    # The kind says which of the two ``work`` is (the Protocols cannot be told apart at run time).
    @property
    def compute(self) -> ComputeWork:
        """``work`` of a compute op."""
        if self.kind != "compute":
            raise UsageError(f"a {self.kind} op has no compute workload")
        return cast(ComputeWork, self.work)

    @property
    def comm(self) -> CommWork:
        """``work`` of a comm op."""
        if self.kind != "comm":
            raise UsageError(f"a {self.kind} op has no collective")
        return cast(CommWork, self.work)


class Schedule:
    """Operations in launch order. See :meth:`pair` and :meth:`backward`."""

    def __init__(self, ops: list[Op]):
        if not isinstance(ops, (list, tuple)):
            raise UsageError(f"ops must be a list of Op, not {ops!r}")
        ops = list(ops)
        for i, op in enumerate(ops):
            if not isinstance(op, Op):
                raise UsageError(f"op {i} must be an Op, not {op!r:.100}")
            if op.after is not None and not (0 <= op.after < i and ops[op.after].kind == "compute"):
                raise UsageError(f"op {i} waits for op {op.after}, which is not an earlier compute op")
        if not any(o.kind == "compute" for o in ops) or not any(o.kind == "comm" for o in ops):
            raise UsageError("a schedule needs at least one compute op and one comm op")
        self.ops = ops

    @classmethod
    def pair(cls, compute: ComputeWork, comm: CommWork) -> "Schedule":
        """Layer i-1's compute beside layer i's collective, whose input is ready: the compute is
        launched first (it takes every SM it can), the collective right after, independent."""
        return cls([Op("compute", compute), Op("comm", comm)])

    @classmethod
    def backward(cls, computes: Sequence[ComputeWork], comms: Sequence[CommWork]) -> "Schedule":
        """A backward pass: layer by layer, compute, then its collective waiting for it; the
        next layer's compute is launched at once, beside the collective."""
        if not isinstance(computes, (list, tuple)) or not isinstance(comms, (list, tuple)) \
                or len(computes) != len(comms) or not computes:
            raise UsageError(f"backward() takes two lists of the same length (at least one): compute launches "
                             f"and their collectives, not {computes!r} and {comms!r}")
        ops = []
        for c, a in zip(computes, comms, strict=True):
            ops.append(Op("compute", c))
            ops.append(Op("comm", a, after=len(ops) - 1))
        return cls(ops)

    def of(self, kind: str) -> list[Op]:
        """The ops of ``kind`` ("compute" or "comm"), in order."""
        validate.one_of(kind, "kind", KINDS)
        return [o for o in self.ops if o.kind == kind]

    @property
    def label(self) -> str:
        c = "+".join(dict.fromkeys(o.work.label for o in self.of("compute")))
        a = "+".join(dict.fromkeys(o.work.label for o in self.of("comm")))
        n = len(self.of("compute"))
        return f"{c} + {a}" + (f" x{n} layers" if n > 1 else "")
