"""DLPack through ctypes: read the data pointer of a producer's tensor, and export Buffers.

Layouts follow dlpack.h (DLTensor, DLManagedTensor, v0.8+ unversioned capsule "dltensor").
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

__all__ = ["DEVICE_MEMORY", "device_of", "tensor_info", "data_pointer", "export"]

# DLDeviceType values used here.
CPU, CUDA, CUDA_HOST, ROCM, ROCM_HOST, CUDA_MANAGED = 1, 2, 3, 10, 11, 13
DEVICE_MEMORY = {CUDA, CUDA_MANAGED, ROCM}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


_CAPSULE_NAME = b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _Destructor]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.c_void_p]
# The same function taking the capsule as a raw PyObject*, for use inside its destructor.
_RawGetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def device_of(obj: Any) -> tuple[int, int]:
    """(DLDeviceType, device id) from ``__dlpack_device__``."""
    dev = obj.__dlpack_device__()
    return int(dev[0]), int(dev[1])


_DL_DTYPES = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64", (1, 8): "uint8",
              (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64", (2, 16): "float16", (2, 32): "float32",
              (2, 64): "float64", (4, 16): "bfloat16", (6, 8): "bool"}


def tensor_info(obj: Any) -> tuple[int, str, tuple[int, ...], bool]:
    """(data pointer, dtype name, shape, C-contiguous) of a DLPack producer's tensor."""
    capsule = obj.__dlpack__()
    if not _api.PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        raise ValueError("__dlpack__ did not return an unconsumed 'dltensor' capsule")
    t = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME)).dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    contiguous = True
    if t.strides:
        expected = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expected:
                contiguous = False
            expected *= shape[i]
    dtype = _DL_DTYPES.get((t.dtype.code, t.dtype.bits), f"dlpack(code={t.dtype.code}, bits={t.dtype.bits})")
    if t.dtype.lanes != 1:
        dtype += f"x{t.dtype.lanes}"
    return (t.data or 0) + t.byte_offset, dtype, shape, contiguous


def data_pointer(obj: Any) -> int:
    """Address of the first element of a DLPack producer's tensor (data + byte_offset).

    The capsule is not consumed, so its destructor releases the producer's reference; the
    address stays valid as long as ``obj`` lives.
    """
    capsule = obj.__dlpack__()
    if not _api.PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        raise ValueError("__dlpack__ did not return an unconsumed 'dltensor' capsule")
    managed = DLManagedTensor.from_address(_api.PyCapsule_GetPointer(capsule, _CAPSULE_NAME))
    return (managed.dl_tensor.data or 0) + managed.dl_tensor.byte_offset


# --- export ------------------------------------------------------------------------------

_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "b": 6, "c": 5}  # kDLInt, kDLUInt, kDLFloat, kDLBool, kDLComplex
_exported: dict[int, tuple] = {}   # address of a DLManagedTensor -> what keeps it and its owner alive
_lock = threading.Lock()


def live_exports() -> int:
    """How many exported tensors no consumer has released yet (each keeps its buffer alive)."""
    return len(_exported)


def _release(address):
    with _lock:
        _exported.pop(address, None)


_delete = _Deleter(_release)  # what a consumer calls when it is done with the tensor


@_Destructor
def _capsule_destructor(capsule_ptr):
    # A capsule nobody consumed still owns its tensor: call the tensor's deleter.
    name = _api.PyCapsule_GetName(capsule_ptr)
    if name == _CAPSULE_NAME:
        address = _RawGetPointer(capsule_ptr, _CAPSULE_NAME)
        if address:
            _release(address)


def export(owner: Any, pointer: int, shape: tuple[int, ...], dtype: np.dtype, device: tuple[int, int]) -> Any:
    """A 'dltensor' capsule over device memory at ``pointer``; it keeps ``owner`` alive."""
    dtype = np.dtype(dtype)
    if dtype.kind not in _DTYPE_CODES:
        raise ValueError(f"dtype {dtype} cannot be exported through DLPack")
    managed = DLManagedTensor()
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    t = managed.dl_tensor
    t.data = pointer
    t.device = DLDevice(*device)
    t.ndim = len(shape)
    t.dtype = DLDataType(_DTYPE_CODES[dtype.kind], dtype.itemsize * 8, 1)
    t.shape = dims
    t.strides = None  # compact, row-major
    t.byte_offset = 0
    managed.deleter = _delete
    address = ctypes.addressof(managed)
    with _lock:
        _exported[address] = (managed, dims, owner)
    return _api.PyCapsule_New(address, _CAPSULE_NAME, _capsule_destructor)
