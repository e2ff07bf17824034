"""``bench torch`` with one process per rank: a real DDP training step under plain DDP and under
every policy of :func:`shimrt.torch.overlap`, side by side in one run.

Under torchrun or ``python -m shimrt.launch`` (2+ ranks; two processes on one GPU under
``--mps``), every rank builds the same model and trains on its own batch. Per configuration:

- compute alone: forward, backward and the optimizer step of the bare model (no DDP), each step
  ended by a one-element all-reduce that keeps the ranks in step, as DDP's all-reduces do (ranks
  sharing a GPU that drift apart compute partly alone: compute-heavy measured 25 ms so on the
  H200, against 48 ms with both ranks computing at once);
- all-reduces alone: buckets of the gradients' size through torch.distributed, back to back;
- the shortest step DDP's order allows (:func:`~shimrt.bench.torch_measure.order_bound`): the
  all-reduces alone after compute alone's forward, then the rest of its step; so how much of the
  all-reduces any way keeping that order can hide at most;
- per DDP way, its forward and backward's own GPU time (:class:`~shimrt.bench.torch_measure.ComputeSpans`)
  against compute alone's: how much slower the compute runs beside the all-reduces ("slower");
- plain DDP (ProcessGroupNCCL on its own streams): the reference a user already has; it runs
  first and again last, and the two set the run's noise;
- DDP with ``shimrt.torch.overlap`` under each fixed policy of ``--policies`` and auto (its trial
  steps counted apart, what it kept reported), with ``ov.step()``'s host microseconds per step
  of the policy in force (auto's after its decision alone, ``ov.report()["kept_host_us"]``; the
  runs in docs/data up to 0e79d59 counted auto's trial steps under its kept policy in too)
  (``priority`` is DDP on a process group of high-priority streams, what a user could make with
  ``pg_options``); with auto, also ``ddp`` (plain DDP under ``overlap(policy="ddp")``), so that
  whatever auto kept has its fixed row in the same run: the table's last lines set them side by
  side; and ``auto-steps`` (always run), auto whose check alternates plain DDP and the pick step by
  step and is made only where the trials kept another policy, its trials one step per visit, every candidate in
  every round (``Auto(check_block=1, check_always=False, trial_block=1, trial_drop=None)``, the default before
  b0f05c9's run), beside the default (visits of 3 timed steps, a check in blocks of 6) for comparison.

Every way runs ``--settle`` untimed steps before its warm-up (auto's trial steps count towards
them): plain DDP of two ranks sharing a GPU has been seen to run its first twenty or so steps
fast and then stretches 1.19x slower (docs/ddp.md), so a way timed just after its start and one
timed after auto's trials would not be compared alike. ``--steady N`` then runs windows of N
untimed steps until two in a row agree (:data:`STEADY_TOLERANCE`, the slowest rank's means, every
rank deciding alike; at most :data:`STEADY_WINDOWS`): a way is timed once it runs at one speed,
and the windows it took are in ``--json``.

``--in-turn N`` (with ``--rounds R``) times each way in blocks of N steps in turn with a plain
job of its own, made with the way's model (plain, way, way, plain per round, a step untimed
before each block: :mod:`.in_turn`), and sets each way against it by the ratio per round: where
the host's speed drifts (FSDP2 of two ranks sharing a GPU, docs/ddp.md at 8d31cd5), ways timed one
after another measure the host. The plain job is made anew for each way, after the way's model,
and settled as the way is: the two are of one age, with their loss reads in step (one plain job
kept through the configuration ran 68-71 ms beside some ways and 75-77 beside others under FSDP2,
docs/ddp.md at e888d1f). Plain DDP's own two ways read plain against plain (the run's
noise in turn); the contention column is blank (the blocks' untimed steps), and auto's room check
for no-reshard sees the plain model's memory too.

``--fsdp``: the same with FSDP2 (``fully_shard`` of every block, then the model) in place of DDP,
plain FSDP2 the reference (said so in the table; its JSON rows keep plain DDP's names); written for
2-8 GPUs, run so far with two ranks on one H100 (docs/ddp.md). The loop is a user's: ``--optimizer``
(fused SGD or fused AdamW), the loss read on the host every ``--loss-every`` steps (1: the host
waits for each step's end), ``--bucket-mb`` (DDP's ``bucket_cap_mb``), ``--bucket-view``
(``gradient_as_bucket_view=True``); ``--one-bucket`` adds plain DDP with every gradient in one
bucket, its all-reduce after backward (no overlap), set against plain DDP and said beside the goals;
each DDP way's JSON row has ``bucket_bytes``, the buckets DDP's reducer made. A step's time is the
median of per-step CUDA events after the warm-up; the table gives the slowest rank's, the mean of
the slowest rank's steps (the goals are said by both) and the slowest step, and ``--json`` every
timed step's (the slowest rank's, step by step), so a way whose steps run at two speeds shows it
(the tables and goals: :mod:`.torch_ddp_report`). Hidden: (compute alone + all-reduces alone - step)
/ all-reduces alone. Losses are set against plain DDP's, step for step, from the same weights and
batches. Each way's JSON row says what torch's caching allocator did over its warm-up and timed
steps (with ``--in-turn``, its blocks and the plain job's beside them: ``allocator``, its retries,
each a device-wide wait, said in the table where there were any; memory reserved at the end; the
device's least free memory), the ranks' worst. Rank 0 prints; ``--json`` and ``--plots`` (a bar
chart per configuration) are written by rank 0. ``--profile DIR``: after each way's timed steps, 3
more under torch.profiler; every rank's Chrome trace in DIR, and where rank 0's step went
(collectives' kernels and blocks, FSDP2's copies, the communication exposed: :mod:`.torch_timeline`)
under the table.

About 470 lines, past the house's 400: one configuration's measurement is one function over the
ways' shared state (compute alone, the reference's losses, the plain job beside them), and its
helpers (steady windows, blocks in turn, the allocator's record, the profiler) sit beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import itertools
import statistics
import time
from typing import Any, Callable

from ..errors import ShimrtError, UsageError
from ..torch.ddp import DEFAULT_BUCKET_MB, bucket_bytes
from ..torch.ddp import settings as ddp_settings
from ..torch.fsdp import settings as fsdp_settings
from .in_turn import blocks_reading, run_rounds
from .torch_ddp_report import AUTOS, CUSTOM_WAY, ONE_BUCKET_WAY, bars_png, report
from .torch_measure import ComputeSpans, allocator_mark, allocator_since, comm_hidden, order_bound, step_times_ms

__all__ = ["run"]

#: --steady: two windows in a row agree when their means are this far apart or less (a share of
#: the first), and a way runs at most this many windows before it is timed, steady or not.
STEADY_TOLERANCE = 0.02
STEADY_WINDOWS = 8


class _Rank:
    """This process's rank: its device, process groups and the model's shape."""

    def __init__(self, torch: Any, dist: Any, args: argparse.Namespace):
        from ..config import launch_env
        self.torch, self.dist, self.args = torch, dist, args
        index = launch_env().device
        self.device = torch.device("cuda", index)
        torch.cuda.set_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group("nccl", device_id=self.device,
                                    timeout=datetime.timedelta(seconds=args.comm_timeout))
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        if self.size < 2:
            raise ShimrtError("bench torch with one process per rank needs 2 or more ranks (torchrun, or python -m "
                              "shimrt.launch --nproc 2)")

    def slowest(self, values: list[float]) -> list[float]:
        """Each value's maximum over the ranks."""
        t = self.torch.tensor(values, dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def fresh(self, size: Any, shard: bool = False) -> tuple[Any, Any, Any]:
        """(model, its batch, an optimizer of --optimizer), the same weights on every rank and
        each call; ``shard``: the model fully_shard-ed (every block, then the whole: FSDP2), the
        optimizer made over its shards (foreach: fused optimizers over DTensors are not every
        torch's)."""
        from .torch_model import batch, build
        gc.collect()
        self.torch.cuda.empty_cache()
        model = build(size, self.device)
        if shard:
            from torch.distributed.fsdp import fully_shard
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
        optim, fused = self.torch.optim, not shard
        optimizer = optim.AdamW(model.parameters(), lr=1e-4, fused=fused) if self.args.optimizer == "adamw" else \
            optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, fused=fused)
        return model, batch(size, self.device, seed=1 + self.rank), optimizer

    def job(self, size: Any, bucket_mb: int | None = None) -> tuple[Any, Any, Any, Any]:
        """(model, the model as the job trains it, its batch, its optimizer): :meth:`fresh`, then
        DDP with --bucket-mb (``bucket_mb`` in its place where given) and --bucket-view, or FSDP2
        (--fsdp: the model is its own root)."""
        from torch.nn.parallel import DistributedDataParallel as DDP
        args = self.args
        model, data, opt = self.fresh(size, shard=args.fsdp)
        wrapped = model if args.fsdp else DDP(model, device_ids=[self.device.index],
                                              bucket_cap_mb=bucket_mb or args.bucket_mb,
                                              gradient_as_bucket_view=args.bucket_view)
        return model, wrapped, data, opt


def _continuing(step: Callable[[int], Any], start: int, seen: list) -> Callable[[int], Any]:
    """``step`` numbered on from ``start`` whatever index it is called with (the phases of a way,
    settling, windows and timed steps, are one run of steps), each step's loss appended to ``seen``."""
    count = itertools.count(start)

    def going(_: int) -> Any:
        seen.append(step(next(count)))
        return seen[-1]
    return going


def _window_ms(r: _Rank, step: Callable[[int], Any], steps: int) -> float:
    """One window of --steady: the mean of ``steps`` steps (ms, the slowest rank's), not in the table."""
    return r.slowest([statistics.fmean(step_times_ms(r.torch, step, 0, steps)[0])])[0]


def steady(window: Callable[[], float]) -> list[float]:
    """Run ``window()`` (a window of untimed steps; it returns their mean, the slowest rank's, so
    that every rank stops at the same window) until two in a row are STEADY_TOLERANCE apart or
    less, or STEADY_WINDOWS have run: the windows' means, in order."""
    means: list[float] = []
    while len(means) < STEADY_WINDOWS:
        means.append(window())
        if agreed(means):
            break
    return means


def agreed(means: list[float]) -> bool:
    """Whether the last two windows' means are STEADY_TOLERANCE apart or less."""
    return len(means) >= 2 and abs(means[-1] - means[-2]) <= STEADY_TOLERANCE * means[-2]


def _stepper(model: Any, data: tuple, optimizer: Any, context: Callable[[], Any] = contextlib.nullcontext,
             after: Callable[[], Any] | None = None, loss_every: int = 0, spans: ComputeSpans | None = None):
    """Step ``i``: one training step, then ``after`` (the ranks kept in step, say); the loss read
    on the host after every ``loss_every``-th step (0: never); ``spans`` marks each step's forward
    and backward."""
    def step(i: int) -> Any:
        with context():
            if spans is not None:
                spans.start()
            loss = model(*data)
            if spans is not None:
                spans.forward_end()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        if after is not None:
            after()
        if loss_every and (i + 1) % loss_every == 0:
            loss.item()
        return loss.detach()
    return step


#: Steps of a way under torch.profiler (--profile).
PROFILED_STEPS = 3


def _profiled(r: _Rank, step: Callable[[int], Any], config: str, way: str) -> dict:
    """PROFILED_STEPS of ``step`` under torch.profiler: this rank's trace written to --profile and
    where its time went (:func:`shimrt.bench.torch_timeline.summarise`)."""
    from .torch_timeline import record, summarise
    path = r.args.profile / f"{config}_{way.replace(' ', '_')}_rank{r.rank}.json.gz"
    try:
        return summarise(record(r.torch, step, PROFILED_STEPS, path), PROFILED_STEPS)
    except (ShimrtError, RuntimeError, OSError, ValueError, KeyError) as exc:  # the way's times stand without it
        return {"failed": f"{type(exc).__name__}: {exc}"}


def _plain_beside(r: _Rank, size: Any) -> tuple[Callable[[int], Any], Any]:
    """--in-turn: a step of a plain DDP (FSDP2 with --fsdp) of its own, the same weights and
    batch as every way's, its loss read every --loss-every of its steps, after --settle untimed
    ones; made for one way, beside the way's model (two models on the GPU at once, not one); and
    that DDP (FSDP2 module)."""
    _, wrapped, data, opt = r.job(size)
    going = _continuing(_stepper(wrapped, data, opt, loss_every=r.args.loss_every), 0, [])
    if r.args.settle:
        step_times_ms(r.torch, going, r.args.settle, 0)
    return going, wrapped


def _allocator(r: _Rank, mark: tuple[int, int]) -> dict:
    """The caching allocator over a way's warm-up and timed steps, or its blocks in turn
    (:func:`~.torch_measure.allocator_since`), the ranks' worst: the most retries and memory
    reserved, the least free memory of the device."""
    seen = allocator_since(r.torch, r.device, mark)
    retries, reserved, least_free = r.slowest([seen["retries"], seen["reserved"], -seen["device_free"]])
    return {"retries": int(retries), "reserved_gib": reserved / 2**30, "device_free_gib": -least_free / 2**30}


def _in_turn(r: _Rank, plain: Callable[[int], Any], way: Callable[[int], Any]) -> tuple[list[float], dict]:
    """--in-turn: --rounds rounds of blocks of --in-turn steps, plain, way, way, plain, each block
    after one untimed step (the switch from the other model); the way's timed steps (this rank's,
    in order) and the blocks' reading (:func:`~shimrt.bench.in_turn.blocks_reading`, each block the
    slowest rank's mean)."""
    args, mine = r.args, []

    def block(which: str) -> float:
        ms, _ = step_times_ms(r.torch, plain if which == "plain" else way, 1, args.in_turn)
        if which == "way":
            mine.extend(ms)
        return statistics.fmean(ms)
    read = blocks_reading(run_rounds(block, args.rounds), r.slowest)
    return mine, dict(read, block=args.in_turn, rounds=args.rounds)


def ways_of(args: Any, kinds: list[str]) -> list[tuple[str, str | None, str]]:
    """The ways of a configuration, in order: (its name, the policy overlap() is given, None for
    the plain job; the FSDP2 route). Plain DDP first and last (the run's noise), under
    ``--one-bucket`` plain DDP in one bucket (:data:`ONE_BUCKET_WAY`) after the first, each fixed
    policy of ``kinds`` (FSDP2 marks no window and has no ``sequential``; ``paced`` is plain,
    waiting), ``priority`` again over FSDP2's custom collectives under ``--fsdp-route both``
    (:data:`CUSTOM_WAY`), and with auto, plain DDP through overlap() (``ddp``: what auto keeps
    when nothing wins) and each of :data:`AUTOS`."""
    from ..torch import policies as vocabulary
    route = "mesh" if args.fsdp_route == "both" else args.fsdp_route
    fixed = [p for p in vocabulary.candidates(args.sms, kinds)
             if (p.baseline is None or p.pace or (p.sequential and not args.fsdp)) and not (args.fsdp and p.window)]
    # by name: overlap() sizes each policy's channels by the ranks per GPU
    ways: list[tuple[str, str | None, str]] = [("plain DDP", None, route)]
    if args.one_bucket:
        ways.append((ONE_BUCKET_WAY, None, route))
    ways += [(p.name, p.name, route) for p in fixed]
    if args.fsdp_route == "both":
        ways.append((CUSTOM_WAY, "priority", "custom"))
    if "auto" in kinds:
        ways += [("ddp", "ddp", route)] + [(a, a, route) for a in AUTOS]
    return ways + [("plain DDP again", None, route)]


def run_config(r: _Rank, name: str, size: Any, kinds: list[str]) -> dict:
    """Every way of configuration ``name`` (``kinds``: --policies; ``sequential`` is DDP's, left out
    under FSDP2) on this rank; times are the slowest rank's."""
    from ..torch import Auto, overlap
    torch, args = r.torch, r.args
    out: dict = {"model": size.record(), "ways": {}, "gradient_as_bucket_view": args.bucket_view, "fsdp": args.fsdp,
                 "fsdp_route": args.fsdp_route,
                 "loss_every": args.loss_every, "optimizer": args.optimizer, "bucket_mb": args.bucket_mb,
                 "steps": args.steps}
    model, data, opt = r.fresh(size)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    grad_dtype = next(model.parameters()).dtype
    steps: dict[str, list[float]] = {}  # this rank's timed steps: compute, comm and each way's
    tick = torch.zeros(1, device=r.device)
    every = args.loss_every
    # The forward and backward's own GPU time per step, alone and in each DDP way (FSDP2's forward
    # waits on its all-gathers: there a span is not compute alone).
    spans: dict[str, list[float]] = {}
    forward: list[float] = []  # compute alone's forwards (ms), the same way

    def spanned(m: Any) -> ComputeSpans | None:
        return None if args.fsdp else ComputeSpans(torch, [m.embed.weight, m.position.weight])
    marks = spanned(model)
    try:
        compute = _stepper(model, data, opt, after=lambda: r.dist.all_reduce(tick), loss_every=every, spans=marks)
        steps["compute"], _ = step_times_ms(torch, compute, args.warmup, args.steps)
        if marks is not None:
            spans["compute"], forward = marks.ms(args.steps), marks.forward_ms(args.steps)
    finally:
        if marks is not None:
            marks.close()
    chunk = ((args.bucket_mb or DEFAULT_BUCKET_MB) << 20) // grad_dtype.itemsize
    buckets = [torch.zeros(min(chunk, (grad_bytes - i) // grad_dtype.itemsize), dtype=grad_dtype, device=r.device)
               for i in range(0, grad_bytes, chunk * grad_dtype.itemsize)]
    del compute, model, opt  # the step's closure holds the bare model too

    def comm(i: int) -> Any:
        for b in buckets:
            r.dist.all_reduce(b)
        return buckets[0][0].float()  # a 0-d loss, as a model step's
    steps["comm"], _ = step_times_ms(torch, comm, args.warmup, args.steps)
    buckets.clear()  # their memory back before the models
    out["gradient_bytes"] = grad_bytes
    whole_mb = -(-grad_bytes // 2**20)  # --one-bucket's bucket_cap_mb: every gradient in one bucket
    reference = None
    ways = ways_of(args, kinds)
    timed = 2 * args.rounds * args.in_turn if args.in_turn else args.steps  # each way's timed steps
    settings = fsdp_settings if args.fsdp else ddp_settings  # a model's settings, to set a way's beside plain's
    for count, (way, policy, route) in enumerate(ways, 1):
        if r.rank == 0 and not args.quiet:  # a line per way: a configuration can take minutes
            print(f"{name}: {way} [{count}/{len(ways)}]", flush=True)
        model, ddp, data, opt = r.job(size, whole_mb if way == ONE_BUCKET_WAY else None)
        entry: dict = {}
        ov = step = going = beside = plain = None
        marks = None if args.in_turn else spanned(model)  # in turn: its untimed steps between blocks
        try:
            # --in-turn: the way timed in blocks in turn with a plain job made with it (the module's docstring)
            beside, plain = _plain_beside(r, size) if args.in_turn else (None, None)
            if policy is not None:
                chosen = (Auto(sms=args.sms, trial_steps=args.trial_steps, **AUTOS[policy]) if policy in AUTOS
                          else policy)
                ov = overlap(ddp, chosen, timeout=args.comm_timeout, fsdp_route=route)
                entry.update(ranks_per_gpu=ov.ranks_per_gpu, fsdp_route=route if args.fsdp else None)
            step = _stepper(ddp, data, opt, ov.step if ov is not None else contextlib.nullcontext,
                            loss_every=every, spans=marks)
            trials = 0
            if ov is not None and policy in AUTOS:
                while ov.report()["policy"] is None:
                    step(trials)
                    trials += 1
                entry.update(trial_steps=trials, trials=ov.report()["trials"])
            settle = max(0, args.settle - trials)
            seen: list = []  # every loss after the trials: ways compared step for step from there
            going = _continuing(step, trials, seen)  # the loss read every --loss-every steps across the phases
            if settle:
                step_times_ms(torch, going, settle, 0)
            windows = steady(functools.partial(_window_ms, r, going, args.steady)) if args.steady else []
            entry["unsteady"] = bool(windows) and not agreed(windows)  # STEADY_WINDOWS ran out
            ran = trials + settle + args.steady * len(windows)  # the way's steps before its timed ones
            entry.update(steady_windows_ms=windows, untimed_steps=ran
                         + (2 * args.rounds if args.in_turn else args.warmup))  # in turn: one before each block
            if beside is not None:  # the plain job's loss reads in step with the way's (auto's trials ran it on)
                step_times_ms(torch, beside, (ran - args.settle) % every if every else 0, 0)
            began, memory = time.time(), allocator_mark(torch, r.device)
            if beside is None:
                ms, _ = step_times_ms(torch, going, args.warmup, args.steps)
            else:
                ms, entry["in_turn"] = _in_turn(r, beside, going)
                # what of the way's model differs from the plain one's beside it (a kept plain job: nothing)
                mine, theirs = settings(ddp), settings(plain)
                entry["unlike_plain"] = sorted(k for k in mine if mine[k] != theirs[k])
            entry["allocator"] = _allocator(r, memory)
            if not args.fsdp:  # what DDP's reducer made of --bucket-mb (or of --one-bucket's size)
                entry["bucket_bytes"] = bucket_bytes(ddp)
            losses = [float(x) for x in torch.stack(seen).tolist()]
            if marks is not None:
                spans[way] = marks.ms(args.steps)
            entry["timed_between"] = (began, time.time())  # the host's clock: to match GPU clock samples
            if args.profile is not None:  # after the timed steps: the profiler's cost is in none of them
                entry["timeline"] = _profiled(r, going, name, way)
            if ov is not None:
                report = ov.report()
                entry.update(kept=report["policy"], choice=report["describe"], dropped=report["dropped"],
                             process_group=report["process_group"], host_us=report["kept_host_us"])
                ov.close()
        except (ShimrtError, RuntimeError) as exc:  # one way that cannot run here: said, the rest go on
            entry["failed"] = f"{type(exc).__name__}: {exc}"
            entry.pop("in_turn", None)  # a way that failed after its blocks has no ratio to set against the others
            ms, losses = [float("nan")] * timed, []
            if ov is not None:  # its communicators, streams and interposers, before the next way's
                with contextlib.suppress(ShimrtError, RuntimeError):  # the error said is the one above
                    ov.close()
        finally:
            if marks is not None:
                marks.close()
            del ddp, model, opt, ov, step, going, beside, plain  # the steps' closures hold the models: freed first
        steps[way] = ms
        if reference is None:
            reference = losses
        if policy not in AUTOS and losses and reference:
            # the steps both ran (--steady's windows differ between ways), from the same weights and batches
            entry["loss_max_diff"] = max(abs(a - b) for a, b in zip(losses, reference, strict=False))
        out["ways"][way] = entry
    # The slowest rank's median, and its every step (the ranks' steps end together, at the all-reduces).
    names = list(steps)
    medians = r.slowest([statistics.median(steps[n]) for n in names])
    each = r.slowest([t for n in names for t in steps[n]])
    ends = list(itertools.accumulate(len(steps[n]) for n in names))  # compute, comm: --steps; the ways: timed
    slowest = {n: (medians[i], each[end - len(steps[n]):end])
               for i, (n, end) in enumerate(zip(names, ends, strict=True))}
    (out["compute_ms"], out["compute_steps_ms"]), (out["comm_ms"], out["comm_steps_ms"]) = \
        slowest["compute"], slowest["comm"]
    for n, e in out["ways"].items():
        e["step_ms"], e["steps_ms"] = slowest[n]
        e["hidden"] = comm_hidden(out["compute_ms"], out["comm_ms"], e["step_ms"])  # NaN for a way that failed
    if not args.fsdp:
        names = ["compute", *out["ways"]]
        # NCCL's MAX drops a NaN: a way missing on any rank is said so apart (in the same
        # all-reduce), and is NaN here
        both = r.slowest([statistics.fmean(spans[n]) if spans.get(n) else 0.0 for n in names]
                         + [0.0 if spans.get(n) else 1.0 for n in names] + [statistics.fmean(forward)])
        means = [float("nan") if gone or m <= 0 else m
                 for m, gone in zip(both[:len(names)], both[len(names):-1], strict=True)]
        out["compute_span_ms"] = means[0]
        out["order_bound"] = order_bound(out["compute_ms"], out["comm_ms"], means[0], both[-1])
        for n, m in zip(names[1:], means[1:], strict=True):
            out["ways"][n]["span_ms"] = m
            out["ways"][n]["contention"] = m / means[0] - 1  # NaN where either is
    return out


def run(args: argparse.Namespace, sizes: dict) -> int:
    """``bench torch`` under a launcher with 2+ ranks: every configuration (``sizes``: name ->
    its ModelSize), its table, --json and --plots (rank 0)."""
    import torch
    import torch.distributed as dist

    from .. import cli
    from ..nccl.link import link_of_process
    if not torch.cuda.is_available():
        raise UsageError("bench torch needs torch with CUDA")
    with cli.deadline(args.timeout):
        r = _Rank(torch, dist, args)
        # the link every communicator of the run crosses (python -m shimrt.launch --link)
        results: dict = {"ranks": r.size, "link": link_of_process() or "native", "configs": {}}
        if r.rank == 0:
            print(f"{r.size} ranks, their collectives over the {results['link']} link", flush=True)
        for name, size in sizes.items():
            results["configs"][name] = result = run_config(r, name, size, list(args.policies))
            if r.rank == 0:
                print(report(name, result), flush=True)
                if args.plots:
                    print(f"wrote {bars_png(name, result, args.plots / f'ddp_{name}.png')}", flush=True)
                # The configurations so far, after each: a run cut short by its deadline keeps them.
                cli.finish("", results, args.json, indent=None, say=name == list(sizes)[-1])
        dist.destroy_process_group()
    return 0
