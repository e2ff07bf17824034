"""What ``bench torch`` measures beside the policies' step times: why a configuration gains what
it gains (the best step any overlap policy could reach, how much of torch's compute cannot share
an SM with NCCL), the CUPTI timeline of a step, and the Interposer's host cost per launch.

- :func:`timed_steps`: a policy's step time (the median of per-step events), losses and gradients.
- :func:`phases`: when, in a step of compute alone, the first bucket's gradients are all ready,
  backward ends and the optimizer ends (the shortest over steps run back to back, CUDA events).
- :func:`bound`: a step cannot be shorter than the time to the first full bucket, plus every
  all-reduce back to back at the fastest channel setting measured, plus the optimizer (which
  needs every reduced gradient), nor than compute alone; nor, where NCCL's blocks and compute
  never share an SM, than the same with the rest of backward and the all-reduces' SM time in
  between. Against torch's default it says what any policy that keeps DDP's order (buckets as
  they fill, the optimizer after) could save at most.
- :func:`sharing`: each compute kernel's footprint (CUPTI) against one NCCL block's
  (:func:`shimrt.occupancy.coresident`): the share of compute time in kernels none of whose
  blocks fit on an SM that hosts an NCCL block. Those kernels and NCCL take turns on an SM;
  a kernel that fits can run beside it.
- :func:`contention`: the all-reduces beside work kept off the SMs left to NCCL (torch on an SM
  partition of the rest; NCCL's own blocks are not confined): a memory-bound copy and a
  compute-bound GEMM, each about as long as the all-reduces. What of the shorter each hides
  (:func:`overlap_share`) says what the all-reduces compete for besides SMs: with ranks sharing
  one GPU, its memory.
- :class:`ComputeSpans`: each step's forward and backward on the GPU, from its first kernel to the
  last gradient's, so that a DDP step's compute beside its all-reduces is set against the same
  compute alone (the contention the all-reduces cause).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import validate
from ..device import Device
from ..errors import ShimrtError
from ..occupancy import Footprint, coresident

__all__ = ["ComputeSpans", "step_times_ms", "timed_steps", "phases", "bound", "sharing", "comm_alone", "comm_hidden",
           "order_bound", "contention", "timeline", "interposer_cost", "is_nccl", "finish", "allocator_mark",
           "allocator_since"]

if TYPE_CHECKING:
    from ..torch.step import GradientBuckets, NcclBuckets
    from .torch_trainer import Trainer


def median_step_ms(torch: Any, step: Callable[[int], Any], warmup: int, steps: int) -> tuple[float, list]:
    """(median ms of ``steps`` steps after ``warmup``, what every step returned): see
    :func:`step_times_ms`."""
    ms, out = step_times_ms(torch, step, warmup, steps)
    return statistics.median(ms), out


def step_times_ms(torch: Any, step: Callable[[int], Any], warmup: int, steps: int) -> tuple[list[float], list]:
    """(ms of each of ``steps`` steps after ``warmup``, what every step returned): ``step(i)`` runs
    step ``i`` (0 is the first warm-up step) on the current stream, timed by a CUDA event between
    steps, with Python's collector paused, so that one stalled step (a collection, a preempted
    host thread) does not move the figure."""
    out = []
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for i in range(warmup + steps):
            if i >= warmup:
                marks[i - warmup].record()
            out.append(step(i))
        marks[-1].record()
        finish(torch)
    finally:
        if collecting:
            gc.enable()
    return [a.elapsed_time(b) for a, b in zip(marks[:-1], marks[1:], strict=True)], out


def timed_steps(torch: Any, trainer: Trainer, comm: NcclBuckets | None, overlap: bool, warmup: int, steps: int,
                keep: bool = False, settle: Any = None) -> tuple:
    """(median ms per step over ``steps`` after ``warmup``, the losses, the gradients after the
    first step when ``keep``) on the current stream, from the initial weights (see
    :func:`median_step_ms`). ``settle`` (an interposer's) runs after each warm-up step: the kernels
    it learnt are shaped from the next."""
    trainer.reset()
    grads = []

    def step(i: int) -> Any:
        loss = trainer.step(comm, overlap)
        if i == 0 and keep:
            grads.append(trainer.buckets.copy())
        if i < warmup and settle is not None:
            settle()
        return loss
    ms, losses = median_step_ms(torch, step, warmup, steps)
    return ms, torch.stack(losses), grads[0] if grads else None


def phases(torch: Any, trainer: Trainer, steps: int = 5) -> dict:
    """The shortest ms, over ``steps`` compute-alone steps run back to back (the host queueing
    ahead, as in a timed run), from a step's start to its first full bucket ("first bucket"),
    to the end of backward ("backward") and to its end ("end"): the least each phase needs."""
    steps = validate.integer(steps, "steps", least=1)

    def one_step() -> dict:  # its marks, read once every step has run
        trainer.marks = {}
        trainer.step(None)
        return trainer.marks
    try:
        # The first step starts on an idle GPU with its host behind: left out where there are more.
        seen = [trainer.phases(marks) for marks in rounds(one_step, steps - 1)]
    finally:
        trainer.marks = None
    return {k: min(p[k] for p in seen) for k in seen[0]}


def bound(phase_ms: dict, compute_ms: float, comm_ms: dict, blocks: dict | None = None, sms: int = 0) -> dict:
    """The shortest step a policy keeping DDP's order could reach (see the module docstring):
    ``comm_ms`` maps each channel setting measured (str) to the all-reduces' time alone; the
    fastest of those is taken (a setting not measured might be faster still).

    With ``blocks`` (setting -> NCCL blocks on this GPU) and ``sms``, also "exclusive_ms": the
    same if NCCL's blocks never share an SM with compute and compute fills every SM it has. From
    the first full bucket on, the rest of backward and the all-reduces then need the GPU for the
    rest of backward plus blocks x time / SMs, and at least the all-reduces' own time."""
    fastest = min(comm_ms, key=comm_ms.__getitem__)
    first, backward = phase_ms["first bucket"], phase_ms["backward"]
    optimizer = max(0.0, phase_ms["end"] - backward)
    out = {"ms": max(compute_ms, first + comm_ms[fastest] + optimizer), "first_bucket_ms": first,
           "comm_ms": comm_ms[fastest], "channels": fastest, "optimizer_ms": optimizer}
    blocks = blocks or {}
    shared = {k: max(t, backward - first + blocks[k] * t / sms) for k, t in comm_ms.items() if k in blocks} \
        if sms > 0 else {}  # no SM count: no exclusive bound (and no division by 0)
    if shared:
        best = min(shared, key=shared.__getitem__)
        out.update(exclusive_ms=max(compute_ms, first + shared[best] + optimizer), exclusive_channels=best,
                   exclusive_blocks=blocks[best])
    return out


def sharing(target: Any, records: list, nccl: Footprint) -> dict:
    """Of the compute kernels in ``records`` (CUPTI, NCCL's left out by the caller): their time
    in all, the share of it in kernels no block of which fits beside one ``nccl`` block, and the
    longest-running such kernel with its footprint."""
    total, alone = 0.0, 0.0
    exclusive: dict = {}  # name -> (us in all, its footprint as (threads, registers, smem))
    fits: dict = {}
    for k in records:
        _, fp = Footprint.of_record(k)  # a CUPTI record's footprint, whatever kernel it is
        key = (fp.threads, fp.registers, fp.static_smem + fp.dynamic_smem)
        if key not in fits:
            try:
                fits[key] = coresident(target, {"registers": key[1], "static_smem": key[2]}, key[0], nccl)
            except ShimrtError:  # a footprint the model cannot place beside NCCL at all
                fits[key] = 0
        us = (k["end"] - k["start"]) / 1e3
        total += us
        if fits[key] == 0:
            alone += us
            name = k["name"][:60]
            exclusive[name] = (exclusive.get(name, (0.0,))[0] + us, key)
    top = max(exclusive, key=lambda n: exclusive[n][0], default=None)
    return {"compute_us": total, "exclusive_share": alone / total if total else 0.0,
            "top_exclusive": None if top is None else dict(zip(("name", "us", "threads", "registers", "smem"),
                                                               (top, exclusive[top][0], *exclusive[top][1]),
                                                               strict=True))}


def _round_ms(torch: Any, comm: NcclBuckets | None, buckets: GradientBuckets, work: Any = None,
              stream: Any = None) -> float:
    """ms, on the GPU's clock, for every bucket's all-reduce through ``comm`` (None: none) beside
    ``work()`` (None: none) queued on torch stream ``stream``, from one start until both are done.
    The current stream first spins (where torch can: ``torch.cuda._sleep``) so that the host has
    queued every launch before the clock starts: the time is the GPU's, not the host's. Where the
    spin ended before the host was done, the round is run again with a longer one."""
    main = torch.cuda.current_stream()
    spin = getattr(torch.cuda, "_sleep", None)
    for cycles in (4_000_000, 32_000_000, 256_000_000):  # GPU clock cycles: about 2, 16 and 130 ms on the H200
        start, end, ready, spun = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True),
                                   torch.cuda.Event(), torch.cuda.Event())
        if spin is not None:
            spin(cycles)
        spun.record(main)
        start.record(main)
        ready.record(main)
        if work is not None:
            stream.wait_event(ready)
            with torch.cuda.stream(stream):
                work()
            main.wait_stream(stream)
        if comm is not None:
            for i in range(len(buckets.flats)):
                comm.launch(i, ready)
            comm.join(main)
        host_behind = spin is not None and spun.query()  # the GPU waited for the host's launches
        end.record(main)
        finish(torch)
        if not host_behind:
            return start.elapsed_time(end)
    raise ShimrtError("bench torch: the host queued a round's launches slower than a 130 ms spin on the GPU ran: "
                      "the round would time the host, not the GPU (is another process using this CPU?)")


def rounds(measure: Any, repeats: int) -> list:
    """What ``repeats`` calls of ``measure()`` gave after one that warms up (what that one gave,
    alone, when ``repeats`` is 0)."""
    repeats = validate.integer(repeats, "repeats", least=0)
    times = [measure() for _ in range(repeats + 1)]
    return times[1:] or times


def comm_alone(torch: Any, comm: NcclBuckets, buckets: GradientBuckets, repeats: int = 3) -> float:
    """ms for every bucket's all-reduce back to back, with no compute: the median of ``repeats``
    rounds after one that warms up."""
    timed = sorted(rounds(lambda: _round_ms(torch, comm, buckets), repeats))
    return timed[len(timed) // 2]


class ComputeSpans:
    """The GPU time of each step's forward and backward: an event on the current stream as the
    forward starts (:meth:`start`), another each time one of ``last`` (the parameters whose
    gradients backward computes last, the embeddings) has its gradient accumulated, the step's
    span ending at the later. Under DDP those hooks run before the reducer's end-of-backward wait
    for the all-reduces, so the span is the compute's own, slowed only by what runs beside it."""

    def __init__(self, torch: Any, last: list) -> None:
        self._torch = torch
        self._marks: list[list[Any]] = []  # [start event, end of backward, end of forward (None: not yet)] per step
        self._stream: Any = None  # the stream of the step being marked
        self._handles = [p.register_post_accumulate_grad_hook(self._end) for p in last]

    def start(self) -> None:
        """Mark a step's start (before its forward), on the current stream, where the step's end
        is marked too (the hooks run on autograd's thread, whose current stream may be another)."""
        self._stream = self._torch.cuda.current_stream()
        self._marks.append([self._event(), None, None])

    def _event(self) -> Any:
        event = self._torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def _end(self, _: Any) -> None:
        if self._marks:
            self._marks[-1][1] = self._event()

    def forward_end(self) -> None:
        """Mark the end of a step's forward (after :meth:`start`, on the step's stream)."""
        if self._marks:
            self._marks[-1][2] = self._event()

    def ms(self, last: int) -> list[float]:
        """The ``last`` steps' spans (ms; their events finished): NaN for a step whose gradients
        never came."""
        return [a.elapsed_time(b) if b is not None else float("nan") for a, b, _ in self._marks[-last:]]

    def forward_ms(self, last: int) -> list[float]:
        """The ``last`` steps' forwards (ms; their events finished): NaN where none was marked."""
        return [a.elapsed_time(f) if f is not None else float("nan") for a, _, f in self._marks[-last:]]

    def close(self) -> None:
        """Remove the hooks (the model outlives the measurement)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


def order_bound(compute_ms: float, comm_ms: float, span_ms: float, forward_ms: float) -> dict:
    """The shortest step DDP's order allows, from compute alone (``compute_ms`` a step, of which
    ``span_ms`` its forward and backward and ``forward_ms`` its forward) and the all-reduces alone
    (``comm_ms``): the all-reduces start at the earliest once the forward has ended, and the rest
    of the step after backward (the optimizer) waits for them. Its "ms" and "hideable", the share of
    the all-reduces' time that can hide at most (:func:`comm_hidden` of that step)."""
    if not all(math.isfinite(x) for x in (compute_ms, comm_ms, span_ms, forward_ms)):
        return {"ms": math.nan, "forward_ms": forward_ms, "hideable": math.nan}  # a part not measured
    rest = max(0.0, compute_ms - span_ms)
    ms = max(compute_ms, forward_ms + comm_ms + rest)
    return {"ms": ms, "forward_ms": forward_ms, "hideable": comm_hidden(compute_ms, comm_ms, ms)}


def comm_hidden(compute_ms: float, comm_ms: float, step_ms: float) -> float:
    """The share of the all-reduces' time (``comm_ms`` alone) a step of ``step_ms`` hides beside
    ``compute_ms`` of compute, clipped to 0..1; NaN for a step that was not measured (NaN)."""
    if math.isnan(step_ms):
        return float("nan")
    return max(0.0, min(1.0, (compute_ms + comm_ms - step_ms) / comm_ms))


def overlap_share(alone_ms: float, comm_ms: float, together_ms: float) -> float:
    """The share of the shorter of two pieces of work hidden when they run together: 1 when
    together takes the longer's time, 0 when it takes their sum (below 0: they slow each other
    down more than running one after the other would)."""
    for name, value in (("alone_ms", alone_ms), ("comm_ms", comm_ms), ("together_ms", together_ms)):
        validate.number(value, name, positive=True)
    return (alone_ms + comm_ms - together_ms) / min(alone_ms, comm_ms)


def contention(torch: Any, comm: NcclBuckets, buckets: GradientBuckets, stream: Any, repeats: int = 3) -> dict:
    """Every bucket's all-reduce through ``comm`` (an NcclBuckets) alone, and beside a 512 MiB
    copy and beside an 8192^3 bf16 GEMM, each repeated to about the all-reduces' time, on torch
    stream ``stream`` (a partition's, which keeps torch off the SMs left to NCCL). Per work: its count, ms
    alone, the all-reduces' ms alone, ms together (each the shortest of ``repeats`` rounds after
    one that warms up) and :func:`overlap_share`."""
    device = buckets.flats[0].device
    a = torch.ones(256 << 20, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    m = torch.ones(8192, 8192, dtype=torch.bfloat16, device=device)
    product = torch.empty_like(m)
    works = {"copy": lambda: b.copy_(a), "gemm": lambda: torch.mm(m, m, out=product)}

    def shortest(work: Any, count: int, with_comm: bool) -> float:
        def repeated() -> None:
            for _ in range(count):
                work()
        return min(rounds(lambda: _round_ms(torch, comm if with_comm else None, buckets, repeated, stream), repeats))

    comm_ms = min(rounds(lambda: _round_ms(torch, comm, buckets), repeats))
    out = {}
    for name, work in works.items():
        count = max(1, round(comm_ms / shortest(work, 1, False)))
        alone, together = shortest(work, count, False), shortest(work, count, True)
        out[name] = {"count": count, "alone_ms": alone, "comm_ms": comm_ms, "together_ms": together,
                     "overlap": overlap_share(alone, comm_ms, together)}
    return out


def timeline(dev: Device, torch: Any, trainer: Trainer, comm: NcclBuckets | None, overlap: bool) -> list:
    """[short name, start us, end us, NCCL?] of every kernel of one step."""
    with dev.record_kernels() as rec:
        trainer.step(comm, overlap)
        finish(torch)
    kernels = sorted((k for k in rec.kernels if k.get("device_id", dev.index) == dev.index), key=lambda k: k["start"])
    t0 = kernels[0]["start"] if kernels else 0
    return [[k["name"][:60], (k["start"] - t0) / 1e3, (k["end"] - t0) / 1e3, is_nccl(k["name"])]
            for k in kernels]


def interposer_cost(dev: Device, launches: int = 2000) -> dict:
    """Host us per launch the Interposer adds, measured beside the same launches without it: a
    small torch add (one block: left alone) and a large one (many blocks: padded to 2 per SM)."""
    import torch

    from ..overlap.interpose import Interposer
    out = {}
    for label, n in (("left alone", 256), ("padded", 1 << 22)):
        a = torch.ones(n, device=torch.device("cuda", dev.index))
        ip = Interposer(dev, cap=2)

        def loop(count: int, a=a) -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(count):
                a.add_(1)
            torch.cuda.synchronize()
            return time.perf_counter() - t0
        loop(20)
        with ip:  # the first block learns the kernel
            loop(20)
        plain = min(loop(launches) for _ in range(3))
        with ip:
            shaped = min(loop(launches) for _ in range(3))
        ip.close()
        out[label] = {"plain_us": plain / launches * 1e6, "interposed_us": shaped / launches * 1e6,
                      "added_us": (shaped - plain) / launches * 1e6, "padded": sum(ip.report()["padded"].values())}
    return out


def is_nccl(name: str) -> bool:
    """An NCCL kernel by its CUPTI name, mangled ("_Z32ncclDevKernel_...") or not."""
    return "ncclDevKernel" in name[:48] or "ncclKernel" in name[:48]


def finish(torch: Any) -> None:
    """Wait for the current stream (a green context's too, which a device-wide sync of torch's
    context does not cover) and then the whole device."""
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    torch.cuda.synchronize()


def allocator_mark(torch: Any, device: Any) -> tuple[int, int]:
    """torch's caching allocator on ``device`` now, for :func:`allocator_since`: its retries so far
    and the device's free memory (bytes)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0)), int(free)


def allocator_since(torch: Any, device: Any, mark: tuple[int, int]) -> dict:
    """What the caching allocator did on ``device`` since ``mark`` (:func:`allocator_mark`): its
    retries (a cudaMalloc that failed, every cached block freed and the call made again, each a
    device-wide wait: a step that runs them is slower for it, not for its policy), what it
    reserves at the end (not its peak), and the least free memory of the device's at the two ends
    (every process's, NCCL's buffers included), in bytes."""
    retries, free = allocator_mark(torch, device)
    return {"retries": retries - mark[0], "reserved": int(torch.cuda.memory_reserved(device)),
            "device_free": min(free, mark[1])}
