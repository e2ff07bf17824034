"""Compute workloads for the overlap engine: the kernels of ``kernels_src/workloads.cu`` with their
inputs on a device, one launch at a time, checked against numpy.

``ComputeSpec`` says what to run (``ComputeSpec("sgemm", 4096)``); ``ComputeWorkload(device,
spec)`` compiles and loads the source, allocates random inputs and the output, and then
``launch()`` runs one launch, with per-block timestamps when given a ``stamps`` buffer
(3 uint64 words per block: start, end, SM id; see ``shimrt_block_begin``), and ``check()``
compares the output with a float64 numpy reference.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from .. import kernels
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..kernel import Module
from ..memory import Buffer

KINDS = ("sgemm", "bias_gelu", "softmax", "layernorm")
_KERNEL = {"sgemm": "sgemm", "bias_gelu": "bias_gelu", "softmax": "softmax_rows", "layernorm": "layernorm_rows"}
SGEMM_TILE = 128      # sgemm's block tile (M and N must be multiples of it)
SGEMM_THREADS = 256   # and its block size
MAX_BLOCK = 1024      # the row kernels' shared-memory reductions hold one float per thread
LAYERNORM_EPS = 1e-5
_MAX_INT32 = 2**31 - 1
_U = 2.0**-24         # float32 unit roundoff


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True)
class ComputeSpec:
    """What to run.

    ``kind``: "sgemm" (C = A @ B, M = N = K = ``size``, a multiple of 128), "bias_gelu"
    (gelu(x + bias) on ``size`` x ``size``), "softmax" or "layernorm" (over each row of
    ``size`` x ``size``, one block per row). ``block``: threads per block for the last three
    (1..1024); sgemm always uses 256. ``grid``: bias_gelu only, its number of blocks (it
    grid-strides); None gives one element per thread, ceil(size * size / block) blocks.
    """

    kind: str
    size: int
    block: int = 256
    grid: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not _is_int(self.size) or not 1 <= self.size <= _MAX_INT32:
            raise UsageError(f"size must be a positive int, not {self.size!r}")
        if not _is_int(self.block) or not 1 <= self.block <= MAX_BLOCK:
            raise UsageError(f"block must be an int in 1..{MAX_BLOCK}, not {self.block!r}")
        if self.kind == "sgemm":
            if self.size % SGEMM_TILE:
                raise UsageError(f"sgemm needs a size that is a multiple of {SGEMM_TILE}, not {self.size}")
            if self.block != SGEMM_THREADS:
                raise UsageError(f"sgemm uses {SGEMM_THREADS} threads per block; leave block at its default")
        if self.grid is not None:
            if self.kind != "bias_gelu":
                raise UsageError(f"grid is for bias_gelu only; {self.kind} has one block per "
                                 + ("128 x 128 tile" if self.kind == "sgemm" else "row"))
            if not _is_int(self.grid) or not 1 <= self.grid <= _MAX_INT32:
                raise UsageError(f"grid must be a positive int, not {self.grid!r}")
        elif self.kind == "bias_gelu" and -(-self.size * self.size // self.block) > _MAX_INT32:
            raise UsageError(f"bias_gelu-{self.size} needs more than 2**31 - 1 blocks of {self.block}: give a grid")
        for name in ("size", "block", "grid"):  # numpy integers become ints: equal specs hash alike
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, int(value))

    @property
    def label(self) -> str:
        """A short name, e.g. "sgemm-4096" or "bias_gelu-8192-block512-grid264"."""
        text = f"{self.kind}-{self.size}"
        if self.block != 256:
            text += f"-block{self.block}"
        if self.grid is not None:
            text += f"-grid{self.grid}"
        return text

    @property
    def kernel_name(self) -> str:
        """The kernel's name in workloads.cu."""
        return _KERNEL[self.kind]


def inputs(spec: ComputeSpec, seed: int = 0, *, beta: float = 0.0) -> dict[str, np.ndarray]:
    """The float32 host inputs of a workload, from ``numpy.random.default_rng(seed)``: sgemm
    "A", "B" (and "C", its initial value, when ``beta`` is not 0); bias_gelu "x", "bias";
    softmax "x"; layernorm "x" (mean 1: subtracting it matters), "gamma", "beta"."""
    n = spec.size
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0, shift=0.0):
        return (rng.standard_normal(shape) * scale + shift).astype(np.float32)

    if spec.kind == "sgemm":
        host = {"A": normal(n, n), "B": normal(n, n)}
        if beta != 0.0:
            host["C"] = normal(n, n)
        return host
    if spec.kind == "bias_gelu":
        return {"x": normal(n, n), "bias": normal(n)}
    if spec.kind == "softmax":
        return {"x": normal(n, n, scale=2.0)}
    return {"x": normal(n, n, scale=3.0, shift=1.0), "gamma": normal(n), "beta": normal(n)}


def expected(spec: ComputeSpec, host: dict[str, np.ndarray], *, alpha: float = 1.0,
             beta: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(reference, scale): the output computed by numpy in float64 from the float32 ``host``
    inputs, and the size of what each element sums or scales, which check() divides errors by:
    sgemm |alpha| (|A| @ |B|) + |beta| |C|; bias_gelu 1 + |x + bias|; softmax |ref|;
    layernorm |gamma| (1 + |xhat|) + |beta|, xhat the normalised input."""
    h = {k: v.astype(np.float64) for k, v in host.items()}
    if spec.kind == "sgemm":
        ref = alpha * (h["A"] @ h["B"])
        scale = abs(alpha) * (np.abs(h["A"]) @ np.abs(h["B"]))
        if beta != 0.0:
            ref += beta * h["C"]
            scale += abs(beta) * np.abs(h["C"])
    elif spec.kind == "bias_gelu":
        v = h["x"] + h["bias"]
        ref = 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
        scale = 1.0 + np.abs(v)
    elif spec.kind == "softmax":
        e = np.exp(h["x"] - h["x"].max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
        scale = ref
    else:
        x = h["x"]
        mean = x.mean(axis=1, keepdims=True)
        xhat = (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + LAYERNORM_EPS)
        ref = xhat * h["gamma"] + h["beta"]
        scale = np.abs(h["gamma"]) * (1.0 + np.abs(xhat)) + np.abs(h["beta"])
    return ref, np.maximum(scale, np.finfo(np.float64).tiny)


def tolerance(spec: ComputeSpec) -> float:
    """The largest normalised error (see expected()) that compare() accepts: 64 u for bias_gelu,
    8 (sqrt(n) + 4) u for the others, n the length of the sums (K, or cols), u = 2**-24."""
    if spec.kind == "bias_gelu":
        return 64 * _U
    # Rounding errors of an n-term float32 sum grow like sqrt(n) u with overwhelming
    # probability (Higham and Mary's probabilistic bound; 8 standard deviations), far below
    # the worst case n u, which would let a dropped term through at large n.
    return 8 * (math.sqrt(spec.size) + 4) * _U


def compare(spec: ComputeSpec, out: np.ndarray, ref: np.ndarray, scale: np.ndarray) -> float:
    """The largest normalised error |out - ref| / scale; ShimrtError naming the worst element
    if it exceeds ``tolerance(spec)``. A NaN or infinity in ``out`` always fails."""
    out = np.asarray(out)
    if out.shape != ref.shape:
        raise UsageError(f"out has shape {out.shape}, the workload's output {ref.shape}")
    with np.errstate(invalid="ignore"):
        err = np.abs(out.astype(np.float64) - ref) / scale
    err[~np.isfinite(err)] = np.inf
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    largest = float(err[worst])
    tol = tolerance(spec)
    if largest > tol:
        bad = int(np.count_nonzero(err > tol))
        raise ShimrtError(f"{spec.label}: element {tuple(int(i) for i in worst)} is {out[worst]!r}, "
                          f"expected {ref[worst]!r} (normalised error {largest:.3g} > tolerance {tol:.3g}); "
                          f"{bad} of {err.size} elements outside")
    return largest


# One loaded module per device, shared by the workloads that use it at the same time. The values
# are weak: a Module holds its Device, so a strong cache would keep every Device alive forever.
# The compile itself is cached on disk, so a reload after all workloads are gone is cheap.
_modules: "weakref.WeakValueDictionary[int, Module]" = weakref.WeakValueDictionary()
_modules_lock = threading.Lock()


def module(device: Device) -> Module:
    """``kernels_src/workloads.cu`` compiled for and loaded on ``device``."""
    if not isinstance(device, Device):
        raise UsageError(f"device must be a shimrt Device, not {type(device).__name__}")
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
        if not isinstance(spec, ComputeSpec):
            raise UsageError(f"spec must be a ComputeSpec, not {type(spec).__name__}")
        if spec.kind != "sgemm" and (alpha != 1.0 or beta != 0.0):
            raise UsageError(f"alpha and beta are for sgemm, not {spec.kind}")
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
        if spec.kind == "sgemm":
            self._args = (self.output, i["A"], i["B"], size, size, size, np.float32(alpha), np.float32(beta))
        elif spec.kind == "bias_gelu":
            self._args = (self.output, i["x"], i["bias"], size, size)
        elif spec.kind == "softmax":
            self._args = (self.output, i["x"], size, size)
        else:
            self._args = (self.output, i["x"], i["gamma"], i["beta"], size, size, np.float32(LAYERNORM_EPS))
        self._expected = None
        self.reset()

    @property
    def label(self) -> str:
        return self.spec.label

    def __repr__(self):
        return f"<ComputeWorkload {self.spec.label} on {self.device.name}: grid {self.grid}, block {self.block}>"

    def reset(self, stream=None) -> None:
        """Put the output back as it was before the first launch: sgemm's initial C when beta is
        not 0, otherwise all NaN (so that elements a launch fails to write show in check())."""
        if "C" in self.host:
            self.output.copy_from_host(self.host["C"], stream=stream)
        else:
            self.output.memset(0xFF, stream=stream)  # 0xFFFFFFFF is a float32 NaN

    def stamps_buffer(self) -> Buffer:
        """A zeroed uint64 buffer of 3 words per block, for ``launch(stamps=...)``."""
        return self.device.empty(3 * self.blocks, np.uint64).memset(0)

    def launch(self, stream=None, *, dynamic_smem: int = 0, stamps: Buffer | None = None, kernel=None) -> None:
        """One launch on ``stream`` (None: the legacy default stream) with ``dynamic_smem`` bytes of
        dynamic shared memory (padding only: the kernels use none). ``stamps``: a uint64 Buffer
        of at least 3 * blocks words that receives each block's start, end and SM id, or None.
        ``kernel``: the same kernel loaded elsewhere (an SM partition) to launch instead."""
        (kernel or self.kernel).launch(self.grid, self.block, *self._args, self._stamps_arg(stamps), stream=stream,
                                       dynamic_smem=dynamic_smem)

    def prepare(self, stream=None, *, dynamic_smem: int = 0, stamps: Buffer | None = None, kernel=None):
        """:meth:`launch`'s checks and argument packing done now; returns a function that
        launches (for launches that must follow each other with no host work between)."""
        return (kernel or self.kernel).prepare(self.grid, self.block, *self._args, self._stamps_arg(stamps),
                                               stream=stream, dynamic_smem=dynamic_smem)

    def _stamps_arg(self, stamps):
        if stamps is None:
            return 0  # the kernels skip the timestamps for a null pointer
        if not isinstance(stamps, Buffer):
            raise UsageError(f"stamps must be a shimrt Buffer of uint64, not {type(stamps).__name__}")
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
