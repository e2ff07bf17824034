"""Devices and SM partitions: opening a GPU through a backend, its context, and the public face
that the rest of shimrt (nccl, overlap, bench, torch) uses instead of backend handles.

The objects a Device makes live in their own modules: :mod:`shimrt.kernel` (Module, Kernel, the
launch fast path), :mod:`shimrt.memory` (Buffer), :mod:`shimrt.stream` (Stream, Event), and
:mod:`shimrt.lifetime` (closing and finalizers).
"""

from __future__ import annotations

import threading
from typing import Any, Iterable

import numpy as np

from . import backends, compiler, targets, validate
from .config import settings
from .errors import NoDeviceError, ShimrtError, UsageError
from .kernel import Module
from .lifetime import Owning, finalizer
from .memory import Buffer, as_dtype, as_shape, nbytes_of
from .program import Program
from .stream import PRIORITIES, Event, Stream, timeout_seconds
from .targets import Target

__all__ = ["Device", "Partition"]


class Device(Owning):
    """One GPU, through the CUDA backend when a CUDA driver and device are present (or HIP).

    ``backend`` (or ``SHIMRT_BACKEND``) forces one. With no driver or no device this raises
    :class:`NoDeviceError` whose message says why in one line.
    """

    def __init__(self, index: int = 0, backend: str | None = None):
        index = validate.integer(index, "device index", least=0, most=validate.MAX_INT32)  # a C int ordinal
        if backend is not None:
            validate.one_of(backend, "backend", backends.NAMES)
        requested = backend or settings().backend
        reasons, absent = [], []
        for name in ([requested] if requested else list(backends.NAMES)):
            try:
                drv = backends.load(name, "driver")
                drv.init()
                count = drv.device_count()
                if count == 0:
                    raise NoDeviceError(f"the {name} driver reports no device")
                break
            except NoDeviceError as exc:
                if exc.missing and not requested:  # a backend not installed is not why this GPU is missing
                    absent.append(name)
                else:
                    reasons.append(f"{name}: {exc}")
        else:
            if not reasons:
                raise NoDeviceError(f"no GPU backend is installed ({', '.join(absent)}): pip install 'shimrt[cuda]' "
                                    "for NVIDIA GPUs, 'shimrt[hip]' for AMD ones", missing=True)
            raise NoDeviceError("no GPU available (" + "; ".join(reasons + [f"{n}: not installed" for n in absent])
                                + ")")
        if index >= count:
            raise NoDeviceError(f"device {index} does not exist: the {name} driver reports {count} device(s)")
        self.index = index
        self.backend = name
        #: The backend's driver part (backends.Driver): the seam through which this device's
        #: kernels, buffers and streams make their driver calls.
        self.driver: backends.Driver = drv
        self._dev = drv.get_device(index)
        self._ctx = drv.context_retain(self._dev)
        self._finalizer = finalizer(self, drv.context_release, self._dev)
        drv.make_current(self._ctx)
        props = drv.device_properties(self._dev)
        self.name = props["name"]
        self.total_memory = props["total_memory"]
        self.target = _target_from(props, name)
        self.priority_range = drv.priority_range()  # (least, greatest)
        self.timestamp_hz = drv.timestamp_hz(self._dev)
        self._null = drv.null_stream()

    def __repr__(self) -> str:
        return f"<shimrt.Device {self.index}: {self.name} ({self.backend}, {self.target.arch})>"

    # --- lifetime ---
    def close(self) -> None:
        """Release the device's context. Objects made from it must be closed first."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def activate(self) -> None:
        """Make this device's context current on the calling thread."""
        if self.closed:
            raise UsageError(f"{self!r} is closed")
        self.driver.make_current(self._ctx)

    def device_count(self) -> int:
        """How many devices this device's driver reports (the indices ``Device(i)`` accepts)."""
        return self.driver.device_count()

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for all work on the device (at most ``timeout`` seconds when given: a positive number)."""
        if timeout is not None:
            timeout = timeout_seconds(timeout)
        self.activate()
        if timeout is None:
            self.driver.synchronize()
            return
        # No query covers every stream of a context, so the blocking call runs on a helper
        # thread and the caller stops waiting after the timeout.
        outcome: list[BaseException | None] = []

        def wait():
            try:
                self.activate()
                self.driver.synchronize()
                outcome.append(None)
            except BaseException as exc:  # handed to the caller below
                outcome.append(exc)

        helper = threading.Thread(target=wait, name="shimrt-synchronize", daemon=True)
        helper.start()
        helper.join(timeout)
        if helper.is_alive():
            raise ShimrtError(f"work on {self!r} did not finish within {timeout} s")
        if outcome[0] is not None:
            raise outcome[0]

    # --- compile and load ---
    def compile(self, source: str, *, options: Iterable[str] = (), name: str = "kernel.cu",
                include_dirs: Any = None, cache: bool | None = None,
                name_expressions: Iterable[str] = ()) -> Program:
        """``shimrt.compile`` for this device's own target, with the same arguments."""
        return compiler.compile(source, self.target, options=options, name=name, include_dirs=include_dirs,
                                cache=cache, name_expressions=name_expressions)

    def load(self, program: Program) -> Module:
        """Load a compiled program; its kernels are ``module["name"]``."""
        if not isinstance(program, Program):
            raise UsageError(f"load() takes a Program from shimrt.compile, not {program!r:.100}")
        _check_compatible(program.target, self.target)
        self.activate()
        return Module(self, self.driver.module_load(program.binary), program)

    # --- memory ---
    def alloc(self, nbytes: int) -> Buffer:
        """``nbytes`` of uninitialised device memory (a uint8 Buffer)."""
        return self.empty(validate.integer(nbytes, "nbytes", least=0), np.uint8)

    def empty(self, shape: Any, dtype: Any = np.float32) -> Buffer:
        """An uninitialised device array of ``shape`` (an int or a sequence of ints) and ``dtype`` (a
        numeric numpy dtype)."""
        shape, dtype = as_shape(shape), as_dtype(dtype)
        nbytes = nbytes_of(shape, dtype)
        if nbytes > self.total_memory:  # refused here, before a size the driver cannot even take
            raise UsageError(f"an array must fit in the {self.total_memory} bytes of {self.name}, not shape {shape} "
                             f"of {dtype}: it needs {nbytes} bytes")
        self.activate()
        ptr = self.driver.mem_alloc(nbytes) if nbytes else 0
        return Buffer(self, ptr, nbytes, shape, dtype, owner=None)

    def to_device(self, array: Any, stream: Stream | None = None) -> Buffer:
        """A device copy of a host array of numbers (same dtype and shape)."""
        host = host_array(array)
        buf = self.empty(host.shape, host.dtype)
        buf.copy_from_host(host, stream=stream)
        return buf

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        self.activate()
        return self.driver.mem_info()

    # --- streams and events ---
    def stream(self, priority: str | int = "low") -> Stream:
        """A non-blocking stream. ``"high"`` is the device's greatest priority, ``"low"`` its least;
        an int must lie in the device's range (see ``priority_range``)."""
        value = self._priority(priority)
        self.activate()
        return Stream(self, self.driver.stream_create(value))

    def _priority(self, priority) -> int:
        return stream_priority(priority, self.priority_range)

    def event(self, timing: bool = True) -> Event:
        """An event; ``timing=False`` makes it cheaper but unusable for elapsed time."""
        timing = validate.boolean(timing, "timing")
        self.activate()
        return Event(self, self.driver.event_create(timing), timing)

    def stream_handle(self, stream: Any) -> int:
        """The integer handle of ``stream``: a shimrt Stream of this device, None (the legacy
        default stream, 0 on CUDA), or another library's stream (``__cuda_stream__`` or
        ``cuda_stream``), as other libraries (NCCL, torch, CuPy) take it."""
        return self.driver.stream_handle(self.stream_ref(stream))

    def stream_query(self, stream: Any) -> bool:
        """True when everything queued on ``stream`` (any form :meth:`stream_handle` takes) has
        finished."""
        return self.driver.stream_query(self.stream_ref(stream))

    def stream_wait(self, stream: Any, event: Event) -> None:
        """Make later work on ``stream`` (a shimrt Stream, or another library's stream of this
        device) wait for ``event``, without the host waiting."""
        if not isinstance(event, Event):
            raise UsageError(f"stream_wait() takes a shimrt Event, not {event!r:.100}")
        self.driver.stream_wait_event(self.stream_ref(stream), event.ref())

    def stream_ref(self, stream: Any) -> Any:
        """The backend's handle of ``stream`` (any form :meth:`stream_handle` takes), for driver
        calls: part of the seam the device's kernels, buffers and streams use, with :attr:`driver`."""
        if stream is None:
            return self._null
        if isinstance(stream, Stream):
            if stream.device is not self and not stream.closed:
                raise UsageError("the stream belongs to another Device")
            return stream.ref()
        if hasattr(stream, "__cuda_stream__"):
            return int(stream.__cuda_stream__()[1])
        if hasattr(stream, "cuda_stream"):
            return int(stream.cuda_stream)
        raise UsageError(f"stream must be a shimrt Stream, None or a CUDA stream object, not {stream!r:.100}")

    # --- SM partitions ---
    def partition(self, sms: int) -> tuple["Partition", "Partition"]:
        """Split the SMs (CUs) in two: ``sms`` of them (the driver may round up to its
        granularity) and the rest. Returns (the split, the rest) as :class:`Partition` objects:
        kernels loaded into one and launched on its streams run only on its SMs. CUDA uses green
        contexts, HIP CU-masked streams. Memory from this device is usable in both."""
        sms = partition_sms(sms, self.target.num_sms)
        self.activate()
        parts = self.driver.sm_partition(self._dev, sms)
        self.activate()
        split, rest = (Partition(self, handle, ctx, count) for handle, ctx, count in parts)
        return split, rest

    # --- kernel tracing ---
    def record_kernels(self) -> Any:
        """A context manager that records every kernel launched inside it, whoever launches it
        (CUPTI on CUDA): ``with dev.record_kernels() as rec: ...; rec.kernels`` is a list of dicts
        (name, grid, block, registers, static and dynamic shared memory, start and end in ns).
        Work must have finished by the end of the block (synchronize inside it)."""
        return backends.load(self.backend, "trace").KernelRecorder()

    def foreign_function_attributes(self, handle: int) -> dict:
        """Registers, static and largest dynamic shared memory, threads, ... of a function other
        code launched, by the handle a launch interposer sees (an int): a CUfunction, or the
        CUkernel PyTorch's kernels are. Call it outside the interposer's callbacks."""
        handle = validate.integer(handle, "handle", least=1)
        self.activate()
        return self.driver.handle_attributes(handle, self._dev)

    def set_foreign_max_dynamic_smem(self, handle: int, nbytes: int) -> None:
        """Let the function behind ``handle`` (see :meth:`foreign_function_attributes`) launch
        with up to ``nbytes`` of dynamic shared memory (above 48 KiB a function must opt in)."""
        handle = validate.integer(handle, "handle", least=1)
        nbytes = validate.integer(nbytes, "nbytes", least=0, most=self.target.smem_per_block_optin)
        self.activate()
        self.driver.handle_set_max_dynamic_smem(handle, self._dev, nbytes)

    def interpose_launches(self, rewrite: Any) -> Any:
        """A context manager that calls ``rewrite(launch)`` at the entry of every kernel launch
        inside it, whoever launches it (CUPTI's launch callbacks on CUDA), and launches with the
        dynamic shared memory it returns (None: unchanged). ``launch`` holds the function, grid,
        block, dynamic shared memory, stream, cluster size and the cooperative flag. A failing
        ``rewrite`` leaves the launch unchanged and is kept in ``.failures``."""
        return backends.load(self.backend, "trace").LaunchInterposer(rewrite)


def stream_priority(priority: Any, priority_range: tuple[int, int]) -> int:
    """The driver's value of a stream ``priority``: "high" (the greatest of ``priority_range``,
    which is (least, greatest)), "low" (the least), or an int within the range."""
    least, greatest = priority_range
    low, high = min(least, greatest), max(least, greatest)
    allowed = f"'high', 'low' or an int in {low}..{high} ({greatest} is the greatest priority)"
    if isinstance(priority, str) and priority in PRIORITIES:
        return greatest if priority == "high" else least
    if isinstance(priority, (int, np.integer)) and not isinstance(priority, (bool, np.bool_)) \
            and low <= priority <= high:
        return int(priority)
    raise UsageError(f"stream priority must be {allowed}, not {priority!r}")


def partition_sms(sms: Any, num_sms: int) -> int:
    """``sms`` as the size of an SM partition of a device of ``num_sms``: 1..num_sms - 1, so that both
    sides keep at least one."""
    return validate.integer(sms, "sms", least=1, most=num_sms - 1)


def host_array(array: Any) -> np.ndarray:
    """``array`` as a C-contiguous host array of numbers (a numpy array, or a list of numbers)."""
    allowed = "a host array of numbers (numpy, or a list of numbers)"
    if array is None or np.isscalar(array) or isinstance(array, np.ndarray) and array.ndim == 0 \
            or hasattr(array, "__cuda_array_interface__"):  # a scalar would become a one-element array unasked
        raise UsageError(f"array must be {allowed}, not {array!r:.100}")
    try:
        host = np.ascontiguousarray(array)
    except (TypeError, ValueError, RuntimeError) as exc:  # device tensors, ragged lists
        raise UsageError(f"array must be {allowed}, not {array!r:.100} ({exc})") from None
    if host.dtype.kind not in "biufc":
        raise UsageError(f"array must be {allowed}, not {array!r:.100} of {host.dtype}")
    return host


def _target_from(props: dict, backend: str) -> Target:
    """A Target filled from a real device's attributes; granularities from the arch's profile."""
    try:
        base = targets.get(props["arch"])
    except ShimrtError:
        base = None
    keys = ("num_sms", "warp_size", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "smem_per_sm",
            "smem_per_block_optin", "reserved_smem_per_block", "max_threads_per_block", "max_smem_per_block_default",
            "regs_per_block")
    fields = {k: props[k] for k in keys if props.get(k) is not None}  # None: the driver cannot say
    name = props["name"] or props["arch"]  # a driver may leave the name empty
    if base is not None:
        return base.with_(name=name, **fields)
    missing = sorted(set(keys) - set(fields))
    if missing:
        raise ShimrtError(f"no profile for {props['arch']} and the driver does not report {', '.join(missing)}")
    return Target(name=name, backend=backend, arch=props["arch"], max_regs_per_thread=255, **fields)


def _check_compatible(built: Target, device: Target) -> None:
    if built.backend != device.backend:
        raise UsageError(f"program was compiled for {built.backend} ({built.arch}) but the device is {device.backend}")
    if built.arch == device.arch:
        return
    b, d = built.compute_capability, device.compute_capability
    # A CUBIN runs on the same major version with an equal or newer minor (never for sm_XXa).
    if b and d and b[0] == d[0] and b[1] <= d[1] and not built.arch.endswith("a"):
        return
    raise UsageError(f"program was compiled for {built.arch} ({built.name}); this device is {device.arch}: "
                     "compile for device.target")


class Partition(Device):
    """A share of a device's SMs (from :meth:`Device.partition`): load programs, create streams
    and allocate as on a Device; its kernels run only on its ``target.num_sms`` SMs. Partitions
    made from a CUDA device are green contexts: launch into one only while it is active
    (:meth:`activate`)."""

    def __init__(self, parent: Device, handle: Any, ctx: Any, sms: int):  # a view: no Device.__init__
        self.parent, self._partition = parent, handle
        self.driver = parent.driver  # read on every driver call: kept here rather than looked up
        self._ctx = ctx if ctx is not None else parent._ctx
        self.target = parent.target.with_(num_sms=sms)
        self._finalizer = finalizer(self, parent.driver.partition_destroy, handle)

    def __getattr__(self, name: str) -> Any:
        """What a partition does not set itself (the index, backend, name, memory, priorities, the
        device's handles) is its parent's: nothing is copied, so nothing added to Device goes
        missing here."""
        if name.startswith("__") or name == "parent":  # pickling and copying look for these; no recursion
            raise AttributeError(name)
        return getattr(self.parent, name)

    def __repr__(self) -> str:
        return f"<shimrt.Partition of device {self.index}: {self.target.num_sms} SMs>"

    def stream(self, priority: str | int = "low") -> Stream:
        """A non-blocking stream on this partition's SMs (HIP: CU-masked streams keep the
        default priority)."""
        value = self._priority(priority)
        # The parent's context, not the partition's: the stream is made from the partition's
        # handle, and a green context left current would give this thread's runtime users (torch)
        # another context's default stream, out of step with their other threads.
        self.parent.activate()
        return Stream(self, self.driver.partition_stream_create(self._partition, value))
