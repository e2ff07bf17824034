"""The HIP runtime, through hip-python, behind the interface ``shimrt.device`` uses.

Mirrors ``shimrt/cuda/driver.py`` name for name. HIP has no explicit contexts in this API: a
device's "context" is its ordinal, made current with hipSetDevice. Every call's return
convention was checked against hip-python's documentation (a tuple: the hipError_t first,
then the out-parameters); without an AMD GPU they are exercised only up to the HIP error.
"""

from __future__ import annotations

import threading
from typing import Any

from ..backends import Driver, members
from ..errors import NoDeviceError, ShimrtError
from ..vendor import read_attributes, ready
from .check import bindings, check, loaded, raise_for
from .check import library_path as _library_path

#: what the core may call (Driver, :mod:`shimrt.backends`)
__all__ = members(Driver)

NAME = "hip"
DLPACK_DEVICE_TYPE = 10         # kDLROCM

_ATTRS = {  # our name -> hipDeviceAttribute*
    "num_sms": "MultiprocessorCount",
    "warp_size": "WarpSize",
    "max_threads_per_sm": "MaxThreadsPerMultiProcessor",
    "max_blocks_per_sm": "MaxBlocksPerMultiProcessor",
    "regs_per_sm": "MaxRegistersPerMultiprocessor",
    "smem_per_sm": "MaxSharedMemoryPerMultiprocessor",
    "smem_per_block_optin": "SharedMemPerBlockOptin",
    "reserved_smem_per_block": "ReservedSharedMemPerBlock",
    "max_threads_per_block": "MaxThreadsPerBlock",
    "max_smem_per_block_default": "MaxSharedMemoryPerBlock",
    "regs_per_block": "MaxRegistersPerBlock",
}

_FUNC_ATTRS = {  # our name -> HIP_FUNC_ATTRIBUTE_*
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "static_smem": "SHARED_SIZE_BYTES",
    "const_bytes": "CONST_SIZE_BYTES",
    "local_bytes": "LOCAL_SIZE_BYTES",
    "registers": "NUM_REGS",
    "ptx_version": "PTX_VERSION",
    "binary_version": "BINARY_VERSION",
    "max_dynamic_smem": "MAX_DYNAMIC_SHARED_SIZE_BYTES",
}

_current = threading.local()  # the device made current on this thread


def _hip():
    return bindings()[0]


def _address(obj) -> int:
    """A hip-python pointer object (or None) as an integer address."""
    if obj is None:
        return 0
    try:
        return int(obj)
    except TypeError:
        return obj.as_c_void_p().value or 0


def library_path() -> str | None:
    """The HIP runtime library (libamdhip64) in use."""
    return _library_path("libamdhip64.so")


def binding_version() -> str:
    """'hip-python X.Y.Z'."""
    from importlib.metadata import version
    return f"hip-python {version('hip-python')}"


def init() -> None:
    """Load and initialise HIP; :class:`NoDeviceError` naming HIP's error if there is no device."""
    hip = _hip()
    (err,) = loaded(lambda: hip.hipInit(0))
    if int(err) == 0:
        err, count = hip.hipGetDeviceCount()
        if int(err) == 0 and count > 0:
            return
    name = getattr(err, "name", str(err))
    raise NoDeviceError(f"the HIP runtime reports no usable device ({name})")


def version() -> int:
    """The HIP runtime version number (HIP_VERSION: major * 10**7 + minor * 10**5 + patch)."""
    return check(_hip().hipRuntimeGetVersion(), "hipRuntimeGetVersion")


def device_count() -> int:
    return check(_hip().hipGetDeviceCount(), "hipGetDeviceCount")


def get_device(index: int) -> Any:
    return check(_hip().hipDeviceGet(index), "hipDeviceGet")


def device_name(dev: Any) -> str:
    raw = check(_hip().hipDeviceGetName(256, dev), "hipDeviceGetName")
    raw = bytes(raw) if not isinstance(raw, str) else raw.encode()
    return raw.split(b"\0", 1)[0].decode()


def device_properties(dev: Any) -> dict:
    """The attributes a Target needs, plus name, arch and total memory. An attribute this HIP
    does not report is None (the arch's profile then supplies it)."""
    hip = _hip()
    props: dict[str, Any] = {}
    for ours, theirs in _ATTRS.items():
        err, value = hip.hipDeviceGetAttribute(getattr(hip.hipDeviceAttribute_t, "hipDeviceAttribute" + theirs), dev)
        props[ours] = int(value) if int(err) == 0 else None
    prop = hip.hipDeviceProp_t()
    loaded(lambda: check(hip.hipGetDeviceProperties(prop, dev), "hipGetDeviceProperties"))
    arch = prop.gcnArchName
    arch = bytes(arch).split(b"\0", 1)[0].decode() if not isinstance(arch, str) else arch
    props["arch"] = arch.split(":", 1)[0]          # "gfx90a:sramecc+:xnack-" -> "gfx90a"
    props["name"] = device_name(dev)
    props["total_memory"] = check(hip.hipDeviceTotalMem(dev), "hipDeviceTotalMem")
    return props


def timestamp_hz(dev: Any) -> int:
    """Ticks per second of shimrt_timestamp() (wall_clock64) on this device."""
    hip = _hip()
    khz = check(hip.hipDeviceGetAttribute(hip.hipDeviceAttribute_t.hipDeviceAttributeWallClockRate, dev),
                "hipDeviceGetAttribute(WallClockRate)")
    return int(khz) * 1000


def context_retain(dev: Any) -> Any:
    """HIP's per-thread current device stands in for a context: the device ordinal."""
    check(_hip().hipSetDevice(dev), "hipSetDevice")
    _current.ctx = dev
    return dev


def context_release(dev: Any) -> None:
    _current.ctx = None


def make_current(ctx: Any) -> None:
    """Make device ``ctx`` current on this thread (a no-op when it already is)."""
    if getattr(_current, "ctx", None) != ctx:
        check(_hip().hipSetDevice(ctx), "hipSetDevice")
        _current.ctx = ctx


def synchronize() -> None:
    check(_hip().hipDeviceSynchronize(), "hipDeviceSynchronize")


def priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority; greater priority is lower."""
    least, greatest = check(_hip().hipDeviceGetStreamPriorityRange(), "hipDeviceGetStreamPriorityRange")
    return int(least), int(greatest)


# --- modules and functions ---------------------------------------------------------------

def module_load(binary: bytes) -> Any:
    return check(_hip().hipModuleLoadData(binary), "hipModuleLoadData")


def module_unload(module: Any) -> None:
    check(_hip().hipModuleUnload(module), "hipModuleUnload")


def module_function(module: Any, name: str) -> Any:
    """The function ``name``, or None when the module has no such kernel."""
    hip = _hip()
    err, fn = hip.hipModuleGetFunction(module, name.encode())
    if err == hip.hipError_t.hipErrorNotFound:
        return None
    check((err,), f"hipModuleGetFunction({name!r})")
    return fn


def function_attributes(fn: Any) -> dict:
    hip = _hip()
    return read_attributes(check, _FUNC_ATTRS, hip.hipFunction_attribute, "HIP_FUNC_ATTRIBUTE_",
                            lambda attr: hip.hipFuncGetAttribute(attr, fn), "hipFuncGetAttribute")


def handle_attributes(handle: int, dev: Any) -> dict:
    """The CUDA backend reads a foreign launch's function by its handle (launch interposition);
    HIP has no launch interposer bound yet (roctracer), so nothing hands it a handle."""
    raise ShimrtError("attributes of functions other code launches are not read on HIP yet: launch interposition "
                      "needs roctracer, which shimrt does not bind yet")


def handle_set_max_dynamic_smem(handle: int, dev: Any, nbytes: int) -> None:
    """Not on HIP yet (see handle_attributes)."""
    raise ShimrtError("launch interposition is not available on HIP yet (it needs roctracer)")


def function_param_layout(fn: Any) -> list[tuple[int, int]] | None:
    """HIP cannot report parameter layouts; the code object's metadata gives them (Program.params)."""
    return None


def function_set_max_dynamic_smem(fn: Any, nbytes: int) -> None:
    hip = _hip()
    attr = hip.hipFuncAttribute.hipFuncAttributeMaxDynamicSharedMemorySize
    check(hip.hipFuncSetAttribute(fn, attr, nbytes), "hipFuncSetAttribute(MaxDynamicSharedMemorySize)")


def function_set_carveout(fn: Any, percent: int) -> None:
    """Preferred shared-memory carveout of the function, in percent (AMD's LDS is not shared with L1:
    HIP accepts and ignores it)."""
    hip = _hip()
    attr = hip.hipFuncAttribute.hipFuncAttributePreferredSharedMemoryCarveout
    check(hip.hipFuncSetAttribute(fn, attr, percent), "hipFuncSetAttribute(PreferredSharedMemoryCarveout)")


def occupancy(fn: Any, block_size: int, dynamic_smem: int) -> int:
    return check(_hip().hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(fn, block_size, dynamic_smem),
                 "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor")


def launcher() -> Any:
    """The raw launch call for the hot path: f(fn, gx, gy, gz, bx, by, bz, smem, stream,
    params_address, extra) -> (err,), err falsy on success; pass a failure to :func:`launch_error`."""
    return _hip().hipModuleLaunchKernel


def launch_error(err: Any) -> None:
    """Raise the DriverError for a failed launch."""
    raise_for("hipModuleLaunchKernel", err)


def is_invalid_context(err: Any) -> bool:
    """True when a launch may have failed only because another device is current on this thread
    (the caller makes the right one current and retries once)."""
    e = _hip().hipError_t
    return err in (e.hipErrorInvalidContext, e.hipErrorInvalidDevice, e.hipErrorInvalidHandle,
                   e.hipErrorInvalidResourceHandle)


# --- memory ------------------------------------------------------------------------------

def mem_alloc(nbytes: int) -> int:
    return _address(check(_hip().hipMalloc(nbytes), f"hipMalloc({nbytes})"))


def mem_free(ptr: int) -> None:
    check(_hip().hipFree(ptr), "hipFree")


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    free, total = check(_hip().hipMemGetInfo(), "hipMemGetInfo")
    return int(free), int(total)


def memcpy_htod(dst: int, src_host: int, nbytes: int, stream: Any) -> None:
    check(_hip().hipMemcpyHtoDAsync(dst, src_host, nbytes, stream), "hipMemcpyHtoDAsync")


def memcpy_dtoh(dst_host: int, src: int, nbytes: int, stream: Any) -> None:
    check(_hip().hipMemcpyDtoHAsync(dst_host, src, nbytes, stream), "hipMemcpyDtoHAsync")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Any) -> None:
    check(_hip().hipMemcpyDtoDAsync(dst, src, nbytes, stream), "hipMemcpyDtoDAsync")


def memset_d8(dst: int, value: int, nbytes: int, stream: Any) -> None:
    check(_hip().hipMemsetD8Async(dst, value, nbytes, stream), "hipMemsetD8Async")


# --- streams and events ------------------------------------------------------------------

def stream_create(priority: int) -> Any:
    """A non-blocking stream (no implicit sync with the null stream)."""
    hip = _hip()
    return check(hip.hipStreamCreateWithPriority(hip.hipStreamNonBlocking, priority), "hipStreamCreateWithPriority")


def stream_priority(stream: Any) -> int:
    return int(check(_hip().hipStreamGetPriority(stream), "hipStreamGetPriority"))


def stream_destroy(stream: Any) -> None:
    check(_hip().hipStreamDestroy(stream), "hipStreamDestroy")


def stream_synchronize(stream: Any) -> None:
    check(_hip().hipStreamSynchronize(stream), "hipStreamSynchronize")


def stream_query(stream: Any) -> bool:
    """True when all work on the stream has finished."""
    return ready(check, _hip().hipStreamQuery(stream), _hip().hipError_t.hipErrorNotReady, "hipStreamQuery")


def stream_wait_event(stream: Any, event: Any) -> None:
    check(_hip().hipStreamWaitEvent(stream, event, 0), "hipStreamWaitEvent")


def stream_handle(stream: Any) -> int:
    """The stream as an integer (what other libraries take)."""
    return _address(stream)


def null_stream() -> Any:
    return None  # hip-python passes None as the NULL stream


def event_create(timing: bool) -> Any:
    hip = _hip()
    return check(hip.hipEventCreateWithFlags(hip.hipEventDefault if timing else hip.hipEventDisableTiming),
                 "hipEventCreateWithFlags")


def event_record(event: Any, stream: Any) -> None:
    check(_hip().hipEventRecord(event, stream), "hipEventRecord")


def event_synchronize(event: Any) -> None:
    check(_hip().hipEventSynchronize(event), "hipEventSynchronize")


def event_query(event: Any) -> bool:
    """True when the event has completed."""
    return ready(check, _hip().hipEventQuery(event), _hip().hipError_t.hipErrorNotReady, "hipEventQuery")


def event_elapsed_ms(start: Any, end: Any) -> float:
    return float(check(_hip().hipEventElapsedTime(start, end), "hipEventElapsedTime"))


def event_destroy(event: Any) -> None:
    check(_hip().hipEventDestroy(event), "hipEventDestroy")


# --- SM partitions (CU-masked streams) --------------------------------------------------------

def sm_partition(dev: Any, sm_count: int) -> Any:
    """Split the device's CUs in two: the first ``sm_count`` and the rest. Returns
    ``[(mask, None, cus), (mask, None, cus)]`` (the split first): HIP partitions by masking a
    stream's CUs, in the same context (None: nothing to load per partition)."""
    total = device_properties(dev)["num_sms"]
    split, rest = cu_masks(total, sm_count)
    return [(split, None, sm_count), (rest, None, total - sm_count)]


def cu_masks(total: int, count: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(first ``count`` CUs, the other ``total - count``) as hipExtStreamCreateWithCUMask's
    32-bit words, CU 0 in bit 0 of word 0."""
    if not 0 < count < total:
        raise NoDeviceError(f"cannot set {count} of {total} CUs apart")
    words = -(-total // 32)
    every = (1 << total) - 1
    first = (1 << count) - 1
    rest = every & ~first

    def split(value: int) -> tuple[int, ...]:
        return tuple((value >> (32 * i)) & 0xFFFFFFFF for i in range(words))

    return split(first), split(rest)


def partition_stream_create(handle: Any, priority: int) -> Any:
    """A stream restricted to the CUs of ``handle`` (a CU mask). CU-masked streams have the
    default priority: HIP takes no priority with a mask."""
    import ctypes
    hip = _hip()
    # hip-python 6.2 passes hipExtStreamCreateWithCUMask an uninitialised one-word mask (its
    # generator took the const uint32_t* for an output), so the call goes through ctypes.
    lib = ctypes.CDLL(library_path() or "libamdhip64.so")
    fn = lib.hipExtStreamCreateWithCUMask
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    fn.restype = ctypes.c_int
    out = ctypes.c_void_p()
    mask = (ctypes.c_uint32 * len(handle))(*handle)
    err = fn(ctypes.byref(out), len(handle), mask)
    check((hip.hipError_t(err),), "hipExtStreamCreateWithCUMask")
    return hip.ihipStream_t.fromObj(out.value)


def partition_destroy(handle: Any) -> None:
    """Nothing to free: a CU mask is plain data."""
