"""Device memory: :class:`Buffer`, its host and device copies, and its array interfaces.

Buffers export ``__cuda_array_interface__`` and DLPack. Host copies with ``stream=None`` first
wait for all work on the device and return when the copy is done; with a stream they are ordered
on it (and still return when done).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import validate
from .arrays import ArrayInfo
from .errors import UsageError
from .lifetime import Closing, finalizer

__all__ = ["as_shape", "as_dtype", "nbytes_of", "Buffer"]

if TYPE_CHECKING:
    from .device import Device


def as_shape(shape: Any) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints) as a tuple of non-negative ints."""
    allowed = "an int or a sequence of ints, each >= 0"
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        parts: tuple = (shape,)
    elif shape is None or isinstance(shape, (str, bytes, dict, set, frozenset)):  # unordered or not sizes at all
        raise UsageError(f"shape must be {allowed}, not {shape!r}")
    else:
        try:
            parts = tuple(shape)
        except TypeError:
            raise UsageError(f"shape must be {allowed}, not {shape!r}") from None
    if not all(isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)) and s >= 0 for s in parts):
        raise UsageError(f"shape must be {allowed}, not {shape!r}")
    return tuple(int(s) for s in parts)


#: numpy kinds a device array may have: booleans, integers, floats, complex numbers.
_DTYPE_KINDS = "biufc"


def as_dtype(dtype: Any) -> np.dtype:
    """``dtype`` (a numpy dtype, a scalar type such as ``np.float32``, or a name such as "int64") as a
    numpy dtype of plain numbers; objects, strings, records and None are refused."""
    allowed = "a numeric numpy dtype such as np.float32 or 'int64'"
    # np.dtype(None) is float64 and np.dtype(np.True_) bool: neither is what was meant.
    if dtype is None or isinstance(dtype, (bool, int, float, np.generic)):
        raise UsageError(f"dtype must be {allowed}, not {dtype!r}")
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):
        raise UsageError(f"dtype must be {allowed}, not {dtype!r}") from None
    if found.kind not in _DTYPE_KINDS or found.itemsize == 0:
        raise UsageError(f"dtype must be {allowed}, not {dtype!r} ({found})")
    return found


def nbytes_of(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of an array, in Python ints (numpy's int64 product would wrap around silently)."""
    return math.prod(shape) * dtype.itemsize


class Buffer(Closing):
    """Device memory with a dtype and shape (made by :meth:`Device.empty`, ``alloc`` and
    ``to_device``). Freed by :meth:`free` (or ``close``), its ``with`` block, or collection."""

    def __init__(self, device: "Device", ptr: int, nbytes: int, shape: Any, dtype: Any, owner: "Buffer | None"):
        self.device, self.nbytes, self.shape, self.dtype = device, nbytes, tuple(shape), np.dtype(dtype)
        self.device_pointer: int | None = ptr  # read by the launch fast path; None once freed
        self._owner = owner        # the Buffer whose memory a view shares
        self._finalizer = finalizer(self, device.driver.mem_free, ptr) if owner is None and ptr else None

    def __repr__(self) -> str:
        return f"<shimrt.Buffer {self.shape} {self.dtype} on device {self.device.index}>"

    @property
    def ptr(self) -> int:
        """The device address; UsageError once the memory is freed."""
        if self.device_pointer is None or (self._owner is not None and self._owner.device_pointer is None):
            raise UsageError("the buffer has been freed")
        return self.device_pointer

    @property
    def base(self) -> "Buffer":
        """The Buffer that owns this memory: itself, or the one a view was made from. Its
        ``device_pointer`` is None once the memory is freed."""
        return self._owner or self

    @property
    def size(self) -> int:
        """Elements."""
        return math.prod(self.shape)

    def array_info(self) -> ArrayInfo:
        """Pointer, dtype name, element count and item size (:func:`shimrt.arrays.describe`);
        UsageError once freed. Made once: a collective asks on every call."""
        ptr = self.ptr
        info = self.__dict__.get("_array_info")
        if info is None:
            info = self._array_info = ArrayInfo(ptr, self.dtype.name, self.size, self.dtype.itemsize)
        return info

    def view(self, dtype: Any = None, shape: Any = None) -> "Buffer":
        """The same memory as another dtype and/or shape (same number of bytes)."""
        dtype = self.dtype if dtype is None else as_dtype(dtype)
        if shape is None:
            if self.nbytes % dtype.itemsize:
                raise UsageError(f"dtype must fit the buffer's {self.nbytes} bytes a whole number of times, "
                                 f"not {dtype}")
            shape = (self.nbytes // dtype.itemsize,)
        shape = as_shape(shape)
        if nbytes_of(shape, dtype) != self.nbytes:
            raise UsageError(f"a view must have the buffer's {self.nbytes} bytes, not shape {shape} of {dtype} "
                             f"({nbytes_of(shape, dtype)} bytes)")
        return Buffer(self.device, self.ptr, self.nbytes, shape, dtype, owner=self._owner or self)

    def __getitem__(self, index: slice) -> "Buffer":
        """A view of a contiguous range of a 1-D buffer: ``buf[start:stop]`` (no step)."""
        if len(self.shape) != 1:
            raise UsageError(f"a buffer index must be a slice of a one-dimensional buffer, not {index!r} of one of "
                             f"shape {self.shape} (view(shape=...) it first)")
        bounds = (index.start, index.stop, index.step) if isinstance(index, slice) else ()
        if not isinstance(index, slice) or index.step not in (None, 1) or not all(
                b is None or isinstance(b, (int, np.integer)) and not isinstance(b, (bool, np.bool_)) for b in bounds):
            raise UsageError(f"a buffer index must be a slice buf[start:stop] of ints (no step), not {index!r}")
        start, stop, _ = index.indices(self.shape[0])
        count = max(stop - start, 0)
        return Buffer(self.device, self.ptr + start * self.dtype.itemsize, count * self.dtype.itemsize, (count,),
                      self.dtype, owner=self._owner or self)

    def _host(self, array, writable: bool) -> np.ndarray:
        # An object array holds pointers to Python objects: copying those bytes is never meant.
        if not isinstance(array, np.ndarray) or array.dtype.kind == "O":
            shown = f"an array of {array.dtype}" if isinstance(array, np.ndarray) else f"{array!r:.100}"
            raise UsageError(f"host array must be a numpy array of numbers, not {shown}")
        if not array.flags.c_contiguous:
            raise UsageError("host array must be C-contiguous (np.ascontiguousarray), not a strided view")
        if writable and not array.flags.writeable:
            raise UsageError("host array must be writable, not read-only")
        if array.nbytes != self.nbytes:
            raise UsageError(f"host array must have the buffer's {self.nbytes} bytes, not {array.nbytes}")
        return array

    def _copy(self, fn, a, b, stream) -> None:
        dev = self.device
        dev.activate()
        drv = dev.driver
        if stream is None:
            drv.synchronize()
            fn(a, b, self.nbytes, dev.stream_ref(None))
            drv.synchronize()
        else:
            ref = dev.stream_ref(stream)
            fn(a, b, self.nbytes, ref)
            drv.stream_synchronize(ref)

    def copy_from_host(self, array: np.ndarray, stream: Any = None) -> "Buffer":
        """Copy a host array of the same byte size into the buffer."""
        host = self._host(array, writable=False)
        if self.nbytes:
            self._copy(self.device.driver.memcpy_htod, self.ptr, host.ctypes.data, stream)
        return self

    def copy_to_host(self, out: np.ndarray | None = None, stream: Any = None) -> np.ndarray:
        """Copy the buffer into ``out`` (or a new array of its dtype and shape) and return it."""
        out = np.empty(self.shape, self.dtype) if out is None else self._host(out, writable=True)
        if self.nbytes:
            self._copy(self.device.driver.memcpy_dtoh, out.ctypes.data, self.ptr, stream)
        return out

    def numpy(self, stream: Any = None) -> np.ndarray:
        """A new host array with the buffer's contents."""
        return self.copy_to_host(stream=stream)

    def copy_from(self, other: "Buffer", stream: Any = None) -> "Buffer":
        """Copy another device buffer of the same byte size into this one."""
        if not isinstance(other, Buffer):
            raise UsageError(f"copy_from() takes a shimrt Buffer, not {other!r:.100}")
        if other.nbytes != self.nbytes:
            raise UsageError(f"source has {other.nbytes} bytes, the buffer {self.nbytes}")
        if self.nbytes:
            self._copy(self.device.driver.memcpy_dtod, self.ptr, other.ptr, stream)
        return self

    def memset(self, value: int, stream: Any = None) -> "Buffer":
        """Set every byte to ``value`` (0-255)."""
        value = validate.integer(value, "memset value", least=0, most=255)
        if self.nbytes:
            self._copy(self.device.driver.memset_d8, self.ptr, int(value), stream)
        return self

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device.driver.DLPACK_DEVICE_TYPE, self.device.index)

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        from . import dlpack
        if copy:
            raise BufferError("shimrt buffers are exported without copying")
        if stream is not None and stream != -1:
            self.device.synchronize()  # the consumer's stream then sees finished data
        return dlpack.export(self, self.ptr, self.shape, self.dtype, self.__dlpack_device__())

    def free(self) -> None:
        """Free the memory now (a view only forgets it)."""
        self.device_pointer = None
        if self._finalizer is not None:
            self._finalizer()

    close = free
