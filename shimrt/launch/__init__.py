"""Start one process per local GPU, all running one Python script or module, and give each what it
needs to join one communicator: its rank and NCCL's unique id.

Usage: ``python -m shimrt.launch --nproc N script.py [args]`` (or ``-m module [args]``); in the
script, :func:`init` (or :func:`rendezvous` for the rank and id alone).

The launcher makes the ncclUniqueId itself (no GPU needed for that) and hands every process its
rank, the world size, its local rank and the id through the environment: ``SHIMRT_RANK``,
``SHIMRT_WORLD_SIZE``, ``SHIMRT_LOCAL_RANK``, ``SHIMRT_LOCAL_WORLD_SIZE`` and
``SHIMRT_NCCL_UNIQUE_ID``, and torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` too, for code written against torch.distributed, and, where the
environment does not set them, ``MASTER_ADDR`` (127.0.0.1) and ``MASTER_PORT`` (a port free on
this machine), as torchrun ``--standalone`` does, so that ``torch.distributed.init_process_group()``
(``env://``) finds its rendezvous; shimrt's own id needs no store. Set either around the launcher
to choose it.

When NCCL does not load in the launcher, the ranks still start, without an id but with the
reason in ``SHIMRT_NCCL_UNIQUE_ID_ERROR``: a script that never calls :func:`init` runs as usual,
and one that does gets a CollectiveError saying what to install.

The launcher passes SIGTERM, SIGINT and SIGHUP on to every rank (each rank runs in its own
process group, as under torchrun, so what the rank started gets the signal too), gives them
5 s to exit, kills what is left, and exits with 128 + the signal number. When a rank fails it
stops the others the same way and exits with that rank's code; after ``--timeout`` it exits
with 124.

Across machines, use an existing launcher: torchrun (rank 0 shares the id through
torch.distributed's TCPStore at MASTER_ADDR:MASTER_PORT) or MPI (mpi4py broadcasts it). In the
script::

    comm = shimrt.launch.init()          # Device(local_rank) and its Communicator

Ranks may share a GPU: ``--devices 0,0`` (or ``SHIMRT_DEVICES=0,0``) maps local rank i to the
i-th index listed. NCCL allows it from 2.30 with ``NCCL_MULTI_RANK_GPU_ENABLE=1``; two processes
on one GPU time-slice it (right for correctness runs, not for speed), while two ranks in one
process (``Communicator.local([dev, dev])``) run their kernels side by side. ``--mps`` runs the
ranks as clients of an MPS daemon of the launcher's own (:mod:`shimrt.launch.mps`), so that processes
sharing a GPU run side by side too; it is stopped after the ranks, whatever ends them.
"""

from __future__ import annotations

import argparse
import datetime
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .. import config, validate
from ..config import BACKENDS, LaunchEnv, device_map, devices_of, launch_env
from ..errors import CollectiveError, ShimrtError, UsageError
from ..nccl.link import LINKS
from ..stream import MAX_TIMEOUT
from . import mps
from .ranks import FORWARDED_SIGNALS, GRACE_S, TIMEOUT_EXIT, run, say

__all__ = ["environment", "init", "local_devices", "main", "FORWARDED_SIGNALS", "GRACE_S", "TIMEOUT_EXIT", "run", "say"]

if TYPE_CHECKING:
    from ..device import Device
    from ..nccl import CommOptions, Communicator

_INSTALL_HINT = ("install NCCL (pip install 'shimrt[nccl]') or set SHIMRT_NCCL_LIBRARY to the path of "
                 "libnccl.so.2 (librccl.so under ROCm), then launch again")


@dataclass(frozen=True)
class Rendezvous:
    """This process's rank, the world size, its local rank, and the shared unique id."""

    rank: int
    world_size: int
    local_rank: int
    unique_id: bytes
    source: str


def store_port(master_port: int) -> int:
    """The port of shimrt's store under torchrun: beside torchrun's own (MASTER_PORT), on the
    next port, or the one before when MASTER_PORT is the last (65535); every rank computes the
    same one."""
    master_port = validate.integer(master_port, "MASTER_PORT", least=1, most=65535)
    return master_port + 1 if master_port < 65535 else master_port - 1


def _torch_store_share(env: LaunchEnv, uid_maker) -> bytes:
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise ShimrtError("torchrun's environment found but torch is not installed") from None
    if not env.master_addr or not env.master_port:
        raise ShimrtError("torchrun's environment lacks MASTER_ADDR/MASTER_PORT")
    store = TCPStore(env.master_addr, store_port(env.master_port), env.world_size, env.rank == 0,
                     timeout=datetime.timedelta(seconds=300))
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
        from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]  # optional: MPI launches only
    except ImportError:
        raise ShimrtError("an MPI launch found but mpi4py is not installed (pip install mpi4py)") from None
    return MPI.COMM_WORLD.bcast(uid_maker() if env.rank == 0 else None, root=0)


def rendezvous(env: LaunchEnv | None = None, *, backend: str | None = None) -> Rendezvous:
    """Rank, world size, local rank and the shared ncclUniqueId of this process. The id is made
    (by rank 0 where ranks share it) with the collective library of ``backend`` (NCCL for
    "cuda", RCCL for "hip"; default: see :func:`shimrt.nccl.unique_id`).

    ``env`` defaults to :func:`shimrt.config.launch_env`. Under python -m shimrt.launch the id
    comes from the launcher; CollectiveError, with the reason and what to install, when the
    launcher could not load NCCL to make it."""
    if env is not None and not isinstance(env, LaunchEnv):
        raise UsageError(f"env must be a shimrt.config.LaunchEnv or None, not {type(env).__name__}")
    if backend is not None:
        validate.one_of(backend, "backend", BACKENDS)
    from ..nccl import unique_id
    env = launch_env() if env is None else env

    def make() -> bytes:
        return unique_id(backend=backend)

    if env.source is None:
        return Rendezvous(0, 1, 0, make(), "single process")
    if env.source == "shimrt":
        if env.unique_id is None:
            if env.unique_id_error:
                raise CollectiveError("this rank needs a communicator, but python -m shimrt.launch could not "
                                      f"make the shared unique id: {env.unique_id_error}; {_INSTALL_HINT}")
            raise ShimrtError("SHIMRT_RANK is set but SHIMRT_NCCL_UNIQUE_ID is not "
                              "(start with python -m shimrt.launch)")
        uid = env.unique_id
    elif env.source == "torchrun":
        uid = _torch_store_share(env, make)
    else:
        uid = _mpi_share(env, make)
    return Rendezvous(env.rank, env.world_size, env.local_rank, uid, env.source)


def environment() -> LaunchEnv:
    """Where this process stands, as python -m shimrt.launch, torchrun or MPI left it in the
    environment: ``source`` ("shimrt", "torchrun", "mpi" or None: not launched), ``rank``,
    ``world_size``, ``local_rank`` and ``device`` (its GPU: its entry of ``--devices``, or its
    local rank). UsageError for a value the launcher would not have set."""
    return launch_env()


def init(device: Device | None = None, *, options: CommOptions | None = None) -> Communicator:
    """The Communicator of this process: on ``device`` (a :class:`shimrt.Device`; default
    Device(local_rank), or the local rank's GPU in SHIMRT_DEVICES), with the collective library
    of the device's backend and ``options`` (a :class:`shimrt.nccl.CommOptions`). The device is
    opened before the rendezvous, since its backend says which library makes the id. Ranks that
    share a GPU are refused here, naming what is missing, when the NCCL loaded cannot do it.
    Under python -m shimrt.launch --mps, a GPU that does not open names MPS as the likely cause."""
    from ..device import Device
    from ..nccl import CommOptions, Communicator
    if device is not None and not isinstance(device, Device):
        raise UsageError(f"device must be a shimrt.Device or None, not {type(device).__name__}")
    if options is not None and not isinstance(options, CommOptions):
        raise UsageError(f"options must be a shimrt.nccl.CommOptions or None, not {type(options).__name__}")
    env = launch_env()
    if device is None:
        try:
            device = Device(env.device)
        except ShimrtError as exc:
            if not env.mps:
                raise
            raise mps.client_error(exc) from None
    if env.devices is not None and env.devices.count(device.index) > 1:
        from ..nccl.config import check_shared_gpu
        from ..nccl.library import load
        check_shared_gpu(load(device.backend), device.backend, f"SHIMRT_DEVICES={','.join(map(str, env.devices))}",
                         process_per_rank=True)
    r = rendezvous(backend=device.backend)
    return Communicator(device, r.unique_id, r.rank, r.world_size, options=options)


def local_devices(dev: Device, wanted: int | None = None) -> list[Device]:
    """The devices of the ranks one process holds (``Communicator.local``), ``dev`` (a shimrt
    Device) first: the GPUs SHIMRT_DEVICES lists; else ``wanted`` ranks (default: one per GPU)
    on the first GPUs, or all on ``dev`` when it is the only one, where ``wanted`` defaults to 2
    if the NCCL loaded can put two ranks on one GPU and 1 otherwise. CollectiveError, naming
    what is missing, when ranks would share a GPU that NCCL cannot share."""
    from ..device import Device
    from ..nccl import library
    from ..nccl.config import check_shared_gpu
    if not isinstance(dev, Device):
        raise UsageError(f"dev must be a shimrt Device, not {dev!r:.100}")
    if wanted is not None:
        wanted = validate.integer(wanted, "wanted (local ranks)", least=1)
    lib = library.load(dev.backend)
    count, mapped = dev.device_count(), device_map()
    if mapped is not None:
        indices = list(mapped)
        if wanted is not None and len(indices) != wanted:
            raise UsageError(f"{wanted} local ranks need as many GPUs in SHIMRT_DEVICES, not {mapped}")
    elif count >= 2:
        indices = [(dev.index + i) % count for i in range(wanted or count)]
    else:
        if wanted is None:
            try:
                check_shared_gpu(lib, dev.backend, "")
                wanted = 2
            except ShimrtError:
                wanted = 1
        indices = [dev.index] * wanted
    if indices[0] != dev.index:
        raise UsageError(f"the first GPU of SHIMRT_DEVICES ({indices[0]}) must be the one measured ({dev.index})")
    if len(set(indices)) < len(indices):
        check_shared_gpu(lib, dev.backend, f"{len(indices)} ranks on GPUs {indices}")
    opened = {dev.index: dev}
    return [opened[i] if i in opened else opened.setdefault(i, Device(i, backend=dev.backend)) for i in indices]


def _one_node(value: Any, what: str) -> int:
    """torchrun's --nnodes, which can only be 1 here."""
    try:
        nodes = int(value)
    except ValueError:
        raise UsageError(f"{what} must be 1, not {value!r}") from None
    if nodes != 1:
        raise UsageError(f"{what} must be 1: python -m shimrt.launch starts ranks on this machine only; across "
                         f"machines use torchrun or MPI (shimrt.launch.init() follows them), not {value!r}")
    return nodes


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=36)


_DESCRIPTION = """\
Start one process per local GPU, each running the same Python script (or module, with -m), and
let them join one NCCL communicator with shimrt.launch.init().

The launcher makes NCCL's unique id and gives every process its rank through the environment:
SHIMRT_RANK, SHIMRT_WORLD_SIZE, SHIMRT_LOCAL_RANK, SHIMRT_LOCAL_WORLD_SIZE and
SHIMRT_NCCL_UNIQUE_ID, plus torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, and
MASTER_ADDR (127.0.0.1) and MASTER_PORT (a free port) where unset, as torchrun --standalone does,
for torch.distributed's env:// rendezvous (shimrt itself needs none). If NCCL does not load here, the
processes still start, and only those that call shimrt.launch.init() fail, saying why.

--devices 0,0 puts both ranks on GPU 0 (SHIMRT_DEVICES); NCCL 2.30+ allows it with
NCCL_MULTI_RANK_GPU_ENABLE=1, and the processes then time-slice the GPU, unless --mps makes them
clients of one MPS daemon: the launcher starts its own (nvidia-cuda-mps-control -d, private pipe
and log folders in CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY), and stops it after the
ranks, signals and --timeout included. --mps refuses, before any rank starts, where MPS is not
installed (SHIMRT_MPS_CONTROL names the control program) or a daemon already runs.

Every line a process prints is prefixed with its rank. When one process fails, the others are
stopped and the launcher exits with the failed process's code. SIGTERM, SIGINT and SIGHUP are
passed on to every process; those still running after 5 s are killed, and the launcher exits
with 128 + the signal's number (143 for SIGTERM)."""

_EPILOG = """\
examples:
  python -m shimrt.launch --nproc 8 train.py --epochs 3
  python -m shimrt.launch --nproc-per-node 2 --timeout 600 -m shimrt.bench collectives
  NCCL_MULTI_RANK_GPU_ENABLE=1 python -m shimrt.launch --nproc 2 --devices 0,0 -m shimrt.selftest
  NCCL_MULTI_RANK_GPU_ENABLE=1 python -m shimrt.launch --nproc 2 --devices 0,0 --mps train.py"""


def _parser() -> argparse.ArgumentParser:
    from .. import __version__
    parser = argparse.ArgumentParser(
        prog="python -m shimrt.launch", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_HelpFormatter,
        usage="python -m shimrt.launch --nproc N [--devices I,J,...] [--mps] [--timeout SECONDS] "
              "(script | -m module) [args ...]")
    parser.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", dest="nproc", metavar="N", required=True,
                        type=validate.argument(validate.integer, "--nproc", least=1, most=config.MAX_RANKS),
                        help="how many processes to start (one per local GPU); the names are torchrun's too")
    parser.add_argument("--nnodes", metavar="1", default=1, type=validate.argument(_one_node, "--nnodes"),
                        help="torchrun's flag: this launcher starts ranks on this machine only, so 1 (across "
                             "machines, use torchrun or MPI; shimrt.launch.init() follows them)")
    parser.add_argument("--standalone", action="store_true",
                        help="torchrun's flag, accepted for its command lines: this launcher is always standalone")
    parser.add_argument("--devices", metavar="I,J,...", default=None,
                        type=validate.argument(devices_of, "--devices"),
                        help="the GPU of each rank, one index per rank (0,0: two ranks on GPU 0; default: rank i on "
                             "GPU i, or SHIMRT_DEVICES)")
    parser.add_argument("--mps", action="store_true",
                        help="run the ranks as clients of an MPS daemon started for them and stopped after them, so "
                             "that ranks sharing a GPU (--devices 0,0) run side by side instead of taking turns; it "
                             "works with one rank per GPU too")
    parser.add_argument("--link", choices=LINKS, default="native",
                        help="what the ranks' collectives cross: native (what NCCL finds between them) or socket "
                             "(each rank a host of its own, NCCL's sockets over the loopback: a network between "
                             "machines, on this one; shimrt.nccl.link)")
    parser.add_argument("--timeout", metavar="SECONDS", default=None,
                        type=validate.argument(validate.number, "--timeout", positive=True, most=MAX_TIMEOUT),
                        help="stop every process after this many seconds and exit with 124 (default: no limit)")
    parser.add_argument("--version", action="version", version=f"shimrt {__version__}",
                        help="print shimrt's version and exit")
    # Everything after -m belongs to the module, as with python -m.
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="module",
                        help="-m MODULE [args]: run MODULE as a script, as python -m does (e.g. -m shimrt.bench); "
                             "the rest of the command line is its arguments")
    parser.add_argument("script", nargs="?", help="the Python script every process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parse ``argv`` (default ``sys.argv[1:]``), run, and return the exit
    code instead of raising SystemExit. A refused argument exits 2 with argparse's message, a
    ShimrtError or OSError 2 with "shimrt.launch: <message>", never with a traceback."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if args.module is not None:
            if not args.module:
                parser.error("-m needs a module name, e.g. -m shimrt.bench")
            if not all(part.isidentifier() for part in args.module[0].split(".")):  # what python -m finds
                parser.error(f"-m takes a module name (dotted Python names, e.g. shimrt.bench), not "
                             f"{validate.shown(args.module[0])}")
            target = ["-m", *args.module]
        elif args.script is None:
            parser.error("give a script or -m module")
        else:
            try:
                validate.readable_file(args.script, "script")
            except UsageError as exc:
                parser.error(str(exc))
            target = [args.script, *args.args]
    except SystemExit as exc:  # --help, --version (0) or a refused argument (2): argparse said why
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        config.check()  # a bad SHIMRT_* value is refused here, before any process starts
        return run(args.nproc, target, args.timeout, args.devices, mps=args.mps, link=args.link)
    except ShimrtError as exc:
        say(str(exc))
        return 2
    except OSError as exc:
        say(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
        return 2
    except KeyboardInterrupt:  # Ctrl-C before any rank started
        say("interrupted")
        return 128 + signal.SIGINT
