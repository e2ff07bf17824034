"""The CUDA driver API, through cuda-python, behind the small interface ``shimrt.device`` uses.

``shimrt/hip/driver.py`` provides the same names over hip-python. Handles returned here are
the binding's own objects; the device layer keeps them opaque.
"""

from __future__ import annotations

import threading
from typing import Any

from ..backends import Driver, members
from ..errors import NoDeviceError
from ..vendor import read_attributes, ready
from .check import bindings, check, raise_for
from .check import library_path as _library_path

#: what the core may call (Driver, :mod:`shimrt.backends`)
__all__ = members(Driver)

NAME = "cuda"
DLPACK_DEVICE_TYPE = 2          # kDLCUDA

_ATTRS = {  # our name -> CU_DEVICE_ATTRIBUTE_*
    "num_sms": "MULTIPROCESSOR_COUNT",
    "warp_size": "WARP_SIZE",
    "max_threads_per_sm": "MAX_THREADS_PER_MULTIPROCESSOR",
    "max_blocks_per_sm": "MAX_BLOCKS_PER_MULTIPROCESSOR",
    "regs_per_sm": "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "smem_per_sm": "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR",
    "smem_per_block_optin": "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "reserved_smem_per_block": "RESERVED_SHARED_MEMORY_PER_BLOCK",
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "max_smem_per_block_default": "MAX_SHARED_MEMORY_PER_BLOCK",
    "regs_per_block": "MAX_REGISTERS_PER_BLOCK",
    "cc_major": "COMPUTE_CAPABILITY_MAJOR",
    "cc_minor": "COMPUTE_CAPABILITY_MINOR",
}

_FUNC_ATTRS = {  # our name -> CU_FUNC_ATTRIBUTE_*
    "max_threads_per_block": "MAX_THREADS_PER_BLOCK",
    "static_smem": "SHARED_SIZE_BYTES",
    "const_bytes": "CONST_SIZE_BYTES",
    "local_bytes": "LOCAL_SIZE_BYTES",
    "registers": "NUM_REGS",
    "ptx_version": "PTX_VERSION",
    "binary_version": "BINARY_VERSION",
    "max_dynamic_smem": "MAX_DYNAMIC_SHARED_SIZE_BYTES",
}

_current = threading.local()  # the context made current on this thread, to skip redundant calls


def _driver():
    return bindings()[0]


def init() -> None:
    """Load and initialise the driver; :class:`NoDeviceError` with one line if there is none."""
    try:
        driver = _driver()
        (err,) = driver.cuInit(0)
    except NoDeviceError:
        raise
    except Exception as exc:  # cuda.pathfinder raises when libcuda.so is absent
        raise NoDeviceError(f"no CUDA driver: {exc}".splitlines()[0]) from None
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        if name == "CUDA_ERROR_NO_DEVICE":
            raise NoDeviceError("the CUDA driver is loaded but reports no device (CUDA_ERROR_NO_DEVICE)")
        raise NoDeviceError(f"cuInit failed: {name}")


def library_path() -> str | None:
    """The driver library (libcuda) in use."""
    return _library_path("cuda")


def binding_version() -> str:
    """'cuda-bindings X.Y.Z'."""
    import cuda.bindings
    return f"cuda-bindings {cuda.bindings.__version__}"


def version() -> int:
    """The driver's CUDA version as 1000 * major + 10 * minor."""
    return check(_driver().cuDriverGetVersion(), "cuDriverGetVersion")


def device_count() -> int:
    return check(_driver().cuDeviceGetCount(), "cuDeviceGetCount")


def get_device(index: int) -> Any:
    return check(_driver().cuDeviceGet(index), "cuDeviceGet")


def device_name(dev: Any) -> str:
    raw = check(_driver().cuDeviceGetName(256, dev), "cuDeviceGetName")
    return raw.split(b"\0", 1)[0].decode()


def device_properties(dev: Any) -> dict:
    """The attributes a Target needs, plus name, arch and total memory."""
    driver = _driver()
    props = read_attributes(check, _ATTRS, driver.CUdevice_attribute, "CU_DEVICE_ATTRIBUTE_",
                             lambda attr: driver.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute")
    props["arch"] = f"sm_{props.pop('cc_major')}{props.pop('cc_minor')}"
    props["name"] = device_name(dev)
    props["total_memory"] = check(driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
    return props


def timestamp_hz(dev: Any) -> int:
    """Ticks per second of shimrt_timestamp() on this device: %globaltimer counts nanoseconds."""
    return 1_000_000_000


def context_retain(dev: Any) -> Any:
    return check(_driver().cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


def context_release(dev: Any) -> None:
    check(_driver().cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
    _current.ctx = None


def make_current(ctx: Any) -> None:
    """Make ``ctx`` current on this thread (a no-op when it already is)."""
    if getattr(_current, "ctx", None) is not ctx:
        check(_driver().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        _current.ctx = ctx


def synchronize() -> None:
    check(_driver().cuCtxSynchronize(), "cuCtxSynchronize")


def priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority of the current context; greater priority is lower."""
    least, greatest = check(_driver().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    return int(least), int(greatest)


# --- modules and functions ---------------------------------------------------------------

def module_load(binary: bytes) -> Any:
    return check(_driver().cuModuleLoadData(binary), "cuModuleLoadData")


def module_unload(module: Any) -> None:
    check(_driver().cuModuleUnload(module), "cuModuleUnload")


def module_function(module: Any, name: str) -> Any:
    """The function ``name``, or None when the module has no such kernel."""
    driver = _driver()
    err, fn = driver.cuModuleGetFunction(module, name.encode())
    if err == driver.CUresult.CUDA_ERROR_NOT_FOUND:
        return None
    check((err,), f"cuModuleGetFunction({name!r})")
    return fn


def function_attributes(fn: Any) -> dict:
    driver = _driver()
    return read_attributes(check, _FUNC_ATTRS, driver.CUfunction_attribute, "CU_FUNC_ATTRIBUTE_",
                            lambda attr: driver.cuFuncGetAttribute(attr, fn), "cuFuncGetAttribute")


def handle_attributes(handle: int, dev: Any) -> dict:
    """function_attributes of a function some other code launched, known by its handle (an int,
    as a launch callback sees it): a CUfunction, or a CUkernel cast to one (PyTorch's, from
    the runtime's library loading), whose attributes only cuKernelGetAttribute answers."""
    driver = _driver()
    first = driver.cuFuncGetAttribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                      driver.CUfunction(handle))
    if first[0] != driver.CUresult.CUDA_ERROR_INVALID_HANDLE:
        return function_attributes(driver.CUfunction(handle))
    kernel = driver.CUkernel(handle)
    return read_attributes(check, _FUNC_ATTRS, driver.CUfunction_attribute, "CU_FUNC_ATTRIBUTE_",
                           lambda attr: driver.cuKernelGetAttribute(attr, kernel, dev), "cuKernelGetAttribute")


def handle_set_max_dynamic_smem(handle: int, dev: Any, nbytes: int) -> None:
    """function_set_max_dynamic_smem for a handle as handle_attributes takes it."""
    driver = _driver()
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    err = driver.cuFuncSetAttribute(driver.CUfunction(handle), attr, nbytes)
    if err[0] == driver.CUresult.CUDA_ERROR_INVALID_HANDLE:
        err = driver.cuKernelSetAttribute(attr, nbytes, driver.CUkernel(handle), dev)
    check(err, "cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")


def function_param_layout(fn: Any) -> list[tuple[int, int]] | None:
    """[(offset, size)] of each kernel parameter from the driver, or None if it cannot say."""
    driver = _driver()
    count = None
    try:  # the binding has it from 12.9 on; an older driver lacks the symbol (RuntimeError)
        err, n = driver.cuFuncGetParamCount(fn)
        count = int(n) if int(err) == 0 else None
    except (AttributeError, RuntimeError):
        pass
    layout = []
    index = 0
    while count is None or index < count:
        try:  # CUDA 12.4+
            err, offset, size = driver.cuFuncGetParamInfo(fn, index)
        except (AttributeError, RuntimeError):
            return None
        if int(err) != 0:
            if count is None and err == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
                break  # walked past the last parameter
            if err == driver.CUresult.CUDA_ERROR_NOT_SUPPORTED:
                return None
            raise_for("cuFuncGetParamInfo", err)
        layout.append((int(offset), int(size)))
        index += 1
    return layout


def function_set_max_dynamic_smem(fn: Any, nbytes: int) -> None:
    driver = _driver()
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(driver.cuFuncSetAttribute(fn, attr, nbytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")


def function_set_carveout(fn: Any, percent: int) -> None:
    """Preferred shared-memory carveout of the function, in percent of the maximum."""
    driver = _driver()
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    check(driver.cuFuncSetAttribute(fn, attr, percent), "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")


def occupancy(fn: Any, block_size: int, dynamic_smem: int) -> int:
    return check(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, block_size, dynamic_smem),
                 "cuOccupancyMaxActiveBlocksPerMultiprocessor")


def launcher() -> Any:
    """The raw launch call for the hot path: f(fn, gx, gy, gz, bx, by, bz, smem, stream,
    params_address, extra) -> (err,), err falsy on success; pass a failure to :func:`launch_error`."""
    return _driver().cuLaunchKernel


def launch_error(err: Any) -> None:
    """Raise the DriverError for a failed launch."""
    raise_for("cuLaunchKernel", err)


def is_invalid_context(err: Any) -> bool:
    """True when a call failed only because no (or another) context is current on this thread."""
    return err == _driver().CUresult.CUDA_ERROR_INVALID_CONTEXT


# --- memory ------------------------------------------------------------------------------

def mem_alloc(nbytes: int) -> int:
    return int(check(_driver().cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))


def mem_free(ptr: int) -> None:
    check(_driver().cuMemFree(ptr), "cuMemFree")


def mem_info() -> tuple[int, int]:
    """(free, total) bytes of device memory."""
    free, total = check(_driver().cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


def memcpy_htod(dst: int, src_host: int, nbytes: int, stream: Any) -> None:
    check(_driver().cuMemcpyHtoDAsync(dst, src_host, nbytes, stream), "cuMemcpyHtoDAsync")


def memcpy_dtoh(dst_host: int, src: int, nbytes: int, stream: Any) -> None:
    check(_driver().cuMemcpyDtoHAsync(dst_host, src, nbytes, stream), "cuMemcpyDtoHAsync")


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: Any) -> None:
    check(_driver().cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")


def memset_d8(dst: int, value: int, nbytes: int, stream: Any) -> None:
    check(_driver().cuMemsetD8Async(dst, value, nbytes, stream), "cuMemsetD8Async")


# --- streams and events ------------------------------------------------------------------

def stream_create(priority: int) -> Any:
    """A non-blocking stream (no implicit sync with the legacy default stream)."""
    driver = _driver()
    flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
    return check(driver.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority")


def stream_priority(stream: Any) -> int:
    return int(check(_driver().cuStreamGetPriority(stream), "cuStreamGetPriority"))


def stream_destroy(stream: Any) -> None:
    check(_driver().cuStreamDestroy(stream), "cuStreamDestroy")


def stream_synchronize(stream: Any) -> None:
    check(_driver().cuStreamSynchronize(stream), "cuStreamSynchronize")


def stream_query(stream: Any) -> bool:
    """True when all work on the stream has finished."""
    return ready(check, _driver().cuStreamQuery(stream), _driver().CUresult.CUDA_ERROR_NOT_READY, "cuStreamQuery")


def stream_wait_event(stream: Any, event: Any) -> None:
    check(_driver().cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")


def stream_handle(stream: Any) -> int:
    """The stream as an integer (what __cuda_array_interface__ and other libraries take)."""
    return int(stream)


def null_stream() -> Any:
    return _driver().CUstream(0)


def event_create(timing: bool) -> Any:
    driver = _driver()
    flags = driver.CUevent_flags.CU_EVENT_DEFAULT if timing else driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
    return check(driver.cuEventCreate(flags), "cuEventCreate")


def event_record(event: Any, stream: Any) -> None:
    check(_driver().cuEventRecord(event, stream), "cuEventRecord")


def event_synchronize(event: Any) -> None:
    check(_driver().cuEventSynchronize(event), "cuEventSynchronize")


def event_query(event: Any) -> bool:
    """True when the event has completed."""
    return ready(check, _driver().cuEventQuery(event), _driver().CUresult.CUDA_ERROR_NOT_READY, "cuEventQuery")


def event_elapsed_ms(start: Any, end: Any) -> float:
    return float(check(_driver().cuEventElapsedTime(start, end), "cuEventElapsedTime"))


def event_destroy(event: Any) -> None:
    check(_driver().cuEventDestroy(event), "cuEventDestroy")


# --- SM partitions (green contexts) -----------------------------------------------------------

def sm_partition(dev: Any, sm_count: int) -> Any:
    """Split the device's SMs in two: ``sm_count`` (rounded up by the driver to its granularity)
    and the rest. Returns ``[(handle, context, sms), (handle, context, sms)]`` (the split first),
    one green context each; the contexts are made current to load modules into them."""
    driver = _driver()
    sm = driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
    resource = check(driver.cuDeviceGetDevResource(dev, sm), "cuDeviceGetDevResource")
    groups, count, rest = check(driver.cuDevSmResourceSplitByCount(1, resource, 0, sm_count),
                                "cuDevSmResourceSplitByCount")
    if count != 1:
        raise NoDeviceError(f"the driver could not set {sm_count} SMs apart (cuDevSmResourceSplitByCount "
                            f"made {count} groups)")
    parts = []
    for res in (groups[0], rest):
        desc = check(driver.cuDevResourceGenerateDesc([res], 1), "cuDevResourceGenerateDesc")
        flags = driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        green = check(driver.cuGreenCtxCreate(desc, dev, flags), "cuGreenCtxCreate")
        ctx = check(driver.cuCtxFromGreenCtx(green), "cuCtxFromGreenCtx")
        parts.append((green, ctx, int(res.sm.smCount)))
    return parts


def partition_stream_create(handle: Any, priority: int) -> Any:
    """A non-blocking stream whose kernels run only on the partition's SMs."""
    driver = _driver()
    flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
    return check(driver.cuGreenCtxStreamCreate(handle, flags, priority), "cuGreenCtxStreamCreate")


def partition_destroy(handle: Any) -> None:
    check(_driver().cuGreenCtxDestroy(handle), "cuGreenCtxDestroy")
    _current.ctx = None
