"""Where a training step's GPU time goes, from a torch.profiler trace: ``bench torch --profile``.

A few steps of a way are recorded with torch.profiler (CUDA activity) into a Chrome trace, and the
trace is read back here into per-step figures: the collectives' kernels by kind (AllGather,
ReduceScatter, AllReduce, ...), their time and the blocks they hold (a kernel's grid: one block
per NCCL channel, each on an SM of its own), FSDP2's copy-in and copy-out (the kernels run inside
its ``FSDP::all_gather_copy_in``/``..._copy_out`` ranges and its ``chunk_cat`` before a
reduce-scatter), the rest of the compute, and the communication exposed: the time some
collective's kernel runs while no other kernel does (the union of the collectives' intervals less
the union of everything else's). A collective that waits for its peer with its kernel already
running counts as communication, as it holds its SMs all the same; one NCCL runs on the copy
engines (CTA policy ZERO) is the memory copies inside torch.distributed's "nccl:..." range, no
kernel of its own. With ranks sharing a GPU, the other rank's kernels are not in this rank's
trace: "exposed" is this process's.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any, Callable

from ..errors import UsageError

__all__ = ["record", "load", "summarise", "describe", "kind_of"]

#: A collective's kernel by its name: NCCL's (ncclDevKernel_AllGather_RING_LL, ncclKernel_...) and
#: RCCL's; the group is the collective's kind.
_COLLECTIVE = re.compile(r"(?:nccl|rccl)\w*?(AllGather|ReduceScatter|AllReduce|Broadcast|Reduce|SendRecv|Send|Recv)",
                         re.IGNORECASE)
#: FSDP2's copies around its collectives, by the record_function range the kernel runs in (or its own name).
COPIES = {"copy-in": ("all_gather_copy_in", "chunk_cat"), "copy-out": ("all_gather_copy_out",
                                                                        "split_with_sizes_copy")}


def record(torch: Any, step: Callable[[int], Any], steps: int, path: Path) -> Path:
    """Run ``step(0..steps-1)`` under torch.profiler (CPU and CUDA activity) and write its Chrome
    trace to ``path`` (gzip-ed where the name ends with .gz); the path."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))  # gzip-ed by torch where the name ends with .gz
    return path


def load(trace: dict | Path) -> dict:
    """A Chrome trace as a dict: ``trace`` itself, or the file (gzip-ed where it ends with .gz)."""
    if isinstance(trace, dict):
        return trace
    opener = gzip.open if Path(trace).suffix == ".gz" else open
    with opener(trace, "rt") as f:
        return json.load(f)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _less(spans: list[tuple[float, float]], minus: list[tuple[float, float]]) -> float:
    """The time of ``spans`` (a union) outside ``minus`` (a union)."""
    covered, j = 0.0, 0
    for a, b in spans:
        while j < len(minus) and minus[j][1] <= a:
            j += 1
        k = j
        while k < len(minus) and minus[k][0] < b:
            covered += min(b, minus[k][1]) - max(a, minus[k][0])
            k += 1
    return _length(spans) - covered


def kind_of(name: str) -> str | None:
    """A collective's kind from its kernel's name (``AllGather``...; ``NCCL`` for a kernel of
    NCCL's or RCCL's whose name says no kind), None for any other kernel."""
    if m := _COLLECTIVE.search(name):
        return m.group(1)
    return "NCCL" if "nccl" in name.lower() else None


#: A collective's kind from the record_function range torch.distributed opens around it ("nccl:all_gather...").
_ANNOTATED = (("all_gather", "AllGather"), ("allgather", "AllGather"), ("reduce_scatter", "ReduceScatter"),
              ("all_reduce", "AllReduce"), ("allreduce", "AllReduce"), ("broadcast", "Broadcast"))


def _annotated_kind(names: list[str]) -> str | None:
    """The collective kind of the innermost "nccl:..." range among ``names`` (``NCCL`` where it
    names none), or None outside any."""
    for n in names:
        if n.lower().startswith("nccl:"):
            return next((kind for key, kind in _ANNOTATED if key in n.lower()), "NCCL")
    return None


def summarise(trace: dict | Path, steps: int) -> dict:
    """Per step (the trace's kernels over ``steps``, a positive int): ``span_ms`` (first kernel's
    start to last one's end), ``compute_ms`` (busy time of every kernel not a collective nor a
    copy), per collective kind its ``ms``, ``kernels`` and ``blocks`` (the largest grid), ``copy-in``
    and ``copy-out`` ms, ``comm_ms`` (the collectives' union) and ``exposed_ms`` (of it, while no
    other kernel runs). A memory copy inside torch.distributed's "nccl:..." range on its stream is a
    collective on the copy engines (NCCL's CTA policy ZERO), its kind "<kind> (copy engine)", no
    blocks. A kernel is FSDP2's copy-in or copy-out by its own name or a range on its own stream."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise UsageError(f"steps must be a positive int, not {steps!r}")
    events = load(trace).get("traceEvents") or []
    ranges = [(e.get("pid"), e.get("tid"), e["ts"], e["ts"] + e.get("dur", 0), e.get("name", "")) for e in events
              if e.get("cat") == "gpu_user_annotation"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        raise UsageError("the trace has no GPU kernels (was CUDA activity recorded?)")
    memcpys = [e for e in events if e.get("cat") == "gpu_memcpy" and "dur" in e]

    def inside(e: dict) -> list[str]:  # the ranges on e's stream that hold it, innermost first
        start, end = e["ts"], e["ts"] + e["dur"]
        held = [(b - a, n) for pid, tid, a, b, n in ranges
                if (pid, tid) == (e.get("pid"), e.get("tid")) and a <= start and end <= b]
        return [n for _, n in sorted(held)]

    collectives: dict[str, dict] = {}
    comm, other, compute = [], [], []
    copies = {c: 0.0 for c in COPIES}

    def collective(kind: str, e: dict, blocks: int) -> None:
        c = collectives.setdefault(kind, {"ms": 0.0, "kernels": 0, "blocks": 0})
        c["ms"] += e["dur"] / 1e3
        c["kernels"] += 1
        c["blocks"] = max(c["blocks"], blocks)
        comm.append((e["ts"], e["ts"] + e["dur"]))
    for k in kernels:
        name = k.get("name", "")
        kind = kind_of(name)
        if kind is not None:
            grid = (k.get("args") or {}).get("grid") or [0]
            collective(kind, k, int(grid[0]) * int(grid[1] if len(grid) > 1 else 1)
                       * int(grid[2] if len(grid) > 2 else 1))
            continue
        other.append((k["ts"], k["ts"] + k["dur"]))
        names = inside(k) + [name]
        copy = next((c for c, keys in COPIES.items() if any(key in n for key in keys for n in names)), None)
        if copy is None:
            compute.append((k["ts"], k["ts"] + k["dur"]))
        else:
            copies[copy] += k["dur"] / 1e3
    for m in memcpys:  # the copy engines' collectives; other copies hold no SM and are left out
        if (kind := _annotated_kind(inside(m))) is not None:
            collective(f"{kind} (copy engine)", m, 0)
    comm_u, other_u = _union(comm), _union(other)
    first, last = min(k["ts"] for k in kernels), max(k["ts"] + k["dur"] for k in kernels)
    per = 1e3 * steps
    return {"steps": steps, "span_ms": (last - first) / per, "compute_ms": _length(_union(compute)) / per,
            "collectives": {kind: {"ms": c["ms"] / steps, "kernels": c["kernels"] / steps, "blocks": c["blocks"]}
                            for kind, c in sorted(collectives.items())},
            **{f"{c}_ms": ms / steps for c, ms in copies.items()},
            "comm_ms": _length(comm_u) / per, "exposed_ms": _less(comm_u, other_u) / per}


def describe(way: str, s: dict) -> str:
    """One line of :func:`summarise`'s figures for ``way`` (or why there are none: ``failed``)."""
    if "failed" in s:
        return f"{way}: no timeline ({s['failed']})"
    kinds = "; ".join(f"{kind} {c['kernels']:.0f} {'copies' if 'copy engine' in kind else 'kernels'} {c['ms']:.2f} ms"
                      + (f" on up to {c['blocks']} blocks" if c["blocks"] else "")
                      for kind, c in s["collectives"].items()) or "no collectives"
    share = s["exposed_ms"] / s["comm_ms"] if s["comm_ms"] else 0.0
    return (f"{way}: per step {s['span_ms']:.2f} ms of kernels, compute {s['compute_ms']:.2f} ms busy, {kinds}; "
            f"copy-in {s['copy-in_ms']:.2f} ms, copy-out {s['copy-out_ms']:.2f} ms; communication "
            f"{s['comm_ms']:.2f} ms, exposed {s['exposed_ms']:.2f} ms ({share:.0%})")
