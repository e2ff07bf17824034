"""What a machine without a GPU sees: settings, errors, NoDeviceError, the selftest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import skip_or_fail

import shimrt
from shimrt.config import settings
from shimrt.cuda import check

ROOT = Path(__file__).resolve().parents[1]


def has_gpu():
    try:
        shimrt.Device().close()
        return True
    except shimrt.NoDeviceError:
        return False


def test_settings_read_the_environment(tmp_path):
    s = settings({"SHIMRT_BACKEND": "CUDA", "SHIMRT_CACHE_DIR": str(tmp_path), "SHIMRT_DISABLE_CACHE": "yes"})
    assert (s.backend, s.cache_dir, s.cache_enabled) == ("cuda", tmp_path, False)
    s = settings({"XDG_CACHE_HOME": str(tmp_path)})
    assert (s.backend, s.cache_dir, s.cache_enabled) == (None, tmp_path / "shimrt", True)
    with pytest.raises(shimrt.ShimrtError, match="SHIMRT_BACKEND"):
        settings({"SHIMRT_BACKEND": "opencl"})


def test_vendor_errors_become_driver_errors_named_after_them():
    from cuda.bindings import nvrtc
    with pytest.raises(shimrt.DriverError) as info:
        check.check((nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION,), "nvrtcCompileProgram")
    assert info.value.name == "NVRTC_ERROR_INVALID_OPTION" and info.value.call == "nvrtcCompileProgram"
    assert str(info.value).startswith("nvrtcCompileProgram failed: NVRTC_ERROR_INVALID_OPTION (5)")
    from cuda.bindings import driver
    with pytest.raises(shimrt.DriverError) as info:
        check.check((driver.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuMemAlloc")
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE" and info.value.code == 1
    assert check.check((driver.CUresult.CUDA_SUCCESS, 5), "x") == 5


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU")
def test_no_gpu_is_a_one_line_no_device_error():
    with pytest.raises(shimrt.NoDeviceError) as info:
        shimrt.Device()
    assert "\n" not in str(info.value) and "cuda" in str(info.value)
    with pytest.raises(shimrt.NoDeviceError, match="hip: ") as info:
        shimrt.Device(backend="hip")
    assert "\n" not in str(info.value)


@pytest.mark.skipif(has_gpu(), reason="this machine has a GPU")
@pytest.mark.parametrize("hidden, says", [
    (["hip"], "hip: not installed)"),  # one word, not hip-python's install advice
    (["hip", "cuda"], "no GPU backend is installed (cuda, hip): pip install 'shimrt[cuda]' for NVIDIA GPUs, "
                      "'shimrt[hip]' for AMD ones"),
])
def test_the_no_gpu_message_speaks_of_the_backends_installed(hidden, says):
    """A backend whose binding cannot be imported (made so for real: sys.modules says None) is
    named, not advised on; asked for by name, it gets the advice."""
    hide = "; ".join(f"sys.modules[{m!r}] = None" for m in hidden)
    code = (f"import sys; {hide}; import shimrt\n"
            "for backend in (None, 'hip'):\n"
            "    try: shimrt.Device(backend=backend)\n"
            "    except shimrt.NoDeviceError as e: print(e)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    default, asked = run.stdout.splitlines()
    assert says in default and "Debian" not in default and "apt-get" not in default, default
    assert "hip-python is not installed" in asked and "apt-get" in asked, asked


def test_selftest_runs_environment_and_compile_sections(tmp_path, request):
    env = {**__import__("os").environ, "SHIMRT_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "shimrt.selftest", "--json", "--quiet"], capture_output=True,
                         text=True, timeout=300, env=env, cwd=ROOT)
    results = json.loads(run.stdout)["results"]
    by = {(r["section"], r["name"]): r for r in results}
    assert run.returncode == (1 if any(r["status"] == "fail" for r in results) else 0)
    if by[("environment", "NVRTC")]["status"] != "pass":
        skip_or_fail("nvrtc", by[("environment", "NVRTC")]["detail"])
    arches = ["sm_80", "sm_86", "sm_90"]
    if by[("environment", "hipRTC")]["status"] == "pass":
        arches.append("gfx90a")
    else:  # the hiprtc fixture fails here when CI requires hipRTC, skips otherwise
        request.getfixturevalue("hiprtc")
    for arch in arches:
        for name in shimrt.kernels.names():
            assert by[("compile", f"{name} for {arch}")]["status"] == "pass"
    if not has_gpu():
        for key in [("device", "open device"), ("device", "overlap: prioritized comm beside shaped compute"),
                    ("communication", "single-rank collective"), ("communication", "N-rank collective")]:
            assert by[key]["status"] == "skip" and by[key]["fix"] and "no GPU" in by[key]["detail"]
        assert run.returncode == 0
        strict = subprocess.run([sys.executable, "-m", "shimrt.selftest", "--strict", "--quiet"],
                                capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
        assert strict.returncode == 1 and "skipped" in strict.stdout
    # Without --quiet, into a pipe: the report once, on stdout; no progress list before it (a
    # progress line is drawn only on a terminal, and erased before the report).
    plain = subprocess.run([sys.executable, "-m", "shimrt.selftest"], capture_output=True, text=True, timeout=300,
                           env=env, cwd=ROOT)
    assert plain.stderr == "" and plain.stdout.count("== compile") == 1, plain.stderr[:500]


def test_collective_bus_bandwidth_factors_follow_nccl_tests():
    from shimrt.bench.collectives import bus_factor
    assert [bus_factor("all_reduce", n) for n in (1, 2, 8)] == [0.0, 1.0, 1.75]
    assert [bus_factor("all_gather", n) for n in (1, 2, 8)] == [0.0, 0.5, 0.875]
    assert bus_factor("reduce_scatter", 4) == 0.75 and bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0


def test_bounded_waiting_stops_at_the_deadline():
    import time

    from shimrt import waiting
    calls = []
    t0 = time.monotonic()
    assert waiting.until(lambda: calls.append(1) and False, 0.05) is False
    assert 0.05 <= time.monotonic() - t0 < 1.0 and len(calls) > 3
    ticks = iter([False, False, True])
    assert waiting.until(lambda: next(ticks), 5) is True


def test_bounded_waiting_spins_before_it_sleeps():
    import time

    from shimrt import waiting
    calls = []
    t0 = time.monotonic()
    # Spinning: many calls within 20 ms, then the sleeps until the deadline.
    assert waiting.until(lambda: calls.append(1) and False, 0.05, first=0.01, longest=0.01, spin=0.02) is False
    assert 0.05 <= time.monotonic() - t0 < 1.0 and len(calls) > 100
    ticks = iter([False] * 50 + [True])
    t0 = time.monotonic()
    assert waiting.until(lambda: next(ticks), 5, first=1.0, spin=0.5) is True
    assert time.monotonic() - t0 < 0.5  # settled while spinning: no one-second sleep
