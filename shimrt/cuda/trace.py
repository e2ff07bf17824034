"""Kernel tracing on CUDA, through CUPTI bound with ctypes.

Two parts. :class:`KernelRecorder`: CUPTI's activity records of the kernels some code launches
(name, grid, block, registers per thread, static and dynamic shared memory, start and end), used
to measure the footprint of kernels shimrt does not compile itself, such as NCCL's.
:class:`LaunchInterposer`: CUPTI's driver-API launch callbacks, which read each launch and may
rewrite its dynamic shared memory (how :mod:`shimrt.overlap.interpose` shapes torch's kernels).

CUPTI's results go through this backend's one check helper (:mod:`shimrt.cuda.check`) as
:class:`~shimrt.cuda.check.CuptiResult`. The HIP mirror is :mod:`shimrt.hip.trace`.
"""

from __future__ import annotations

import ctypes
import gc
import struct
import threading
from typing import Any

from ..errors import ShimrtError
from .check import CuptiResult, check

# The trace part's public names: backends.Trace's three (shimrt.hip.trace has the same, with the same
# signatures), then CUPTI's layouts and readers, this backend's own.
__all__ = ["KernelRecorder", "LaunchInterposer", "library_path",
           "KIND_KERNEL", "KIND_CONCURRENT_KERNEL", "KERNEL_RECORD", "parse_kernel_record", "LAUNCH_CALLBACKS",
           "CALLBACK_DATA", "LAUNCH_PARAMS", "LAUNCH_EX_PARAMS", "LAUNCH_CONFIG", "LAUNCH_ATTRIBUTE", "read_launch",
           "write_dynamic_smem", "GRAPH_LAUNCHES"]

KIND_KERNEL = 3              # CUPTI_ACTIVITY_KIND_KERNEL
KIND_CONCURRENT_KERNEL = 10  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
_FLUSH_FORCED = 1            # CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: flush buffers that are not full yet
_MAX_LIMIT_REACHED = 12      # CUPTI_ERROR_MAX_LIMIT_REACHED: no more records in the buffer
_BUFFER_SIZE = 8 << 20
_ALIGN = 8                   # CUPTI wants its activity buffers 8-byte aligned

# CUpti_ActivityKernel10 (cupti_activity.h of CUPTI 12.x and 13.x): our name -> (offsetof,
# struct code). tests/test_trace.py compares these with the C compiler's offsetof on the header.
KERNEL_RECORD = {
    "kind": (0, "I"),                  # CUpti_ActivityKind kind
    "registers": (6, "H"),             # uint16_t registersPerThread
    "start": (16, "Q"),                # uint64_t start (ns)
    "end": (24, "Q"),                  # uint64_t end (ns)
    "device_id": (40, "I"),            # uint32_t deviceId
    "stream_id": (48, "I"),            # uint32_t streamId
    "grid_x": (52, "i"), "grid_y": (56, "i"), "grid_z": (60, "i"),       # int32_t gridX/Y/Z
    "block_x": (64, "i"), "block_y": (68, "i"), "block_z": (72, "i"),    # int32_t blockX/Y/Z
    "static_smem": (76, "i"),          # int32_t staticSharedMemory
    "dynamic_smem": (80, "i"),         # int32_t dynamicSharedMemory
    "local_per_thread": (84, "I"),     # uint32_t localMemoryPerThread
    "name": (104, "Q"),                # const char* name (64-bit pointer)
}

# --- launch callbacks (for kernels shimrt did not compile) ---------------------------------------
# CUPTI's driver-API domain calls back at CUPTI_API_ENTER of these launches with a
# CUpti_CallbackData whose functionParams point at the launch's parameter struct; writing its
# sharedMemBytes there changes the launch (measured on the H200: ../shared/notes).
_DRIVER_DOMAIN = 1  # CUPTI_CB_DOMAIN_DRIVER_API
_API_ENTER = 0      # CUPTI_API_ENTER
#: cbid -> the driver function (cupti_driver_cbid.h); the _Ex ones take a CUlaunchConfig.
LAUNCH_CALLBACKS = {307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz", 652: "cuLaunchKernelEx",
                    653: "cuLaunchKernelEx_ptsz"}
# A graph launched inside the block replays kernels whose launches were captured before it: the
# interposer cannot rewrite them, so it counts them (kernels captured inside the block are
# rewritten at capture, like any launch).
GRAPH_LAUNCHES = {514: "cuGraphLaunch", 515: "cuGraphLaunch_ptsz"}
# Our name -> (offsetof, struct code), each compared with the C compiler on the headers by
# tests/test_trace.py, as KERNEL_RECORD is.
CALLBACK_DATA = {  # CUpti_CallbackData (cupti_callbacks.h)
    "site": (0, "I"),            # CUpti_ApiCallbackSite callbackSite
    "function_name": (8, "Q"),   # const char *functionName
    "params": (16, "Q"),         # const void *functionParams
    "symbol_name": (32, "Q"),    # const char *symbolName
    "context": (40, "Q"),        # CUcontext context
    "correlation_id": (64, "I"),  # uint32_t correlationId
}
LAUNCH_PARAMS = {  # cuLaunchKernel_params (generated_cuda_meta.h); _ptsz has the same layout
    "f": (0, "Q"), "grid_x": (8, "I"), "grid_y": (12, "I"), "grid_z": (16, "I"), "block_x": (20, "I"),
    "block_y": (24, "I"), "block_z": (28, "I"), "dynamic_smem": (32, "I"), "stream": (40, "Q"),
}
LAUNCH_EX_PARAMS = {"config": (0, "Q"), "f": (8, "Q")}  # cuLaunchKernelEx_params (and _ptsz)
LAUNCH_CONFIG = {  # CUlaunchConfig (cuda.h)
    "grid_x": (0, "I"), "grid_y": (4, "I"), "grid_z": (8, "I"), "block_x": (12, "I"), "block_y": (16, "I"),
    "block_z": (20, "I"), "dynamic_smem": (24, "I"), "stream": (32, "Q"), "attrs": (40, "Q"), "num_attrs": (48, "I"),
}
LAUNCH_ATTRIBUTE = {  # CUlaunchAttribute (cuda.h): its id, and the value's fields read here
    "size": (72, ""), "id": (0, "I"), "cooperative": (8, "i"), "cluster_x": (8, "I"), "cluster_y": (12, "I"),
    "cluster_z": (16, "I"),
}
_ATTRIBUTE_COOPERATIVE, _ATTRIBUTE_CLUSTER = 2, 4  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE, _CLUSTER_DIMENSION


def _read(table: dict, address: int) -> dict:
    size = max(o + struct.calcsize(f) for o, f in table.values() if f)
    raw = ctypes.string_at(address, size)
    return {k: struct.unpack_from("<" + f, raw, o)[0] for k, (o, f) in table.items() if f}


def read_launch(cbid: int, params: int) -> dict:
    """The launch behind callback ``cbid`` (a key of LAUNCH_CALLBACKS) whose parameter struct is
    at ``params``: f, grid and block sizes, dynamic_smem, stream, cluster_blocks (1: no cluster)
    and cooperative; ``dynamic_smem_at`` is the address of its sharedMemBytes field."""
    if cbid not in LAUNCH_CALLBACKS:
        raise ShimrtError(f"callback {cbid} is not a kernel launch (those are {sorted(LAUNCH_CALLBACKS)})")
    if cbid in (307, 442):
        launch = _read(LAUNCH_PARAMS, params)
        launch.update(cluster_blocks=1, cooperative=False, dynamic_smem_at=params + LAUNCH_PARAMS["dynamic_smem"][0])
        return launch
    ex = _read(LAUNCH_EX_PARAMS, params)
    launch = _read(LAUNCH_CONFIG, ex["config"])
    launch.update(f=ex["f"], cluster_blocks=1, cooperative=False,
                  dynamic_smem_at=ex["config"] + LAUNCH_CONFIG["dynamic_smem"][0])
    size = LAUNCH_ATTRIBUTE["size"][0]
    for i in range(launch["num_attrs"]):
        attr = _read({k: v for k, v in LAUNCH_ATTRIBUTE.items() if k != "size"}, launch["attrs"] + i * size)
        if attr["id"] == _ATTRIBUTE_COOPERATIVE:
            launch["cooperative"] = attr["cooperative"] != 0
        elif attr["id"] == _ATTRIBUTE_CLUSTER:
            launch["cluster_blocks"] = max(1, attr["cluster_x"] * attr["cluster_y"] * attr["cluster_z"])
    return launch


def write_dynamic_smem(launch: dict, value: int) -> None:
    """Set the dynamic shared memory of the launch ``read_launch`` returned, in place (in the
    parameter struct the driver is about to use)."""
    ctypes.c_uint32.from_address(launch["dynamic_smem_at"]).value = value


# The C types of cupti_activity.h by name, so each table entry reads like its prototype (private:
# this module's public names are the mirrored ones in __all__).
_CUptiResult = ctypes.c_int
_CUpti_ActivityKind = ctypes.c_int
_CUcontext = ctypes.c_void_p
_uint8_p = ctypes.c_void_p        # uint8_t* buffer: CUPTI hands it back to Python as an int address
_c_uint32, _c_size_t, _POINTER = ctypes.c_uint32, ctypes.c_size_t, ctypes.POINTER

# typedef void (*CUpti_BuffersCallbackRequestFunc)(uint8_t **buffer, size_t *size, size_t *maxNumRecords);
_BuffersRequested = ctypes.CFUNCTYPE(None, _POINTER(_uint8_p), _POINTER(_c_size_t), _POINTER(_c_size_t))
# typedef void (*CUpti_BuffersCallbackCompleteFunc)(CUcontext context, uint32_t streamId, uint8_t *buffer,
#                                                   size_t size, size_t validSize);
_BuffersCompleted = ctypes.CFUNCTYPE(None, _CUcontext, _c_uint32, _uint8_p, _c_size_t, _c_size_t)

# name -> (restype, argtypes). The C prototype from cupti_activity.h is the comment above each entry.
# typedef void (CUPTIAPI *CUpti_CallbackFunc)(void *userdata, CUpti_CallbackDomain domain,
#                                            CUpti_CallbackId cbid, const void *cbdata);
_CallbackFunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
_CUpti_SubscriberHandle = ctypes.c_void_p

_TABLE = {
    # CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata);
    "cuptiSubscribe": (_CUptiResult, [_POINTER(_CUpti_SubscriberHandle), _CallbackFunc, ctypes.c_void_p]),
    # CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
    #                                 CUpti_CallbackDomain domain, CUpti_CallbackId cbid);
    "cuptiEnableCallback": (_CUptiResult, [_c_uint32, _CUpti_SubscriberHandle, ctypes.c_int, _c_uint32]),
    # CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber);
    "cuptiUnsubscribe": (_CUptiResult, [_CUpti_SubscriberHandle]),
    # CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
    #                                            CUpti_BuffersCallbackCompleteFunc funcBufferCompleted);
    "cuptiActivityRegisterCallbacks": (_CUptiResult, [_BuffersRequested, _BuffersCompleted]),
    # CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind);
    "cuptiActivityEnable": (_CUptiResult, [_CUpti_ActivityKind]),
    # CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind);
    "cuptiActivityDisable": (_CUptiResult, [_CUpti_ActivityKind]),
    # CUptiResult cuptiActivityFlushAll(uint32_t flag);
    "cuptiActivityFlushAll": (_CUptiResult, [_c_uint32]),
    # CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t validBufferSizeBytes, CUpti_Activity **record);
    "cuptiActivityGetNextRecord": (_CUptiResult, [_uint8_p, _c_size_t, _POINTER(ctypes.c_void_p)]),
}

# CUPTI, opened and bound once per process: (CDLL, path). A failed load is not kept: the next
# call tries again.
_loaded: tuple[ctypes.CDLL, str] | None = None
_lock = threading.Lock()


def _library() -> tuple[ctypes.CDLL, str]:
    """(CUPTI bound from _TABLE, its path); ShimrtError saying what to install if it does not load."""
    global _loaded
    with _lock:  # one thread binds the library; the others get what it bound
        if _loaded is None:
            try:
                from cuda.pathfinder import load_nvidia_dynamic_lib
                path = load_nvidia_dynamic_lib("cupti").abs_path
                lib = ctypes.CDLL(path)
            except Exception as exc:
                raise ShimrtError(f"CUPTI is not available (pip install nvidia-cuda-cupti): {exc}") from None
            for name, (restype, argtypes) in _TABLE.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError:
                    raise ShimrtError(f"{path} has no {name}: not a usable CUPTI "
                                      "(pip install nvidia-cuda-cupti)") from None
                fn.restype, fn.argtypes = restype, argtypes
            _loaded = lib, path
        return _loaded


def library_path() -> str | None:
    """Where CUPTI loads from, or None if it does not load (never raises)."""
    try:
        return _library()[1]
    except ShimrtError:
        return None


def parse_kernel_record(address: int) -> dict:
    """The fields of KERNEL_RECORD read from a kernel activity record at ``address``, with
    ``name`` decoded to str."""
    rec = _read(KERNEL_RECORD, address)
    rec["name"] = ctypes.string_at(rec["name"]).decode(errors="replace") if rec["name"] else ""
    return rec


class KernelRecorder:
    """``with KernelRecorder() as rec: ...`` collects a record per kernel launched inside.

    ``rec.kernels`` is a list of dicts (see KERNEL_RECORD), ``rec.path`` the CUPTI library.
    Work must have finished by the end of the block (synchronize inside it); the records are
    flushed on exit. CUPTI's callbacks are process-wide: one recorder at a time.
    """

    kernels: list[dict]
    path: str

    def __init__(self) -> None:
        self.kernels = []
        self._buffers: dict[int, ctypes.Array] = {}
        self._lock = threading.Lock()
        self._error: CuptiResult | None = None  # from a callback, which cannot raise: raised on exit
        self._lib, self.path = _library()
        # kept alive here while CUPTI holds them
        self._requested = _BuffersRequested(self._on_requested)
        self._completed = _BuffersCompleted(self._on_completed)

    def _on_requested(self, buffer, size, max_records) -> None:
        raw = ctypes.create_string_buffer(_BUFFER_SIZE + _ALIGN)
        address = (ctypes.addressof(raw) + _ALIGN - 1) // _ALIGN * _ALIGN
        with self._lock:
            self._buffers[address] = raw
        buffer[0] = address
        size[0] = _BUFFER_SIZE
        max_records[0] = 0  # as many as fit

    def _on_completed(self, context, stream_id, buffer, size, valid_size) -> None:
        record = ctypes.c_void_p()  # NULL: start at the first record
        while (result := self._lib.cuptiActivityGetNextRecord(buffer, valid_size, ctypes.byref(record))) == 0:
            address = record.value
            if not address:  # CUPTI answered success with no record: nothing more to read
                break
            kind = ctypes.c_uint32.from_address(address).value
            if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
                self.kernels.append(parse_kernel_record(address))
        if result != _MAX_LIMIT_REACHED and self._error is None:
            self._error = CuptiResult(result)
        with self._lock:
            self._buffers.pop(buffer, None)

    def __enter__(self) -> KernelRecorder:
        lib = self._lib
        check((CuptiResult(lib.cuptiActivityRegisterCallbacks(self._requested, self._completed)),),
              "cuptiActivityRegisterCallbacks")
        check((CuptiResult(lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL)),), "cuptiActivityEnable")
        # CUPTI calls the buffer callbacks on whatever thread launches (NCCL's own, inside the
        # driver): a garbage collection there could run finalizers that call the driver. None
        # runs while recording (suspected in a hang of NCCL beside CUPTI on the H200).
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: Any) -> None:
        lib = self._lib
        try:
            check((CuptiResult(lib.cuptiActivityFlushAll(_FLUSH_FORCED)),), "cuptiActivityFlushAll")
        finally:  # stop recording even if the flush failed
            try:
                check((CuptiResult(lib.cuptiActivityDisable(KIND_CONCURRENT_KERNEL)),), "cuptiActivityDisable")
            finally:
                if self._gc_was_enabled:
                    gc.enable()
        if self._error is not None:
            check((self._error,), "cuptiActivityGetNextRecord")


class LaunchInterposer:
    """``with LaunchInterposer(rewrite) as li: ...`` calls ``rewrite(launch)`` at the entry of
    every kernel launch made in the process while the block runs, whoever launches it (PyTorch,
    cuBLAS, Triton, NCCL), on the launching thread. ``launch`` is :func:`read_launch`'s dict
    with the kernel's ``name`` (its symbol, as CUPTI gives it);
    ``rewrite`` returns the dynamic shared memory to launch with, or None to leave it. Kernels
    captured into a CUDA graph inside the block are rewritten at capture; a graph launched inside
    the block replays what it captured, unrewritten, and is counted in ``li.graph_launches``.

    A failure in ``rewrite`` (or in reading the launch) never breaks the launch: it goes ahead
    as it was, and the failure is kept in ``li.failures`` (at most 100, counted in
    ``li.failure_count``). Outside the block nothing is subscribed, so it costs nothing.
    CUPTI takes one subscriber per process: a second interposer at once is refused.
    """

    failures: list[str]
    failure_count: int
    graph_launches: int
    path: str

    def __init__(self, rewrite: Any) -> None:
        if not callable(rewrite):
            raise ShimrtError(f"rewrite must be a function of a launch, not {rewrite!r:.100}")
        self._rewrite = rewrite
        self.failures, self.failure_count, self.graph_launches = [], 0, 0
        self._lib, self.path = _library()
        self._callback = _CallbackFunc(self.on_callback)  # kept alive here while CUPTI holds it
        self._subscriber = _CUpti_SubscriberHandle()

    def on_callback(self, userdata, domain, cbid, cbdata) -> None:
        """CUPTI's callback (userdata, domain, callback id, the callback data's address): a launch
        at API entry is read and handed to ``rewrite``; a graph launch is counted. Never raises: a
        failure is counted in ``failure_count`` and its text kept in ``failures``."""
        try:
            if domain != _DRIVER_DOMAIN:
                return
            data = _read(CALLBACK_DATA, cbdata)
            if data["site"] != _API_ENTER:
                return
            if cbid in GRAPH_LAUNCHES:
                self.graph_launches += 1
                return
            if cbid not in LAUNCH_CALLBACKS:
                return
            launch = read_launch(cbid, data["params"])
            launch["name"] = ctypes.string_at(data["symbol_name"]).decode(errors="replace") \
                if data["symbol_name"] else ""
            value = self._rewrite(launch)
            if value is not None and value != launch["dynamic_smem"]:
                write_dynamic_smem(launch, int(value))
        except BaseException as exc:  # a callback must not raise: the launch goes ahead unchanged
            self.failure_count += 1
            if len(self.failures) < 100:
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> LaunchInterposer:
        lib = self._lib
        check((CuptiResult(lib.cuptiSubscribe(ctypes.byref(self._subscriber), self._callback, None)),),
              "cuptiSubscribe")
        try:
            for cbid in (*LAUNCH_CALLBACKS, *GRAPH_LAUNCHES):
                check((CuptiResult(lib.cuptiEnableCallback(1, self._subscriber, _DRIVER_DOMAIN, cbid)),),
                      "cuptiEnableCallback")
        except BaseException:
            lib.cuptiUnsubscribe(self._subscriber)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        check((CuptiResult(self._lib.cuptiUnsubscribe(self._subscriber)),), "cuptiUnsubscribe")
