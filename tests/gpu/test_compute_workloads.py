"""The overlap engine's compute workloads on a real GPU: every output element checked against a
float64 numpy reference, per-block timestamps, padding shared memory, repeatability."""

from __future__ import annotations

import numpy as np
import pytest

from shimrt import ShimrtError, UsageError
from shimrt.overlap import workloads
from shimrt.overlap.workloads import ComputeSpec, ComputeWorkload

SPECS = [
    ComputeSpec("sgemm", 128), ComputeSpec("sgemm", 256), ComputeSpec("sgemm", 512), ComputeSpec("sgemm", 1152),
    ComputeSpec("bias_gelu", 1), ComputeSpec("bias_gelu", 1000), ComputeSpec("bias_gelu", 777, block=96, grid=13),
    ComputeSpec("bias_gelu", 2048, grid=132),
    ComputeSpec("softmax", 1), ComputeSpec("softmax", 37), ComputeSpec("softmax", 1000, block=128),
    ComputeSpec("softmax", 4099), ComputeSpec("softmax", 300, block=1000), ComputeSpec("softmax", 64, block=1024),
    ComputeSpec("layernorm", 1), ComputeSpec("layernorm", 37, block=64), ComputeSpec("layernorm", 1000),
    ComputeSpec("layernorm", 3001, block=200), ComputeSpec("layernorm", 513, block=33),
]


def _check_stamps(device, wl, stamps):
    words = stamps.numpy().reshape(-1, 3)[: wl.blocks]
    start, end, sm = words[:, 0], words[:, 1], words[:, 2]
    assert (start > 0).all(), f"{np.count_nonzero(start == 0)} of {wl.blocks} blocks wrote no stamps"
    assert (start <= end).all()
    if device.backend == "cuda":  # HIP packs XCC, SE and CU ids into its hardware id
        assert (sm < device.target.num_sms).all()
    return start, end, sm


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label)
def test_every_element_matches_numpy(device, spec):
    wl = ComputeWorkload(device, spec, seed=7)
    assert wl.blocks == wl.grid[0] * wl.grid[1] * wl.grid[2]
    stamps = wl.stamps_buffer()
    wl.launch(stamps=stamps)
    err = wl.check()
    assert 0 <= err <= wl.tolerance
    _check_stamps(device, wl, stamps)


def test_sgemm_alpha_beta_reads_c(device):
    wl = ComputeWorkload(device, ComputeSpec("sgemm", 384), seed=1, alpha=-1.5, beta=0.25)
    with device.stream() as s:
        wl.launch(s)
        s.synchronize()
    wl.check()
    wl.launch()  # C changed: a second launch without reset gives something else
    with pytest.raises(ShimrtError, match="outside"):
        wl.check()
    wl.reset()
    np.testing.assert_array_equal(wl.result(), wl.host["C"])
    wl.launch()
    wl.check()


def test_sgemm_non_square_through_the_kernel(device, rng):
    # The kernel takes any M, N (multiples of 128) and K (a multiple of 8); the spec is square.
    M, N, K = 256, 384, 72
    a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    out = device.empty((M, N), np.float32).memset(0xFF)
    grid = (N // 128, M // 128 + 1)  # a row of blocks beyond M must do nothing but its stamps
    stamps = device.empty(3 * grid[0] * grid[1], np.uint64).memset(0)
    workloads.module(device)["sgemm"].launch(grid, 256, out, device.to_device(a), device.to_device(b),
                                             np.int32(M), np.int32(N), np.int32(K), np.float32(1), np.float32(0),
                                             stamps)
    spec = ComputeSpec("sgemm", 128)  # only K matters for the tolerance: use one at least as strict
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    workloads.compare(spec, out.numpy(), ref, scale)
    assert (stamps.numpy().reshape(-1, 3)[:, 0] > 0).all()


def test_repeated_launches_give_identical_output(device):
    for spec in (ComputeSpec("sgemm", 256), ComputeSpec("softmax", 500), ComputeSpec("bias_gelu", 300, grid=5)):
        wl = ComputeWorkload(device, spec)
        wl.launch()
        first = wl.result()
        wl.reset()
        assert np.isnan(wl.result()).all()  # reset: NaN, so unwritten elements would show
        for _ in range(3):
            wl.launch()
        np.testing.assert_array_equal(wl.result(), first)


def test_padding_shared_memory_caps_residency_and_keeps_results(device):
    wl = ComputeWorkload(device, ComputeSpec("sgemm", 2048))
    natural = wl.kernel.max_active_blocks(256, 0)
    assert natural >= 2  # 128 registers and 16.6 KB: two blocks of 256 per SM
    shaping = wl.kernel.shape(256, resident_blocks=1)
    stamps = wl.stamps_buffer()
    with device.stream() as s:
        wl.launch(s, dynamic_smem=shaping.dynamic_smem, stamps=stamps)
        s.synchronize()
    wl.check()
    start, end, sm = _check_stamps(device, wl, stamps)
    if device.backend == "cuda":  # at most one block of it on any SM at any time
        for unit in np.unique(sm):
            order = np.argsort(start[sm == unit])
            s_, e_ = start[sm == unit][order], end[sm == unit][order]
            assert (s_[1:] >= e_[:-1]).all(), f"SM {unit} ran two blocks at once"


def test_workloads_share_the_module_of_a_device(device):
    a = ComputeWorkload(device, ComputeSpec("softmax", 16))
    b = ComputeWorkload(device, ComputeSpec("sgemm", 128))
    assert a.module is b.module is workloads.module(device)


def test_bad_stamps_are_refused_before_launch(device):
    wl = ComputeWorkload(device, ComputeSpec("softmax", 64))
    for bad, message in [(device.empty(3 * 64 - 1, np.uint64), "at least 192 uint64"),
                         (device.empty(3 * 64, np.uint32), "at least 192 uint64"),
                         (np.zeros(192, np.uint64), "must be a shimrt Buffer")]:
        with pytest.raises(UsageError, match=message):
            wl.launch(stamps=bad)
    assert np.isnan(wl.result()).all()


def test_flops_and_bytes_are_positive(device):
    wl = ComputeWorkload(device, ComputeSpec("layernorm", 100))
    assert wl.flops == 8 * 100 * 100 and wl.bytes == 4 * (2 * 100 * 100 + 200)
