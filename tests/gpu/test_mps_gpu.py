"""NVIDIA's real MPS: the launcher's own daemon starts, two rank processes share GPU 0 as its
clients and get every collective right, and nothing of it is left once the launcher exits.
Skipped, saying why, where MPS is not installed, a daemon already runs, or the NCCL in use cannot
put two ranks on one GPU (2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shimrt import CollectiveError
from shimrt.launch import mps
from shimrt.nccl import library
from shimrt.nccl.config import check_shared_gpu

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "data" / "mps_probe.py"
LAUNCH_VARIABLES = ("SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE",
                    "SHIMRT_NCCL_UNIQUE_ID", "SHIMRT_DEVICES", "SHIMRT_MPS", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                    "LOCAL_WORLD_SIZE", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@pytest.fixture(scope="module")
def control(device):
    """NVIDIA's control program, where MPS can be started here."""
    if device.backend != "cuda":
        pytest.skip(f"MPS is NVIDIA's, and this GPU is run by {device.backend}")
    try:
        program = mps.find_control()
    except mps.MpsError as exc:
        pytest.skip(str(exc))
    daemons = mps.running(program)
    if daemons:
        pytest.skip(f"an MPS daemon already runs ({'; '.join(map(str, daemons))}): --mps refuses beside it")
    return program


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while mps.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not mps.alive(pid)


@pytest.mark.timeout(120)
def test_the_real_daemon_starts_answers_and_leaves_nothing_behind(control):
    with mps.Mps() as daemon:
        pid, pipe, root = daemon.pid, daemon.pipe_directory, os.path.dirname(daemon.pipe_directory)
        assert pid is not None and mps.alive(pid)
        assert [d.pid for d in mps.running(control)] == [pid]
        servers = daemon.ask("get_server_list")
        assert re.fullmatch(r"[0-9 ]*", servers), servers  # pids of servers, none before a client came
    assert _gone(pid), f"the MPS control daemon {pid} still runs"
    assert not os.path.exists(root)
    assert mps.running(control) == []
    asked = subprocess.run([control], input="get_server_list\n", capture_output=True, text=True, timeout=20,
                           env=dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe))
    assert "Cannot find MPS control daemon" in asked.stdout + asked.stderr, asked


@pytest.mark.timeout(300)
def test_two_processes_on_one_gpu_under_mps_get_every_collective_right(device, control):
    try:
        check_shared_gpu(library.load(device.backend), device.backend, "two rank processes on GPU 0")
    except CollectiveError as exc:
        pytest.skip(str(exc))
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-m", "shimrt.launch", "--nproc", "2", "--devices", "0,0", "--mps",
                          "--timeout", "200", str(PROBE), "collectives"], capture_output=True, text=True,
                         timeout=260, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    started = re.search(r"MPS control daemon started \(pid (\d+); pipes in (\S+), logs in (\S+)\)", run.stderr)
    assert started, run.stderr
    assert "no NVIDIA GPU can be used" not in run.stderr
    for rank in (0, 1):
        ok = re.findall(rf"^\[rank {rank}\] OK {rank} (.+)$", run.stdout, re.M)
        assert len(ok) == 13, run.stdout[-3000:]  # all_to_all and barrier too
        # While its clients ran, the daemon had an MPS server for them: the ranks really were its clients.
        servers = re.search(rf"^\[rank {rank}\] SERVERS {rank} (.*)$", run.stdout, re.M)
        assert servers and re.fullmatch(r"\d+( \d+)*", servers.group(1)), run.stdout[-3000:]
    pid, pipe = int(started.group(1)), started.group(2)
    assert _gone(pid), f"the MPS control daemon {pid} still runs after the launcher"
    assert not os.path.exists(os.path.dirname(pipe))
    assert mps.running(control) == []
    server = int(servers.group(1).split()[0])
    assert _gone(server), f"the MPS server {server} still runs after the launcher"
