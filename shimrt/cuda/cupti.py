"""CUPTI's activity API through ctypes: the launch records of the kernels some code launches
(name, grid, block, registers per thread, static and dynamic shared memory).

Used to measure the footprint of kernels shimrt does not compile itself, such as NCCL's. CUDA
only (the HIP counterpart would be roctracer); not part of the mirrored backend interface.
"""

from __future__ import annotations

import ctypes
import struct
import threading

from ..errors import ShimrtError

KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
_SUCCESS = 0
_MAX_LIMIT_REACHED = 12   # CUPTI_ERROR_MAX_LIMIT_REACHED: no more records in the buffer
_BUFFER_SIZE = 8 << 20
_ALIGN = 8

# CUpti_ActivityKernel10 (cupti_activity.h of CUPTI 12.x and 13.x): our name -> (offsetof,
# struct code). tests/test_cupti.py compares these with the C compiler's offsetof on the header.
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

_Requested = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                              ctypes.POINTER(ctypes.c_size_t))
_Completed = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_size_t)


def _library():
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        path = load_nvidia_dynamic_lib("cupti").abs_path
    except Exception as exc:
        raise ShimrtError(f"CUPTI is not available (pip install nvidia-cuda-cupti): {exc}") from None
    lib = ctypes.CDLL(path)
    lib.cuptiActivityRegisterCallbacks.argtypes = [_Requested, _Completed]
    lib.cuptiActivityEnable.argtypes = [ctypes.c_int]
    lib.cuptiActivityDisable.argtypes = [ctypes.c_int]
    lib.cuptiActivityFlushAll.argtypes = [ctypes.c_uint32]
    lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
    lib.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib, path


def parse_kernel_record(address: int) -> dict:
    """The fields of KERNEL_RECORD read from a kernel activity record at ``address``."""
    size = max(o + struct.calcsize(f) for o, f in KERNEL_RECORD.values())
    raw = ctypes.string_at(address, size)
    rec = {k: struct.unpack_from("<" + f, raw, o)[0] for k, (o, f) in KERNEL_RECORD.items()}
    rec["name"] = ctypes.string_at(rec["name"]).decode(errors="replace") if rec["name"] else ""
    return rec


class KernelRecorder:
    """``with KernelRecorder() as rec: ...`` collects a record per kernel launched inside.

    ``rec.kernels`` is a list of dicts (see KERNEL_RECORD). Work must have finished by the end
    of the block (synchronize inside it); the records are flushed on exit.
    """

    def __init__(self):
        self.kernels: list[dict] = []
        self._buffers: dict[int, ctypes.Array] = {}
        self._lock = threading.Lock()
        self._lib, self.path = _library()
        self._requested = _Requested(self._on_requested)  # kept alive while registered
        self._completed = _Completed(self._on_completed)

    def _call(self, result: int, call: str) -> None:
        if result != _SUCCESS:
            text = ctypes.c_char_p()
            self._lib.cuptiGetResultString(result, ctypes.byref(text))
            raise ShimrtError(f"{call} failed: CUPTI error {result}: {(text.value or b'').decode()}")

    def _on_requested(self, buffer, size, max_records):
        raw = ctypes.create_string_buffer(_BUFFER_SIZE + _ALIGN)
        address = (ctypes.addressof(raw) + _ALIGN - 1) // _ALIGN * _ALIGN
        with self._lock:
            self._buffers[address] = raw
        buffer[0] = address
        size[0] = _BUFFER_SIZE
        max_records[0] = 0

    def _on_completed(self, context, stream_id, buffer, size, valid_size):
        record = ctypes.c_void_p()
        while self._lib.cuptiActivityGetNextRecord(buffer, valid_size, ctypes.byref(record)) == _SUCCESS:
            kind = ctypes.c_uint32.from_address(record.value).value
            if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
                self.kernels.append(parse_kernel_record(record.value))
        with self._lock:
            self._buffers.pop(buffer, None)

    def __enter__(self):
        self._call(self._lib.cuptiActivityRegisterCallbacks(self._requested, self._completed),
                   "cuptiActivityRegisterCallbacks")
        self._call(self._lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL), "cuptiActivityEnable")
        return self

    def __exit__(self, *exc):
        self._call(self._lib.cuptiActivityFlushAll(1), "cuptiActivityFlushAll")  # 1: CUPTI_ACTIVITY_FLAG_FLUSH_FORCED
        self._call(self._lib.cuptiActivityDisable(KIND_CONCURRENT_KERNEL), "cuptiActivityDisable")
