"""The host time ``ov.step()`` takes of a training step, per policy: its entry and exit (the
policy's compute side set and undone, auto's timing events), the user's block not counted. Under
DDP this is all shimrt adds to the host's work: the all-reduces go through DDP's own C++ path."""

from __future__ import annotations

import time

#: The clock of the counts (nanoseconds, the host's).
now = time.perf_counter_ns


class HostCost:
    """Host time per policy: ``counters(name)`` is a list the step adds to in place:
    [ns, steps]."""

    def __init__(self) -> None:
        self.by_policy: dict[str, list[int]] = {}

    def counters(self, name: str) -> list[int]:
        found = self.by_policy.get(name)
        if found is None:
            found = self.by_policy[name] = [0, 0]
        return found

    def report(self) -> dict[str, dict[str, float | None]]:
        """Per policy: ``ov.step()``'s own host microseconds per step, and the steps counted."""
        return {name: {"step_us": ns / steps / 1e3 if steps else None, "steps": steps}
                for name, (ns, steps) in self.by_policy.items()}
