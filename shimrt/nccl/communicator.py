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
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

from .. import validate, waiting
from ..config import settings
from ..device import Device
from ..errors import CollectiveError, UsageError
from ..stream import timeout_seconds
from . import library
from .collectives import MAX_RANKS, buffers_of, datatype_of, nccl_count, op_of, rank_of, row_of
from .config import MIN_VERSION, CommOptions


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

    def collective(self, name: str, send: Any, recv: Any = None, *, op: str | None = None, root: int | None = None,
                   peer: int | None = None, stream: Any = None) -> None:
        """Enqueue collective ``name`` (a key of :data:`COLLECTIVES`) on ``stream`` (default:
        ``comm.stream``). ``send`` is the send buffer, or the one buffer of send and recv;
        ``recv`` None runs in place where the collective allows it. ``op`` (default "sum") only
        for reducing collectives, ``root`` (default 0) only for broadcast and reduce, ``peer``
        for send and recv. Everything is checked before NCCL sees it."""
        row = row_of(name)
        s, r = buffers_of(name, row, send, recv)
        datatype = datatype_of(s, f"{name}: the buffer" if row.buffers == 1 else f"{name}: the buffers")
        count = nccl_count(name, s, r, self.size)
        args = row.arguments(s.pointer, r.pointer, count, datatype, op_of(name, row, op),
                             rank_of(name, row, self.size, root, peer), self._live(),
                             ctypes.c_void_p(self.device.stream_handle(self._target(stream))))
        self._poll(getattr(self.lib, row.function)(*args), row.function)

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
