"""Overlap metrics from device timestamps: pure arithmetic, no GPU.

Times come from the kernels' own per-block timestamps (``%globaltimer`` on CUDA, the wall clock
on HIP) or from CUPTI's kernel records, never from host clocks. A run's spans are converted to
milliseconds relative to its first block start.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import numpy as np

from .. import validate
from ..errors import UsageError

__all__ = ["Span", "blocks", "span", "Metrics", "compute", "median_run"]


@dataclass(frozen=True)
class Span:
    """First start and last end of a set of blocks (or kernels), in ms."""

    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


def blocks(stamps: np.ndarray, hz: float, origin: int) -> np.ndarray:
    """Per-block ``[start_ms, end_ms, sm]`` rows from raw stamps (3 words per block: start, end,
    SM id, in ticks of ``hz``), relative to ``origin`` ticks. Every block must have written its
    stamps (start > 0, end >= start): a block that did not run means a broken measurement."""
    hz = validate.number(hz, "hz (timestamp ticks per second)", positive=True)
    origin = validate.integer(origin, "origin (ticks)", least=0, most=2**64 - 1)
    if not isinstance(stamps, np.ndarray) or stamps.dtype.kind not in "ui" or stamps.size % 3:
        raise UsageError(f"stamps must be a numpy integer array of 3 words per block, not {stamps!r:.100}"
                         + (f" of {stamps.size} {stamps.dtype}" if isinstance(stamps, np.ndarray) else ""))
    rows = np.asarray(stamps, dtype=np.uint64).reshape(-1, 3)
    if rows.size == 0:
        raise UsageError("no blocks to measure")
    start, end = rows[:, 0], rows[:, 1]
    bad = np.flatnonzero((start == 0) | (end < start))
    if bad.size:
        raise UsageError(f"{bad.size} of {len(rows)} blocks left no timestamps (first: block {bad[0]})")
    scale = 1e3 / float(hz)
    out = np.empty((len(rows), 3))
    out[:, 0] = (start.astype(np.int64) - np.int64(origin)) * scale
    out[:, 1] = (end.astype(np.int64) - np.int64(origin)) * scale
    out[:, 2] = rows[:, 2]
    return out


def span(rows: np.ndarray) -> Span:
    """The Span of per-block rows from :func:`blocks`."""
    if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.shape[1] < 2 or not len(rows):
        raise UsageError(f"rows must be the non-empty [start_ms, end_ms, sm] rows from blocks(), not {rows!r}")
    return Span(float(rows[:, 0].min()), float(rows[:, 1].max()))


@dataclass(frozen=True)
class Metrics:
    """One workload under one policy. ``t_comp_ms`` and ``t_comm_ms``: each side alone;
    ``t_seq_ms``: one after the other; ``makespan_ms``: first start to last end under the policy.

    - ``efficiency`` E = (T_seq - T_overlap) / min(T_comp, T_comm): 1.0 hides the shorter side.
    - ``ratio`` R = T_overlap / max(T_comp, T_comm): 1.0 is the physical limit.
    - ``compute_slowdown``: compute's span under the policy over compute alone.
    - ``comm_start_delay_ms``: from the first compute block's start to the first comm block's.
    - ``reduction``: 1 - T_overlap / T_seq, the time saved against running one after the other.
    """

    t_comp_ms: float
    t_comm_ms: float
    t_seq_ms: float
    makespan_ms: float
    efficiency: float
    ratio: float
    compute_slowdown: float
    comm_start_delay_ms: float
    reduction: float

    def as_dict(self) -> dict:
        return asdict(self)


def compute(t_comp: float, t_comm: float, t_seq: float, makespan: float, comp_span: float,
            comm_start_delay: float) -> Metrics:
    """The metrics of one run from its times in ms (see :class:`Metrics`)."""
    t_comp, t_comm, t_seq, makespan, comp_span = (
        validate.number(value, f"{name} (ms)", positive=True)
        for name, value in (("t_comp", t_comp), ("t_comm", t_comm), ("t_seq", t_seq), ("makespan", makespan),
                            ("comp_span", comp_span)))
    comm_start_delay = validate.number(comm_start_delay, "comm_start_delay (ms)")  # may be negative
    return Metrics(t_comp_ms=t_comp, t_comm_ms=t_comm, t_seq_ms=t_seq, makespan_ms=makespan,
                   efficiency=(t_seq - makespan) / min(t_comp, t_comm), ratio=makespan / max(t_comp, t_comm),
                   compute_slowdown=comp_span / t_comp, comm_start_delay_ms=comm_start_delay,
                   reduction=1.0 - makespan / t_seq)


def median_run(makespans: list[float]) -> int:
    """Index of the repeat whose makespan is the median (the lower one for an even count), the
    repeat whose timeline a report shows."""
    if not isinstance(makespans, (list, tuple)) or not makespans:
        raise UsageError(f"makespans must be a non-empty list of times, not {makespans!r}")
    makespans = [validate.number(m, "each makespan") for m in makespans]
    target = statistics.median_low(makespans)
    return makespans.index(target)
