"""Shared fixtures. GPU tests live in tests/gpu/ and are marked ``gpu`` automatically; the
``device`` fixture skips them with the reason when no GPU can be opened (never at import)."""

from __future__ import annotations

from pathlib import Path

import pytest

GPU_DIR = Path(__file__).parent / "gpu"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def device():
    import shimrt
    try:
        dev = shimrt.Device()
    except shimrt.NoDeviceError as exc:
        pytest.skip(f"needs a GPU: {exc}")
    yield dev


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private, empty compile cache for one test."""
    d = tmp_path / "cache"
    monkeypatch.setenv("SHIMRT_CACHE_DIR", str(d))
    monkeypatch.delenv("SHIMRT_DISABLE_CACHE", raising=False)
    return d


@pytest.fixture(scope="session")
def hiprtc():
    """The hipRTC backend, or a skip saying what to install. CI sets SHIMRT_TEST_REQUIRE_HIPRTC=1
    so that a missing hipRTC fails there instead of skipping (its gfx90a compiles must run)."""
    import os

    import shimrt
    from shimrt.hip import rtc
    try:
        rtc.version()
    except shimrt.NoDeviceError as exc:
        if os.environ.get("SHIMRT_TEST_REQUIRE_HIPRTC") == "1":
            pytest.fail(f"hipRTC is required here (SHIMRT_TEST_REQUIRE_HIPRTC=1) but: {exc}")
        pytest.skip(f"needs hipRTC for gfx90a: {exc}")
    return rtc
