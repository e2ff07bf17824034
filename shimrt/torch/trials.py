"""auto over a training loop's first steps: which policy to keep, from the steps' own times.

The trials run in rounds. A round visits every candidate in turn; a visit is ``warmup`` steps
under the candidate, untimed (what switching to it costs: a communicator's first use, cuBLAS's
plans for a carveout), then one timed step. After ``steps`` rounds of every candidate (the
search), the ``finalists`` fastest and the reference (plain DDP) run ``steps`` rounds more among
themselves (the confirmation); then the finalist of the least mean step time over all its timed
steps is kept, except that the reference stays unless another beats it by more than ``margin``,
so auto never settles on a policy measured slower than DDP.

Why rounds and means, not each candidate's steps back to back and their median: a GPU shared by
several ranks can run stretches of steps at two speeds, and a stretch outlasts a few steps in a
row, so back-to-back steps measure one stretch while the policy kept may run at the other. Visits
spread over the trials sample each candidate across such stretches, side by side with the others,
and the mean (what a run's total time follows) counts the slow ones that a median of a few hides
(the runs that showed this: docs/ddp.md, "auto's trials: rounds and means").

A step counts only when it all-reduced: a ``no_sync()`` step is run again under the same
candidate. The schedule depends only on the steps' count, never on their times, so every
rank switches at the same step; the decisions take the times agreed over the ranks (the slowest
rank's, through ``agree``), so every rank picks the same finalists and keeps the same policy. No
GPU here: the caller times the steps and hands them in.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Sequence

from .. import choose, validate
from ..errors import ShimrtError, UsageError

#: ``agree``: this rank's mean (or standard error) per candidate, in candidate order, to the ranks'
#: common ones (their maximum).
Agree = Callable[[list[float]], list[float]]
#: How many standard errors of the difference a candidate must beat the reference by, beyond the
#: margin: a gain within the trials' own noise keeps the reference.
SIGNIFICANCE = 2.0


class Trials:
    """The schedule and the decisions of auto (see the module's docstring). ``candidates``: the
    policies (objects with a ``name``); ``steps``: rounds of each stage, so timed steps per
    candidate in the search; ``reference``: the name of the one kept unless beaten."""

    def __init__(self, candidates: Sequence[Any], *, steps: int = 3, warmup: int = 1, finalists: int = 2,
                 margin: float = 0.01, reference: str | None = None):
        if not candidates or not all(isinstance(getattr(c, "name", None), str) for c in candidates):
            raise UsageError(f"candidates must be a non-empty list of policies, not {candidates!r:.100}")
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise UsageError(f"candidates must have distinct names, not {names}")
        self.rounds = validate.integer(steps, "trial steps", least=1, most=1000)
        self.warmup = validate.integer(warmup, "warm-up steps", least=0, most=1000)
        self.finalists = validate.integer(finalists, "finalists", least=0, most=1000)
        self.margin = validate.number(margin, "margin", least=0, most=0.5)
        if reference is not None and reference not in names:
            raise UsageError(f"reference must be one of the candidates {names}, not {reference!r}")
        self.candidates, self.reference = list(candidates), reference
        #: (policy, warm-up?) per trial step, in order: the search's rounds, then the confirmation's
        self.schedule: list[tuple[Any, bool]] = self._rounds(self.candidates)
        self.position = 0
        self.times: dict[str, list[float]] = {n: [] for n in names}
        self.means: dict[str, float] = {}
        #: the standard error of each mean (the ranks' largest), once decided
        self.errors: dict[str, float] = {}
        #: the candidates of the confirmation, once the search is decided (empty: none held)
        self.final: list[Any] = []
        self.picked: Any = None

    def _rounds(self, policies: list[Any]) -> list[tuple[Any, bool]]:
        visit = [True] * self.warmup + [False]
        return [(p, w) for _ in range(self.rounds) for p in policies for w in visit]

    @classmethod
    def settled(cls, policy: Any) -> "Trials":
        """No trials: ``policy`` is kept from the first step."""
        trials = cls([policy], steps=1, warmup=0)
        trials.position, trials.picked = len(trials.schedule), policy
        return trials

    @property
    def exhausted(self) -> bool:
        """Every trial step scheduled so far has run (a decision is due: :meth:`decide`)."""
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

    def decide(self, agree: Agree | None = None) -> Any:
        """Once the steps scheduled so far have run: after the search, schedule the confirmation
        and return None (or keep a policy at once, when there is nothing to confirm); after the
        confirmation, keep one and return it. ``agree`` turns this rank's mean per candidate (in
        candidate order; inf where none was timed) into the ranks' common ones (their maximum),
        so every rank decides alike."""
        if not self.exhausted:
            raise UsageError(f"auto decides after its {len(self.schedule)} trial steps, not after {self.position}")
        if self.picked is not None:
            raise UsageError(f"auto already kept {self.picked.name}")
        mine = [statistics.fmean(self.times[c.name]) if self.times[c.name] else math.inf for c in self.candidates]
        agreed = list(agree(mine)) if agree is not None else mine
        if len(agreed) != len(mine):
            raise UsageError(f"agree must give one time per candidate ({len(mine)}), not {len(agreed)}")
        self.means = {c.name: float(t) for c, t in zip(self.candidates, agreed, strict=True)}
        spread = [self._standard_error(c.name) for c in self.candidates]
        agreed = list(agree(spread)) if agree is not None else spread
        self.errors = {c.name: float(e) for c, e in zip(self.candidates, agreed, strict=True)}
        if not self.final:
            final = self._finalists()
            if len(final) > 1:
                self.final = final
                self.schedule += self._rounds(final)
                return None
        pool = {c.name: self.means[c.name] for c in self.final or self.candidates}
        reference = self.reference if self.reference in pool else None
        try:
            name = choose.fastest(pool, reference, self.margin)
        except ShimrtError:
            raise UsageError("auto timed no candidate: no trial step all-reduced") from None
        if reference is not None and name != reference and math.isfinite(pool[reference]):
            # Faster by the margin, but also by more than the noise: SIGNIFICANCE standard errors
            # of the difference of the two means (each the slowest rank's), or the reference stays.
            noise = SIGNIFICANCE * math.hypot(self.errors[name], self.errors[reference])
            if pool[reference] - pool[name] <= noise:
                name = reference
        self.picked = next(c for c in self.candidates if c.name == name)
        return self.picked

    def _standard_error(self, name: str) -> float:
        """The standard error of candidate ``name``'s mean step (0 with fewer than two steps)."""
        times = self.times[name]
        return statistics.stdev(times) / math.sqrt(len(times)) if len(times) > 1 else 0.0

    def _finalists(self) -> list[Any]:
        """The reference and the ``finalists`` fastest others by the search's agreed means (those
        timed), in candidate order."""
        timed = [c for c in self.candidates if math.isfinite(self.means[c.name]) and c.name != self.reference]
        best = {c.name for c in sorted(timed, key=lambda c: self.means[c.name])[:self.finalists]}
        return [c for c in self.candidates
                if c.name in best or (c.name == self.reference and math.isfinite(self.means[c.name]))]

    def report(self) -> dict:
        """The trials: each candidate's timed steps (ms) and the agreed means, the finalists, what
        was kept."""
        return {"candidates": [c.name for c in self.candidates], "times_ms": self.times, "means_ms": self.means,
                "standard_errors_ms": self.errors, "significance": SIGNIFICANCE,
                "finalists": [c.name for c in self.final], "picked": None if self.picked is None else self.picked.name,
                "reference": self.reference, "margin": self.margin, "trial_steps": len(self.schedule)}
