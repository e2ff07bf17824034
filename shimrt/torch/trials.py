"""auto over a training loop's first steps: which policy to keep, from the steps' own times.

The trials start with ``lead`` untimed steps under the reference (the job's own first steps:
DDP's bucket rebuild, the allocator's growth, the libraries' first calls; on an H100 the first
timed step of plain DDP ran 4-30% above its others in three of five bench configurations). Then
they run in rounds. A round visits every candidate in turn; a visit is ``warmup`` steps under the
candidate, untimed (what switching to it costs: a communicator's first use, cuBLAS's plans for a
carveout), then ``block`` timed steps (their noise then taken over the visits' means: steps of one
visit are not independent). One timed step per visit can hide a way that gains over a run: on an
H100 at 8eb640b (comm-heavy-1024, docs/ddp.md) ``sequential`` ran 0.887x plain DDP in blocks of 6
in turn, where one-step visits timed it at 32.0 ms against plain DDP's 29.3, so it was never
checked. Where ``drop`` is given, the search's first round decides who visits on: a candidate
slower than both the reference's visit and the median visit by more than ``drop`` (shaping at
2.5x plain DDP) runs no more rounds, since blocks make each visit dear. After ``steps`` rounds
(the search), the ``finalists`` fastest and the reference (plain DDP) run ``steps`` rounds more among
themselves (the confirmation); then the finalist of the least mean step time over all its timed
steps is chosen, except that the reference stays unless another beats it by more than ``margin``
and the noise. A policy so chosen is then checked (``check`` rounds of it and the reference
alone, once the losers' resources are gone, so that it runs as it will once kept): it is kept only
if these steps show it faster than the reference by the margin, and all its timed steps (trials
and check together) faster by the margin and the noise; else the reference is. The check's few
steps alone would let a reference that runs at two speeds (plain DDP of ranks sharing a GPU does)
veto a steady gain by its spread; its direction still must hold.
So auto never settles on a policy measured slower than DDP (beyond the margin, for a tie the trials
broke: below), and a pick that won the trials beside resources it no longer has, or in a lucky
stretch, is measured again before it stays.

The check can run in blocks instead (``check_block`` timed steps per visit, the visits in the
order reference, pick, pick, reference, ...: a drift over the check weighs on both alike), and
even where the trials kept the reference (``check_always``: the fastest other finalist is checked
then). Steps that alternate policies every step ran at speeds neither policy runs at once kept
(an H100, docs/ddp.md at 284db66: a windowed carveout 57.8 ms in the check's alternation, 65.7
kept); blocks run as the job will. A block check decides on its own steps (and, for a tie, the
trials' means): the pick stays
if its mean beats the reference's by the margin and by SIGNIFICANCE standard errors of the
difference, each taken over the visits' means (steps of one visit are not independent). Where the
pick leads by the margin but not yet beyond that noise, or trails the reference within that
noise where the trials measured it faster by the margin and no tie (below) holds it yet, the
block check runs ``check`` rounds
more, up to ``check_most`` rounds in all, and decides on all its visits: a reference that runs
at two speeds (plain DDP of ranks sharing a GPU, docs/ddp.md) spreads its visits' means, and more
visits narrow the noise where a few cannot tell. (On an H100 at 2f2e613, comm-heavy-1024, a
stretch of slow steps took both policies of the check from its 9th step on: carveout:32's visits
read 23.9, 29.7, 30.2 and 32.5 ms, plain DDP's 26.8, 27.7, 30.7 and 28.7, where the trials had
measured 24.4 and 26.2; plain DDP was kept and ran 27.4, carveout:32 fixed 25.1.) A second look
at the same rule makes a gain within the noise pass a little more often than one look would (two
chances at two standard errors).
Against such a reference the noise rule can refuse a pick that cannot lose: on an H100 (bench
torch compute-heavy, docs/ddp.md at 596006f) plain DDP's visits read 78.3, 66.3, 72.3, 66.3, 66.3,
66.5, 68.6 and 66.3 ms, a windowed carveout's all 66.2-67.2 (mean 66.7): 3% faster on average,
within the noise of the slow visits, and plain DDP, kept, then ran 73.7 ms. So a pick that leads
by the margin also holds when its loss is bounded: its mean within the margin of the reference's
fastest visit (at worst it costs the margin where the reference runs at its best) and none of its
visits slower than the reference's mean (it is steady, not a lucky stretch). A pick slower than
the reference's fastest visit by more than the margin, or with a visit slower than the reference's
mean, still needs the noise rule.

A pick at one speed beside a reference at two holds too, by its steadiness: every visit of the
pick within the margin of its fastest and faster than the reference's mean, where the reference's
visits spread beyond the margin and at least two of them ran slower than the pick's slowest (one
slow visit may be a stall rather than a level); no lead by the margin is asked, and the guard then
asks the pick to beat the reference's check mean strictly (a tie it might also be is not allowed
the margin). On an H100 (bench torch balanced,
be4344c, docs/ddp.md) a windowed carveout's visits read 47.5-47.8 ms and plain DDP's 52.8 once and
46.9-48.0 seven times (47.66 against 47.99: 0.7% ahead, 1.6% behind plain DDP's fastest visit, so
neither rule above held it); plain DDP, kept, ran all its 24 timed steps at 52.6-54.3 ms, the
windowed carveout fixed at 47.75. Kept so, the pick costs at most its distance from the
reference's fastest visit where the reference stays at its fast speed, and the reference's visits
say that it does not; the pick's guard (below) still asks it to beat the reference's mean alone.

A block check's pick that neither rule holds, once no more visits run, can still hold as a tie the
trials broke: its mean at most the margin above the reference's (level with it, or ahead within the
noise) and known to within the margin, where the trials (spread over more of the run) measured it
faster by the margin, even if within their noise (the trials may have kept the reference for it,
and checked the pick because ``check_always`` asks). Plain DDP at two speeds can run its whole
check fast and its trials partly slow: on an H100 at 8d31cd5 (docs/ddp.md) plain DDP, kept so, ran
70.02 and 49.85 ms, where the windowed carveout its check tied with ran 66.75 and 47.81 fixed. Its
guard allows it the same margin.

Why rounds and means, not each candidate's steps back to back and their median: a GPU shared by
several ranks can run stretches of steps at two speeds, and a stretch outlasts a few steps in a
row, so back-to-back steps measure one stretch while the policy kept may run at the other. Visits
spread over the trials sample each candidate across such stretches, side by side with the others,
and the mean (what a run's total time follows) counts the slow ones that a median of a few hides
(the runs that showed this: docs/ddp.md, "auto's trials: rounds and means").

A pick the check kept can still run slower alone than it ran there: on an H100 (8b70d5d, a model
of a user's own under FSDP2, docs/ddp.md) a kept policy ran 72.2 and 78.1 ms right after its
check, where the check had measured it at 63.6 and 66.9 and plain FSDP2 at 65.3 and 76.3. So a
kept pick can be guarded: ``guard_lead`` untimed steps of it alone, once the others' resources are
gone, then ``guard`` timed ones; if their mean (the slowest rank's) is not below the reference's
mean in the check (for a tie, within the margin of it), the reference is kept after all ("gave way
alone").

The reference is guarded the same way where a check gave way on a pick the trials had measured
faster by the margin: a reference at two speeds can run its whole check at its fast one and then
run on at its slow one. On an H100 (bench torch balanced-1024, e888d1f, docs/ddp.md) plain DDP's
24 check steps all read 43.5-44.3 ms, the windowed carveout's 44.6 on average, so the check gave
way; kept, plain DDP then ran mostly at 53.0-54.5 ms, the windowed carveout fixed at 44.9. So
``guard_lead`` untimed and ``guard`` timed steps of the reference alone follow such a check; where
their mean (the slowest rank's) is slower than the pick's mean in the check by more than the
margin, the pick runs alone as well (its own lead-in and guard), and it is kept if its mean there
beats the reference's alone by the margin and by SIGNIFICANCE standard errors of the difference
("held alone"); else the reference is. Those steps of the reference are what keeping it would run
anyway, but for the pick's resources (its group, Interposer or window hook), made and idle through
them, since the pick may run next (the trials' resources left idle were not measurable beside
plain DDP: docs/ddp.md at 0867b39).

A step counts only when it all-reduced: a ``no_sync()`` step is run again under the same
candidate. The schedule depends only on the steps' count, never on their times, so every
rank switches at the same step; the decisions take the times agreed over the ranks (the slowest
rank's, through ``agree``), so every rank picks the same finalists and keeps the same policy. No
GPU here: the caller times the steps and hands them in.

About 630 lines, a third of them this docstring: the schedule and the rules that read it (search,
confirmation, check, guards), and what each stage says it does, are one state machine over one
schedule, read together.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Sequence

from .. import choose, validate
from ..errors import ShimrtError, UsageError

__all__ = ["Trials", "how_held", "alone_said"]

#: ``agree``: this rank's mean (or standard error) per candidate, in candidate order, to the ranks'
#: common ones (their maximum).
Agree = Callable[[list[float]], list[float]]
#: How many standard errors of the difference a candidate must beat the reference by, beyond the
#: margin: a gain within the trials' own noise keeps the reference.
SIGNIFICANCE = 2.0


class Trials:
    """The schedule and the decisions of auto (see the module's docstring). ``candidates``: the
    policies (objects with a ``name``); ``steps``: rounds of each stage (the search's and the
    confirmation's), each visit ``block`` timed steps; ``reference``: the name of the one kept
    unless beaten; ``drop``: after the search's first round, the share slower than the reference
    and the median visit that leaves a candidate out of the rest (None: none leaves)."""

    def __init__(self, candidates: Sequence[Any], *, steps: int = 3, warmup: int = 1, finalists: int = 2,
                 margin: float = 0.01, reference: str | None = None, check: int = 0, lead: int = 0,
                 check_block: int = 1, check_always: bool = False, check_most: int | None = None,
                 guard: int = 0, guard_lead: int = 0, block: int = 1, drop: float | None = None):
        if not candidates or not all(isinstance(getattr(c, "name", None), str) for c in candidates):
            raise UsageError(f"candidates must be a non-empty list of policies, not {candidates!r:.100}")
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise UsageError(f"candidates must have distinct names, not {names}")
        self.rounds = validate.integer(steps, "trial steps", least=1, most=1000)
        self.warmup = validate.integer(warmup, "warm-up steps", least=0, most=1000)
        self.finalists = validate.integer(finalists, "finalists", least=0, most=1000)
        self.margin = validate.number(margin, "margin", least=0, most=0.5)
        self.check_rounds = validate.integer(check, "check rounds", least=0, most=1000)
        self.lead = lead = validate.integer(lead, "lead-in steps", least=0, most=1000)
        self.check_block = validate.integer(check_block, "check block", least=1, most=1000)
        self.check_always = validate.boolean(check_always, "check_always")
        #: timed steps per visit of the search and the confirmation (their noise then over the visits' means)
        self.block = validate.integer(block, "trial block", least=1, most=1000)
        #: after the search's first round, a candidate slower than this share above the reference's
        #: first visit and the visits' median is visited no more (None: every round visits every one)
        self.drop = None if drop is None else validate.number(drop, "drop", least=0.05, most=10)
        if self.check_block > 1 and self.check_rounds == 1:
            raise UsageError("a check in blocks needs at least 2 rounds (its noise is taken between visits), "
                             "not check=1")
        #: a block check's rounds at the most, extended while its visits cannot tell
        self.check_most = self.check_rounds if check_most is None else \
            validate.integer(check_most, "check_most", least=self.check_rounds, most=1000)
        if self.check_rounds and self.check_most % self.check_rounds:
            raise UsageError(f"check_most must be a multiple of the check rounds ({self.check_rounds}): the check "
                             f"runs that many more at a time (reference, pick, pick, reference), not {self.check_most}")
        self._check_done = 0  # a block check's rounds scheduled so far
        self.guard = validate.integer(guard, "guard steps", least=0, most=1000)
        self.guard_lead = validate.integer(guard_lead, "guard lead-in steps", least=0, most=1000)
        #: the policy a guard runs alone (None: no guard under way): the pick, or the reference
        #: after a check that gave way
        self.guarding: Any = None
        #: which guard: "pick" (after a check that held), "reference" (after one that gave way),
        #: "pick after reference" (the pick alone once the reference alone ran slower than it)
        self.guard_role: str | None = None
        self.guard_times: list[float] = []
        self._guard_from: int | None = None  # the schedule's index of the guard's first timed step
        if lead and reference is None:
            raise UsageError("lead-in steps run under the reference: give a reference, or lead=0")
        if reference is not None and reference not in names:
            raise UsageError(f"reference must be one of the candidates {names}, not {reference!r}")
        self.candidates, self.reference = list(candidates), reference
        #: (policy, warm-up?) per trial step, in order: the lead-in, the search's rounds, then the
        #: confirmation's and the check's
        self.schedule: list[tuple[Any, bool]] = [(self._named(str(reference)), True)] * lead if lead else []
        self._visit: dict[int, int] = {}  # a timed step's index -> its visit (where its timed steps start)
        #: the search's and the confirmation's timed steps per candidate, by visit
        self.visits: dict[str, dict[int, list[float]]] = {n: {} for n in names}
        #: the candidates the search's first round left behind (``drop``), and those it visits on
        self.dropped: list[str] = []
        self.searching = list(self.candidates)
        #: the search's rounds scheduled in one go: all, or the first alone where ``drop`` may prune after it
        self._first_round = self.drop is not None and self.rounds > 1
        self._add_rounds(self.candidates, 1 if self._first_round else self.rounds)
        self.position = 0
        self.times: dict[str, list[float]] = {n: [] for n in names}
        self.means: dict[str, float] = {}
        #: the standard error of each mean (the ranks' largest), once decided
        self.errors: dict[str, float] = {}
        #: the candidates of the confirmation, once the search is decided (empty: none held)
        self.final: list[Any] = []
        #: the policy the check measures against the reference (None: no check under way or done)
        self.checking: Any = None
        #: the check's timed steps per policy, its agreed means and errors, and whether the pick held
        self.check_times: dict[str, list[float]] = {}
        self.check: dict[str, Any] = {}
        self._check_from: int | None = None  # the schedule's index where the check starts
        #: the check's timed steps per policy, by visit
        self.check_visits: dict[str, dict[int, list[float]]] = {}
        #: the name the search and confirmation chose (before any check), once they have
        self.trials_chose: str | None = None
        self.picked: Any = None

    def _add_rounds(self, policies: list[Any], rounds: int, block: int | None = None) -> None:
        """Schedule ``rounds`` rounds of ``policies``, a visit of each (:meth:`_add_visit`) of
        ``block`` timed steps (None: the trials' block)."""
        for _ in range(rounds):
            for p in policies:
                self._add_visit(p, self.block if block is None else block)

    def _add_visit(self, policy: Any, block: int) -> None:
        """Schedule a visit of ``policy``: ``warmup`` untimed steps, then ``block`` timed ones,
        marked as one visit."""
        self.schedule += [(policy, True)] * self.warmup
        start = len(self.schedule)
        for index in range(start, start + block):
            self._visit[index] = start
            self.schedule.append((policy, False))

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
        name = self.schedule[index][0].name
        if self._guard_from is not None and index >= self._guard_from:
            self.guard_times.append(ms)
        elif self._check_from is not None and index >= self._check_from:
            self.check_times[name].append(ms)
            self.check_visits[name].setdefault(self._visit[index], []).append(ms)
        else:
            self.times[name].append(ms)
            self.visits[name].setdefault(self._visit[index], []).append(ms)

    def decide(self, agree: Agree | None = None) -> Any:
        """Once the steps scheduled so far have run: after the search, schedule the confirmation
        and return None (or choose at once, when there is nothing to confirm); after the
        confirmation, choose one: the reference is kept at once, another is checked (its rounds
        scheduled, :attr:`checking` set, None returned) when ``check`` rounds were asked for, else
        kept; after the check, keep the one checked or the reference, and return it (a block
        check whose visits cannot tell yet schedules more rounds first, up to ``check_most``,
        and returns None). ``agree``
        turns this rank's mean per candidate (in candidate order; inf where none was timed) into
        the ranks' common ones (their maximum), so every rank decides alike."""
        if not self.exhausted:
            raise UsageError(f"auto decides after its {len(self.schedule)} trial steps, not after {self.position}")
        if self.picked is not None:
            raise UsageError(f"auto already kept {self.picked.name}")
        if self.guarding is not None:
            return self._end_guard(agree)
        if self.checking is not None:
            return self._end_check(agree)
        self.means, self.errors = self._agreed(self.times, self.candidates, agree)
        if self.block > 1:  # the steps of one visit are not independent: the noise between visits
            _, self.errors = self._agreed(self._visit_means(self.visits), self.candidates, agree)
        if self._first_round:
            self._first_round = False
            self._prune()
            self._add_rounds(self.searching, self.rounds - 1)
            return None
        if not self.final:
            final = self._finalists()
            if len(final) > 1:
                self.final = final
                self._add_rounds(final, self.rounds)
                return None
        pool = {c.name: self.means[c.name] for c in self.final or self.searching}
        reference = self.reference if self.reference in pool else None
        try:
            name = self._winner(pool, self.errors, reference)
        except ShimrtError:
            raise UsageError("auto timed no candidate: no trial step all-reduced") from None
        self.trials_chose = name
        chosen = self._named(name)
        if reference is not None and name == reference and self.check_always and self.check_rounds:
            others = [n for n, t in pool.items() if n != reference and math.isfinite(t)]
            if others:  # the trials kept the reference: their fastest other is checked in blocks too
                chosen = self._named(min(others, key=lambda n: pool[n]))
        if reference is None or chosen.name == reference or not self.check_rounds:
            self.picked = chosen
            return chosen
        self.checking = chosen
        pair = [self._named(reference), chosen]
        self.check_times = {p.name: [] for p in pair}
        self.check_visits = {p.name: {} for p in pair}
        self._check_from = len(self.schedule)
        if self.check_block == 1:
            self._add_rounds(pair, self.check_rounds, 1)
        else:
            self._blocks(pair, self.check_rounds)
        return None

    def _prune(self) -> None:
        """After the search's first round: the candidates whose visit ran slower than ``drop``
        above both the reference's visit and the median visit (of every candidate's, by the ranks'
        agreed means) are visited no more. Both: a reference that ran its visit at a fast stretch
        alone drops no candidate that ran level with the others."""
        timed = {n: t for n, t in self.means.items() if math.isfinite(t)}
        if not timed or self.drop is None:
            return
        bar = statistics.median(timed.values())
        if self.reference is not None and self.reference in timed:
            bar = max(bar, timed[self.reference])
        bar *= 1 + self.drop
        self.dropped = [c.name for c in self.candidates if c.name != self.reference and self.means[c.name] > bar]
        self.searching = [c for c in self.candidates if c.name not in self.dropped]

    @staticmethod
    def _visit_means(visits: dict[str, dict[int, list[float]]]) -> dict[str, list[float]]:
        return {n: [statistics.fmean(v) for v in by.values()] for n, by in visits.items()}

    def _blocks(self, pair: list[Any], rounds: int) -> None:
        """``rounds`` more rounds of a block check of ``pair`` (reference, pick), its visits in the
        order reference, pick, pick, reference, ... on from those scheduled."""
        for visit in range(2 * self._check_done, 2 * (self._check_done + rounds)):
            self._add_visit(pair[(visit + 1) // 2 % 2], self.check_block)
        self._check_done += rounds

    def _end_check(self, agree: Agree | None) -> Any:
        """Keep the policy checked or the reference: the check's own means must show the policy
        faster by the margin, and its trial and check steps together faster by the margin and the
        noise (see the module's docstring)."""
        reference = str(self.reference)  # a check is scheduled only beside a reference
        pair = [self._named(reference), self.checking]
        means, errors = self._agreed(self.check_times, pair, agree)
        pooled = {p.name: self.times[p.name] + self.check_times[p.name] for p in pair}
        all_means, all_errors = self._agreed(pooled, pair, agree)
        extra: dict[str, Any] = {}
        try:
            direction = choose.fastest(means, reference, self.margin)
            if self.check_block == 1:
                held = direction == self.checking.name and self._winner(all_means, all_errors, reference) == direction
            else:  # blocks: their own steps alone, the noise over the visits' means
                visits = self._visit_means(self.check_visits)
                _, spread = self._agreed(visits, pair, agree)
                # each visit's mean, the slowest rank's: the bound and steadiness rules read them
                common = {n: list(agree(v)) if agree is not None else v for n, v in visits.items()}
                leads = direction == self.checking.name
                by_noise = leads and self._winner(means, spread, reference) == direction
                by_bound = leads and not by_noise and self._bounded(common, reference)
                by_steady = not (by_noise or by_bound) and self._steady(common, means, reference)
                sure = by_noise or by_bound or by_steady
                # level, or ahead within the noise, and faster in the trials: held once no more visits run
                by_tie = not sure and self._tied(means, spread, reference)
                # the visits cannot tell yet: a lead within the noise, or, where the trials had the
                # pick faster and no tie holds it now, a deficit within the noise
                pick = self.checking.name
                unsure = not sure and (leads or (
                    self._trials_faster(reference) and not by_tie
                    and means[pick] - means[reference] <= _noise(spread, pick, reference)))
                if unsure and self._check_done < self.check_most:
                    self._blocks(pair, self.check_rounds)
                    return None  # more visits first
                held = sure or by_tie
                extra = {"block": self.check_block, "visit_means_ms": visits, "visit_standard_errors_ms": spread,
                         "rounds_run": self._check_done,
                         "held_by": "noise" if by_noise else "bound" if by_bound else "steady" if by_steady else
                         "tie" if by_tie else None}
        except ShimrtError:  # the check timed neither: what the trials chose is all there is to go on
            held = self.trials_chose == self.checking.name
        self.check = {"policy": self.checking.name, "rounds": self.check_rounds, "times_ms": self.check_times,
                      "means_ms": means, "standard_errors_ms": errors, "all_means_ms": all_means,
                      "all_standard_errors_ms": all_errors, "held": held,
                      "after_reference_won": self.trials_chose == reference, **extra}
        if self.guard and (held or self._trials_faster(reference)):
            # the pick alone first, the others' resources gone; or, where the check gave way on a
            # pick the trials had faster, the reference alone (it may have run its check fast)
            self._guard(self.checking if held else self._named(reference), "pick" if held else "reference")
            return None
        self.picked = self.checking if held else self._named(reference)
        return self.picked

    def _guard(self, policy: Any, role: str) -> None:
        """Schedule ``guard_lead`` untimed and ``guard`` timed steps of ``policy`` alone."""
        self.guarding, self.guard_role, self.guard_times = policy, role, []
        self.schedule += [(policy, True)] * self.guard_lead
        self._guard_from = len(self.schedule)
        self.schedule += [(policy, False)] * self.guard

    def _end_guard(self, agree: Agree | None) -> Any:
        """After the pick's guard: keep it if its steps alone ran faster than the reference did in
        the check (a tie: within the margin of it), or, after the reference's own guard, faster than
        the reference alone by the margin; else the reference. After the reference's guard: the
        reference is kept unless it ran alone slower than the pick in the check by the margin, when
        the pick's guard runs first. All by the slowest rank's means (the module's docstring)."""
        policy, reference = self.guarding, str(self.reference)
        means, errors = self._agreed({policy.name: self.guard_times}, [policy], agree)
        mean, error = means[policy.name], errors[policy.name]
        times = {"steps": len(self.guard_times), "times_ms": list(self.guard_times), "mean_ms": mean}
        if self.guard_role == "reference":
            pick_check = self.check["means_ms"][self.checking.name]
            slower = mean * (1 - self.margin) > pick_check
            self.check["reference_alone"] = {**times, "standard_error_ms": error, "pick_check_ms": pick_check,
                                             "slower": slower}
            if slower:  # what the check saw of the reference did not last: the pick alone, beside it
                self._guard(self.checking, "pick after reference")
                return None
            self.picked = self._named(reference)
            return self.picked
        if self.guard_role == "pick after reference":
            alone = self.check["reference_alone"]
            against = alone["mean_ms"]
            # by the margin and beyond the two runs' noise: a slow stretch of plain DDP's alone is no gain
            noise = _noise({policy.name: error, reference: alone["standard_error_ms"]}, policy.name, reference)
            held = mean < against * (1 - self.margin) and against - mean > noise
            guard = {**times, "reference_alone_ms": against, "held": held, "check_held_by": None}
            self.check.update(held=held, guard=guard, held_by="alone" if held else None)
        else:
            against = self.check["means_ms"][reference]
            # a tie held for costing at most the margin is guarded to that: the others, strictly
            held = mean <= against * (1 + self.margin) if self.check.get("held_by") == "tie" else mean < against
            guard = {**times, "reference_check_ms": against, "held": held, "check_held_by": self.check.get("held_by")}
            self.check.update(held=held, guard=guard)
            if not held:
                self.check["held_by"] = None  # the check held; the pick alone did not
        self.picked = policy if held else self._named(reference)
        return self.picked

    def stage(self) -> str:
        """What the steps scheduled now do, in words, and how many of them are left: the
        search, the finalists again, the check (in blocks: the rounds scheduled and the most it
        may run), a guard alone, or what was kept. A progress line: a search, a check and its
        guards can take hundreds of steps, some slower than the reference's."""
        steps, rounds = _count(len(self.schedule) - self.position, "step"), _count(self.rounds, "round")
        if self.picked is not None:
            return f"kept {self.picked.name}"
        if self.guarding is not None:
            why = {"pick": "the check held it", "reference": "the check gave way on a pick the trials had faster",
                   "pick after reference": "the reference ran slower alone than the pick in the check"}
            return f"{self.guarding.name} alone, its guard ({why[str(self.guard_role)]}): {steps}"
        if self.checking is not None:
            beside = f"{self.checking.name} checked beside {self.reference}"
            if self.check_block == 1:
                return f"{beside}, a step each in turn, {_count(self.check_rounds, 'round')}: {steps}"
            start = self._check_done - self.check_rounds + 1
            return (f"{beside} in blocks of {self.check_block} steps, rounds {start}-{self._check_done} of at most "
                    f"{self.check_most}: {steps}")
        if self.final:
            return f"the finalists {', '.join(p.name for p in self.final)} again, {rounds}: {steps}"
        first = f", after {_count(self.lead, 'step')} of {self.reference}" if self.position < self.lead else ""
        visit = f" of {self.block} timed steps each" if self.block > 1 else ""
        if self._first_round:
            than = f"{self.reference} and " if self.reference else ""
            return (f"{_count(len(self.candidates), 'candidate')}, the first of {rounds}{visit}{first} (then those "
                    f"more than {self.drop:.0%} slower than {than}the median drop out): {steps}")
        if self.drop is not None and self.rounds > 1:
            dropped = f"dropped: {', '.join(self.dropped)}" if self.dropped else "none dropped"
            left = f"{_count(len(self.searching), 'candidate')} left ({dropped})"
            return f"{left}, {'round 2' if self.rounds == 2 else f'rounds 2-{self.rounds}'}{visit}: {steps}"
        return f"{_count(len(self.candidates), 'candidate')}, {rounds}{visit}{first}: {steps}"

    @property
    def staying(self) -> list[Any]:
        """The policies the coming trial steps run besides the reference: the pick checked (or
        guarded, or waiting for the reference's guard), else the finalists, else the candidates the
        search visits on."""
        if self.checking is not None:
            return [self.checking]
        return list(self.final or self.searching)

    def _bounded(self, visits: dict[str, list[float]], reference: str) -> bool:
        """A block check's pick whose loss is bounded where its gain is not: its mean within the
        margin of the reference's fastest visit, and none of its visits slower than the
        reference's mean (see the module's docstring). From the ranks' common visit means (each
        visit's slowest rank), so every rank decides alike."""
        ref, mine = visits[reference], visits[self.checking.name]
        return (statistics.fmean(mine) <= min(ref) * (1 + self.margin)
                and max(mine) <= statistics.fmean(ref))

    def _steady(self, visits: dict[str, list[float]], means: dict[str, float], reference: str) -> bool:
        """A block check's pick at one speed beside a reference at two: every visit of the pick
        within the margin of its fastest, and faster than the reference's mean (that of its visits
        and the check's agreed one, the slowest rank's: each visit's slowest rank can be another
        rank), where the reference's visits spread beyond the margin and at least two of them ran
        slower than the pick's slowest (a slow speed seen once may be a stall, not a level; see the
        module's docstring). From the ranks' common visit means, so every rank decides alike."""
        ref, mine = visits[reference], visits[self.checking.name]
        slowest = max(mine)
        return (slowest <= min(mine) * (1 + self.margin) and slowest < min(statistics.fmean(ref), means[reference])
                and max(ref) > min(ref) * (1 + self.margin) and sum(t > slowest for t in ref) >= 2)

    def _tied(self, means: dict[str, float], spread: dict[str, float], reference: str) -> bool:
        """A block check's pick that neither the noise rule nor the bound holds, at most the margin
        above the reference in the check (level with it, or ahead within the noise), known to within
        the margin (SIGNIFICANCE standard errors of its visits' means), that the trials measured
        faster by the margin (see the module's docstring). From the agreed means and errors (the
        slowest rank's), so every rank decides alike."""
        pick = self.checking.name
        return (means[pick] <= means[reference] * (1 + self.margin)
                and SIGNIFICANCE * spread[pick] <= self.margin * means[pick] and self._trials_faster(reference))

    def _trials_faster(self, reference: str) -> bool:
        """Whether the trials' agreed means had the pick checked faster than the reference by the
        margin (within their noise or not)."""
        trials = self.means
        return math.isfinite(trials[reference]) and trials[self.checking.name] < trials[reference] * (1 - self.margin)

    def _agreed(self, times: dict[str, list[float]], candidates: list[Any],
                agree: Agree | None) -> tuple[dict[str, float], dict[str, float]]:
        """The ranks' common mean and standard error per candidate of ``times``."""
        mine = [statistics.fmean(times[c.name]) if times[c.name] else math.inf for c in candidates]
        spread = [choose.standard_error(times[c.name]) for c in candidates]
        out = []
        for values in (mine, spread):
            agreed = list(agree(values)) if agree is not None else values
            if len(agreed) != len(values):
                raise UsageError(f"agree must give one time per candidate ({len(values)}), not {len(agreed)}")
            out.append({c.name: float(t) for c, t in zip(candidates, agreed, strict=True)})
        return out[0], out[1]

    def _winner(self, means: dict[str, float], errors: dict[str, float], reference: str | None) -> str:
        """The fastest of ``means``; the reference stays unless another beats it by the margin
        and by more than SIGNIFICANCE standard errors of the difference of the two means (each the
        slowest rank's): a gain within the trials' own noise keeps the reference."""
        name = choose.fastest(means, reference, self.margin)
        if reference is not None and name != reference and math.isfinite(means[reference]):
            if means[reference] - means[name] <= _noise(errors, name, reference):
                name = reference
        return name

    def _named(self, name: str) -> Any:
        return next(c for c in self.candidates if c.name == name)

    def _finalists(self) -> list[Any]:
        """The reference and the ``finalists`` fastest others by the search's agreed means (those
        timed and not dropped), in candidate order."""
        timed = [c for c in self.searching if math.isfinite(self.means[c.name]) and c.name != self.reference]
        best = {c.name for c in sorted(timed, key=lambda c: self.means[c.name])[:self.finalists]}
        return [c for c in self.candidates
                if c.name in best or (c.name == self.reference and math.isfinite(self.means[c.name]))]

    def report(self) -> dict:
        """The trials: each candidate's timed steps (ms) and the agreed means, the finalists, what
        was kept."""
        return {"candidates": [c.name for c in self.candidates], "times_ms": self.times, "means_ms": self.means,
                "standard_errors_ms": self.errors, "significance": SIGNIFICANCE,
                "finalists": [c.name for c in self.final], "picked": None if self.picked is None else self.picked.name,
                "block": self.block, "drop": self.drop, "dropped": list(self.dropped),
                "check": dict(self.check) or None, "reference": self.reference, "margin": self.margin,
                "trial_steps": len(self.schedule)}


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _noise(errors: dict[str, float], a: str, b: str) -> float:
    """SIGNIFICANCE standard errors of the difference of ``a``'s and ``b``'s means: the noise a
    gain (or a loss) must clear to count."""
    return SIGNIFICANCE * math.hypot(errors[a], errors[b])


def how_held(check: dict) -> str:
    """A check's end in words (``Trials.check``): "held", "held by its bound" (a block check whose
    pick's loss is bounded, though its gain is within the noise), "held by its steadiness" (a pick
    at one speed whose every visit beat the mean of a reference at two), "held as a tie the trials broke"
    (level with the reference in the check, faster in the trials), "held alone" (the check gave way,
    the reference then ran alone slower than the pick had in the check, and the pick alone beat it
    by the margin), "gave way", or "gave way alone" (it held, or the reference alone ran slower than
    it had, and its guard's steps alone were not faster than the reference, in the check or alone)."""
    if not check["held"]:
        return "gave way alone" if check.get("guard") else "gave way"
    said = {"bound": "held by its bound", "steady": "held by its steadiness", "tie": "held as a tie the trials broke",
            "alone": "held alone"}
    return said.get(str(check.get("held_by")), "held")


def alone_said(check: dict, plain: str = "plain DDP") -> str:
    """The guards' steps alone after a check (``Trials.check``) in words, "" where none ran: the
    reference's (after a check that gave way) and the pick's (after one that held, or after the
    reference's)."""
    said = []
    ref = check.get("reference_alone")
    if ref:
        said.append(f"{plain} alone after it, {ref['steps']} steps {ref['mean_ms']:.2f} ms against "
                    f"{check['policy']}'s {ref['pick_check_ms']:.2f} in the check")
    guard = check.get("guard")
    if guard and "reference_alone_ms" in guard:
        said.append(f"{check['policy']} alone then, {guard['steps']} steps {guard['mean_ms']:.2f} ms against "
                    f"{plain}'s {guard['reference_alone_ms']:.2f} alone")
    elif guard:
        said.append(f"alone after it, {guard['steps']} steps {guard['mean_ms']:.2f} ms against {plain}'s "
                    f"{guard['reference_check_ms']:.2f} in the check")
    return "; ".join(said)
