"""Time NCCL collectives through shimrt over a range of message sizes, as nccl-tests does.

For each collective and size: size, count, type, redop, root, then time, algbw and busbw
out-of-place and in-place, as nccl-tests prints them; JSON too (--json). The options follow
nccl-tests: -b/--minbytes and -e/--maxbytes take sizes with K, M or G suffixes (powers of 1024),
-f/--stepfactor multiplies, -n/--iters and -w/--warmup_iters count iterations per size, e.g.
-b 8 -e 256M -f 2.

Runs one rank per local GPU in this process (Communicator.local; on a machine of one GPU, two ranks
on it where NCCL 2.30+ allows it with NCCL_MULTI_RANK_GPU_ENABLE=1; --local-ranks or
SHIMRT_DEVICES to choose), or one rank per process under python -m shimrt.launch / torchrun / MPI.
Communicators are blocking (NCCL's fastest calls, bounded by shimrt's watchdog); --nonblocking
makes non-blocking ones. --torch also times torch.distributed on the same NCCL library (torch takes
the libnccl.so.2 shimrt loaded first; two different versions are refused unless --mixed-nccl) with
one rank per process, alone or under the launcher: its device times beside the table, and the
latency of back-to-back in-place all_reduces, shimrt's one-off and prepared calls against
torch's (:mod:`shimrt.bench.latency`). busbw = algbw x nccl-tests' factor: AllReduce
2(n-1)/n; ReduceScatter and AllGather (n-1)/n, with the size counted as the gathered size;
Broadcast and Reduce 1. Times are device-event medians.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from typing import Any

import numpy as np

from .. import cli, validate
from ..config import launch_env
from ..device import Device
from ..errors import UsageError
from ..nccl import buffer_counts, group

__all__ = ["add_arguments", "run"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
MAX_BYTES = 1 << 40  # 1 TiB: more than any GPU holds, and the sizes stay within what drivers take


def byte_count(value: Any, what: str = "size") -> int:
    """A message size from 1 byte to 1T: an int, or a string with a K/M/G/T suffix."""
    return cli.nbytes(value, what, least=1, most=MAX_BYTES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench collectives``: nccl-tests' short flags beside the long names."""
    p.add_argument("-b", "--min-bytes", "--minbytes", dest="min_bytes", metavar="BYTES", default="8",
                   type=validate.argument(byte_count, "-b/--min-bytes"),
                   help="smallest size, 1 to 1T, e.g. 8, 64K, 1M (default 8)")
    p.add_argument("-e", "--max-bytes", "--maxbytes", dest="max_bytes", metavar="BYTES", default="256M",
                   type=validate.argument(byte_count, "-e/--max-bytes"),
                   help="largest size, from the smallest to 1T (default 256M)")
    p.add_argument("-f", "--factor", "--stepfactor", dest="factor", metavar="N", default=4,
                   type=cli.count("-f/--factor", 2),
                   help="each size is the previous one times N, N >= 2 (default 4)")
    p.add_argument("-n", "--iters", dest="iters", metavar="N", default=20,
                   type=cli.count("-n/--iters", 1),
                   help="timed iterations per size, at least 1 (default 20)")
    p.add_argument("-w", "--warmup", "--warmup_iters", dest="warmup", metavar="N", default=5,
                   type=cli.count("-w/--warmup", 0),
                   help="untimed iterations per size first, at least 0 (default 5)")
    p.add_argument("--ops", metavar="OP[,OP...]", default=list(COLLECTIVES),
                   type=cli.distinct(validate.one_of, "--ops", allowed=COLLECTIVES),
                   help=f"comma-separated collectives among {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--local-ranks", metavar="N", default=None,
                   type=validate.argument(validate.integer, "--local-ranks", least=1, most=64),
                   help="ranks this process holds when not launched (default: one per GPU; on one GPU, 2 where "
                        "NCCL can put two ranks on it, else 1)")
    p.add_argument("--nonblocking", action="store_true",
                   help="non-blocking communicators (each NCCL call then starts a host thread); default blocking")
    p.add_argument("--torch", action="store_true",
                   help="also time torch.distributed, one rank per process, on the same NCCL, and the latency of "
                        "back-to-back all_reduces (shimrt one-off and prepared against torch)")
    p.add_argument("--latency-calls", metavar="N", default=None,
                   type=cli.count("--latency-calls", 1),
                   help="back-to-back calls per latency measurement with --torch, at least 1 (default 200)")
    p.add_argument("--mixed-nccl", action="store_true",
                   help="with --torch, time torch.distributed even when it uses another NCCL than shimrt's")
    cli.add_json(p)
    p.set_defaults(run=run, check=check)


def check(args: argparse.Namespace) -> None:
    """Relations between options, refused before any device is opened."""
    sizes(args.min_bytes, args.max_bytes, args.factor)
    if args.torch and importlib.util.find_spec("torch") is None:
        raise UsageError("--torch needs torch (pip install 'shimrt[torch]')")
    for option, given in (("--latency-calls", args.latency_calls is not None), ("--mixed-nccl", args.mixed_nccl)):
        if given and not args.torch:
            raise UsageError(f"{option} applies with --torch only (it sets how torch.distributed is timed): add "
                             f"--torch or leave {option} out")
    if args.latency_calls is None:
        args.latency_calls = 200


def sizes(min_bytes: Any, max_bytes: Any, factor: int = 2) -> list[int]:
    """The message sizes, nccl-tests style: ``min_bytes``, times ``factor``, up to ``max_bytes``
    (byte counts as ints or strings with K/M/G suffixes: ``sizes(8, "256M", 2)``)."""
    low, high = byte_count(min_bytes, "-b/--min-bytes"), byte_count(max_bytes, "-e/--max-bytes")
    factor = validate.integer(factor, "-f/--factor", least=2)
    if high < low:
        raise UsageError(f"-e/--max-bytes must be at least -b/--min-bytes ({low}), not {high}")
    out, size = [], low
    while size <= high:  # factor >= 2: at most 41 sizes from 1 to 1T
        out.append(size)
        size *= factor
    return out


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw / algbw for ``op`` on ``n`` ranks."""
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}.get(op, 1.0)


def _communicators(local_ranks: int | None = None, blocking: bool = True):
    from ..launch import init, local_devices
    from ..nccl import CommOptions, Communicator
    options = CommOptions(blocking=blocking)
    if launch_env().source is not None:
        return [init(options=options)]
    return Communicator.local(local_devices(Device(launch_env().device), local_ranks), options=options)


def _buffers(comm, op, nbytes):
    """(send, recv) float32 buffers for ``nbytes`` as nccl-tests counts it (the larger buffer)."""
    n = comm.size
    send, recv = buffer_counts(op, max(nbytes // 4 // n * n, n), n, given="largest")
    return comm.device.empty(send, np.float32).memset(0), comm.device.empty(recv, np.float32)


def measure(comms: list, ops: list[str], sizes: list[int], iters: int = 20, warmup: int = 5,
            progress: bool = True) -> list[dict]:
    """Time each of ``ops`` at each of ``sizes`` bytes on every communicator of ``comms`` (one
    per rank in this process): ``warmup`` untimed then ``iters`` timed iterations, medians."""
    for op in ops:
        validate.one_of(op, "op", COLLECTIVES)
    for nbytes in sizes:
        byte_count(nbytes)
    iters = validate.integer(iters, "iters", least=1)
    warmup = validate.integer(warmup, "warmup", least=0)
    rows = []
    total = len(ops) * len(sizes)
    step = 0
    for op in ops:
        for nbytes in sizes:
            step += 1
            if progress and comms[0].rank == 0:
                print(f"\r{op:15s} {nbytes:>12d} B  [{step}/{total}]", end="", file=sys.stderr, flush=True)
            row = {"op": op, "bytes": nbytes, "type": "float32", "redop": "sum" if "reduce" in op else "none",
                   "root": 0 if op in ("broadcast", "reduce") else -1, "ranks": comms[0].size}
            bufs = [_buffers(c, op, nbytes) for c in comms]
            row["count"] = max(bufs[0][0].size, bufs[0][1].size)
            for place in ("out", "in"):
                pairs = bufs if place == "out" else [_in_place(c, p) for c, p in zip(comms, bufs, strict=True)]
                times = []
                for i in range(warmup + iters):
                    starts = [c.stream.record() for c in comms]
                    with group(*comms):  # the ranks of this process, each on its own stream
                        for c, (s, r) in zip(comms, pairs, strict=True):
                            c.collective(op, s, r)  # reductions sum, broadcast and reduce from root 0
                    ends = [c.stream.record() for c in comms]
                    for c in comms:
                        c.wait()
                    if i >= warmup:
                        times.append(max(a.elapsed_ms(b) for a, b in zip(starts, ends, strict=True)) * 1e3)
                us = statistics.median(times)
                algbw = nbytes / us / 1e3  # GB/s
                row[place] = {"time_us": us, "algbw": algbw, "busbw": algbw * bus_factor(op, comms[0].size)}
            rows.append(row)
    if progress and comms[0].rank == 0:
        print(file=sys.stderr)
    return rows


def _in_place(comm, pair):
    """In-place layouts as nccl-tests uses them: one buffer, the rank's slice of it on the small side."""
    send, recv = pair
    k = min(send.size, recv.size)
    mine = slice(comm.rank * k, (comm.rank + 1) * k)
    if send.size < recv.size:  # all_gather: each rank's block is already in place
        return recv[mine], recv
    if recv.size < send.size:  # reduce_scatter: the rank's block of the send buffer
        return send, send[mine]
    return send, send


_TORCH_IN_PLACE = ("all_reduce", "broadcast", "reduce")  # torch's calls for these take one tensor


def report(rows: list[dict]) -> str:
    """nccl-tests' table of ``rows`` (from :func:`measure`)."""
    lines = [f"# {rows[0]['ranks'] if rows else 0} rank(s); times in us, bandwidths in GB/s",
             f"{'op':>14s} {'size':>12s} {'count':>10s} {'type':>8s} {'redop':>6s} {'root':>5s} "
             f"{'time':>9s} {'algbw':>7s} {'busbw':>7s}   {'time':>9s} {'algbw':>7s} {'busbw':>7s}",
             f"{'':>68s}out-of-place{'':>21s}in-place"]
    torch_too = any("torch_us" in r for r in rows)
    if torch_too:
        lines[1] += f"   {'torch':>9s} {'shimrt/torch':>12s}"
    for r in rows:
        o, i = r["out"], r["in"]
        line = (f"{r['op']:>14s} {r['bytes']:12d} {r['count']:10d} {r['type']:>8s} {r['redop']:>6s} "
                f"{r['root']:5d} {o['time_us']:9.1f} {o['algbw']:7.2f} {o['busbw']:7.2f}   "
                f"{i['time_us']:9.1f} {i['algbw']:7.2f} {i['busbw']:7.2f}")
        if "torch_us" in r:  # against shimrt in the same place (in place where torch's call is)
            ours = (i if r["op"] in _TORCH_IN_PLACE else o)["time_us"]
            line += f"   {r['torch_us']:9.1f} {ours / r['torch_us']:11.3f}x"
        lines.append(line)
    if torch_too:
        lines.append("torch: torch.distributed's time, in place for all_reduce, broadcast and reduce and out of "
                     "place for the others, against shimrt's in the same place")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``bench collectives``: measure, print nccl-tests' table (and with --torch torch's times
    and the latency table), write --json."""
    from ..nccl.link import link_of_process
    from . import latency
    steps = sizes(args.min_bytes, args.max_bytes, args.factor)
    comms = _communicators(args.local_ranks, blocking=not args.nonblocking)  # NCCL loaded before torch
    lead = comms[0]
    kind = "non-blocking" if args.nonblocking else "blocking"
    torch_nccl, lat = None, []
    try:
        rows = measure(comms, args.ops, steps, args.iters, args.warmup)
        if args.torch and len(comms) > 1:
            print(f"bench collectives: torch.distributed holds one rank per process and this one holds {len(comms)}: "
                  "timing shimrt alone (run under python -m shimrt.launch for torch beside it)", file=sys.stderr)
            lat = latency.local_latency(comms, steps, args.latency_calls)
        elif args.torch:
            torch_nccl = latency.check_same_nccl(lead.lib, args.mixed_nccl)
            with latency.torch_group(lead) as dist:
                times = latency.torch_device_times(lead, dist, args.ops, steps, args.iters, args.warmup)
                lat = latency.latency(lead, dist, steps, args.latency_calls)
            for r in rows:
                r["torch_us"] = times[f"{r['op']}:{r['bytes']}"]
    finally:
        for c in comms:
            c.close()
    if lead.rank == 0:
        where = f"{lead.size} ranks, {'one per process' if len(comms) == 1 else f'{len(comms)} in this process'}"
        link = link_of_process() or "native"  # python -m shimrt.launch --link
        print(f"# {kind} communicators, NCCL {lead.lib.version_text} ({lead.lib.path}), over the {link} link")
        print(report(rows))
        if torch_nccl is not None:
            print(f"torch.distributed used NCCL {torch_nccl}; shimrt {lead.lib.version_text}")
        if lat:
            print(latency.report(lat, where))
        cli.finish("", {"ranks": lead.size, "local_ranks": len(comms), "blocking": not args.nonblocking, "link": link,
                        "nccl": lead.lib.version_text, "nccl_path": lead.lib.path, "rows": rows,
                        "torch_nccl": torch_nccl, "latency": lat}, args.json)
    return 0
