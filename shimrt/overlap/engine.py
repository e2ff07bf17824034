"""Run a schedule of compute launches and collectives under a policy, timed on the device.

A :class:`~shimrt.overlap.schedule.Schedule` lists operations in launch order (compute
launches, and collectives that may wait for one); an :class:`Engine` runs it under a
:class:`~shimrt.overlap.planner.Choice`:

- ``sequential``: one stream, everything in order;
- ``concurrent``: compute on one stream, collectives on another, both at the least priority;
- ``priority``: collectives on the device's greatest-priority stream;
- ``shaping``: compute launched with the dynamic shared memory that caps it at N blocks per SM;
- ``shaping+priority``: both (the method shimrt is built on);
- ``partition``: compute and collectives on disjoint SM sets (green contexts / CU masks).

Times come from the kernels' own per-block timestamps (``shimrt_block_begin/end``), or from
CUPTI's kernel records for kernels shimrt does not compile (NCCL's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import kernel as kernel_module
from .. import occupancy, validate
from ..device import Device, Partition
from ..errors import ShimrtError, UsageError
from ..kernel import Kernel
from ..stream import Event, timeout_seconds
from . import metrics, planner
from .planner import Choice
from .schedule import KINDS, CommWork, ComputeWork, Op, Schedule

__all__ = ["Result", "Engine"]

#: The most repeats a run takes: more is a typo, not a measurement (each repeat runs the schedule).
MAX_REPEATS = 10_000


def _threads(work: ComputeWork) -> int:
    """Threads per block of a compute workload."""
    return int(np.prod(work.block))


@dataclass
class Timing:
    """One run: per-block rows ``[start_ms, end_ms, sm]`` per kind, relative to the first start;
    ``ops``: each op's span by its index in the schedule."""

    rows: dict[str, np.ndarray]
    makespan: float
    compute: metrics.Span | None
    comm: metrics.Span | None
    ops: dict[int, metrics.Span] = field(default_factory=dict)


def _timing_of(per_op: dict[int, np.ndarray], kinds: dict[int, str]) -> Timing:
    """A run's Timing from rows per op (``kinds``: op index -> kind): each op's and each side's
    span, and first start to last end."""
    parts: dict[str, list[np.ndarray]] = {}
    for i, r in per_op.items():
        parts.setdefault(kinds[i], []).append(r)
    rows = {k: np.concatenate(v) for k, v in parts.items()}
    spans = {k: metrics.span(v) for k, v in rows.items()}
    makespan = max(sp.end for sp in spans.values()) - min(sp.start for sp in spans.values())
    return Timing(rows, makespan, spans.get("compute"), spans.get("comm"),
                  {i: metrics.span(r) for i, r in per_op.items()})


@dataclass
class Result:
    """A measured policy: the choice, medians, the metrics and the median run's timeline."""

    policy: str
    choice: Choice
    timings: list[Timing]
    metrics: metrics.Metrics | None = None
    note: str = ""
    detail: str = ""  # what the choice alone does not say (e.g. the NCCL communicator auto picked)

    @property
    def makespan(self) -> float:
        return float(np.median([t.makespan for t in self.timings]))

    def median_timing(self) -> Timing:
        """The repeat whose makespan is the median: the one reports show."""
        return self.timings[metrics.median_run([x.makespan for x in self.timings])]

    def blocks(self) -> dict:
        """Blocks per kind in the median run (all of them, whatever a timeline keeps)."""
        return {kind: len(rows) for kind, rows in self.median_timing().rows.items()}

    def timeline(self, max_blocks: int = 3000) -> dict:
        """The median run's rows per kind, in ms to 0.1 us; a kind with more than ``max_blocks``
        blocks keeps an even sample of them, always with its first start and last end."""
        max_blocks = validate.integer(max_blocks, "max_blocks", least=2)
        out = {}
        for kind, rows in self.median_timing().rows.items():
            if len(rows) > max_blocks:
                keep = set(np.linspace(0, len(rows) - 1, max_blocks).astype(int).tolist())
                keep |= {int(rows[:, 0].argmin()), int(rows[:, 1].argmax())}
                rows = rows[sorted(keep)]
            out[kind] = np.round(rows, 4).tolist()
        return out


def _choice(choice) -> Choice:
    if not isinstance(choice, Choice):
        raise UsageError(f"choice must be a planner.Choice (planner.plan(...)), not {choice!r}")
    return choice


class _Setup:
    """Streams and kernels for one choice (partitions hold their own copies of the kernels)."""

    def __init__(self, engine: "Engine", choice: Choice):
        dev = engine.device
        self.parts: tuple[Partition, ...] = ()
        self.kernels: dict[int, Kernel] = {}
        self.places: dict[str, Device]
        if choice.policy == "partition":
            if choice.partition_sms is None:
                raise UsageError("a partition choice needs partition_sms (planner.plan('partition', ...))")
            comm_part, compute_part = self.parts = dev.partition(choice.partition_sms)
            self.places = {"compute": compute_part, "comm": comm_part}
            for i, op in enumerate(engine.schedule.ops):
                k = op.compute.kernel if op.kind == "compute" else op.comm.kernel
                if k is not None:  # NCCL brings its own kernels
                    self.kernels[i] = self.places[op.kind].load(k.module.program)[k.name]
        else:
            self.places = {"compute": dev, "comm": dev}
        self.compute_stream = self.places["compute"].stream("low")
        self.comm_stream = self.compute_stream if choice.policy == "sequential" else \
            self.places["comm"].stream(choice.comm_priority)
        # The padding of each compute op: the choice's own for the kernel the planner saw, and the
        # occupancy model's for the same cap for any other kernel of the schedule; each confirmed
        # with the driver once (Kernel.confirm), then applied as computed.
        self.dynamic_smem: dict[int, int] = {}
        self.carveout: dict[int, int | None] = {}
        first = engine.schedule.of("compute")[0].compute
        resident = choice.resident_blocks  # None: unshaped
        for i, op in enumerate(engine.schedule.ops):
            if op.kind != "compute":
                continue
            work = op.compute
            k = self.kernels.get(i, work.kernel)
            if resident is None:
                self.dynamic_smem[i] = 0
                self.carveout[i] = None  # the driver's default split, as without shimrt
                continue
            threads = _threads(work)
            if work.kernel is first.kernel and threads == _threads(first):
                k.confirm(threads, choice.dynamic_smem, resident)
                self.dynamic_smem[i] = choice.dynamic_smem
            else:  # another kernel: the same cap, or its own residency where that is lower
                natural = occupancy.max_active_blocks(dev.target, block_size=threads, **k.occupancy_resources)
                self.dynamic_smem[i] = k.shape(threads, resident_blocks=min(resident, natural)).dynamic_smem
            self.carveout[i] = kernel_module.SHAPED_CARVEOUT  # all shared memory, so the room left is real
        # Recorded on the compute stream, so made where it lives; waiting on it works across contexts.
        self.events = {i: self.places["compute"].event(timing=False)
                       for i, op in enumerate(engine.schedule.ops) if op.kind == "compute"}

    def close(self) -> None:
        for e in self.events.values():
            e.close()
        if self.comm_stream is not self.compute_stream:
            self.comm_stream.close()
        self.compute_stream.close()
        for p in self.parts:
            p.close()


class Engine:
    """Runs ``schedule`` on ``device`` under any choice, ``repeats`` times, and reports metrics.

    Every stream wait is bounded (``timeout_s``): a run that does not finish raises ShimrtError
    instead of hanging.
    """

    def __init__(self, device: Device, schedule: Schedule, *, repeats: int = 5, timeout_s: float = 30.0):
        if not isinstance(schedule, Schedule):
            raise UsageError(f"schedule must be a Schedule, not {schedule!r:.100}")
        repeats = validate.integer(repeats, "repeats", least=1, most=MAX_REPEATS)
        timeout_s = timeout_seconds(timeout_s, "timeout_s")
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        self.device, self.schedule, self.repeats, self.timeout_s = device, schedule, repeats, timeout_s
        self.hz = device.timestamp_hz
        # Enough stamp words for any grid an op may be launched with.
        self._stamps = {i: device.empty(3 * self._max_blocks(op), np.uint64) for i, op in enumerate(schedule.ops)}
        self._setups: dict[Choice, _Setup] = {}
        self._alone: tuple[float, float] | None = None
        self.comm_kind = schedule.of("comm")[0].comm.kind

    @staticmethod
    def _max_blocks(op: Op) -> int:
        return op.comm.max_blocks if op.kind == "comm" else op.compute.blocks

    def close(self) -> None:
        for s in self._setups.values():
            s.close()
        self._setups.clear()

    # --- planning ---
    def problem(self) -> planner.Problem:
        """The planner's view: the first compute kernel and the first collective's footprint."""
        c = self.schedule.of("compute")[0].compute
        a = self.schedule.of("comm")[0].comm
        return self._problem_of(c.kernel, _threads(c), a)

    def _problem_of(self, kernel: Kernel, threads: int, comm: CommWork) -> planner.Problem:
        return planner.Problem(self.device.target, kernel.occupancy_resources, threads, comm.footprint(),
                               comm.blocks())

    # --- running ---
    def _setup(self, choice: Choice) -> _Setup:
        s = self._setups.get(choice)
        if s is None:
            s = self._setups[choice] = _Setup(self, choice)
        return s

    def run_once(self, choice: Choice, only: str | None = None) -> Timing:
        """One run of the schedule (or of its ``only`` = "compute"/"comm" ops, alone)."""
        _choice(choice)
        if only is not None:
            validate.one_of(only, "only (or None)", KINDS)
        s = self._setup(choice)
        ops = [(i, op) for i, op in enumerate(self.schedule.ops) if only in (None, op.kind)]
        self.device.synchronize(self.timeout_s)
        for i, _ in ops:
            self._stamps[i].memset(0)
        for i, op in ops:  # kernels are shared between choices: set the carveout of this one
            if op.kind == "compute":
                s.kernels.get(i, op.compute.kernel).set_carveout(s.carveout[i])
        if self.comm_kind == "nccl":  # NCCL's kernels carry no stamps: the device's tracer times them
            with self.device.record_kernels() as recorder:
                self._launch(s, ops, choice, only)
            # CUPTI records every GPU of the process: only this one's kernels share its SMs.
            return self.timing_from_records(ops, [r for r in recorder.kernels
                                                   if r.get("device_id", self.device.index) == self.device.index])
        self._launch(s, ops, choice, only)
        for op in self.schedule.of("comm"):
            op.comm.raise_if_stalled()
        return self._timing(ops, choice)

    def _launch(self, s: _Setup, ops: list[tuple[int, Op]], choice: Choice, only: str | None) -> None:
        # Everything is checked and packed first, so the launches follow each other with no
        # host work between: a collective's start delay is then the device's doing.
        steps: list[tuple[Device, Callable[[], None], Event | None, Event | None]] = []
        for i, op in ops:
            place, k = s.places[op.kind], s.kernels.get(i)
            place.activate()
            if op.kind == "compute":
                run = op.compute.prepare(s.compute_stream, dynamic_smem=s.dynamic_smem[i], stamps=self._stamps[i],
                                         kernel=k)
                steps.append((place, run, s.events[i], None))
            else:
                run = op.comm.prepare(s.comm_stream, stamps=self._stamps[i], kernel=k, blocks=choice.comm_blocks,
                                      threads=choice.comm_threads)
                wait = s.events[op.after] if op.after is not None and only is None else None
                steps.append((place, run, None, wait))
        for place, run, done, wait in steps:
            place.activate()  # a green context must be current to launch into it
            if wait is not None:
                s.comm_stream.wait(wait)
            run()
            if done is not None:
                done.record(s.compute_stream)
        self.device.activate()
        s.compute_stream.synchronize(self.timeout_s)
        s.comm_stream.synchronize(self.timeout_s)

    @staticmethod
    def timing_from_records(ops: list[tuple[int, Op]], records: list[dict]) -> Timing:
        """Rows ``[start_ms, end_ms, -1]`` per kernel from CUPTI (no SM is known per kernel)."""
        names = {op.compute.kernel.name for _, op in ops if op.kind == "compute"}
        kinds: dict[str, list[dict]] = {"compute": [], "comm": []}
        for r in records:
            if r["name"] in names:
                kinds["compute"].append(r)
            else:  # the engine launched nothing else: NCCL's kernels (C++-mangled names)
                kinds["comm"].append(r)
        if kinds["comm"]:  # NCCL picks its channels (one block each), threads and shared memory
            last = kinds["comm"][-1]
            for _, op in ops:
                if op.kind == "comm":
                    op.comm.observe(last)
        wanted = {op.kind for _, op in ops}
        missing = [k for k in wanted if not kinds[k]]
        if missing:
            raise ShimrtError(f"CUPTI recorded no {' or '.join(missing)} kernel (NCCL may have used a copy: "
                              "with one rank only send_recv launches a kernel)")
        origin = min(r["start"] for k in wanted for r in kinds[k])
        # Each side's ops run one after another on its stream: the kernels of a kind, by start,
        # follow its ops (NCCL launches one kernel per collective and rank here).
        per_op: dict[int, np.ndarray] = {}
        of: dict[int, str] = {}
        for kind in wanted:
            idx = [i for i, op in ops if op.kind == kind]
            recs = sorted(kinds[kind], key=lambda r: r["start"])
            # k kernels per op (one per rank of this process), in start order; no whole number of
            # them per op: every kernel of the side goes to its first op.
            k = len(recs) // len(idx) if len(recs) % len(idx) == 0 else 0
            groups = [recs[j:j + k] for j in range(0, len(recs), k)] if k else [recs]
            for i, group in zip(idx, groups, strict=False):
                per_op[i] = np.array([[(r["start"] - origin) / 1e6, (r["end"] - origin) / 1e6, -1] for r in group])
                of[i] = kind
        return _timing_of(per_op, of)

    def _timing(self, ops: list[tuple[int, Op]], choice: Choice) -> Timing:
        raw = {}
        for i, op in ops:
            n = op.comm.blocks(choice.comm_blocks) if op.kind == "comm" else op.compute.blocks
            raw[i] = self._stamps[i][: 3 * n].numpy()  # only the words this launch wrote
        origin = min(int(r.reshape(-1, 3)[:, 0].min()) for r in raw.values())
        per_op = {}
        for i, op in ops:
            try:
                per_op[i] = metrics.blocks(raw[i], self.hz, origin)
            except UsageError as exc:
                raise ShimrtError(f"op {i} ({op.work.label}): {exc}") from None
        return _timing_of(per_op, {i: op.kind for i, op in ops})

    def run(self, choice: Choice, repeats: int | None = None, only: str | None = None,
            warmup: int = 1) -> list[Timing]:
        """``warmup`` untimed runs, then ``repeats`` timed ones (default: the engine's) of ``choice``
        (``only``: "compute" or "comm" ops alone)."""
        _choice(choice)
        repeats = self.repeats if repeats is None else validate.integer(repeats, "repeats", least=1,
                                                                         most=MAX_REPEATS)
        warmup = validate.integer(warmup, "warmup", least=0, most=MAX_REPEATS)
        if only is not None:
            validate.one_of(only, "only (or None)", KINDS)
        for _ in range(warmup):
            self.run_once(choice, only)
        return [self.run_once(choice, only) for _ in range(repeats)]

    def alone(self) -> tuple[float, float]:
        """(T_comp, T_comm): the medians of each side run by itself, unshaped (ms)."""
        if self._alone is None:
            base = Choice("sequential")
            comp = float(np.median([t.makespan for t in self.run(base, only="compute")]))
            comm = float(np.median([t.makespan for t in self.run(base, only="comm")]))
            self._alone = (comp, comm)
        return self._alone

    def measure(self, choice: Choice, t_seq: float | None = None) -> Result:
        """Run ``choice`` ``repeats`` times; metrics against the sequential time ``t_seq``
        (measured now when not given)."""
        _choice(choice)
        if t_seq is not None:
            t_seq = validate.number(t_seq, "t_seq (ms)", positive=True)
        t_comp, t_comm = self.alone()
        timings = self.run(choice)
        result = Result(choice.policy, choice, timings)
        if t_seq is None:
            t_seq = result.makespan if choice.policy == "sequential" else self.measure(Choice("sequential")).makespan
        lengths, delays = [], []
        for t in timings:
            if t.compute is None or t.comm is None:  # a run of the whole schedule times both sides
                raise ShimrtError(f"a run of {self.schedule.label} has no {'compute' if t.compute is None else 'comm'}"
                                  " span")
            lengths.append(t.compute.length)
            delays.append(t.comm.start - t.compute.start)
        comp_span = float(np.median(lengths))
        delay = float(np.median(delays))
        result.metrics = metrics.compute(t_comp, t_comm, t_seq, result.makespan, comp_span, delay)
        return result

