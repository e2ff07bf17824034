"""The per-launch decision for kernels shimrt did not compile (shimrt.overlap.foreign): real
footprints of torch's kernels on the H200 (../shared/notes), checked against the occupancy model."""

from __future__ import annotations

import pytest

from shimrt import UsageError, occupancy
from shimrt.overlap.foreign import Decisions, Launch, decide

NCCL = occupancy.NCCL_2_28_SM90.with_threads(512)
# As CUPTI saw torch 2.11's kernels on the H200.
LAYERNORM = Launch("layernorm", 4096, 128, 32, 0)
NVJET = Launch("nvjet_sm90_tst_192x192", 132, 384, 168, 0, 188604)
SOFTMAX = Launch("softmax", 8192, 1024, 37, 0)


def test_a_kernel_above_the_cap_is_padded_to_it_and_the_driver_arithmetic_agrees():
    d = decide("sm_90", LAYERNORM, 2)
    assert (d.action, d.natural_blocks, d.resident_blocks) == ("pad", 16, 2)
    assert d.needs_opt_in  # above 48 KiB: the function's limit must be raised first
    with_pad = occupancy.max_active_blocks("sm_90", block_size=128, registers=32, static_smem=d.dynamic_smem)
    assert with_pad == 2  # the padding really caps it


def test_the_footprint_lowers_the_cap_to_what_leaves_it_room():
    d = decide("sm_90", LAYERNORM, 4, NCCL)
    assert d.action == "pad" and d.resident_blocks == 1  # NCCL's 103 KiB of shared memory leaves room for one
    free = 233472 - (d.dynamic_smem + 1024)
    assert free >= NCCL.static_smem + NCCL.dynamic_smem + 1024


def test_a_kernel_with_its_own_dynamic_smem_keeps_it_under_the_padding():
    own = Launch("tiled", 10_000, 256, 32, 1024, dynamic_smem=16384)
    d = decide("sm_90", own, 2)
    assert d.action == "pad" and d.dynamic_smem > 16384
    assert occupancy.max_active_blocks("sm_90", block_size=256, registers=32,
                                       static_smem=1024 + d.dynamic_smem) == 2


@pytest.mark.parametrize("launch, cap, footprint, why", [
    (NVJET, 2, None, "persistent or one-wave (132 blocks on 132 SMs"),
    (Launch("small", 100, 128, 16, 0), 2, None, "persistent or one-wave"),
    (SOFTMAX, 2, None, "already at most 2 resident blocks per SM (1)"),
    (SOFTMAX, 2, NCCL, "cannot leave the communication room at any residency"),
    (Launch("clustered", 4096, 128, 16, 0, cluster_blocks=2), 2, None, "a cluster launch (2 blocks per cluster)"),
    (Launch("coop", 4096, 128, 16, 0, cooperative=True), 2, None, "a cooperative launch"),
    (Launch("big-static", 4096, 128, 16, 200_000), 2, None, "already at most 2 resident blocks per SM (1)"),
])
def test_launches_left_alone_say_why(launch, cap, footprint, why):
    d = decide("sm_90", launch, cap, footprint)
    assert d.action == "skip" and why in d.reason, d.reason
    assert d.dynamic_smem == launch.dynamic_smem and d.padding == 0


def test_decisions_are_cached_and_counted():
    from shimrt import targets
    decisions = Decisions(targets.get("sm_90"), 2)
    for _ in range(3):
        d = decisions("fn-a", LAYERNORM)
        assert d.action == "pad"
        decisions.record(LAYERNORM.name, True)
    d = decisions("fn-b", NVJET)
    decisions.record(NVJET.name, d.action == "pad", d.reason)
    assert decisions.padded == {"layernorm": 3}
    assert list(decisions.skipped) == [(NVJET.name, d.reason)] and "persistent" in d.reason
    assert list(decisions.skipped.values()) == [1] and len(decisions) == 2


@pytest.mark.parametrize("bad, message", [
    (dict(grid_blocks=0), "Launch.grid_blocks must be an int >= 1"),
    (dict(block_threads=-1), "Launch.block_threads must be an int >= 1"),
    (dict(registers=1.5), "Launch.registers must be an int"),
    (dict(cooperative="yes"), "Launch.cooperative must be"),
    (dict(cluster_blocks=0), "Launch.cluster_blocks must be an int >= 1"),
])
def test_bad_launch_descriptions_are_refused(bad, message):
    fields = dict(name="k", grid_blocks=10, block_threads=128, registers=16, static_smem=0) | bad
    with pytest.raises(UsageError, match=message):
        Launch(**fields)


def test_bad_decision_arguments_are_refused():
    with pytest.raises(UsageError, match="cap must be an int >= 1"):
        decide("sm_90", LAYERNORM, 0)
    with pytest.raises(UsageError, match="launch must be a foreign.Launch"):
        decide("sm_90", {"grid": 1}, 2)
    with pytest.raises(UsageError, match="footprint must be an occupancy.Footprint"):
        decide("sm_90", LAYERNORM, 2, footprint="nccl")


def test_the_torch_helpers_say_what_they_need():
    import importlib.util

    import shimrt.torch as st
    if importlib.util.find_spec("torch") is None:
        with pytest.raises(UsageError, match="needs PyTorch: pip install 'shimrt\\[torch\\]'"):
            st.stream(object())
        with pytest.raises(UsageError, match="needs PyTorch"):
            with st.sm_carveout(16):
                pass
    else:
        with pytest.raises(UsageError, match="takes an open shimrt Stream"):
            st.stream(object())
        with pytest.raises(UsageError, match="sms must be an int in 0..1024"):
            with st.sm_carveout(-1):
                pass
