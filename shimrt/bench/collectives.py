"""Time NCCL collectives through shimrt over a range of message sizes, as nccl-tests does.

For each collective and size: size, count, type, redop, root, then time, algbw and busbw
out-of-place and in-place, as nccl-tests prints them; JSON too (--json). The options follow
nccl-tests: -b/--minbytes and -e/--maxbytes take sizes with K, M or G suffixes (powers of 1024),
-f/--stepfactor multiplies, -n/--iters and -w/--warmup_iters count iterations per size, e.g.
-b 8 -e 256M -f 2.

Runs one rank per local GPU in this process (Communicator.local), or one rank per process under
python -m shimrt.launch / torchrun / MPI. busbw = algbw x nccl-tests' factor: AllReduce
2(n-1)/n; ReduceScatter and AllGather (n-1)/n, with the size counted as the gathered size;
Broadcast and Reduce 1. Times are device-event medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np

from .. import cli, validate
from ..config import launch_env
from ..device import Device
from ..errors import UsageError
from ..nccl import buffer_counts

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
                   type=validate.argument(validate.integer, "-f/--factor", least=2),
                   help="each size is the previous one times N, N >= 2 (default 4)")
    p.add_argument("-n", "--iters", dest="iters", metavar="N", default=20,
                   type=validate.argument(validate.integer, "-n/--iters", least=1),
                   help="timed iterations per size, at least 1 (default 20)")
    p.add_argument("-w", "--warmup", "--warmup_iters", dest="warmup", metavar="N", default=5,
                   type=validate.argument(validate.integer, "-w/--warmup", least=0),
                   help="untimed iterations per size first, at least 0 (default 5)")
    p.add_argument("--ops", metavar="OP[,OP...]", default=list(COLLECTIVES),
                   type=cli.distinct(validate.one_of, "--ops", allowed=COLLECTIVES),
                   help=f"comma-separated collectives among {', '.join(COLLECTIVES)} (default: all)")
    cli.add_json(p)
    p.set_defaults(run=run, check=check)


def check(args: argparse.Namespace) -> None:
    """Relations between options, refused before any device is opened."""
    sizes(args.min_bytes, args.max_bytes, args.factor)


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


def _communicators():
    from ..launch import init
    from ..nccl import Communicator
    if launch_env().source is not None:
        return [init()]
    probe = Device()
    return Communicator.local([probe] + [Device(i, backend=probe.backend) for i in range(1, probe.device_count())])


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


def report(rows: list[dict]) -> str:
    """nccl-tests' table of ``rows`` (from :func:`measure`)."""
    lines = [f"# {rows[0]['ranks'] if rows else 0} rank(s); times in us, bandwidths in GB/s",
             f"{'op':>14s} {'size':>12s} {'count':>10s} {'type':>8s} {'redop':>6s} {'root':>5s} "
             f"{'time':>9s} {'algbw':>7s} {'busbw':>7s}   {'time':>9s} {'algbw':>7s} {'busbw':>7s}",
             f"{'':>68s}out-of-place{'':>21s}in-place"]
    for r in rows:
        o, i = r["out"], r["in"]
        lines.append(f"{r['op']:>14s} {r['bytes']:12d} {r['count']:10d} {r['type']:>8s} {r['redop']:>6s} "
                     f"{r['root']:5d} {o['time_us']:9.1f} {o['algbw']:7.2f} {o['busbw']:7.2f}   "
                     f"{i['time_us']:9.1f} {i['algbw']:7.2f} {i['busbw']:7.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``bench collectives``: measure, print nccl-tests' table, write --json."""
    steps = sizes(args.min_bytes, args.max_bytes, args.factor)
    comms = _communicators()
    try:
        rows = measure(comms, args.ops, steps, args.iters, args.warmup)
    finally:
        for c in comms:
            c.close()
    if comms[0].rank == 0:
        print(report(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": comms[0].size, "rows": rows}, f, indent=2)
    return 0
