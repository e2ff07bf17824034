"""Finding libnccl / librccl and binding its C API with ctypes, from one declarative table.

``SHIMRT_NCCL_LIBRARY``, when set, is the one library loaded: if it cannot be, CollectiveError
says why (nothing else is tried, so a run never uses another NCCL than the one it was told to).
Otherwise the search order is: the ``nvidia-nccl-cu13``/``-cu12`` wheel's
``nvidia/nccl/lib/libnccl.so.2``; the system's ``libnccl.so.2``. Under the HIP backend:
``$ROCM_PATH/lib/librccl.so``, then the system's ``librccl.so``. A symbol an older library
lacks is left unbound, and only what uses it is unavailable.

Each library is opened and bound once per process: :func:`load` keeps what it loaded by
resolved path and hands the same :class:`Library` back. A path (not a bare name, which the
dynamic loader resolves) is read before ``dlopen`` far enough to refuse a file that is not a
whole shared library for this machine (:func:`shimrt.elf.library_problem`): a truncated one
would otherwise kill the process with SIGBUS inside ``dlopen``, and a FIFO would block it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

from .. import elf
from ..config import settings
from ..errors import CollectiveError, UsageError

__all__ = ["IN_PROGRESS", "BROKEN", "DATATYPES", "REDOPS", "UniqueId", "version_text", "Library", "load"]

BACKENDS = ("cuda", "hip")

# ncclResult_t values (nccl.h); ncclTimeout exists from 2.30 on.
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
           4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
           8: "ncclTimeout"}
IN_PROGRESS = 7
# Results after which a communicator cannot be used again (unhandled CUDA error, system, internal
# and remote errors, timeout), unlike a refused argument or usage.
BROKEN = frozenset({1, 2, 3, 6, 8})

# ncclDataType_t and ncclRedOp_t (nccl.h); float8 types from 2.24 on.
DATATYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
             "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3": 10, "float8_e5m2": 11}
REDOPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}

# The C types of nccl.h by name, so each table entry reads like its prototype. Enums are 4-byte
# ints; handles and buffers are pointers.
ncclResult_t = ctypes.c_int
ncclDataType_t = ctypes.c_int
ncclRedOp_t = ctypes.c_int
ncclComm_t = ctypes.c_void_p      # struct ncclComm*
cudaStream_t = ctypes.c_void_p    # hipStream_t under RCCL: the same pointer
ncclConfig_p = ctypes.c_void_p    # ncclConfig_t*: its layout depends on the version (config.py)
buffer_p = ctypes.c_void_p        # const void* sendbuff, void* recvbuff
c_int, c_size_t, POINTER = ctypes.c_int, ctypes.c_size_t, ctypes.POINTER


class UniqueId(ctypes.Structure):
    """ncclUniqueId: ``typedef struct { char internal[128]; } ncclUniqueId;`` (passed by value)."""
    _fields_ = [("internal", ctypes.c_char * 128)]


# name -> (restype, argtypes). The C prototype from nccl.h is the comment above each entry.
TABLE = {
    # ncclResult_t ncclGetVersion(int* version);
    "ncclGetVersion": (ncclResult_t, [POINTER(c_int)]),
    # ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
    "ncclGetUniqueId": (ncclResult_t, [POINTER(UniqueId)]),
    # ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
    "ncclCommInitRank": (ncclResult_t, [POINTER(ncclComm_t), c_int, UniqueId, c_int]),
    # ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
    #                                     ncclConfig_t* config);
    "ncclCommInitRankConfig": (ncclResult_t, [POINTER(ncclComm_t), c_int, UniqueId, c_int, ncclConfig_p]),
    # ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
    "ncclCommInitAll": (ncclResult_t, [POINTER(ncclComm_t), c_int, POINTER(c_int)]),
    # ncclResult_t ncclCommDestroy(ncclComm_t comm);
    "ncclCommDestroy": (ncclResult_t, [ncclComm_t]),
    # ncclResult_t ncclCommAbort(ncclComm_t comm);
    "ncclCommAbort": (ncclResult_t, [ncclComm_t]),
    # ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
    "ncclCommGetAsyncError": (ncclResult_t, [ncclComm_t, POINTER(ncclResult_t)]),
    # ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
    "ncclCommCount": (ncclResult_t, [ncclComm_t, POINTER(c_int)]),
    # ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
    "ncclCommCuDevice": (ncclResult_t, [ncclComm_t, POINTER(c_int)]),
    # ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
    "ncclCommUserRank": (ncclResult_t, [ncclComm_t, POINTER(c_int)]),
    # ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
    #                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    "ncclAllReduce": (ncclResult_t, [buffer_p, buffer_p, c_size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                     cudaStream_t]),
    # ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
    #                            int root, ncclComm_t comm, cudaStream_t stream);
    "ncclBroadcast": (ncclResult_t, [buffer_p, buffer_p, c_size_t, ncclDataType_t, c_int, ncclComm_t,
                                     cudaStream_t]),
    # ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
    #                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
    "ncclReduce": (ncclResult_t, [buffer_p, buffer_p, c_size_t, ncclDataType_t, ncclRedOp_t, c_int, ncclComm_t,
                                  cudaStream_t]),
    # ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
    #                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
    "ncclAllGather": (ncclResult_t, [buffer_p, buffer_p, c_size_t, ncclDataType_t, ncclComm_t, cudaStream_t]),
    # ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
    #                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    "ncclReduceScatter": (ncclResult_t, [buffer_p, buffer_p, c_size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                         cudaStream_t]),
    # ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
    #                       ncclComm_t comm, cudaStream_t stream);
    "ncclSend": (ncclResult_t, [buffer_p, c_size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t]),
    # ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
    #                       ncclComm_t comm, cudaStream_t stream);
    "ncclRecv": (ncclResult_t, [buffer_p, c_size_t, ncclDataType_t, c_int, ncclComm_t, cudaStream_t]),
    # ncclResult_t ncclGroupStart();
    "ncclGroupStart": (ncclResult_t, []),
    # ncclResult_t ncclGroupEnd();
    "ncclGroupEnd": (ncclResult_t, []),
    # const char* ncclGetErrorString(ncclResult_t result);
    "ncclGetErrorString": (ctypes.c_char_p, [ncclResult_t]),
    # const char* ncclGetLastError(ncclComm_t comm);
    "ncclGetLastError": (ctypes.c_char_p, [ncclComm_t]),
}


def _backend(backend: str) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    return backend


def candidates(backend: str = "cuda") -> list[str]:
    """Where the library of ``backend`` ("cuda": NCCL, "hip": RCCL) is looked for, in order: only
    ``SHIMRT_NCCL_LIBRARY`` when it is set."""
    _backend(backend)
    cfg = settings()
    if cfg.nccl_library:
        return [cfg.nccl_library]
    found: list[str] = []
    if backend == "hip":
        if cfg.rocm_path:
            found.append(str(Path(cfg.rocm_path) / "lib" / "librccl.so"))
        found.append("librccl.so")
        return found
    spec = importlib.util.find_spec("nvidia.nccl") if importlib.util.find_spec("nvidia") else None
    for root in (spec.submodule_search_locations or []) if spec else []:  # the nvidia-nccl-cu1x wheel
        found.append(str(Path(root) / "lib" / "libnccl.so.2"))
    found.append(ctypes.util.find_library("nccl") or "libnccl.so.2")
    return found


def version_text(version: int | None) -> str:
    """An ncclGetVersion result as NCCL prints it, e.g. "2.28.9" (2.8 and older encoded
    X*1000+Y*100+Z); "unknown" for None."""
    if version is None:
        return "unknown"
    v = version
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v // 100 % 10}.{v % 100}"


#: A bound C function of :data:`TABLE` (ncclResult_t, or a C string for the two that return one).
CFunction = Callable[..., Any]


class _Absent:
    """A :data:`TABLE` function the library lacks: calling it raises CollectiveError naming it."""

    def __init__(self, name: str, path: str):
        self.name, self.path = name, path

    def __call__(self, *args: Any) -> Any:
        raise CollectiveError(f"{self.name} is not in {self.path}")


@dataclass
class Library:
    """A loaded NCCL/RCCL: ``path``, ``version`` (X*10000+Y*100+Z), and each function of
    :data:`TABLE` as a declared attribute of that name (its C prototype in the table; one the
    library lacks raises CollectiveError when called); ``missing`` names the symbols it lacks.
    shimrt calls NCCL through the typed methods below (:meth:`unique_id`, :meth:`group_start`,
    :meth:`comm_init`, ...), and the collectives' packed calls take theirs by name
    (:meth:`function`)."""

    path: str
    handle: ctypes.CDLL
    version: int
    missing: tuple[str, ...]
    _bare: dict[str, CFunction] = field(default_factory=dict, init=False, repr=False)
    ncclGetVersion: CFunction = field(init=False, repr=False)
    ncclGetUniqueId: CFunction = field(init=False, repr=False)
    ncclCommInitRank: CFunction = field(init=False, repr=False)
    ncclCommInitRankConfig: CFunction = field(init=False, repr=False)
    ncclCommInitAll: CFunction = field(init=False, repr=False)
    ncclCommDestroy: CFunction = field(init=False, repr=False)
    ncclCommAbort: CFunction = field(init=False, repr=False)
    ncclCommGetAsyncError: CFunction = field(init=False, repr=False)
    ncclCommCount: CFunction = field(init=False, repr=False)
    ncclCommCuDevice: CFunction = field(init=False, repr=False)
    ncclCommUserRank: CFunction = field(init=False, repr=False)
    ncclAllReduce: CFunction = field(init=False, repr=False)
    ncclBroadcast: CFunction = field(init=False, repr=False)
    ncclReduce: CFunction = field(init=False, repr=False)
    ncclAllGather: CFunction = field(init=False, repr=False)
    ncclReduceScatter: CFunction = field(init=False, repr=False)
    ncclSend: CFunction = field(init=False, repr=False)
    ncclRecv: CFunction = field(init=False, repr=False)
    ncclGroupStart: CFunction = field(init=False, repr=False)
    ncclGroupEnd: CFunction = field(init=False, repr=False)
    ncclGetErrorString: CFunction = field(init=False, repr=False)
    ncclGetLastError: CFunction = field(init=False, repr=False)

    def function(self, name: str) -> CFunction:
        """The bound function ``name`` (a key of :data:`TABLE`)."""
        if name not in TABLE:
            raise UsageError(f"{name!r} is not an NCCL function shimrt binds ({', '.join(TABLE)})")
        fn: CFunction = getattr(self, name)
        return fn

    def packed(self, name: str, args: tuple) -> tuple[CFunction, tuple]:
        """``name``'s function and ``args`` made ready for calls that repeat them as they are (a
        collective's packed call): each argument converted once to its C type of :data:`TABLE`
        (a pointer or size as its ctypes object; a C int as the Python int ctypes passes as one),
        and the function bound without a prototype, so that ctypes converts nothing per call.
        Conversion through a prototype is most of a call's host cost (seven arguments: 0.65 us
        a call against 0.38 with them packed, measured on the CPU machine; docs/bench.md)."""
        absent = self.function(name)  # refuses a name shimrt does not bind
        if name in self.missing:
            absent()  # raises what calling a symbol this library lacks raises
        restype, kinds = TABLE[name]
        argtypes = cast(list, kinds)
        if len(args) != len(argtypes):
            raise UsageError(f"{name} takes {len(argtypes)} arguments, not {len(args)}")
        fn = self._bare.get(name)
        if fn is None:
            fn = self.handle[name]  # a new function object: the prototyped one keeps its argtypes
            fn.restype = restype
            self._bare[name] = fn
        return fn, tuple(_as_c(kind, value) for kind, value in zip(argtypes, args, strict=True))

    @property
    def version_text(self) -> str:
        """The version as NCCL prints it, e.g. "2.28.9"."""
        return version_text(self.version)

    def has(self, name: str) -> bool:
        """Whether the library exports ``name`` (a TABLE entry)."""
        return name not in self.missing

    # --- typed calls: those that return at once check their result here; those that may wait for
    # peers (init, destroy, abort) run on a helper thread (shimrt.waiting.bounded) and hand their
    # result back, for the caller to check on its own thread with :meth:`check`. ---
    def get_version(self) -> int:
        """ncclGetVersion: X*10000+Y*100+Z (2.8 and older: X*1000+Y*100+Z)."""
        version = ctypes.c_int()
        self.check(self.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
        return version.value

    def unique_id(self) -> UniqueId:
        """A new ncclUniqueId (ncclGetUniqueId), for every rank of one communicator to join with."""
        uid = UniqueId()
        self.check(self.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return uid

    def group_start(self) -> None:
        """ncclGroupStart: this thread's calls wait for :meth:`group_end`."""
        self.check(self.ncclGroupStart(), "ncclGroupStart")

    def group_end(self) -> int:
        """ncclGroupEnd's result, unchecked: ncclInProgress (a non-blocking group) is settled by
        the caller, and a failed call inside the group is the error worth reporting."""
        result: int = self.ncclGroupEnd()
        return result

    def async_error(self, comm: ctypes.c_void_p) -> int:
        """The communicator's asynchronous state (ncclCommGetAsyncError): 0, ncclInProgress or
        the error; CollectiveError when the query itself fails."""
        out = ctypes.c_int()
        self.check(self.ncclCommGetAsyncError(comm, ctypes.byref(out)), "ncclCommGetAsyncError", comm)
        return out.value

    def comm_init(self, box: ctypes.c_void_p, size: int, uid: UniqueId, rank: int, config: Any = None) -> int:
        """ncclCommInitRankConfig into ``box`` with ``config`` (a built ``ncclConfig_t``, kept
        alive by the caller until the communicator is joined), or ncclCommInitRank without one;
        the result, unchecked (it may wait for every peer: see above)."""
        if config is None:
            result: int = self.ncclCommInitRank(ctypes.byref(box), size, uid, rank)
        else:
            result = self.ncclCommInitRankConfig(ctypes.byref(box), size, uid, rank, ctypes.byref(config))
        return result

    def comm_destroy(self, comm: ctypes.c_void_p) -> int:
        """ncclCommDestroy's result, unchecked (it may wait for peers: see above)."""
        result: int = self.ncclCommDestroy(comm)
        return result

    def comm_abort(self, comm: ctypes.c_void_p) -> int:
        """ncclCommAbort's result, unchecked (it joins NCCL's threads: see above)."""
        result: int = self.ncclCommAbort(comm)
        return result

    def check(self, result: int, call: str, comm: Any = None) -> None:
        """Raise CollectiveError for a failed call, with NCCL's error string and last error."""
        if result == 0:
            return
        name = RESULTS.get(result, f"ncclResult {result}")
        text = self.ncclGetErrorString(result).decode() if self.has("ncclGetErrorString") else ""
        last = self.ncclGetLastError(comm).decode() if self.has("ncclGetLastError") else ""
        raise CollectiveError(f"{call} failed: {name} ({result}): {text}" + (f"; last error: {last}" if last else ""))


def _as_c(kind: Any, value: Any) -> Any:
    """``value`` as an argument of C type ``kind`` for a function bound without a prototype:
    unchanged when it already is one, or when ``kind`` is a C int and it is a Python int in its
    range (ctypes passes a Python int as a C int); else ``kind(value)``."""
    if isinstance(value, kind) or (kind is c_int and type(value) is int and -2**31 <= value < 2**31):
        return value
    return kind(value)


def _bind(path: str, handle: ctypes.CDLL) -> Library:
    """Declare every TABLE entry the library exports and read its version."""
    lib = Library(path=path, handle=handle, version=0, missing=())
    missing = []
    for name, (restype, argtypes) in TABLE.items():
        try:
            fn = getattr(handle, name)
        except AttributeError:
            missing.append(name)
            setattr(lib, name, _Absent(name, path))
            continue
        fn.restype, fn.argtypes = restype, argtypes
        setattr(lib, name, fn)
    lib.missing = tuple(missing)
    if "ncclGetVersion" in lib.missing:
        raise CollectiveError(f"{path} is not an NCCL or RCCL library: it has no ncclGetVersion")
    lib.version = lib.get_version()
    return lib


def _key(path: str) -> str:
    return os.path.realpath(path) if os.sep in path else path


class Loader:
    """Libraries loaded and bound, by resolved path (a bare name, which the dynamic loader
    resolves, by itself): binding the table again would only repeat the work and hand out a second
    Library for one library. The process has one (:func:`load`); a new one is a fresh process's
    view, for tests."""

    def __init__(self) -> None:
        self.loaded: dict[str, Library] = {}
        self._lock = threading.Lock()

    def load(self, backend: str = "cuda") -> Library:
        """See :func:`load`."""
        tried = []
        chosen = settings().nccl_library
        with self._lock:  # one thread binds a library; the others get its Library
            for path in candidates(backend):
                key = _key(path)
                if key in self.loaded:
                    return self.loaded[key]
                problem = elf.library_problem(path) if os.sep in path else None
                try:
                    if problem is not None:
                        raise OSError(f"{path}: {problem}")
                    handle = ctypes.CDLL(path)
                except OSError as exc:
                    reason = str(exc)
                else:
                    try:
                        self.loaded[key] = _bind(path, handle)
                    except CollectiveError as exc:  # loaded, but not an NCCL/RCCL it can use
                        reason = str(exc)
                    else:
                        return self.loaded[key]
                if chosen:
                    raise CollectiveError(f"SHIMRT_NCCL_LIBRARY={path!r} could not be loaded, and nothing else is "
                                          f"tried while it is set: {reason}")
                tried.append(f"{path} ({reason})")
        what = "RCCL (librccl.so)" if backend == "hip" else "NCCL (libnccl.so.2)"
        raise CollectiveError(f"{what} not found; searched: " + "; ".join(tried))


_PROCESS = Loader()


def load(backend: str = "cuda") -> Library:
    """The library of ``backend`` ("cuda": NCCL, "hip": RCCL): the first candidate (see the
    module docstring) that loads, opened and bound once per process and then shared.
    CollectiveError naming every place searched when none loads."""
    return _PROCESS.load(backend)
