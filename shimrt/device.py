"""Device, Module, Kernel, Stream, Event and Buffer over a backend (``shimrt.cuda`` or ``shimrt.hip``).

Lifetime: every object that owns a driver resource frees it on ``close()``, on leaving its
``with`` block, when it is garbage collected, or at interpreter exit (children before the
device), and errors during that late cleanup are ignored rather than printed.
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterable

import numpy as np

from . import backends, compiler, fastlaunch, occupancy, targets, waiting
from .args import Packer
from .config import settings
from .errors import NoDeviceError, ShimrtError, UsageError
from .program import Program
from .targets import Target

_MAX_GRID = (2**31 - 1, 65535, 65535)


def _quiet(fn, *args):
    """Run a release call from a finalizer; the driver may already be gone at exit."""
    try:
        fn(*args)
    except Exception:
        pass


def _dim3(value, what: str) -> tuple[int, int, int]:
    parts = value if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(parts) <= 3 or not all(isinstance(v, (int, np.integer)) for v in parts):
        raise UsageError(f"{what} must be an int or a tuple of 1-3 ints, not {value!r}")
    dims = tuple(int(v) for v in parts)
    dims = dims + (1,) * (3 - len(dims))
    if any(d < 1 for d in dims):
        raise UsageError(f"{what} dimensions must be positive, got {dims}")
    return dims


def _wait(query, timeout: float, what: str) -> None:
    """Poll ``query`` until it is true; ShimrtError after ``timeout`` seconds."""
    if not waiting.until(query, timeout):
        raise ShimrtError(f"{what} did not finish within {timeout} s")


class _Closing:
    """``with obj:`` closes ``obj`` on leaving the block."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Device(_Closing):
    """One GPU, through the CUDA backend when a CUDA driver and device are present (or HIP).

    ``backend`` (or ``SHIMRT_BACKEND``) forces one. With no driver or no device this raises
    :class:`NoDeviceError` whose message says why in one line.
    """

    def __init__(self, index: int = 0, backend: str | None = None):
        if not isinstance(index, int) or index < 0:
            raise UsageError(f"device index must be a non-negative int, not {index!r}")
        requested = backend or settings().backend
        reasons = []
        for name in ([requested] if requested else list(backends.NAMES)):
            try:
                drv = backends.load(name, "driver")
                drv.init()
                count = drv.device_count()
                if count == 0:
                    raise NoDeviceError(f"the {name} driver reports no device")
                break
            except NoDeviceError as exc:
                reasons.append(f"{name}: {exc}")
        else:
            raise NoDeviceError("no GPU available (" + "; ".join(reasons) + ")")
        if index >= count:
            raise NoDeviceError(f"device {index} does not exist: the {name} driver reports {count} device(s)")
        self.index = index
        self.backend = name
        self._drv = drv
        self._dev = drv.get_device(index)
        self._ctx = drv.context_retain(self._dev)
        self._finalizer = weakref.finalize(self, _quiet, drv.context_release, self._dev)
        drv.make_current(self._ctx)
        props = drv.device_properties(self._dev)
        self.name = props["name"]
        self.total_memory = props["total_memory"]
        self.target = _target_from(props, name)
        self.priority_range = drv.priority_range()  # (least, greatest)
        self.timestamp_hz = drv.timestamp_hz(self._dev)
        self._null = drv.null_stream()

    def __repr__(self):
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
        self._drv.make_current(self._ctx)

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for all work on the device (at most ``timeout`` seconds when given)."""
        self.activate()
        if timeout is None:
            self._drv.synchronize()
            return
        # No query covers every stream of a context, so the blocking call runs on a helper
        # thread and the caller stops waiting after the timeout.
        outcome = []

        def wait():
            try:
                self.activate()
                self._drv.synchronize()
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
    def compile(self, source: str, *, options: Iterable[str] = (), name: str = "kernel.cu") -> Program:
        """``shimrt.compile`` for this device's own target."""
        return compiler.compile(source, self.target, options=options, name=name)

    def load(self, program: Program) -> "Module":
        """Load a compiled program; its kernels are ``module["name"]``."""
        if not isinstance(program, Program):
            raise UsageError(f"load() takes a Program from shimrt.compile, not {type(program).__name__}")
        _check_compatible(program.target, self.target)
        self.activate()
        return Module(self, self._drv.module_load(program.binary), program)

    # --- memory ---
    def alloc(self, nbytes: int) -> "Buffer":
        """``nbytes`` of uninitialised device memory (a uint8 Buffer)."""
        return self.empty((int(nbytes),), np.uint8)

    def empty(self, shape, dtype=np.float32) -> "Buffer":
        """An uninitialised device array of ``shape`` and ``dtype``."""
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise UsageError(f"shape must be non-negative, got {shape}")
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.activate()
        ptr = self._drv.mem_alloc(nbytes) if nbytes else 0
        return Buffer(self, ptr, nbytes, shape, dtype, owner=None)

    def to_device(self, array, stream: "Stream | None" = None) -> "Buffer":
        """A device copy of a host array (same dtype and shape)."""
        host = np.ascontiguousarray(array)
        buf = self.empty(host.shape, host.dtype)
        buf.copy_from_host(host, stream=stream)
        return buf

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        self.activate()
        return self._drv.mem_info()

    # --- streams and events ---
    def stream(self, priority: "str | int" = "low") -> "Stream":
        """A non-blocking stream. ``"high"`` is the device's greatest priority, ``"low"`` its least;
        an int must lie in the device's range (see ``priority_range``)."""
        value = self._priority(priority)
        self.activate()
        return Stream(self, self._drv.stream_create(value))

    def _priority(self, priority) -> int:
        least, greatest = self.priority_range
        if priority == "high":
            return greatest
        if priority == "low":
            return least
        if isinstance(priority, (int, np.integer)) and not isinstance(priority, bool):
            value = int(priority)
            if not min(least, greatest) <= value <= max(least, greatest):
                raise UsageError(f"stream priority {value} is outside this device's range "
                                 f"[{greatest} (greatest), {least} (least)]")
            return value
        raise UsageError(f"priority must be 'high', 'low' or an int, not {priority!r}")

    def partition(self, sms: int) -> tuple["Partition", "Partition"]:
        """Split the SMs (CUs) in two: ``sms`` of them (the driver may round up to its
        granularity) and the rest. Returns (the split, the rest) as :class:`Partition` objects:
        kernels loaded into one and launched on its streams run only on its SMs. CUDA uses green
        contexts, HIP CU-masked streams. Memory from this device is usable in both."""
        if isinstance(sms, bool) or not isinstance(sms, int) or not 0 < sms < self.target.num_sms:
            raise UsageError(f"sms must be an int in 1..{self.target.num_sms - 1}, not {sms!r}")
        self.activate()
        parts = self._drv.sm_partition(self._dev, sms)
        self.activate()
        return tuple(Partition(self, handle, ctx, count) for handle, ctx, count in parts)

    def event(self, timing: bool = True) -> "Event":
        """An event; ``timing=False`` makes it cheaper but unusable for elapsed time."""
        self.activate()
        return Event(self, self._drv.event_create(timing), timing)

    def _stream_handle(self, stream):
        """The backend handle of ``stream``: a shimrt Stream, None (the legacy default stream),
        or another library's stream exposing ``__cuda_stream__`` or ``cuda_stream``."""
        if stream is None:
            return self._null
        if isinstance(stream, Stream):
            if stream._handle is None:
                raise UsageError("the stream is closed")
            if stream.device is not self:
                raise UsageError("the stream belongs to another Device")
            return stream._handle
        if hasattr(stream, "__cuda_stream__"):
            return int(stream.__cuda_stream__()[1])
        if hasattr(stream, "cuda_stream"):
            return int(stream.cuda_stream)
        raise UsageError(f"stream must be a shimrt Stream, None or a CUDA stream object, not {type(stream).__name__}")


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
    if base is not None:
        return base.with_(name=props["name"], **fields)
    missing = sorted(set(keys) - set(fields))
    if missing:
        raise ShimrtError(f"no profile for {props['arch']} and the driver does not report {', '.join(missing)}")
    return Target(name=props["name"], backend=backend, arch=props["arch"], max_regs_per_thread=255, **fields)


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

    def __init__(self, parent: Device, handle, ctx, sms: int):  # a view: no Device.__init__
        self.parent, self._partition = parent, handle
        for name in ("index", "backend", "_drv", "_dev", "name", "total_memory", "priority_range", "timestamp_hz",
                     "_null"):
            setattr(self, name, getattr(parent, name))
        self._ctx = ctx if ctx is not None else parent._ctx
        self.target = parent.target.with_(num_sms=sms)
        self._finalizer = weakref.finalize(self, _quiet, parent._drv.partition_destroy, handle)

    def __repr__(self):
        return f"<shimrt.Partition of device {self.index}: {self.target.num_sms} SMs>"

    def stream(self, priority: "str | int" = "low") -> "Stream":
        """A non-blocking stream on this partition's SMs (HIP: CU-masked streams keep the
        default priority)."""
        value = self._priority(priority)
        self.activate()
        return Stream(self, self._drv.partition_stream_create(self._partition, value))


class Module(_Closing):
    """A loaded program. ``module["name"]`` gives a :class:`Kernel`."""

    def __init__(self, device: Device, handle, program: Program):
        self.device, self.program, self._handle = device, program, handle
        self._kernels: dict[str, Kernel] = {}
        self._finalizer = weakref.finalize(self, _quiet, device._drv.module_unload, handle)

    def __getitem__(self, name: str) -> "Kernel":
        kernel = self._kernels.get(name)
        if kernel is None:
            if self._handle is None:
                raise UsageError("the module is closed")
            self.device.activate()
            fn = self.device._drv.module_function(self._handle, name)
            if fn is None:
                raise UsageError(f"no kernel {name!r} in {self.program.name}; it has: {', '.join(self.program.kernels)}"
                                 " (kernels need extern \"C\" or SHIMRT_KERNEL to keep their names)")
            kernel = self._kernels[name] = Kernel(self, name, fn)
        return kernel

    def __contains__(self, name: str) -> bool:
        return name in self.program.resources

    @property
    def kernels(self) -> list[str]:
        return self.program.kernels

    def close(self) -> None:
        """Unload the module; its kernels can no longer be launched."""
        self._handle = None
        for k in self._kernels.values():
            k._fn = None
            k._fast_block_limit = 0  # sends launches to the checked path, which raises
        self._finalizer()


class Kernel:
    """One kernel of a loaded module."""

    def __init__(self, module: Module, name: str, fn):
        self.module, self.name, self._fn = module, name, fn
        self.device = module.device
        drv = self.device._drv
        self.resources = module.program.resources.get(name)
        self.attributes: dict = drv.function_attributes(fn)
        layout = drv.function_param_layout(fn)
        if layout is None and name in module.program.params:
            layout = [tuple(p) for p in module.program.params[name]]
        self.param_layout = layout
        self._launch = drv.launcher()
        self._max_threads = self.attributes["max_threads_per_block"]
        self._smem_limit = self.attributes["max_dynamic_smem"]
        # One parameter block per thread: the driver reads it during the launch call, which
        # releases the GIL, so threads launching the same kernel must not share one.
        self._local = threading.local()
        self._fast_block_limit = self._max_threads  # 0 once the module is closed
        if self.param_layout is not None:
            self.launch = fastlaunch.build(self, Stream)

    def __repr__(self):
        return f"<shimrt.Kernel {self.name} on {self.device.name}>"

    def _opt_in(self, smem: int) -> None:
        """Raise the kernel's dynamic smem limit to ``smem`` (needed above 48 KiB)."""
        if not isinstance(smem, (int, np.integer)) or smem < 0:
            raise UsageError(f"smem must be a non-negative int of bytes, not {smem!r}")
        smem = int(smem)
        if smem <= self._smem_limit:
            return
        static = self.attributes["static_smem"]
        limit = self.device.target.smem_per_block_optin
        if static + smem > limit:
            raise UsageError(f"kernel {self.name}: {smem} B of dynamic shared memory + {static} B static exceeds "
                             f"the device's {limit} B per block (so at most {limit - static} B dynamic)")
        self.device.activate()
        self.device._drv.function_set_max_dynamic_smem(self._fn, smem)
        self._smem_limit = smem

    def set_carveout(self, percent: int | None) -> None:
        """Prefer ``percent`` of the SM's L1/shared-memory split as shared memory for this kernel
        (100: all of it, what shaping needs so that room is left beside it; None: the driver's
        default, no preference)."""
        if percent is not None and (not isinstance(percent, int) or not 0 <= percent <= 100):
            raise UsageError(f"carveout must be a percentage 0..100 or None, not {percent!r}")
        self.device.activate()
        self.device._drv.function_set_carveout(self._fn, -1 if percent is None else percent)

    def max_active_blocks(self, block_size: int, dynamic_smem: int = 0) -> int:
        """Blocks of this kernel that fit on one SM at once (the driver's occupancy query)."""
        if not isinstance(block_size, (int, np.integer)) or not 1 <= block_size <= self._max_threads:
            raise UsageError(f"block_size must be 1..{self._max_threads} for kernel {self.name}, not {block_size!r}")
        self._opt_in(dynamic_smem)
        self.device.activate()
        return self.device._drv.occupancy(self._fn, int(block_size), int(dynamic_smem))

    def shape(self, block_size: int, *, resident_blocks: int | None = None, reserve=None):
        """:func:`shimrt.occupancy.shape` for this kernel on this device, confirmed with the driver.

        Uses the device's own target and the driver's register and static smem counts; the
        driver's occupancy query must give exactly the promised residency for the shaped
        dynamic smem, else ShimrtError. Launch with ``smem=shaping.dynamic_smem``.
        """
        # The SM's shared memory is split from L1 per launch, and a kernel that needs little gets
        # a small split: its SMs then have no room for a communication block until they drain
        # (seen on the H200). The whole of it must be shared memory for the reserve to exist.
        self.set_carveout(100)
        sgprs = int(self.resources.extra.get("sgprs", 0)) if self.resources is not None else 0
        res = {"registers": self.attributes["registers"], "static_smem": self.attributes["static_smem"],
               "sgprs": sgprs}
        shaping = occupancy.shape(self.device.target, res, block_size, resident_blocks=resident_blocks,
                                  reserve=reserve)
        got = self.max_active_blocks(block_size, shaping.dynamic_smem)
        if got != shaping.resident_blocks:
            raise ShimrtError(f"kernel {self.name}: the driver fits {got} blocks per SM with {shaping.dynamic_smem} B "
                              f"of dynamic smem, the occupancy model promised {shaping.resident_blocks}")
        return shaping

    def launch(self, grid, block, *args, stream=None, smem: int = 0) -> None:
        """Launch on ``stream`` (None: the legacy default stream) with ``smem`` bytes of dynamic
        shared memory. ``grid`` and ``block`` are ints or tuples of up to 3 ints. Argument
        rules: see :mod:`shimrt.args`. Dynamic smem above 48 KiB is opted in automatically.
        Everything is checked before the launch; a bad launch raises UsageError and runs nothing."""
        # Replaced per instance by a function specialised to the kernel's parameter layout
        # (shimrt.fastlaunch) when the driver reports the layout; this is the general path.
        self._launch_checked(grid, block, args, stream, smem)

    def _launch_checked(self, grid, block, args, stream, smem) -> None:
        """Validate everything, then launch."""
        grid, block, smem, handle = self._validate(grid, block, smem, stream)
        try:
            packer = self._local.packer
        except AttributeError:
            packer = self._local.packer = Packer(self.name, self.param_layout)
        params = packer.pack(tuple(args))
        (err,) = self._launch(self._fn, *grid, *block, smem, handle, params, 0)
        if err:
            self._launch_failed(err, grid, block, smem, handle, params)

    def _validate(self, grid, block, smem, stream):
        """(grid, block, smem, stream handle) of a launch after every check, dims as 3-tuples."""
        if self._fn is None:
            raise UsageError(f"kernel {self.name}: its module is closed")
        grid, block = _dim3(grid, "grid"), _dim3(block, "block")
        if any(g > m for g, m in zip(grid, _MAX_GRID, strict=True)):
            raise UsageError(f"grid {grid} exceeds the limits {_MAX_GRID}")
        threads = block[0] * block[1] * block[2]
        if threads > self._max_threads:
            raise UsageError(f"kernel {self.name}: a block of {threads} threads exceeds its limit of "
                             f"{self._max_threads} (from its registers and launch bounds)")
        self._opt_in(smem)
        return grid, block, int(smem), self.device._stream_handle(stream)

    def prepare(self, grid, block, *args, stream=None, smem: int = 0):
        """Check and pack a launch once; return a function that repeats it with no further work.

        For hot loops that launch the same kernel with the same arguments (timing runs,
        schedules replayed every step): ``run = kernel.prepare(grid, block, *args, stream=s)``,
        then ``run()``. The same rules and checks as :meth:`launch` apply, once. The function
        keeps the arguments and the stream alive; freeing a Buffer it uses or closing its stream
        makes it invalid.
        """
        (gx, gy, gz), (bx, by, bz), smem, handle = self._validate(grid, block, smem, stream)
        packer = Packer(self.name, self.param_layout)
        address = packer.pack(tuple(args))
        raw, fn, failed = self._launch, self._fn, self._launch_failed
        keep = (packer, args, stream, self)  # the parameter block, the buffers, the stream

        def run() -> None:
            err = raw(fn, gx, gy, gz, bx, by, bz, smem, handle, address, 0)[0]
            if err:
                failed(err, (gx, gy, gz), (bx, by, bz), smem, handle, address)

        run.keep = keep
        run.__doc__ = f"Launch {self.name} as prepared: grid {(gx, gy, gz)}, block {(bx, by, bz)}, smem {smem}."
        return run

    def _thread_block(self):
        """This thread's parameter block for the fast path: (memoryview, pointer-array address)."""
        packer = Packer(self.name, self.param_layout)
        self._local.block = (packer._view, packer.address)
        self._local.block_owner = packer  # keeps the ctypes memory alive
        return self._local.block

    def _launch_failed(self, err, grid, block, smem, handle, params):
        drv = self.device._drv
        if drv.is_invalid_context(err):  # first launch from a new thread: make the context current
            self.device.activate()
            (err,) = self._launch(self._fn, *grid, *block, smem, handle, params, 0)
            if not err:
                return
        drv.launch_error(err)


class Stream(_Closing):
    """A non-blocking stream with a fixed priority. ``priority`` is read back from the driver."""

    def __init__(self, device: Device, handle):
        self.device, self._handle = device, handle
        self._launch_device = device  # what the launch fast path checks; None once closed
        self._finalizer = weakref.finalize(self, _quiet, device._drv.stream_destroy, handle)

    @property
    def priority(self) -> int:
        return self.device._drv.stream_priority(self._live())

    @property
    def handle(self) -> int:
        """The stream as an integer, for other libraries."""
        return self.device._drv.stream_handle(self._live())

    def __cuda_stream__(self):
        return (0, self.handle)

    def _live(self):
        if self._handle is None:
            raise UsageError("the stream is closed")
        return self._handle

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for the stream's work (ShimrtError after ``timeout`` seconds when given)."""
        self.device.activate()
        if timeout is None:
            self.device._drv.stream_synchronize(self._live())
        else:
            _wait(self.query, timeout, "the stream's work")
            self.device._drv.stream_synchronize(self._live())

    def query(self) -> bool:
        """True when everything queued on the stream has finished."""
        return self.device._drv.stream_query(self._live())

    def wait(self, event: "Event") -> None:
        """Make later work on this stream wait for ``event``."""
        self.device._drv.stream_wait_event(self._live(), event._live())

    def record(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (or a new timing event) on this stream and return it."""
        event = event or self.device.event()
        event.record(self)
        return event

    def close(self) -> None:
        self._handle = self._launch_device = None
        self._finalizer()


class Event(_Closing):
    """A device event: record on a stream, wait for it, time between two of them."""

    def __init__(self, device: Device, handle, timing: bool):
        self.device, self._handle, self.timing = device, handle, timing
        self._finalizer = weakref.finalize(self, _quiet, device._drv.event_destroy, handle)

    def _live(self):
        if self._handle is None:
            raise UsageError("the event is closed")
        return self._handle

    def record(self, stream=None) -> "Event":
        self.device._drv.event_record(self._live(), self.device._stream_handle(stream))
        return self

    def query(self) -> bool:
        return self.device._drv.event_query(self._live())

    def synchronize(self, timeout: float | None = None) -> None:
        if timeout is not None:
            _wait(self.query, timeout, "the event")
        self.device._drv.event_synchronize(self._live())

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded, both with timing)."""
        if not (self.timing and end.timing):
            raise UsageError("elapsed time needs events created with timing=True")
        return self.device._drv.event_elapsed_ms(self._live(), end._live())

    def close(self) -> None:
        self._handle = None
        self._finalizer()


class Buffer(_Closing):
    """Device memory with a dtype and shape. Exposes ``__cuda_array_interface__`` and DLPack.

    Host copies with ``stream=None`` first wait for all work on the device and return when the
    copy is done; with a stream they are ordered on it (and still return when done).
    """

    def __init__(self, device: Device, ptr: int, nbytes: int, shape, dtype, owner):
        self.device, self.nbytes, self.shape, self.dtype = device, nbytes, tuple(shape), np.dtype(dtype)
        self.device_pointer = ptr  # read by the launch fast path; None once freed
        self._owner = owner        # the Buffer whose memory a view shares
        if owner is None and ptr:
            self._finalizer = weakref.finalize(self, _quiet, device._drv.mem_free, ptr)
        else:
            self._finalizer = None

    def __repr__(self):
        return f"<shimrt.Buffer {self.shape} {self.dtype} on device {self.device.index}>"

    @property
    def ptr(self) -> int:
        if self.device_pointer is None or (self._owner is not None and self._owner.device_pointer is None):
            raise UsageError("the buffer has been freed")
        return self.device_pointer

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def view(self, dtype=None, shape=None) -> "Buffer":
        """The same memory as another dtype and/or shape (same number of bytes)."""
        dtype = np.dtype(dtype or self.dtype)
        if shape is None:
            if self.nbytes % dtype.itemsize:
                raise UsageError(f"{self.nbytes} bytes are not a whole number of {dtype}")
            shape = (self.nbytes // dtype.itemsize,)
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != self.nbytes:
            raise UsageError(f"a view of shape {shape} and dtype {dtype} is not {self.nbytes} bytes")
        return Buffer(self.device, self.ptr, self.nbytes, shape, dtype, owner=self._owner or self)

    def __getitem__(self, index: slice) -> "Buffer":
        """A view of a contiguous range of a 1-D buffer: ``buf[start:stop]`` (no step)."""
        if len(self.shape) != 1 or not isinstance(index, slice) or index.step not in (None, 1):
            raise UsageError("buffers can be sliced as buf[start:stop] when one-dimensional")
        start, stop, _ = index.indices(self.shape[0])
        count = max(stop - start, 0)
        return Buffer(self.device, self.ptr + start * self.dtype.itemsize, count * self.dtype.itemsize, (count,),
                      self.dtype, owner=self._owner or self)

    def _host(self, array, writable: bool) -> np.ndarray:
        usable = isinstance(array, np.ndarray) and array.flags.c_contiguous
        if not usable or (writable and not array.flags.writeable):
            raise UsageError("host array must be a C-contiguous" + (" writable" if writable else "") + " numpy array")
        if array.nbytes != self.nbytes:
            raise UsageError(f"host array has {array.nbytes} bytes, the buffer {self.nbytes}")
        return array

    def _copy(self, fn, a, b, stream) -> None:
        dev = self.device
        dev.activate()
        if stream is None:
            dev._drv.synchronize()
            fn(a, b, self.nbytes, dev._null)
            dev._drv.synchronize()
        else:
            handle = dev._stream_handle(stream)
            fn(a, b, self.nbytes, handle)
            dev._drv.stream_synchronize(handle)

    def copy_from_host(self, array, stream=None) -> "Buffer":
        """Copy a host array of the same byte size into the buffer."""
        host = self._host(array, writable=False)
        if self.nbytes:
            self._copy(self.device._drv.memcpy_htod, self.ptr, host.ctypes.data, stream)
        return self

    def copy_to_host(self, out: np.ndarray | None = None, stream=None) -> np.ndarray:
        """Copy the buffer into ``out`` (or a new array of its dtype and shape) and return it."""
        out = np.empty(self.shape, self.dtype) if out is None else self._host(out, writable=True)
        if self.nbytes:
            self._copy(self.device._drv.memcpy_dtoh, out.ctypes.data, self.ptr, stream)
        return out

    def numpy(self, stream=None) -> np.ndarray:
        """A new host array with the buffer's contents."""
        return self.copy_to_host(stream=stream)

    def copy_from(self, other: "Buffer", stream=None) -> "Buffer":
        """Copy another device buffer of the same byte size into this one."""
        if other.nbytes != self.nbytes:
            raise UsageError(f"source has {other.nbytes} bytes, the buffer {self.nbytes}")
        if self.nbytes:
            self._copy(self.device._drv.memcpy_dtod, self.ptr, other.ptr, stream)
        return self

    def memset(self, value: int, stream=None) -> "Buffer":
        """Set every byte to ``value`` (0-255)."""
        if not isinstance(value, (int, np.integer)) or not 0 <= value <= 255:
            raise UsageError(f"memset takes a byte value 0-255, not {value!r}")
        if self.nbytes:
            self._copy(self.device._drv.memset_d8, self.ptr, int(value), stream)
        return self

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device._drv.DLPACK_DEVICE_TYPE, self.device.index)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
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
