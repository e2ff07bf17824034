"""The overlap policies of a data-parallel step, by name: one vocabulary for the library
(:func:`shimrt.torch.overlap`) and ``bench torch``.

A policy is a :class:`Policy`. Its name says what it does:

- ``ddp``: torch.distributed's own all-reduce, as plain DDP does it (ProcessGroupNCCL, its
  stream): the reference, and one of auto's candidates, so auto never keeps anything slower;
- ``priority``: the all-reduces on streams of the greatest priority, NCCL's own channels;
- ``low-priority``: the same at default priority (what a second stream alone gives);
- ``ctas:N``: the collectives on streams of the greatest priority with NCCL held to N channels
  per rank (one block each): what the collectives themselves take of the SMs, and no more;
- ``prefetch:N`` (FSDP2 only): the collectives on streams of the greatest priority, and FSDP2 told to
  all-gather the next N modules ahead, in forward and in backward (its own prefetch is one);
- ``no-reshard`` (FSDP2 only): the collectives on streams of the greatest priority, and every FSDP2
  module below the root keeps its parameters all-gathered from its forward to its backward
  (FSDP2's ``reshard_after_forward=False``): no all-gather in backward, each of those modules'
  parameters held unsharded that long (FSDP2's root already keeps its own). auto tries it only
  where that memory is at most a quarter of the GPU's free memory when :func:`overlap` is called;
- ``zero-sm`` (FSDP2 over its custom collectives only): the collectives on streams of the greatest
  priority, on a communicator of NCCL's CTA policy ZERO, and FSDP2's all-gather outputs in
  symmetric memory registered with it: NCCL 2.28+ then all-gathers on the copy engines, holding no
  SM (its reduce-scatters still run kernels: a copy engine does not add). Where a requirement of
  NCCL's fails it runs its kernels instead, without saying so (``scripts/zero_sm_probe.py`` tells);
- ``shaping:N``: every torch kernel capped at N blocks per SM (launch interposition), room left
  for NCCL's blocks;
- ``partition:K``: torch's compute on an SM partition of all but K SMs, NCCL's channels sized to
  the K kept;
- ``carveout:K``: cuBLAS leaves K SMs free for the whole step; ``windowed-carveout:K`` only from
  the first bucket's gradients on (to the end of backward in bench torch's one-process mode, to
  the end of ``ov.step()`` under DDP: the optimizer's step runs no cuBLAS matmul, so the two agree);
- ``paced``: the plain job, with the host waiting at the end of each ``ov.step()`` for the step's
  work on the GPU (no step queued ahead of the one running), as a loop that reads its loss every
  step does. Two ranks sharing a GPU ran plain DDP at one of two speeds, the faster where the
  host waited each step (docs/ddp.md, "The two speeds"); with one rank per GPU the host's running
  ahead hides its launch time, which a wait gives up. A fixed policy: no auto tries it;
- ``sequential``: every all-reduce after backward (no overlap): under DDP, its reducer sits out
  the step and the gradients are all-reduced once backward ends (:class:`shimrt.torch.ddp.AfterBackward`),
  one of DDP's auto's candidates where its flat buffer of gradients (those below DDP's bucket
  size) takes at most a quarter of the GPU's free memory; in bench torch's one-process mode, its
  baseline.

About 490 lines: the vocabulary is one table (the kinds, the Policy value and its compute sides,
make, parse, candidates and Auto's options, each checked against the kinds); split, either half
would import the other.

Who all-reduces: in bench torch's one-process mode and :class:`~shimrt.torch.step.NcclBuckets`,
shimrt's Communicators with the policy's priority and channels; under DDP, DDP's own reducer on a
ProcessGroupNCCL made with them (:mod:`shimrt.torch.groups`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Iterable

from .. import validate
from ..errors import UsageError
from ..stream import PRIORITIES
from ..targets import MAX_SMS

__all__ = ["Shaping", "Partition", "Carveout", "Policy", "KINDS", "FSDP_KINDS", "FIXED_ONLY", "SMS_BOUNDS", "Auto",
           "channels_for", "parse", "candidates", "Kind", "Compute"]


class Kind(str, Enum):
    """The kinds of policy, by name (what ``bench torch --policies`` takes), baselines first.
    The tables below are keyed by them, and a test checks each covers the enum."""

    SEQUENTIAL = "sequential"
    DDP = "ddp"
    LOW_PRIORITY = "low-priority"
    PRIORITY = "priority"
    CTAS = "ctas"
    PREFETCH = "prefetch"
    NO_RESHARD = "no-reshard"
    ZERO_SM = "zero-sm"
    PACED = "paced"
    SHAPING = "shaping"
    PARTITION = "partition"
    CARVEOUT = "carveout"
    WINDOWED_CARVEOUT = "windowed-carveout"
    AUTO = "auto"


#: What a baseline policy is: ``plain``, the job's own collectives as they are (plain DDP or
#: FSDP2: nothing of shimrt's); ``sequential``, every all-reduce after backward (no overlap; bench
#: torch's one-process mode only). A policy without one overlaps through shimrt's groups.
BASELINES = ("plain", "sequential")


@dataclass(frozen=True)
class Shaping:
    """Every compute kernel capped at ``cap`` blocks per SM (launch interposition)."""

    cap: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "cap", validate.integer(self.cap, "Shaping.cap", least=1, most=64))


@dataclass(frozen=True)
class Partition:
    """torch's compute on an SM partition of all but ``sms`` SMs (kept for NCCL)."""

    sms: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "sms", validate.integer(self.sms, "Partition.sms", least=1, most=MAX_SMS))


@dataclass(frozen=True)
class Carveout:
    """cuBLAS leaves ``sms`` SMs free: for the whole step, or (``window``) only while the
    collectives run beside backward."""

    sms: int
    window: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sms", validate.integer(self.sms, "Carveout.sms", least=1, most=MAX_SMS))
        object.__setattr__(self, "window", validate.boolean(self.window, "Carveout.window"))


#: A policy's compute side: one of these, or None (torch's compute as it is).
Compute = Shaping | Partition | Carveout | None


@dataclass(frozen=True)
class Policy:
    """How a step overlaps its all-reduces (see the module's docstring): the collectives' stream
    ``priority``, its ``compute`` side (one of :class:`Shaping`, :class:`Partition`,
    :class:`Carveout`, or None: a policy cannot hold two), ``ctas``, NCCL's channels per rank
    where they are to be held to a number (None: :meth:`channels` derives them from the SMs a
    partition or carveout keeps, for the ranks sharing the GPU, where the group is made), and
    ``baseline``, where the policy is one (:data:`BASELINES`): ``"plain"`` or ``"sequential"``;
    ``prefetch``, FSDP2's modules all-gathered ahead (None: FSDP2's own prefetch); ``no_reshard``,
    FSDP2's modules below the root keep their parameters all-gathered from forward to backward; ``zero_sm``,
    NCCL's CTA policy ZERO and symmetric all-gather outputs (FSDP2's copy-engine all-gather);
    ``pace``, the host waits for each step's work at the end of ``ov.step()`` (the plain job's or
    any policy's)."""

    name: str
    priority: str = "high"
    compute: Compute = None
    ctas: int | None = None
    baseline: str | None = None
    prefetch: int | None = None
    no_reshard: bool = False
    zero_sm: bool = False
    pace: bool = False

    def __post_init__(self) -> None:
        validate.text(self.name, "Policy.name")
        object.__setattr__(self, "zero_sm", validate.boolean(self.zero_sm, "Policy.zero_sm"))
        object.__setattr__(self, "no_reshard", validate.boolean(self.no_reshard, "Policy.no_reshard"))
        object.__setattr__(self, "pace", validate.boolean(self.pace, "Policy.pace"))
        if self.baseline is not None:
            validate.one_of(self.baseline, "Policy.baseline", BASELINES)
        validate.one_of(self.priority, "Policy.priority", PRIORITIES)
        if self.compute is not None and not isinstance(self.compute, (Shaping, Partition, Carveout)):
            raise UsageError(f"Policy.compute must be a Shaping, Partition, Carveout or None, not "
                             f"{validate.shown(self.compute)}")
        if self.ctas is not None:
            object.__setattr__(self, "ctas", validate.integer(self.ctas, "Policy.ctas", least=1, most=64))
        if self.prefetch is not None:
            object.__setattr__(self, "prefetch", validate.integer(self.prefetch, "Policy.prefetch", least=1,
                                                                  most=MAX_PREFETCH))
        if self.plain and (self.ctas is not None or self.compute is not None or self.prefetch is not None
                           or self.zero_sm or self.no_reshard):
            raise UsageError(f"Policy {self.name!r}: the plain job (baseline='plain') runs its own collectives "
                             "as they are: no ctas, no compute side, no prefetch, no zero_sm, no no_reshard")
        if self.zero_sm and self.ctas is not None:
            raise UsageError(f"Policy {self.name!r}: zero_sm asks NCCL for no SMs (CTA policy ZERO); it takes no "
                             "ctas")
        if self.pace and self.sequential:
            raise UsageError(f"Policy {self.name!r}: pace is a wait at the end of ov.step(), which bench torch's "
                             "one-process baseline (baseline='sequential') has not")
        if self.window and self.sequential:
            raise UsageError(f"Policy {self.name!r}: a windowed carveout needs the all-reduces beside backward "
                             "(it limits the carveout to the time they run there), not baseline='sequential'")

    @property
    def plain(self) -> bool:
        """The plain job's own collectives (plain DDP or FSDP2)."""
        return self.baseline == "plain"

    @property
    def sequential(self) -> bool:
        """Every all-reduce after backward: no overlap."""
        return self.baseline == "sequential"

    # The compute side's numbers, None where the policy has another (or none).
    @property
    def cap(self) -> int | None:
        return self.compute.cap if isinstance(self.compute, Shaping) else None

    @property
    def partition(self) -> int | None:
        return self.compute.sms if isinstance(self.compute, Partition) else None

    @property
    def carveout(self) -> int | None:
        return self.compute.sms if isinstance(self.compute, Carveout) else None

    @property
    def window(self) -> bool:
        return isinstance(self.compute, Carveout) and self.compute.window

    def channels(self, ranks_per_gpu: int) -> int | None:
        """NCCL's channels per rank with ``ranks_per_gpu`` ranks sharing the GPU: ``ctas`` where
        given, else one per SM a partition or carveout keeps for those ranks (:func:`channels_for`),
        else None (NCCL's own number)."""
        if self.ctas is not None:
            return self.ctas
        if self.zero_sm:  # NCCL's CTA policy ZERO: no channel count of shimrt's
            return None
        kept = self.partition if self.partition is not None else self.carveout
        return None if kept is None else channels_for(kept, ranks_per_gpu)

    def sized(self, ranks_per_gpu: int) -> "Policy":
        """This policy with its channels fixed for ``ranks_per_gpu`` ranks per GPU (``ctas`` set)."""
        return replace(self, ctas=self.channels(ranks_per_gpu))

    def describe(self, ranks_per_gpu: int | None = None) -> str:
        """What the policy does, in words; its NCCL channels where ``ranks_per_gpu`` (or ``ctas``)
        says them."""
        parts = ["after backward" if self.sequential else
                 "the wrapper's own collectives, as without shimrt" if self.plain else f"{self.priority} priority"]
        if self.cap is not None:
            parts.append(f"compute capped at {self.cap} blocks/SM")
        if self.partition is not None:
            parts.append(f"compute on all but {self.partition} SMs")
        if self.carveout is not None:
            parts.append(f"cuBLAS leaves {self.carveout} SMs" + (" while all-reduces run" if self.window else ""))
        ctas = self.ctas if ranks_per_gpu is None else self.channels(ranks_per_gpu)
        if ctas is not None:
            parts.append(f"NCCL {ctas} channels/rank")
        if self.prefetch is not None:
            parts.append(f"FSDP2 all-gathers {self.prefetch} modules ahead")
        if self.no_reshard:
            parts.append("FSDP2 keeps parameters all-gathered from forward to backward")
        if self.zero_sm:
            parts.append("NCCL's CTA policy ZERO, all-gathers into symmetric memory (on the copy engines)")
        if self.pace:
            parts.append("the host waits for each step's end")
        return ", ".join(parts)


#: Kinds of policy (what ``bench torch --policies`` takes), baselines first: :class:`Kind`'s values.
KINDS = tuple(k.value for k in Kind)
#: Kinds that take a number after a colon: NCCL's channels, the cap, or the SMs kept for NCCL.
NUMBERED = (Kind.CTAS.value, Kind.PREFETCH.value, Kind.SHAPING.value, Kind.PARTITION.value, Kind.CARVEOUT.value,
            Kind.WINDOWED_CARVEOUT.value)
#: The overlap engine's policy (:data:`shimrt.overlap.planner.POLICIES`, its own kernels'
#: vocabulary) that each kind here corresponds to: the same two controls, named for what the
#: engine varies. None: the engine has no such policy (``ddp`` is torch's own all-reduce; a
#: carveout is cuBLAS's, which the engine's kernels do not take; the engine sizes NCCL's channels
#: under every policy, not as one of its own; prefetch and no-reshard are FSDP2's).
ENGINE_POLICY: dict[str, str | None] = {
    "sequential": "sequential", "ddp": None, "low-priority": "concurrent", "priority": "priority", "ctas": None,
    "prefetch": None, "no-reshard": None, "zero-sm": None, "paced": None,
    "shaping": "shaping+priority", "partition": "partition", "carveout": None, "windowed-carveout": None,
    "auto": "auto"}
#: Kinds of FSDP2's alone (a DDP has no parameters to all-gather ahead or to keep gathered): its
#: auto tries them, DDP's does not, and bench torch runs them under --fsdp only. ``ctas`` is both's:
#: under DDP, ctas:8 ran 0.78x plain DDP where auto without it kept 0.85x (H200, e41cccb, docs/ddp.md).
FSDP_KINDS = (Kind.PREFETCH.value, Kind.NO_RESHARD.value)
#: Kinds no auto tries: ``zero-sm`` needs FSDP2's custom collectives, a torch and NCCL that offer
#: the CTA policy ZERO, and one rank per GPU, and has not yet run on a GPU where it can; ``paced``
#: waits at each step's end, and a step after a wait ran faster whatever its policy (docs/ddp.md):
#: auto's rounds, a step of each candidate in turn, would credit a paced step's speed to the next
#: candidate. Fixed policies only.
FIXED_ONLY = (Kind.ZERO_SM.value, Kind.PACED.value)
#: The channel counts of the ``ctas`` candidates (auto's and bench torch's): a quarter and half of
#: the 16 that a carveout or partition of 32 SMs gives each of two ranks on a GPU.
CTAS = (4, 8)
#: The depths of the ``prefetch`` candidates (FSDP2's auto and bench torch's), and the deepest taken:
#: each module ahead holds its parameters unsharded that much earlier.
PREFETCH = (2,)
MAX_PREFETCH = 8
#: How many times ``Auto.check_steps`` a check in blocks may run to by default (``Auto.check_most``).
CHECK_TIMES = 6
#: The bounds of an SM count kept for NCCL, wherever one enters (a policy's name, overlap()'s
#: ``sms``, bench torch's ``--sms``).
SMS_BOUNDS = {"least": 1, "most": MAX_SMS}


@dataclass(frozen=True)
class Auto:
    """auto's options, as ``overlap(ddp, policy=Auto(...))`` takes them (``"auto"`` is
    ``Auto()``): ``sms``, the SMs its partition and carveout candidates keep for NCCL;
    ``trial_steps``, the rounds of its search and of its confirmation (a round: one warm-up step
    and ``trial_block`` timed steps per candidate: one-step visits hid ``sequential``'s gain on an
    H100 at 8eb640b, :mod:`shimrt.torch.trials`); ``trial_drop``, after the search's first round,
    how much slower than plain DDP and the median candidate a candidate may run and still visit on
    (None: every candidate runs every round); ``margin``, how much faster than plain DDP its pick must
    be (beyond the trials' noise, which it also asks; a block check holds a pick at one speed
    beside a plain DDP at two without it: :mod:`shimrt.torch.trials`); ``check_steps``, the rounds of the check
    that a pick other than plain DDP must pass once the others' resources are gone (a round: a
    warm-up and a timed step of plain DDP, then of the pick; 0: no check); ``check_block``, timed
    steps per visit of the check (above 1: the check runs in blocks, as the job will, and decides
    on its own steps: :mod:`shimrt.torch.trials`; at least 2 ``check_steps`` then; 1: one step per
    visit, alternating); ``check_always``, check the fastest other finalist even when the trials
    kept plain DDP (with ``check_steps`` 0, plain DDP is kept: nothing unchecked ever is);
    ``check_most``, the rounds a check in blocks may run to, ``check_steps`` more at a time while
    its visits cannot tell (its pick leads plain DDP within the noise, or trails it within the
    noise where the trials had it faster by the margin and no tie holds it): a multiple of
    ``check_steps`` (None: six times
    ``check_steps``, at most 1000, read through :attr:`most_check_rounds`: on an H200 at c81df25
    a 3% lead over a plain DDP at two speeds was 1.3 standard errors after 8 rounds, which 24
    rounds of the same visits would make 2.3). Blocks
    of 6 checked always are the default since an H100 run (docs/ddp.md, b0f05c9) where, on the one
    configuration whose plain DDP ran at one speed, they kept carveout:32 (0.959x plain DDP, the
    best fixed way 0.957x) while the alternating check kept plain DDP; ``ctas``, the NCCL channel
    counts of its ``ctas:N`` candidates and ``prefetch``, the depths of its ``prefetch:N`` ones
    (FSDP2's only); ``no_reshard``, whether FSDP2's auto tries ``no-reshard`` (where the
    parameters it keeps unsharded take at most a quarter of the GPU's free memory);
    ``guard_steps``, once a check has held a pick, that many steps of it alone (after
    ``check_block`` untimed ones), kept only if their mean is below plain DDP's in the check (a
    tie the trials broke: within ``margin`` of it; 0: no guard; :mod:`shimrt.torch.trials`: a
    pick kept under FSDP2 ran 6-13% slower alone than its check had measured it, on an H100 at
    8b70d5d); and, once a check gave way on a pick the trials had faster by ``margin``, that many
    steps of plain DDP alone, then of the pick alone where plain DDP ran slower than the pick had in
    the check, the pick kept if faster alone by ``margin`` (plain DDP ran its whole check at its
    fast level and 22% slower once kept, on an H100 at e888d1f)."""

    sms: tuple[int, ...] = (32, 48, 64)
    trial_steps: int = 3
    trial_block: int = 3
    trial_drop: float | None = 0.3
    margin: float = 0.01
    check_steps: int = 4
    check_block: int = 6
    check_always: bool = True
    check_most: int | None = None
    ctas: tuple[int, ...] = CTAS
    prefetch: tuple[int, ...] = PREFETCH
    no_reshard: bool = True
    guard_steps: int = 12

    def __post_init__(self) -> None:
        object.__setattr__(self, "guard_steps", validate.integer(self.guard_steps, "Auto.guard_steps", least=0,
                                                                 most=1000))
        object.__setattr__(self, "no_reshard", validate.boolean(self.no_reshard, "Auto.no_reshard"))
        object.__setattr__(self, "sms", tuple(kept_sms(self.sms, "Auto.sms")))
        object.__setattr__(self, "ctas", tuple(distinct_counts(self.ctas, "Auto.ctas")))
        object.__setattr__(self, "prefetch", tuple(distinct_counts(self.prefetch, "Auto.prefetch", MAX_PREFETCH)))
        object.__setattr__(self, "trial_steps", validate.integer(self.trial_steps, "Auto.trial_steps", least=1,
                                                                 most=1000))
        object.__setattr__(self, "trial_block", validate.integer(self.trial_block, "Auto.trial_block", least=1,
                                                                 most=1000))
        if self.trial_drop is not None:
            object.__setattr__(self, "trial_drop", validate.number(self.trial_drop, "Auto.trial_drop", least=0.05,
                                                                   most=10))
        object.__setattr__(self, "margin", validate.number(self.margin, "Auto.margin", least=0, most=0.5))
        object.__setattr__(self, "check_steps", validate.integer(self.check_steps, "Auto.check_steps", least=0,
                                                                 most=1000))
        object.__setattr__(self, "check_block", validate.integer(self.check_block, "Auto.check_block", least=1,
                                                                 most=1000))
        object.__setattr__(self, "check_always", validate.boolean(self.check_always, "Auto.check_always"))
        if self.check_most is not None:
            object.__setattr__(self, "check_most", validate.integer(self.check_most, "Auto.check_most",
                                                                    least=self.check_steps, most=1000))
            if self.check_steps and self.check_most % self.check_steps:
                raise UsageError(f"Auto.check_most must be a multiple of check_steps ({self.check_steps}): the check "
                                 f"runs check_steps rounds more at a time, not {self.check_most}")
        if self.check_block > 1 and self.check_steps == 1:
            raise UsageError(f"Auto.check_block above 1 (here {self.check_block}; the default is 6) needs at least 2 "
                             "check_steps (the check's noise is taken between its visits), not check_steps=1: pass "
                             "check_block=1 for a one-round check")

    @property
    def most_check_rounds(self) -> int:
        """The rounds a check in blocks may run to: ``check_most``, or the greatest multiple of
        ``check_steps`` up to six times it and 1000 (``check_steps`` itself above 500: no rounds
        more)."""
        if self.check_most is not None:
            return self.check_most
        return self.check_steps * max(1, min(CHECK_TIMES, 1000 // max(1, self.check_steps)))


def kept_sms(values: Any, what: str = "sms") -> list[int]:
    """``values`` as a list of distinct SM counts kept for NCCL (:data:`SMS_BOUNDS`)."""
    import numpy as np
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range, np.ndarray)):
        raise UsageError(f"{what} must be a list of SM counts such as [32, 64], not {validate.shown(values)}")
    out = [validate.integer(k, what, **SMS_BOUNDS) for k in list(values)]
    if len(set(out)) != len(out):
        raise UsageError(f"{what} must list each SM count once, not {out}")
    if not out:
        raise UsageError(f"{what} must list at least one SM count, not an empty list")
    return out


def distinct_counts(values: Any, what: str = "ctas", most: int = 64) -> list[int]:
    """``values`` as a list of distinct counts from 1 to ``most`` (NCCL's 64 channels, or
    :data:`MAX_PREFETCH` modules), possibly empty."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range)):
        raise UsageError(f"{what} must be a list of counts such as [2, 4], not {validate.shown(values)}")
    out = [validate.integer(n, what, least=1, most=most) for n in list(values)]
    if len(set(out)) != len(out):
        raise UsageError(f"{what} must list each count once, not {out}")
    return out


def channels_for(sms: int, ranks_per_gpu: int) -> int:
    """NCCL's channels per rank where ``sms`` SMs are kept for the ranks on a GPU: one block per
    channel, one NCCL block per SM, between 1 and NCCL's 64."""
    return max(1, min(64, sms // ranks_per_gpu))


def make(kind: str, number: int | None = None) -> Policy:
    """The policy of ``kind`` (see the module's docstring) with its number (the cap, or the SMs
    kept); its NCCL channels follow from the SMs kept once the ranks per GPU are known
    (:meth:`Policy.channels`)."""
    validate.one_of(kind, "policy kind", KINDS[:-1])
    if kind not in NUMBERED:
        if number is not None:
            raise UsageError(f"policy {kind!r} takes no number, not {number!r}")
        if kind == Kind.SEQUENTIAL:
            return Policy("sequential", priority="low", baseline="sequential")
        if kind == Kind.DDP:
            return Policy("ddp", baseline="plain")
        if kind == Kind.ZERO_SM:
            return Policy("zero-sm", zero_sm=True)
        if kind == Kind.PACED:
            return Policy("paced", baseline="plain", pace=True)
        if kind == Kind.NO_RESHARD:
            return Policy("no-reshard", no_reshard=True)
        return Policy(kind, priority="high" if kind == Kind.PRIORITY else "low")
    if number is None:
        example = {Kind.SHAPING: 2, Kind.CTAS: 8, Kind.PREFETCH: 2}.get(Kind(kind), 48)
        raise UsageError(f"policy {kind!r} needs a number: {kind}:N (e.g. {kind}:{example})")
    most = {Kind.SHAPING: 64, Kind.CTAS: 64, Kind.PREFETCH: MAX_PREFETCH}.get(Kind(kind))
    n = validate.integer(number, f"{kind}'s number", least=1, most=most) if most is not None else \
        validate.integer(number, f"{kind}'s number", **SMS_BOUNDS)
    if kind == Kind.CTAS:
        return Policy(f"ctas:{n}", ctas=n)
    if kind == Kind.PREFETCH:
        return Policy(f"prefetch:{n}", prefetch=n)
    if kind == Kind.SHAPING:
        return Policy(f"shaping:{n}", compute=Shaping(n))
    if kind == Kind.PARTITION:
        return Policy(f"partition:{n}", compute=Partition(n))
    return Policy(f"{kind}:{n}", compute=Carveout(n, window=kind == Kind.WINDOWED_CARVEOUT))


def parse(text: Any) -> Policy:
    """The policy a name such as ``"priority"`` or ``"partition:48"`` stands for (a Policy as it is)."""
    if isinstance(text, Policy):
        return text
    if type(text) is not str and isinstance(text, str):  # a str subclass (numpy's str_) is its text
        text = str(text)
    allowed = (f"a Policy, or one of {', '.join(k + (':N' if k in NUMBERED else '') for k in KINDS[:-1])}")
    if not isinstance(text, str):
        raise UsageError(f"policy must be {allowed}, not {validate.shown(text)}")
    kind, _, number = text.partition(":")
    if kind not in KINDS[:-1]:
        raise UsageError(f"policy must be {allowed}, not {text!r:.100}")
    if number and not (number.isascii() and number.isdigit()):
        raise UsageError(f"{kind}:N takes a positive whole number N, not {number!r:.40}")
    return make(kind, int(number) if number else None)


def candidates(sms: Iterable[int], kinds: Iterable[str] = KINDS, ctas: Iterable[int] = CTAS,
               prefetch: Iterable[int] = PREFETCH) -> list[Policy]:
    """The fixed policies of ``kinds`` (auto's candidates, or a bench's list), baselines first:
    NCCL held to each of ``ctas`` channels, FSDP2 prefetching each of ``prefetch`` modules ahead,
    shaping at N=2 and 1, partition and both carveouts at each of ``sms``."""
    kinds = tuple(kinds)
    out = [make(k) for k in ("sequential", "ddp", "low-priority", "priority") if k in kinds]
    if "ctas" in kinds:
        out += [make("ctas", n) for n in ctas]
    if "prefetch" in kinds:
        out += [make("prefetch", n) for n in prefetch]
    if "no-reshard" in kinds:
        out.append(make("no-reshard"))
    if "zero-sm" in kinds:
        out.append(make("zero-sm"))
    if "paced" in kinds:
        out.append(make("paced"))
    if "shaping" in kinds:
        out += [make("shaping", n) for n in (2, 1)]
    for k in sms:
        out += [make(kind, k) for kind in ("partition", "carveout", "windowed-carveout") if kind in kinds]
    return out


def kind(policy: Policy) -> str:
    """The kind of ``policy`` (its name before the colon)."""
    return policy.name.partition(":")[0]
