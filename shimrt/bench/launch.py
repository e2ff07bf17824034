"""Measure the per-launch cost of shimrt's Kernel.launch beside cuda.bindings and CuPy's RawKernel.

cuda.bindings both pre-packed and packing per launch; all launch the same CUBIN on one stream:
an empty kernel taking one pointer, and ``add_i64`` taking three pointers and an int, passed as
shimrt Buffers, torch tensors and CuPy arrays (against CuPy RawKernel with CuPy arrays).

Grid forms: an empty kernel of six parameters (two pointers, a double, an int64, an int32, a
uint64) launched 4 x 256 by every grid and block form shimrt takes (ints, tuples of 1 and 3, lists,
numpy integers), with Python and with numpy scalars, each beside CuPy's RawKernel given the same
form (CuPy takes tuples only: the int and list rows give it the 1-tuple) and the same scalars;
pointers are each library's own arrays. The goal is at most 1.10x CuPy on each.

Two figures per method, measured side by side with the methods interleaved:
- enqueue: host time to issue a batch of launches small enough never to fill the driver's
  launch queue (the stream is drained between batches, outside the timed region), per launch:
  the CPU cost a caller pays, which is what launch overhead means;
- throughput: wall time of many back-to-back launches plus one synchronize, per launch; once
  the queue is full this is bounded by how fast the GPU retires launches, not by the caller.
Medians over batches (enqueue) and rounds (throughput).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import sys
import tempfile
import time

import numpy as np

from .. import cli, kernels, validate
from ..device import Device

__all__ = ["add_arguments", "run"]

#: option -> (default, what it counts); each must be at least 1.
COUNTS = {"batch": (200, "launches per enqueue batch"), "batches": (200, "enqueue batches per method"),
          "launches": (20000, "launches per throughput round"), "rounds": (5, "throughput rounds")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench launch``."""
    for name, (default, what) in COUNTS.items():
        p.add_argument(f"--{name}", metavar="N", type=cli.count(f"--{name}", 1),
                       default=default, help=f"{what}, at least 1 (default {default})")
    cli.add_json(p)
    p.set_defaults(run=run)


def _cupy_kernel(program, name: str, stream):
    """CuPy's RawKernel for ``name`` of the same CUBIN, and CuPy's view of ``stream``; None
    without CuPy."""
    try:
        import cupy  # type: ignore[import-not-found, import-untyped, unused-ignore]  # optional; no stubs
    except ImportError:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(program.binary)
    raw = cupy.RawModule(path=f.name).get_function(name)
    os.unlink(f.name)
    return cupy, raw, cupy.cuda.ExternalStream(stream.handle)


def _methods(dev: Device, stream):
    """name -> function(n) that performs n launches (without synchronizing), the baseline each is
    compared with, what must outlive the launches, and the grid-form pairs (:func:`_form_methods`).
    Kernels: ``empty(float*)`` (one pointer), ``add_i64(out, a, b, n)`` (three pointers and an int)
    with shimrt Buffers, torch tensors and CuPy arrays as arguments, and the grid forms' ``six``."""
    from cuda.bindings import driver
    program = dev.compile(kernels.source("vector_ops"), name="vector_ops.cu")
    module = dev.load(program)
    kernel, add = module["empty"], module["add_i64"]
    arg = dev.alloc(4)
    methods, base = {}, {}
    blocks: list[ctypes.Array[ctypes.c_void_p]] = []  # the pre-packed parameter blocks, in order
    keep: list[object] = [module, arg, blocks]

    def prepacked(fn, values):
        """cuda.bindings' cuLaunchKernel with a parameter block packed once (the floor)."""
        cells = [ctypes.c_uint64(v) for v in values]
        params = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        keep.append(cells)
        blocks.append(params)
        address, handle = ctypes.addressof(params), stream.handle

        def run(n):
            launch = driver.cuLaunchKernel
            for _ in range(n):
                launch(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, 0)
        return run

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
    methods["cuda.bindings pre-packed"] = prepacked(kernel.handle, [arg.ptr])
    fn, handle, address = kernel.handle, stream.handle, ctypes.addressof(blocks[-1])

    def call_prepacked():
        return driver.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, handle, address, 0)

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
    for name in methods:
        base[name] = "cuda.bindings pre-packed"

    cp = _cupy_kernel(program, "empty", stream)
    if cp is None:
        print("CuPy is not installed: its rows are left out", file=sys.stderr)
    else:
        cupy, raw, cstream = cp
        carr = cupy.empty(1, dtype=cupy.float32)

        def cupy_rawkernel(n):
            with cstream:
                for _ in range(n):
                    raw((1,), (32,), (carr,))
        methods["CuPy RawKernel"] = cupy_rawkernel
        base["CuPy RawKernel"] = "cuda.bindings pre-packed"

    # add_i64(out, a, b, n): three pointers and an int, the shape of most kernels' arguments.
    count = 256
    bufs = [dev.empty(count, np.int64).memset(0) for _ in range(3)]
    keep.append(bufs)
    floor3 = "add_i64: cuda.bindings pre-packed"
    methods[floor3] = prepacked(add.handle, [b.ptr for b in bufs] + [count])

    def with_args(args):
        def run(n):
            launch = add.launch
            for _ in range(n):
                launch(1, 32, *args, stream=stream)
        return run
    methods["add_i64: shimrt, Buffers"] = with_args([*bufs, count])
    reference = floor3
    if cp is not None:
        cupy, _, cstream = cp
        raw3 = _cupy_kernel(program, "add_i64", stream)[1]
        carrs = [cupy.zeros(count, dtype=cupy.int64) for _ in range(3)]
        keep.append(carrs)

        def cupy_raw3(n):
            with cstream:
                for _ in range(n):
                    raw3((1,), (32,), (*carrs, np.int64(count)))
        reference = "add_i64: CuPy RawKernel, CuPy arrays"
        methods[reference] = cupy_raw3
        methods["add_i64: shimrt, CuPy arrays"] = with_args([*carrs, count])
    try:
        import torch
    except ImportError:
        print("torch is not installed: its row is left out", file=sys.stderr)
    else:
        tensors = [torch.zeros(count, dtype=torch.int64, device=f"cuda:{dev.index}") for _ in range(3)]
        keep.append(tensors)
        methods["add_i64: shimrt, torch tensors"] = with_args([*tensors, count])
    for name in methods:
        if name.startswith("add_i64"):
            base[name] = reference
    base[reference] = floor3
    forms = _form_methods(dev, stream, prepacked, methods, base, keep)
    return methods, base, keep, forms  # the ctypes memory must outlive the launches


#: The grid-forms kernel: six parameters of the kinds kernels take, and no work.
FORMS_SOURCE = r"""
extern "C" __global__ void six(double* out, const double* in, double a, long long n, int k, unsigned long long m) {}
"""
#: The goal of every grid-form row: shimrt's time per launch over CuPy's.
FORMS_GOAL = 1.10


def _form_methods(dev: Device, stream, prepacked, methods: dict, base: dict, keep: list) -> list[dict]:
    """Add the grid-form rows to ``methods`` and ``base``: shimrt's ``six`` launched by each form,
    beside CuPy's RawKernel with the same form and scalars; returns the pairs, as the JSON lists them."""
    program = dev.compile(FORMS_SOURCE, name="launch_forms.cu")
    module = dev.load(program)
    six = module["six"]
    bufs = [dev.empty(16, np.float64).memset(0) for _ in range(2)]
    keep.extend([module, bufs])
    floor = "six: cuda.bindings pre-packed"
    methods[floor] = prepacked(six.handle, [bufs[0].ptr, bufs[1].ptr, 0, 1024, 7, 9])
    base[floor] = "cuda.bindings pre-packed"
    scalars = {"Python": (0.5, 1024, 7, 9), "numpy": (np.float64(0.5), np.int64(1024), np.int32(7), np.uint64(9))}
    n4, n256 = np.int64(4), np.int64(256)
    # (form, shimrt's grid and block, CuPy's grid and block, the scalars)
    forms = [("int", 4, 256, (4,), (256,), "Python"),
             ("tuple", (4,), (256,), (4,), (256,), "Python"),
             ("3-tuple", (4, 1, 1), (256, 1, 1), (4, 1, 1), (256, 1, 1), "Python"),
             ("list", [4], [256], (4,), (256,), "Python"),
             ("numpy int", n4, n256, (n4,), (n256,), "Python"),
             ("int", 4, 256, (4,), (256,), "numpy"),
             ("tuple", (4,), (256,), (4,), (256,), "numpy")]
    cp = _cupy_kernel(program, "six", stream)
    if cp is not None:
        cupy, raw, cstream = cp
        arrays = [cupy.zeros(16, dtype=cupy.float64) for _ in range(2)]
        keep.append(arrays)

    def shimrt_form(grid, block, a, n_, k, m):
        def run(n):
            launch, (out, src) = six.launch, bufs
            for _ in range(n):
                launch(grid, block, out, src, a, n_, k, m, stream=stream)
        return run

    def cupy_form(grid, block, args):
        def run(n):
            with cstream:
                for _ in range(n):
                    raw(grid, block, args)
        return run

    pairs = []
    for label, grid, block, cgrid, cblock, kind in forms:
        mine = f"six, {label} grid, {kind} scalars: shimrt"
        theirs = None if cp is None else f"six, {label} grid, {kind} scalars: CuPy"
        methods[mine] = shimrt_form(grid, block, *scalars[kind])
        base[mine] = theirs or floor
        if theirs is not None:
            methods[theirs] = cupy_form(cgrid, cblock, (*arrays, *scalars[kind]))
            base[theirs] = floor
        pairs.append({"form": label, "grid": repr(grid), "block": repr(block), "cupy_grid": repr(cgrid),
                      "cupy_block": repr(cblock), "scalars": kind, "shimrt": mine, "cupy": theirs})
    return pairs


def measure(batch: int = 200, batches: int = 200, launches: int = 20000, rounds: int = 5,
            device: Device | None = None, progress: bool = True) -> dict:
    """Per-launch enqueue and throughput times of every method, and their ratios to baselines."""
    for name, value in zip(COUNTS, (batch, batches, launches, rounds), strict=True):
        validate.integer(value, name, least=1)
    dev = device or Device()
    stream = dev.stream()
    methods, base, keep, forms = _methods(dev, stream)
    names = list(methods)
    enqueue: dict[str, list[float]] = {name: [] for name in names}
    throughput: dict[str, list[float]] = {name: [] for name in names}
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
    result = {"device": dev.name, "batch": batch, "batches": batches, "launches": launches, "rounds": rounds,
              "methods": {}}
    for name in methods:
        e, t = statistics.median(enqueue[name]), statistics.median(throughput[name])
        b = base[name]
        result["methods"][name] = {"enqueue_us": e, "enqueue_ratio": e / statistics.median(enqueue[b]),
                                   "throughput_us": t, "throughput_ratio": t / statistics.median(throughput[b]),
                                   "baseline": b, "enqueue_batches_us": enqueue[name],
                                   "throughput_rounds_us": throughput[name]}
    result["forms"] = judge_forms(result["methods"], forms)
    return result


def judge_forms(methods: dict, pairs: list[dict]) -> list[dict]:
    """The grid-form pairs with shimrt's enqueue and throughput ratios to CuPy (the shimrt rows'
    baseline), ``goal`` and ``met`` (both ratios at most the goal); ratios and ``met`` are None
    for a pair without CuPy. ``methods`` is a :func:`measure` result's."""
    judged = []
    for pair in pairs:
        mine, theirs = methods[pair["shimrt"]], pair["cupy"]
        names = ("enqueue_ratio", "throughput_ratio")
        ratios: dict[str, float | None] = dict.fromkeys(names)
        met: bool | None = None
        if theirs:
            measured: list[float] = [mine[n] for n in names]
            ratios = dict(zip(names, measured, strict=True))
            met = all(r <= FORMS_GOAL for r in measured)
        judged.append({**pair, **ratios, "goal": FORMS_GOAL, "met": met})
    return judged


def report(result: dict) -> str:
    """The table of a :func:`measure` result, then the grid forms against CuPy."""
    width = max([40, *map(len, result["methods"])])
    lines = [f"launch overhead on {result['device']} (median us per launch; ratio to the row's baseline)",
             f"  enqueue: {result['batches']} batches of {result['batch']}; "
             f"throughput: {result['rounds']} rounds of {result['launches']}",
             f"{'method':{width}s} {'enqueue':>9s} {'ratio':>7s} {'throughput':>11s} {'ratio':>7s}  baseline"]
    for name, m in result["methods"].items():
        lines.append(f"{name:{width}s} {m['enqueue_us']:9.2f} {m['enqueue_ratio']:6.3f}x "
                     f"{m['throughput_us']:11.2f} {m['throughput_ratio']:6.3f}x  {m['baseline']}")
    forms = result.get("forms", [])
    if forms:
        lines += ["", f"grid forms: shimrt over CuPy RawKernel with the same form and scalars, enqueue and "
                      f"throughput (goal: at most {FORMS_GOAL:.2f}x on each)",
                  f"{'grid, block (shimrt)':30s} {'scalars':7s} {'shimrt us':>9s} {'enqueue':>8s} "
                  f"{'throughput':>10s}  goal"]
        for p in forms:
            us = result["methods"][p["shimrt"]]["enqueue_us"]
            row = f"{p['grid'] + ', ' + p['block']:30s} {p['scalars']:7s} {us:9.2f}"
            if p["cupy"] is None:
                lines.append(f"{row}  CuPy is not installed: no ratio")
            else:
                lines.append(f"{row} {p['enqueue_ratio']:7.3f}x {p['throughput_ratio']:9.3f}x  "
                             f"{'met' if p['met'] else 'MISSED'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``bench launch``: measure, print, write --json."""
    result = measure(args.batch, args.batches, args.launches, args.rounds)
    return cli.finish(report(result), result, args.json)
