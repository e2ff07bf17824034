"""Measure compute beside communication under every overlap policy: makespan, overlap efficiency and ratio.

For each workload (a compute kernel and size x a collective and message size) the schedule
"compute of layer i-1 beside the collective of layer i" runs under sequential, concurrent,
priority, shaping, shaping+priority, partition and auto, --repeats times each; times come
from the kernels' per-block device timestamps. On one GPU the collective is the stand-in with
NCCL's footprint (shimrt.overlap.standin); every report says which communication was used.
Under python -m shimrt.launch --nproc N -m shimrt.bench overlap (or torchrun/MPI) with 2+
ranks the collectives are real NCCL/RCCL ones (--comm auto), timed through CUPTI, and rank
0 reports. --comm-ratios sizes the collective so that T_comm is that multiple of T_comp (1
is the balanced point; with NCCL every rank takes the slowest rank's times, so all agree on the
sizes); --bytes gives message sizes instead. Prints a table per workload, a summary (auto
against the best fixed policy, the reduction against sequential), and writes JSON (--json)
and PNG plots (--plots DIR: timelines per policy, makespan per policy).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from typing import Any

import numpy as np

from .. import cli, validate
from ..config import launch_env, settings
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..overlap import planner
from ..overlap.auto import ChoiceCache, search
from ..overlap.collective import COLLECTIVES, NcclCollective
from ..overlap.engine import Engine, Result
from ..overlap.schedule import Schedule
from ..overlap.standin import MAX_LINK_GBPS, MIN_LINK_GBPS, STEPS, CommStandIn, StandInSpec
from ..overlap.workloads import ComputeSpec, ComputeWorkload
from .communication import Communication, Retune, auto_nccl
from .communication import comm_kind as _comm_kind
from .progress import Progress

__all__ = ["add_arguments", "run"]

SCHEMA = "shimrt.bench.overlap/1"
_MIB = 1 << 20
_SPEC = re.compile(r"^([A-Za-z_]+):([0-9]{1,20})(?::([0-9]{1,20}))?$")  # no more digits than int() reads


def compute_spec(item: str, what: str = "compute") -> ComputeSpec:
    """One "kind:size[:block]" item as a ComputeSpec, refused with ComputeSpec's own rules."""
    m = _SPEC.match(validate.text(item, what).strip())
    if m is None:
        raise UsageError(f"{what} must be kind:size[:block] items such as sgemm:4096 or softmax:8192:1024, "
                         f"not {validate.shown(item)}")
    kind, size, block = m.groups()
    try:
        return ComputeSpec(kind, int(size), *([int(block)] if block else []))
    except UsageError as exc:
        raise UsageError(f"{what} {m.group(0)!r}: {exc}") from None


def _stand_in(field: str):
    """A check of one StandInSpec field with the spec's own rules (threads, blocks, ranks)."""
    def check(value, what: str) -> int:
        value = cli.integer_text(value, what) if isinstance(value, str) else value
        try:
            StandInSpec(nbytes=_MIB, **{field: value})
        except UsageError as exc:
            raise cli.renamed(exc, field, what) from None
        return value
    return check


def message_bytes(value: Any, what: str = "bytes") -> int:
    """A collective's message size: whole MiB (the sizes the benchmark runs), e.g. 16M or 256MiB."""
    nbytes = cli.nbytes(value, what, least=1, most=1 << 40)  # no GPU holds a 1T message
    if nbytes % _MIB:
        raise UsageError(f"{what} must be whole MiB such as 1M, 16MiB or 1G, not {value!r}")
    return nbytes


def link_gbps(value: Any, what: str = "link_gbps") -> float:
    """A stand-in channel's bandwidth in GB/s: 0 (unpaced) or what StandInSpec takes."""
    gbps = validate.number(cli.number_text(value, what) if isinstance(value, str) else value, what, least=0)
    if gbps:
        try:
            StandInSpec(nbytes=_MIB, link_gbps=gbps)
        except UsageError as exc:
            raise UsageError(f"{what} must be 0 (unpaced) or a bandwidth in GB/s from {MIN_LINK_GBPS:g} to "
                             f"{MAX_LINK_GBPS:g}, not {validate.shown(value)}") from exc
    return gbps


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench overlap``, each checked as it is parsed."""
    p.add_argument("--compute", metavar="KIND:SIZE[:BLOCK],...", default="sgemm:4096,bias_gelu:8192,softmax:8192",
                   type=cli.distinct(compute_spec, "--compute"),
                   help="compute kernels, comma-separated; KIND one of sgemm (SIZE a multiple of 128), bias_gelu, "
                        "softmax, layernorm (BLOCK 1..1024) (default %(default)s)")
    p.add_argument("--comm", choices=("auto", "stand-in", "nccl"), default="auto",
                   help="the communication: the stand-in, real NCCL collectives, or auto (NCCL when launched "
                        "with 2+ ranks, else the stand-in)")
    p.add_argument("--collective", default="all_reduce", type=validate.argument(
                       validate.one_of, "--collective", allowed=COLLECTIVES),
                   help=f"one of {', '.join(STEPS)} (NCCL also send_recv: on one rank the only operation NCCL "
                        "runs as a kernel) (default %(default)s)")
    sizing = p.add_mutually_exclusive_group()
    sizing.add_argument("--comm-ratios", metavar="R,...", default="0.25,1,4",
                        type=cli.distinct(validate.number, "--comm-ratios", least=1e-3, most=1e3),
                        help="size the collective so T_comm = ratio x T_comp, ratios from 0.001 to 1000 (default "
                             "%(default)s)")
    sizing.add_argument("--bytes", metavar="SIZE,...", type=cli.distinct(message_bytes, "--bytes"),
                        help="message sizes instead of ratios, whole MiB, e.g. 16M,256MiB,1G")
    p.add_argument("--policies", metavar="POLICY,...", default=list(planner.POLICIES),
                   type=cli.distinct(validate.one_of, "--policies", allowed=planner.POLICIES),
                   help=f"policies to run among {', '.join(planner.POLICIES)} (default: all)")
    p.add_argument("--local-ranks", metavar="N", default=None,
                   type=validate.argument(validate.integer, "--local-ranks", least=1, most=64),
                   help="--comm nccl in one process: how many ranks it holds, each on this GPU (or on the GPUs "
                        "SHIMRT_DEVICES lists); 2 or more run NCCL's real ring, beside rank 0's compute (default: 2 "
                        "where NCCL can put two ranks on one GPU, 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1; else 1, "
                        "which only send_recv makes NCCL launch a kernel for)")
    p.add_argument("--auto-ctas", metavar="N,...", default="8,16,32",
                   type=cli.distinct(validate.integer, "--auto-ctas", least=1, most=64),
                   help="--comm nccl in one process: the channel counts (ncclConfig minCTAs = maxCTAs, one "
                        "communicator each, made once) auto tries besides NCCL's own choice and, where NCCL has "
                        "it, its 'efficiency' CTA policy (default %(default)s)")
    p.add_argument("--stand-in-too", action="store_true",
                   help="--comm nccl: also run each workload with the stand-in playing the same collective (same "
                        "bytes, ring size, blocks on this GPU and threads as NCCL's kernel), to set the two side by "
                        "side")
    p.add_argument("--ranks", metavar="N", type=validate.argument(_stand_in("ranks"), "--ranks"), default=8,
                   help="ring size the stand-in plays, at least 2 (default 8)")
    p.add_argument("--comm-blocks", metavar="N", type=validate.argument(_stand_in("blocks"), "--comm-blocks"),
                   default=16, help="stand-in blocks (NCCL channels), at least 1; all must fit on the GPU at once "
                                    "(default 16)")
    p.add_argument("--comm-threads", metavar="N", type=validate.argument(_stand_in("threads"), "--comm-threads"),
                   default=512, help="stand-in threads per block, a multiple of 32 from 32 to 640 (default 512)")
    p.add_argument("--link-gbps", metavar="GBPS", default=25.0,
                   type=validate.argument(link_gbps, "--link-gbps"),
                   help="stand-in bandwidth per channel in GB/s, as NVLink sets NCCL's (16 x 25 = 400 GB/s, about "
                        "an H200 node's all-reduce bus bandwidth); 0: unpaced, as fast as local memory allows "
                        "(default 25)")
    p.add_argument("--auto-threads", metavar="N,...", default="256,128",
                   type=cli.distinct(_stand_in("threads"), "--auto-threads"),
                   help="lower thread counts auto may give the collective; those not below --comm-threads are "
                        "left out (default %(default)s)")
    p.add_argument("--auto-blocks", metavar="N,...", default="8",
                   type=cli.distinct(_stand_in("blocks"), "--auto-blocks"),
                   help="lower block (CTA) counts auto may give the collective; those not below --comm-blocks are "
                        "left out (default %(default)s)")
    p.add_argument("--repeats", metavar="N", type=cli.count("--repeats", 1),
                   default=5, help="runs per policy, at least 1; medians are reported (default 5)")
    p.add_argument("--fresh", action="store_true", help="ignore auto's cached choices")
    cli.add_json(p, "write the results as JSON")
    p.add_argument("--plots", metavar="DIR", type=validate.argument(cli.writable_folder, "--plots"),
                   help="write PNG plots there (needs matplotlib); made if missing")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=run, check=check)


def check(args: argparse.Namespace) -> None:
    """What depends on more than one option or on the launch, refused before any device is opened."""
    if args.comm == "stand-in":  # options only a real NCCL reads would be taken and ignored
        for given, flag in ((args.local_ranks is not None, "--local-ranks"), (args.stand_in_too, "--stand-in-too")):
            if given:
                raise UsageError(f"{flag} is for --comm nccl (or auto with NCCL), not with --comm stand-in")
    if _comm_kind(args.comm, launch_env()) == "stand-in" and args.collective not in STEPS:
        raise UsageError(f"--collective must be one of {', '.join(STEPS)} with the stand-in (send_recv needs "
                         f"--comm nccl or 2+ ranks under python -m shimrt.launch), not {args.collective!r}")
    if args.plots is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plots needs matplotlib: pip install 'shimrt[plot]' (or leave --plots out and plot the "
                         "--json results elsewhere with python -m shimrt.bench plot)")


def _row(workload: str, result, comm_kind: str, nbytes: int) -> dict:
    return {"workload": workload, "policy": result.policy, "choice": result.choice.as_dict(),
            "describe": result.choice.describe() + (f", {result.detail}" if result.detail else ""),
            "bytes": nbytes, "comm": comm_kind,
            "metrics": result.metrics.as_dict(), "timeline": result.timeline(), "timeline_blocks": result.blocks(),
            "identical": result.note != "differs"}


def measure_workload(dev: Device, engine: Engine, policies: Any, args: Any, progress: Progress,
                     retune: Retune | None = None) -> tuple[list[Result], list[tuple[str, str]], dict,
                                                            planner.Estimate]:
    """Every policy on one workload: (results, infeasible [(policy, why)], auto's details, the
    occupancy model's estimate for the collective as given). ``retune(ctas)``, where given, is
    an Engine of the same schedule whose NCCL collective has ``ctas`` channels (auto tries it)."""
    compute = engine.schedule.of("compute")[0].compute
    nccl = engine.comm_kind == "nccl"
    progress.step(f"{engine.schedule.label}: alone")
    alone = engine.alone()
    problem = engine.problem()  # after a run: NCCL's kernel as CUPTI saw it, every rank's blocks
    model = planner.estimate(problem, *alone)
    progress.step(f"{engine.schedule.label}: sequential")
    seq = engine.measure(planner.Choice("sequential"))
    reference = compute.result()
    results: list[Result] = [seq] if "sequential" in policies else []
    infeasible: list[tuple[str, str]] = []
    auto: dict = {}
    for policy in policies:
        if policy == "sequential":
            continue
        progress.step(f"{engine.schedule.label}: {policy}")
        if policy == "partition" and nccl:
            infeasible.append((policy, "not with NCCL yet: its kernels would have to launch into a green context's "
                                       "stream, which has not been tried"))
            continue
        if policy == "auto" and nccl:
            result, auto = auto_nccl(engine, seq, args, retune)
            if result is None:
                infeasible.append((policy, "; ".join(auto["rejected"]) or "no choice could run"))
                continue
            results.append(result)
            if not np.array_equal(compute.result(), reference, equal_nan=True):
                result.note = "differs"
            continue
        if policy == "auto":
            cache = None if args.fresh else ChoiceCache(settings().cache_dir, f"{dev.name}|{dev.target.arch}")
            # None is the collective's own setting. Auto may only lower its threads and blocks, to
            # make room beside compute: more of them would make the collective itself faster and
            # measure a different collective than the one T_comm was taken for.
            threads = [None] + [t for t in args.auto_threads if t < args.comm_threads]
            blocks = [None] + [b for b in args.auto_blocks if b < args.comm_blocks]
            choice, times, rejected = search(engine, cache, threads=threads, blocks=blocks)
            auto = {"choice": choice.describe(), "cached": not times,
                    "measured": {c.describe(): round(t, 4) for c, t in sorted(times.items(), key=lambda x: x[1])},
                    "rejected": [f"{r.what}: {r.why}" for r in rejected]}
        else:
            try:
                choice = planner.plan(policy, problem)
            except ShimrtError as exc:
                infeasible.append((policy, str(exc)))
                continue
        try:
            result = engine.measure(choice, t_seq=seq.makespan)
        except ShimrtError as exc:
            infeasible.append((policy, str(exc)))
            continue
        result.policy = policy
        # Overlap must not change results: the compute output is the sequential run's, bit for bit.
        if not np.array_equal(compute.result(), reference, equal_nan=True):
            result.note = "differs"
        results.append(result)
    return results, infeasible, auto, model


def table(label: str, comm_kind: str, nbytes: int, results: Any, infeasible: Any, model: Any) -> str:
    head = (f"{'policy':17s} {'choice':44s} {'makespan':>9s} {'E':>6s} {'R':>6s} {'slowdown':>8s} "
            f"{'comm start':>10s} {'vs seq':>7s}")
    m0 = results[0].metrics if results else None
    times = f": T_comp {m0.t_comp_ms:.3f} ms, T_comm {m0.t_comm_ms:.3f} ms, T_seq {m0.t_seq_ms:.3f} ms" if m0 else ""
    lines = [f"== {label} ({comm_kind}, {nbytes / (1 << 20):.0f} MiB){times}", head]
    for r in results:
        m = r.metrics
        what = r.choice.describe() + (f", {r.detail}" if r.detail else "")
        lines.append(f"{r.policy:17s} {what[:44]:44s} {m.makespan_ms:8.3f}ms {m.efficiency:6.2f} "
                     f"{m.ratio:6.3f} {m.compute_slowdown:8.3f} {m.comm_start_delay_ms:8.3f}ms {-m.reduction:+7.1%}"
                     + ("  RESULT DIFFERS" if r.note == "differs" else ""))
    for policy, why in infeasible:
        lines.append(f"{policy:17s} cannot run: {why}")
    lines.append(f"occupancy model: R {model.ratio:.3f}, {model.makespan_ms:.3f} ms at best ({model.why})")
    return "\n".join(lines)


def summary(label: str, results: Any, model: Any) -> dict:
    """Auto against the best fixed policy, the reduction against sequential, and the occupancy
    model's estimate of R (:func:`shimrt.overlap.planner.estimate`)."""
    by = {r.policy: r for r in results}
    fixed = [r for r in results if r.policy != "auto"]
    best = min(fixed, key=lambda r: r.makespan) if fixed else None
    out = {"workload": label, "best_fixed": best.policy if best else None,
           "best_fixed_ms": best.makespan if best else None, "model_ratio": model.ratio,
           "model_ms": model.makespan_ms, "model_why": model.why}
    if "auto" in by and best is not None:
        a = by["auto"].metrics
        out.update(auto_ms=a.makespan_ms, auto_vs_best=a.makespan_ms / best.makespan, auto_ratio=a.ratio,
                   auto_reduction=a.reduction, balance=a.t_comm_ms / a.t_comp_ms)
    if "shaping+priority" in by:
        out["seed_efficiency"] = by["shaping+priority"].metrics.efficiency
        out["seed_reduction"] = by["shaping+priority"].metrics.reduction
    return out


def _summary_line(s: dict) -> str:
    if s["best_fixed"] is None:  # only auto was asked for, or every fixed policy was infeasible
        line = f"  {s['workload']:44s} no fixed policy ran"
    else:
        line = f"  {s['workload']:44s} best fixed {s['best_fixed']} {s['best_fixed_ms']:.3f} ms"
    if "auto_ms" in s:
        line += (f"; auto {s['auto_ms']:.3f} ms = {s['auto_vs_best']:.3f}x best, R {s['auto_ratio']:.3f}, "
                 f"{s['auto_reduction']:.1%} less than sequential (T_comm/T_comp {s['balance']:.2f}; "
                 f"occupancy model R {s['model_ratio']:.3f})")
    if "seed_efficiency" in s:
        line += f"; shaping+priority E {s['seed_efficiency']:.2f}"
    return line


def run(args: argparse.Namespace) -> int:
    """``bench overlap``: the matrix, its tables and summary, --json and --plots."""
    policies, computes = args.policies, args.compute
    ratios, sizes = ([], args.bytes) if args.bytes else (args.comm_ratios, [])
    env = launch_env()
    dev = Device(env.device)  # the local rank's GPU, or the first of SHIMRT_DEVICES
    communication = Communication(dev, args)
    comm_kind, root = communication.kind, communication.root
    workloads = [(c, r, s) for c in computes for r, s in ([(r, None) for r in ratios] + [(None, s) for s in sizes])]
    steps = len(workloads) * (len(policies) + 1) * (2 if args.stand_in_too and comm_kind == "nccl" else 1)
    progress = Progress(steps, enabled=root and not args.quiet)
    # The JSON's lists and auto's details, filled as the workloads run.
    run_rows: list[dict] = []
    infeasible_rows: list[dict] = []
    summaries: list[dict] = []
    autos: dict[str, dict] = {}
    out: dict[str, object] = {
        "schema": SCHEMA, "device": {"name": dev.name, "arch": dev.target.arch, "num_sms": dev.target.num_sms,
                                     "backend": dev.backend},
        "comm": comm_kind, "communication": communication.describe(),
        "link_gbps": (args.link_gbps or None) if comm_kind == "stand-in" else None,
        "runs": run_rows, "infeasible": infeasible_rows, "summary": summaries, "auto": autos}
    if root:
        print(f"shimrt overlap on {dev.name} ({dev.target.arch}, {dev.target.num_sms} SMs): communication = "
              f"{communication.describe()}; {args.repeats} repeats, medians; device timestamps")
    tables = []
    try:
        for spec, ratio, nbytes in workloads:
            compute = ComputeWorkload(dev, spec)
            comm = communication.sized(compute, ratio) if ratio is not None else communication.make(nbytes)
            engine = Engine(dev, Schedule.pair(compute, comm), repeats=args.repeats)
            label = engine.schedule.label
            made: list[CommStandIn | NcclCollective] = []

            def engine_with(ctas, compute=compute, nbytes=comm.nbytes, made=made):
                other = communication.make(nbytes, ctas=ctas)
                made.append(other)
                return Engine(dev, Schedule.pair(compute, other), repeats=args.repeats)
            retune = Retune(engine_with, communication.channel_settings()) if communication.retunable else None
            try:
                results, infeasible, auto, model = measure_workload(dev, engine, policies, args, progress, retune)
            finally:
                engine.close()
                for c in [comm, *made]:
                    communication.release(c)
            tables.append(table(label, comm_kind, comm.nbytes, results, infeasible, model))
            run_rows += [_row(label, r, comm_kind, comm.nbytes) for r in results]
            infeasible_rows += [{"workload": label, "policy": p, "why": w} for p, w in infeasible]
            summaries.append(summary(label, results, model))
            autos[label] = auto
            if args.stand_in_too and isinstance(comm, NcclCollective):  # comm_kind "nccl"
                twin = communication.stand_in_like(comm)
                engine = Engine(dev, Schedule.pair(compute, twin), repeats=args.repeats)
                try:
                    results, infeasible, auto, model = measure_workload(dev, engine, policies, args, progress)
                finally:
                    engine.close()
                label = engine.schedule.label + " (stand-in beside NCCL)"
                tables.append(table(label, "stand-in", twin.nbytes, results, infeasible, model))
                run_rows += [_row(label, r, "stand-in", twin.nbytes) for r in results]
                summaries.append(summary(label, results, model))
                autos[label] = auto
    finally:
        progress.close()
        communication.close()
    if not root:  # rank 0 reports for all
        return 0
    print("\n\n".join(tables))
    print("\nsummary (auto vs the best fixed policy; reduction = time saved against sequential):")
    for s in summaries:
        print(_summary_line(s))
    cli.finish("", out, args.json, indent=1, say=True)
    if args.plots:
        from .plots import write_all
        try:
            for path in write_all(out, args.plots):
                print(f"wrote {path}")
        except ShimrtError as exc:  # matplotlib missing: the JSON can be plotted elsewhere
            print(f"no plots: {exc}", file=sys.stderr)
    return 0
