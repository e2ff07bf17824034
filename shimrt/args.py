"""Kernel arguments: device pointers from any array library, scalars packed to the kernel's layout.

The rule, checked before every launch:
- a shimrt Buffer, or any object with ``__cuda_array_interface__`` or device DLPack
  (torch, CuPy, JAX arrays) is passed as its data pointer; the parameter must be 8 bytes;
- a numpy scalar (``np.float32(2)``, ``np.int64(n)``) or a ctypes scalar is passed as its
  bytes; its size must equal the parameter's;
- a plain Python ``int`` takes the parameter's size as a signed integer (an unsigned value
  that only fits unsigned is accepted); a plain ``float`` is float32 for a 4-byte parameter
  and float64 for an 8-byte one. Where the driver cannot report parameter sizes, plain
  Python numbers are refused: pass numpy scalars.
- a host array (numpy) is refused: copy it with ``Device.to_device`` first.
"""

from __future__ import annotations

import ctypes
import operator
import struct
import sys
from typing import Any, Callable

import numpy as np

from . import dlpack
from .errors import UsageError

__all__ = ["pointer_getters", "encode", "Packer"]

_INT = {1: "b", 2: "h", 4: "i", 8: "q"}
_UINT = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FLOAT = {4: "f", 8: "d"}


# type -> f(obj) giving its device address (None when it is not in device memory): the launch
# fast path reads a pointer with one dict lookup and one call. Filled as types are first seen.
_POINTERS: dict[type, Callable[[object], int | None]] = {}


def _torch_pointer(tensor) -> int | None:
    # torch's __cuda_array_interface__ builds a dict in Python on every call (~10 us a launch);
    # data_ptr() is the same address. is_cuda is also true for ROCm builds' GPU tensors.
    return tensor.data_ptr() if tensor.is_cuda else None


def _cupy_pointer(array) -> int:
    return array.data.ptr  # CuPy arrays always live on a device


def pointer_getters() -> dict[type, Callable[[object], int | None]]:
    """The registry of per-type pointer getters (shared: entries added later are seen)."""
    if not _POINTERS:
        from .memory import Buffer
        _POINTERS[Buffer] = operator.attrgetter("device_pointer")
    return _POINTERS


def _learn(obj) -> Callable[[object], int | None] | None:
    """A fast getter for ``obj``'s type when it is a torch tensor or CuPy array (registered)."""
    torch, cupy = sys.modules.get("torch"), sys.modules.get("cupy")
    getter: Callable[[object], int | None] | None = None
    if torch is not None and isinstance(obj, getattr(torch, "Tensor", ())):
        getter = _torch_pointer
    elif cupy is not None and isinstance(obj, getattr(cupy, "ndarray", ())):
        getter = _cupy_pointer
    if getter is not None:
        pointer_getters()[type(obj)] = getter
    return getter


def pointer_of(obj: Any) -> int | None:
    """The device address behind ``obj``, or None if it is not a device array."""
    getter = pointer_getters().get(type(obj)) or _learn(obj)
    if getter is not None:
        ptr = getter(obj)
        if ptr is not None:
            return ptr
        # None: a freed Buffer or a host tensor; the general path below says which.
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0] or 0)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        kind, _ = dlpack.device_of(obj)
        if kind not in dlpack.DEVICE_MEMORY:
            return None
        return dlpack.data_pointer(obj)
    return None


def _describe(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


def encode(index: int, value: Any, size: int) -> bytes:
    """The bytes of argument ``index`` for a parameter of ``size`` bytes (see the module rule)."""
    if isinstance(value, (np.generic, ctypes._SimpleCData)):
        raw = value.tobytes() if isinstance(value, np.generic) else bytes(value)
        if len(raw) != size:
            raise UsageError(f"argument {index}: {_describe(value)} is {len(raw)} bytes but the kernel's "
                             f"parameter is {size} bytes")
        return raw
    if isinstance(value, (bool, int)) and not isinstance(value, np.ndarray):
        value = int(value)
        for table in (_INT, _UINT):
            if size in table:
                try:
                    return struct.pack("<" + table[size], value)
                except struct.error:
                    continue
        raise UsageError(f"argument {index}: {value} does not fit the kernel's {size}-byte integer parameter")
    if isinstance(value, float):
        if size not in _FLOAT:
            raise UsageError(f"argument {index}: a float cannot fill a {size}-byte parameter")
        try:
            return struct.pack("<" + _FLOAT[size], value)
        except OverflowError:
            raise UsageError(f"argument {index}: {value!r} is beyond the range of the kernel's float32 "
                             "parameter") from None
    if isinstance(value, np.ndarray):
        raise UsageError(f"argument {index}: a numpy array lives on the host; pass device memory "
                         "(Device.to_device(array)) or a numpy scalar")
    ptr = pointer_of(value)
    if ptr is None:
        raise UsageError(f"argument {index}: cannot pass {_describe(value)} to a kernel; pass device memory "
                         "(a Buffer, a torch/CuPy array), a numpy scalar or a Python int/float")
    if size != 8:
        raise UsageError(f"argument {index}: a device pointer is 8 bytes but the kernel's parameter is {size}")
    return struct.pack("<Q", ptr)


class Packer:
    """Packs arguments into one reusable parameter block laid out as the kernel's parameters.

    The driver copies the parameters during the launch call, so the block can be reused by
    the next launch; it must not be shared between threads (the Kernel keeps one per thread).
    """

    def __init__(self, kernel_name: str, layout: list[tuple[int, int]] | None):
        self.name = kernel_name
        self.layout = layout
        if layout is not None:
            self._prepare(layout)

    def _prepare(self, layout):
        total = max((o + s for o, s in layout), default=0)
        # Whole 8-byte words, so that the block can also be viewed as 8-byte items (launch fast path).
        self._block = (ctypes.c_char * (-(-max(total, 1) // 8) * 8))()
        self._view = memoryview(self._block).cast("B")
        base = ctypes.addressof(self._block)
        self._pointers = (ctypes.c_void_p * max(len(layout), 1))(*[base + o for o, _ in layout])
        self.address = ctypes.addressof(self._pointers)
        self._slots = tuple(layout)
        self._count = len(layout)

    def pack(self, args: tuple) -> int:
        """Write ``args`` into the parameter block; return the address of the pointer array."""
        if self.layout is None:
            self._prepare(self._infer(args))
        elif len(args) != self._count:
            sizes = ", ".join(str(s) for _, s in self.layout)
            raise UsageError(f"kernel {self.name} takes {self._count} arguments "
                             f"(parameter sizes {sizes} bytes), got {len(args)}")
        view = self._view
        for i, value in enumerate(args):
            offset, size = self._slots[i]
            view[offset:offset + size] = encode(i, value, size)
        return self.address

    def block(self) -> tuple[memoryview, int]:
        """(the parameter block as bytes, the address of its pointer array) for code that writes
        arguments itself (the launch fast path)."""
        if self.layout is None:
            raise UsageError(f"kernel {self.name}: its parameter layout is unknown")
        return self._view, self.address

    def _infer(self, args) -> list[tuple[int, int]]:
        """Natural-alignment layout from the arguments alone (drivers without cuFuncGetParamInfo)."""
        layout, offset = [], 0
        for i, value in enumerate(args):
            if isinstance(value, np.generic):
                size = value.itemsize
            elif isinstance(value, ctypes._SimpleCData):
                size = ctypes.sizeof(value)
            elif isinstance(value, (int, float)):
                raise UsageError(f"argument {i}: this driver cannot report kernel {self.name}'s parameter sizes, "
                                 "so plain Python numbers are ambiguous; pass numpy scalars (np.int32(n))")
            else:
                size = 8
            offset = -(-offset // size) * size
            layout.append((offset, size))
            offset += size
        return layout
