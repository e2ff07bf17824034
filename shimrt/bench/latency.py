"""``bench collectives --torch``: shimrt's collectives against torch.distributed's on one NCCL.

Two measures, side by side in one run, on the rank this process holds (one per process, under
``python -m shimrt.launch``, torchrun or MPI):

- **latency**: host time per call of back-to-back in-place all_reduces (``--latency-calls`` of
  them, then one synchronize), as a training loop issues them: shimrt's one-off
  ``comm.all_reduce(t)``, its prepared call (``comm.prepare``), ``dist.all_reduce(t)``, and
  ncclAllReduce called directly on shimrt's communicator, all on the same torch tensor,
  interleaved round by round with each in each place in turn, medians over rounds;
- **device time** per collective and size (CUDA events around each call), torch's beside the
  nccl-tests table (:func:`torch_device_times`).

Both sides must use one NCCL library: torch links ``libnccl.so.2`` by name, and takes the one
shimrt loaded when shimrt loads it first (the bench does, before importing torch). Where torch
was imported first it brings its own, and :func:`check_same_nccl` refuses to set two versions
side by side unless asked (``--mixed-nccl``).

With several ranks in one process (``Communicator.local``) torch.distributed cannot take part;
:func:`local_latency` times shimrt's grouped one-off and ``prepare_group`` calls alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..errors import UsageError
from ..nccl import buffer_counts, group, prepare_group
from ..nccl.library import version_text

__all__ = ["torch_nccl_version", "check_same_nccl", "torch_group", "latency", "local_latency", "torch_device_times",
           "report"]

if TYPE_CHECKING:
    from ..nccl import Communicator
    from ..nccl.library import Library

#: Latency goals of shimrt against torch.distributed (issue 22): one-off and prepared calls.
GOALS = {"one-off": 1.10, "prepared": 1.00}


def torch_nccl_version() -> int | None:
    """The NCCL version torch's calls reach, X*10000 + Y*100 + Z, once torch is imported: the
    ``ncclGetVersion`` the process's global symbol scope resolves, which is what libtorch binds
    (a preloaded library first, else the one torch loads itself). torch.cuda.nccl.version() is
    the version torch was built against, not this. None where no NCCL is global."""
    import torch  # noqa: F401 - loads its CUDA libraries, NCCL among them
    try:
        fn = ctypes.CDLL(None).ncclGetVersion
    except AttributeError:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_int)]
    out = ctypes.c_int()
    return out.value if fn(ctypes.byref(out)) == 0 else None


def _mapped_nccl() -> set[str]:
    """The NCCL (RCCL) library files mapped into this process, as real paths (/proc/self/maps)."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(("libnccl.so", "librccl.so")):
                found.add(os.path.realpath(fields[5].strip()))
    return found


def check_same_nccl(lib: Library, allow_mixed: bool) -> str:
    """Import torch and say which NCCL its calls reach, after checking it is shimrt's ``lib``:
    UsageError when it is another version, unless ``allow_mixed``."""
    theirs = torch_nccl_version()
    if theirs is None and _mapped_nccl() <= {os.path.realpath(lib.path)}:
        theirs = lib.version  # no NCCL in the global scope, and no other NCCL file in the process
    text = version_text(theirs)
    if theirs != lib.version and not allow_mixed:
        raise UsageError(f"torch.distributed would call NCCL {text} beside shimrt's {lib.version_text} ({lib.path}): "
                         f"torch loads its own libnccl.so.2. Start with LD_PRELOAD={lib.path} so both call one "
                         "library, or pass --mixed-nccl to time the two side by side anyway")
    return text


@contextlib.contextmanager
def torch_group(comm: Communicator) -> Iterator[Any]:
    """torch.distributed's NCCL process group of ``comm``'s rank and size on its GPU, joined
    through a HashStore (one rank) or a FileStore named by the communicator's unique id (every
    rank of a launch has it), destroyed on the way out."""
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(comm.device.index)
    if comm.size == 1:
        store = dist.HashStore()
    else:
        store = dist.FileStore(str(Path(tempfile.gettempdir()) / f"shimrt-torch-{comm.unique_id.hex()[:32]}"),
                               comm.size)
    dist.init_process_group("nccl", store=store, rank=comm.rank, world_size=comm.size,
                            device_id=torch.device("cuda", comm.device.index))
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def _per_call_us(call: Callable[[], object], sync: Callable[[], None], calls: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def _count(nbytes: int, size: int) -> int:
    return max(nbytes // 4 // size * size, size)


def latency(comm: Communicator, dist: Any, sizes: list[int], calls: int = 200, rounds: int = 8,
            progress: bool = True) -> list[dict]:
    """Per-call host time (us, median of ``rounds``) of ``calls`` back-to-back in-place
    all_reduces of float32 at each of ``sizes`` bytes: shimrt's one-off and prepared calls and
    torch.distributed's (``dist``, joined by :func:`torch_group`), on one torch tensor."""
    import torch
    rows = []
    for step, nbytes in enumerate(sizes, 1):
        if progress and comm.rank == 0:
            print(f"\rlatency {nbytes:>12d} B  [{step}/{len(sizes)}]", end="", file=sys.stderr, flush=True)
        t = torch.zeros(_count(nbytes, comm.size), dtype=torch.float32, device=f"cuda:{comm.device.index}")
        prepared = comm.prepare("all_reduce", t)
        q = prepared.queued
        ways: dict[str, Callable[..., object]] = {"one-off": lambda t=t: comm.all_reduce(t), "prepared": prepared,
                "torch": lambda t=t: dist.all_reduce(t),
                # NCCL's own function on the same communicator, nothing around it (no check, no watchdog)
                "direct": lambda f=q.function, a=q.args: f(*a)}
        names = list(ways)
        times: dict[str, list[float]] = {k: [] for k in ways}
        for r in range(rounds + 1):  # the first round warms every path up and is dropped
            for name in names[r % len(names):] + names[:r % len(names)]:  # each takes each place in turn
                times[name].append(_per_call_us(ways[name], torch.cuda.synchronize, calls))
        rows.append({"bytes": nbytes, **{k: statistics.median(v[1:]) for k, v in times.items()}})
        del t
    if progress and comm.rank == 0:
        print(file=sys.stderr)
    return rows


def local_latency(comms: list, sizes: list[int], calls: int = 200, rounds: int = 5) -> list[dict]:
    """As :func:`latency` for several ranks of this process: shimrt's grouped one-off calls and
    :func:`prepare_group`, on shimrt Buffers (torch.distributed holds one rank per process)."""
    import numpy as np
    rows = []
    for nbytes in sizes:
        bufs = [c.device.empty(_count(nbytes, c.size), np.float32).memset(0) for c in comms]

        def one_off(bufs=bufs) -> None:
            with group(*comms):
                for c, b in zip(comms, bufs, strict=True):
                    c.all_reduce(b)

        def sync() -> None:
            for c in comms:
                c.device.synchronize()
        prepared = prepare_group(*(c.prepare("all_reduce", b) for c, b in zip(comms, bufs, strict=True)))
        ways: dict[str, Callable[[], None]] = {"one-off": one_off, "prepared": prepared}
        times: dict[str, list[float]] = {k: [] for k in ways}
        for _ in range(rounds + 1):
            for name, call in ways.items():
                times[name].append(_per_call_us(call, sync, calls))
        rows.append({"bytes": nbytes, **{k: statistics.median(v[1:]) for k, v in times.items()}})
        for b in bufs:
            b.free()
    return rows


def torch_device_times(comm: Communicator, dist: Any, ops: list[str], sizes: list[int], iters: int = 20,
                       warmup: int = 5) -> dict[str, float]:
    """torch.distributed's time (us, device-event median) for each (op, size), keyed "op:bytes":
    in place where torch's call takes one tensor, out of place for all_gather and reduce_scatter."""
    import torch
    n = comm.size
    out = {}
    for op in ops:
        for nbytes in sizes:
            send_count, recv_count = buffer_counts(op, _count(nbytes, n), n, given="largest")
            a = torch.zeros(send_count, dtype=torch.float32, device="cuda")
            b = torch.zeros(recv_count, dtype=torch.float32, device="cuda")
            calls: dict[str, Callable[..., object]] = {
                "all_reduce": lambda a=a: dist.all_reduce(a),
                "broadcast": lambda a=a: dist.broadcast(a, 0),
                "reduce": lambda a=a: dist.reduce(a, 0),
                "all_gather": lambda a=a, b=b: dist.all_gather_into_tensor(b, a),
                "reduce_scatter": lambda a=a, b=b: dist.reduce_scatter_tensor(b, a)}
            call = calls[op]
            times = []
            for i in range(warmup + iters):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                if i >= warmup:
                    times.append(start.elapsed_time(end) * 1e3)
            out[f"{op}:{nbytes}"] = statistics.median(times)
    return out


def report(rows: list[dict], ranks: str) -> str:
    """The latency table: us per call for each way, and shimrt against torch where it ran."""
    torch_too = bool(rows) and "torch" in rows[0]
    head = f"{'bytes':>12s} {'one-off':>9s} {'prepared':>9s}"
    if torch_too:
        head += f" {'torch':>9s} {'direct':>9s} {'one-off/torch':>14s} {'prepared/torch':>15s}"
    lines = [f"# latency: in-place all_reduce, {ranks}, host clock per call of back-to-back calls (us; direct: "
             "ncclAllReduce itself on shimrt's communicator)" if torch_too else
             f"# latency: in-place all_reduce, {ranks}, host clock per call of back-to-back calls (us)", head]
    worst = dict.fromkeys(GOALS, 0.0)
    for r in rows:
        line = f"{r['bytes']:12d} {r['one-off']:9.1f} {r['prepared']:9.1f}"
        if torch_too:
            ratios = {k: r[k] / r["torch"] for k in GOALS}
            for k, v in ratios.items():
                worst[k] = max(worst[k], v)
            line += f" {r['torch']:9.1f} {r['direct']:9.1f} {ratios['one-off']:13.3f}x {ratios['prepared']:14.3f}x"
        lines.append(line)
    if torch_too and rows:
        lines.append("goals: " + "; ".join(f"{k} at most {g:.2f}x torch at every size: worst {worst[k]:.3f}x "
                                           f"({'met' if worst[k] <= g else 'NOT met'})" for k, g in GOALS.items()))
    return "\n".join(lines)
