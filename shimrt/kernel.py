"""Loaded modules and their kernels: checked launches and shaping.

``Kernel.launch`` checks everything before it launches; for a kernel whose parameter layout the
driver reports it is replaced by a function specialised to that layout
(:func:`shimrt.launchpath.build_launch`), which takes the common forms at a fraction of the cost
and leaves every other case to the checked path here, so the rules and messages are the same
either way. ``Kernel.prepare`` checks and packs once for launches repeated as they are.

The shaping padding (:meth:`Kernel.shape`) is one value: computed by :func:`shimrt.occupancy.shape`,
confirmed against the driver once per kernel, block size and padding (:meth:`Kernel.confirm`),
and launched as ``dynamic_smem``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from . import occupancy, validate
from .args import Packer
from .errors import ShimrtError, UsageError
from .launchpath import MAX_BLOCK, MAX_GRID, LaunchState, build_launch, dim3
from .lifetime import Owning, finalizer
from .program import Program

__all__ = ["SHAPED_CARVEOUT", "Module", "Kernel"]

if TYPE_CHECKING:
    from .device import Device

#: The carveout a shaped kernel needs: all of the SM's L1/shared split as shared memory.
SHAPED_CARVEOUT = 100


class Module(Owning):
    """A loaded program (from :meth:`Device.load`). ``module["name"]`` gives a :class:`Kernel`."""

    def __init__(self, device: "Device", handle: Any, program: Program):
        self.device, self.program, self._handle = device, program, handle
        self._kernels: dict[str, Kernel] = {}
        self._finalizer = finalizer(self, device.driver.module_unload, handle)

    def __repr__(self) -> str:
        return f"<shimrt.Module {self.program.name} on device {self.device.index}>"

    def __getitem__(self, name: str) -> "Kernel":
        kernel = self._kernels.get(name) if type(name) is str else None  # an unhashable name must not raise here
        if kernel is None:
            if self._handle is None:
                raise UsageError("the module is closed")
            if not isinstance(name, str) or not name or "\0" in name:  # the driver would stop at a NUL
                raise UsageError(f"kernel name must be one of {', '.join(self.program.kernels)}, not {name!r}")
            lowered = self.program.names.get(name, name)  # a name expression ("k<float>") of the compile
            self.device.activate()
            fn = self.device.driver.module_function(self._handle, lowered)
            if fn is None:
                raise UsageError(f"no kernel {name!r} in {self.program.name}; it has: {', '.join(self.program.kernels)}"
                                 " (kernels need extern \"C\" or SHIMRT_KERNEL to keep their names, or compile(..., "
                                 "name_expressions=[...]) for C++ names)")
            kernel = self._kernels.get(lowered) or Kernel(self, lowered, fn)
            self._kernels[name] = self._kernels[lowered] = kernel
        return kernel

    def __contains__(self, name: str) -> bool:
        return isinstance(name, str) and self.program.names.get(name, name) in self.program.resources

    @property
    def kernels(self) -> list[str]:
        return self.program.kernels

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Unload the module; its kernels can no longer be launched."""
        self._handle = None
        for k in self._kernels.values():
            k._fn = None
            k._state.block_limit = 0  # sends launches to the checked path, which raises
        self._finalizer()


class Kernel:
    """One kernel of a loaded module."""

    def __init__(self, module: Module, name: str, fn: Any):
        self.module, self.name, self._fn = module, name, fn
        self.device = module.device
        drv = self.device.driver
        self.resources = module.program.resources.get(name)
        self.attributes: dict = drv.function_attributes(fn)
        layout = drv.function_param_layout(fn)
        if layout is None and name in module.program.params:
            layout = [(int(offset), int(size)) for offset, size in module.program.params[name]]
        self.param_layout = layout
        self._max_threads = self.attributes["max_threads_per_block"]
        self._carveout: int | None = None   # what this process last set (None: the driver's default)
        self._confirmed: dict[tuple[int, int], int] = {}  # (block, dynamic smem) -> blocks per SM
        self._state = LaunchState(fn, drv.launcher(), self.attributes["max_dynamic_smem"], self._max_threads,
                                  self._launch_checked, self._launch_failed)
        if self.param_layout is not None:
            # The fast path specialised to this kernel's parameters replaces the generic method.
            fast = build_launch(name, self.param_layout, self.device, self._state)
            fast.__doc__ = Kernel.launch.__doc__
            self.launch = fast  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"<shimrt.Kernel {self.name} on {self.device.name}>"

    @property
    def handle(self) -> Any:
        """The backend's function handle (CUfunction / hipFunction_t), for other libraries."""
        if self._fn is None:
            raise UsageError(f"kernel {self.name}: its module is closed")
        return self._fn

    @property
    def occupancy_resources(self) -> dict:
        """What the occupancy model needs of this kernel: the driver's ``registers`` and
        ``static_smem``, and the compiler's ``sgprs`` (AMD; 0 elsewhere)."""
        return {"registers": self.attributes["registers"], "static_smem": self.attributes["static_smem"],
                "sgprs": self.resources.sgprs if self.resources is not None else 0}

    def _opt_in(self, dynamic_smem) -> None:
        """Raise the kernel's dynamic smem limit to ``dynamic_smem`` (needed above 48 KiB): the one
        check of the padding against the device's per-block limit."""
        smem = validate.integer(dynamic_smem, "dynamic_smem", least=0)
        if smem <= self._state.smem_limit:
            return
        static = self.attributes["static_smem"]
        limit = self.device.target.smem_per_block_optin
        if static + smem > limit:
            raise UsageError(f"dynamic_smem must be an int of at most {limit - static} bytes for kernel {self.name}, "
                             f"not {smem}: with {static} B static it exceeds the device's {limit} B per block")
        self.device.activate()
        self.device.driver.function_set_max_dynamic_smem(self._fn, smem)
        self._state.smem_limit = smem

    def set_carveout(self, percent: int | None) -> None:
        """Prefer ``percent`` of the SM's L1/shared-memory split as shared memory for this kernel
        (100: all of it, what shaping needs so that room is left beside it; None: the driver's
        default, no preference). A no-op when this process already set the same value."""
        if percent is not None:
            percent = validate.integer(percent, "carveout percent (or None)", least=0, most=100)
        if percent == self._carveout:
            return
        self.device.activate()
        self.device.driver.function_set_carveout(self._fn, -1 if percent is None else percent)
        self._carveout = percent

    def max_active_blocks(self, block_size: int, dynamic_smem: int = 0) -> int:
        """Blocks of this kernel that fit on one SM at once (the driver's occupancy query)."""
        self._block_size(block_size)
        self._opt_in(dynamic_smem)
        self.device.activate()
        return self.device.driver.occupancy(self._fn, int(block_size), int(dynamic_smem))

    def shape(self, block_size: int, *, resident_blocks: int | None = None, reserve: Any = None) -> occupancy.Shaping:
        """:func:`shimrt.occupancy.shape` for this kernel on this device, confirmed with the driver
        (:meth:`confirm`). Launch with ``dynamic_smem=shaping.dynamic_smem``."""
        self._block_size(block_size)
        shaping = occupancy.shape(self.device.target, self.occupancy_resources, block_size,
                                  resident_blocks=resident_blocks, reserve=reserve)
        self.confirm(block_size, shaping.dynamic_smem, shaping.resident_blocks)
        return shaping

    def confirm(self, block_size: int, dynamic_smem: int, resident_blocks: int) -> None:
        """Check a shaping plan with the driver, once per block size and padding: with
        ``dynamic_smem`` bytes and the whole shared-memory carveout (which this sets: the room left
        beside the kernel exists only then), exactly ``resident_blocks`` blocks fit per SM, else
        ShimrtError."""
        # The SM's shared memory is split from L1 per launch, and a kernel that needs little gets
        # a small split: its SMs then have no room for a communication block until they drain
        # (seen on the H200).
        block_size = self._block_size(block_size)
        dynamic_smem = validate.integer(dynamic_smem, "dynamic_smem", least=0)
        resident_blocks = validate.integer(resident_blocks, "resident_blocks", least=1)
        self.set_carveout(SHAPED_CARVEOUT)
        key = (int(block_size), int(dynamic_smem))
        got = self._confirmed.get(key)
        if got is None:
            got = self._confirmed[key] = self.max_active_blocks(block_size, dynamic_smem)
        if got != resident_blocks:
            raise ShimrtError(f"kernel {self.name}: the driver fits {got} blocks per SM with {dynamic_smem} B "
                              f"of dynamic smem, the occupancy model promised {resident_blocks}")

    def _block_size(self, block_size) -> int:
        """``block_size`` as threads per block of this kernel: 1 up to its limit."""
        return validate.integer(block_size, f"block_size of kernel {self.name}", least=1, most=self._max_threads)

    def launch(self, grid: Any, block: Any, *args: Any, stream: Any = None, dynamic_smem: int = 0) -> None:
        """Launch on ``stream`` (None: the legacy default stream) with ``dynamic_smem`` bytes of
        dynamic shared memory. ``grid`` and ``block`` are ints, or tuples or lists of 1-3 ints
        (numpy integers too), within :data:`shimrt.launchpath.MAX_GRID` and ``MAX_BLOCK`` and the
        kernel's threads per block. Argument rules: see :mod:`shimrt.args`. Dynamic smem above
        48 KiB is opted in automatically. Everything is checked before the launch; a bad launch
        raises UsageError and runs nothing."""
        # Replaced per instance by build_launch()'s function when the driver reports the
        # parameter layout; this is the general path.
        self._launch_checked(grid, block, args, stream, dynamic_smem)

    def _launch_checked(self, grid, block, args, stream, dynamic_smem) -> None:
        """Validate everything, then launch."""
        grid, block, smem, handle = self._validate(grid, block, dynamic_smem, stream)
        local = self._state.local
        try:
            packer = local.packer
        except AttributeError:
            packer = local.packer = Packer(self.name, self.param_layout)
        params = packer.pack(tuple(args))
        (err,) = self._state.raw_launch(self._fn, *grid, *block, smem, handle, params, 0)
        if err:
            self._launch_failed(err, grid, block, smem, handle, params)

    def _validate(self, grid, block, dynamic_smem, stream):
        """(grid, block, dynamic smem, stream handle) of a launch after every check, dims as 3-tuples."""
        if self._fn is None:
            raise UsageError(f"kernel {self.name}: its module is closed")
        dims = dim3(grid, "grid", MAX_GRID), dim3(block, "block", MAX_BLOCK)
        threads = dims[1][0] * dims[1][1] * dims[1][2]
        if threads > self._max_threads:
            raise UsageError(f"block must have at most {self._max_threads} threads for kernel {self.name}, not "
                             f"{block!r}: a block of {threads} threads exceeds its limit of {self._max_threads} "
                             "(from its registers and launch bounds)")
        self._opt_in(dynamic_smem)
        return dims[0], dims[1], int(dynamic_smem), self.device.stream_ref(stream)

    def prepare(self, grid: Any, block: Any, *args: Any, stream: Any = None,
                dynamic_smem: int = 0) -> Callable[[], None]:
        """Check and pack a launch once; return a function that repeats it with no further work.

        For hot loops that launch the same kernel with the same arguments (timing runs,
        schedules replayed every step): ``run = kernel.prepare(grid, block, *args, stream=s)``,
        then ``run()``. The same rules and checks as :meth:`launch` apply, once. The function
        keeps the arguments and the stream alive; freeing a Buffer it uses or closing its stream
        makes it invalid.
        """
        (gx, gy, gz), (bx, by, bz), smem, handle = self._validate(grid, block, dynamic_smem, stream)
        packer = Packer(self.name, self.param_layout)
        address = packer.pack(tuple(args))
        raw, fn, failed = self._state.raw_launch, self._fn, self._launch_failed
        keep = (packer, args, stream, self)  # the parameter block, the buffers, the stream

        def run() -> None:
            err = raw(fn, gx, gy, gz, bx, by, bz, smem, handle, address, 0)[0]
            if err:
                failed(err, (gx, gy, gz), (bx, by, bz), smem, handle, address)

        run.__dict__["keep"] = keep
        run.__doc__ = f"Launch {self.name} as prepared: grid {(gx, gy, gz)}, block {(bx, by, bz)}, " \
                      f"dynamic smem {smem}."
        return run

    def _launch_failed(self, err, grid, block, smem, handle, params):
        drv = self.device.driver
        if drv.is_invalid_context(err):  # first launch from a new thread: make the context current
            self.device.activate()
            (err,) = self._state.raw_launch(self._fn, *grid, *block, smem, handle, params, 0)
            if not err:
                return
        drv.launch_error(err)
