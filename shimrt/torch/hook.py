"""The comm hook's hot path: one DDP bucket's all-reduce through a shimrt Communicator on a
policy's stream, handed back to DDP as a CUDA future; and the host time it and ``ov.step()`` take.

Per bucket, DDP's reducer calls the hook with the GIL taken, and takes it again to read the
future's tensor; completing a CUDA future with a Python value makes torch find its tensors by
pickling it. None of that exists without a hook, so a :class:`Lane` keeps its own part small: the
bucket's all-reduce is packed once per bucket (a prepared call, re-packed when DDP rebuilds its
buckets), the compute stream's progress is handed over by one reused event (record, wait) rather
than a new one per bucket, and the future is completed with the lane's stream made current by
``torch.cuda.set_stream`` rather than a stream context. :class:`HostCost` counts what the hook
and the step's own entry and exit take, per policy, for ``ov.report()``.
"""

from __future__ import annotations

import time
from typing import Any

#: The clock of the counts (nanoseconds, the host's).
now = time.perf_counter_ns


class Lane:
    """The all-reduces of the policies sharing a communicator and a stream priority: ``comm``
    (a Communicator over the DDP's ranks), ``stream`` (a shimrt Stream; the communicator's own or
    one the lane owns: ``owned``), ``size`` (the ranks, for the average) and ``index`` (the GPU)."""

    def __init__(self, torch: Any, comm: Any, stream: Any, *, owned: bool, size: int, index: int):
        from .interop import stream as torch_stream
        self.torch, self.comm, self.stream, self.owned, self.size = torch, comm, stream, owned, size
        self.device = torch.device("cuda", index)
        self.torch_stream = torch_stream(stream)
        self.event = torch.cuda.Event()
        self._calls: dict[int, tuple[int, int, Any, bool]] = {}  # bucket index -> (address, numel, call, prescale)

    def exact_average(self, buf: Any) -> bool:
        """Whether ncclAvg averages ``buf`` as DDP does: it scales by 1/size in the buffer's own
        type (NCCL's hostToDevRedOp), which for 16-bit floats equals DDP's float scaling only
        when 1/size is a power of two."""
        return buf.element_size() >= 4 or self.size & (self.size - 1) == 0

    def _prepare(self, index: int, buf: Any) -> tuple[int, int, Any, bool]:
        from ..errors import UsageError
        if buf.is_sparse:
            raise UsageError("shimrt.torch.overlap takes dense gradients only (a sparse embedding's bucket came)")
        exact = self.exact_average(buf)
        # Not exact: as DDP, times 1/size in float, rounded once (before the call), then summed.
        call = self.comm.prepare("all_reduce", buf, op="avg" if exact else "sum", stream=self.stream)
        entry = (buf.data_ptr(), buf.numel(), call, not exact)
        self._calls[index] = entry
        return entry

    def all_reduce(self, bucket: Any) -> Any:
        """DDP bucket ``bucket``'s average over the ranks, launched on the lane's stream once the
        current stream has reached this point, as a future completed on the lane's stream (DDP's
        end of backward waits for it on the GPU, never the host)."""
        torch = self.torch
        buf = bucket.buffer()
        index = bucket.index()
        entry = self._calls.get(index)
        if entry is None or entry[0] != buf.data_ptr() or entry[1] != buf.numel():
            entry = self._prepare(index, buf)  # the first step, or DDP rebuilt its buckets
        current = torch.cuda.current_stream(self.device)
        self.event.record(current)
        ts = self.torch_stream
        ts.wait_event(self.event)
        future = torch.futures.Future(devices=[self.device])
        torch.cuda.set_stream(ts)
        try:
            if entry[3]:
                buf.mul_(1.0 / self.size)
            entry[2]()
            future.set_result(buf)
        finally:
            torch.cuda.set_stream(current)
        return future

    def forget(self) -> None:
        """Drop the prepared calls (they hold the buckets they were packed for)."""
        self._calls.clear()

    def close(self) -> None:
        """Close the lane's own stream (not the communicator, nor its stream)."""
        self._calls.clear()
        if self.owned:
            self.stream.close()


class HostCost:
    """Host time per policy, in nanoseconds: the hook per bucket, ``ov.step()``'s own work at
    its entry and exit per step. ``counters(name)`` is a list the hot paths add to in place:
    [hook ns, buckets, step ns, steps]."""

    def __init__(self) -> None:
        self.by_policy: dict[str, list[int]] = {}

    def counters(self, name: str) -> list[int]:
        found = self.by_policy.get(name)
        if found is None:
            found = self.by_policy[name] = [0, 0, 0, 0]
        return found

    def report(self) -> dict[str, dict[str, float | None]]:
        """Per policy: the hook's mean host microseconds per bucket, buckets per step, and
        ``ov.step()``'s own microseconds per step (entry and exit, the user's block not counted)."""
        out: dict[str, dict[str, float | None]] = {}
        for name, (hook_ns, buckets, step_ns, steps) in self.by_policy.items():
            out[name] = {"hook_us_per_bucket": hook_ns / buckets / 1e3 if buckets else None,
                         "buckets_per_step": buckets / steps if steps else None,
                         "hook_us_per_step": hook_ns / steps / 1e3 if steps else None,
                         "step_us": step_ns / steps / 1e3 if steps else None}
        return out

