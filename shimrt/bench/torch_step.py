"""Time a real PyTorch training step (a torch.nn transformer decoder in bf16 whose gradients are
reduced bucket by bucket during backward) under every overlap policy, side by side.

Under a launcher with 2+ ranks (torchrun, ``python -m shimrt.launch``), one process per rank:
plain DDP against ``shimrt.torch.overlap`` (:mod:`.torch_ddp`). Otherwise, in one process:

Communication is real NCCL over this process's ranks (two ranks on one GPU where NCCL 2.30+
allows it, NCCL_MULTI_RANK_GPU_ENABLE=1; else one per GPU of SHIMRT_DEVICES); ranks after the
first add zeros, so the gradients stay rank 0's own, bit for bit. Policies:
- baselines a user already has: sequential (every all-reduce after backward), low-priority
  (each bucket on a separate stream at default priority, as DDP does) and priority (the same at
  the greatest priority, as DDP's high-priority stream);
- shimrt: shaping (every torch kernel capped at N blocks per SM through launch interposition),
  partition (torch on a green context of all but K SMs, NCCL's channels sized to fit K), carveout
  (cuBLAS leaves K SMs, NCCL sized alike), and auto (each choice tried for a few steps, the
  fastest kept; its tuning time is reported).
Reported per configuration: step time, its ratio to low-priority's (DDP's way), communication hidden, the
compute's own slowdown under the policy, whether losses and gradients equal the sequential run's
bit for bit; and why it gains what it gains (:mod:`.torch_measure`: bounds, SM sharing, memory
contention); --json, and --plots for CUPTI timelines of one step per policy (PNG).

About 490 lines: :func:`run_config` is one configuration's whole measurement (the policies'
communicators, compute alone, every way, the timelines), whose parts share its state, and the
options of both modes are declared and checked here, once (--fsdp, --fsdp-route, --settle,
--steady belong to one process per rank); the measurements themselves are :mod:`.torch_measure`'s,
the tables :mod:`.torch_report`'s, and one process per rank :mod:`.torch_ddp`'s.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import cli, validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..lifetime import close_each
from ..torch import policies as policies_mod
from ..torch.ddp import DEFAULT_BUCKET_MB
from ..torch.fsdp import ROUTES
from . import torch_measure
from .progress import Progress
from .torch_measure import comm_hidden, finish, interposer_cost, is_nccl, timed_steps
from .torch_report import report, timelines_png

__all__ = ["CONFIGS", "add_arguments", "run"]

if TYPE_CHECKING:
    from ..torch.step import GradientBuckets

#: name -> model and batch: one 1.08 G-parameter model (2 GiB of bf16 gradients), fewer tokens per
#: step as communication weighs more (comm-heavy: all-reduces alone about 0.56x compute alone on
#: the H200). Four wide blocks keep the step GPU-bound: eight blocks of 2048 left the small
#: configurations waiting on the host, where every policy's time was noise.
CONFIGS: dict[str, dict[str, Any]] = {
    "compute-heavy": dict(width=4096, layers=4, batch=2, seq=1024),
    "balanced": dict(width=4096, layers=4, batch=1, seq=1024),
    "comm-heavy": dict(width=4096, layers=4, batch=1, seq=256),
    # A user's smaller model, whose step waits on the host as much as on the GPU: twelve blocks of
    # 1024 (219 M parameters) in fp32 under bf16 autocast, so its all-reduces are fp32 (0.82 GiB).
    "balanced-1024": dict(width=1024, layers=12, batch=4, seq=1024, weights="float32"),
    "comm-heavy-1024": dict(width=1024, layers=12, batch=1, seq=1024, weights="float32"),
    # Sized to a network link (python -m shimrt.launch --link socket, docs/regimes.md): on an H100
    # at b0f05c9 NCCL's socket transport on loopback all-reduced 0.82 GiB in 324 ms (2.7 GB/s) and
    # 24 sequences of comm-heavy-1024's model took 172 ms of compute. Its weights in bf16 halve the
    # all-reduces (0.41 GiB, about 160 ms at that speed): 8, 24 and 32 sequences put the compute
    # at about a third of them, level with them and 1.4 times them. Not more: a step's logits
    # (32768 tokens of the vocabulary, in bf16 and fp32 with their gradients) and activations
    # come to about 30 GiB a rank at 32 sequences, and two ranks share the GPU.
    "link-comm-heavy": dict(width=1024, layers=12, batch=8, seq=1024),
    "link-balanced": dict(width=1024, layers=12, batch=24, seq=1024),
    "link-compute-heavy": dict(width=1024, layers=12, batch=32, seq=1024)}
#: The configurations of one process per rank by default: over the native link (shared memory
#: between ranks of a GPU) and over a network link (--link socket).
NATIVE = ("compute-heavy", "balanced", "comm-heavy", "balanced-1024", "comm-heavy-1024")
LINKED = ("link-balanced", "link-comm-heavy", "link-compute-heavy")  # the goals' first: a run cut short keeps it
#: The configurations of one process holding every rank (the host-bound ones are DDP's: here their
#: policies' times would be the host's noise).
WIDE = ("compute-heavy", "balanced", "comm-heavy")
#: What a step's optimizer is (both fused: one pass over weights, gradients and state).
OPTIMIZERS = ("sgd", "adamw")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench torch``."""
    p.add_argument("--configs", default=None,
                   type=cli.distinct(validate.one_of, "--configs", allowed=tuple(CONFIGS)),
        help=f"configurations, comma-separated, of {', '.join(CONFIGS)} (default with one process per rank: "
             f"{', '.join(NATIVE)}, or under python -m shimrt.launch --link socket {', '.join(LINKED)}; "
             f"{', '.join(WIDE)} with every rank in this one)")
    # --batch and --seq size a configuration to a link (docs/regimes.md): compute about as long as its all-reduces.
    for flag, least, what in (("--width", 64, "model width"), ("--layers", 1, "blocks"),
                              ("--batch", 1, "sequences per rank and step"), ("--seq", 8, "tokens per sequence")):
        p.add_argument(flag, metavar="N", default=None,
                       type=cli.count(flag, least),
                       help=f"{what} of every configuration, at least {least} (default: each configuration's own)")
    for flag, default, least, what in (("--steps", 8, 1, "timed steps per policy"),
                                       ("--warmup", 2, 1, "untimed steps before them (the first teaches the "
                                                          "interposer the kernels)"),
                                       ("--trial-steps", None, 1, "steps auto times each choice for, with auto in "
                                                                  "--policies (default 3)")):
        p.add_argument(flag, metavar="N", default=default,
                       type=cli.count(flag, least),
                       help=f"{what}, at least {least}" + (f" (default {default})" if default is not None else ""))
    p.add_argument("--bucket-mb", metavar="N", default=None, type=cli.count("--bucket-mb", 1),
                   help=f"DDP's bucket_cap_mb, at least 1 (default: DDP's own, {DEFAULT_BUCKET_MB} MiB buckets after a "
                        "first one of 1 MiB, as DDP(model) makes them; a size given is the first bucket's too)")
    p.add_argument("--sms", default="32,48,64", type=cli.distinct(validate.integer, "--sms", **policies_mod.SMS_BOUNDS),
        help="SMs kept for NCCL by the partition and carveout policies, comma-separated (default 32,48,64)")
    p.add_argument("--policies", default=None,
                   type=cli.distinct(validate.one_of, "--policies", allowed=KINDS),
                   help=f"policies, comma-separated, of {', '.join(KINDS)} (default: all but prefetch and "
                        "no-reshard, which --fsdp adds: FSDP2's auto tries them, DDP's does not, and zero-sm, "
                        "which --fsdp --fsdp-route custom adds; paced runs with one process per rank only; the first "
                        "is the reference the others' losses and gradients are compared with)")
    cli.add_timeout(p, 1800)
    p.add_argument("--comm-timeout", metavar="S", default=300.0,
                   type=validate.argument(validate.number, "--comm-timeout", positive=True, most=86400),
                   help="one process per rank: seconds a collective may take before it is aborted (default 300)")
    p.add_argument("--bucket-view", action="store_true",
                   help="one process per rank: every DDP with gradient_as_bucket_view=True (gradients are views "
                        "of DDP's buckets: no copy between them)")
    p.add_argument("--one-bucket", action="store_true",
                   help="one process per rank, DDP: also plain DDP with every gradient in one bucket (its "
                        "all-reduce after backward, no overlap), after plain DDP: what a user can run without "
                        "shimrt where overlapping costs more than it hides")
    p.add_argument("--fsdp", action="store_true",
                   help="one process per rank: FSDP2 (fully_shard of every block and the model) in place of DDP; "
                        "plain FSDP2 is the reference")
    p.add_argument("--loss-every", metavar="N", default=0, type=cli.count("--loss-every", 0),
                   help="one process per rank: read the loss on the host every N steps, as a training loop that "
                        "logs it does (1: the host waits for every step's end; default 0: never, the host runs "
                        "ahead)")
    p.add_argument("--settle", metavar="N", default=0, type=cli.count("--settle", 0),
                   help="one process per rank: untimed steps every way runs before its warm-up, so that each is "
                        "timed as far into the job as auto's kept policy (auto's trials count towards them; "
                        "default 0)")
    p.add_argument("--fsdp-route", default="mesh", choices=(*ROUTES, "both"),
                   help="one process per rank, with --fsdp: how FSDP2's collectives reach a policy's process groups, "
                        "its groups' mesh (default) or FSDP2's public custom collectives (shimrt.torch.fsdp); both: "
                        "every way over the mesh, and priority over the custom collectives too, side by side")
    p.add_argument("--steady", metavar="N", default=0, type=cli.count("--steady", 0),
                   help="one process per rank: after --settle, windows of N untimed steps until two in a row agree "
                        "(their means, the slowest rank's, within 2%%; at most 8 windows), so that a way is timed "
                        "once it runs at one speed (default 0: no windows)")
    p.add_argument("--in-turn", metavar="N", default=0, type=cli.count("--in-turn", 0),
                   help="one process per rank: time each way in blocks of N steps in turn with a plain DDP (or "
                        "FSDP2) model of its own, made anew for each way (plain, way, way, plain per "
                        "round, --rounds rounds, a step untimed before each block), and set each way against plain "
                        "by the ratio per round: what a job whose host speed drifts needs; --steps then times "
                        "compute alone and the all-reduces alone only (default 0: each way timed alone, --steps "
                        "steps)")
    p.add_argument("--rounds", metavar="R", default=None, type=cli.count("--rounds", 1),
                   help="with --in-turn: rounds of four blocks (default 4)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="one process per rank: fused SGD with momentum (default) or fused AdamW")
    p.add_argument("--local-ranks", metavar="N", default=None,
                   type=validate.argument(validate.integer, "--local-ranks", least=2, most=64),
                   help="ranks in this process (default: 2 on one GPU where NCCL can, else one per GPU)")
    p.add_argument("--plots", metavar="DIR", default=None, type=validate.argument(cli.writable_folder, "--plots"),
                   help="write a CUPTI timeline of one step per policy as DIR/torch_CONFIG.png")
    p.add_argument("--profile", metavar="DIR", default=None, type=validate.argument(cli.writable_folder, "--profile"),
                   help="one process per rank: after each way's timed steps, 3 steps more under torch.profiler, "
                        "each rank's Chrome trace in DIR and where rank 0's step time went in the table "
                        "(shimrt.bench.torch_timeline)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress (a bar with every rank in this one process, a line per way with one process "
                        "per rank)")
    cli.add_json(p)
    p.set_defaults(run=run, check=check)


def check(args: argparse.Namespace) -> None:
    """What the options need beyond their own values, refused before the run (not after a
    configuration was measured)."""
    if args.plots is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plots needs matplotlib: pip install 'shimrt[plot]' (or leave --plots out)")
    if args.one_bucket and args.fsdp:
        raise UsageError("--one-bucket is DDP's (FSDP2 has no buckets): leave out --one-bucket or --fsdp")
    if args.fsdp_route != "mesh" and not args.fsdp:
        raise UsageError("--fsdp-route applies with --fsdp (FSDP2's collectives): add --fsdp or leave it out")
    args.paced_asked = args.policies is not None and "paced" in args.policies  # refused with one process (run)
    if args.fsdp and args.policies is not None and "sequential" in args.policies:
        raise UsageError("sequential all-reduces a DDP's gradients after backward; FSDP2 has none to: leave "
                         "sequential out of --policies or --fsdp out")
    if args.policies is None:  # prefetch:N and no-reshard are FSDP2's candidates alone (shimrt.torch.training)
        args.policies = [k for k in KINDS if (k not in policies_mod.FSDP_KINDS or args.fsdp)
                         and (k != "zero-sm" or (args.fsdp and args.fsdp_route == "custom"))]
    for kind, what in (("prefetch", "prefetch:N is FSDP2's (it all-gathers parameters ahead)"),
                       ("no-reshard", "no-reshard is FSDP2's (it keeps sharded parameters all-gathered)")):
        if kind in args.policies and not args.fsdp:
            raise UsageError(f"{what}: add --fsdp, or leave {kind} out of --policies")
    if "zero-sm" in args.policies and not (args.fsdp and args.fsdp_route == "custom"):
        raise UsageError("zero-sm is FSDP2's over its custom collectives (its all-gather outputs come from symmetric "
                         "memory): add --fsdp --fsdp-route custom, or leave zero-sm out of --policies")
    if args.trial_steps is not None and "auto" not in args.policies:
        raise UsageError("--trial-steps applies with auto in --policies only (it sets auto's trials): add auto to "
                         "--policies or leave --trial-steps out")
    if args.trial_steps is None:
        args.trial_steps = 3
    if args.rounds is not None and not args.in_turn:
        raise UsageError("--rounds applies with --in-turn (rounds of blocks in turn): add --in-turn N or leave "
                         "--rounds out")
    if args.rounds is None:
        args.rounds = 4
    for name in args.configs or CONFIGS:  # a shape torch cannot build is refused here, before any GPU
        try:
            model_size(name, args)
        except UsageError as exc:
            raise cli.renamed(exc, "ModelSize.width", "--width") if args.width is not None else exc from None


#: What --policies takes (shimrt.torch.policies' kinds but ``ddp``: one process here holds every
#: rank, so there is no torch.distributed process group to all-reduce through).
KINDS = tuple(k for k in policies_mod.KINDS if k != "ddp")
channels = policies_mod.channels_for


def policies(sms: list[int], ranks_per_gpu: int, kinds: Any = KINDS) -> list:
    """The fixed policies of ``kinds``, baselines first (:func:`shimrt.torch.policies.candidates`),
    their NCCL channels fixed for ``ranks_per_gpu`` ranks per GPU (``ctas``): this run's
    communicators are made per channel setting. No ``prefetch``, ``no-reshard`` or ``zero-sm`` here: one process
    holds no FSDP2; no ``paced``: one host drives every rank, and waits for them all anyway."""
    return [p.sized(ranks_per_gpu) for p in policies_mod.candidates(sms, [k for k in kinds if k not in
                                                                          ("ddp", "prefetch", "no-reshard", "zero-sm",
                                                                                   "paced")])]


class Bench:
    """What one run holds: communicators per channel setting, and the policies' partitions and
    Interposers (:class:`~shimrt.torch.resources.Resources`, as :func:`shimrt.torch.overlap`
    holds them, closed at the end of the run); closed at the end."""

    def __init__(self, dev: Device, devices: list):
        from ..torch.resources import Resources
        self.dev, self.devices = dev, devices
        self.resources = Resources(dev, keep_partitions=False)
        self._comms: dict = {}

    def comms(self, ctas: int | None) -> list:
        from ..nccl import CommOptions, Communicator
        if ctas not in self._comms:
            options = CommOptions(blocking=True, min_ctas=ctas, max_ctas=ctas)
            self._comms[ctas] = Communicator.local(self.devices, options=options)
        return self._comms[ctas]

    def close(self) -> None:
        try:
            self.resources.close()
        finally:
            close_each([c for comms in self._comms.values() for c in comms])


def fastest_kept(sms: list, ranks_per_gpu: int, comm_ms: dict) -> int:
    """Of the SMs kept for NCCL in ``sms``, the setting whose channels' all-reduces ran fastest alone
    (``comm_ms``: channels per rank -> ms); the first where none of them ran."""
    return min(sms, key=lambda k: comm_ms.get(channels(k, ranks_per_gpu), float("inf")))


def contention_at(bench: Bench, torch: Any, buckets: GradientBuckets, comm_of: Any, comm_ms: dict, ranks_per_gpu: int,
                sms: list) -> dict:
    """:func:`torch_measure.contention` at the --sms setting whose all-reduces ran fastest alone
    (the first, where none ran alone here), torch kept off those SMs by a partition; {"error":
    why} where no partition can be made (no green contexts) or memory is short."""
    from ..torch import stream as torch_stream
    from ..torch.policies import Policy
    kept = fastest_kept(sms, ranks_per_gpu, comm_ms)
    ctas = channels(kept, ranks_per_gpu)
    try:
        stream = torch_stream(bench.resources.partition(kept).stream)
    except ShimrtError as exc:  # no green contexts here: the rest of the run goes on
        if is_fatal(exc):
            raise
        return {"error": f"{type(exc).__name__}: {exc}"}
    try:
        out = torch_measure.contention(torch, comm_of(Policy("contention", ctas=ctas)), buckets, stream)
    except torch.cuda.OutOfMemoryError as exc:
        return {"error": f"out of memory: {exc}"}
    return {"sms_kept": bench.resources.partition(kept).kept.target.num_sms, "channels": ctas, **out}


def _same(torch: Any, a: Any, b: Any) -> tuple[bool, float]:
    """(bitwise equal, largest absolute difference) of two lists of tensors."""
    if all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
        return True, 0.0
    return False, max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b, strict=True))


def model_size(name: str, args: argparse.Namespace) -> Any:
    """Configuration ``name``'s model (a ModelSize), with ``--width``, ``--layers``, ``--batch`` and
    ``--seq`` over its own."""
    from .torch_model import ModelSize
    shape = CONFIGS[name] | {k: v for k in ("width", "layers", "batch", "seq")
                             if (v := getattr(args, k, None)) is not None}
    return ModelSize(heads=max(1, shape["width"] // 128), **shape)


def run_config(bench: Bench, name: str, args: argparse.Namespace, progress: Progress) -> dict:
    """Every policy and auto on configuration ``name``: the result as JSON-ready dict."""
    import torch

    from ..occupancy import Footprint
    from ..torch.policies import Policy
    from ..torch.resources import Window
    from ..torch.step import GradientBuckets, NcclBuckets
    from .torch_model import batch, build
    from .torch_trainer import Trainer
    dev = bench.dev
    size = model_size(name, args)
    where = torch.device("cuda", dev.index)
    model = build(size, where)
    buckets = GradientBuckets(model, (args.bucket_mb or DEFAULT_BUCKET_MB) << 20)
    trainer = Trainer(model, batch(size, where), buckets)
    ranks_per_gpu = sum(d.index == dev.index for d in bench.devices)
    fixed = policies(args.sms, ranks_per_gpu, args.policies)
    comm_sets: dict = {}

    def comm_of(policy):
        key = (policy.ctas, policy.priority, policy.carveout if policy.window else None)
        if key not in comm_sets:
            beside = Window(policy.carveout).held if policy.window else None
            comm_sets[key] = NcclBuckets(bench.comms(policy.ctas), buckets, policy.priority, beside=beside)
        return comm_sets[key]

    resources = bench.resources
    context, settle = resources.context, resources.settle

    result: dict = {"model": size.record(),
                    "gradient_bytes": buckets.nbytes, "buckets": len(buckets.flats), "policies": {}}
    try:
        progress.step(f"{name}: compute alone")
        compute_ms, _, _ = timed_steps(torch, trainer, None, True, args.warmup, args.steps)
        result["compute_ms"] = compute_ms
        comm_ms = {}
        natural = Policy("NCCL's own channels")  # the reference for comm alone, whatever policies run
        for p in [natural, *fixed]:
            if p.ctas not in comm_ms:
                comm_ms[p.ctas] = torch_measure.comm_alone(torch, comm_of(p), buckets)
        result["comm_ms"] = {str(k): v for k, v in comm_ms.items()}
        with dev.record_kernels() as rec:
            torch_measure.comm_alone(torch, comm_of(natural), buckets, repeats=0)
        nccl = [k for k in rec.kernels if is_nccl(k["name"])]
        if nccl:
            nccl_channels, footprint = Footprint.of_record(nccl[0])
            result["nccl"] = {"kernel": footprint.name, "channels_per_rank": nccl_channels,
                              "ranks_on_this_gpu": ranks_per_gpu,
                              "blocks_on_this_gpu": nccl_channels * ranks_per_gpu, "threads": footprint.threads,
                              "registers": footprint.registers,
                              "smem": footprint.static_smem + footprint.dynamic_smem}
            with dev.record_kernels() as rec:  # one step of compute alone: which kernels can sit beside NCCL
                trainer.step(None)
                finish(torch)
            result["sharing"] = torch_measure.sharing(dev.target, [k for k in rec.kernels if not is_nccl(k["name"])],
                                                    footprint)
        # NCCL's blocks on this GPU per channel setting: one per channel per rank.
        blocks = {str(k): k * ranks_per_gpu for k in comm_ms if k is not None}
        if "nccl" in result:
            blocks["None"] = result["nccl"]["blocks_on_this_gpu"]
        result["bound"] = torch_measure.bound(torch_measure.phases(torch, trainer), compute_ms, result["comm_ms"],
                                              blocks, dev.target.num_sms)
        result["contention"] = contention_at(bench, torch, buckets, comm_of, comm_ms, ranks_per_gpu, args.sms)
        reference = None
        for p in fixed + (["auto"] if "auto" in args.policies else []):
            key = p if isinstance(p, str) else p.name
            progress.step(f"{name}: {key}")
            entry: dict = {}
            try:
                if p == "auto":  # among the policies that ran here with finite losses
                    sound = [q for q in fixed if result["policies"].get(q.name, {}).get("finite")]
                    if not sound:
                        raise ShimrtError("auto has no policy to choose from: none of the fixed policies ran here with "
                                          "finite losses (list some in --policies besides auto)")
                    p, entry = _tune(torch, trainer, sound, comm_of, context, settle, args)
                comm = comm_of(p)
                with context(p):
                    overlapped = not p.sequential
                    step_ms, losses, grads = timed_steps(torch, trainer, comm, overlapped, args.warmup, args.steps,
                                                         keep=True, settle=settle(p))
                    # A windowed carveout exists only beside all-reduces: its compute alone is the plain one.
                    plain = p.window or (p.cap is None and p.partition is None and p.carveout is None)
                    alone_ms = compute_ms if plain else \
                        timed_steps(torch, trainer, None, True, 1, args.steps, settle=settle(p))[0]
                    steps_seen = (torch_measure.timeline(dev, torch, trainer, comm, overlapped)
                                  if args.plots or args.json else [])
                    # The reference once more: are its kernels deterministic? (else no policy can be bitwise).
                    # Not a shaping one: its interposer learnt the kernels, so the repeat's first step differs.
                    repeat = timed_steps(torch, trainer, comm, overlapped, args.warmup, 1, keep=True,
                                         settle=settle(p)) if reference is None and p.cap is None else None
            except (ShimrtError, RuntimeError) as exc:  # one policy that cannot run here: said, the rest go on
                if is_fatal(exc):
                    raise  # the device's context is broken: nothing after this could be trusted
                print(f"bench torch: {name}: {key} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                result.setdefault("failed", {})[key] = f"{type(exc).__name__}: {exc}"
                continue
            if reference is None:
                reference = (losses, grads)
                if repeat is not None:
                    _, again, again_grads = repeat
                    same_losses, loss_diff = _same(torch, [again], [losses[:len(again)]])  # warm-up + 1 step
                    same_grads, grad_diff = _same(torch, again_grads, grads)
                    result["reference_repeat"] = {"losses_bitwise": same_losses, "loss_max_diff": loss_diff,
                                                  "grads_bitwise": same_grads, "grad_max_diff": grad_diff}
                    del repeat, again_grads
                same_losses, loss_diff, same_grads, grad_diff = True, 0.0, True, 0.0
            else:
                same_losses, loss_diff = _same(torch, [losses], [reference[0]])
                same_grads, grad_diff = _same(torch, grads, reference[1])
            del grads
            t_comm = comm_ms[p.ctas]
            finite = bool(torch.isfinite(losses).all())
            entry.update(policy=p.name, choice=p.describe(), step_ms=step_ms, compute_alone_ms=alone_ms, finite=finite,
                         compute_slowdown=None if p.window else alone_ms / compute_ms, comm_alone_ms=t_comm,
                         comm_hidden=comm_hidden(alone_ms, t_comm, step_ms),
                         losses=[float(x) for x in losses], losses_bitwise=same_losses, loss_max_diff=loss_diff,
                         grads_bitwise=same_grads, grad_max_diff=grad_diff, timeline=steps_seen)
            if p.cap is not None:
                entry["interposer"] = {k: v for k, v in resources.interposer(p.cap).report().items()
                                       if k != "raised_limits"}
            result["policies"]["auto" if entry.get("tried") else p.name] = entry
    finally:
        try:  # newest first: each windowed set restores the carveout it found, so the first made restores the original
            close_each(list(reversed(comm_sets.values())))
        finally:
            resources.close_interposers()  # they learnt this model's kernels
    return result


def is_fatal(exc: BaseException) -> bool:
    """An error that poisons the context (an illegal address, a launch failure): shimrt's sticky
    DriverError, or torch's "CUDA error" (torch's own text does not say which; taken as such)."""
    from ..errors import DriverError
    return isinstance(exc, DriverError) and exc.sticky or "CUDA error" in str(exc)


def _tune(torch: Any, trainer: Any, fixed: list, comm_of: Any, context: Any, settle: Any, args: argparse.Namespace):
    """auto, as :func:`shimrt.torch.overlap`'s: :class:`~shimrt.torch.trials.Trials` over every
    fixed policy that ran here (``--trial-steps`` rounds, a visit one warm-up step and one timed,
    then the finalists again); the fastest by its mean."""
    from ..torch.trials import Trials
    t0 = time.perf_counter()
    trials = Trials(fixed, steps=args.trial_steps, warmup=1, margin=0.0)
    picked = None
    while picked is None:
        while not trials.exhausted:
            p = trials.current()
            with context(p):  # the visit: its warm-up step (the interposer learns), then the timed one
                ms = timed_steps(torch, trainer, comm_of(p), not p.sequential, 1, 1, settle=settle(p))[0]
            trials.done(True)  # the warm-up
            index = trials.done(True)
            if index is not None:
                trials.record(index, ms)
        picked = trials.decide()
    return picked, {"tried": dict(trials.means), "picked": picked.name, "trial_steps": len(trials.schedule),
                    "tuning_s": time.perf_counter() - t0}


def run(args: argparse.Namespace) -> int:
    """``bench torch``: every configuration, its table, --json and --plots."""
    try:
        import torch
    except ImportError:
        raise UsageError("bench torch needs PyTorch with CUDA: pip install 'shimrt[torch]'") from None
    from ..config import launch_env
    from ..launch import local_devices
    launch = launch_env()
    if launch.world_size > 1 and args.local_ranks is None:  # one process per rank: DDP and shimrt.torch.overlap
        from ..nccl.link import link_of_process
        from . import torch_ddp
        names = args.configs or (LINKED if link_of_process() else NATIVE)
        return torch_ddp.run(args, {name: model_size(name, args) for name in names})
    if getattr(args, "paced_asked", False):
        raise UsageError("paced waits at the end of each rank's ov.step(), which needs one process per rank (DDP): run "
                         "under torchrun or python -m shimrt.launch --nproc N, or leave paced out of --policies")
    for flag, default in (("bucket_view", False), ("one_bucket", False), ("loss_every", 0), ("optimizer", "sgd"),
                          ("fsdp", False), ("settle", 0), ("steady", 0), ("fsdp_route", "mesh"), ("profile", None),
                          ("in_turn", 0)):
        if getattr(args, flag) != default:
            raise UsageError(f"--{flag.replace('_', '-')} applies to one process per rank (DDP): run under torchrun "
                             "or python -m shimrt.launch --nproc N, without --local-ranks")
    args.configs = args.configs or list(WIDE)
    dev = Device(launch.device)
    if dev.backend != "cuda" or not torch.cuda.is_available():
        raise UsageError("bench torch needs torch with CUDA on a CUDA device")
    torch.cuda.set_device(dev.index)
    devices = local_devices(dev, args.local_ranks)
    if len(devices) < 2:
        raise ShimrtError("bench torch needs at least 2 ranks to all-reduce between: two GPUs (SHIMRT_DEVICES), or "
                          "two ranks on one GPU (NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1)")
    bench = Bench(dev, devices)
    fixed = len(policies(args.sms, 1, args.policies))
    progress = Progress(len(args.configs) * (fixed + 2), enabled=not args.quiet)
    configs: dict[str, dict] = {}  # name -> run_config()'s result
    results: dict[str, object] = {"device": repr(dev), "ranks": [d.index for d in devices], "configs": configs}
    with cli.deadline(args.timeout):  # the whole run, its clean-up included
        try:
            results["interposer_cost"] = cost = interposer_cost(dev)
            print("interposer host cost per launch (us): " + "; ".join(
                f"{k}: {v['plain_us']:.2f} without, {v['interposed_us']:.2f} with (+{v['added_us']:.2f})"
                for k, v in cost.items()), flush=True)
            for name in args.configs:
                configs[name] = run_config(bench, name, args, progress)
                torch.cuda.empty_cache()  # the model of this configuration is gone
                progress.close()
                print(report(name, configs[name]), flush=True)
        finally:
            progress.close()
            bench.close()
    results["nccl_version"] = _nccl_version()
    cli.finish("", results, args.json, indent=None, say=True)
    if args.plots:
        for name, r in configs.items():
            print(f"wrote {timelines_png(name, r, args.plots / f'torch_{name}.png')}")
    return 0


def _nccl_version() -> str:
    from ..nccl import library
    return library.load("cuda").version_text

