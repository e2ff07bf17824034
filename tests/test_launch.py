"""The launcher and its rendezvous with real processes (up to where NCCL needs a GPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import skip_or_fail

from shimrt import CollectiveError, ShimrtError, UsageError, launch
from shimrt.config import LaunchEnv, launch_env

DATA = Path(__file__).parent / "data"
PROBE = str(DATA / "rendezvous_probe.py")
LAUNCH_PROBE = str(DATA / "launch_probe.py")
# Launch variables of an outer launcher must not leak into the launches under test.
OUTER = ("SHIMRT_DEVICES", "SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE",
         "SHIMRT_NCCL_UNIQUE_ID", "SHIMRT_NCCL_UNIQUE_ID_ERROR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
         "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="module")
def nccl():
    from shimrt.nccl import library
    try:
        return library.load()
    except CollectiveError as exc:
        skip_or_fail("nccl", f"the launcher makes an ncclUniqueId, which needs NCCL: {exc}")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OUTER}
    env.update(extra)
    return env


def launch_cmd(*args, timeout=120, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "shimrt.launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env if env is not None else clean_env(), cwd=cwd)


def rank_lines(stdout: str) -> dict[int, list[str]]:
    """The ranks' output by rank, without the launcher's "[rank N] " prefix."""
    out: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        if line.startswith("[rank "):
            prefix, _, rest = line.partition("] ")
            out.setdefault(int(prefix[len("[rank "):]), []).append(rest)
    return out


def test_two_processes_share_one_unique_id(nccl):
    run = launch_cmd("--nproc", "2", PROBE)
    reports = {}
    for line in run.stdout.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("{"):
            reports[prefix] = json.loads(rest)
    assert set(reports) == {"[rank 0", "[rank 1"}, run.stdout + run.stderr
    assert [reports[f"[rank {i}"]["rank"] for i in range(2)] == [0, 1]
    assert {r["world_size"] for r in reports.values()} == {2}
    assert {r["source"] for r in reports.values()} == {"shimrt"}  # not torchrun, though RANK is set too
    assert len({r["unique_id"] for r in reports.values()}) == 1
    assert len(bytes.fromhex(reports["[rank 0"]["unique_id"])) == 128
    # Each rank joined, said there is no GPU, or (a peer missing) gave up within the timeout.
    ends = [line for line in run.stdout.splitlines() if any(w in line for w in ("JOINED", "NO-DEVICE", "GAVE-UP"))]
    assert len(ends) == 2 and run.returncode == 0, run.stdout + run.stderr


@pytest.mark.timeout(90)
def test_a_failing_rank_stops_the_others(nccl):
    t0 = time.monotonic()
    run = launch_cmd("--nproc", "2", PROBE, "fail-rank-1", timeout=60)
    assert run.returncode == 3, run.stdout + run.stderr
    assert time.monotonic() - t0 < 60  # rank 0 would sleep 120 s
    assert "rank 1 exited with code 3; stopping the other 1 rank(s)" in run.stderr


@pytest.mark.timeout(60)
def test_the_failing_rank_is_named_with_its_exit_code():
    t0 = time.monotonic()
    run = launch_cmd("--nproc", "3", LAUNCH_PROBE, "exit", "7", "2", timeout=45)
    assert run.returncode == 7, run.stdout + run.stderr
    assert "shimrt.launch: rank 2 exited with code 7; stopping the other 2 rank(s)" in run.stderr, run.stderr
    assert time.monotonic() - t0 < 30  # the others sleep 120 s
    assert "Traceback" not in run.stderr


@pytest.mark.timeout(60)
def test_a_rank_killed_by_a_signal_is_named_with_it():
    run = launch_cmd("--nproc", "2", LAUNCH_PROBE, "kill-self", "0", timeout=45)
    assert run.returncode == 128 + signal.SIGKILL, run.stdout + run.stderr
    assert "rank 0 was killed by SIGKILL; stopping the other 1 rank(s)" in run.stderr, run.stderr


@pytest.mark.timeout(60)
def test_the_timeout_stops_every_rank_with_124():
    t0 = time.monotonic()
    # "exit 0 5": rank 5 would exit, and there is none, so both ranks sleep.
    run = launch_cmd("--nproc", "2", "--timeout", "1", LAUNCH_PROBE, "exit", "0", "5", timeout=45)
    assert run.returncode == 124, run.stdout + run.stderr
    assert "still running after --timeout 1 s" in run.stderr, run.stderr
    assert time.monotonic() - t0 < 30


def test_launch_environments_are_read():
    env = launch_env({"SHIMRT_RANK": "1", "SHIMRT_WORLD_SIZE": "4", "SHIMRT_LOCAL_RANK": "1",
                      "SHIMRT_NCCL_UNIQUE_ID": "ab" * 128})
    assert (env.source, env.rank, env.world_size, env.local_rank, env.unique_id) == ("shimrt", 1, 4, 1, b"\xab" * 128)
    env = launch_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
    assert (env.source, env.rank, env.world_size, env.master_port) == ("torchrun", 3, 8, 29500)
    env = launch_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert (env.source, env.rank, env.world_size) == ("mpi", 2, 4)
    assert launch_env({}).source is None
    with pytest.raises(ShimrtError, match="SHIMRT_RANK .*must be an int"):
        launch_env({"SHIMRT_RANK": "x", "SHIMRT_WORLD_SIZE": "2", "SHIMRT_LOCAL_RANK": "0"})


def test_a_module_runs_in_every_rank(tmp_path):
    # -m module, as python takes it: here a module that prints its rank and its arguments, options
    # included (everything after -m module is the module's).
    (tmp_path / "rank_echo.py").write_text("import os, sys\nprint('RANK', os.environ['SHIMRT_RANK'], sys.argv[1:])\n")
    run = launch_cmd("--nproc", "2", "-m", "rank_echo", "x", "--y", "1", "-h", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        assert f"RANK {rank} ['x', '--y', '1', '-h']" in run.stdout, run.stdout
    nothing = launch_cmd("--nproc", "2", timeout=60)
    assert nothing.returncode == 2 and "give a script or -m module" in nothing.stderr


# --- the command line ------------------------------------------------------------------------

BAD_ARGUMENTS = [
    (["--nproc", "0"], "--nproc must be an int in 1..2147483647, not 0"),
    (["--nproc", "-2"], "--nproc must be an int in 1..2147483647, not -2"),
    (["--nproc", str(2**31)], "--nproc must be an int in 1..2147483647, not 2147483648"),
    (["--nproc", "abc"], "--nproc must be an int, not 'abc'"),
    (["--nproc", "1.5"], "--nproc must be an int, not '1.5'"),
    (["--nproc-per-node", "0"], "--nproc must be an int in 1..2147483647, not 0"),
    (["--nproc", "2", "--timeout", "0"], "--timeout must be a finite positive number <= 9223372036.0, not 0.0"),
    (["--nproc", "2", "--timeout", "-1"], "--timeout must be a finite positive number <= 9223372036.0, not -1.0"),
    (["--nproc", "2", "--timeout", "inf"], "--timeout must be a finite positive number <= 9223372036.0, not inf"),
    (["--nproc", "2", "--timeout", "nan"], "--timeout must be a finite positive number <= 9223372036.0, not nan"),
    (["--nproc", "2", "--timeout", "1e308"], "--timeout must be a finite positive number <= 9223372036.0, not 1e+308"),
    (["--nproc", "2", "--timeout", "abc"], "--timeout must be a number, not 'abc'"),
    (["--nproc", "2", "--devices", "0"], "--devices / SHIMRT_DEVICES must name one GPU per rank (2), not 1: 0"),
    (["--nproc", "1", "--devices", "0,0"], "must name one GPU per rank (1), not 2: 0,0"),
    (["--nproc", "2", "--devices", "0,-1"], "--devices must be comma-separated GPU indices"),
    (["--nproc", "2", "--devices", "a,b"], "--devices must be comma-separated GPU indices"),
    (["--nproc", "2", "--devices", "0,,1"], "--devices must be comma-separated GPU indices"),
    (["--nproc", "2", "--devices", ""], "--devices must be a string (not empty)"),
    (["--nproc", "2", "--nnodes", "2"], "--nnodes must be 1: python -m shimrt.launch starts ranks on this machine"),
    (["--nproc", "2", "--nnodes", "x"], "--nnodes must be 1, not 'x'"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, message", BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_are_refused_before_anything_starts(args, message):
    t0 = time.monotonic()
    run = launch_cmd(*args, LAUNCH_PROBE, "env", timeout=20)
    assert run.returncode == 2, run.stdout + run.stderr
    assert message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""  # no rank ran
    assert time.monotonic() - t0 < 20


def test_bad_arguments_in_process(capsys, tmp_path):
    assert launch.main(["--nproc", "0", LAUNCH_PROBE]) == 2
    assert "--nproc must be an int in 1..2147483647, not 0" in capsys.readouterr().err
    assert launch.main(["--nproc", "2", str(tmp_path / "missing.py")]) == 2
    assert "is not a readable file" in capsys.readouterr().err
    assert launch.main(["--nproc", "2", "-m"]) == 2
    assert "-m needs a module name" in capsys.readouterr().err
    assert launch.main([LAUNCH_PROBE]) == 2  # --nproc is required
    assert "--nproc" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_version_and_help():
    run = launch_cmd("--version", timeout=20)
    assert run.returncode == 0 and run.stdout.strip() == f"shimrt {__import__('shimrt').__version__}"
    run = launch_cmd("--help", timeout=20)
    assert run.returncode == 0
    for words in ("Start one process per local GPU", "--nproc-per-node", "MASTER_ADDR", "SIGTERM", "124"):
        assert words in run.stdout, run.stdout


@pytest.mark.timeout(30)
def test_a_bad_shimrt_variable_is_refused_before_the_ranks_start():
    run = launch_cmd("--nproc", "2", LAUNCH_PROBE, "env", env=clean_env(SHIMRT_BACKEND="xyz"), timeout=20)
    assert run.returncode == 2
    assert "shimrt.launch: SHIMRT_BACKEND must be one of cuda, hip, not 'xyz'" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""


def test_run_and_rendezvous_check_their_arguments():
    for bad in (dict(nproc=0, argv=["x.py"]), dict(nproc=True, argv=["x.py"]), dict(nproc=2, argv="x.py"),
                dict(nproc=2, argv=[]), dict(nproc=2, argv=["x.py"], timeout=0),
                dict(nproc=2, argv=["x.py"], timeout=float("nan"))):
        with pytest.raises(UsageError):
            launch.run(**bad)
    with pytest.raises(UsageError, match="env must be a shimrt.config.LaunchEnv"):
        launch.rendezvous({"SHIMRT_RANK": "0"})
    with pytest.raises(UsageError, match="backend must be one of cuda, hip, not 'xyz'"):
        launch.rendezvous(backend="xyz")
    with pytest.raises(UsageError, match="device must be a shimrt.Device"):
        launch.init(0)
    with pytest.raises(UsageError, match="options must be a shimrt.nccl.CommOptions"):
        launch.init(options={"timeout": 5})


def test_rendezvous_relays_why_the_launcher_had_no_unique_id():
    env = LaunchEnv("shimrt", 0, 2, 0, None, unique_id_error="NCCL (libnccl.so.2) not found; searched: x")
    with pytest.raises(CollectiveError) as info:
        launch.rendezvous(env)
    text = str(info.value)
    assert "NCCL (libnccl.so.2) not found" in text
    assert "pip install 'shimrt[nccl]'" in text and "SHIMRT_NCCL_LIBRARY" in text
    with pytest.raises(ShimrtError, match="SHIMRT_NCCL_UNIQUE_ID is not"):
        launch.rendezvous(LaunchEnv("shimrt", 0, 2, 0, None))


# --- the ranks' environment ------------------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("flag", ["--nproc", "--nproc-per-node", "--nproc_per_node", "--nproc-per-node="])
def test_ranks_see_torchrun_variables_beside_shimrt_ones(flag):
    args = [flag + "3"] if flag.endswith("=") else [flag, "3"]
    run = launch_cmd(*args, LAUNCH_PROBE, "env", timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    reports = {rank: json.loads(lines[0]) for rank, lines in rank_lines(run.stdout).items()}
    assert sorted(reports) == [0, 1, 2], run.stdout
    for rank, report in reports.items():
        v = report["vars"]
        for prefix in ("SHIMRT_", ""):
            assert (v[f"{prefix}RANK"], v[f"{prefix}WORLD_SIZE"], v[f"{prefix}LOCAL_RANK"],
                    v[f"{prefix}LOCAL_WORLD_SIZE"]) == (str(rank), "3", str(rank), "3")
        # torch.distributed's env:// rendezvous, as torchrun --standalone gives it: one for all the ranks
        assert v["MASTER_ADDR"] == "127.0.0.1" and v["MASTER_PORT"] == reports[0]["vars"]["MASTER_PORT"]
        assert 1 <= int(v["MASTER_PORT"]) <= 65535
        # Both sets are there: launch_env() reads shimrt's.
        assert report["launch_env"] == {"source": "shimrt", "rank": rank, "world_size": 3, "local_rank": rank,
                                        "local_world_size": 3}
        assert report["has_unique_id"] != (v["SHIMRT_NCCL_UNIQUE_ID_ERROR"] is not None)


@pytest.mark.timeout(90)
def test_a_rendezvous_the_caller_sets_reaches_the_ranks_as_it_is():
    for given, wanted in (({"MASTER_ADDR": "node7", "MASTER_PORT": "29501"}, ("node7", "29501")),
                          ({"MASTER_PORT": "29502"}, ("127.0.0.1", "29502"))):
        run = launch_cmd("--nproc", "2", LAUNCH_PROBE, "env", timeout=60, env=clean_env(**given))
        assert run.returncode == 0, run.stdout + run.stderr
        for lines in rank_lines(run.stdout).values():
            v = json.loads(lines[0])["vars"]
            assert (v["MASTER_ADDR"], v["MASTER_PORT"]) == wanted


def test_a_script_that_starts_torch_distributed_finds_its_rendezvous_under_the_launcher(tmp_path):
    """torch.distributed's env:// over gloo, with nothing set around the launcher: an all-reduce of
    the ranks' numbers."""
    pytest.importorskip("torch")
    script = tmp_path / "gloo_sum.py"
    script.write_text("import datetime, torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=30))\n"
                      "t = torch.tensor([dist.get_rank() + 1.0])\n"
                      "dist.all_reduce(t)\n"
                      "print('sum', int(t.item()))\n"
                      "dist.destroy_process_group()\n")
    run = launch_cmd("--nproc", "3", "--timeout", "60", str(script), timeout=90, env=clean_env(GLOO_SOCKET_IFNAME="lo"))
    assert run.returncode == 0, run.stdout + run.stderr
    said = {rank: [line for line in lines if line.startswith("sum")] for rank, lines in rank_lines(run.stdout).items()}
    assert said == {0: ["sum 6"], 1: ["sum 6"], 2: ["sum 6"]}, run.stdout


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["flag", "variable"])
def test_ranks_share_a_gpu_through_the_device_map(how):
    """--devices 0,0 (or SHIMRT_DEVICES) reaches every rank, and launch_env().device follows it."""
    args = ["--nproc", "3"] + (["--devices", "0,0,1"] if how == "flag" else [])
    env = clean_env(**({"SHIMRT_DEVICES": " 0, 0 ,1"} if how == "variable" else {}))
    run = launch_cmd(*args, LAUNCH_PROBE, "env", timeout=60, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    reports = {rank: json.loads(lines[0]) for rank, lines in rank_lines(run.stdout).items()}
    assert {r: rep["device"] for r, rep in reports.items()} == {0: 0, 1: 0, 2: 1}
    assert all(rep["vars"]["SHIMRT_DEVICES"] == "0,0,1" for rep in reports.values())  # checked, then passed on


@pytest.mark.timeout(30)
def test_a_device_map_of_the_wrong_length_in_the_environment_is_refused_before_the_ranks_start():
    run = launch_cmd("--nproc", "3", LAUNCH_PROBE, "env", timeout=20, env=clean_env(SHIMRT_DEVICES="0,0"))
    assert run.returncode == 2 and "must name one GPU per rank (3), not 2: 0,0" in run.stderr, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr


def test_torchruns_single_node_flags_are_taken_and_the_store_port_fits():
    run = launch_cmd("--standalone", "--nnodes", "1", "--nproc-per-node", "2", LAUNCH_PROBE, "env", timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(rank_lines(run.stdout)) == [0, 1]
    assert (launch.store_port(29500), launch.store_port(65535), launch.store_port(1)) == (29501, 65534, 2)
    for bad in (0, 65536, "29500"):
        with pytest.raises(UsageError, match="MASTER_PORT must be an int in 1..65535"):
            launch.store_port(bad)


def test_the_device_map_is_read_and_checked():
    from shimrt.config import device_map, devices_of
    assert devices_of("0,0") == (0, 0) and devices_of(" 3 ") == (3,)
    for bad in ("", "0,", "x", "0;1", "-1", "1.0", "0,,1"):
        with pytest.raises(UsageError, match="SHIMRT_DEVICES must be"):
            devices_of(bad)
    assert device_map({}) is None and device_map({"SHIMRT_DEVICES": "  "}) is None
    assert device_map({"SHIMRT_DEVICES": "1,1"}) == (1, 1)
    env = launch_env({"SHIMRT_RANK": "1", "SHIMRT_WORLD_SIZE": "2", "SHIMRT_LOCAL_RANK": "1",
                      "SHIMRT_LOCAL_WORLD_SIZE": "2", "SHIMRT_DEVICES": "0,0"})
    assert (env.local_rank, env.device) == (1, 0)
    assert launch_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).device == 1  # no map: the local rank
    assert launch_env({"RANK": "0", "WORLD_SIZE": "1", "SHIMRT_DEVICES": "5"}).device == 5
    with pytest.raises(UsageError, match=r"must name a GPU for each of the 2 local ranks, not '0' \(1\)"):
        launch_env({"SHIMRT_RANK": "1", "SHIMRT_WORLD_SIZE": "2", "SHIMRT_LOCAL_RANK": "1",
                    "SHIMRT_LOCAL_WORLD_SIZE": "2", "SHIMRT_DEVICES": "0"})
    with pytest.raises(UsageError, match="one GPU per rank"):
        launch.run(2, ["x.py"], devices=[0])
    with pytest.raises(UsageError, match="every item of devices"):
        launch.run(2, ["x.py"], devices=[0, -1])


# --- signals ---------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie nobody reaped yet does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _start_launcher(tmp_path, nproc, mode, sigint=signal.SIG_DFL):
    # The launcher gets its own session, so the test can always clean up after it. It starts with
    # SIGINT as ``sigint`` says, whatever pytest's is: a non-interactive shell starts a background
    # job (``pytest &``) with SIGINT ignored, and an ignored signal stays ignored (ranks.py).
    proc = subprocess.Popen([sys.executable, "-m", "shimrt.launch", "--nproc", str(nproc), LAUNCH_PROBE, mode,
                             str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    deadline = time.monotonic() + 45
    while len(list(tmp_path.glob("rank-*.json"))) < nproc:
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill_all(proc, tmp_path)
            pytest.fail(f"the ranks did not start: {proc.communicate()}")
        time.sleep(0.05)
    pids = []
    for f in tmp_path.glob("rank-*.json"):
        pids.extend(json.loads(f.read_text()).values())
    assert all(_alive(p) for p in pids)
    return proc, pids


def _kill_all(proc, tmp_path):
    """What a failed test leaves behind, killed."""
    for pid in [proc.pid] + [p for f in tmp_path.glob("rank-*.json") for p in json.loads(f.read_text()).values()]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_all_gone(proc, pids, timeout):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # the caller's finally kills the ranks
        raise
    deadline = time.monotonic() + 5  # the grandchildren are reaped by init, which may take a moment
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return out, err


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_reaches_every_rank_and_its_children(tmp_path, sig):
    proc, pids = _start_launcher(tmp_path, 2, "sleep")
    try:
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = _wait_all_gone(proc, pids, timeout=30)
        assert proc.returncode == 128 + sig, err
        assert f"got {signal.Signals(sig).name}; passing it to 2 running rank(s)" in err, err
        assert "Traceback" not in err
        assert [p for p in pids if _alive(p)] == []
        assert "killing it" not in err  # the ranks obeyed at once: no grace period to wait out
        assert time.monotonic() - t0 < launch.GRACE_S
    finally:
        _kill_all(proc, tmp_path)


@pytest.mark.timeout(90)
def test_a_launcher_started_with_sigint_ignored_keeps_ignoring_it(tmp_path):
    # A background job of a script (``python -m shimrt.launch ... &``) is started so: Ctrl-C at the
    # terminal is not for it, and its ranks run on.
    proc, pids = _start_launcher(tmp_path, 2, "sleep", sigint=signal.SIG_IGN)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None and all(_alive(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        out, err = _wait_all_gone(proc, pids, timeout=30)
        assert proc.returncode == 143, err
        assert "got SIGINT" not in err and "got SIGTERM; passing it to 2 running rank(s)" in err, err
    finally:
        _kill_all(proc, tmp_path)


@pytest.mark.timeout(90)
def test_ranks_that_ignore_sigterm_are_killed_after_the_grace_period(tmp_path):
    proc, pids = _start_launcher(tmp_path, 2, "stubborn")
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = _wait_all_gone(proc, pids, timeout=30)
        took = time.monotonic() - t0
        assert proc.returncode == 143, err
        assert "rank 0 still running after 5 s; killing it" in err, err
        assert [p for p in pids if _alive(p)] == []
        assert launch.GRACE_S - 0.5 < took < launch.GRACE_S + 10
    finally:
        _kill_all(proc, tmp_path)


@pytest.mark.timeout(90)
def test_what_a_stopped_rank_leaves_behind_is_killed(tmp_path):
    # The ranks exit on SIGTERM at once; their children ignore it and are killed with their group.
    proc, pids = _start_launcher(tmp_path, 2, "leaky")
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = _wait_all_gone(proc, pids, timeout=30)
        assert proc.returncode == 143, err
        assert [p for p in pids if _alive(p)] == []
    finally:
        _kill_all(proc, tmp_path)


@pytest.mark.timeout(90)
def test_a_second_signal_ends_the_grace_period(tmp_path):
    proc, pids = _start_launcher(tmp_path, 2, "stubborn")
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = _wait_all_gone(proc, pids, timeout=30)
        assert proc.returncode == 143, err
        assert [p for p in pids if _alive(p)] == []
        assert time.monotonic() - t0 < launch.GRACE_S - 1
    finally:
        _kill_all(proc, tmp_path)


# --- without NCCL ----------------------------------------------------------------------------

def _without_nccl(tmp_path, how: str) -> dict[str, str]:
    """An environment in which NCCL does not load: SHIMRT_NCCL_LIBRARY names a file that does
    not exist and ("hidden") the nvidia-nccl wheel cannot be imported (an empty ``nvidia``
    package earlier on the path hides the namespace package that holds it)."""
    env = clean_env(SHIMRT_NCCL_LIBRARY=str(tmp_path / "missing" / "libnccl.so.2"))
    if how == "hidden":
        (tmp_path / "shadow" / "nvidia").mkdir(parents=True)
        (tmp_path / "shadow" / "nvidia" / "__init__.py").write_text("")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path / "shadow"), env.get("PYTHONPATH")) if p)
    check = subprocess.run([sys.executable, "-c", "from shimrt.nccl import library; print(library.load().path)"],
                           capture_output=True, text=True, env=env, timeout=60)
    if check.returncode == 0:
        if how == "configured":
            pytest.xfail("shimrt/nccl/library.py still falls back to another NCCL when SHIMRT_NCCL_LIBRARY "
                         f"does not load (it loaded {check.stdout.strip()})")
        pytest.skip(f"NCCL loads from elsewhere on this machine: {check.stdout.strip()}")
    assert "CollectiveError" in check.stderr, check.stderr
    return env


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["hidden", "configured"])
def test_ranks_start_without_nccl_and_only_those_that_need_it_fail(tmp_path, how):
    env = _without_nccl(tmp_path, how)
    run = launch_cmd("--nproc", "2", LAUNCH_PROBE, "no-nccl", env=env, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "NCCL did not load here" in run.stderr
    assert {r: lines for r, lines in rank_lines(run.stdout).items()} == {
        0: ["RAN 0 no-id error"], 1: ["RAN 1 no-id error"]}, run.stdout

    run = launch_cmd("--nproc", "2", LAUNCH_PROBE, "rendezvous", env=env, timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "could not make the shared unique id" in run.stdout and "pip install 'shimrt[nccl]'" in run.stdout
    assert "SHIMRT_NCCL_LIBRARY" in run.stdout
    assert "exited with code 1" in run.stderr and "Traceback" not in run.stderr

    # init() opens the device first: without a GPU that is what it reports; with one, the NCCL error.
    run = launch_cmd("--nproc", "2", LAUNCH_PROBE, "init", env=env, timeout=60)
    ends = [line for lines in rank_lines(run.stdout).values() for line in lines]
    assert ends and all(e.startswith("NO-DEVICE") or "could not make the shared unique id" in e for e in ends), \
        run.stdout + run.stderr


def test_the_mps_check_run_alone_ends_in_one_line_or_passes_as_one_rank():
    """python -m shimrt.launch.mpscheck is a launch's rank side; alone it is one rank of one. On a
    machine without a GPU (or NCCL) it says why in one line, exit 2; with one, its sum is numpy's."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SHIMRT_RANK", "SHIMRT_WORLD", "RANK"))}
    env["PYTHONPATH"] = str(root)
    out = subprocess.run([sys.executable, "-m", "shimrt.launch.mpscheck"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    if out.returncode == 0:
        assert out.stdout.strip() == "MPSCHECK 0 1 OK", out.stdout
    else:
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("shimrt.launch.mpscheck: "), lines
    helped = subprocess.run([sys.executable, "-m", "shimrt.launch.mpscheck", "--help"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m shimrt.launch.mpscheck")
