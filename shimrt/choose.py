"""The one rule every auto in shimrt keeps a candidate by, and the one search that measures them.

Auto exists at three levels: the overlap engine's policies (:mod:`shimrt.overlap.auto`), NCCL's
channel settings in ``bench overlap`` (``bench/communication.auto_nccl``) and a training step's
policies (``bench torch``, and :mod:`shimrt.torch.trials` on a user's own steps). Each measures
its candidates its own way (a makespan, a run, a step's time); all of them keep one by
:func:`fastest`, and those that measure each candidate in one call go through :func:`pick`.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Hashable, Iterable, Mapping, TypeVar

from . import validate
from .errors import ShimrtError, UsageError

__all__ = ["fastest", "standard_error"]

K = TypeVar("K", bound=Hashable)


def fastest(times: Mapping[K, float], reference: K | None = None, margin: float = 0.0) -> K:
    """The key of the least time (the first of equals, in ``times``' order). With a
    ``reference``, it is kept unless another is faster by more than ``margin`` (a fraction), so an
    auto never leaves what a user already has for a gain within noise (unless the reference
    itself was not measured). A time that is infinite or NaN is a candidate that failed or was
    never timed: never kept. ShimrtError when nothing was measured (every time such, or none)."""
    margin = validate.number(margin, "margin", least=0, most=0.5)
    if not times:
        raise ShimrtError("auto has no candidate to choose from")
    if reference is not None and reference not in times:
        raise UsageError(f"reference must be one of the candidates, not {reference!r}")
    measured = {k: t for k, t in times.items() if math.isfinite(t)}
    if not measured:
        raise ShimrtError("auto measured no candidate: every one failed or was never timed")
    best = min(measured, key=measured.__getitem__)
    if reference in measured and not measured[best] < measured[reference] * (1 - margin):
        return reference
    return best


def standard_error(times: list[float]) -> float:
    """The standard error of the mean of ``times`` (0 with fewer than two): how far a candidate's
    measured mean may be from its own, the noise the autos weigh a gain against."""
    return statistics.stdev(times) / math.sqrt(len(times)) if len(times) > 1 else 0.0


def pick(candidates: Iterable[K], measure: Callable[[K], float], reference: K | None = None,
         margin: float = 0.0) -> tuple[K, dict[K, float]]:
    """Measure every candidate once (``measure(c)``: a time, inf for one that cannot run) and keep
    the :func:`fastest`; also every measured value, in the candidates' order."""
    times = {c: float(measure(c)) for c in candidates}
    return fastest(times, reference, margin), times
