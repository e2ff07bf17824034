"""``Communicator``: one rank of an NCCL (or RCCL) communicator, its collectives, and no hangs.

By default communicators are non-blocking (``ncclConfig_t.blocking = 0``): every call that
answers ``ncclInProgress`` is polled with ``ncclCommGetAsyncError`` for at most the options'
timeout, and :meth:`Communicator.wait` bounds the wait for the collectives themselves. When
the time runs out the communicator is aborted (``ncclCommAbort``) and a
:class:`CollectiveError` says what did not finish.
"""

from __future__ import annotations

import contextlib
import ctypes

from .. import arrays, waiting
from ..errors import CollectiveError, UsageError
from . import library
from .config import MIN_VERSION, CommOptions


def unique_id(lib: library.Library | None = None) -> bytes:
    """A fresh ncclUniqueId (128 bytes) for rank 0 to share with the others. No GPU needed."""
    lib = lib or library.load()
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


class Communicator:
    """Rank ``rank`` of ``size`` on ``device``, joined through the shared ``unique_id``.

    Collectives take shimrt Buffers or any CUDA/ROCm array (torch, CuPy), infer the datatype
    and count, check the sizes before NCCL sees them, and run on ``stream`` or, by default, on
    the communicator's own stream of the device's greatest priority (``comm.stream``).
    """

    def __init__(self, device, unique_id: bytes, rank: int, size: int, *, options: CommOptions | None = None,
                 library_: library.Library | None = None, _handle=None):
        if not isinstance(size, int) or size < 1 or not isinstance(rank, int) or not 0 <= rank < size:
            raise UsageError(f"rank must be in 0..size-1 and size >= 1, got rank={rank!r}, size={size!r}")
        self.device, self.rank, self.size = device, rank, size
        self.options = options or CommOptions()
        self.lib = library_ or library.load(device.backend)
        self._handle = _handle if _handle is not None else ctypes.c_void_p()
        self.stream = device.stream("high")
        if _handle is None:
            device.activate()
            self._poll(self._init_call(_uid(unique_id)), "ncclCommInitRankConfig")

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
        self.lib.check(self.lib.ncclCommGetAsyncError(self._handle, ctypes.byref(state)), "ncclCommGetAsyncError",
                       self._handle)
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
        handle = self.device._stream_handle(stream if stream is not None else self.stream)
        drv = self.device._drv

        def finished() -> bool:
            if drv.stream_query(handle):
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
    def _stream_arg(self, stream) -> ctypes.c_void_p:
        handle = self.device._stream_handle(stream if stream is not None else self.stream)
        return ctypes.c_void_p(self.device._drv.stream_handle(handle))

    def _live(self):
        if not self._handle:
            raise CollectiveError("the communicator is closed or was aborted")
        return self._handle

    def _datatype(self, info: arrays.ArrayInfo, what: str) -> int:
        code = library.DATATYPES.get(info.dtype)
        if code is None:
            raise UsageError(f"{what} has dtype {info.dtype}, which NCCL cannot carry "
                             f"(it takes {', '.join(library.DATATYPES)})")
        return code

    def _pair(self, send, recv, name):
        s = arrays.describe(send, f"{name}: send buffer")
        r = s if recv is None or recv is send else arrays.describe(recv, f"{name}: receive buffer")
        if r.dtype != s.dtype:
            raise UsageError(f"{name}: send is {s.dtype} but receive is {r.dtype}")
        return s, r, self._datatype(s, f"{name}: the buffers")

    def _op(self, op: str) -> int:
        if op not in library.REDOPS:
            raise UsageError(f"op must be one of {', '.join(library.REDOPS)}, not {op!r}")
        return library.REDOPS[op]

    def _root(self, root: int) -> int:
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise UsageError(f"root must be a rank in 0..{self.size - 1}, not {root!r}")
        return root

    def _poll_call(self, call: str, result: int) -> None:
        self._poll(result, call)

    def all_reduce(self, send, recv=None, *, op: str = "sum", stream=None) -> None:
        """recv = op over all ranks of send (in place when recv is None)."""
        s, r, dt = self._pair(send, recv, "all_reduce")
        if r.count != s.count:
            raise UsageError(f"all_reduce: receive holds {r.count} elements, send {s.count}")
        self._poll_call("ncclAllReduce", self.lib.ncclAllReduce(s.pointer, r.pointer, s.count, dt, self._op(op),
                                                           self._live(), self._stream_arg(stream)))

    def broadcast(self, send, recv=None, *, root: int = 0, stream=None) -> None:
        """recv on every rank = send of ``root`` (in place when recv is None)."""
        s, r, dt = self._pair(send, recv, "broadcast")
        if r.count != s.count:
            raise UsageError(f"broadcast: receive holds {r.count} elements, send {s.count}")
        self._poll_call("ncclBroadcast", self.lib.ncclBroadcast(s.pointer, r.pointer, s.count, dt, self._root(root),
                                                           self._live(), self._stream_arg(stream)))

    def reduce(self, send, recv=None, *, op: str = "sum", root: int = 0, stream=None) -> None:
        """recv on ``root`` = op over all ranks of send."""
        s, r, dt = self._pair(send, recv, "reduce")
        if r.count != s.count:
            raise UsageError(f"reduce: receive holds {r.count} elements, send {s.count}")
        self._poll_call("ncclReduce", self.lib.ncclReduce(s.pointer, r.pointer, s.count, dt, self._op(op),
                                                          self._root(root), self._live(), self._stream_arg(stream)))

    def all_gather(self, send, recv, *, stream=None) -> None:
        """recv = the send buffers of ranks 0..size-1, one after the other."""
        s, r, dt = self._pair(send, recv, "all_gather")
        if r.count < s.count * self.size:
            raise UsageError(f"all_gather: receive holds {r.count} elements, needs {s.count} x {self.size} ranks "
                             f"= {s.count * self.size}")
        self._poll_call("ncclAllGather", self.lib.ncclAllGather(s.pointer, r.pointer, s.count, dt, self._live(),
                                                           self._stream_arg(stream)))

    def reduce_scatter(self, send, recv, *, op: str = "sum", stream=None) -> None:
        """recv on rank i = op over all ranks of block i of send (size blocks of recv's count)."""
        s, r, dt = self._pair(send, recv, "reduce_scatter")
        if s.count < r.count * self.size:
            raise UsageError(f"reduce_scatter: send holds {s.count} elements, needs {r.count} x {self.size} ranks "
                             f"= {r.count * self.size}")
        self._poll_call("ncclReduceScatter", self.lib.ncclReduceScatter(s.pointer, r.pointer, r.count, dt, self._op(op),
                                                                   self._live(), self._stream_arg(stream)))

    def send(self, buf, peer: int, *, stream=None) -> None:
        """Send buf to ``peer`` (pair with its recv, inside :meth:`group` for exchanges)."""
        b = arrays.describe(buf, "send: buffer")
        self._poll_call("ncclSend", self.lib.ncclSend(b.pointer, b.count, self._datatype(b, "send: buffer"),
                                                 self._root(peer), self._live(), self._stream_arg(stream)))

    def recv(self, buf, peer: int, *, stream=None) -> None:
        """Receive into buf from ``peer``."""
        b = arrays.describe(buf, "recv: buffer")
        self._poll_call("ncclRecv", self.lib.ncclRecv(b.pointer, b.count, self._datatype(b, "recv: buffer"),
                                                 self._root(peer), self._live(), self._stream_arg(stream)))

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
