"""Per-launch overhead of Kernel.launch beside cuda.bindings (pre-packed and per-launch packing)
and CuPy RawKernel, all launching the same CUBIN of an empty kernel on one stream.

Rounds interleave the methods so that drift of the machine hits all of them alike; the figure
per method is the median over rounds of (wall time of N launches + one synchronize) / N.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
import tempfile
import time

from .. import kernels
from ..device import Device


def add_arguments(p) -> None:
    p.add_argument("--launches", type=int, default=20000, help="launches per round (default 20000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds, methods interleaved (default 7)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.set_defaults(run=run)


def _methods(dev: Device, stream, n: int):
    """name -> function that performs n launches of the empty kernel (without synchronizing)."""
    program = dev.compile(kernels.source("vector_ops"), name="vector_ops.cu")
    kernel = dev.load(program)["empty"]
    arg = dev.alloc(4)
    methods = {}

    def shimrt_launch():
        launch = kernel.launch
        for _ in range(n):
            launch(1, 32, arg, stream=stream)
    methods["shimrt Kernel.launch"] = shimrt_launch

    from cuda.bindings import driver
    fn, handle = kernel._fn, stream._handle
    value = ctypes.c_uint64(arg.ptr)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(value))
    address = ctypes.addressof(params)

    def bindings_prepacked():
        launch = driver.cuLaunchKernel
        for _ in range(n):
            launch(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, 0)
    methods["cuda.bindings pre-packed"] = bindings_prepacked

    def bindings_packing():
        launch = driver.cuLaunchKernel
        for _ in range(n):
            launch(fn, 1, 1, 1, 32, 1, 1, 0, handle, ((arg.ptr,), (ctypes.c_void_p,)), 0)
    methods["cuda.bindings packing each launch"] = bindings_packing

    try:
        import cupy
    except ImportError:
        print("CuPy is not installed: its column is left out", file=sys.stderr)
    else:
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(program.binary)
        raw = cupy.RawModule(path=f.name).get_function("empty")
        os.unlink(f.name)
        cstream = cupy.cuda.ExternalStream(stream.handle)
        carr = cupy.empty(1, dtype=cupy.float32)

        def cupy_rawkernel():
            with cstream:
                for _ in range(n):
                    raw((1,), (32,), (carr,))
        methods["CuPy RawKernel"] = cupy_rawkernel
    return methods, (kernel, arg)


def measure(launches: int = 20000, rounds: int = 7, device: Device | None = None, progress=True) -> dict:
    dev = device or Device()
    stream = dev.stream()
    methods, keep = _methods(dev, stream, launches)
    times = {name: [] for name in methods}
    for fn in methods.values():  # warm up: module loads, first-launch costs
        fn()
    stream.synchronize()
    for r in range(rounds):
        for name, fn in methods.items():
            stream.synchronize()
            t0 = time.perf_counter()
            fn()
            stream.synchronize()
            times[name].append((time.perf_counter() - t0) / launches * 1e6)
        if progress:
            print(f"\rround {r + 1}/{rounds}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    base = statistics.median(times["cuda.bindings pre-packed"])
    result = {"device": dev.name, "launches": launches, "rounds": rounds, "methods": {}}
    for name, ts in times.items():
        med = statistics.median(ts)
        result["methods"][name] = {"us_per_launch": med, "ratio_to_prepacked": med / base, "rounds_us": ts}
    return result


def report(result: dict) -> str:
    lines = [f"launch overhead on {result['device']}: {result['launches']} launches x {result['rounds']} rounds, "
             "median us/launch", f"{'method':36s} {'us/launch':>10s} {'vs pre-packed':>14s}"]
    for name, m in result["methods"].items():
        lines.append(f"{name:36s} {m['us_per_launch']:10.2f} {m['ratio_to_prepacked']:13.3f}x")
    return "\n".join(lines)


def run(args) -> int:
    result = measure(args.launches, args.rounds)
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
