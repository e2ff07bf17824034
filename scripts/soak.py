"""Soak: many shaped launches and collectives in one process, with the resources they use read
before and after, to show that nothing leaks (device memory, streams, events, buffers, modules,
communicators, file descriptors, threads, host memory).

    PYTHONPATH=. python3 scripts/soak.py [--iterations 10000] [--json soak.json]

Each iteration: a fresh stream and event, a fresh device buffer, a launch of a kernel shaped to
leave room for NCCL's footprint (padding confirmed with the driver), an all_reduce on a
single-rank communicator's greatest-priority stream waited for with a bound, the output checked
now and then against numpy; every 1000 iterations a new communicator and a reloaded module.
Resources are read after a warm-up (first-use allocations by the driver and NCCL are not leaks)
and at the end; the table shows both and the difference.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time

import numpy as np

import shimrt
from shimrt import kernels, validate
from shimrt.nccl import Communicator, unique_id
from shimrt.occupancy import NCCL_2_28_SM90

TRACKED = (shimrt.Stream, shimrt.Event, shimrt.Buffer, shimrt.Module, Communicator)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def resources(dev: shimrt.Device) -> dict:
    """What a leak would grow: device memory in use, live shimrt objects by class, open file
    descriptors, threads and the process's resident host memory."""
    gc.collect()
    free, total = dev.mem_info()
    live = {cls.__name__: 0 for cls in TRACKED}
    for obj in gc.get_objects():
        for cls in TRACKED:
            if type(obj) is cls and not getattr(obj, "closed", False) and getattr(obj, "device_pointer", 1) is not None:
                live[cls.__name__] += 1
    rss = _rss_bytes()
    return {"device_used_MiB": (total - free) / 2**20, **{f"live {k}": v for k, v in live.items()},
            "open fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count(),
            "host RSS MiB": rss / 2**20}


def soak(dev: shimrt.Device, iterations: int, progress: bool = True) -> dict:
    n = 1 << 16
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    module = dev.load(dev.compile(kernels.source("vector_ops"), name="vector_ops.cu"))
    comm = Communicator(dev, unique_id(backend=dev.backend), 0, 1)
    before = None
    shaped = checked = collectives = 0
    # Host memory taken while renewing the communicator and the module, apart from the loop's own.
    renewals = {"communicator": 0, "module": 0}
    t0 = time.monotonic()
    warmup = min(100, iterations // 10)
    for i in range(iterations + warmup):
        if i == warmup:
            before = resources(dev)
        if i and i % 1000 == 0:  # a new communicator and module now and then: their teardown leaks too
            r0 = _rss_bytes()
            comm.close()
            comm = Communicator(dev, unique_id(backend=dev.backend), 0, 1)
            r1 = _rss_bytes()
            module.close()
            module = dev.load(dev.compile(kernels.source("vector_ops"), name="vector_ops.cu"))
            if before is not None:
                renewals["communicator"] += r1 - r0
                renewals["module"] += _rss_bytes() - r1
        saxpy = module["saxpy"]
        shaping = saxpy.shape(256, reserve=NCCL_2_28_SM90.with_threads(512))
        with dev.stream("low") as s, dev.event() as done:
            dx = dev.to_device(x, stream=s)
            dy = dev.empty(n, np.float32).memset(0, stream=s)
            saxpy.launch(2 * dev.target.num_sms, 256, dy, dx, 2.0, n, stream=s, dynamic_smem=shaping.dynamic_smem)
            s.record(done)
            comm.stream.wait(done)
            out = dev.empty(n, np.float32)
            comm.all_reduce(dy, out)
            comm.wait(timeout=30)
            shaped += 1
            collectives += 1
            if i % 500 == 0:
                np.testing.assert_array_equal(out.numpy(), 2.0 * x)
                checked += 1
            for b in (dx, dy, out):
                b.free()
        if progress and i % 500 == 0:
            print(f"\rsoak {i}/{iterations + warmup}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    after = resources(dev)  # with the same communicator, module and streams alive as before
    comm.close()
    module.close()
    return {"device": dev.name, "iterations": iterations, "warmup": warmup, "shaped launches": shaped,
            "collectives": collectives, "outputs checked": checked, "seconds": time.monotonic() - t0,
            "before": before, "after": after, "renewals": iterations // 1000,
            "host RSS MiB by renewal": {k: v / 2**20 for k, v in renewals.items()}}


def report(result: dict) -> str:
    lines = [f"soak on {result['device']}: {result['shaped launches']} shaped launches and {result['collectives']} "
             f"all_reduces ({result['warmup']} of each as warm-up), {result['outputs checked']} outputs checked "
             f"against numpy, {result['seconds']:.1f} s",
             f"{'resource':24s} {'after warm-up':>14s} {'at the end':>12s} {'change':>10s}"]
    for key, b in result["before"].items():
        a = result["after"][key]
        lines.append(f"{key:24s} {b:14.1f} {a:12.1f} {a - b:+10.1f}")
    by = result["host RSS MiB by renewal"]
    grown = result["after"]["host RSS MiB"] - result["before"]["host RSS MiB"]
    lines.append(f"host RSS change by cause: {by['communicator']:+.1f} MiB over {result['renewals']} new "
                 f"communicators (NCCL init and destroy), {by['module']:+.1f} MiB over as many reloaded modules, "
                 f"{grown - sum(by.values()):+.1f} MiB in the launches and collectives themselves")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=validate.argument(validate.integer, "--iterations", least=1),
                        default=10_000, help="shaped launches and collectives (default 10000)")
    parser.add_argument("--json", type=validate.argument(validate.writable_file, "--json"),
                        help="also write the figures as JSON")
    args = parser.parse_args(argv)
    try:
        result = soak(shimrt.Device(), args.iterations)
    except shimrt.ShimrtError as exc:
        print(f"soak: {exc}", file=sys.stderr)
        return 2
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
