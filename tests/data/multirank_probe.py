"""Several NCCL ranks checked against numpy: imported by tests/gpu/test_multirank.py for ranks in
one process, and run under python -m shimrt.launch for one rank per process.

Modes (argv[1]) under the launcher:
  collectives          every collective, each output element checked; prints "OK <rank> ..." lines
  killed-peer SECONDS [blocking|nonblocking]
                       the last rank exits at once; the others' all_reduce must end in
                       CollectiveError within SECONDS (the communicator's timeout) plus a margin,
                       after which each makes a new one-rank communicator that works; prints
                       "ABORTED <rank> <seconds>" and "REUSED <rank>" (communicators of the kind
                       named, blocking by default)
"""
from __future__ import annotations

import sys
import time

import numpy as np

from shimrt.nccl import group

COUNT = 1 << 16  # elements per rank's send buffer (a multiple of any rank count used here)


def inputs(rank: int, count: int = COUNT, dtype=np.float32) -> np.ndarray:
    """Rank ``rank``'s input: small integers, so every sum, product and mean is exact in float32
    whatever order NCCL reduces in, and every element can be compared exactly."""
    return np.random.default_rng(1000 + rank).integers(-8, 9, count).astype(dtype)


def every_collective(comms: list, count: int = COUNT) -> list[str]:
    """Every collective over ``comms`` (the ranks this process holds, each on its own
    comm.stream, grouped), each rank's output compared element by element with numpy.
    AssertionError naming the collective, rank and first wrong element otherwise."""
    n = comms[0].size
    xs = {r: inputs(r, count) for r in range(n)}
    done = []

    def run(name, make, call, want):
        """make(c) -> the rank's buffers; call(c, bufs) enqueues; want(rank) -> expected output
        (None: nothing to check on that rank); the output is bufs[-1]."""
        bufs = {c.rank: make(c) for c in comms}
        with group(*comms):
            for c in comms:
                call(c, bufs[c.rank])
        for c in comms:
            c.wait(timeout=60)
        for c in comms:
            expected = want(c.rank)
            if expected is None:
                continue
            got = bufs[c.rank][-1].numpy()
            bad = np.flatnonzero(got != expected)
            assert not bad.size, (f"{name} rank {c.rank}: {bad.size} of {got.size} elements wrong, first at "
                                  f"{bad[0]}: {got[bad[0]]} != {expected[bad[0]]}")
        done.append(name)

    def send_and_out(c, out_count=count, fill=-99.0):
        return c.device.to_device(xs[c.rank]), c.device.to_device(np.full(out_count, fill, np.float32))

    stacked = np.stack([xs[r] for r in range(n)])
    for op, reduce in (("sum", np.sum), ("prod", np.prod), ("max", np.max), ("min", np.min)):
        run(f"all_reduce {op}", send_and_out, lambda c, b, op=op: c.all_reduce(b[0], b[1], op=op, stream=c.stream),
            lambda r, reduce=reduce: reduce(stacked, axis=0).astype(np.float32))
    run("all_reduce avg", send_and_out, lambda c, b: c.all_reduce(b[0], b[1], op="avg", stream=c.stream),
        lambda r: (np.sum(stacked, axis=0) / n).astype(np.float32))
    # In place: the send buffer is the output.
    run("all_reduce sum in place", lambda c: (c.device.to_device(xs[c.rank]),),
        lambda c, b: c.all_reduce(b[0], stream=c.stream), lambda r: np.sum(stacked, axis=0).astype(np.float32))
    root = n - 1  # not rank 0, so the root really is honoured
    run(f"broadcast from {root}", send_and_out, lambda c, b: c.broadcast(b[0], b[1], root=root, stream=c.stream),
        lambda r: xs[root])
    run(f"reduce max to {root}", send_and_out, lambda c, b: c.reduce(b[0], b[1], op="max", root=root, stream=c.stream),
        lambda r: np.max(stacked, axis=0).astype(np.float32) if r == root else np.full(count, -99.0, np.float32))
    run("all_gather", lambda c: send_and_out(c, count * n), lambda c, b: c.all_gather(b[0], b[1], stream=c.stream),
        lambda r: np.concatenate([xs[q] for q in range(n)]))
    block = count // n
    run("reduce_scatter sum", lambda c: send_and_out(c, block),
        lambda c, b: c.reduce_scatter(b[0], b[1], stream=c.stream),
        lambda r: np.sum(stacked[:, r * block:(r + 1) * block], axis=0).astype(np.float32))

    def ring(c, b):  # each rank sends to the next and receives from the previous
        c.send(b[0], (c.rank + 1) % n, stream=c.stream)
        c.recv(b[1], (c.rank - 1) % n, stream=c.stream)
    run("send/recv ring", send_and_out, ring, lambda r: xs[(r - 1) % n])
    # all_to_all: block j of rank i's send lands in block i of rank j's receive.
    run("all_to_all", send_and_out, lambda c, b: c.all_to_all(b[0], b[1], stream=c.stream),
        lambda r: np.concatenate([xs[q][r * block:(r + 1) * block] for q in range(n)]))
    try:
        from torch.distributed import ReduceOp
    except ImportError:  # torch's ops are checked where torch is
        return done
    run("all_reduce ReduceOp.MAX", send_and_out,
        lambda c, b: c.all_reduce(b[0], b[1], op=ReduceOp.MAX, stream=c.stream),
        lambda r: np.max(stacked, axis=0).astype(np.float32))
    return done


def waited(comm) -> list[str]:
    """One rank per process: async_op handles (waited on the host with a timedelta, and on a
    stream), barrier(), each output checked against numpy."""
    import datetime
    n, count = comm.size, COUNT
    xs = {r: inputs(r, count) for r in range(n)}
    stacked = np.stack([xs[r] for r in range(n)])
    done = []
    send, out = comm.device.to_device(xs[comm.rank]), comm.device.to_device(np.full(count, -99.0, np.float32))
    work = comm.all_reduce(send, out, async_op=True)
    assert work.wait(timeout=datetime.timedelta(seconds=60)) and work.is_completed()
    assert np.array_equal(out.numpy(), np.sum(stacked, axis=0).astype(np.float32)), "async all_reduce"
    done.append("async all_reduce, host wait")
    gathered = comm.device.to_device(np.full(count * n, -99.0, np.float32))
    other = comm.device.stream("low")
    work = comm.all_gather(send, gathered, async_op=True)
    work.wait(stream=other)  # the other stream waits on the GPU; its own end is then the gather's
    other.synchronize(60)
    assert np.array_equal(gathered.numpy(), np.concatenate([xs[q] for q in range(n)])), "async all_gather"
    other.close()
    done.append("async all_gather, stream wait")
    block = count // n
    work = comm.all_to_all(send, out, async_op=True)
    work.wait(timeout=60)
    want = np.concatenate([xs[q][comm.rank * block:(comm.rank + 1) * block] for q in range(n)])
    assert np.array_equal(out.numpy(), want), "async all_to_all"
    done.append("async all_to_all")
    fresh = comm.device.to_device(np.full(count, -99.0, np.float32))
    work = comm.all_reduce(send, fresh, async_op=True)
    future = work.get_future()
    assert work.get_future() is future, "one future per Work"
    assert future.result(timeout=60) is fresh, "the future's value is the output"
    assert np.array_equal(fresh.numpy(), np.sum(stacked, axis=0).astype(np.float32)), "async all_reduce, future"
    done.append("async all_reduce, future")
    for _ in range(3):
        comm.barrier(timeout=datetime.timedelta(seconds=30))
    done.append("barrier")
    return done


def _killed_peer(timeout: float, blocking: bool) -> None:
    from shimrt import CollectiveError
    from shimrt.launch import init
    from shimrt.nccl import CommOptions, Communicator, unique_id
    comm = init(options=CommOptions(timeout=timeout, blocking=blocking))
    if comm.rank == comm.size - 1:
        print(f"LEAVING {comm.rank}", flush=True)
        sys.exit(0)  # gone without a word: its peers' collective can never finish
    buf = comm.device.to_device(inputs(comm.rank))
    t0 = time.monotonic()
    try:
        comm.all_reduce(buf)
        comm.wait()
    except CollectiveError as exc:
        print(f"ABORTED {comm.rank} {time.monotonic() - t0:.1f} {exc}", flush=True)
    else:
        print(f"FINISHED {comm.rank} (the all_reduce finished without its peer)", flush=True)
        sys.exit(1)
    # The aborted communicator is gone; a new one on the same GPU works.
    with Communicator(comm.device, unique_id(backend=comm.device.backend), 0, 1) as alone:
        x = inputs(comm.rank)
        b = alone.device.to_device(x)
        alone.all_reduce(b)
        alone.wait(timeout=60)
        assert np.array_equal(b.numpy(), x)
    print(f"REUSED {comm.rank}", flush=True)


def main() -> None:
    mode = sys.argv[1]
    if mode == "collectives":
        from shimrt.launch import init
        comm = init()
        try:
            for name in every_collective([comm]) + waited(comm):
                print(f"OK {comm.rank} {name}", flush=True)
        finally:
            comm.close()
    elif mode == "killed-peer":
        kind = sys.argv[3] if len(sys.argv) > 3 else "blocking"
        if kind not in ("blocking", "nonblocking"):
            sys.exit(f"killed-peer takes blocking or nonblocking, not {kind!r}")
        _killed_peer(float(sys.argv[2]), kind == "blocking")
    else:
        sys.exit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
