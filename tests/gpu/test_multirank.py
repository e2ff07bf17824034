"""Several real NCCL ranks: in one process (Communicator.local) and one per process (python -m
shimrt.launch), on as many GPUs as there are, or two ranks sharing one GPU where the NCCL in use
can (2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1; skipped, saying so, otherwise). Every output
element is compared with numpy."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shimrt import CollectiveError, Device, UsageError
from shimrt.nccl import CommOptions, Communicator, group, library, prepare_group
from shimrt.nccl.config import check_shared_gpu

PROBE = Path(__file__).resolve().parents[1] / "data" / "multirank_probe.py"
_spec = importlib.util.spec_from_file_location("multirank_probe", PROBE)
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def _indices(device) -> list[int]:
    """Two ranks: on two GPUs where there are two, else both on this one (skipped, with NCCL's
    reason, where the NCCL in use cannot do that)."""
    try:
        lib = library.load(device.backend)
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    if device.device_count() >= 2:
        return [0, 1]
    try:
        check_shared_gpu(lib, device.backend, "two ranks on this machine's one GPU")
    except CollectiveError as exc:
        pytest.skip(str(exc))
    return [device.index, device.index]


def _local(device, **options):
    indices = _indices(device)
    devices = [device if i == device.index else Device(i, backend=device.backend) for i in indices]
    return Communicator.local(devices, options=CommOptions(**options))


@pytest.fixture(scope="module", params=[True, False], ids=["blocking", "nonblocking"])
def ranks(device, request):
    comms = _local(device, timeout=60, blocking=request.param)
    yield comms
    for c in comms:
        c.close()


# What probe.every_collective runs, all_to_all and torch's ReduceOp.MAX among them.
EVERY = 13


def test_every_collective_of_two_ranks_in_one_process_equals_numpy(ranks):
    done = probe.every_collective(ranks)
    assert len(done) == EVERY, done


def test_a_grouped_call_is_settled_and_right(ranks):
    """ncclGroupEnd answers ncclInProgress for non-blocking communicators: shimrt polls every
    member instead of failing; blocking ones return once enqueued. Either way the data is right
    (a large buffer keeps it in flight)."""
    n = 1 << 26
    xs = [probe.inputs(c.rank, n) for c in ranks]
    bufs = [c.device.to_device(x) for c, x in zip(ranks, xs, strict=True)]
    with group(*ranks):
        for c, b in zip(ranks, bufs, strict=True):
            c.all_reduce(b)
    for c in ranks:
        c.wait()
    want = xs[0] + xs[1]
    for b in bufs:
        np.testing.assert_array_equal(b.numpy(), want)


def test_two_ranks_on_one_stream_are_refused_before_nccl_sees_them(ranks):
    a, b = ranks
    shared = a.device.stream("high")
    bufs = [c.device.to_device(probe.inputs(c.rank)) for c in ranks]
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="two ranks of one communicator need a stream each"):
        with group(a, b):
            a.all_reduce(bufs[0], stream=shared)
            b.all_reduce(bufs[1], stream=shared)
    assert time.monotonic() - t0 < 5  # refused, not hung
    assert shared.query()  # nothing was enqueued
    shared.close()
    # Nothing reached NCCL: the communicators still work.
    assert len(probe.every_collective(ranks, count=1 << 10)) == EVERY


def test_prepared_calls_of_two_ranks_go_into_one_group(ranks):
    xs = [probe.inputs(c.rank) for c in ranks]
    bufs = [c.device.to_device(x) for c, x in zip(ranks, xs, strict=True)]
    calls = [c.prepare("all_reduce", b, stream=c.stream) for c, b in zip(ranks, bufs, strict=True)]
    with group(*ranks):
        for call in calls:
            call()
    for c in ranks:
        c.wait()
    for b in bufs:
        np.testing.assert_array_equal(b.numpy(), xs[0] + xs[1])
    # prepare_group: the same calls made a group once; twice in a row sums twice.
    both = prepare_group(*calls)
    both()
    for c in ranks:
        c.wait()
    for b in bufs:
        np.testing.assert_array_equal(b.numpy(), 2 * (xs[0] + xs[1]))
    with group(*ranks):  # inside an open group its calls join that group
        both()
    for c in ranks:
        c.wait()
    for b in bufs:
        np.testing.assert_array_equal(b.numpy(), 4 * (xs[0] + xs[1]))
    with pytest.raises(UsageError, match="of one communicator on one stream"):
        prepare_group(*(c.prepare("all_reduce", b, stream=ranks[0].stream) for c, b in zip(ranks, bufs, strict=True)))
    bufs[1].free()
    with pytest.raises(UsageError, match="freed"):
        both()  # refused before NCCL sees any of it


def _launch(*args, timeout=240, extra=None):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), **(extra or {}))
    for name in ("SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE",
                 "SHIMRT_NCCL_UNIQUE_ID", "SHIMRT_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "shimrt.launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _devices_flag(device) -> list[str]:
    return ["--devices", ",".join(map(str, _indices(device)))]


@pytest.mark.timeout(300)
def test_every_collective_of_two_processes_equals_numpy(device):
    run = _launch("--nproc", "2", *_devices_flag(device), "--timeout", "200", str(PROBE), "collectives")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in (0, 1):
        ok = re.findall(rf"^\[rank {rank}\] OK {rank} (.+)$", run.stdout, re.M)
        assert len(ok) == 18, run.stdout[-3000:]  # every collective, the async handles, a future and barrier


@pytest.mark.timeout(300)
def test_every_collective_over_the_socket_link_equals_numpy(device):
    """python -m shimrt.launch --link socket: each rank names a host of its own, so NCCL carries
    the collectives over its socket transport on the loopback (NCCL says so at INFO), two ranks on
    one GPU whatever NCCL's version; every output element against numpy, as over the native link."""
    try:
        library.load(device.backend)
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    if device.backend != "cuda":
        pytest.skip("the socket link's variables are NCCL's; RCCL's are not checked here")
    indices = ["0,1"] if device.device_count() >= 2 else [f"{device.index},{device.index}"]
    env_extra = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    run = _launch("--nproc", "2", "--devices", indices[0], "--link", "socket", "--timeout", "200", str(PROBE),
                  "collectives", extra=env_extra)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in (0, 1):
        ok = re.findall(rf"^\[rank {rank}\] OK {rank} (.+)$", run.stdout, re.M)
        assert len(ok) == 18, run.stdout[-3000:]
    assert "NET/Socket" in run.stdout, run.stdout[-3000:]  # NCCL's own word for the transport it took


@pytest.mark.timeout(120)
def test_ranks_of_one_process_are_refused_the_socket_link_with_the_reason(device, tmp_path):
    script = tmp_path / "local_on_socket.py"
    script.write_text("import sys\nfrom shimrt import Device, UsageError\nfrom shimrt.nccl import Communicator\n"
                      "d = Device()\ntry:\n    Communicator.local([d, d])\nexcept UsageError as e:\n"
                      "    print('REFUSED', e)\n    sys.exit(0)\nsys.exit('not refused')\n")
    run = _launch("--nproc", "1", "--link", "socket", str(script))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "REFUSED Communicator.local: this process's ranks would cross the socket link" in run.stdout, run.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "nonblocking"])
def test_a_rank_that_never_joins_the_collective_ends_it_within_the_timeout(device, blocking):
    """Two ranks in one process; after a collective of both, rank 0 enqueues one alone. Its
    kernel waits for rank 1 for good: the watchdog aborts the communicator within the timeout
    and a few seconds, and every later use raises why."""
    timeout = 4
    a, b = _local(device, timeout=timeout, blocking=blocking)
    try:
        xs = [probe.inputs(c.rank) for c in (a, b)]
        bufs = [c.device.to_device(x) for c, x in zip((a, b), xs, strict=True)]
        with group(a, b):  # both ranks: connections made, the data right
            for c, buf in zip((a, b), bufs, strict=True):
                c.all_reduce(buf)
        for c in (a, b):
            c.wait(timeout=60)
        np.testing.assert_array_equal(bufs[0].numpy(), xs[0] + xs[1])
        t0 = time.monotonic()
        a.all_reduce(bufs[0])  # rank 1 never comes
        while a.state.error is None and time.monotonic() - t0 < timeout + 30:
            time.sleep(0.05)
        took = time.monotonic() - t0
        assert a.state.error is not None, "the watchdog did not abort the communicator"
        assert timeout - 0.5 <= took <= timeout + 5, took
        assert "watchdog aborted" in str(a.state.error) and "all_reduce enqueued" in str(a.state.error)
        with pytest.raises(CollectiveError, match="watchdog aborted"):
            a.all_reduce(bufs[0])
        with pytest.raises(CollectiveError, match="watchdog aborted"):
            a.wait(timeout=30)
    finally:
        for c in (a, b):
            c.abort()
            c.stream.close()
        device.synchronize(timeout=60)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["blocking", "nonblocking"])
def test_a_peer_that_leaves_ends_the_others_collective_within_the_timeout(device, kind):
    timeout = 15
    run = _launch("--nproc", "2", *_devices_flag(device), "--timeout", "200", str(PROBE), "killed-peer",
                  str(timeout), kind)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "[rank 1] LEAVING 1" in out, out
    aborted = re.search(r"^\[rank 0\] ABORTED 0 ([0-9.]+) (.*)$", out, re.M)
    assert aborted, out
    assert float(aborted.group(1)) <= timeout + 5, aborted.group(0)  # a CollectiveError, in time
    assert "[rank 0] REUSED 0" in out, out


@pytest.mark.timeout(120)
def test_an_nccl_that_cannot_share_a_gpu_is_named(device, monkeypatch):
    """Without NCCL_MULTI_RANK_GPU_ENABLE, two ranks on one GPU are refused before NCCL is
    called, naming the variable (NCCL itself would answer "Duplicate GPU detected")."""
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    try:
        lib = library.load(device.backend)
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    if device.backend != "cuda":
        pytest.skip("RCCL answers for itself")
    with pytest.raises(CollectiveError, match="NCCL_MULTI_RANK_GPU_ENABLE=1" if lib.version >= 23000 else
                       "NCCL 2.30 or newer"):
        Communicator.local([device, device])
