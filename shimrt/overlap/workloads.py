"""Compute workloads for the overlap engine: the kernels of ``kernels_src/workloads.cu`` with their
inputs on a device, one launch at a time, checked against numpy.

``ComputeSpec`` says what to run (``ComputeSpec("sgemm", 4096)``); ``ComputeWorkload(device,
spec)`` compiles and loads the source, allocates random inputs and the output, and then
``launch()`` runs one launch, with per-block timestamps when given a ``stamps`` buffer
(3 uint64 words per block: start, end, SM id; see ``shimrt_block_begin``), and ``check()``
compares the output with a float64 numpy reference.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import numpy as np

from .. import kernels
from ..device import Device
from ..errors import UsageError
from ..kernel import Kernel, Module
from ..memory import Buffer
from ..validate import available_host_memory, require_memory

# The host side, named here too: what most callers import from this module.
from .specs import (
    KINDS,
    LAYERNORM_EPS,
    MAX_BLOCK,
    SGEMM_THREADS,
    SGEMM_TILE,
    ComputeSpec,
    as_scale,
    as_seed,
    as_spec,
    compare,
    device_bytes,
    expected,
    host_bytes,
    input_elements,
    inputs,
    inputs_names,
    tolerance,
)

__all__ = ["ComputeWorkload", "KINDS", "LAYERNORM_EPS", "MAX_BLOCK", "SGEMM_THREADS", "SGEMM_TILE", "ComputeSpec",
           "as_scale", "as_seed", "as_spec", "compare", "device_bytes", "expected", "host_bytes", "input_elements",
           "inputs", "inputs_names", "tolerance"]

# One loaded module per device, shared by the workloads that use it at the same time. The values
# are weak: a Module holds its Device, so a strong cache would keep every Device alive forever.
# The compile itself is cached on disk, so a reload after all workloads are gone is cheap.
_modules: "weakref.WeakValueDictionary[int, Module]" = weakref.WeakValueDictionary()
_modules_lock = threading.Lock()


def module(device: Device) -> Module:
    """``kernels_src/workloads.cu`` compiled for and loaded on ``device``."""
    if not isinstance(device, Device):
        raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
    with _modules_lock:
        found = _modules.get(id(device))
        # While the entry lives, its Module keeps that Device alive, so the id cannot be reused.
        if found is not None and not found.closed:
            return found
        loaded = device.load(device.compile(kernels.source("workloads"), name="workloads.cu"))
        _modules[id(device)] = loaded
        return loaded


class ComputeWorkload:
    """One compute kernel with its inputs and output on ``device``.

    Inputs come from ``inputs(spec, seed)``. For sgemm, ``alpha`` and ``beta`` scale A @ B and
    C (with beta = 0, the default, C is only written, so repeated launches give identical
    output). Attributes: ``kernel``, ``grid`` and ``block`` (3-tuples), ``blocks`` (total blocks
    of one launch), ``host`` (the host inputs, by name as in :func:`inputs`), ``buffers`` (their
    device copies), ``output`` (the Buffer written).
    """

    def __init__(self, device: Device, spec: ComputeSpec, seed: int = 0, *, alpha: float = 1.0, beta: float = 0.0):
        as_spec(spec)
        seed, alpha, beta = as_seed(seed), as_scale(alpha, "alpha"), as_scale(beta, "beta")
        if spec.kind != "sgemm" and (alpha != 1.0 or beta != 0.0):
            raise UsageError(f"alpha and beta are for sgemm, not {spec.kind}")
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        # Both memories are checked before anything is drawn, compiled or allocated.
        require_memory(device_bytes(spec, beta=beta), device.mem_info()[0], f"the buffers of {spec.label}",
                       f"{device.name}'s free device")
        require_memory(host_bytes(spec, beta=beta), available_host_memory(), f"the inputs of {spec.label}", "host")
        self.device, self.spec, self.seed = device, spec, seed
        self.module = module(device)
        self.kernel = self.module[spec.kernel_name]
        self.alpha, self.beta = float(alpha), float(beta)
        n = spec.size
        self.host = inputs(spec, seed, beta=self.beta)
        if spec.kind == "sgemm":
            self.grid = (n // SGEMM_TILE, n // SGEMM_TILE, 1)
        elif spec.kind == "bias_gelu":
            self.grid = (spec.grid or -(-n * n // spec.block), 1, 1)
        else:
            self.grid = (n, 1, 1)
        self.block = (spec.block, 1, 1)
        self.blocks = self.grid[0] * self.grid[1] * self.grid[2]
        self.buffers = {k: device.to_device(v) for k, v in self.host.items()}
        self.output = device.empty((n, n), np.float32)
        i, size = self.buffers, np.int32(n)
        self._args: tuple[Buffer | np.int32 | np.float32, ...]
        if spec.kind == "sgemm":
            self._args = (self.output, i["A"], i["B"], size, size, size, np.float32(alpha), np.float32(beta))
        elif spec.kind == "bias_gelu":
            self._args = (self.output, i["x"], i["bias"], size, size)
        elif spec.kind == "softmax":
            self._args = (self.output, i["x"], size, size)
        else:
            self._args = (self.output, i["x"], i["gamma"], i["beta"], size, size, np.float32(LAYERNORM_EPS))
        self._expected: tuple[np.ndarray, np.ndarray] | None = None
        self.reset()

    @property
    def label(self) -> str:
        return self.spec.label

    def __repr__(self) -> str:
        return f"<ComputeWorkload {self.spec.label} on {self.device.name}: grid {self.grid}, block {self.block}>"

    def reset(self, stream: Any = None) -> None:
        """Put the output back as it was before the first launch: sgemm's initial C when beta is
        not 0, otherwise all NaN (so that elements a launch fails to write show in check())."""
        if "C" in self.host:
            self.output.copy_from_host(self.host["C"], stream=stream)
        else:
            self.output.memset(0xFF, stream=stream)  # 0xFFFFFFFF is a float32 NaN

    def stamps_buffer(self) -> Buffer:
        """A zeroed uint64 buffer of 3 words per block, for ``launch(stamps=...)``."""
        return self.device.empty(3 * self.blocks, np.uint64).memset(0)

    def launch(self, stream: Any = None, *, dynamic_smem: int = 0, stamps: Buffer | None = None,
               kernel: Kernel | None = None) -> None:
        """One launch on ``stream`` (None: the legacy default stream) with ``dynamic_smem`` bytes of
        dynamic shared memory (padding only: the kernels use none). ``stamps``: a uint64 Buffer
        of at least 3 * blocks words that receives each block's start, end and SM id, or None.
        ``kernel``: the same kernel loaded elsewhere (an SM partition) to launch instead."""
        (kernel or self.kernel).launch(self.grid, self.block, *self._args, self._stamps_arg(stamps), stream=stream,
                                       dynamic_smem=dynamic_smem)

    def prepare(self, stream: Any = None, *, dynamic_smem: int = 0, stamps: Buffer | None = None,
                kernel: Kernel | None = None) -> Callable[[], None]:
        """:meth:`launch`'s checks and argument packing done now; returns a function that
        launches (for launches that must follow each other with no host work between)."""
        return (kernel or self.kernel).prepare(self.grid, self.block, *self._args, self._stamps_arg(stamps),
                                               stream=stream, dynamic_smem=dynamic_smem)

    def _stamps_arg(self, stamps):
        if stamps is None:
            return 0  # the kernels skip the timestamps for a null pointer
        if not isinstance(stamps, Buffer):
            raise UsageError(f"stamps must be a shimrt Buffer of uint64, not {stamps!r:.100}")
        if stamps.device is not self.device:
            raise UsageError("stamps must be on the workload's device")
        if stamps.dtype != np.uint64 or stamps.size < 3 * self.blocks:
            raise UsageError(f"stamps must hold at least {3 * self.blocks} uint64 (3 per block), "
                             f"not {stamps.size} {stamps.dtype}")
        return stamps

    def result(self) -> np.ndarray:
        """The output, copied to the host (after all work on the device)."""
        return self.output.numpy()

    def reference(self) -> np.ndarray:
        """The expected output, computed by numpy in float64 from the same float32 inputs."""
        return self._reference()[0]

    @property
    def tolerance(self) -> float:
        """The largest normalised error check() accepts (see :func:`tolerance`)."""
        return tolerance(self.spec)

    def check(self, out: np.ndarray | None = None) -> float:
        """The largest normalised error of ``out`` (default: ``result()``) against the reference;
        ShimrtError naming the worst element if it exceeds ``tolerance``. Errors are divided by
        the size of what each element sums or scales (see :func:`expected`); a NaN or infinity
        always fails."""
        out = self.result() if out is None else out
        return compare(self.spec, out, *self._reference())

    def _reference(self) -> tuple[np.ndarray, np.ndarray]:
        """(reference, scale), computed once."""
        if self._expected is None:
            self._expected = expected(self.spec, self.host, alpha=self.alpha, beta=self.beta)
        return self._expected

    @property
    def flops(self) -> int:
        """Floating-point operations of one launch: 2 M N K for sgemm; for the others a nominal
        count per element (an add, multiply or transcendental is 1, an FMA 2): bias_gelu 10,
        softmax 6 (max, subtract and exp twice, add, multiply), layernorm 8."""
        n = self.spec.size
        per_element = {"bias_gelu": 10, "softmax": 6, "layernorm": 8}
        return 2 * n**3 if self.spec.kind == "sgemm" else per_element[self.spec.kind] * n * n

    @property
    def bytes(self) -> int:
        """Bytes one launch must move to or from device memory at least (each input read once,
        the output written once; sgemm reads C too when beta is not 0)."""
        n, f = self.spec.size, 4
        kind = self.spec.kind
        if kind == "sgemm":
            return f * n * n * (3 + ("C" in self.host))
        if kind == "bias_gelu":
            return f * (2 * n * n + n)
        if kind == "softmax":
            return f * 2 * n * n
        return f * (2 * n * n + 2 * n)
