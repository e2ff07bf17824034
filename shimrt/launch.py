"""python -m shimrt.launch --nproc N script.py [args] (or -m module [args]): one process per local GPU, and the
rendezvous each process uses to join one communicator.

The launcher makes the ncclUniqueId itself (no GPU needed for that) and hands every process
its rank, the world size, its local rank and the id through the environment. Across machines,
use an existing launcher: torchrun (rank 0 shares the id through torch.distributed's TCPStore
at MASTER_ADDR:MASTER_PORT) or MPI (mpi4py broadcasts it). In the script::

    comm = shimrt.launch.init()          # Device(local_rank) and its Communicator
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .config import LaunchEnv, launch_env
from .errors import ShimrtError


@dataclass(frozen=True)
class Rendezvous:
    """This process's rank, the world size, its local rank, and the shared unique id."""

    rank: int
    world_size: int
    local_rank: int
    unique_id: bytes
    source: str


def _torch_store_share(env: LaunchEnv, uid_maker) -> bytes:
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise ShimrtError("torchrun's environment found but torch is not installed") from None
    if not env.master_addr or not env.master_port:
        raise ShimrtError("torchrun's environment lacks MASTER_ADDR/MASTER_PORT")
    # torchrun's own store listens on MASTER_PORT; shimrt's sits on the next port.
    store = TCPStore(env.master_addr, env.master_port + 1, env.world_size, env.rank == 0,
                     timeout=__import__("datetime").timedelta(seconds=300))
    if env.rank == 0:
        store.set("shimrt_nccl_unique_id", uid_maker().hex())
    uid = bytes.fromhex(store.get("shimrt_nccl_unique_id").decode())
    # Rank 0 serves the store: it must not leave before every rank has read the id.
    store.add("shimrt_nccl_unique_id_read", 1)
    if env.rank == 0:
        deadline = time.monotonic() + 300
        while store.add("shimrt_nccl_unique_id_read", 0) < env.world_size:
            if time.monotonic() > deadline:
                raise ShimrtError("not every rank read the unique id from the store within 300 s")
            time.sleep(0.01)
    return uid


def _mpi_share(env: LaunchEnv, uid_maker) -> bytes:
    try:
        from mpi4py import MPI
    except ImportError:
        raise ShimrtError("an MPI launch found but mpi4py is not installed (pip install mpi4py)") from None
    return MPI.COMM_WORLD.bcast(uid_maker() if env.rank == 0 else None, root=0)


def rendezvous(env: LaunchEnv | None = None, *, backend: str | None = None) -> Rendezvous:
    """Rank, world size, local rank and the shared ncclUniqueId of this process. The id is made
    (by rank 0 where ranks share it) with the collective library of ``backend`` (NCCL for
    "cuda", RCCL for "hip"; default: see :func:`shimrt.nccl.unique_id`)."""
    from .nccl import unique_id
    env = env or launch_env()

    def make() -> bytes:
        return unique_id(backend=backend)

    if env.source is None:
        return Rendezvous(0, 1, 0, make(), "single process")
    if env.source == "shimrt":
        if env.unique_id is None:
            raise ShimrtError("SHIMRT_RANK is set but SHIMRT_NCCL_UNIQUE_ID is not "
                              "(start with python -m shimrt.launch)")
        uid = env.unique_id
    elif env.source == "torchrun":
        uid = _torch_store_share(env, make)
    else:
        uid = _mpi_share(env, make)
    return Rendezvous(env.rank, env.world_size, env.local_rank, uid, env.source)


def init(device=None, *, options=None):
    """The Communicator of this process: on ``device`` (default Device(local_rank)), with the
    collective library of the device's backend."""
    from .device import Device
    from .nccl import Communicator
    device = device or Device(launch_env().local_rank)
    r = rendezvous(backend=device.backend)
    return Communicator(device, r.unique_id, r.rank, r.world_size, options=options)


# --- the launcher ----------------------------------------------------------------------------

def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line.decode(errors="replace"))
        out.flush()


def run(nproc: int, argv: list[str], timeout: float | None = None) -> int:
    """Start ``nproc`` copies of ``python argv...``; stop them all when one fails; return the
    first non-zero exit code (or 0)."""
    from .nccl import unique_id
    if nproc < 1:
        raise ShimrtError("--nproc must be at least 1")
    uid = unique_id().hex()
    procs, pumps = [], []
    for rank in range(nproc):
        env = dict(os.environ, SHIMRT_RANK=str(rank), SHIMRT_WORLD_SIZE=str(nproc), SHIMRT_LOCAL_RANK=str(rank),
                   SHIMRT_NCCL_UNIQUE_ID=uid, PYTHONUNBUFFERED="1")
        p = subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        procs.append(p)
        t = threading.Thread(target=_pump, args=(p.stdout, f"[rank {rank}] ", sys.stdout), daemon=True)
        t.start()
        pumps.append(t)
    deadline = None if timeout is None else time.monotonic() + timeout
    code = 0
    try:
        while True:
            states = [p.poll() for p in procs]  # every one, so each exit is seen
            if all(s is not None for s in states):
                break
            failed = [s for s in states if s not in (None, 0)]
            if failed:
                code = failed[0]
                print(f"shimrt.launch: a rank exited with {code}; stopping the others", file=sys.stderr)
                break
            if deadline is not None and time.monotonic() > deadline:
                code = 124
                print(f"shimrt.launch: ranks still running after {timeout} s; stopping them", file=sys.stderr)
                break
            time.sleep(0.05)
    finally:
        _stop([p for p in procs if p.poll() is None])
        for t in pumps:
            t.join(5)
    return code or next((p.returncode for p in procs if p.returncode), 0)


def _stop(procs, grace: float = 5.0) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(end - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shimrt.launch", description=__doc__.splitlines()[0],
                                     usage="python -m shimrt.launch --nproc N [--timeout S] (script | -m module) ...")
    parser.add_argument("--nproc", type=int, required=True, help="processes to start (one per local GPU)")
    parser.add_argument("--timeout", type=float, default=None, help="stop every rank after this many seconds")
    parser.add_argument("-m", dest="module", help="run a module as a script (python -m module), e.g. shimrt.bench")
    parser.add_argument("script", nargs="?", help="the Python script to run in every process")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.module is None and args.script is None:
        parser.error("give a script or -m module")
    # With -m, what argparse took for the script is the module's first argument.
    target = ["-m", args.module, *([args.script] if args.script else []), *args.args] if args.module else \
        [args.script, *args.args]
    try:
        return run(args.nproc, target, args.timeout)
    except ShimrtError as exc:
        print(f"shimrt.launch: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
