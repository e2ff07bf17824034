"""``Communicator``: one rank of an NCCL (or RCCL) communicator, its collectives, and no hangs.

Every collective goes one way: a row of :data:`COLLECTIVES` says which NCCL function it
calls and what it takes, :func:`nccl_count` checks the buffers' sizes against
:func:`buffer_counts` (the one place the size rules live), and :meth:`Communicator.collective`
makes the call. The named methods (``all_reduce``, ``broadcast``, ...) only name their row.

By default communicators are non-blocking (``ncclConfig_t.blocking = 0``): every call that
answers ``ncclInProgress`` is polled with ``ncclCommGetAsyncError`` for at most the options'
timeout, and :meth:`Communicator.wait` bounds the wait for the collectives themselves. When
the time runs out the communicator is aborted (``ncclCommAbort``) and a
:class:`CollectiveError` says what did not finish.
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass

from .. import arrays, waiting
from ..config import settings
from ..errors import CollectiveError, UsageError
from . import library
from .config import MIN_VERSION, CommOptions


@dataclass(frozen=True)
class Collective:
    """One row of the table: a Communicator operation and the NCCL function that does it.

    ``ranks_in``: the buffer that holds one block per rank, "recv" (all_gather) or "send"
    (reduce_scatter); None when send and receive hold the same count. ``reduces``: takes a
    reduction op. ``rank``: takes a "root" or a "peer". ``in_place``: recv may be None (the send
    buffer is then the receive buffer too). ``buffers``: 2, or 1 for send and recv.
    """

    function: str
    ranks_in: str | None = None
    reduces: bool = False
    rank: str | None = None
    in_place: bool = False
    buffers: int = 2

    def arguments(self, send: int, recv: int, count: int, datatype: int, op: int | None, rank: int | None,
                  comm, stream) -> tuple:
        """The C arguments in the order of the function's prototype: the buffers, count,
        datatype, [op], [root or peer], comm, stream."""
        return ((send, recv)[:self.buffers] + (count, datatype) + ((op,) if self.reduces else ())
                + ((rank,) if self.rank else ()) + (comm, stream))


#: Communicator method -> its row. Each method of that name is a thin call of
#: :meth:`Communicator.collective`.
COLLECTIVES: dict[str, Collective] = {
    "all_reduce": Collective("ncclAllReduce", reduces=True, in_place=True),
    "broadcast": Collective("ncclBroadcast", rank="root", in_place=True),
    "reduce": Collective("ncclReduce", reduces=True, rank="root", in_place=True),
    "all_gather": Collective("ncclAllGather", ranks_in="recv"),
    "reduce_scatter": Collective("ncclReduceScatter", ranks_in="send", reduces=True),
    "send": Collective("ncclSend", rank="peer", buffers=1),
    "recv": Collective("ncclRecv", rank="peer", buffers=1),
}

#: What the ``count`` of :func:`buffer_counts` is: NCCL's count argument, the send buffer's
#: count, or the larger buffer's (nccl-tests' size convention).
GIVEN = ("nccl", "send", "largest")


def _row(collective: str) -> Collective:
    row = COLLECTIVES.get(collective)
    if row is None:
        raise UsageError(f"collective must be one of {', '.join(COLLECTIVES)}, not {collective!r}")
    return row


def _whole(value, what: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{what} must be an int >= {least}, not {value!r}")
    return value


def buffer_counts(collective: str, count: int, size: int, *, given: str = "nccl") -> tuple[int, int]:
    """(send, receive) element counts of ``collective`` over ``size`` ranks.

    ``count`` is, by ``given``: "nccl", the count NCCL takes (all_gather's send count,
    reduce_scatter's receive count, the one count of the others); "send", the send buffer's;
    "largest", the larger buffer's. A count that does not split into ``size`` blocks where one
    buffer holds a block per rank is rounded down. all_gather receives ``size`` x its send,
    reduce_scatter sends ``size`` x its receive, the others (send and recv: their one buffer)
    hold the same count on both sides.
    """
    row = _row(collective)
    _whole(count, "count", 0)
    _whole(size, "size", 1)
    if given not in GIVEN:
        raise UsageError(f"given must be one of {', '.join(GIVEN)}, not {given!r}")
    per_send = size if row.ranks_in == "send" else 1  # elements per element of NCCL's count
    per_recv = size if row.ranks_in == "recv" else 1
    per = {"nccl": 1, "send": per_send, "largest": max(per_send, per_recv)}[given]
    n = count // per
    return n * per_send, n * per_recv


def nccl_count(collective: str, send: arrays.ArrayInfo, recv: arrays.ArrayInfo, size: int) -> int:
    """The count NCCL takes for ``collective`` over ``size`` ranks with these buffers (for
    send and recv, pass their one buffer twice); UsageError naming the counts when the buffers
    do not fit :func:`buffer_counts`. A gathering receive or a scattered send may be larger
    than needed; where both sides hold one count they must be equal."""
    row = _row(collective)
    _whole(size, "size", 1)
    count = recv.count if row.ranks_in == "send" else send.count  # NCCL counts the per-rank side
    need_send, need_recv = buffer_counts(collective, count, size)
    if row.ranks_in is None:
        if recv.count != send.count:
            raise UsageError(f"{collective}: receive holds {recv.count} elements, send {send.count}; "
                             "they must be equal")
        return count
    which, have, need = (("receive", recv.count, need_recv) if row.ranks_in == "recv" else
                         ("send", send.count, need_send))
    if have < need:
        raise UsageError(f"{collective}: {which} holds {have} elements, needs {count} x {size} ranks = {need}")
    return count


def unique_id(lib: library.Library | None = None, *, backend: str | None = None) -> bytes:
    """A fresh ncclUniqueId (128 bytes) for rank 0 to share with the others. No GPU needed.

    The id comes from ``lib``, or else from the library of ``backend`` ("cuda": NCCL, "hip":
    RCCL), which defaults to ``SHIMRT_BACKEND`` when set and to "cuda" otherwise: a process
    without a Device has no better signal. A Device's owner should pass ``device.backend``
    (Communicator.local and footprint do).
    """
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
        raise UsageError("the unique id must be the 128 bytes from shimrt.nccl.unique_id()")
    uid = library.UniqueId()
    ctypes.memmove(ctypes.addressof(uid), bytes(value), 128)
    return uid


def _datatype(info: arrays.ArrayInfo, what: str) -> int:
    code = library.DATATYPES.get(info.dtype)
    if code is None:
        raise UsageError(f"{what} has dtype {info.dtype}, which NCCL cannot carry "
                         f"(it takes {', '.join(library.DATATYPES)})")
    return code


def _buffers(name: str, row: Collective, send, recv) -> tuple[arrays.ArrayInfo, arrays.ArrayInfo]:
    """(send, receive) ArrayInfo of a call, the same one twice for one buffer or in place."""
    if row.buffers == 1:
        if recv is not None:
            raise UsageError(f"{name} takes one buffer, not a receive buffer as well")
        one = arrays.describe(send, f"{name}: buffer")
        return one, one
    s = arrays.describe(send, f"{name}: send buffer")
    if recv is None:
        if not row.in_place:
            in_place = ", ".join(n for n, r in COLLECTIVES.items() if r.in_place)
            raise UsageError(f"{name} needs a receive buffer (recv=None, in place, is for {in_place})")
        return s, s
    r = s if recv is send else arrays.describe(recv, f"{name}: receive buffer")
    if r.dtype != s.dtype:
        raise UsageError(f"{name}: send is {s.dtype} but receive is {r.dtype}")
    return s, r


def _op(name: str, row: Collective, op: str | None) -> int | None:
    if not row.reduces:
        if op is not None:
            raise UsageError(f"{name} takes no op (it reduces nothing)")
        return None
    op = "sum" if op is None else op
    if op not in library.REDOPS:
        raise UsageError(f"op must be one of {', '.join(library.REDOPS)}, not {op!r}")
    return library.REDOPS[op]


def _rank(name: str, row: Collective, size: int, root: int | None, peer: int | None) -> int | None:
    for kind, value in (("root", root), ("peer", peer)):
        if value is not None and row.rank != kind:
            raise UsageError(f"{name} takes no {kind}")
    if row.rank is None:
        return None
    value = root if row.rank == "root" else peer
    if value is None and row.rank == "root":
        value = 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        raise UsageError(f"{row.rank} must be a rank in 0..{size - 1}, not {value!r}")
    return value


class Communicator:
    """Rank ``rank`` of ``size`` on ``device``, joined through the shared ``unique_id``.

    Collectives take shimrt Buffers or any CUDA/ROCm array (torch, CuPy), infer the datatype
    and count, check the sizes before NCCL sees them, and run on ``stream`` or, by default, on
    the communicator's own stream of the device's greatest priority (``comm.stream``).
    """

    def __init__(self, device, unique_id: bytes, rank: int, size: int, *, options: CommOptions | None = None,
                 library_: library.Library | None = None, _handle=None):
        if (isinstance(size, bool) or not isinstance(size, int) or size < 1 or isinstance(rank, bool)
                or not isinstance(rank, int) or not 0 <= rank < size):
            raise UsageError(f"rank must be in 0..size-1 and size >= 1, got rank={rank!r}, size={size!r}")
        if options is not None and not isinstance(options, CommOptions):
            raise UsageError(f"options must be a CommOptions, not {type(options).__name__}")
        self.device, self.rank, self.size = device, rank, size
        self.options = options or CommOptions()
        self.lib = library_ or library.load(device.backend)
        self._handle = _handle if _handle is not None else ctypes.c_void_p()
        self.stream = device.stream("high")
        if _handle is None:
            try:
                device.activate()
                self._poll(self._init_call(_uid(unique_id)), "ncclCommInitRankConfig")
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
    def local(cls, devices, *, options: CommOptions | None = None) -> list["Communicator"]:
        """One communicator per device of this process (ranks in the order given), made together."""
        devices = list(devices)
        if not devices:
            raise UsageError("local() needs at least one Device")
        backends = {d.backend for d in devices}
        if len(backends) > 1:
            raise UsageError(f"local() needs devices of one backend, got {', '.join(sorted(backends))}")
        lib = library.load(devices[0].backend)
        uid = _uid(unique_id(lib))
        comms = [cls(d, b"", i, len(devices), options=options, library_=lib, _handle=ctypes.c_void_p())
                 for i, d in enumerate(devices)]
        lib.check(lib.ncclGroupStart(), "ncclGroupStart")
        results = []
        for c in comms:
            c.device.activate()
            results.append(c._init_call(uid))
        end = lib.ncclGroupEnd()
        for c, r in zip(comms, results, strict=True):
            c._poll(r if r != 0 else end, "ncclCommInitRankConfig (grouped)")
        return comms

    # --- waiting without hanging ---
    def _state(self) -> int:
        state = ctypes.c_int()
        handle = self._live()
        self.lib.check(self.lib.ncclCommGetAsyncError(handle, ctypes.byref(state)), "ncclCommGetAsyncError", handle)
        return state.value

    def _poll(self, result: int, call: str) -> None:
        """Finish a call that may answer ncclInProgress, within the timeout."""
        if result == 0:
            return
        if result != library.IN_PROGRESS:
            self.lib.check(result, call, self._handle)
        state = library.IN_PROGRESS

        def settled() -> bool:
            nonlocal state
            state = self._state()
            return state != library.IN_PROGRESS

        if not waiting.until(settled, self.options.timeout, first=1e-4, longest=0.01):
            self.abort()
            raise CollectiveError(f"{call} did not complete within {self.options.timeout} s (is every rank "
                                  f"running?); the communicator was aborted")
        self.lib.check(state, call, self._handle)

    def wait(self, stream=None, timeout: float | None = None) -> None:
        """Wait for the work on ``stream`` (default: the communicator's) for at most ``timeout``
        seconds (default: the options'); an asynchronous NCCL error or the timeout aborts the
        communicator and raises CollectiveError."""
        timeout = self.options.timeout if timeout is None else timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise UsageError(f"timeout must be a positive number of seconds, not {timeout!r}")
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

    def collective(self, name: str, send, recv=None, *, op: str | None = None, root: int | None = None,
                   peer: int | None = None, stream=None) -> None:
        """Enqueue collective ``name`` (a key of :data:`COLLECTIVES`) on ``stream`` (default:
        ``comm.stream``). ``send`` is the send buffer, or the one buffer of send and recv;
        ``recv`` None runs in place where the collective allows it. ``op`` (default "sum") only
        for reducing collectives, ``root`` (default 0) only for broadcast and reduce, ``peer``
        for send and recv. Everything is checked before NCCL sees it."""
        row = _row(name)
        s, r = _buffers(name, row, send, recv)
        datatype = _datatype(s, f"{name}: the buffer" if row.buffers == 1 else f"{name}: the buffers")
        count = nccl_count(name, s, r, self.size)
        args = row.arguments(s.pointer, r.pointer, count, datatype, _op(name, row, op),
                             _rank(name, row, self.size, root, peer), self._live(),
                             ctypes.c_void_p(self.device.stream_handle(self._target(stream))))
        self._poll(getattr(self.lib, row.function)(*args), row.function)

    def all_reduce(self, send, recv=None, *, op: str = "sum", stream=None) -> None:
        """recv = op over all ranks of send (in place when recv is None)."""
        self.collective("all_reduce", send, recv, op=op, stream=stream)

    def broadcast(self, send, recv=None, *, root: int = 0, stream=None) -> None:
        """recv on every rank = send of ``root`` (in place when recv is None)."""
        self.collective("broadcast", send, recv, root=root, stream=stream)

    def reduce(self, send, recv=None, *, op: str = "sum", root: int = 0, stream=None) -> None:
        """recv on ``root`` = op over all ranks of send (in place when recv is None)."""
        self.collective("reduce", send, recv, op=op, root=root, stream=stream)

    def all_gather(self, send, recv, *, stream=None) -> None:
        """recv = the send buffers of ranks 0..size-1, one after the other."""
        self.collective("all_gather", send, recv, stream=stream)

    def reduce_scatter(self, send, recv, *, op: str = "sum", stream=None) -> None:
        """recv on rank i = op over all ranks of block i of send (size blocks of recv's count)."""
        self.collective("reduce_scatter", send, recv, op=op, stream=stream)

    def send(self, buf, peer: int, *, stream=None) -> None:
        """Send buf to ``peer`` (pair with its recv, inside :meth:`group` for exchanges)."""
        self.collective("send", buf, peer=peer, stream=stream)

    def recv(self, buf, peer: int, *, stream=None) -> None:
        """Receive into buf from ``peer``."""
        self.collective("recv", buf, peer=peer, stream=stream)

    @contextlib.contextmanager
    def group(self):
        """``with comm.group():`` fuses the calls inside into one NCCL launch (ncclGroupStart/End)."""
        self.lib.check(self.lib.ncclGroupStart(), "ncclGroupStart")
        try:
            yield self
        finally:
            self._poll(self.lib.ncclGroupEnd(), "ncclGroupEnd")

    # --- lifetime ---
    def abort(self) -> None:
        """Free the communicator without waiting for peers (after an error or a timeout)."""
        if self._handle:
            self.lib.ncclCommAbort(self._handle)
            self._handle = ctypes.c_void_p()

    def close(self) -> None:
        """Destroy the communicator (waits for its work) and its stream."""
        if self._handle:
            result = self.lib.ncclCommDestroy(self._handle)
            self._handle = ctypes.c_void_p()
            if result != library.IN_PROGRESS:  # a non-blocking destroy finishes on its own
                self.lib.check(result, "ncclCommDestroy")
        self.stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self.abort()
            self.stream.close()

    def __repr__(self):
        return f"<shimrt Communicator rank {self.rank}/{self.size} on {self.device!r}, NCCL {self.lib.version_text}>"
