"""What a compute workload is and what it must produce, on the host: :class:`ComputeSpec`, the
inputs drawn for it, the float64 numpy reference, the tolerance, and the bytes it needs.

:mod:`.workloads` runs them on a device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import validate
from ..errors import ShimrtError, UsageError
from ..validate import available_host_memory, require_memory

__all__ = ["KINDS", "SGEMM_TILE", "SGEMM_THREADS", "MAX_BLOCK", "LAYERNORM_EPS", "ComputeSpec", "as_spec", "as_seed",
           "as_scale", "input_elements", "host_bytes", "device_bytes", "inputs", "expected", "inputs_names",
           "tolerance", "compare"]

KINDS = ("sgemm", "bias_gelu", "softmax", "layernorm")
_KERNEL = {"sgemm": "sgemm", "bias_gelu": "bias_gelu", "softmax": "softmax_rows", "layernorm": "layernorm_rows"}
SGEMM_TILE = 128      # sgemm's block tile (M and N must be multiples of it)
SGEMM_THREADS = 256   # and its block size
MAX_BLOCK = 1024      # the row kernels' shared-memory reductions hold one float per thread
LAYERNORM_EPS = 1e-5
_MAX_INT32 = 2**31 - 1
# The kernels take sizes as int and index with 64-bit products (row * cols), so size * size may
# exceed int32; what bounds a size is the grid (sgemm's y dimension, at most 65535 tiles) and memory.
MAX_SIZE = {"sgemm": 65535 * SGEMM_TILE, "bias_gelu": _MAX_INT32, "softmax": _MAX_INT32, "layernorm": _MAX_INT32}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_U = 2.0**-24         # float32 unit roundoff


def _positive(value, what: str, most: int, where: str = "") -> int:
    """``value`` as an int in 1..most (numpy integers taken, bools not)."""
    try:
        return validate.integer(value, what, least=1, most=most)
    except UsageError:
        raise UsageError(f"{what} must be a positive int (at most {most}{where}), not {value!r}") from None


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

    def __post_init__(self) -> None:
        validate.one_of(self.kind, "kind", KINDS)
        _positive(self.size, "size", MAX_SIZE[self.kind], f" for {self.kind}")
        validate.integer(self.block, "block", least=1, most=MAX_BLOCK)
        if self.kind == "sgemm":
            if self.size % SGEMM_TILE:
                raise UsageError(f"sgemm needs a size that is a multiple of {SGEMM_TILE}, not {self.size}")
            if self.block != SGEMM_THREADS:
                raise UsageError(f"sgemm uses {SGEMM_THREADS} threads per block; leave block at its default")
        if self.grid is not None:
            if self.kind != "bias_gelu":
                raise UsageError(f"grid is for bias_gelu only; {self.kind} has one block per "
                                 + ("128 x 128 tile" if self.kind == "sgemm" else "row"))
            _positive(self.grid, "grid", _MAX_INT32)
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


def as_spec(spec: Any) -> ComputeSpec:
    """``spec`` when it is a ComputeSpec."""
    if not isinstance(spec, ComputeSpec):
        raise UsageError(f"spec must be a ComputeSpec, not {spec!r:.100}")
    return spec


def as_seed(seed: Any) -> int:
    """A seed for numpy's generator: an int >= 0."""
    return validate.integer(seed, "seed", least=0)


def as_scale(value: Any, what: str) -> float:
    """sgemm's alpha or beta: a float32-representable finite number."""
    # sgemm takes alpha and beta as float32: a larger value would become infinity.
    return validate.number(value, what, least=-_FLOAT32_MAX, most=_FLOAT32_MAX)


def input_elements(spec: ComputeSpec, *, beta: float = 0.0) -> int:
    """float32 elements of a workload's inputs (see :func:`inputs`)."""
    n = as_spec(spec).size
    return {"sgemm": (2 + (beta != 0.0)) * n * n, "bias_gelu": n * n + n, "softmax": n * n,
            "layernorm": n * n + 2 * n}[spec.kind]


def host_bytes(spec: ComputeSpec, *, beta: float = 0.0) -> int:
    """Host memory :func:`inputs` needs at its peak: the float32 inputs, and the two float64
    arrays of size x size that one of them is drawn through."""
    return 4 * input_elements(spec, beta=beta) + 16 * spec.size * spec.size


def device_bytes(spec: ComputeSpec, *, beta: float = 0.0) -> int:
    """Device memory a :class:`ComputeWorkload` allocates: its inputs and its size x size output."""
    return 4 * input_elements(spec, beta=beta) + 4 * spec.size * spec.size


def inputs(spec: ComputeSpec, seed: int = 0, *, beta: float = 0.0) -> dict[str, np.ndarray]:
    """The float32 host inputs of a workload, from ``numpy.random.default_rng(seed)``: sgemm
    "A", "B" (and "C", its initial value, when ``beta`` is not 0); bias_gelu "x", "bias";
    softmax "x"; layernorm "x" (mean 1: subtracting it matters), "gamma", "beta". UsageError,
    with the sizes, when they would not fit in the host's available memory."""
    as_spec(spec)
    seed, beta = as_seed(seed), as_scale(beta, "beta")
    if spec.kind != "sgemm" and beta != 0.0:
        raise UsageError(f"beta is for sgemm, not {spec.kind}")
    require_memory(host_bytes(spec, beta=beta), available_host_memory(), f"the inputs of {spec.label}", "host")
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
    as_spec(spec)
    alpha, beta = as_scale(alpha, "alpha"), as_scale(beta, "beta")
    if spec.kind != "sgemm" and (alpha != 1.0 or beta != 0.0):
        raise UsageError(f"alpha and beta are for sgemm, not {spec.kind}")
    if not isinstance(host, dict) or not all(isinstance(v, np.ndarray) for v in host.values()):
        raise UsageError(f"host must be the dict of numpy arrays from inputs(), not {host!r:.100}")
    wanted = set(inputs_names(spec, beta=beta))
    if set(host) != wanted:
        raise UsageError(f"host must hold the inputs {', '.join(sorted(wanted))} of {spec.label}, "
                         f"not {', '.join(sorted(map(str, host)))}")
    # float64 copies of the inputs, and the reference, its scale and their temporaries.
    require_memory(8 * input_elements(spec, beta=beta) + 32 * spec.size * spec.size, available_host_memory(),
                   f"the float64 reference of {spec.label}", "host")
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


def inputs_names(spec: ComputeSpec, *, beta: float = 0.0) -> tuple[str, ...]:
    """The names of a workload's inputs, as :func:`inputs` gives them."""
    return {"sgemm": ("A", "B") + (("C",) if beta != 0.0 else ()), "bias_gelu": ("x", "bias"), "softmax": ("x",),
            "layernorm": ("x", "gamma", "beta")}[as_spec(spec).kind]


def tolerance(spec: ComputeSpec) -> float:
    """The largest normalised error (see expected()) that compare() accepts: 64 u for bias_gelu,
    8 (sqrt(n) + 4) u for the others, n the length of the sums (K, or cols), u = 2**-24."""
    if as_spec(spec).kind == "bias_gelu":
        return 64 * _U
    # Rounding errors of an n-term float32 sum grow like sqrt(n) u with overwhelming
    # probability (Higham and Mary's probabilistic bound; 8 standard deviations), far below
    # the worst case n u, which would let a dropped term through at large n.
    return 8 * (math.sqrt(spec.size) + 4) * _U


def compare(spec: ComputeSpec, out: np.ndarray, ref: np.ndarray, scale: np.ndarray) -> float:
    """The largest normalised error |out - ref| / scale; ShimrtError naming the worst element
    if it exceeds ``tolerance(spec)``. A NaN or infinity in ``out`` always fails."""
    as_spec(spec)
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "biuf":
        raise UsageError(f"out must be a numpy array of real numbers, not {out!r:.100}"
                         + (f" of {out.dtype}" if isinstance(out, np.ndarray) else ""))
    if not isinstance(ref, np.ndarray) or not isinstance(scale, np.ndarray) or ref.shape != scale.shape:
        raise UsageError("ref and scale must be the numpy arrays of one shape that expected() returns")
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
