"""auto over a training loop's first steps: which policy to keep, from the steps' own times.

Each candidate runs ``warmup`` + ``steps`` steps in turn (a step counts only when it
all-reduced: a ``no_sync()`` step is run again under the same candidate); then the fastest by
median step time is kept, except that the reference (plain DDP) stays unless another beats it by
more than ``margin``, so auto never settles on a policy measured slower than DDP. The schedule
depends only on the steps' count, never on their times, so every rank switches at the same step;
the decision takes the times agreed over the ranks (the slowest rank's, through ``agree``), so
every rank keeps the same policy. No GPU here: the caller times the steps and hands them in.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Sequence

from .. import choose, validate
from ..errors import ShimrtError, UsageError


class Trials:
    """The schedule and the decision of auto (see the module's docstring). ``candidates``: the
    policies (objects with a ``name``), ``reference``: the name of the one kept unless beaten."""

    def __init__(self, candidates: Sequence[Any], *, steps: int = 3, warmup: int = 1, margin: float = 0.01,
                 reference: str | None = None):
        if not candidates or not all(isinstance(getattr(c, "name", None), str) for c in candidates):
            raise UsageError(f"candidates must be a non-empty list of policies, not {candidates!r:.100}")
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise UsageError(f"candidates must have distinct names, not {names}")
        steps = validate.integer(steps, "trial steps", least=1, most=1000)
        warmup = validate.integer(warmup, "warm-up steps", least=0, most=1000)
        self.margin = validate.number(margin, "margin", least=0, most=0.5)
        if reference is not None and reference not in names:
            raise UsageError(f"reference must be one of the candidates {names}, not {reference!r}")
        self.candidates, self.reference = list(candidates), reference
        #: (policy, warm-up?) per trial step, in order
        self.schedule = [(c, i < warmup) for c in self.candidates for i in range(warmup + steps)]
        self.position = 0
        self.times: dict[str, list[float]] = {n: [] for n in names}
        self.medians: dict[str, float] = {}
        self.picked: Any = None

    @classmethod
    def settled(cls, policy: Any) -> "Trials":
        """No trials: ``policy`` is kept from the first step."""
        trials = cls([policy], steps=1, warmup=0)
        trials.position, trials.picked = len(trials.schedule), policy
        return trials

    @property
    def exhausted(self) -> bool:
        """Every trial step has run (the decision may still wait for their times)."""
        return self.position >= len(self.schedule)

    def current(self) -> Any:
        """The policy of the next step: the kept one once decided, else the trial's."""
        if self.picked is not None:
            return self.picked
        return self.schedule[min(self.position, len(self.schedule) - 1)][0]

    def done(self, all_reduced: bool) -> int | None:
        """The step under :meth:`current` ended; ``all_reduced``: it all-reduced. Returns the
        trial step's index when its time counts (hand it to :meth:`record`), else None."""
        if self.picked is not None or self.exhausted or not all_reduced:
            return None
        index = self.position
        self.position += 1
        return None if self.schedule[index][1] else index

    def record(self, index: int, ms: float) -> None:
        """Trial step ``index`` (from :meth:`done`) took ``ms`` milliseconds."""
        index = validate.integer(index, "index", least=0, most=len(self.schedule) - 1)
        ms = validate.number(ms, "ms", least=0)
        self.times[self.schedule[index][0].name].append(ms)

    def decide(self, agree: Callable[[list[float]], list[float]] | None = None) -> Any:
        """Keep one policy: ``agree`` turns this rank's median per candidate (in candidate order;
        inf where none was timed) into the ranks' common ones (their maximum), so every rank
        decides alike."""
        if not self.exhausted:
            raise UsageError(f"auto decides after its {len(self.schedule)} trial steps, not after {self.position}")
        mine = [statistics.median(self.times[c.name]) if self.times[c.name] else math.inf for c in self.candidates]
        agreed = list(agree(mine)) if agree is not None else mine
        if len(agreed) != len(mine):
            raise UsageError(f"agree must give one time per candidate ({len(mine)}), not {len(agreed)}")
        self.medians = {c.name: float(t) for c, t in zip(self.candidates, agreed, strict=True)}
        try:
            name = choose.fastest(self.medians, self.reference, self.margin)
        except ShimrtError:
            raise UsageError("auto timed no candidate: no trial step all-reduced") from None
        self.picked = next(c for c in self.candidates if c.name == name)
        return self.picked

    def report(self) -> dict:
        """The trials: each candidate's step times (ms) and the agreed median, what was kept."""
        return {"candidates": [c.name for c in self.candidates], "times_ms": self.times, "medians_ms": self.medians,
                "picked": None if self.picked is None else self.picked.name, "reference": self.reference,
                "margin": self.margin, "trial_steps": len(self.schedule)}
