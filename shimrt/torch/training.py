"""Overlap in a data-parallel training loop (DDP, or FSDP2's ``fully_shard``): a policy's compute
side around each step, its collectives on a process group of its own, and auto, which keeps the
plain job unless a policy is measured faster. The DDP and FSDP2 specifics are their adapters'
(:mod:`shimrt.torch.ddp`, :mod:`shimrt.torch.fsdp`); this module is what both share.

::

    model = DDP(model, device_ids=[local_rank])        # as before (torchrun, one process per GPU)
    ov = shimrt.torch.overlap(model, policy="auto")    # + 1 line
    for x, y in data:
        with ov.step():                                # + 1 line: the policy's compute side
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    print(ov.report()["policy"])                       # what auto kept, and its trials
    ov.close()

auto's options are an :class:`~shimrt.torch.policies.Auto` (``policy=Auto(sms=(32, 64),
trial_steps=3, margin=0.01)``); what it kept and its trials' means are logged at INFO on rank 0
by the ``shimrt.torch`` logger (``logging.basicConfig(level=logging.INFO)`` shows them).

A policy (:mod:`shimrt.torch.policies`) has two sides. Its communication: the model's own
collectives, on a ProcessGroupNCCL over the same ranks made with the policy's options
(:mod:`shimrt.torch.groups`), set by the adapter between steps; nothing of shimrt's runs per
collective. Its compute side: ``ov.step()`` around the user's forward, backward and optimizer
step (every kernel shaped through the Interposer, torch's compute on an SM partition, or cuBLAS
leaving SMs free, for the step or, with ``windowed-carveout``, from the first accumulated
gradient on). ``ddp`` is the plain job: its own groups, and ``ov.step()`` only counts; ``paced``
the same, with the host waiting for the step's GPU work at the end of ``ov.step()``; ``sequential``
(DDP) its own group too, every gradient all-reduced once backward has ended (no overlap).

``policy="auto"`` times the plain job beside every candidate in rounds over the first steps,
then the fastest few again beside it, and chooses the fastest by the slowest rank's mean step
time: the plain job unless another is more than ``margin`` faster and faster beyond the trials'
noise (:mod:`shimrt.torch.trials`). What the next stage cannot use is destroyed as it goes (the
groups of candidates dropped after the search's first round, the losers' after the search, the
other finalists' after the confirmation); a policy chosen
over the plain job is then checked alone beside it (``Auto.check_steps`` rounds) and stays only
if still faster. When the plain job is kept, nothing of the trials is left (``ov.report()["held"]``)
and it runs as if :func:`overlap` had never been called; at each stage's end what torch cached for
the trials goes back to the GPU, process-wide (:func:`~shimrt.torch.interop.release_cached`).
``ov.report()`` gives the reference's time, the check, each policy's host time per step and the
device memory of the groups' NCCL communicators. A collective whose peer is gone ends as in the plain
job: torch's NCCL watchdog, after the group's timeout. For a loop without DDP or FSDP2,
:class:`~shimrt.torch.step.GradientBuckets` and :class:`~shimrt.torch.step.NcclBuckets` take the
same policies through shimrt's own Communicators.

:class:`Overlap` is the step and auto's stages; where the model's collectives run (the policies'
groups, the one in force, the window's hook) is a :class:`~shimrt.torch.placement.Placement`, the
policies' device resources and the carveout window are :mod:`shimrt.torch.resources`'s, and the
timing of auto's steps is :class:`~shimrt.torch.cost.StepTimer`'s. About 430 lines: the step and
auto's stages read and write one Overlap's state (its placement, resources, timer and trials), and
split they would hand it back and forth.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import socket
from typing import Any, Iterator

from .. import validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..stream import timeout_seconds
from .cost import HostCost, StepTimer, now
from .fsdp import ROUTES
from .groups import Groups, subgroup_refusal
from .interop import release_cached, require_torch
from .interop import stream as torch_stream
from .placement import Placement, Wrapped
from .policies import FIXED_ONLY, FSDP_KINDS, KINDS, Auto, Policy, candidates, parse
from .resources import Resources, Window
from .trials import Trials, alone_said, how_held

__all__ = ["overlap", "Overlap", "no_room", "auto_kinds", "auto_trials"]

#: Where auto says what it kept (INFO, rank 0).
log = logging.getLogger("shimrt.torch")
#: Untimed steps of the plain job before auto's first round: a job's first steps (DDP's bucket
#: rebuild, the allocator's growth) ran 4-30% above the rest (:mod:`shimrt.torch.trials`).
LEAD_STEPS = 3



def overlap(model: Any, policy: Any = "auto", *, timeout: float = 300.0, fsdp_route: str = "mesh") -> "Overlap":
    """Overlap ``model``'s collectives with its compute under ``policy``: a name of
    :mod:`shimrt.torch.policies`, a :class:`Policy`, ``"auto"`` or an
    :class:`~shimrt.torch.policies.Auto` with auto's options; see the module's docstring.
    ``model``: a ``DistributedDataParallel``, or a module ``fully_shard`` made an FSDP2 module
    (its root). ``timeout``: seconds a collective of shimrt's process groups may take before
    torch's watchdog ends it. ``fsdp_route``: how an FSDP2 model's collectives reach a policy's
    groups, ``"mesh"`` or ``"custom"`` (FSDP2's public custom collectives; :mod:`shimrt.torch.fsdp`).
    Collective over the model's ranks: every rank calls it, with the same arguments."""
    require_torch()
    return Overlap(model, policy, timeout=timeout, fsdp_route=fsdp_route)


#: What each policy that holds memory beyond the plain model's holds, and how a user runs it or
#: leaves it out of auto (:func:`no_room`).
HOLDS = {"no-reshard": ("parameters all-gathered",
                        "policy='no-reshard' runs it, Auto(no_reshard=False) leaves it out unsaid"),
         "sequential": ("gradients in a flat buffer at backward's end", "policy='sequential' runs it")}


def no_room(need: int, free: int, kind: str = "no-reshard") -> str | None:
    """Why auto leaves the policy ``kind`` (a key of :data:`HOLDS`) out (None: it does not) where
    what it holds beyond the plain model takes ``need`` bytes and the GPU has ``free``: at most a
    quarter of the free memory, so that a job sized to the GPU's memory does not run out in one of
    auto's trials."""
    held, remedy = HOLDS[validate.one_of(kind, "kind", tuple(HOLDS))]
    if 4 * need <= free:
        return None
    return (f"it would hold {need / 2**20:.0f} MiB of {held}, more than a quarter of the {free / 2**20:.0f} MiB "
            f"free on the GPU: {remedy}")


def auto_kinds(kind: str, auto: Auto) -> list[str]:
    """The kinds of policy auto tries on a model of ``kind`` ("DDP" or "FSDP2") under ``auto``'s
    options, in :data:`KINDS`' order: not ``low-priority`` (under a DDP or FSDP2, the model's own
    streams and channels again) or the fixed-only kinds; ``sequential`` (every all-reduce after
    backward) for DDP alone, FSDP2's own kinds for FSDP2 alone, ``no-reshard`` only where
    ``auto.no_reshard``."""
    validate.one_of(kind, "kind", ("DDP", "FSDP2"))
    skip = ("auto", "low-priority", *FIXED_ONLY) + (("sequential",) if kind == "FSDP2" else FSDP_KINDS) + \
        (() if auto.no_reshard else ("no-reshard",))
    return [k for k in KINDS if k not in skip]


def auto_trials(auto: Auto, candidates: list[Policy]) -> Trials:
    """auto's trials of ``candidates`` (plain DDP, ``ddp``, their reference) as ``auto``'s options
    set them: its rounds and their visits, margin, check in blocks and guard (after ``check_block`` untimed
    steps)."""
    return Trials(candidates, steps=auto.trial_steps, block=auto.trial_block, drop=auto.trial_drop, margin=auto.margin,
                  reference="ddp", check=auto.check_steps,
                  lead=LEAD_STEPS, check_block=auto.check_block, check_always=auto.check_always,
                  check_most=auto.most_check_rounds, guard=auto.guard_steps,
                  guard_lead=auto.check_block if auto.guard_steps else 0)


def wrap(model: Any, fsdp_route: str = "mesh") -> Wrapped:
    """The adapter of ``model``: a DDP's, or an FSDP2 root module's (its collectives reached by
    ``fsdp_route``); UsageError for anything else."""
    import torch

    from .ddp import Ddp
    from .fsdp import Fsdp, is_fsdp
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        if fsdp_route != "mesh":
            raise UsageError(f"fsdp_route applies to FSDP2 models, not to a DDP (fsdp_route={fsdp_route!r})")
        return Ddp(model)
    if is_fsdp(model):
        return Fsdp(model, fsdp_route)
    raise UsageError(f"overlap() takes a torch.nn.parallel.DistributedDataParallel or a module fully_shard made an "
                     f"FSDP2 module, not {validate.shown(model)}")


class Overlap:
    """What :func:`overlap` returns: ``step()``, ``report()``, ``close()``."""

    def __init__(self, model: Any, policy: Any, *, timeout: float, fsdp_route: str = "mesh"):
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        # The plain arguments first (no GPU, no collective), then the DDP. The timeout is checked
        # here, once: the groups take it as it comes out.
        limit = datetime.timedelta(seconds=timeout_seconds(timeout))
        validate.one_of(fsdp_route, "fsdp_route", ROUTES)
        if not isinstance(policy, (str, Policy, Auto)):  # before any comparison: numpy compares elementwise
            raise UsageError(f"policy must be 'auto', an Auto, a policy's name or a Policy, not "
                             f"{validate.shown(policy)}")
        policy = policy if isinstance(policy, (Policy, Auto)) else str(policy)
        auto = Auto() if policy == "auto" else policy if isinstance(policy, Auto) else None
        named = None
        if auto is not None:
            policy = "auto"
        else:
            # Parsed once, here, before any collective; its channels follow the ranks per GPU (Placement).
            named = parse(policy)
        self.model = wrap(model, "mesh" if named is not None and named.plain else fsdp_route)  # plain: untouched
        self.group = self.model.group
        # sequential stays on the model's own group (its refusal says what else it needs)
        if (named is None or not (named.plain or named.sequential)) and \
                (why := self.model.moveable() or subgroup_refusal(dist, self.group)):
            raise UsageError(f"policy {policy!r} moves this {self.model.kind}'s collectives to process groups of its "
                             f"own, and they cannot move: {why}; policy='ddp' leaves the {self.model.kind} as it is")
        self.rank, self.size = dist.get_rank(self.group), dist.get_world_size(self.group)
        self.torch_device = torch.device("cuda", self.model.index)
        self.device = Device(self.model.index)
        self.ranks_per_gpu = self._ranks_per_gpu()
        self.placement = Placement(self.model, Groups(dist, self.group, limit, device=self.torch_device),
                                   self.ranks_per_gpu)
        self.resources = Resources(self.device, keep_partitions=True)
        self.dropped: dict[str, str] = {}
        self.cost = HostCost()
        self.timer = StepTimer(torch)
        self._active: Policy | None = None
        self.window = Window()  # a windowed carveout's, aimed at each step, opened by the hook
        self.closed = False
        try:
            if auto is not None:
                usable = self._usable(candidates(auto.sms, auto_kinds(self.model.kind, auto), auto.ctas,
                                                 auto.prefetch), auto=True)
                self.auto, self.trials = True, auto_trials(auto, usable)
            elif named is not None:  # a fixed policy: parsed above
                if self._usable([named]) == []:
                    raise UsageError(f"policy {named.name!r} cannot run here: {self.dropped[named.name]}")
                self.auto, self.trials = False, Trials.settled(named)
            for p in self.trials.candidates:  # every group now, in the same order on every rank
                self.placement.group_of(p)
            if any(p.window for p in self.trials.candidates):
                self.placement.hook_window(self.window)
            if not self.auto:
                self.placement.use(self.trials.current())
            else:
                self._progress()
        except BaseException:
            with contextlib.suppress(Exception):  # the error that matters is the one raised
                self._close_parts()
            raise

    # --- set-up ---
    def _ranks_per_gpu(self) -> int:
        """How many of the group's ranks share this rank's GPU (one per GPU under torchrun, two
        on one GPU under MPS): NCCL's channels are sized by it."""
        props = self._torch.cuda.get_device_properties(self.torch_device)
        me = (socket.gethostname(), str(getattr(props, "uuid", self.torch_device.index)))
        everyone: list = [None] * self.size
        with self._torch.cuda.device(self.torch_device):
            self._dist.all_gather_object(everyone, me, group=self.group)
        return sum(x == me for x in everyone)

    def _usable(self, candidates: list[Policy], auto: bool = False) -> list[Policy]:
        """The candidates every rank can run (a partition needs green contexts; under ``auto``,
        no-reshard and sequential need memory to spare: :func:`no_room`), agreed over the ranks;
        why the others were dropped goes to :attr:`dropped`."""
        mine, fatal = [], None
        for p in candidates:
            try:
                if fatal is not None:
                    continue
                if why := self.model.refusal(p, self.ranks_per_gpu) or (auto and self._no_room(p)):
                    raise UsageError(why)
                self.resources.prepare(p)
                mine.append(p.name)
            except ShimrtError as exc:
                if getattr(exc, "sticky", False):
                    fatal = exc  # raised after the others heard: they would wait for this rank for good
                self.dropped[p.name] = f"{type(exc).__name__}: {exc}"
        everyone: list = [None] * self.size
        with self._torch.cuda.device(self.torch_device):
            self._dist.all_gather_object(everyone, None if fatal else mine, group=self.group)
        if fatal is not None:
            raise fatal
        if None in everyone:
            raise ShimrtError(f"rank {everyone.index(None)} could not set the policies up (its own error says why)")
        for names in everyone:
            for p in candidates:
                if p.name not in names and p.name not in self.dropped:
                    self.dropped[p.name] = "another rank cannot run it"
        return [p for p in candidates if p.name not in self.dropped]

    def _no_room(self, policy: Policy) -> str | None:
        """Why auto leaves ``policy`` out for memory now (:func:`no_room`; None: it does not)."""
        need = self.model.held_bytes(policy)
        if not need:
            return None
        free = self._torch.cuda.mem_get_info(self.torch_device)[0]
        return no_room(need, free, policy.name)  # the kinds that hold memory take no number

    # --- the step ---
    @contextlib.contextmanager
    def step(self) -> Iterator[Policy]:
        """One training step under the policy (auto's trial, or the one kept): its compute side
        around the block, the DDP on the policy's process group, the step timed for auto; yields
        the policy."""
        start = now()
        if self.closed:
            raise UsageError("the Overlap is closed")
        if self._active is not None:
            raise UsageError("ov.step() blocks do not nest")
        policy = self.trials.current()
        timed = self.trials.picked is None
        if not timed:  # a trial's step sets the model up in _use() below
            self.model.before_step()
        if policy.plain and not timed:  # plain DDP kept: nothing to do (paced: but wait at the end)
            self.cost.add(policy.name, now() - start, kept=True)
            yield policy
            if policy.pace:  # the host's wait, as a loop's reading its loss is: not ov.step()'s own cost
                self._torch.cuda.current_stream(self.torch_device).synchronize()
            return
        torch = self._torch
        current = torch.cuda.current_stream(self.torch_device)
        if timed:
            self.placement.use(policy)  # between steps, at the same step on every rank
            # A no_sync() step reduces nothing: it does not count.
            synced = self.model.synced()
            begun = self.timer.begin(current)
        part = self.resources.stream_of(policy)
        if part is not None:  # the partition's stream starts after what came before, and hands back
            torch_stream(part).wait_stream(current)
        self._active = policy
        self.window.aim(policy.carveout if policy.window else None)
        with contextlib.ExitStack() as inside:
            inside.enter_context(self.resources.context(policy))
            spent = now() - start
            try:
                yield policy
            finally:
                start = now()
                self._active = None
                self.window.clear()
                if part is not None:
                    current.wait_stream(torch_stream(part))
        if timed:
            self.timer.end(current, begun, self.trials.done(synced))
        self.cost.add(policy.name, spent + now() - start, kept=not timed)
        if policy.pace:  # after the timer's end mark and the count: a wait, not ov.step()'s own cost
            current.synchronize()
        if timed and self.trials.exhausted:  # auto's decision: once, not a step's own cost
            self._decide()

    def _decide(self) -> None:
        torch = self._torch
        self.timer.collect(self.trials.record)

        def agree(means: list[float]) -> list[float]:  # the slowest rank's time, on every rank
            t = torch.tensor(means, dtype=torch.float64, device=self.torch_device)
            self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
            return t.tolist()
        picked = self.trials.decide(agree)  # None: the finalists, or the pick beside plain DDP, run again first
        if picked is None:
            # What the coming steps cannot use goes now (each trial step puts the model on its own
            # policy's group): the next stage runs as the job will.
            self._release(self.trials.staying)
            self._progress()
            return
        self.placement.use(picked)
        self._release([picked])
        if self.rank == 0 and log.isEnabledFor(logging.INFO):
            final = {c.name for c in self.trials.final}
            times = ", ".join(f"{n}{'*' if n in final else ''} {t:.2f}" for n, t in self.trials.means.items())
            log.info("auto kept %s (%s) after %d trial steps; mean step ms (* finalists; ddp: plain %s): %s",
                     picked.name, picked.describe(self.ranks_per_gpu), len(self.trials.schedule), self.model.kind,
                     times)
            check = self.trials.check
            if check:
                log.info("auto's check of %s alone beside plain %s, mean step ms: %s (%s)", check["policy"],
                         self.model.kind, ", ".join(f"{n} {t:.2f}" for n, t in check["means_ms"].items()),
                         how_held(check) if check["held"] or check.get("guard") else
                         "plain " + self.model.kind + " kept")
                if alone := alone_said(check, "plain " + self.model.kind):
                    log.info("auto's steps alone after its check: %s", alone)

    def _progress(self) -> None:
        """auto's stage as it begins, logged at INFO by rank 0 (``Trials.stage``)."""
        if self.rank == 0 and log.isEnabledFor(logging.INFO):
            log.info("auto, from trial step %d: %s", self.trials.position, self.trials.stage())

    def _release(self, staying: list[Policy]) -> None:
        """Only ``staying`` (and plain DDP, whose group is the model's own) run from the next
        step: the other policies' groups, Interposers and the window's hook go, and so does what
        torch cached for them (blocks per stream and at the trials' peaks, cuBLAS workspaces per
        stream: a kept plain FSDP2 held 21.3 GiB after the trials against 6.0 before, H100, 8d31cd5)."""
        self.placement.release(staying)
        self.resources.close_interposers(keep=[p.cap for p in staying if p.cap is not None])
        release_cached()

    # --- results and the end ---
    def report(self) -> dict:
        """The policy in force (None while auto tries), its process group, auto's trials and its
        reference (plain DDP, timed in the same rounds), ``ov.step()``'s host time per step per
        policy (``host_us``: every step under it, auto's trials among them) and of the policy in
        force's steps alone (``kept_host_us``: after auto's decision, or every step of a fixed
        policy), candidates dropped and why."""
        policy = self.trials.picked
        means = self.trials.means if self.auto else {}
        return {"policy": None if policy is None else policy.name,
                "describe": None if policy is None else policy.describe(self.ranks_per_gpu),
                "process_group": None if policy is None else _group_said(policy, self.ranks_per_gpu),
                "reference": {"policy": "ddp", "what": f"plain {self.model.kind}, timed in the same rounds",
                              "mean_ms": means.get("ddp")} if self.auto else None,
                "trials": self.trials.report() if self.auto else None,
                "host_us": self.cost.report(),
                # the policy in force's steps alone (after auto's decision): what the job pays from there
                "kept_host_us": self.cost.kept_report(),
                # what the policies' NCCL communicators took of the GPU's memory, outside torch's stats
                "nccl_memory": self.placement.groups.report(),
                # what the policies hold now: once plain DDP is kept, no group, Interposer or hook
                "held": dict(self.resources.held(), window_hook=self.placement.hook is not None),
                "dropped": dict(self.dropped), "ranks": self.size, "ranks_per_gpu": self.ranks_per_gpu}

    def close(self, timeout: float = 120.0) -> None:
        """Wait for the partitions' work (at most ``timeout`` s each), put the model back on its own
        process group (it trains on as the plain job) and close what the policies made (not the
        partitions, which the process keeps: see :mod:`shimrt.torch.resources`)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.resources.synchronize(timeout)
        finally:
            self._close_parts()

    def _close_parts(self) -> None:
        """Put the model back on its group and close what the policies made, each whatever the
        others do (the partitions stay: see :mod:`shimrt.torch.resources`)."""
        try:
            self.window.clear()  # a step whose entry failed may have left it aimed, or open
            self.placement.close()
        finally:
            self.resources.close()

    def __enter__(self) -> "Overlap":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _group_said(policy: Policy, ranks_per_gpu: int) -> str:
    if policy.plain:
        return "the model's own"
    if policy.sequential:
        return "the model's own, its gradients all-reduced after backward"
    ctas = policy.channels(ranks_per_gpu)
    channels = "NCCL's own channels" if ctas is None else f"NCCL held to {ctas} channels"
    return f"ProcessGroupNCCL, {policy.priority}-priority streams, {channels}"
