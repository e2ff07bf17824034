"""Policies and the choices behind them: pure arithmetic on the occupancy model, no GPU.

A :class:`Problem` says what runs side by side: a compute kernel (its registers, static shared
memory and block size) and a communication kernel (its per-block :class:`Footprint` and its
number of blocks, one per channel). :func:`plan` turns a fixed policy into a :class:`Choice`;
:func:`candidates` lists what ``auto`` measures, after the occupancy model has ruled out the
choices that cannot work at all (and says why for each). :mod:`.auto` measures them and keeps
what it picked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import occupancy, validate
from ..errors import ShimrtError, UsageError
from ..occupancy import Footprint
from ..stream import PRIORITIES
from ..targets import MAX_BLOCK_THREADS, MAX_SMS, Target

__all__ = ["POLICIES", "FIXED", "Choice", "Problem", "plan", "Estimate", "estimate", "Rejected", "candidates", "sweeps"]

#: Every policy, in report order; ``auto`` picks among the choices of the others.
POLICIES = ("sequential", "concurrent", "priority", "shaping", "shaping+priority", "partition", "auto")
FIXED = POLICIES[:-1]
MAX_MS = 1e12  # the longest time estimate() takes, in ms


@dataclass(frozen=True)
class Choice:
    """How one run is set up.

    ``resident_blocks``: the compute kernel's cap per SM (None: unshaped) and ``dynamic_smem`` the
    padding that sets it; ``comm_priority``: the communication stream's priority;
    ``partition_sms``: SMs set apart for communication (None: shared); ``comm_blocks`` and
    ``comm_threads``: the communication kernel's blocks (NCCL's CTAs/channels) and threads per
    block (None: its default).
    """

    policy: str
    resident_blocks: int | None = None
    dynamic_smem: int = 0
    comm_priority: str = "low"
    partition_sms: int | None = None
    comm_blocks: int | None = None
    comm_threads: int | None = None

    def __post_init__(self) -> None:
        validate.one_of(self.policy, "policy", FIXED)
        validate.one_of(self.comm_priority, "comm_priority", PRIORITIES)
        # numpy integers become ints: a Choice is a dict key (auto's times) and goes to JSON. The
        # bounds are any GPU's (a Choice may be read back from auto's cache before a device is
        # known); the launch checks the device's own: blocks a C int, the padding an unsigned int.
        for name, most in (("resident_blocks", validate.MAX_INT32), ("partition_sms", MAX_SMS),
                           ("comm_blocks", validate.MAX_INT32), ("comm_threads", MAX_BLOCK_THREADS)):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, validate.integer(value, f"{name} (or None)", least=1, most=most))
        object.__setattr__(self, "dynamic_smem", validate.integer(self.dynamic_smem, "dynamic_smem", least=0,
                                                                  most=validate.MAX_UINT32))
        if self.resident_blocks is None and self.dynamic_smem:
            raise UsageError("dynamic_smem is set only with resident_blocks")

    @property
    def shaped(self) -> bool:
        return self.resident_blocks is not None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Choice":
        """The inverse of :meth:`as_dict`; UsageError for anything else (unknown keys included)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, Mapping):
            raise UsageError(f"Choice.from_dict takes a dict of {', '.join(sorted(fields))}, not {data!r}")
        unknown = sorted(map(str, set(data) - fields))
        if unknown:
            raise UsageError(f"Choice keys must be among {', '.join(sorted(fields))}, not {', '.join(unknown)}")
        if "policy" not in data:
            raise UsageError(f"Choice.from_dict needs a 'policy', not {dict(data)!r}")
        return cls(**data)

    def describe(self) -> str:
        """The choice in a few words, e.g. "partition: comm on 16 SMs, high priority"."""
        parts = []
        if self.shaped:
            parts.append(f"N={self.resident_blocks}")
        if self.partition_sms:
            parts.append(f"comm on {self.partition_sms} SMs")
        if self.comm_priority == "high":
            parts.append("high priority")
        if self.comm_blocks:
            parts.append(f"{self.comm_blocks} CTAs")
        if self.comm_threads:
            parts.append(f"{self.comm_threads} threads")
        return self.policy + (": " + ", ".join(parts) if parts else "")


@dataclass(frozen=True)
class Problem:
    """A compute kernel and a communication kernel meant to run side by side on ``target``.

    ``compute``: the compute kernel's resources (``registers``, ``static_smem``, optionally
    ``sgprs``) and ``compute_block`` its threads per block; ``comm``: the communication kernel's
    per-block footprint (``comm.blocks``: blocks it needs per SM, normally 1) and ``comm_blocks``
    its grid, one block per channel.
    """

    target: Target
    compute: dict
    compute_block: int
    comm: Footprint
    comm_blocks: int

    def __post_init__(self) -> None:
        if not isinstance(self.target, Target):
            raise UsageError(f"target must be a shimrt Target (shimrt.targets.get('H200')), not {self.target!r}")
        if not isinstance(self.comm, Footprint):
            raise UsageError(f"comm must be a Footprint, not {self.comm!r:.100}")
        if not isinstance(self.compute, Mapping) or not {"registers", "static_smem"} <= set(self.compute):
            raise UsageError(f"compute must be a dict with 'registers' and 'static_smem' (and optionally 'sgprs'), "
                             f"not {self.compute!r}")
        occupancy.resource_counts(self.compute)  # every value checked
        object.__setattr__(self, "compute", dict(self.compute))  # a copy: the caller's may change later
        object.__setattr__(self, "compute_block", validate.integer(
            self.compute_block, "compute_block", least=1, most=self.target.max_threads_per_block))
        object.__setattr__(self, "comm_blocks", validate.integer(self.comm_blocks, "comm_blocks", least=1,
                                                                 most=validate.MAX_INT32))  # a grid: a C int

    def footprint(self, threads: int | None = None) -> Footprint:
        """The communication kernel's footprint, with ``threads`` per block when given."""
        return self.comm if threads is None else self.comm.with_threads(self.comm_threads(threads))

    def comm_threads(self, threads: Any) -> int:
        """``threads`` as the communication kernel's threads per block: 1 up to the target's limit."""
        return validate.integer(threads, "threads", least=1, most=self.target.max_threads_per_block)

    def comm_grid(self, blocks: Any) -> int:
        """``blocks`` as the communication kernel's blocks (channels): a positive int."""
        return validate.integer(blocks, "blocks", least=1, most=validate.MAX_INT32)

    def compute_per_sm(self) -> int:
        """Compute blocks one otherwise idle SM holds (unshaped)."""
        c = self.compute
        return occupancy.max_active_blocks(self.target, block_size=self.compute_block, registers=int(c["registers"]),
                                           static_smem=int(c["static_smem"]), sgprs=int(c.get("sgprs", 0)))

    def comm_per_sm(self, threads: int | None = None) -> int:
        """Communication blocks one otherwise idle SM holds."""
        fp = self.footprint(threads)
        return occupancy.max_active_blocks(self.target, block_size=fp.threads, registers=fp.registers,
                                           static_smem=fp.static_smem, dynamic_smem=fp.dynamic_smem, sgprs=fp.sgprs)


def _problem(problem) -> Problem:
    if not isinstance(problem, Problem):
        raise UsageError(f"problem must be a planner.Problem, not {problem!r:.100}")
    return problem


def shaped(problem: Problem, threads: int | None = None, resident_blocks: int | None = None) -> occupancy.Shaping:
    """shape() of the compute kernel with room for one block of the communication kernel."""
    fp = _problem(problem).footprint(threads)
    return occupancy.shape(problem.target, problem.compute, problem.compute_block, reserve=fp,
                           resident_blocks=resident_blocks)


def partition_sms(problem: Problem, threads: int | None = None, blocks: int | None = None) -> int:
    """The fewest SMs that hold every communication block at once (they must all be resident)."""
    blocks = None if blocks is None else _problem(problem).comm_grid(blocks)
    per_sm = _problem(problem).comm_per_sm(threads)
    if per_sm == 0:
        raise ShimrtError(f"{problem.footprint(threads).name} does not fit on one SM of {problem.target.name}")
    need = -(-(blocks or problem.comm_blocks) // per_sm)
    if need >= problem.target.num_sms:
        raise ShimrtError(f"{blocks or problem.comm_blocks} communication blocks need {need} SMs, "
                          f"{problem.target.name} has {problem.target.num_sms}: nothing would be left for compute")
    return need


def spread_sms(problem: Problem) -> int:
    """The partition's SMs: one per communication block, as NCCL's channels spread (blocks
    that share an SM share its load/store bandwidth), or the fewest that hold them all where one
    each would take half the device or more."""
    need = partition_sms(_problem(problem))
    return problem.comm_blocks if need < problem.comm_blocks < problem.target.num_sms // 2 else need


def plan(policy: str, problem: Problem) -> Choice:
    """The choice a fixed policy makes for ``problem``; ShimrtError if it cannot work (why)."""
    validate.one_of(policy, "policy", POLICIES)
    _problem(problem)
    if policy in ("sequential", "concurrent"):
        return Choice(policy)
    if policy == "priority":
        return Choice(policy, comm_priority="high")
    if policy in ("shaping", "shaping+priority"):
        s = shaped(problem)
        return Choice(policy, resident_blocks=s.resident_blocks, dynamic_smem=s.dynamic_smem,
                      comm_priority="high" if policy == "shaping+priority" else "low")
    if policy == "partition":
        return Choice(policy, partition_sms=spread_sms(problem), comm_priority="high")
    if policy == "auto":
        raise UsageError("auto is not a fixed policy: use candidates() and measure them")
    raise UsageError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")


@dataclass(frozen=True)
class Estimate:
    """The occupancy model's estimate of the best overlap, for a collective of ``comm_blocks``
    blocks with its own footprint beside the compute kernel: ``lost`` compute block slots of
    ``slots`` while it runs (on ``comm_sms`` SMs that keep ``kept`` compute blocks each, of
    ``natural``), ``makespan_ms`` and ``ratio`` the overlap that leaves, ``why`` in words.

    The model: compute's rate is proportional to its resident blocks and the collective runs at
    its own speed from the first moment, on the SMs that cost compute least; the compute work
    T_comp x slots then finishes at max(T_comm, T_comp + T_comm x lost / slots). An estimate,
    not a guarantee either way: a short collective can hide in the SMs compute's last wave
    leaves idle (then R beats it), and memory-bound kernels lose bandwidth rather than slots."""

    lost: int
    slots: int
    comm_sms: int
    kept: int
    natural: int
    makespan_ms: float
    ratio: float
    why: str


def estimate(problem: Problem, t_comp: float, t_comm: float) -> Estimate:
    """The makespan and R the occupancy model expects at best for ``problem`` (see :class:`Estimate`)."""
    _problem(problem)
    # 1e12 ms is 30 years: a longer time is a unit mistake, and near 1e308 the sums overflow.
    t_comp = validate.number(t_comp, "t_comp (ms)", positive=True, most=MAX_MS)
    t_comm = validate.number(t_comm, "t_comm (ms)", positive=True, most=MAX_MS)
    t = problem.target
    res, block = problem.compute, problem.compute_block
    natural = problem.compute_per_sm()
    per_sm = problem.comm_per_sm()
    if per_sm == 0:
        raise ShimrtError(f"{problem.comm.name} does not fit on one SM of {t.name}")
    options = []  # (lost, SMs, kept, j) for j collective blocks per SM it uses: per_sm >= 1 of them
    for j in range(1, per_sm + 1):
        full, rest = divmod(problem.comm_blocks, j)
        kept = occupancy.coresident(t, res, block, dataclasses.replace(problem.comm, blocks=j))
        lost = full * (natural - kept)
        if rest:
            lost += natural - occupancy.coresident(t, res, block, dataclasses.replace(problem.comm, blocks=rest))
        options.append((lost, full + (rest > 0), kept, j))
    lost, sms, kept, j = min(options, key=lambda o: o[0])  # the first of the least lost
    slots = t.num_sms * natural
    makespan = max(t_comm, t_comp + t_comm * lost / slots)
    why = (f"{problem.comm_blocks} blocks of {problem.comm.name} take {sms} SMs ({j} each), where "
           f"{kept} of {natural} compute blocks still fit: {lost} of {slots} compute slots lost while it runs")
    return Estimate(lost, slots, sms, kept, natural, makespan, makespan / max(t_comp, t_comm), why)


@dataclass(frozen=True)
class Rejected:
    """A choice the occupancy model rules out, and why."""

    what: str
    why: str


def candidates(problem: Problem, *, threads: Any = (None,), blocks: Any = (None,), partition_steps: int = 3,
               partition_granularity: int = 8) -> tuple[list[Choice], list[Rejected]]:
    """What ``auto`` measures: every fixed policy's own choice, every residency cap N that leaves
    room for a communication block, partitions from the fewest SMs that hold every
    communication block upward, and priority alone, each for every communication thread count
    in ``threads`` and block count in ``blocks`` (None: the default). Returns (feasible
    choices, rejected ones). ``partition_steps`` (1 up to the target's SMs) partition sizes are
    tried, each rounded up to a multiple of ``partition_granularity`` SMs (1 up to the target's SMs)."""
    t = _problem(problem).target
    threads, blocks = sweeps(problem, threads, blocks)
    partition_steps = validate.integer(partition_steps, "partition_steps", least=1, most=t.num_sms)
    partition_granularity = validate.integer(partition_granularity, "partition_granularity", least=1,
                                             most=t.num_sms)
    feasible: list[Choice] = []
    rejected: list[Rejected] = []

    def add(choice: Choice):
        if choice not in feasible:
            feasible.append(choice)

    for policy in FIXED:
        try:
            add(plan(policy, problem))
        except ShimrtError as exc:
            rejected.append(Rejected(policy, str(exc)))
    natural = problem.compute_per_sm()
    for th in threads:
        for nb in blocks:
            label = f"{nb or problem.comm_blocks} blocks x {th or problem.comm.threads} threads"
            per_sm = problem.comm_per_sm(th)
            if per_sm * t.num_sms < (nb or problem.comm_blocks):
                rejected.append(Rejected(label, f"only {per_sm * t.num_sms} such blocks fit on the device at once; "
                                                "they must all be resident"))
                continue
            if th is not None or nb is not None:  # priority alone, with the collective made smaller
                add(Choice("priority", comm_priority="high", comm_blocks=nb, comm_threads=th))
            for n in range(natural, 0, -1):
                try:
                    s = shaped(problem, th, n)
                except ShimrtError as exc:
                    rejected.append(Rejected(f"N={n}, {label}", str(exc)))
                    continue
                add(Choice("shaping+priority", resident_blocks=n, dynamic_smem=s.dynamic_smem, comm_priority="high",
                           comm_blocks=nb, comm_threads=th))
            try:
                need = partition_sms(problem, th, nb)
            except ShimrtError as exc:
                rejected.append(Rejected(f"partition, {label}", str(exc)))
                continue
            sizes = sorted({min(-(-need * k // partition_granularity) * partition_granularity, t.num_sms // 2)
                            for k in range(1, partition_steps + 1)})
            for sms in sizes:
                if sms >= need:
                    add(Choice("partition", partition_sms=sms, comm_priority="high", comm_blocks=nb, comm_threads=th))
    return feasible, rejected


def sweeps(problem: Problem, threads: Any = (None,), blocks: Any = (None,)) -> tuple[tuple, tuple]:
    """``threads`` and ``blocks`` of :func:`candidates`, checked against ``problem``."""
    _problem(problem)
    return _sweep(threads, "threads", problem.comm_threads), _sweep(blocks, "blocks", problem.comm_grid)


def _sweep(values, what: str, check) -> tuple:
    """``values`` (a non-empty list or tuple of ints and None, None meaning the default) checked by
    ``check``, without repeats."""
    if not isinstance(values, (list, tuple)) or not values:
        raise UsageError(f"{what} must be a non-empty list or tuple of ints or None (the default), not {values!r}")
    return tuple(dict.fromkeys(None if v is None else check(v) for v in values))
