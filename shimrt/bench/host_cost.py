"""Measure shimrt's host time per collective beside the same NCCL function called directly.

An 8-byte in-place all_reduce, so the host's work is the whole cost: with one rank NCCL launches
nothing for it. Side by side in one run, the methods interleaved batch by batch, on the same
communicator and stream:
- shimrt: ``comm.all_reduce(buf)`` (every argument checked, the buffer described, the stream
  resolved, and a non-blocking communicator's ncclInProgress polled), and the same call made
  with ``comm.prepare("all_reduce", buf)`` (checked and packed once; each call checks that the
  communicator and buffer are alive);
- direct: ``ncclAllReduce`` through ctypes with the arguments packed once, and the same poll,
  called through its prototype (argtypes, as a ctypes binding declares it: the ratios' base) and
  without one, its arguments already of their C types (ctypes' floor, as shimrt's prepared call
  makes it);
for a non-blocking and a blocking communicator, with one rank and, where this NCCL can put two
ranks on one GPU (2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1) or there are two GPUs, with two ranks
of this process in one group (``shimrt.nccl.group`` against ncclGroupStart/End); and
torch.distributed's all_reduce with one rank where torch is installed (its own NCCL, named).
Reported: the median host time per call over batches, the ratio to the direct call, and where
shimrt's time goes (its steps timed alone).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import cli, validate
from ..device import Device
from ..errors import CollectiveError

__all__ = ["add_arguments", "run"]

if TYPE_CHECKING:
    from ..memory import Buffer
    from ..nccl import Communicator

_COUNT = 2  # float32 elements: 8 bytes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench host-cost``."""
    p.add_argument("--calls", metavar="N", default=200, type=cli.count("--calls", 1),
                   help="calls per timed batch, at least 1 (default 200)")
    p.add_argument("--batches", metavar="N", default=50,
                   type=cli.count("--batches", 1),
                   help="timed batches per method, interleaved with the others', at least 1 (default 50)")
    p.add_argument("--no-torch", action="store_true", help="leave torch.distributed out")
    cli.add_timeout(p, 600)
    cli.add_json(p)
    p.set_defaults(run=run)


def _direct(comms: list, bufs: list, bare: bool = False) -> Callable[[], None]:
    """The NCCL calls with everything packed once: one ncclAllReduce, or a group of one per rank,
    then the poll a non-blocking communicator needs. Through the prototype, as a ctypes binding
    declares it; ``bare``: the arguments of their C types and no prototype, ctypes' floor."""
    from ..nccl import library
    lib = comms[0].lib
    calls = [(ctypes.c_void_p(c.handle), ctypes.c_void_p(b.device_pointer), ctypes.c_void_p(c.stream.handle))
             for c, b in zip(comms, bufs, strict=True)]
    state = ctypes.c_int()
    handles = [h for h, _, _ in calls]
    fn, get = lib.ncclAllReduce, lib.ncclCommGetAsyncError
    count: int | ctypes.c_size_t = _COUNT
    if bare:
        fn, packed = lib.packed("ncclAllReduce", (None, None, _COUNT, 7, 0, None, None))
        count = packed[2]

    def settle(result: int) -> None:
        if result == library.IN_PROGRESS:  # polled back to back, as a C caller would, for at most 60 s
            for h in handles:
                deadline = time.monotonic() + 60
                get(h, ctypes.byref(state))
                while state.value == library.IN_PROGRESS and time.monotonic() < deadline:
                    get(h, ctypes.byref(state))
                if state.value != 0:
                    lib.check(state.value, "ncclAllReduce (direct, settled)")
        elif result != 0:
            lib.check(result, "ncclAllReduce")

    if len(calls) == 1:
        h, p, s = calls[0]
        return lambda: settle(fn(p, p, count, 7, 0, h, s))

    def grouped() -> None:
        lib.ncclGroupStart()
        for h, p, s in calls:
            fn(p, p, count, 7, 0, h, s)
        settle(lib.ncclGroupEnd())
    return grouped


def _shimrt(comms: list, bufs: list, prepared: bool = False) -> Callable[[], None]:
    from ..nccl import group, prepare_group
    if len(comms) == 1:
        c, b = comms[0], bufs[0]
        return c.prepare("all_reduce", b) if prepared else (lambda: c.all_reduce(b))

    if prepared:  # each rank's call made once, and their group too
        return prepare_group(*(c.prepare("all_reduce", b) for c, b in zip(comms, bufs, strict=True)))

    def grouped() -> None:
        with group(*comms):
            for c, b in zip(comms, bufs, strict=True):
                c.all_reduce(b)
    return grouped


def _torch(dev: Device) -> tuple[Callable[[], None], str, Callable[[], None]] | None:
    """torch.distributed's all_reduce on one rank (a HashStore: no network), its NCCL version,
    and its teardown; None where torch or its NCCL backend is missing."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        return None
    torch.cuda.set_device(dev.index)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", dev.index))
    t = torch.zeros(_COUNT, dtype=torch.float32, device="cuda")
    dist.all_reduce(t)  # NCCL's communicator is made at the first call
    torch.cuda.synchronize()
    from ..nccl.library import version_text
    from .latency import torch_nccl_version
    # The NCCL torch's calls reach (a preloaded one first), not torch.cuda.nccl.version(): the one it was built with.
    version = version_text(torch_nccl_version())
    return (lambda: dist.all_reduce(t)), version, dist.destroy_process_group


def _time(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    """Host microseconds per call over one batch (the device drained first, outside the time)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def _steps(comm: Communicator, buf: Buffer, calls: int) -> dict:
    """Where shimrt's time goes: each step of Communicator.collective timed alone (us per call)."""
    from ..nccl.collectives import buffers_of, count_of, datatype_of, op_of, rank_of, row_of
    row = row_of("all_reduce")
    s, r = buffers_of("all_reduce", row, buf, None)
    handle = comm.device.stream_handle(comm.stream)
    steps = {
        "the row and the buffers described": lambda: buffers_of("all_reduce", row_of("all_reduce"), buf, None),
        "datatype, count, op and rank checked": lambda: (datatype_of(s, "all_reduce", row.buffers),
                                                         count_of("all_reduce", row, s, r, 1),
                                                         op_of("all_reduce", row, None),
                                                         rank_of("all_reduce", row, 1, None, None)),
        "the stream's handle": lambda: comm.device.stream_handle(comm.stream),
        "the C arguments packed": lambda: row.arguments(s.pointer, r.pointer, _COUNT, 7, 0, None,
                                                        ctypes.c_void_p(comm.handle), handle),
    }
    out = {}
    for name, fn in steps.items():
        out[name] = statistics.median(_time(fn, calls, lambda: None) for _ in range(5))
    return out


def measure(dev: Device, calls: int = 200, batches: int = 50, torch_too: bool = True) -> dict:
    """Every method's median host time per call (us), by setting; see the module's docstring."""
    from ..nccl import CommOptions, Communicator, library, unique_id
    from ..nccl.config import check_shared_gpu
    calls = validate.integer(calls, "calls", least=1)
    batches = validate.integer(batches, "batches", least=1)
    lib = library.load(dev.backend)
    setups: list[tuple[str, list[Communicator] | str]] = []  # (label, communicators, or why not)
    made: list[Communicator] = []
    torch_setup = None
    try:
        for blocking in (False, True):
            mode = "blocking" if blocking else "non-blocking"
            options = CommOptions(blocking=blocking)
            one = Communicator(dev, unique_id(lib), 0, 1, options=options)
            made.append(one)
            setups.append((f"1 rank, {mode}", [one]))
            try:
                if dev.device_count() < 2:
                    check_shared_gpu(lib, dev.backend, "two ranks on one GPU")
                    pair = Communicator.local([dev, dev], options=options)
                else:
                    pair = Communicator.local([dev, Device(1, backend=dev.backend)], options=options)
            except CollectiveError as exc:
                setups.append((f"2 ranks, {mode}", str(exc)))
                continue
            made.extend(pair)
            setups.append((f"2 ranks in one process, {mode}", pair))
        methods: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {}
        skipped = {}
        for label, comms in setups:
            if isinstance(comms, str):
                skipped[label] = comms
                continue
            bufs = [c.device.to_device(np.zeros(_COUNT, np.float32)) for c in comms]
            def wait_all(cs=comms) -> None:
                for c in cs:
                    c.wait(timeout=60)
            methods[f"{label}: shimrt"] = (_shimrt(comms, bufs), wait_all)
            methods[f"{label}: shimrt prepared"] = (_shimrt(comms, bufs, prepared=True), wait_all)
            methods[f"{label}: direct ctypes"] = (_direct(comms, bufs), wait_all)
            methods[f"{label}: direct ctypes, no prototype"] = (_direct(comms, bufs, bare=True), wait_all)
        torch_setup = _torch(dev) if torch_too else None
        torch_version = None
        if torch_setup is not None:
            import torch
            fn, torch_version, _ = torch_setup
            methods[f"1 rank: torch.distributed (NCCL {torch_version})"] = (fn, torch.cuda.synchronize)
        elif torch_too:
            skipped["torch.distributed"] = "torch with CUDA and its NCCL backend is not installed"
        times: dict[str, list[float]] = {m: [] for m in methods}
        for fn, sync in methods.values():  # warm-up: first calls set NCCL's and torch's state up
            for _ in range(20):
                fn()
            sync()
        for _ in range(batches):
            for name, (fn, sync) in methods.items():
                times[name].append(_time(fn, calls, sync))
        first = made[0]  # setups[0]'s: one rank, non-blocking
        steps = _steps(first, first.device.to_device(np.zeros(_COUNT, np.float32)), calls)
    finally:
        if torch_setup is not None:
            torch_setup[2]()
        for c in made:
            c.close()
    medians = {m: statistics.median(v) for m, v in times.items()}
    return {"device": dev.name, "nccl": lib.version_text, "torch_nccl": torch_version, "calls": calls,
            "batches": batches, "us_per_call": medians, "skipped": skipped, "shimrt_steps_us": steps}


def report(result: dict) -> str:
    m = result["us_per_call"]
    lines = [f"host time per 8-byte in-place all_reduce on {result['device']}, NCCL {result['nccl']} "
             f"(median of {result['batches']} batches of {result['calls']} calls; ratio to the direct call)",
             f"{'method':58s} {'us/call':>8s} {'ratio':>7s}"]
    for name, us in m.items():
        # torch's communicators are blocking: it is set against the blocking direct call
        base = "1 rank, blocking: direct ctypes" if ": torch" in name else name.rsplit(": ", 1)[0] + ": direct ctypes"
        ratio = f"{us / m[base]:6.3f}x" if base in m else ""
        lines.append(f"{name:58s} {us:8.2f} {ratio:>7s}")
    for name, why in result["skipped"].items():
        lines.append(f"{name:58s} not run: {why}")
    lines.append("shimrt's own steps, each timed alone (us per call):")
    lines += [f"  {name:56s} {us:8.2f}" for name, us in result["shimrt_steps_us"].items()]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """``bench host-cost``: measure, print the table, write --json."""
    with cli.deadline(args.timeout):  # its direct calls into NCCL have no watchdog: never a hang
        result = measure(Device(), args.calls, args.batches, not args.no_torch)
    return cli.finish(report(result), result, args.json)
