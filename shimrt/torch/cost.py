"""What a training step costs under ``ov.step()``: the host time ``ov.step()`` itself takes, per
policy (:class:`HostCost`: its entry and exit, the policy's compute side set and undone, auto's
timing events; the user's block not counted; under DDP this is all shimrt adds to the host's
work, the all-reduces going through DDP's own C++ path), and the GPU time of auto's timed steps
(:class:`StepTimer`: CUDA events around each step, read once auto decides)."""

from __future__ import annotations

import time
from typing import Any, Callable

__all__ = ["now", "HostCost", "StepTimer"]

#: The clock of the counts (nanoseconds, the host's).
now = time.perf_counter_ns


class HostCost:
    """Host time per policy, [ns, steps] each, and the same of the steps under the policy in force
    (after auto's decision, or a fixed policy's every step), counted apart: a kept policy's cost
    per step is then set against a fixed one's without auto's trial steps in it."""

    def __init__(self) -> None:
        self.by_policy: dict[str, list[int]] = {}
        self.kept = [0, 0]

    def add(self, name: str, ns: int, kept: bool) -> None:
        """One step of policy ``name`` took ``ns`` of ``ov.step()``'s own host time; ``kept``: a
        step of the policy in force, not a trial's."""
        counts = self.by_policy.setdefault(name, [0, 0])
        counts[0] += ns
        counts[1] += 1
        if kept:
            self.kept[0] += ns
            self.kept[1] += 1

    def report(self) -> dict[str, dict[str, float | None]]:
        """Per policy: ``ov.step()``'s own host microseconds per step, and the steps counted."""
        return {name: _per_step(ns, steps) for name, (ns, steps) in self.by_policy.items()}

    def kept_report(self) -> dict[str, float | None]:
        """The same of the steps under the policy in force alone (none while auto tries)."""
        return _per_step(*self.kept)


def _per_step(ns: int, steps: int) -> dict[str, float | None]:
    return {"step_us": ns / steps / 1e3 if steps else None, "steps": steps}


class StepTimer:
    """auto's timed steps: :meth:`begin` records an event on the step's stream as it starts,
    :meth:`end` another as it ends (kept for the trial ``index``; None: the step does not count),
    and :meth:`collect` waits for those kept and hands each step's milliseconds over. Reading them
    waits on the GPU, so it is done once per decision, not per step."""

    def __init__(self, torch: Any):
        self._torch = torch
        self._pending: list[tuple[int, Any, Any]] = []

    def begin(self, stream: Any) -> Any:
        """An event recorded on ``stream`` now: the step's start."""
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def end(self, stream: Any, begun: Any, index: int | None) -> None:
        """The step begun at ``begun`` ends now on ``stream``; kept for trial ``index``."""
        ended = self.begin(stream)  # an event recorded now, as a start's is
        if index is not None:
            self._pending.append((index, begun, ended))

    def collect(self, record: Callable[[int, float], None]) -> None:
        """``record(index, ms)`` for every step kept since the last collection, oldest first."""
        pending, self._pending = self._pending, []
        for index, begun, ended in pending:
            ended.synchronize()
            record(index, begun.elapsed_time(ended))
