"""One data-parallel training step whose gradient all-reduces overlap backward, under a policy
(:class:`~shimrt.torch.policies.Policy`, whose home is :mod:`shimrt.torch.policies`).

- :class:`GradientBuckets`: the parameters' gradients as views of flat buckets (as DDP's
  ``gradient_as_bucket_view``), in the order backward produces them, zeroed each step; every
  bucket's views are checked before its all-reduce (torch's default ``zero_grad()`` sets
  ``.grad`` to None, and backward then writes a new tensor the all-reduce would never see).
- :class:`NcclBuckets`: a bucket's all-reduce over this process's ranks (shimrt
  Communicators), launched on its own streams once torch's compute stream reaches the bucket's
  event. Ranks other than the first, where one process holds several (two ranks on one GPU),
  are peers that add zeros, so rank 0's gradients come out bit for bit as they went in.

Buckets and their all-reduces live together: each is the other's one user (bench torch's
:class:`~shimrt.bench.torch_trainer.Trainer` drives them); a policy's compute side is
:func:`shimrt.torch.resources.compute_context`, here as under DDP and FSDP2.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

from .. import nccl, validate
from ..errors import UsageError
from ..stream import PRIORITIES
from .interop import stream as torch_stream

__all__ = ["GradientBuckets", "NcclBuckets"]


class GradientBuckets:
    """Every parameter's ``.grad`` as a view of a flat bucket of at most ``bucket_bytes`` (one
    parameter larger than that gets a bucket of its own), filled in reverse registration order,
    the order backward produces gradients in.

    The views hold only while nothing replaces ``.grad``: ``optimizer.zero_grad()`` (torch's
    default, ``set_to_none=True``) drops them, and the next backward writes new tensors that a
    bucket's all-reduce would miss, reducing the previous step's gradients instead. Zero with
    :meth:`zero` or ``zero_grad(set_to_none=False)``, or call :meth:`attach` after
    ``zero_grad()``; :meth:`check_bucket` (run before every bucket's all-reduce by
    :class:`NcclBuckets`) and :meth:`check_views` refuse what no longer holds."""

    def __init__(self, model: Any, bucket_bytes: int):
        import torch
        bucket_bytes = validate.integer(bucket_bytes, "bucket_bytes", least=1)
        if not callable(getattr(model, "named_parameters", None)):
            raise UsageError(f"model must be a torch.nn.Module, not {validate.shown(model)}")
        names = {p: name for name, p in model.named_parameters()}
        params = [p for p in names if p.requires_grad][::-1]
        if not params:
            raise UsageError(f"model must have a parameter with requires_grad=True (a gradient to all-reduce), "
                             f"not none of its {len(names)} parameters")
        groups: list[list[Any]] = [[]]
        size = 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if groups[-1] and (size + nbytes > bucket_bytes or p.dtype != groups[-1][0].dtype):
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        self.flats, self.bucket_of, self.counts = [], {}, []
        self.views: dict = {}  # parameter -> its view of a bucket, what .grad must be
        self._expected: list[list[tuple[Any, int]]] = []  # per bucket: (parameter, its view's address)
        for i, group in enumerate(groups):
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
            offset = 0
            for p in group:
                view = flat[offset:offset + p.numel()].view_as(p)
                self.views[p] = p.grad = view
                self.bucket_of[p] = i
                offset += p.numel()
            self.flats.append(flat)
            self.counts.append(len(group))
            self._expected.append([(p, self.views[p].data_ptr()) for p in group])
        self.params = params
        self._names = names

    @property
    def nbytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.flats)

    def check_bucket(self, index: int) -> None:
        """UsageError unless every parameter of bucket ``index`` still has its view of the bucket
        as ``.grad`` (one attribute and one address per parameter: cheap enough for every step)."""
        for p, address in self._expected[index]:
            grad = p.grad
            if grad is None or grad.data_ptr() != address:
                now = "None" if grad is None else "a tensor of its own"
                raise UsageError(
                    f"the .grad of parameter {self._names.get(p, '?')!r} must be its view of gradient bucket "
                    f"{index}, not {now}: the all-reduce would miss this step's gradients. Zero with "
                    "optimizer.zero_grad(set_to_none=False) (torch's default sets .grad to None) or "
                    "GradientBuckets.zero(), or call GradientBuckets.attach() after zero_grad(); and no "
                    "backward(create_graph=True)")

    def check_views(self) -> None:
        """:meth:`check_bucket` of every bucket."""
        for i in range(len(self.flats)):
            self.check_bucket(i)

    def attach(self) -> None:
        """Make every parameter's ``.grad`` its view of a bucket again (after ``zero_grad()`` set
        them to None, say); the buckets keep their values (:meth:`zero` clears them)."""
        for p, view in self.views.items():
            p.grad = view

    def zero(self) -> None:
        for f in self.flats:
            f.zero_()

    def copy(self) -> list:
        return [f.clone() for f in self.flats]


class NcclBuckets:
    """All-reduces (sum) of each bucket of ``buckets`` over ``comms`` (this process's ranks, from
    ``Communicator.local`` or one rank per process), on one stream per rank at ``priority``.
    Calls are checked and packed once (:meth:`Communicator.prepare`, :func:`nccl.prepare_group`).
    ``beside``: a function giving a context manager that holds while all-reduces run: entered at
    the first :meth:`launch` after a :meth:`join`, left at the next :meth:`join` (for example
    ``shimrt.torch.resources.Window(48).held``: cuBLAS leaves NCCL its SMs only then)."""

    def __init__(self, comms: list, buckets: GradientBuckets, priority: str = "high",
                 beside: Callable[[], ContextManager[Any]] | None = None):
        validate.one_of(priority, "priority", PRIORITIES)
        if beside is not None and not callable(beside):
            raise UsageError(f"beside must be a function giving a context manager, or None, not {beside!r:.100}")
        if not isinstance(comms, (list, tuple)) or not comms \
                or not all(isinstance(c, nccl.Communicator) for c in comms):
            raise UsageError(f"comms must be a non-empty list of Communicators, not {comms!r:.100}")
        if not isinstance(buckets, GradientBuckets):
            raise UsageError(f"buckets must be a GradientBuckets, not {buckets!r:.100}")
        if comms[0].device.index != buckets.flats[0].device.index:
            raise UsageError(f"the first communicator (rank 0's) must be on the gradients' GPU, "
                             f"{buckets.flats[0].device}, not GPU {comms[0].device.index}")
        import torch
        self.comms, self.priority, self.beside = list(comms), priority, beside
        self.buckets = buckets
        self._held = contextlib.ExitStack()
        self._running = False
        self.flats = buckets.flats  # the prepared calls hold their pointers: keep them alive
        self.streams: list = []
        try:
            self._prepare(torch, buckets)
        except BaseException:  # what was made so far goes with the failure
            for s in self.streams:
                s.close()
            raise

    def _prepare(self, torch: Any, buckets: GradientBuckets) -> None:
        for c in self.comms:
            self.streams.append(c.device.stream(self.priority))
        self.torch_streams = [torch_stream(s) for s in self.streams]
        largest = max(f.numel() for f in buckets.flats)
        dtype = buckets.flats[0].dtype
        devices = [torch.device("cuda", c.device.index) for c in self.comms]
        # Peers send zeros (never written) and receive into scratch, each on its own GPU (one rank
        # per GPU, or several on one): rank 0's sum is its own gradient.
        #: per peer rank: (the zeros it sends, where it receives each bucket's sum)
        self.peers = [(torch.zeros(largest, dtype=dtype, device=d), torch.empty(largest, dtype=dtype, device=d))
                      for d in devices[1:]]
        self._views: list = []
        self.calls = []  # per bucket: one function making every rank's call (a group of them)
        for flat in buckets.flats:
            n = flat.numel()
            calls = [self.comms[0].prepare("all_reduce", flat, stream=self.streams[0])]
            for c, s, (zeros, scratch) in zip(self.comms[1:], self.streams[1:], self.peers, strict=True):
                send, recv = zeros[:n], scratch[:n]
                self._views.append((send, recv))  # prepared calls hold their pointers: keep them alive
                calls.append(c.prepare("all_reduce", send, recv, stream=s))
            self.calls.append(calls[0] if len(calls) == 1 else nccl.prepare_group(*calls))
        for d in set(devices):  # the zeros are written before NCCL's streams read them
            torch.cuda.synchronize(d)

    def launch(self, index: int, ready: Any) -> None:
        """Bucket ``index``'s all-reduce, once every rank's stream has reached event ``ready``;
        UsageError, before anything is launched, where a parameter's ``.grad`` is no longer its
        view of the bucket (:meth:`GradientBuckets.check_bucket`)."""
        self.buckets.check_bucket(index)
        if not self._running and self.beside is not None:
            self._held.enter_context(self.beside())
        self._running = True
        for ts in self.torch_streams:
            ts.wait_event(ready)
        self.calls[index]()

    def join(self, stream: Any) -> None:
        """Torch stream ``stream`` waits for every all-reduce launched so far (work queued on it
        after this no longer runs beside them: ``beside``'s context is left)."""
        self.release()
        for ts in self.torch_streams:
            stream.wait_stream(ts)

    def release(self) -> None:
        """Leave ``beside``'s context if it is held (a step that failed before its join)."""
        self._running = False
        self._held.close()

    def close(self, timeout: float = 120.0) -> None:
        """Wait (at most ``timeout`` s per stream: ShimrtError says a collective is stuck) and close."""
        self.release()
        for s in self.streams:
            s.synchronize(timeout)
            s.close()
        self.calls = []
