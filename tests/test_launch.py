"""The launcher and its rendezvous with real processes (up to where NCCL needs a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import skip_or_fail

from shimrt import CollectiveError, ShimrtError
from shimrt.config import launch_env

PROBE = str(Path(__file__).parent / "data" / "rendezvous_probe.py")


@pytest.fixture(scope="module")
def nccl():
    from shimrt.nccl import library
    try:
        return library.load()
    except CollectiveError as exc:
        skip_or_fail("nccl", f"the launcher makes an ncclUniqueId, which needs NCCL: {exc}")


def launch(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "shimrt.launch", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_two_processes_share_one_unique_id(nccl):
    run = launch("--nproc", "2", PROBE)
    reports = {}
    for line in run.stdout.splitlines():
        prefix, _, rest = line.partition("] ")
        if rest.startswith("{"):
            reports[prefix] = json.loads(rest)
    assert set(reports) == {"[rank 0", "[rank 1"}, run.stdout + run.stderr
    assert [reports[f"[rank {i}"]["rank"] for i in range(2)] == [0, 1]
    assert {r["world_size"] for r in reports.values()} == {2}
    assert len({r["unique_id"] for r in reports.values()}) == 1
    assert len(bytes.fromhex(reports["[rank 0"]["unique_id"])) == 128
    # Each rank joined, said there is no GPU, or (a peer missing) gave up within the timeout.
    ends = [line for line in run.stdout.splitlines() if any(w in line for w in ("JOINED", "NO-DEVICE", "GAVE-UP"))]
    assert len(ends) == 2 and run.returncode == 0, run.stdout + run.stderr


def test_a_failing_rank_stops_the_others(nccl):
    t0 = time.monotonic()
    run = launch("--nproc", "2", PROBE, "fail-rank-1")
    assert run.returncode == 3
    assert time.monotonic() - t0 < 60  # rank 0 would sleep 120 s
    assert "stopping the others" in run.stderr


def test_launch_environments_are_read():
    env = launch_env({"SHIMRT_RANK": "1", "SHIMRT_WORLD_SIZE": "4", "SHIMRT_LOCAL_RANK": "1",
                      "SHIMRT_NCCL_UNIQUE_ID": "ab" * 128})
    assert (env.source, env.rank, env.world_size, env.local_rank, env.unique_id) == ("shimrt", 1, 4, 1, b"\xab" * 128)
    env = launch_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
    assert (env.source, env.rank, env.world_size, env.master_port) == ("torchrun", 3, 8, 29500)
    env = launch_env({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert (env.source, env.rank, env.world_size) == ("mpi", 2, 4)
    assert launch_env({}).source is None
    with pytest.raises(ShimrtError, match="SHIMRT_RANK must be an integer"):
        launch_env({"SHIMRT_RANK": "x", "SHIMRT_WORLD_SIZE": "2", "SHIMRT_LOCAL_RANK": "0"})


def test_a_module_runs_in_every_rank(nccl, tmp_path):
    # -m module, as python takes it: here a module that prints its rank and its arguments.
    (tmp_path / "rank_echo.py").write_text("import os, sys\nprint('RANK', os.environ['SHIMRT_RANK'], sys.argv[1:])\n")
    run = subprocess.run([sys.executable, "-m", "shimrt.launch", "--nproc", "2", "-m", "rank_echo", "x", "--y", "1"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        assert f"RANK {rank} ['x', '--y', '1']" in run.stdout, run.stdout
    nothing = subprocess.run([sys.executable, "-m", "shimrt.launch", "--nproc", "2"], capture_output=True, text=True)
    assert nothing.returncode == 2 and "give a script or -m module" in nothing.stderr
