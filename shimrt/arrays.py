"""What a device array is, whatever library made it: pointer, dtype, element count, contiguity.

Accepts shimrt Buffers, objects with ``__cuda_array_interface__`` (CuPy, torch CUDA tensors,
Numba) and device DLPack producers (torch, CuPy, JAX).
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from . import dlpack
from .errors import UsageError

__all__ = ["ArrayInfo", "describe"]


class ArrayInfo(NamedTuple):
    """A device array as collectives and launches see it (a tuple: made on every call, cheaply)."""

    pointer: int
    dtype: str      # numpy-style name: "float32", "int64", "bfloat16", ...
    count: int  # type: ignore[assignment]  # elements (the field shadows tuple.count on purpose)
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize


_ITEMSIZE = {"bfloat16": 2}


def _from_dlpack(obj: Any, what: str) -> ArrayInfo:
    kind, _ = dlpack.device_of(obj)
    if kind not in dlpack.DEVICE_MEMORY:
        raise UsageError(f"{what} lives on the host (DLPack device {kind}); pass device memory")
    ptr, dtype, shape, contiguous = dlpack.tensor_info(obj)
    if not contiguous:
        raise UsageError(f"{what} is not contiguous; pass a contiguous array")
    itemsize = _ITEMSIZE.get(dtype) or np.dtype(dtype).itemsize
    return ArrayInfo(ptr, dtype, int(np.prod(shape, dtype=np.int64)), itemsize)


# torch dtype -> (numpy-style name, itemsize), filled as dtypes are first seen: a torch tensor is
# described from its own attributes (about 1 us) rather than __cuda_array_interface__, which torch
# builds in Python on every call (about 10 us, a collective's whole budget).
_TORCH_DTYPES: dict[Any, tuple[str, int]] = {}


def _torch_info(t: Any) -> ArrayInfo | None:
    """ArrayInfo of a contiguous CUDA (or ROCm) torch tensor of a dtype numpy names alike; None
    for anything else, which the general path below describes or refuses."""
    if not t.is_cuda or not t.is_contiguous():
        return None
    known = _TORCH_DTYPES.get(t.dtype)
    if known is None:
        name = str(t.dtype).removeprefix("torch.")
        if name != "bfloat16":
            try:
                if np.dtype(name).name != name:
                    return None
            except TypeError:
                return None
        known = _TORCH_DTYPES[t.dtype] = (name, t.element_size())
    return ArrayInfo(t.data_ptr(), known[0], t.numel(), known[1])


def describe(obj: Any, what: str = "array") -> ArrayInfo:
    """ArrayInfo of a contiguous device array; UsageError for host arrays and strided views."""
    torch = sys.modules.get("torch")
    if torch is not None and type(obj) is getattr(torch, "Tensor", None):
        info = _torch_info(obj)
        if info is not None:
            return info
    if isinstance(obj, np.ndarray):
        raise UsageError(f"{what} is a numpy array on the host; pass device memory (Device.to_device)")
    info = getattr(obj, "array_info", None)  # a shimrt Buffer: what it knows of itself, checked live
    if info is not None:
        return info()
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except (TypeError, RuntimeError, KeyError, ValueError):
        cai = None  # torch raises for dtypes numpy lacks (bfloat16): DLPack below describes those
    if cai is not None:
        try:
            dtype, shape, strides = np.dtype(cai["typestr"]), tuple(cai["shape"]), cai.get("strides")
            int(cai["data"][0] or 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{what}: its __cuda_array_interface__ must have typestr, shape and data as the "
                             f"protocol (version 3) says, not {cai!r} ({type(exc).__name__}: {exc})") from None
        if dtype.kind == "V" and hasattr(obj, "__dlpack__"):
            return _from_dlpack(obj, what)  # torch gives bfloat16 as raw "<V2": DLPack names it
        if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
            raise UsageError(f"{what} is not contiguous (strides {tuple(strides)}); pass a contiguous array")
        return ArrayInfo(int(cai["data"][0] or 0), dtype.name, int(np.prod(shape, dtype=np.int64)), dtype.itemsize)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, what)
    raise UsageError(f"{what}: cannot use {type(obj).__name__} as device memory (a shimrt Buffer, a torch "
                     "or CuPy array, or anything with __cuda_array_interface__ or DLPack)")


def _c_strides(shape, itemsize) -> tuple[int, ...]:
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))
