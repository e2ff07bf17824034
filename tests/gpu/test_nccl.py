"""NCCL through shimrt on one GPU: a single-rank communicator, every collective checked against
numpy, its stream's priority, validation, timeouts, and torchrun's rendezvous."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shimrt import CollectiveError, UsageError, kernels
from shimrt.nccl import CommOptions, Communicator, unique_id, watchdog


@pytest.fixture(scope="module")
def comm(device):
    try:
        c = Communicator(device, unique_id(), 0, 1)
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    yield c
    c.close()


def test_the_communicators_stream_has_the_greatest_priority(comm, device):
    assert comm.stream.priority == device.priority_range[1]
    assert (comm.rank, comm.size) == (0, 1)


def fresh(device, rng, n, dtype=np.float32):
    x = (rng.standard_normal(n) * 100).astype(dtype)
    return x, device.to_device(x)


def test_every_collective_equals_numpy(comm, device, rng):
    n = 1 << 20
    for op in ("sum", "prod", "max", "min", "avg"):
        for in_place in (False, True):
            x, dx = fresh(device, rng, n)
            out = dx if in_place else device.empty(n, np.float32).memset(0xFF)
            comm.all_reduce(dx, None if in_place else out, op=op)
            comm.wait()
            np.testing.assert_array_equal(out.numpy(), x)  # one rank: the reduction of x alone
    x, dx = fresh(device, rng, n, np.int64)
    out = device.empty(n, np.int64).memset(0)
    comm.broadcast(dx, out, root=0)
    comm.reduce(dx, dx, op="max", root=0)
    comm.wait()
    np.testing.assert_array_equal(out.numpy(), x)
    x, dx = fresh(device, rng, n, np.float16)
    gathered = device.empty(n, np.float16).memset(0)
    comm.all_gather(dx, gathered)
    scattered = device.empty(n, np.float16).memset(0)
    comm.reduce_scatter(dx, scattered, op="sum")
    comm.wait()
    np.testing.assert_array_equal(gathered.numpy(), x)
    np.testing.assert_array_equal(scattered.numpy(), x)
    x, dx = fresh(device, rng, n, np.int32)
    got = device.empty(n, np.int32).memset(0)
    with comm.group():
        comm.send(dx, 0)
        comm.recv(got, 0)
    comm.wait()
    np.testing.assert_array_equal(got.numpy(), x)


def test_torch_tensors_are_collective_buffers(comm, device, rng):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    x = rng.standard_normal(4096).astype(np.float32)
    t = torch.from_numpy(x).cuda(device.index)
    out = torch.zeros_like(t)
    torch.cuda.synchronize()
    comm.all_reduce(t, out)
    comm.wait()
    np.testing.assert_array_equal(out.cpu().numpy(), x)


def test_bad_calls_are_refused_before_nccl(comm, device):
    small = device.empty(10, np.float32).memset(0x7F)
    big = device.empty(100, np.float32)
    with pytest.raises(UsageError, match="needs 100 x 1 ranks"):
        comm.all_gather(big, small)
    with pytest.raises(UsageError, match="float32 but receive is int32"):
        comm.all_reduce(big, device.empty(100, np.int32))
    with pytest.raises(UsageError, match="op must be"):
        comm.all_reduce(big, op="mean")
    with pytest.raises(UsageError, match="root must be"):
        comm.broadcast(big, root=1)
    with pytest.raises(UsageError, match="host"):
        comm.all_reduce(np.zeros(4, np.float32))
    with pytest.raises(UsageError, match="NCCL cannot carry"):
        comm.all_reduce(device.empty(8, np.int16))
    comm.wait()
    assert (small.numpy().view(np.uint8) == 0x7F).all()


def test_local_communicators(device, rng):
    try:
        (c,) = Communicator.local([device], options=CommOptions(max_ctas=4))
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    with c:
        x, dx = fresh(device, rng, 1000)
        c.all_reduce(dx)
        c.wait()
        np.testing.assert_array_equal(dx.numpy(), x)


def test_wait_gives_up_and_aborts_instead_of_hanging(device):
    try:
        c = Communicator(device, unique_id(), 0, 1, options=CommOptions(timeout=30))
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    k = device.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    bufs = (device.empty(1, np.uint32), device.empty(1, np.uint64), device.empty(1, np.uint64))
    x = device.empty(16, np.float32)
    c.all_reduce(x)  # the first call of a blocking communicator sets it up and waits for the stream
    c.wait()
    k.launch(1, 32, *bufs, 2_000_000_000, stream=c.stream)  # 2 s of work the collective waits behind
    c.all_reduce(x)
    with pytest.raises(CollectiveError, match="did not finish within 0.2 s"):
        c.wait(timeout=0.2)
    with pytest.raises(CollectiveError, match="closed or was aborted"):
        c.all_reduce(x)
    device.synchronize()
    c.stream.close()


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "nonblocking"])
def test_the_watchdog_aborts_a_collective_that_outlives_the_timeout(device, blocking):
    """The all_reduce waits behind 3 s of work on its stream; with a timeout of 1 s the watchdog
    aborts the communicator after about 1 s, without anyone waiting on it, and its next use
    raises why."""
    import time
    try:
        c = Communicator(device, unique_id(), 0, 1, options=CommOptions(timeout=1, blocking=blocking))
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    k = device.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    bufs = (device.empty(1, np.uint32), device.empty(1, np.uint64), device.empty(1, np.uint64))
    x = device.empty(16, np.float32)
    try:
        c.all_reduce(x)  # set up first: the first call of a blocking communicator waits for the stream
        c.wait()
        k.launch(1, 32, *bufs, 3_000_000_000, stream=c.stream)
        t0 = time.monotonic()
        c.all_reduce(x)
        returned = time.monotonic() - t0
        while c.state.error is None and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        took = time.monotonic() - t0
        dog = watchdog.watchdog()
        # What the watchdog was doing, should it not have aborted in time.
        seen = (f"took {took:.2f} s, the call returned after {returned:.2f} s; watched: {c.state in dog.watched()}, "
                f"thread alive: {dog.alive}, failures: {dog.failures} "
                f"({dog.last_failure!r}), pending: {len(c.state.pending)}, tail: {c.state.tail is not None}")
        assert c.state.error is not None and 0.9 <= took <= 2.5, seen
        assert "all_reduce enqueued" in str(c.state.error)
        with pytest.raises(CollectiveError, match="watchdog aborted"):
            c.all_reduce(x)
        assert c.handle == 0
    finally:
        device.synchronize(timeout=60)
        c.close()


def test_a_blocking_communicator_follows_each_collective_and_closes_clean(device, rng):
    try:
        c = Communicator(device, unique_id(), 0, 1, options=CommOptions(timeout=30))
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    assert c.options.blocking  # the default
    x, dx = fresh(device, rng, 1 << 16)
    out = device.empty(1 << 16, np.float32)
    call = c.prepare("all_reduce", dx, out)
    for _ in range(500):
        call()
    c.all_reduce(dx, out)
    assert 0 < len(c.state.pending) <= 64  # followed, reaped as it goes
    c.wait()
    np.testing.assert_array_equal(out.numpy(), x)
    c.close()
    assert c.handle == 0 and c.stream.closed


def test_torchrun_rendezvous_shares_the_unique_id(device):
    pytest.importorskip("torch", reason="torch is not installed")
    probe = str(Path(__file__).parents[1] / "data" / "rendezvous_probe.py")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", "29611", probe, "rendezvous-only"], capture_output=True, text=True,
                         timeout=180)
    reports = [json.loads(line[line.index("{"):]) for line in run.stdout.splitlines() if '"unique_id"' in line]
    assert len(reports) == 2, run.stdout + run.stderr
    assert {r["source"] for r in reports} == {"torchrun"} and {r["rank"] for r in reports} == {0, 1}
    assert len({r["unique_id"] for r in reports}) == 1


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "nonblocking"])
def test_a_missing_peer_ends_init_within_the_timeout(device, blocking):
    import time
    t0 = time.monotonic()
    try:
        with pytest.raises(CollectiveError, match="did not complete within 5"):
            # rank 1 never comes
            Communicator(device, unique_id(), 0, 2, options=CommOptions(timeout=5, blocking=blocking))
    except CollectiveError as exc:  # NCCL missing altogether
        pytest.skip(str(exc))
    assert time.monotonic() - t0 < 30


def test_a_prepared_collective_repeats_the_checked_call(comm, device, rng):
    n = 1 << 16
    x, dx = fresh(device, rng, n)
    out = device.empty(n, np.float32).memset(0)
    call = comm.prepare("all_reduce", dx, out, op="max")
    for _ in range(3):
        call()
    comm.wait()
    np.testing.assert_array_equal(out.numpy(), x)
    with pytest.raises(UsageError, match="receive holds 8 elements, send 65536"):
        comm.prepare("all_reduce", dx, device.empty(8, np.float32))  # checked when prepared
    out.free()
    with pytest.raises(UsageError, match="freed"):
        call()  # each call refuses a freed buffer
    # A view of a buffer is refused once its base is freed; a closed stream, a closed communicator too.
    base = device.to_device(x)
    on_view = comm.prepare("all_reduce", base[: n // 2])
    on_view()
    comm.wait()
    base.free()
    with pytest.raises(UsageError, match="freed"):
        on_view()
    stream = device.stream(priority="high")
    on_stream = comm.prepare("all_reduce", dx, stream=stream)
    on_stream()
    stream.synchronize(30)
    stream.close()
    with pytest.raises(UsageError, match="stream .* is closed"):
        on_stream()
    own = Communicator(device, unique_id(), 0, 1)
    on_own = own.prepare("all_reduce", dx)
    on_own()
    own.close()
    with pytest.raises(CollectiveError, match="closed or was aborted"):
        on_own()
