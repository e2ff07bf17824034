"""A short soak: shaped launches and collectives leave no resource behind (scripts/soak.py runs
the long one and reports its figures)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from shimrt import CollectiveError

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def test_shaped_launches_and_collectives_leave_nothing_behind(device):
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    try:
        result = soak.soak(device, 1200, progress=False)  # crosses one communicator and module renewal
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    before, after = result["before"], result["after"]
    assert result["shaped launches"] == result["collectives"] == 1200 + result["warmup"]
    for key in before:
        if key.startswith("live ") or key in ("open fds", "threads"):
            assert after[key] == before[key], (key, before, after)
    assert after["device_used_MiB"] - before["device_used_MiB"] <= 4, (before, after)
