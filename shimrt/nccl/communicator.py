"""``Communicator``: one rank of an NCCL (or RCCL) communicator, its collectives, and no hangs.

Every collective goes one way: a row of :data:`~shimrt.nccl.collectives.COLLECTIVES` says
which NCCL function it calls and what it takes, :func:`~shimrt.nccl.collectives.nccl_count`
checks the buffers' sizes against ``buffer_counts`` (the one place the size rules live), and
:meth:`Communicator.collective` makes the call. The named methods (``all_reduce``,
``broadcast``, ...) only name their row.

By default communicators are non-blocking (``ncclConfig_t.blocking = 0``): every call that
answers ``ncclInProgress`` is polled with ``ncclCommGetAsyncError`` for at most the options'
timeout, and :meth:`Communicator.wait` bounds the wait for the collectives themselves. When
the time runs out the communicator is aborted (``ncclCommAbort``) and a
:class:`CollectiveError` says what did not finish.

:func:`group` queues the calls of several communicators and hands them to NCCL together;
:func:`prepare_group` makes prepared calls (:meth:`Communicator.prepare`) a group once. The
module is longer than the project's ~400 lines because groups, settling and aborting work on
each communicator's handle, state poll and queued calls: split apart, those internals would be
reached across modules.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Any

from .. import validate, waiting
from ..config import settings
from ..device import Device
from ..errors import CollectiveError, UsageError
from ..stream import timeout_seconds
from . import library
from .collectives import MAX_RANKS, buffers_of, datatype_of, nccl_count, op_of, rank_of, row_of
from .config import MIN_VERSION, CommOptions, check_shared_gpu

# The open group of this thread (see group()): ``calls`` is None outside one.
_GROUP = threading.local()


class _Stand:
    """What a prepared call checks where there is no shimrt object to check: always live."""
    device_pointer, closed = 1, False


_ALWAYS = _NEVER_CLOSED = _Stand()


class _AllOf:
    """Views and their bases, checked together: no pointer once any of them is freed."""

    def __init__(self, buffers: list) -> None:
        self.buffers = buffers

    @property
    def device_pointer(self) -> int | None:
        return None if any(b.device_pointer is None for b in self.buffers) else 1


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
    uid = library.UniqueId()
    lib.check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
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


def _bounded(call: Any, name: str, timeout: float) -> None:
    """Run ``call`` (a ctypes call, which lets go of the GIL) on a daemon thread for at most
    ``timeout`` seconds: NCCL's teardown waits for its threads, and this process must not."""
    worker = threading.Thread(target=call, name=f"shimrt {name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CollectiveError(f"{name} did not return within {timeout} s: one of NCCL's threads is stuck "
                              "(the process cannot reuse this GPU's NCCL state safely; exit and start again)")


def _abort_all(comms: list["Communicator"]) -> CollectiveError | None:
    """Abort every communicator of ``comms``, each whatever the others do; the first error
    (an abort that did not return in time), or None."""
    first = None
    for c in comms:
        try:
            c.abort()
        except CollectiveError as exc:
            first = first or exc
    return first


def _settle(comms: list["Communicator"], result: int, call: str, *, abort_all: bool = False) -> None:
    """Finish ``call``, which answered ``result`` for every communicator of ``comms``: nothing
    when it succeeded, CollectiveError when it failed, and when it answered ncclInProgress
    (a non-blocking communicator, or a group of them) poll each one's ncclCommGetAsyncError
    until none is in progress or one reports an error, for at most their longest timeout.
    Stuck communicators are aborted; ``abort_all`` (a grouped init, whose members are useless
    alone) aborts every member on any error."""
    if result == 0:
        return
    lib = comms[0].lib
    if result != library.IN_PROGRESS:
        try:
            lib.check(result, call, comms[0]._handle if len(comms) == 1 else None)
        finally:
            if abort_all:
                _abort_all(comms)
    states = dict.fromkeys(range(len(comms)), library.IN_PROGRESS)

    def settled() -> bool:
        for i, c in enumerate(comms):
            if states[i] == library.IN_PROGRESS:
                states[i] = c._state()
                if states[i] not in (0, library.IN_PROGRESS):
                    return True  # an error: no use waiting for the others
        return all(v != library.IN_PROGRESS for v in states.values())

    timeout = max(c.options.timeout for c in comms)
    # Spin for a millisecond first: a launch NCCL finishes on its own thread settles in tens of
    # microseconds, less than one sleep takes.
    if not waiting.until(settled, timeout, first=1e-4, longest=0.01, spin=1e-3):
        _abort_all(comms)
        raise CollectiveError(f"{call} did not complete within {timeout} s (is every rank running?); "
                              f"the communicator{'s were' if len(comms) > 1 else ' was'} aborted")
    failed = [(i, v) for i, v in states.items() if v not in (0, library.IN_PROGRESS)]
    if failed:
        i, state = failed[0]
        handle = comms[i]._handle
        stuck = [c for j, c in enumerate(comms) if abort_all or states[j] == library.IN_PROGRESS]
        try:
            lib.check(state, call, handle)
        finally:
            _abort_all(stuck)  # those still in progress would never finish


@contextlib.contextmanager
def group(*comms: "Communicator") -> Any:
    """``with group(c0, c1):`` fuses the collectives inside, on any communicators (each rank of
    this process, for one), into one NCCL launch. Several ranks in one thread must be grouped: a
    lone collective of one rank waits for the others for good.

    The calls are checked as they are made and handed to NCCL together when the block ends
    (ncclGroupStart, the calls, ncclGroupEnd), so a refused call (two ranks of one communicator
    on one stream, which would wait for each other for good) or an exception in the block leaves
    NCCL untouched. When NCCL answers ncclInProgress (non-blocking communicators), every
    communicator of the group is polled until it settles, within the timeout. Groups nest: the
    outermost one hands the calls over."""
    if not comms or not all(isinstance(c, Communicator) for c in comms):
        raise UsageError(f"group() takes one or more shimrt.nccl.Communicators, not {comms!r:.200}")
    outer = getattr(_GROUP, "calls", None)
    if outer is not None:  # nested: the outer group makes the calls, without this one's on an error
        mark = len(outer)
        try:
            yield comms
        except BaseException:
            del outer[mark:]
            raise
        return
    _GROUP.calls = []
    try:
        yield comms
        calls = _GROUP.calls
    finally:
        _GROUP.calls = None
    _issue(list(comms), calls)


def prepare_group(*calls: Any) -> Any:
    """Calls made by :meth:`Communicator.prepare` (one per rank of this process, say) as one
    group, checked once: a function of no arguments that refuses what each call refuses (a
    closed communicator or stream, a freed Buffer), then hands them to NCCL between
    ncclGroupStart and ncclGroupEnd and polls non-blocking communicators, as :func:`group`
    does. Inside an open :func:`group` its calls join that group."""
    if not calls or not all(callable(c) and hasattr(c, "queued") for c in calls):
        raise UsageError(f"prepare_group() takes functions made by Communicator.prepare, not {calls!r:.200}")
    queued = [c.queued for c in calls]
    for i, (comm, handle, *_) in enumerate(queued):
        _refuse_shared_stream("prepare_group()", comm, handle, queued[:i])
    members, lib = _members([comm for comm, *_ in queued])
    resolved = [(comm, getattr(lib, function), function, args) for comm, _, function, args in queued]
    checks = [c.live for c in calls]

    def grouped() -> None:
        for check, call in zip(checks, calls, strict=True):
            if not check():
                call.refuse()
        outer = getattr(_GROUP, "calls", None)
        if outer is not None:
            outer.extend(queued)
            return
        _run_group(lib, members, resolved)
    return grouped


def _refuse_shared_stream(what: str, comm: "Communicator", handle: int, earlier: list) -> None:
    """UsageError when ``comm``'s call on stream ``handle`` would share it with another rank's
    call of the same communicator among ``earlier`` (queued calls): in one group, two ranks on
    one stream wait for each other for good."""
    for other, other_handle, *_ in earlier:
        if other._clique == comm._clique and other.rank != comm.rank and other_handle == handle:
            raise UsageError(f"{what} of rank {comm.rank} on the stream of rank {other.rank}'s call in the same "
                             "group: two ranks of one communicator need a stream each (two ranks of one "
                             "communicator on one stream wait for each other for good); pass each rank its own, "
                             "e.g. its comm.stream")


def _members(comms: list["Communicator"]) -> tuple[list["Communicator"], library.Library]:
    """The distinct communicators of a group, in order, and their one NCCL library."""
    members = list(dict.fromkeys(comms))
    lib = members[0].lib
    if any(c.lib is not lib for c in members):
        raise UsageError("a group takes communicators of one NCCL library")
    return members, lib


def _run_group(lib: library.Library, members: list["Communicator"], calls: list) -> None:
    """``calls`` ((communicator, C function, its name, arguments)) between ncclGroupStart and
    ncclGroupEnd, then settled over ``members``."""
    lib.check(lib.ncclGroupStart(), "ncclGroupStart")
    failed = None
    try:
        for comm, function, name, args in calls:
            result = function(*args)
            if result not in (0, library.IN_PROGRESS) and failed is None:
                failed = (result, name, comm)
    finally:
        end = lib.ncclGroupEnd()  # a group is always closed, even after a failed call
    if failed is not None:
        lib.check(failed[0], f"{failed[1]} (in a group)", failed[2]._handle)
    _settle(members, end, "ncclGroupEnd")


def _issue(listed: list["Communicator"], calls: list) -> None:
    """Hand a group's calls to NCCL between ncclGroupStart and ncclGroupEnd, and settle them."""
    members, lib = _members([*listed, *(c for c, *_ in calls)])
    _run_group(lib, members, [(comm, getattr(lib, function), function, args) for comm, _, function, args in calls])


class Communicator:
    """Rank ``rank`` of ``size`` on ``device``, joined through the shared ``unique_id``.

    Collectives take shimrt Buffers or any CUDA/ROCm array (torch, CuPy), infer the datatype
    and count, check the sizes before NCCL sees them, and run on ``stream`` or, by default, on
    the communicator's own stream of the device's greatest priority (``comm.stream``).
    """

    def __init__(self, device: Any, unique_id: bytes, rank: int, size: int, *, options: CommOptions | None = None,
                 library_: library.Library | None = None, _handle: Any = None):
        # Everything is checked before anything is made.
        size = validate.integer(size, "size", least=1, most=MAX_RANKS)
        rank = validate.integer(rank, "rank", least=0, most=size - 1)
        if options is not None and not isinstance(options, CommOptions):
            raise UsageError(f"options must be a CommOptions, not {options!r:.100}")
        uid = _uid(unique_id) if _handle is None else None
        self._clique = bytes(uid) if uid is not None else b""
        if library_ is not None and not isinstance(library_, library.Library):
            raise UsageError(f"library_ must be a shimrt.nccl.library.Library or None, not {library_!r}")
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        self.device, self.rank, self.size = device, rank, size
        self.options = options or CommOptions()
        self.lib = library_ or library.load(device.backend)
        self._handle = _handle if _handle is not None else ctypes.c_void_p()
        self.stream = device.stream("high")
        if _handle is None:
            try:
                device.activate()
                self._poll(self._init_call(uid), "ncclCommInitRankConfig")
            except BaseException:
                self.stream.close()
                raise

    def _init_call(self, uid) -> int:
        if self.lib.version >= MIN_VERSION and self.lib.has("ncclCommInitRankConfig"):
            self._config = self.options.build(self.lib.version)
            return self.lib.ncclCommInitRankConfig(ctypes.byref(self._handle), self.size, uid, self.rank,
                                                   ctypes.byref(self._config))
        if not self.options.blocking:
            raise CollectiveError(f"NCCL {self.lib.version_text} has no ncclCommInitRankConfig: only blocking "
                                  "communicators (CommOptions(blocking=True)) can be made with it")
        return self.lib.ncclCommInitRank(ctypes.byref(self._handle), self.size, uid, self.rank)

    @classmethod
    def local(cls, devices: Any, *, options: CommOptions | None = None) -> list["Communicator"]:
        """One communicator per device of this process (ranks in the order given), made together."""
        if not isinstance(devices, (list, tuple)) or not devices \
                or not all(isinstance(d, Device) for d in devices):
            raise UsageError(f"devices must be a non-empty list of shimrt Devices, not {devices!r}")
        devices = list(devices)
        backends = {d.backend for d in devices}
        if len(backends) > 1:
            raise UsageError(f"local() needs devices of one backend, got {', '.join(sorted(backends))}")
        lib = library.load(devices[0].backend)
        indices = [d.index for d in devices]
        if len(set(indices)) < len(indices):
            check_shared_gpu(lib, devices[0].backend, f"Communicator.local on devices {indices}")
        uid = _uid(unique_id(lib))
        comms = [cls(d, b"", i, len(devices), options=options, library_=lib, _handle=ctypes.c_void_p())
                 for i, d in enumerate(devices)]
        for c in comms:
            c._clique = bytes(uid)
        lib.check(lib.ncclGroupStart(), "ncclGroupStart")
        results = []
        try:
            for c in comms:
                c.device.activate()
                results.append(c._init_call(uid))
        except BaseException:
            lib.ncclGroupEnd()  # never leave this thread inside a group
            _abort_all(comms)
            for c in comms:
                c.stream.close()
            raise
        end = lib.ncclGroupEnd()
        failed = next((r for r in results if r not in (0, library.IN_PROGRESS)), end)
        _settle(comms, failed, "ncclCommInitRankConfig (grouped)", abort_all=True)
        return comms

    @property
    def handle(self) -> int:
        """The ncclComm_t as an integer, for calling NCCL directly (0 once closed or aborted)."""
        return self._handle.value or 0

    @property
    def unique_id(self) -> bytes:
        """The unique id every rank of this communicator joined with: equal ids, one communicator."""
        return self._clique

    # --- waiting without hanging ---
    def _state(self) -> int:
        state = ctypes.c_int()
        handle = self._live()
        self.lib.check(self.lib.ncclCommGetAsyncError(handle, ctypes.byref(state)), "ncclCommGetAsyncError", handle)
        return state.value

    def _poll(self, result: int, call: str) -> None:
        """Finish a call that may answer ncclInProgress, within the timeout."""
        if result != 0:
            _settle([self], result, call)

    def wait(self, stream: Any = None, timeout: float | None = None) -> None:
        """Wait for the work on ``stream`` (default: the communicator's) for at most ``timeout``
        seconds (default: the options'); an asynchronous NCCL error or the timeout aborts the
        communicator and raises CollectiveError."""
        timeout = self.options.timeout if timeout is None else timeout_seconds(timeout)
        target = self._target(stream)

        def finished() -> bool:
            if self.device.stream_query(target):
                return True
            state = self._state()
            if state not in (0, library.IN_PROGRESS):  # an asynchronous NCCL error: stop now
                self.abort()
                self.lib.check(state, "collective (asynchronous error)")
            return False

        if not waiting.until(finished, timeout, longest=0.01):
            self.abort()
            raise CollectiveError(f"collectives did not finish within {timeout} s (a peer may be gone); "
                                  "the communicator was aborted")

    # --- collectives ---
    def _target(self, stream):
        """The stream a call runs on: ``stream``, or the communicator's own when None."""
        return stream if stream is not None else self.stream

    def _live(self):
        if not self._handle:
            raise CollectiveError("the communicator is closed or was aborted")
        return self._handle

    def _packed(self, name, send, recv, op, root, peer, stream) -> tuple:
        """(the row, the stream's handle, the C arguments) of a call, everything checked."""
        row = row_of(name)
        s, r = buffers_of(name, row, send, recv)
        datatype = datatype_of(s, f"{name}: the buffer" if row.buffers == 1 else f"{name}: the buffers")
        count = nccl_count(name, s, r, self.size)
        handle = self.device.stream_handle(self._target(stream))
        args = row.arguments(s.pointer, r.pointer, count, datatype, op_of(name, row, op),
                             rank_of(name, row, self.size, root, peer), self._live(), ctypes.c_void_p(handle))
        return row, handle, args

    def _issue_or_queue(self, name: str, row: Any, handle: int, args: tuple) -> None:
        calls = getattr(_GROUP, "calls", None)
        if calls is None:
            result = getattr(self.lib, row.function)(*args)
            if result:
                self._poll(result, row.function)
            return
        _refuse_shared_stream(name, self, handle, calls)
        calls.append((self, handle, row.function, args))

    def collective(self, name: str, send: Any, recv: Any = None, *, op: str | None = None, root: int | None = None,
                   peer: int | None = None, stream: Any = None) -> None:
        """Enqueue collective ``name`` (a key of :data:`COLLECTIVES`) on ``stream`` (default:
        ``comm.stream``). ``send`` is the send buffer, or the one buffer of send and recv;
        ``recv`` None runs in place where the collective allows it. ``op`` (default "sum") only
        for reducing collectives, ``root`` (default 0) only for broadcast and reduce, ``peer``
        for send and recv. Everything is checked before NCCL sees it; inside :func:`group` the
        call is queued for the group."""
        row, handle, args = self._packed(name, send, recv, op, root, peer, stream)
        self._issue_or_queue(name, row, handle, args)

    def prepare(self, name: str, send: Any, recv: Any = None, *, op: str | None = None, root: int | None = None,
                peer: int | None = None, stream: Any = None) -> Any:
        """:meth:`collective`'s arguments checked and packed once: a function of no arguments
        that makes the call (queued inside :func:`group`, polled when non-blocking), for a
        collective repeated on the same buffers, as a training loop does. Each call still
        refuses a closed communicator and a freed shimrt Buffer; other arrays (torch, CuPy)
        must outlive the function, as they must outlive any collective on them."""
        row, handle, args = self._packed(name, send, recv, op, root, peer, stream)
        # What each call checks, as plain attribute reads (the call is a loop's whole host cost):
        # the communicator's handle object (close and abort replace it), the stream, and the
        # memory of each shimrt Buffer (its base's pointer is None once freed).
        held = [b for b in (send, recv) if b is not None and hasattr(b, "array_info")]
        held = list({id(b): b for b in held + [b.base for b in held]}.values()) or [_ALWAYS]
        first, last = (held[0], held[-1]) if len(held) <= 2 else (_AllOf(held), _ALWAYS)
        function = getattr(self.lib, row.function)
        target = self._target(stream)
        closable = target if hasattr(target, "closed") else _NEVER_CLOSED  # a shimrt Stream: refused once closed
        comm_handle = self._handle

        def call() -> None:
            if self._handle is comm_handle and not closable.closed and first.device_pointer is not None \
                    and last.device_pointer is not None and getattr(_GROUP, "calls", None) is None:
                result = function(*args)
                if result:
                    self._poll(result, row.function)
                return
            refuse()
            self._issue_or_queue(name, row, handle, args)

        def live() -> bool:  # for prepare_group: the same checks as call's, one frame per call
            return self._handle is comm_handle and not closable.closed and first.device_pointer is not None \
                and last.device_pointer is not None

        def refuse() -> None:
            if self._handle is not comm_handle:
                raise CollectiveError("the communicator is closed or was aborted")
            if closable.closed:
                raise UsageError("the stream this collective was prepared for is closed")
            if first.device_pointer is None or last.device_pointer is None:
                raise UsageError("the buffer has been freed")
        call.live, call.refuse, call.queued = live, refuse, (self, handle, row.function, args)
        return call

    def all_reduce(self, send: Any, recv: Any = None, *, op: str = "sum", stream: Any = None) -> None:
        """recv = op over all ranks of send (in place when recv is None)."""
        self.collective("all_reduce", send, recv, op=op, stream=stream)

    def broadcast(self, send: Any, recv: Any = None, *, root: int = 0, stream: Any = None) -> None:
        """recv on every rank = send of ``root`` (in place when recv is None)."""
        self.collective("broadcast", send, recv, root=root, stream=stream)

    def reduce(self, send: Any, recv: Any = None, *, op: str = "sum", root: int = 0, stream: Any = None) -> None:
        """recv on ``root`` = op over all ranks of send (in place when recv is None)."""
        self.collective("reduce", send, recv, op=op, root=root, stream=stream)

    def all_gather(self, send: Any, recv: Any, *, stream: Any = None) -> None:
        """recv = the send buffers of ranks 0..size-1, one after the other."""
        self.collective("all_gather", send, recv, stream=stream)

    def reduce_scatter(self, send: Any, recv: Any, *, op: str = "sum", stream: Any = None) -> None:
        """recv on rank i = op over all ranks of block i of send (size blocks of recv's count)."""
        self.collective("reduce_scatter", send, recv, op=op, stream=stream)

    def send(self, buf: Any, peer: int, *, stream: Any = None) -> None:
        """Send buf to ``peer`` (pair with its recv, inside :meth:`group` for exchanges)."""
        self.collective("send", buf, peer=peer, stream=stream)

    def recv(self, buf: Any, peer: int, *, stream: Any = None) -> None:
        """Receive into buf from ``peer``."""
        self.collective("recv", buf, peer=peer, stream=stream)

    @contextlib.contextmanager
    def group(self) -> Any:
        """``with comm.group():`` fuses the calls inside into one NCCL launch (ncclGroupStart/End);
        :func:`group` groups calls of several communicators."""
        with group(self):
            yield self

    # --- lifetime ---
    def abort(self) -> None:
        """Free the communicator without waiting for peers (after an error or a timeout). NCCL's
        abort joins its own threads; one stuck inside the driver would hold it for good, so it
        runs on a helper thread and CollectiveError says so after the options' timeout."""
        if self._handle:
            handle, self._handle = self._handle, ctypes.c_void_p()
            _bounded(lambda: self.lib.ncclCommAbort(handle), "ncclCommAbort", self.options.timeout)

    def close(self) -> None:
        """Destroy the communicator (waits for its work) and its stream."""
        if self._handle:
            result = self.lib.ncclCommDestroy(self._handle)
            self._handle = ctypes.c_void_p()
            if result != library.IN_PROGRESS:  # a non-blocking destroy finishes on its own
                self.lib.check(result, "ncclCommDestroy")
        self.stream.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()
            self.stream.close()

    def __repr__(self) -> str:
        return f"<shimrt Communicator rank {self.rank}/{self.size} on {self.device!r}, NCCL {self.lib.version_text}>"
