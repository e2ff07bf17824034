"""MPS for ranks that share a GPU (shimrt.launch.mps and python -m shimrt.launch --mps), without a GPU.

NVIDIA's control daemon needs a GPU machine, so these tests run a stand-in for it
(tests/data/mps_control_standin.py, copied as ``nvidia-cuda-mps-control`` and named by
SHIMRT_MPS_CONTROL): a Python program that daemonizes on ``-d``, writes its pid file, listens on
its control socket, answers ``get_server_list`` and exits on ``quit``, as the vendor's does. What
is under test is the launcher's management of that daemon: refusing where it cannot run, starting
it before the ranks with private folders, giving the ranks its variables, and stopping it and
removing its folders after them, whatever ends them. tests/gpu/test_mps_gpu.py runs the real one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from shimrt import DriverError, NoDeviceError, ShimrtError, UsageError, launch
from shimrt.config import launch_env
from shimrt.launch import mps
from shimrt.launch.ranks import GRACE_S

DATA = Path(__file__).parent / "data"
PROBE = str(DATA / "mps_probe.py")
OUTER = ("SHIMRT_DEVICES", "SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE",
         "SHIMRT_NCCL_UNIQUE_ID", "SHIMRT_NCCL_UNIQUE_ID_ERROR", "SHIMRT_MPS", "SHIMRT_MPS_CONTROL", "RANK",
         "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
STARTED = re.compile(r"MPS control daemon started \(pid (\d+); pipes in (\S+), logs in (\S+)\)")


@pytest.fixture(autouse=True)
def _no_mps_folder_left(no_temp_left):
    """Every test here: no MPS folder of its launcher's left behind, whatever its outcome."""


@pytest.fixture
def standin(tmp_path):
    """The stand-in control program, as an executable named like NVIDIA's. Any daemon of it a
    test leaves behind is killed afterwards (the tests that check for that do it first)."""
    program = tmp_path / "bin" / mps.CONTROL
    program.parent.mkdir()
    program.write_text(f"#!{sys.executable}\n" + (DATA / "mps_control_standin.py").read_text())
    program.chmod(0o755)
    yield str(program)
    for pid in _standins(str(program)):
        os.kill(pid, signal.SIGKILL)


def _standins(program: str) -> list[int]:
    """Running processes of the stand-in ``program`` (its daemons, or clients still asking)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if program.encode() in argv[:2] and state not in ("Z", "X"):
            pids.append(int(entry))
    return pids


def env_with(standin: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OUTER}
    if standin is not None:
        env["SHIMRT_MPS_CONTROL"] = standin
    env.update(extra)
    return env


def launch_cmd(*args, env, timeout=60):
    return subprocess.run([sys.executable, "-m", "shimrt.launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def reports(stdout: str) -> dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"\[rank (\d+)\] (\{.*\})$", line)
        if m:
            out[int(m.group(1))] = json.loads(m.group(2))
    return out


def started(stderr: str) -> tuple[int, str, str]:
    """(pid, pipe folder, log folder) of the daemon the launcher said it started."""
    m = STARTED.search(stderr)
    assert m, stderr
    return int(m.group(1)), m.group(2), m.group(3)


def assert_gone(stderr: str, standin: str) -> None:
    """The launcher's daemon is gone and its folders removed, and no stand-in process is left."""
    pid, pipe, log = started(stderr)
    deadline = time.monotonic() + 5  # a daemon killed last is reaped by init, which may take a moment
    while mps.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mps.alive(pid), f"the MPS daemon {pid} still runs"
    assert not os.path.exists(pipe) and not os.path.exists(log)
    assert not os.path.exists(os.path.dirname(pipe))  # the private folder holding both
    assert _standins(standin) == []


# --- the command line and its refusals -------------------------------------------------------

@pytest.mark.timeout(30)
def test_mps_is_in_the_help():
    run = launch_cmd("--help", env=env_with(None), timeout=20)
    assert run.returncode == 0
    assert "--mps" in run.stdout and "MPS daemon" in run.stdout and "SHIMRT_MPS_CONTROL" in run.stdout


def refusals(stderr: str) -> list[str]:
    """The launcher's lines but its warning that NCCL did not load (on a machine without NCCL)."""
    return [line for line in stderr.splitlines() if not line.startswith("shimrt.launch: NCCL did not load here")]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("what", ["missing", "not executable"])
def test_a_control_program_that_is_not_there_is_refused_before_any_rank_starts(tmp_path, what):
    path = tmp_path / "nvidia-cuda-mps-control"
    if what == "not executable":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o644)
    run = launch_cmd("--nproc", "2", "--mps", PROBE, "env", env=env_with(str(path)), timeout=20)
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"shimrt.launch: SHIMRT_MPS_CONTROL must name NVIDIA's MPS control program (nvidia-cuda-mps-control), "
            f"an executable file, not '{path}' ({'missing' if what == 'missing' else 'not an executable file'})"
            in run.stderr), run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr and len(refusals(run.stderr)) == 1


def test_without_the_control_program_mps_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.delenv("SHIMRT_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(mps, "SEARCHED", (str(tmp_path / "a"), str(tmp_path / "b")))
    with pytest.raises(mps.MpsError, match=f"MPS is not installed here: nvidia-cuda-mps-control is neither on PATH "
                                           f"nor in {tmp_path}/a or {tmp_path}/b; install NVIDIA's compute utilities"):
        mps.find_control()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / mps.CONTROL).write_text("")
    (tmp_path / "b" / mps.CONTROL).chmod(0o755)
    assert mps.find_control() == str(tmp_path / "b" / mps.CONTROL)  # off PATH, where NVIDIA's images put it


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["seen running", "named by CUDA_MPS_PIPE_DIRECTORY"])
def test_a_daemon_already_running_is_refused_saying_which_and_how_to_stop_it(standin, tmp_path, how):
    pipe, log = tmp_path / "p", tmp_path / "l"
    pipe.mkdir()
    log.mkdir()
    theirs = env_with(standin, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(log))
    subprocess.run([standin, "-d"], env=theirs, timeout=20, check=True)
    deadline = time.monotonic() + 10
    while not (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int((pipe / mps.PID_FILE).read_text())
    try:
        env = theirs if how == "named by CUDA_MPS_PIPE_DIRECTORY" else env_with(standin)
        run = launch_cmd("--nproc", "2", "--mps", PROBE, "env", env=env, timeout=30)
        assert run.returncode == 2, run.stdout + run.stderr
        assert (f"shimrt.launch: an MPS control daemon already runs on this machine: pid {pid} (user "
                in run.stderr), run.stderr
        assert f"pipe folder {pipe})" in run.stderr
        assert f"echo quit | CUDA_MPS_PIPE_DIRECTORY={pipe} {standin}" in run.stderr
        assert "or launch without --mps" in run.stderr
        assert run.stdout == "" and "Traceback" not in run.stderr
        assert mps.alive(pid)  # theirs: left alone
        assert [d.pid for d in mps.running(standin)] == [pid]
    finally:
        subprocess.run([standin], input="quit\n", text=True, env=theirs, timeout=20)
    deadline = time.monotonic() + 5
    while mps.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mps.running(standin) == []


@pytest.mark.parametrize("length", [mps.TEMP_ROOT_MAX, mps.TEMP_ROOT_MAX + 1])
def test_the_daemons_folders_go_to_the_temporary_folder_where_its_sockets_fit(monkeypatch, length):
    import shutil
    import tempfile
    base = tempfile.mkdtemp(prefix="m", dir="/tmp")  # short, so that a folder of ``length`` bytes fits under it
    try:
        root = os.path.join(base, "d" * (length - len(base) - 1))
        os.mkdir(root)
        assert len(os.fsencode(root)) == length
        monkeypatch.setenv("TMPDIR", root)
        monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
        assert mps.temp_root() == (root if length <= mps.TEMP_ROOT_MAX else "/tmp")
    finally:
        shutil.rmtree(base)


@pytest.mark.timeout(60)
def test_a_daemon_that_does_not_start_is_refused_cleanly(standin):
    before = set(Path(mps.temp_root()).glob("shimrt-mps-*"))
    run = launch_cmd("--nproc", "2", "--mps", PROBE, "env", env=env_with(standin, MPS_STANDIN_FAIL_START="1"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"shimrt.launch: the MPS control daemon did not start: {standin} -d exited with code 1: standin: "
            "cannot start the MPS control daemon: no usable GPU driver" in run.stderr), run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert set(Path(mps.temp_root()).glob("shimrt-mps-*")) == before  # its folders removed


@pytest.mark.timeout(60)
def test_a_control_program_that_starts_no_daemon_is_refused(tmp_path):
    """One that exits 0 to anything (/bin/true) seemed to start and answer: the ranks then ran
    outside MPS with no word (issue 24)."""
    true = tmp_path / "nvidia-cuda-mps-control"
    true.write_text("#!/bin/sh\nexit 0\n")
    true.chmod(0o755)
    before = set(Path(mps.temp_root()).glob("shimrt-mps-*"))
    run = launch_cmd("--nproc", "1", "--mps", PROBE, "env", env=env_with(str(true)), timeout=30)
    assert run.returncode == 2, run.stdout + run.stderr
    assert (f"shimrt.launch: the MPS control daemon did not start: {true} -d returned and answered, but no daemon "
            f"runs (no {mps.PID_FILE} in its pipe folder, no process of it): is it NVIDIA's {mps.CONTROL}?"
            in run.stderr), run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr and len(refusals(run.stderr)) == 1
    assert set(Path(mps.temp_root()).glob("shimrt-mps-*")) == before  # its folders removed


@pytest.mark.timeout(60)
def test_a_daemon_that_never_answers_is_refused_and_killed(standin, monkeypatch):
    monkeypatch.setenv("MPS_STANDIN_SILENT", "1")
    daemon = mps.Mps(standin, start_timeout=1, stop_timeout=1)
    t0 = time.monotonic()
    with pytest.raises(mps.MpsError, match=r"started but did not answer get_server_list within 1 s \(Cannot find "
                                           r"MPS control daemon process\); its log: MPS control.log: .*silent"):
        daemon.start()
    assert time.monotonic() - t0 < 15
    assert not daemon.running and not os.path.exists(daemon.pipe_directory)
    assert _standins(standin) == []  # the silent daemon was killed on the way out


# --- the daemon's lifetime around the ranks --------------------------------------------------

@pytest.mark.timeout(60)
def test_the_ranks_are_clients_of_the_daemon_which_is_gone_after_a_normal_end(standin):
    run = launch_cmd("--nproc", "2", "--mps", PROBE, "env", env=env_with(standin))
    assert run.returncode == 0, run.stdout + run.stderr
    pid, pipe, log = started(run.stderr)
    got = reports(run.stdout)
    assert sorted(got) == [0, 1], run.stdout
    for r in got.values():
        assert (r["pipe"], r["log"], r["mark"], r["launch_env_mps"]) == (pipe, log, "1", True)
        assert r["answers"] and r["daemon"] == pid  # the daemon ran, and answered, while the ranks did
    assert pipe.startswith(os.path.join(mps.temp_root(), "shimrt-mps-"))
    assert os.path.dirname(pipe) == os.path.dirname(log)
    assert_gone(run.stderr, standin)


@pytest.mark.timeout(60)
def test_without_mps_the_ranks_get_no_mark_of_it(standin):
    # A SHIMRT_MPS left in the launcher's own environment (a launcher inside a rank) is not passed on.
    run = launch_cmd("--nproc", "1", PROBE, "env", env=env_with(standin, SHIMRT_MPS="1"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert reports(run.stdout)[0]["mark"] is None and not reports(run.stdout)[0]["launch_env_mps"]
    assert "MPS" not in run.stderr and _standins(standin) == []


@pytest.mark.timeout(60)
def test_a_failing_rank_stops_the_others_and_then_the_daemon(standin):
    t0 = time.monotonic()
    run = launch_cmd("--nproc", "2", "--mps", PROBE, "exit", "7", "1", env=env_with(standin))
    took = time.monotonic() - t0
    assert run.returncode == 7, run.stdout + run.stderr
    assert "rank 1 exited with code 7; stopping the other 1 rank(s)" in run.stderr
    assert took < GRACE_S + 10  # rank 0 would sleep 120 s
    assert "shimrt.launch: MPS control.log: " in run.stderr  # what the daemon saw, before its folders go
    assert_gone(run.stderr, standin)


@pytest.mark.timeout(60)
def test_a_rank_whose_context_fails_under_mps_says_so_and_the_others_stop_at_once(standin):
    run = launch_cmd("--nproc", "2", "--mps", PROBE, "context-fails", "1", env=env_with(standin))
    ended = time.time()
    assert run.returncode == 1, run.stdout + run.stderr
    last = [line for line in run.stdout.splitlines() if line.startswith("[rank 1] ")][-1]
    assert last.startswith("[rank 1] shimrt.errors.DriverError: cuDevicePrimaryCtxRetain failed: "
                           "CUDA_ERROR_DEVICE_UNAVAILABLE (46): CUDA-capable device(s) is/are busy or unavailable "
                           "(likely cause: MPS. This rank is a client of python -m shimrt.launch --mps's daemon"), last
    assert "Launch again, or without --mps)" in last
    assert "rank 1 exited with code 1; stopping the other 1 rank(s)" in run.stderr
    # The waiting peer went at once, not after the grace period, and the daemon after it.
    failed = float(re.search(r"^\[rank 1\] FAILING ([0-9.]+)$", run.stdout, re.M).group(1))
    assert "killing it" not in run.stderr and ended - failed < GRACE_S
    assert_gone(run.stderr, standin)


@pytest.mark.timeout(60)
def test_the_timeout_stops_the_ranks_and_then_the_daemon(standin, tmp_path):
    run = launch_cmd("--nproc", "2", "--mps", "--timeout", "1", PROBE, "sleep", str(tmp_path), env=env_with(standin))
    assert run.returncode == 124, run.stdout + run.stderr
    assert "still running after --timeout 1 s" in run.stderr
    assert_gone(run.stderr, standin)


def _with_signal(sig: signal.Signals, disposition: Any):
    """A ``preexec_fn`` giving the child ``sig`` as ``disposition``: a test that sends the launcher
    a signal starts it with that signal's default, whatever the test runner inherited (nohup ignores
    SIGHUP, a background job of a shell SIGINT; the launcher rightly keeps an ignored signal)."""
    def preexec() -> None:
        signal.signal(sig, disposition)
    return preexec


def _launch_sleepers(standin, tmp_path, preexec) -> subprocess.Popen:
    """The launcher with two ranks under --mps that sleep, once both have said where they run."""
    proc = subprocess.Popen([sys.executable, "-m", "shimrt.launch", "--nproc", "2", "--mps", PROBE, "sleep",
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_with(standin), start_new_session=True, preexec_fn=preexec)
    deadline = time.monotonic() + 45
    while len(list(tmp_path.glob("rank-*.json"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def _end(proc: subprocess.Popen, tmp_path) -> None:
    """Whatever the test's outcome: the launcher's group and its ranks killed."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    for f in tmp_path.glob("rank-*.json"):
        try:
            os.kill(json.loads(f.read_text())["rank"], signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_launcher_stops_the_ranks_and_then_the_daemon(standin, tmp_path, sig):
    proc = _launch_sleepers(standin, tmp_path, _with_signal(sig, signal.SIG_DFL))
    try:
        ranks = [json.loads(f.read_text()) for f in tmp_path.glob("rank-*.json")]
        daemon = ranks[0]["daemon"]
        assert {r["daemon"] for r in ranks} == {daemon} and mps.alive(daemon)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + sig, err
        assert f"got {sig.name}; passing it to 2 running rank(s)" in err
        assert "Traceback" not in err
        assert not any(mps.alive(r["rank"]) for r in ranks)
        assert_gone(err, standin)
    finally:
        _end(proc, tmp_path)


@pytest.mark.timeout(90)
def test_a_signal_the_launcher_inherited_as_ignored_stays_ignored(standin, tmp_path):
    """As under nohup: SIGHUP ignored on the way in is ignored by the launcher and its ranks, which
    run on; SIGTERM still stops them and the daemon."""
    proc = _launch_sleepers(standin, tmp_path, _with_signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        ranks = [json.loads(f.read_text()) for f in tmp_path.glob("rank-*.json")]
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None and all(mps.alive(r["rank"]) for r in ranks)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM and "got SIGHUP" not in err, err
        assert_gone(err, standin)
    finally:
        _end(proc, tmp_path)


@pytest.mark.timeout(60)
def test_a_daemon_that_ignores_quit_is_killed(standin, monkeypatch):
    monkeypatch.setenv("MPS_STANDIN_IGNORE_QUIT", "1")
    with mps.Mps(standin, stop_timeout=1) as daemon:
        pid, root = daemon.pid, os.path.dirname(daemon.pipe_directory)
        assert daemon.ask("get_default_active_thread_percentage") == "100.0"
        assert daemon.environment == {"CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_directory,
                                      "CUDA_MPS_LOG_DIRECTORY": daemon.log_directory, "SHIMRT_MPS": "1"}
        t0 = time.monotonic()
        notes = daemon.stop()
    assert time.monotonic() - t0 < 10
    assert notes == [f"the MPS daemon did not quit within 1 s (quit sent); killed its process(es) {pid}"]
    assert not mps.alive(pid) and not os.path.exists(root) and _standins(standin) == []
    assert daemon.stop() == [] and not daemon.running  # twice (the with block's exit) is harmless


# --- API checks and a rank's error -----------------------------------------------------------

def test_mps_checks_its_arguments(standin):
    for bad in (dict(start_timeout=0), dict(stop_timeout=-1), dict(start_timeout="5"), dict(control="")):
        with pytest.raises(UsageError):
            mps.Mps(**bad)
    daemon = mps.Mps(standin)
    with pytest.raises(UsageError, match="not running: start"):
        _ = daemon.environment
    with pytest.raises(UsageError, match="not running: start"):
        daemon.ask("get_server_list")
    with pytest.raises(mps.MpsError, match="is not an executable file"):
        mps.Mps(str(Path(standin).parent / "nothing")).start()
    with daemon:
        with pytest.raises(UsageError, match="has started already"):
            daemon.start()
        assert daemon.ask("get_server_list") == ""  # no client yet: no server
        subprocess.run([standin], input="quit\n", text=True, env=env_with(standin, **daemon.environment), timeout=20)
        with pytest.raises(mps.MpsError, match="did not answer 'get_server_list': Cannot find MPS control daemon"):
            daemon.ask("get_server_list")
    assert not daemon.running and _standins(standin) == []
    with pytest.raises(UsageError, match="mps must be True or False, not 'yes'"):
        launch.run(2, ["x.py"], mps="yes")


def test_a_ranks_gpu_failure_under_mps_names_mps():
    err = mps.client_error(DriverError("cuDevicePrimaryCtxRetain", "CUDA_ERROR_DEVICE_UNAVAILABLE", 46, "busy"))
    assert isinstance(err, DriverError) and err.name == "CUDA_ERROR_DEVICE_UNAVAILABLE" and err.code == 46
    assert str(err).startswith("cuDevicePrimaryCtxRetain failed: CUDA_ERROR_DEVICE_UNAVAILABLE (46): busy (likely "
                               "cause: MPS. This rank is a client of python -m shimrt.launch --mps's daemon")
    err = mps.client_error(NoDeviceError("no GPU available (cuda: cuInit failed: CUDA_ERROR_MPS_CONNECTION_FAILED)"))
    assert isinstance(err, NoDeviceError) and "likely cause: MPS" in str(err)
    err = mps.client_error(DriverError("cuCtxSetCurrent", "CUDA_ERROR_INVALID_CONTEXT", 201, "invalid context"))
    assert "(under MPS: this rank is a client of python -m shimrt.launch --mps's daemon, which may be why" in str(err)
    assert "\n" not in str(err)
    for unrelated in (NoDeviceError("no GPU available (cuda: no CUDA driver: ...)"), ShimrtError("something else")):
        assert mps.client_error(unrelated) is unrelated  # not MPS's doing: told as it is


def test_init_names_mps_only_under_the_launchers_mps(monkeypatch):
    import shimrt.device

    class Unavailable:
        def __init__(self, *args, **kwargs):
            raise DriverError("cuDevicePrimaryCtxRetain", "CUDA_ERROR_DEVICE_UNAVAILABLE", 46, "busy")

    monkeypatch.setattr(shimrt.device, "Device", Unavailable)
    for name, value in (("SHIMRT_RANK", "0"), ("SHIMRT_WORLD_SIZE", "2"), ("SHIMRT_LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SHIMRT_MPS", raising=False)
    with pytest.raises(DriverError) as plain:
        launch.init()
    assert "MPS" not in str(plain.value)
    monkeypatch.setenv("SHIMRT_MPS", "1")
    assert launch_env().mps
    with pytest.raises(DriverError, match=r"busy \(likely cause: MPS"):
        launch.init()
