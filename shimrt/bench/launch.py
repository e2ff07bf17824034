"""Per-launch overhead of Kernel.launch beside cuda.bindings (pre-packed and packing per launch)
and CuPy RawKernel, all launching the same CUBIN of an empty kernel on one stream.

Two figures per method, measured side by side with the methods interleaved:
- enqueue: host time to issue a batch of launches small enough never to fill the driver's
  launch queue (the stream is drained between batches, outside the timed region), per launch:
  the CPU cost a caller pays, which is what launch overhead means;
- throughput: wall time of many back-to-back launches plus one synchronize, per launch; once
  the queue is full this is bounded by how fast the GPU retires launches, not by the caller.
Medians over batches (enqueue) and rounds (throughput).
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import statistics
import sys
import tempfile
import time

from .. import kernels
from ..device import Device


def add_arguments(p) -> None:
    p.add_argument("--batch", type=int, default=200, help="launches per enqueue batch (default 200)")
    p.add_argument("--batches", type=int, default=200, help="enqueue batches per method (default 200)")
    p.add_argument("--launches", type=int, default=20000, help="launches per throughput round (default 20000)")
    p.add_argument("--rounds", type=int, default=5, help="throughput rounds (default 5)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.set_defaults(run=run)


def _methods(dev: Device, stream):
    """name -> function(n) that performs n launches of the empty kernel (without synchronizing)."""
    program = dev.compile(kernels.source("vector_ops"), name="vector_ops.cu")
    kernel = dev.load(program)["empty"]
    arg = dev.alloc(4)
    methods = {}

    def shimrt_launch(n):
        launch = kernel.launch
        for _ in range(n):
            launch(1, 32, arg, stream=stream)
    methods["shimrt Kernel.launch"] = shimrt_launch

    prepared = kernel.prepare(1, 32, arg, stream=stream)

    def shimrt_prepared(n):
        for _ in range(n):
            prepared()
    methods["shimrt Kernel.prepare, then call"] = shimrt_prepared

    from cuda.bindings import driver
    fn, handle = kernel.handle, stream.handle
    value = ctypes.c_uint64(arg.ptr)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(value))
    address = ctypes.addressof(params)

    def bindings_prepacked(n):
        launch = driver.cuLaunchKernel
        for _ in range(n):
            launch(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, 0)
    methods["cuda.bindings pre-packed"] = bindings_prepacked

    def call_prepacked():
        launch = driver.cuLaunchKernel
        return launch(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, 0)

    def python_call_floor(n):
        for _ in range(n):
            call_prepacked()
    # The floor for any Python-level launch API: one Python function call around pre-packed.
    methods["one Python call + pre-packed"] = python_call_floor

    def bindings_packing(n):
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

        def cupy_rawkernel(n):
            with cstream:
                for _ in range(n):
                    raw((1,), (32,), (carr,))
        methods["CuPy RawKernel"] = cupy_rawkernel
    return methods, (kernel, arg, value, params)  # the ctypes memory must outlive the launches


def measure(batch: int = 200, batches: int = 200, launches: int = 20000, rounds: int = 5,
            device: Device | None = None, progress: bool = True) -> dict:
    dev = device or Device()
    stream = dev.stream()
    methods, keep = _methods(dev, stream)
    names = list(methods)
    enqueue = {name: [] for name in names}
    throughput = {name: [] for name in names}
    for name in names:  # warm up: module loads, first-launch costs, the per-thread blocks
        methods[name](batch)
    stream.synchronize()
    clock = time.perf_counter
    total = batches + rounds
    order = random.Random(0)
    for b in range(batches):
        order.shuffle(names)  # no method always follows the same one
        for name in names:
            stream.synchronize()
            t0 = clock()
            methods[name](batch)
            enqueue[name].append((clock() - t0) / batch * 1e6)
        if progress and b % 20 == 0:
            print(f"\rbatch {b + 1}/{total}", end="", file=sys.stderr, flush=True)
    for r in range(rounds):
        order.shuffle(names)
        for name in names:
            stream.synchronize()
            t0 = clock()
            methods[name](launches)
            stream.synchronize()
            throughput[name].append((clock() - t0) / launches * 1e6)
        if progress:
            print(f"\rround {batches + r + 1}/{total}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    base_e = statistics.median(enqueue["cuda.bindings pre-packed"])
    base_t = statistics.median(throughput["cuda.bindings pre-packed"])
    result = {"device": dev.name, "batch": batch, "batches": batches, "launches": launches, "rounds": rounds,
              "methods": {}}
    for name in methods:
        e, t = statistics.median(enqueue[name]), statistics.median(throughput[name])
        result["methods"][name] = {"enqueue_us": e, "enqueue_ratio": e / base_e,
                                   "throughput_us": t, "throughput_ratio": t / base_t,
                                   "enqueue_batches_us": enqueue[name], "throughput_rounds_us": throughput[name]}
    return result


def report(result: dict) -> str:
    lines = [f"launch overhead on {result['device']} (median us per launch; ratio to cuda.bindings pre-packed)",
             f"  enqueue: {result['batches']} batches of {result['batch']}; "
             f"throughput: {result['rounds']} rounds of {result['launches']}",
             f"{'method':36s} {'enqueue':>9s} {'ratio':>7s} {'throughput':>11s} {'ratio':>7s}"]
    for name, m in result["methods"].items():
        lines.append(f"{name:36s} {m['enqueue_us']:9.2f} {m['enqueue_ratio']:6.3f}x "
                     f"{m['throughput_us']:11.2f} {m['throughput_ratio']:6.3f}x")
    return "\n".join(lines)


def run(args) -> int:
    result = measure(args.batch, args.batches, args.launches, args.rounds)
    print(report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0
