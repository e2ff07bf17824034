"""CUPTI launch records on a real GPU: checked against a kernel whose footprint shimrt knows,
then used on the loaded NCCL."""

from __future__ import annotations

import numpy as np
import pytest

from shimrt import CollectiveError, ShimrtError, kernels
from shimrt.occupancy import Footprint
from shimrt.overlap import footprint


def recorder():
    from shimrt.cuda.trace import KernelRecorder
    try:
        return KernelRecorder()
    except ShimrtError as exc:
        pytest.skip(str(exc))


def test_cupti_records_match_a_known_launch(device):
    k = device.load(device.compile(kernels.source("reduce"), name="reduce.cu"))["block_sum"]
    out, x = device.empty(40, np.float64), device.to_device(np.ones(1 << 16, np.float32))
    with device.stream() as s:
        k.launch(40, 256, out, x, 1 << 16, stream=s)  # warm-up outside the recording
        s.synchronize()
        with recorder() as rec:
            k.launch((40, 1, 1), (256, 1, 1), out, x, 1 << 16, stream=s, dynamic_smem=4096)
            s.synchronize()
    (r,) = [r for r in rec.kernels if r["name"] == "block_sum"]
    assert (r["grid_x"], r["grid_y"], r["block_x"], r["block_y"]) == (40, 1, 256, 1)
    assert r["registers"] == k.attributes["registers"]
    assert r["static_smem"] == k.attributes["static_smem"] == 2048 and r["dynamic_smem"] == 4096
    assert r["end"] > r["start"]


def test_nccl_footprint_is_measured(device):
    try:
        result = footprint.measure(device, nbytes=16 << 20)
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    print("\n" + footprint.report(result))
    assert set(result["operations"]) == {"all_reduce sum", "all_reduce avg", "all_reduce max",
                                         "send/recv to self (grouped)"}
    for records in result["operations"].values():
        for r in records:
            _, f = Footprint.of_record(r)
            assert f.threads >= 32 and f.registers > 0, r
