"""``Communicator``: one rank of an NCCL (or RCCL) communicator and its collectives.

Every collective goes one way: a row of :data:`~shimrt.nccl.collectives.COLLECTIVES` says
which NCCL function it calls and what it takes, :func:`~shimrt.nccl.collectives.nccl_count`
checks the buffers' sizes against ``buffer_counts`` (the one place the size rules live),
:meth:`Communicator.collective` packs the call, and :mod:`shimrt.nccl.group` makes it (or
queues it in an open group). The named methods (``all_reduce``, ``broadcast``, ...) only name
their row; :meth:`Communicator.prepare` packs a call once (:mod:`shimrt.nccl.prepared`).

Communicators are blocking by default (``ncclConfig_t.blocking = 1``): a call returns once NCCL
has enqueued its work, at NCCL's own speed. No wait hangs all the same: initialisation runs on
a helper thread bounded by the options' timeout, the process's watchdog
(:mod:`shimrt.nccl.watchdog`) follows every collective and aborts a communicator whose
collective outlives the timeout, :meth:`Communicator.wait` is bounded, and a failed or aborted
communicator's next use raises :class:`CollectiveError`. ``CommOptions(blocking=False)`` makes
non-blocking communicators, whose every call that answers ``ncclInProgress`` is polled within
the timeout (NCCL then starts a host thread per call: see :class:`CommOptions`).

What torch.distributed's users look for is here too: ``async_op=True`` on every collective (a
:class:`~shimrt.nccl.work.Work` to wait on), ``barrier()``, ``all_to_all`` (grouped sends and
receives, :mod:`shimrt.nccl.alltoall`), ``datetime.timedelta`` timeouts and
``torch.distributed.ReduceOp`` ops. The named methods, one per collective as torch.distributed
has them, take this module past the house's ~400 lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from typing import Any, Iterator, Sequence

import numpy as np

from .. import validate, waiting
from ..config import settings
from ..device import Device
from ..errors import CollectiveError, UsageError
from ..stream import Event, timeout_seconds
from . import alltoall, library
from .collectives import MAX_RANKS, buffers_of, count_of, datatype_of, op_of, rank_of, row_of
from .config import MIN_VERSION, CommOptions, check_shared_gpu
from .group import Queued, bounded, enqueue, group, open_calls, run, settle
from .link import link_of_process
from .prepared import PreparedCall
from .watchdog import CommState, watchdog
from .work import Work

__all__ = ["unique_id", "Communicator"]


def unique_id(lib: library.Library | None = None, *, backend: str | None = None) -> bytes:
    """A fresh ncclUniqueId (128 bytes) for rank 0 to share with the others. No GPU needed.

    The id comes from ``lib``, or else from the library of ``backend`` ("cuda": NCCL, "hip":
    RCCL), which defaults to ``SHIMRT_BACKEND`` when set and to "cuda" otherwise: a process
    without a Device has no better signal. A Device's owner should pass ``device.backend``
    (Communicator.local and footprint do).
    """
    if lib is not None and not isinstance(lib, library.Library):
        raise UsageError(f"lib must be a shimrt.nccl.library.Library (library.load()) or None, not {lib!r}")
    if lib is not None and backend is not None:
        raise UsageError(f"unique_id takes a lib or a backend, not both (lib={lib.path}, backend={backend!r})")
    lib = lib or library.load(backend if backend is not None else settings().backend or "cuda")
    uid = lib.unique_id()
    return ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid))


def _uid(value) -> library.UniqueId:
    if isinstance(value, library.UniqueId):
        return value
    if not isinstance(value, (bytes, bytearray)) or len(value) != 128:
        shown = f"{len(value)} bytes" if isinstance(value, (bytes, bytearray)) else repr(value)
        raise UsageError(f"unique_id must be the 128 bytes from shimrt.nccl.unique_id(), not {shown}")
    uid = library.UniqueId()
    ctypes.memmove(ctypes.addressof(uid), bytes(value), 128)
    return uid


_INIT_HINT = " (is every rank running?)"


class Communicator:
    """Rank ``rank`` of ``size`` on ``device``, joined through the shared ``unique_id``.

    Collectives take shimrt Buffers or any CUDA/ROCm array (torch, CuPy), infer the datatype
    and count, check the sizes before NCCL sees them, and run on ``stream`` or, by default, on
    the communicator's own stream of the device's greatest priority (``comm.stream``).
    ``state`` is what its calls and the process's watchdog share (:class:`CommState`).
    """

    def __init__(self, device: Device, unique_id: bytes, rank: int, size: int, *, options: CommOptions | None = None,
                 library_: library.Library | None = None):
        # Everything is checked before anything is made.
        size = validate.integer(size, "size", least=1, most=MAX_RANKS)
        rank = validate.integer(rank, "rank", least=0, most=size - 1)
        if options is not None and not isinstance(options, CommOptions):
            raise UsageError(f"options must be a CommOptions, not {options!r:.100}")
        uid = _uid(unique_id)
        if library_ is not None and not isinstance(library_, library.Library):
            raise UsageError(f"library_ must be a shimrt.nccl.library.Library or None, not {library_!r}")
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        self._setup(device, rank, size, options, library_ or library.load(device.backend), uid)
        box = ctypes.c_void_p()
        try:
            if self.options.blocking:  # NCCL's blocking init waits for every peer: bounded on a helper thread
                result = bounded(lambda: self._init_on(self.device, uid, box), "ncclCommInitRankConfig",
                                 self.options.timeout, _INIT_HINT)
                self.state.handle = box
                if result:
                    try:
                        self.lib.check(result, "ncclCommInitRankConfig", box)
                    finally:
                        self.abort()
            else:
                result = self._init_on(self.device, uid, box)
                self.state.handle = box
                settle([self], result, "ncclCommInitRankConfig")
        except BaseException:
            self.stream.close()
            raise
        watchdog().register(self.state)

    def _setup(self, device: Device, rank: int, size: int, options: CommOptions | None, lib: library.Library,
               uid: library.UniqueId) -> None:
        """Everything but the NCCL communicator itself (``state.handle`` stays empty until joined)."""
        self.device, self.rank, self.size, self.lib = device, rank, size, lib
        self.options = options or CommOptions()
        self._clique = bytes(uid)
        self.stream = device.stream("high")
        self._own_handle = device.stream_handle(self.stream)  # the default stream of every call: read once
        self._barrier: Any = None  # barrier()'s one element, made on its first call

        def record(event: Event, stream: Any) -> None:
            device.activate()  # the watchdog's thread has no context of its own
            event.record(stream)
        self.state = CommState(ctypes.c_void_p(), timeout=self.options.timeout, blocking=self.options.blocking,
                               new_event=lambda: device.event(timing=False), poll=self.async_error,
                               abort=lambda reason: self.abort(),
                               name=f"communicator of rank {rank}/{size} on {device!r}", own=self.stream,
                               record=record)

    def _init_on(self, device: Device, uid: library.UniqueId, box: ctypes.c_void_p) -> int:
        """ncclCommInitRankConfig (or ncclCommInitRank) into ``box``, with ``device`` current."""
        device.activate()
        if self.lib.version >= MIN_VERSION and self.lib.has("ncclCommInitRankConfig"):
            self._config = self.options.build(self.lib.version)  # kept: NCCL reads it during init
            return self.lib.comm_init(box, self.size, uid, self.rank, self._config)
        if not self.options.blocking:
            raise CollectiveError(f"NCCL {self.lib.version_text} has no ncclCommInitRankConfig: only blocking "
                                  "communicators (CommOptions(blocking=True)) can be made with it")
        return self.lib.comm_init(box, self.size, uid, self.rank)

    @classmethod
    def local(cls, devices: Sequence[Device], *, options: CommOptions | None = None) -> list["Communicator"]:
        """One communicator per device of this process (ranks in the order given), made together."""
        if not isinstance(devices, (list, tuple)) or not devices \
                or not all(isinstance(d, Device) for d in devices):
            raise UsageError(f"devices must be a non-empty list of shimrt Devices, not {devices!r}")
        if options is not None and not isinstance(options, CommOptions):
            raise UsageError(f"options must be a CommOptions, not {options!r:.100}")
        devices = list(devices)
        backends = {d.backend for d in devices}
        if len(backends) > 1:
            raise UsageError(f"local() needs devices of one backend, got {', '.join(sorted(backends))}")
        if len(devices) > 1 and (link := link_of_process()) is not None:
            raise UsageError(f"Communicator.local: this process's ranks would cross the {link} link, which gives each "
                             "rank a host of its own, and ranks of one process share the process's (NCCL_HOSTID): "
                             "run one process per rank (python -m shimrt.launch --link), or leave the link native")
        lib = library.load(devices[0].backend)
        indices = [d.index for d in devices]
        if len(set(indices)) < len(indices):
            check_shared_gpu(lib, devices[0].backend, f"Communicator.local on devices {indices}")
        uid = _uid(unique_id(lib))
        comms: list[Communicator] = []
        boxes = [ctypes.c_void_p() for _ in devices]

        def init_all() -> tuple[list[int], int]:
            # One thread holds the whole group: NCCL's group state is per thread.
            lib.group_start()
            results = []
            try:
                for c, box in zip(comms, boxes, strict=True):
                    results.append(c._init_on(c.device, uid, box))
            finally:
                end = lib.group_end()  # never leave the thread inside a group
            return results, end

        try:
            for i, d in enumerate(devices):
                c = cls.__new__(cls)
                c._setup(d, i, len(devices), options, lib, uid)
                comms.append(c)
            blocking = comms[0].options.blocking
            results, end = bounded(init_all, "ncclCommInitRankConfig (grouped)", comms[0].options.timeout,
                                   _INIT_HINT) if blocking else init_all()
            for c, box in zip(comms, boxes, strict=True):
                c.state.handle = box
            failed = next((r for r in results if r not in (0, library.IN_PROGRESS)), end)
            settle(comms, failed, "ncclCommInitRankConfig (grouped)", abort_every=True)
        except BaseException:
            for c in comms:
                c.stream.close()
            raise
        for c in comms:
            watchdog().register(c.state)
        return comms

    @property
    def handle(self) -> int:
        """The ncclComm_t as an integer, for calling NCCL directly (0 once closed or aborted)."""
        return self.state.handle.value or 0

    @property
    def unique_id(self) -> bytes:
        """The unique id every rank of this communicator joined with: equal ids, one communicator."""
        return self._clique

    # --- waiting without hanging ---
    def async_error(self) -> int:
        """NCCL's asynchronous state of the communicator (ncclCommGetAsyncError): 0, ncclInProgress
        (7) while a non-blocking call settles, or the error. CollectiveError once closed or aborted."""
        state = self.state
        with state.lock:
            handle = state.handle
            if not handle or state.error is not None:
                raise state.dead()
            return self.lib.async_error(handle)

    def wait(self, stream: Any = None, timeout: float | None = None) -> None:
        """Wait for the work on ``stream`` (default: the communicator's) for at most ``timeout``
        seconds (default: the options'); an asynchronous NCCL error or the timeout aborts the
        communicator and raises CollectiveError, as does a communicator the watchdog aborted."""
        timeout = self.options.timeout if timeout is None else timeout_seconds(timeout)
        target = self._target(stream)

        def finished() -> bool:
            if self.device.stream_query(target):
                if self.state.error is not None:  # aborted: the stream drained without the data
                    raise self.state.error
                return True
            state = self.async_error()
            if state not in (0, library.IN_PROGRESS):  # an asynchronous NCCL error: stop now
                self.abort()
                self.lib.check(state, "collective (asynchronous error)")
            return False

        if not waiting.until(finished, timeout, longest=0.01):
            self.abort()
            raise CollectiveError(f"collectives did not finish within {timeout:g} s (a peer may be gone); "
                                  "the communicator was aborted")

    # --- collectives ---
    def _target(self, stream):
        """The stream a call runs on: ``stream``, or the communicator's own when None."""
        return stream if stream is not None else self.stream

    def _queued(self, name, send, recv, op, root, peer, stream) -> Queued:
        """The call, everything checked and packed."""
        row = row_of(name)
        s, r = buffers_of(name, row, send, recv)
        datatype = datatype_of(s, name, row.buffers)
        count = count_of(name, row, s, r, self.size)
        target = self._target(stream)
        # the own stream's handle as read once; any other stream, or a closed own one (refused
        # there, as any closed stream is), through the device
        stream_handle = self._own_handle if target is self.stream and not target.closed \
            else self.device.stream_handle(target)
        handle = self.state.handle
        if not handle:
            raise self.state.dead()
        # The stream as an int: ctypes makes the cudaStream_t (c_void_p) of it in C.
        args = row.arguments(s.pointer, r.pointer, count, datatype, op_of(name, row, op),
                             rank_of(name, row, self.size, root, peer), handle, stream_handle)
        return Queued(self, target, stream_handle, row.function, args, handle, name)

    def collective(self, name: str, send: Any, recv: Any = None, *, op: Any = None, root: int | None = None,
                   peer: int | None = None, stream: Any = None, async_op: bool = False) -> Work | None:
        """Enqueue collective ``name`` (a key of :data:`COLLECTIVES`) on ``stream`` (default:
        ``comm.stream``). ``send`` is the send buffer, or the one buffer of send and recv;
        ``recv`` None runs in place where the collective allows it. ``op`` (default "sum", or a
        ``torch.distributed.ReduceOp``) only for reducing collectives, ``root`` (default 0) only
        for broadcast and reduce, ``peer`` for send and recv. Everything is checked before NCCL
        sees it; inside :func:`group` the call is queued for the group. ``async_op``: return a
        :class:`~shimrt.nccl.work.Work` to wait on (outside a group)."""
        if async_op is not False:
            async_op = validate.boolean(async_op, "async_op")
        q = self._queued(name, send, recv, op, root, peer, stream)
        calls = open_calls()
        if calls is not None:
            if async_op:
                raise UsageError(f"{name}: async_op=True outside a group only (a group's calls are made at its end; "
                                 "wait on the streams after it)")
            enqueue(calls, q)
            return None
        run(q)
        return self._work(q.stream, name, send if recv is None else recv) if async_op else None

    def _work(self, stream: Any, what: str, output: Any = None) -> Work:
        return Work(self, self.device.event(timing=False).record(stream), stream, what, output)

    def prepare(self, name: str, send: Any, recv: Any = None, *, op: Any = None, root: int | None = None,
                peer: int | None = None, stream: Any = None) -> PreparedCall:
        """:meth:`collective`'s arguments checked and packed once: a function of no arguments
        (a :class:`~shimrt.nccl.prepared.PreparedCall`) that makes the call (queued inside
        :func:`group`), for a collective repeated on the same buffers, as a training loop does.
        Each call still refuses a closed or aborted communicator, a closed shimrt Stream and a
        freed shimrt Buffer; other arrays (torch, CuPy) must outlive the function, as they must
        outlive any collective on them."""
        q = self._queued(name, send, recv, op, root, peer, stream)
        return PreparedCall(q, [send, recv], q.stream)

    def all_reduce(self, send: Any, recv: Any = None, *, op: Any = "sum", stream: Any = None,
                   async_op: bool = False) -> Work | None:
        """recv = op over all ranks of send (in place when recv is None)."""
        return self.collective("all_reduce", send, recv, op=op, stream=stream, async_op=async_op)

    def broadcast(self, send: Any, recv: Any = None, *, root: int = 0, stream: Any = None,
                  async_op: bool = False) -> Work | None:
        """recv on every rank = send of ``root`` (in place when recv is None)."""
        return self.collective("broadcast", send, recv, root=root, stream=stream, async_op=async_op)

    def reduce(self, send: Any, recv: Any = None, *, op: Any = "sum", root: int = 0, stream: Any = None,
               async_op: bool = False) -> Work | None:
        """recv on ``root`` = op over all ranks of send (in place when recv is None)."""
        return self.collective("reduce", send, recv, op=op, root=root, stream=stream, async_op=async_op)

    def all_gather(self, send: Any, recv: Any, *, stream: Any = None, async_op: bool = False) -> Work | None:
        """recv = the send buffers of ranks 0..size-1, one after the other."""
        return self.collective("all_gather", send, recv, stream=stream, async_op=async_op)

    def reduce_scatter(self, send: Any, recv: Any, *, op: Any = "sum", stream: Any = None,
                       async_op: bool = False) -> Work | None:
        """recv on rank i = op over all ranks of block i of send (size blocks of recv's count)."""
        return self.collective("reduce_scatter", send, recv, op=op, stream=stream, async_op=async_op)

    def send(self, buf: Any, peer: int, *, stream: Any = None, async_op: bool = False) -> Work | None:
        """Send buf to ``peer`` (pair with its recv, inside :meth:`group` for exchanges)."""
        return self.collective("send", buf, peer=peer, stream=stream, async_op=async_op)

    def recv(self, buf: Any, peer: int, *, stream: Any = None, async_op: bool = False) -> Work | None:
        """Receive into buf from ``peer``."""
        return self.collective("recv", buf, peer=peer, stream=stream, async_op=async_op)

    def all_to_all(self, send: Any, recv: Any, *, stream: Any = None, async_op: bool = False) -> Work | None:
        """Block j of ``send`` (its count / size elements) goes to rank j, whose block i of
        ``recv`` it fills (i: this rank), for every pair at once: NCCL sends and receives in one
        group, as torch.distributed's all_to_all_single does. Equal counts, a multiple of size."""
        async_op = validate.boolean(async_op, "async_op")
        calls = alltoall.block_calls(self, send, recv, stream)
        outer = open_calls()
        if outer is not None:
            if async_op:
                raise UsageError("all_to_all: async_op=True outside a group only (a group's calls are made at its end)")
            for q in calls:
                enqueue(outer, q)
            return None
        with group(self):
            inner = open_calls()
            for q in calls:
                enqueue(inner if inner is not None else [], q)
        return self._work(calls[0].stream, "all_to_all", recv) if async_op else None

    def barrier(self, timeout: Any = None) -> None:
        """Return once every rank has called it: a one-element all-reduce the host waits for, at
        most ``timeout`` seconds (a number or a ``datetime.timedelta``; default the options'),
        as torch.distributed.barrier. CollectiveError, the communicator aborted, when a peer
        does not come."""
        if self._barrier is None:
            self._barrier = self.device.empty((1,), np.float32)
        if open_calls() is not None:
            raise UsageError("barrier() waits for the other ranks: call it outside a group")
        self.all_reduce(self._barrier)
        self._work(self.stream, "barrier").wait(timeout=timeout)

    @contextlib.contextmanager
    def group(self) -> Iterator[Communicator]:
        """``with comm.group():`` fuses the calls inside into one NCCL launch (ncclGroupStart/End);
        :func:`group` groups calls of several communicators."""
        with group(self):
            yield self

    # --- lifetime ---
    def abort(self) -> None:
        """Free the communicator without waiting for peers (after an error or a timeout). NCCL's
        abort joins its own threads; one stuck inside the driver would hold it for good, so it
        runs on a helper thread and CollectiveError says so after the options' timeout."""
        handle = self.state.take_handle(ctypes.c_void_p())
        watchdog().unregister(self.state)
        if handle is not None:
            lib = self.lib
            try:
                bounded(lambda: lib.comm_abort(handle), "ncclCommAbort", self.options.timeout)
            finally:
                # A stuck call aborted from the watchdog holds the lock until it returns: do not wait for good.
                if self.state.lock.acquire(timeout=1.0):
                    try:
                        self.state.release()
                    finally:
                        self.state.lock.release()

    def close(self) -> None:
        """Destroy the communicator once its collectives have finished, and its stream. When they
        do not finish within the timeout the communicator is aborted and CollectiveError says so."""
        state = self.state
        try:
            if state.handle:
                def drained() -> bool:
                    with state.lock:
                        state.flush(time.monotonic())
                        state.reap()
                        return not state.pending
                try:
                    done = waiting.until(drained, self.options.timeout, longest=0.01)
                except CollectiveError:  # an event that cannot be queried: abort rather than wait on it
                    done = False
                if not done:
                    self.abort()
                    raise CollectiveError(f"close: collectives still running after {self.options.timeout:g} s "
                                          "(a peer may be gone); the communicator was aborted")
                with state.lock:
                    handle = state.take_handle(ctypes.c_void_p())
                    state.release()
                watchdog().unregister(state)
                if handle is not None:
                    lib = self.lib
                    result = bounded(lambda: lib.comm_destroy(handle), "ncclCommDestroy", self.options.timeout)
                    if result != library.IN_PROGRESS:  # a non-blocking destroy finishes on its own
                        lib.check(result, "ncclCommDestroy")
        finally:
            self.stream.close()
            if self._barrier is not None:
                self._barrier.free()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            try:
                self.abort()
            finally:
                self.stream.close()

    def __repr__(self) -> str:
        return f"<shimrt Communicator rank {self.rank}/{self.size} on {self.device!r}, NCCL {self.lib.version_text}>"
