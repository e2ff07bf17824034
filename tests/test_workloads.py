"""The overlap engine's compute workloads without a GPU: workloads.cu compiles for every target
with the resources its design needs, ComputeSpec refuses bad input, and check()'s tolerances
accept float32 results computed another way but not a wrong element."""

from __future__ import annotations

import numpy as np
import pytest

import shimrt
from shimrt import ShimrtError, UsageError, kernels
from shimrt.overlap import workloads
from shimrt.overlap.workloads import ComputeSpec, ComputeWorkload

KERNELS = {"sgemm", "bias_gelu", "softmax_rows", "layernorm_rows"}
# kernel -> number of parameters, the trailing stamps pointer included
PARAMS = {"sgemm": 9, "bias_gelu": 6, "softmax_rows": 5, "layernorm_rows": 8}
SGEMM_SMEM = 2 * (8 * 132 + 8 * 128) * 4  # double-buffered A (transposed, padded) and B slices


def _compile(arch):
    return shimrt.compile(kernels.source("workloads"), shimrt.targets.get(arch), name="workloads.cu")


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90"])
def test_workloads_compile_for_nvidia_without_spills(arch, cache_dir, spill_allowance):
    program = _compile(arch)
    assert set(program.resources) == KERNELS
    for name, res in program.resources.items():
        assert res.spill_bytes <= spill_allowance.get(name, 0), (name, res)
    sgemm = program.resources["sgemm"]
    # __launch_bounds__(256, 2): two blocks of 256 threads fit an SM's 64K registers.
    assert sgemm.registers <= 128 and sgemm.max_threads_per_block == 256
    assert sgemm.static_smem == SGEMM_SMEM
    for name in ("softmax_rows", "layernorm_rows"):
        assert program.resources[name].static_smem == 1024 * 4  # one float per thread, up to 1024
        assert program.resources[name].max_threads_per_block == 1024
    assert program.resources["bias_gelu"].static_smem == 0


def test_sgemm_fits_two_blocks_per_sm_on_the_h200(cache_dir):
    res = _compile("H200").resources["sgemm"]
    occ = shimrt.occupancy.occupancy("H200", block_size=256, registers=res.registers, static_smem=res.static_smem)
    assert occ.blocks >= 2


def test_workloads_compile_for_gfx90a(hiprtc, cache_dir):
    program = _compile("gfx90a")
    assert set(program.resources) == KERNELS
    for name, res in program.resources.items():
        assert res.spill_bytes == 0 and res.extra["sgpr_spills"] == 0, (name, res)
        assert len(program.params[name]) == PARAMS[name]
    assert program.resources["sgemm"].static_smem == SGEMM_SMEM
    assert program.resources["sgemm"].max_threads_per_block == 256


def test_spec_defaults_and_labels():
    s = ComputeSpec("sgemm", 4096)
    assert (s.block, s.grid, s.label, s.kernel_name) == (256, None, "sgemm-4096", "sgemm")
    assert ComputeSpec("softmax", 1000).kernel_name == "softmax_rows"
    assert ComputeSpec("layernorm", 7, block=32).label == "layernorm-7-block32"
    assert ComputeSpec("bias_gelu", 8192, block=512, grid=264).label == "bias_gelu-8192-block512-grid264"
    spec = ComputeSpec("bias_gelu", np.int32(100), grid=np.int64(3))
    assert type(spec.size) is int and type(spec.grid) is int and spec == ComputeSpec("bias_gelu", 100, grid=3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(kind="gemm", size=128), "kind must be one of"),
    (dict(kind="sgemm", size=0), "size must be a positive int"),
    (dict(kind="softmax", size=-5), "size must be a positive int"),
    (dict(kind="softmax", size=64.0), "size must be a positive int"),
    (dict(kind="softmax", size=True), "size must be a positive int"),
    (dict(kind="softmax", size=2**31), "size must be a positive int"),
    (dict(kind="sgemm", size=100), "multiple of 128"),
    (dict(kind="sgemm", size=4096, block=128), "256 threads"),
    (dict(kind="softmax", size=64, block=0), "block must be an int in 1..1024"),
    (dict(kind="layernorm", size=64, block=2048), "block must be an int in 1..1024"),
    (dict(kind="layernorm", size=64, block="256"), "block must be an int"),
    (dict(kind="softmax", size=64, grid=10), "grid is for bias_gelu only"),
    (dict(kind="sgemm", size=128, grid=10), "grid is for bias_gelu only"),
    (dict(kind="bias_gelu", size=64, grid=0), "grid must be a positive int"),
    (dict(kind="bias_gelu", size=64, grid=2.5), "grid must be a positive int"),
    (dict(kind="bias_gelu", size=2**31 - 1, block=1), "give a grid"),
])
def test_bad_specs_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ComputeSpec(**kwargs)


def test_workload_arguments_are_checked_before_any_device_use():
    with pytest.raises(UsageError, match="spec must be a ComputeSpec"):
        ComputeWorkload(None, "sgemm-128")
    with pytest.raises(UsageError, match="alpha and beta are for sgemm"):
        ComputeWorkload(None, ComputeSpec("softmax", 16), beta=1.0)
    with pytest.raises(UsageError, match="device must be a shimrt Device"):
        workloads.module("cuda:0")


def test_inputs_are_reproducible_float32():
    spec = ComputeSpec("layernorm", 33)
    a, b = workloads.inputs(spec, seed=3), workloads.inputs(spec, seed=3)
    assert set(a) == {"x", "gamma", "beta"} and a["x"].shape == (33, 33) and a["gamma"].shape == (33,)
    assert all(v.dtype == np.float32 and np.array_equal(v, b[k]) for k, v in a.items())
    assert not np.array_equal(a["x"], workloads.inputs(spec, seed=4)["x"])
    assert set(workloads.inputs(ComputeSpec("sgemm", 128), beta=0.5)) == {"A", "B", "C"}


def _float32_result(spec, host, alpha=1.0, beta=0.0):
    """The workload computed in float32 by numpy, as a correct GPU kernel would within rounding."""
    f = np.float32
    if spec.kind == "sgemm":
        out = f(alpha) * (host["A"] @ host["B"])
        return out + f(beta) * host["C"] if beta else out
    if spec.kind == "bias_gelu":
        v = host["x"] + host["bias"]
        return f(0.5) * v * (f(1) + np.tanh(f(0.7978845608028654) * (v + f(0.044715) * v * v * v)))
    if spec.kind == "softmax":
        e = np.exp(host["x"] - host["x"].max(axis=1, keepdims=True))
        return e * (f(1) / e.sum(axis=1, keepdims=True))
    x = host["x"]
    mean = x.sum(axis=1, keepdims=True) / f(x.shape[1])
    d = x - mean
    inv = f(1) / np.sqrt((d * d).sum(axis=1, keepdims=True) / f(x.shape[1]) + f(workloads.LAYERNORM_EPS))
    return d * inv * host["gamma"] + host["beta"]


@pytest.mark.parametrize("spec, beta", [
    (ComputeSpec("sgemm", 256), 0.0), (ComputeSpec("sgemm", 384), -0.75), (ComputeSpec("bias_gelu", 333), 0.0),
    (ComputeSpec("softmax", 1000), 0.0), (ComputeSpec("layernorm", 517), 0.0),
])
def test_tolerance_accepts_float32_rounding_and_rejects_a_wrong_element(spec, beta):
    alpha = 1.5 if spec.kind == "sgemm" else 1.0
    host = workloads.inputs(spec, seed=1, beta=beta)
    ref, scale = workloads.expected(spec, host, alpha=alpha, beta=beta)
    out = _float32_result(spec, host, alpha, beta)
    assert out.dtype == np.float32
    err = workloads.compare(spec, out, ref, scale)
    assert err < workloads.tolerance(spec) / 4  # with room to spare
    bad = out.copy()
    bad[spec.size // 2, 7] += 20 * workloads.tolerance(spec) * scale[spec.size // 2, 7]
    with pytest.raises(ShimrtError, match=rf"element \({spec.size // 2}, 7\) is .*1 of {out.size} elements outside"):
        workloads.compare(spec, bad, ref, scale)
    bad = out.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ShimrtError, match=r"element \(0, 0\) is .*nan"):
        workloads.compare(spec, bad, ref, scale)
    with pytest.raises(UsageError, match="shape"):
        workloads.compare(spec, out[1:], ref, scale)


def test_sgemm_tolerance_catches_one_dropped_term():
    # The worst-case bound K u would accept this at large K; the probabilistic one does not.
    spec = ComputeSpec("sgemm", 512)
    host = workloads.inputs(spec)
    ref, scale = workloads.expected(spec, host)
    dropped = (host["A"][:, :-1] @ host["B"][:-1, :]).astype(np.float32)  # k = K - 1 left out
    with pytest.raises(ShimrtError, match="outside"):
        workloads.compare(spec, dropped, ref, scale)


def test_nominal_flops_and_bytes():
    class Fake(ComputeWorkload):
        def __init__(self, spec, beta=0.0):  # the arithmetic only: no device
            self.spec, self.host = spec, workloads.inputs(spec, beta=beta) if spec.kind == "sgemm" else {}
    assert Fake(ComputeSpec("sgemm", 128)).flops == 2 * 128**3
    assert Fake(ComputeSpec("sgemm", 128)).bytes == 3 * 4 * 128**2
    assert Fake(ComputeSpec("sgemm", 128), beta=1.0).bytes == 4 * 4 * 128**2
    assert Fake(ComputeSpec("softmax", 10)).bytes == 800 and Fake(ComputeSpec("softmax", 10)).flops == 600
    assert Fake(ComputeSpec("bias_gelu", 10)).bytes == 4 * 210
    assert Fake(ComputeSpec("layernorm", 10)).bytes == 4 * 220
