"""Shared fixtures. GPU tests live in tests/gpu/ and are marked ``gpu`` automatically; the
``device`` fixture skips them with the reason when no GPU can be opened (never at import)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).parent / "gpu"
#: What shimrt names its own entries in the temp folder (MPS folders, torch's file stores).
OWN_TEMP = "shimrt-"


def _own_temp() -> set[str]:
    from shimrt.launch import mps  # its daemons' folders: TMPDIR where short enough for their sockets, else /tmp
    roots = {tempfile.gettempdir(), mps.temp_root()}
    return {str(p) for root in roots if Path(root).is_dir() for p in Path(root).glob(OWN_TEMP + "*")}


def pytest_sessionstart(session):
    session.config.stash[_BEFORE] = _own_temp()


def pytest_sessionfinish(session, exitstatus):
    """No test may leave shimrt's entries in the temp folder, whatever its outcome: a new one
    fails the run, named (the tests that make them clean up after themselves: see
    :func:`no_temp_left`; this is the net under them)."""
    left = sorted(_own_temp() - session.config.stash.get(_BEFORE, set()))
    if left:
        session.config.get_terminal_writer().line(f"tests left these in the temp folder: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def no_temp_left():
    """Entries of shimrt's made in the temp folder during the test are removed after it, whatever
    its outcome (a launcher killed by the test cannot remove its MPS folder itself)."""
    before = _own_temp()
    yield
    for path in sorted(_own_temp() - before):
        if Path(path).is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            Path(path).unlink(missing_ok=True)


_BEFORE = pytest.StashKey[set]()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if GPU_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)


#: What a test needs that a machine may lack, as shimrt says it is missing: (its name for
#: SHIMRT_TEST_REQUIRE, the start of shimrt's message).
OPTIONAL_TOOLS = (("nvrtc", "NVRTC is not installed"), ("matplotlib", "plots need matplotlib"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that reaches a tool this machine lacks (NVRTC, matplotlib) is skipped with shimrt's
    message saying what to install, as the hipRTC ones are; CI lists them as required."""
    from shimrt import ShimrtError
    try:
        return (yield)
    except ShimrtError as exc:
        for name, said in OPTIONAL_TOOLS:
            if str(exc).startswith(said):
                skip_or_fail(name, str(exc))
        raise


#: Modules a test imports with pytest.importorskip that CI may require by name (SHIMRT_TEST_REQUIRE):
#: there, a skip for want of one is a failure.
REQUIRABLE_MODULES = ("torch",)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped:
        import os
        required = {w.strip() for w in os.environ.get("SHIMRT_TEST_REQUIRE", "").split(",") if w.strip()}
        for name in REQUIRABLE_MODULES:
            if name in required and f"could not import '{name}'" in str(report.longrepr):
                report.outcome = "failed"
                report.longrepr = f"{name} is required here (SHIMRT_TEST_REQUIRE) but: {report.longrepr}"
    return report


@pytest.fixture(scope="session")
def device():
    import shimrt
    try:
        dev = shimrt.Device()
    except shimrt.NoDeviceError as exc:
        pytest.skip(f"needs a GPU: {exc}")
    yield dev


@pytest.fixture
def partition16(device):
    """(a 16-SM split of ``device``, the rest, a stream of the rest), closed after the test;
    skipped where the driver has no SM partitions (green contexts)."""
    import shimrt
    try:
        kept, rest = device.partition(16)
    except shimrt.ShimrtError as exc:
        pytest.skip(f"no SM partition here: {exc}")
    s = rest.stream()
    yield kept, rest, s
    device.activate()
    s.close()
    kept.close()
    rest.close()


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


def skip_or_fail(what: str, reason: str):
    """Skip, unless CI listed ``what`` in SHIMRT_TEST_REQUIRE (comma separated): then fail, so
    that checks CI must run (the gfx90a compiles, NVIDIA's reference calculator) never skip."""
    import os
    required = {w.strip() for w in os.environ.get("SHIMRT_TEST_REQUIRE", "").split(",") if w.strip()}
    if what in required:
        pytest.fail(f"{what} is required here (SHIMRT_TEST_REQUIRE) but: {reason}")
    pytest.skip(reason)


def require_matplotlib() -> None:
    """Skip where matplotlib is missing (fail where CI requires it), for a test whose plot call
    would not raise shimrt's own message (a CLI's exit code, an error expected of the plot)."""
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        skip_or_fail("matplotlib", "plots need matplotlib: pip install 'shimrt[plot]'")


@pytest.fixture(scope="session")
def hiprtc():
    """The hipRTC backend, or a skip saying what to install."""
    import shimrt
    from shimrt.hip import rtc
    try:
        rtc.version()
    except shimrt.NoDeviceError as exc:
        skip_or_fail("hiprtc", f"needs hipRTC for gfx90a: {exc}")
    return rtc


# Kernels held to a register cap (NCCL's 96 for the stand-in, two SGEMM blocks per SM): NVRTC 13.5
# fits them without spilling, NVRTC 13.0 (the H200's) spills a few words under the same cap.
SPILL_ALLOWANCE = {"comm_ring": 64, "sgemm": 64}


@pytest.fixture(scope="session")
def spill_allowance():
    """Bytes of spill NVRTC may report per kernel (0 for any kernel not listed)."""
    return SPILL_ALLOWANCE


@pytest.fixture
def script():
    """A function that imports ``scripts/NAME.py`` (a diagnostic script, not a package module) and
    returns the module, to test its parts."""
    import importlib.util

    def load(name: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture
def gloo_ranks():
    """A function that runs ``tests/SCRIPT RANK PORT ARGS...`` as two gloo ranks on this CPU and
    returns each rank's line starting "rank R:" (the script prints it), after checking both
    ended with 0; both are killed after 120 s."""
    pytest.importorskip("torch")
    import os
    import socket
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]

    def run(script: str, *argv: str) -> list[str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        env = dict(os.environ, PYTHONPATH=str(root))
        procs = [subprocess.Popen([sys.executable, str(root / "tests" / script), str(r), port, *argv],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for r in (0, 1)]
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=120)[0])
        finally:
            for p in procs:
                p.kill()
                p.wait()
        lines = []
        for rank, (p, out) in enumerate(zip(procs, outs, strict=True)):
            assert p.returncode == 0, out[-3000:]
            lines.append(next(x for x in out.splitlines() if x.startswith(f"rank {rank}:")))
        return lines
    return run


@pytest.fixture
def gloo():
    """torch, with torch.distributed initialised over gloo as one rank of one in this process
    (destroyed after the test); skipped where torch.distributed is missing or already up."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed is unavailable or already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield torch
    finally:
        dist.destroy_process_group()
