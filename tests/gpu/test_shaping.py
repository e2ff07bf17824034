"""Occupancy shaping on a real GPU: the driver agrees with shape(), and a shaped launch really
holds no more blocks per SM than promised (from in-kernel SM ids and device timestamps)."""

from __future__ import annotations

import numpy as np
import pytest

from shimrt import kernels
from shimrt.occupancy import NCCL_2_28_SM90, Footprint


def all_kernels(device):
    for src in kernels.names():
        module = device.load(device.compile(kernels.source(src), name=src))
        for name in module.kernels:
            yield module[name]


def test_shape_agrees_with_the_driver_for_every_kernel(device):
    smem_only = Footprint("NCCL smem only", 1, 32, 0, NCCL_2_28_SM90.static_smem, NCCL_2_28_SM90.dynamic_smem)
    checked = 0
    for k in all_kernels(device):
        for bs in (64, 128, 256, 512, 1024):
            if bs > k.attributes["max_threads_per_block"]:
                continue
            natural = k.max_active_blocks(bs, 0)
            for n in sorted({1, 2, max(1, natural // 2), natural}):
                if n <= natural:
                    s = k.shape(bs, resident_blocks=n)  # raises if the driver disagrees
                    assert s.resident_blocks == n == k.max_active_blocks(bs, s.dynamic_smem)
                    checked += 1
            for reserve in (smem_only, NCCL_2_28_SM90.with_threads(128)):
                try:
                    s = k.shape(bs, reserve=reserve)
                except Exception as exc:  # no room at any residency: must say which resource
                    assert "(registers)" in str(exc) or "(shared_memory)" in str(exc), exc
                else:
                    assert k.max_active_blocks(bs, s.dynamic_smem) == s.resident_blocks
                    checked += 1
    assert checked > 50


def max_concurrency_per_sm(sm, start, stop, num_sms):
    """Largest number of blocks that ran on one SM at the same time, per SM."""
    out = np.zeros(num_sms, dtype=np.int64)
    for s in range(num_sms):
        mask = sm == s
        events = sorted([(t, 1) for t in start[mask]] + [(t, -1) for t in stop[mask]], key=lambda e: (e[0], e[1]))
        level = peak = 0
        for _, d in events:
            level += d
            peak = max(peak, level)
        out[s] = peak
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_shaped_launch_holds_at_most_n_blocks_per_sm(device, n):
    k = device.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    bs, sms = 128, device.target.num_sms
    shaping = k.shape(bs, resident_blocks=n)
    blocks = sms * n * 4
    bufs = (device.empty(blocks, np.uint32), device.empty(blocks, np.uint64), device.empty(blocks, np.uint64))
    spin = 100_000 * device.timestamp_hz // 1_000_000_000  # 100 us
    with device.stream() as s:
        k.launch(blocks, bs, *bufs, spin, stream=s, dynamic_smem=shaping.dynamic_smem)
        s.synchronize()
        sm, start, stop = (b.numpy() for b in bufs)
        peak = max_concurrency_per_sm(sm, start, stop, sms)
        assert peak.max() == n, (n, np.bincount(peak))
        # Control: unshaped, the same launch runs more than n blocks at once on an SM.
        natural = k.max_active_blocks(bs, 0)
        k.launch(sms * natural, bs, *bufs[:1], *bufs[1:], spin, stream=s)
        s.synchronize()
    sm, start, stop = (b.numpy()[: sms * natural] for b in bufs)
    assert max_concurrency_per_sm(sm, start, stop, sms).max() > n
