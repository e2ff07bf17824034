"""Target profiles and lookup."""

from __future__ import annotations

import dataclasses

import pytest

from shimrt import ShimrtError, Target, targets


@pytest.mark.parametrize("name,expected", [
    ("H200", "H200"), ("h200", "H200"), ("NVIDIA H200", "H200"), ("H100", "H100"), ("h100-sxm", "H100"),
    ("A100", "A100"), ("a40", "A40"), ("sm_80", "A100"), ("SM_86", "A40"), ("sm_90", "H100"),
])
def test_lookup_by_product_or_arch(name, expected):
    assert targets.get(name).name == expected


def test_profiles_have_the_documented_arches():
    assert {n: t.arch for n, t in targets.PROFILES.items()} == {
        "A100": "sm_80", "A40": "sm_86", "H100": "sm_90", "H200": "sm_90", "MI250X": "gfx90a"}
    for t in targets.PROFILES.values():
        assert (t.backend, t.warp_size) == (("hip", 64) if t.arch.startswith("gfx") else ("cuda", 32))


def test_h200_matches_the_measured_device_attributes():
    # shared/notes/h200-measurements.md, read off a real H200.
    t = targets.get("H200")
    assert (t.num_sms, t.smem_per_sm, t.smem_per_block_optin, t.reserved_smem_per_block) == (132, 233472, 232448, 1024)
    assert (t.max_threads_per_sm, t.max_blocks_per_sm, t.regs_per_sm) == (2048, 32, 65536)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ShimrtError) as info:
        targets.get("B200")
    for known in ("A40", "A100", "H100", "H200", "sm_80", "sm_86", "sm_90"):
        assert known in str(info.value)
    with pytest.raises(ShimrtError):
        targets.get(90)


def test_target_is_frozen_and_validated():
    t = targets.get("A100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.num_sms = 1
    assert t.with_(num_sms=7).num_sms == 7 and t.num_sms == 108
    with pytest.raises(ShimrtError, match="num_sms"):
        t.with_(num_sms=0)
    with pytest.raises(ShimrtError, match="backend"):
        Target(**{**t.__dict__, "backend": "opencl"})
    assert t.compute_capability == (8, 0) and targets.get("A40").compute_capability == (8, 6)
