"""NCCL collectives through shimrt, nccl-tests style: size, count, type, redop, root, then time,
algbw and busbw out-of-place and in-place, for each collective; JSON too.

Runs one rank per local GPU in this process (Communicator.local), or one rank per process under
python -m shimrt.launch / torchrun / MPI. busbw = algbw x nccl-tests' factor: AllReduce
2(n-1)/n; ReduceScatter and AllGather (n-1)/n, with the size counted as the gathered size;
Broadcast and Reduce 1. Times are device-event medians.
"""

from __future__ import annotations

import json
import statistics
import sys

import numpy as np

from ..config import launch_env
from ..device import Device
from ..nccl import buffer_counts

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")


def add_arguments(p) -> None:
    p.add_argument("--min-bytes", type=int, default=8, help="smallest size (default 8)")
    p.add_argument("--max-bytes", type=int, default=256 << 20, help="largest size (default 256 MiB)")
    p.add_argument("--factor", type=int, default=4, help="size step factor (default 4)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("--ops", default=",".join(COLLECTIVES), help="comma-separated collectives")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.set_defaults(run=run)


def bus_factor(op: str, n: int) -> float:
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


def measure(comms, ops, sizes, iters=20, warmup=5, progress=True) -> list[dict]:
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


def report(rows) -> str:
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


def run(args) -> int:
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in COLLECTIVES]
    if bad:
        print(f"unknown collective(s): {', '.join(bad)}; choose from {', '.join(COLLECTIVES)}", file=sys.stderr)
        return 2
    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    comms = _communicators()
    try:
        rows = measure(comms, ops, sizes, args.iters, args.warmup)
    finally:
        for c in comms:
            c.close()
    if comms[0].rank == 0:
        print(report(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": comms[0].size, "rows": rows}, f, indent=2)
    return 0
