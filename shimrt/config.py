"""Every SHIMRT_* environment variable (and the launch environment), read and validated in one place.

Nothing here is read at import: callers ask for :func:`settings` or :func:`launch_env` when they
need a value, so a test or a script may change the environment between calls. An empty variable
counts as unset; any other value that cannot be used is a :class:`UsageError` naming the variable
and what it may hold.
"""

from __future__ import annotations

import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from . import validate
from .errors import UsageError

__all__ = ["BACKENDS", "MAX_RANKS", "cache_folder", "settings", "given", "LaunchEnv", "devices_of", "device_map",
           "launch_env", "check"]

#: name -> what it does; the README's table is written from this.
VARIABLES = {
    "SHIMRT_BACKEND": "force the GPU backend: 'cuda' or 'hip', any case (default: the first one with a device)",
    "SHIMRT_CACHE_DIR": "the folder where compiled kernels are cached, made if missing (default: "
                        "$XDG_CACHE_HOME/shimrt or ~/.cache/shimrt); an absolute path or one starting with ~ or "
                        "~user: a relative path is refused (it would follow the working directory), and so is a "
                        "path that exists and is not a folder",
    "SHIMRT_DISABLE_CACHE": "1/true/yes/on (any case) to compile every time and never touch the cache; "
                            "0/false/no/off or unset to use it",
    "SHIMRT_NCCL_LIBRARY": "path of the NCCL (or RCCL) library to load; when set it is the only place searched, "
                           "and a path that does not load is an error (no fallback to another NCCL); its headers are "
                           "read first, so that a file that is truncated, not a shared library of this machine "
                           "(x86-64 or aarch64, 64-bit) or not a regular file is refused with a message instead of "
                           "crashing dlopen",
    "ROCM_PATH": "where ROCm is installed; librccl.so is looked for in its lib/ (read, not owned, by shimrt)",
    "SHIMRT_DEVICES": "comma-separated GPU indices, the device of each local rank in turn, e.g. '0,0' for two "
                      "ranks on GPU 0 (python -m shimrt.launch --devices sets it; default: local rank i uses GPU i)",
    "NCCL_MULTI_RANK_GPU_ENABLE": "NCCL's (2.30+): 1 lets several ranks of one communicator share a GPU; "
                                  "read, not owned, by shimrt, to refuse a shared GPU NCCL would refuse",
    "NCCL_HOSTID": "NCCL's: the host a rank says it is on; python -m shimrt.launch --link socket gives each rank "
                   "one of its own (shimrt.nccl.link), so that NCCL carries their collectives as between machines; "
                   "read, not owned, by shimrt: ranks of different hosts share no GPU in NCCL's eyes",
    "NCCL_NET": "NCCL's: its network transport; --link socket sets Socket (read, not owned, by shimrt)",
    "NCCL_SOCKET_IFNAME": "NCCL's: the interfaces its sockets use; --link socket sets lo, the loopback (read, not "
                          "owned, by shimrt)",
    "NCCL_IB_DISABLE": "NCCL's: 1 keeps InfiniBand out; --link socket sets it (read, not owned, by shimrt)",
    "SHIMRT_RANK": "set by python -m shimrt.launch: this process's rank",
    "SHIMRT_WORLD_SIZE": "set by python -m shimrt.launch: the number of ranks",
    "SHIMRT_LOCAL_RANK": "set by python -m shimrt.launch: the rank on this machine (its GPU: see SHIMRT_DEVICES)",
    "SHIMRT_LOCAL_WORLD_SIZE": "set by python -m shimrt.launch: the number of ranks on this machine",
    "SHIMRT_NCCL_UNIQUE_ID": "set by python -m shimrt.launch: the shared ncclUniqueId, as 256 hex digits",
    "SHIMRT_NCCL_UNIQUE_ID_ERROR": "set by python -m shimrt.launch instead of SHIMRT_NCCL_UNIQUE_ID when the "
                                   "launcher could not load NCCL: why; launch.init() in a rank raises it",
    "SHIMRT_MPS_CONTROL": "path of NVIDIA's MPS control program for python -m shimrt.launch --mps; when set it is "
                          "the only one used (default: nvidia-cuda-mps-control on PATH, then in /usr/local/nvidia/bin "
                          "and /usr/bin)",
    "SHIMRT_MPS": "set by python -m shimrt.launch --mps: 1 when the ranks are clients of the launcher's own MPS "
                  "daemon (launch.init() then names MPS as the likely cause when a rank's GPU will not open)",
    "CUDA_MPS_PIPE_DIRECTORY": "CUDA's: the folder of an MPS daemon's pipes (default /tmp/nvidia-mps); "
                               "python -m shimrt.launch --mps sets it for the ranks to its own daemon's; read, not "
                               "owned, by shimrt, to refuse a second daemon beside one already running there",
    "CUDA_MPS_LOG_DIRECTORY": "CUDA's: the folder of an MPS daemon's logs; python -m shimrt.launch --mps sets it for "
                              "the ranks to its own daemon's (removed when the launcher ends)",
    "RANK": "set by python -m shimrt.launch as torchrun does (SHIMRT_RANK); read under torchrun",
    "WORLD_SIZE": "set by python -m shimrt.launch as torchrun does (SHIMRT_WORLD_SIZE); read under torchrun",
    "LOCAL_RANK": "set by python -m shimrt.launch as torchrun does (SHIMRT_LOCAL_RANK); read under torchrun",
    "LOCAL_WORLD_SIZE": "set by python -m shimrt.launch as torchrun does (SHIMRT_LOCAL_WORLD_SIZE); "
                        "read under torchrun",
    "MASTER_ADDR": "torch.distributed's env:// rendezvous host; python -m shimrt.launch gives its ranks "
                   "127.0.0.1 where unset, as torchrun --standalone does (shimrt's own NCCL id needs none); read "
                   "under torchrun",
    "MASTER_PORT": "torch.distributed's env:// rendezvous port; python -m shimrt.launch gives its ranks one free "
                   "on this machine where unset; read under torchrun",
}

# Set by other launchers and read by launch_env(): torchrun's (python -m shimrt.launch writes the
# first four too, so that torch.distributed code finds them), Open MPI's and MPICH/PMI's.
FOREIGN_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                            "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                            "MPI_LOCALNRANKS")

BACKENDS = ("cuda", "hip")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
UNIQUE_ID_BYTES = 128  # sizeof(ncclUniqueId)
MAX_RANKS = validate.MAX_INT32  # NCCL takes rank counts, ranks and device ordinals as C ints
# Set by python -m shimrt.launch beside SHIMRT_RANK, and read only with it.
_WITH_RANK = ("SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK", "SHIMRT_LOCAL_WORLD_SIZE", "SHIMRT_NCCL_UNIQUE_ID",
              "SHIMRT_NCCL_UNIQUE_ID_ERROR")
_INT = re.compile(r"[+-]?[0-9]+")
_HEX = re.compile(r"[0-9a-fA-F]*")


def _get(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value without surrounding blanks; None when unset or empty."""
    return env.get(name, "").strip() or None


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    """The variable in lower case when it is one of ``allowed`` (any case); None when unset."""
    raw = env.get(name, "")
    value = raw.strip().lower()
    if not value:
        return None
    if value not in allowed:
        validate.one_of(raw, name, allowed)  # refuses it, quoting the value as it was written
    return value


def _switch(env: Mapping[str, str], name: str) -> bool | None:
    """A yes/no variable: True, False, or None when unset."""
    value = _choice(env, name, _TRUE + _FALSE)
    return None if value is None else value in _TRUE


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment's shimrt settings.

    ``nccl_library``, when set, is the only place the NCCL/RCCL loader looks: a path that does
    not load must be reported, never replaced by another NCCL found elsewhere. It is not checked
    here, so that everything that does not use NCCL (compiling kernels) works whatever it says.
    ``mps_control`` (SHIMRT_MPS_CONTROL) likewise: :mod:`shimrt.launch.mps` judges it when MPS is asked
    for. ``mps_pipe_directory`` is CUDA_MPS_PIPE_DIRECTORY, the MPS daemon this process's CUDA
    would join (None: CUDA's default, /tmp/nvidia-mps). ``nccl_hostid`` is NCCL_HOSTID: set,
    this process's ranks name a host of their own to NCCL (:mod:`shimrt.nccl.link`).
    """

    backend: str | None
    cache_dir: Path
    cache_enabled: bool
    nccl_library: str | None = None
    rocm_path: str | None = None
    nccl_multi_rank_gpu: bool = False
    mps_control: str | None = None
    mps_pipe_directory: str | None = None
    nccl_hostid: str | None = None

    def __post_init__(self) -> None:
        validate.one_of(self.backend, "backend", (None, *BACKENDS))
        validate.boolean(self.cache_enabled, "cache_enabled")


def cache_folder(folder: Path, what: str, fix: str = "") -> Path:
    """``folder`` for a cache (``what`` names it), refused with one message, and ``fix`` after it,
    wherever something other than a folder stands there (a file, a device, a dangling link): no
    cache can live there. One that cannot be made or written is the cache's to report."""
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{what} must be a folder (or a path where one can be made), not {str(folder)!r}, which "
                         f"is not a folder{fix}")
    return folder


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``environ`` (default: ``os.environ``). UsageError, naming the
    variable and the values it may take, for SHIMRT_BACKEND or SHIMRT_DISABLE_CACHE values that
    mean nothing, and for a SHIMRT_CACHE_DIR that is relative, names a user who does not exist
    (~nosuchuser) or exists and is not a folder."""
    env = os.environ if environ is None else environ
    backend = _choice(env, "SHIMRT_BACKEND", BACKENDS)
    disabled = _switch(env, "SHIMRT_DISABLE_CACHE")
    cache_dir = _cache_dir(env)
    library = _get(env, "SHIMRT_NCCL_LIBRARY")
    control = _get(env, "SHIMRT_MPS_CONTROL")
    return Settings(backend=backend, cache_dir=cache_dir, cache_enabled=not disabled,
                    nccl_library=os.path.expanduser(library) if library else None,
                    rocm_path=_get(env, "ROCM_PATH"), nccl_multi_rank_gpu=_nccl_flag(env, "NCCL_MULTI_RANK_GPU_ENABLE"),
                    mps_control=os.path.expanduser(control) if control else None,
                    mps_pipe_directory=_get(env, "CUDA_MPS_PIPE_DIRECTORY"), nccl_hostid=_get(env, "NCCL_HOSTID"))


def given(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``names`` (each one of :data:`VARIABLES`) that the environment sets, with
    their values: what a caller about to set them must not silently override."""
    env = os.environ if environ is None else environ
    out = {}
    for name in names:
        if name not in VARIABLES:
            raise UsageError(f"{name} is not a variable shimrt reads (shimrt.config.VARIABLES)")
        value = _get(env, name)
        if value is not None:
            out[name] = value
    return out


def _cache_dir(env: Mapping[str, str]) -> Path:
    """The compile cache's folder: SHIMRT_CACHE_DIR, else $XDG_CACHE_HOME/shimrt, else
    $HOME/.cache/shimrt. Always absolute: a relative SHIMRT_CACHE_DIR is refused (it would put a
    cache wherever a process happens to stand), as is a ~user that names nobody, and a path
    that exists and is not a folder (/dev/null)."""
    raw = _get(env, "SHIMRT_CACHE_DIR")
    if raw is not None:
        what = "SHIMRT_CACHE_DIR"
        path = _expand_user(env, raw, what)
        if not os.path.isabs(path):
            raise UsageError(f"{what} must be an absolute folder path (or one starting with ~), not {raw!r}: a "
                             "relative one would follow the working directory")
        folder = Path(path)
    else:
        # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
        xdg = _get(env, "XDG_CACHE_HOME")
        if xdg and os.path.isabs(xdg):
            what, folder = "XDG_CACHE_HOME's shimrt folder (SHIMRT_CACHE_DIR sets another)", Path(xdg) / "shimrt"
        else:
            what, folder = "~/.cache/shimrt (SHIMRT_CACHE_DIR sets another)", Path(_home(env)) / ".cache" / "shimrt"
    return cache_folder(folder, what)


def _home(env: Mapping[str, str]) -> str:
    """HOME from ``env`` (else this process's home, as ``Path.home()`` finds it), refused unless
    absolute: the default cache folder must not follow the working directory."""
    home = env.get("HOME")
    if home is None:
        home = os.path.expanduser("~")  # HOME, else the user database's; "~" itself when neither says
    if not os.path.isabs(home):
        raise UsageError(f"HOME must be an absolute path for the compile cache's default folder (~/.cache/shimrt), "
                         f"not {home!r}: set SHIMRT_CACHE_DIR or XDG_CACHE_HOME to an absolute folder")
    return home


def _expand_user(env: Mapping[str, str], path: str, what: str) -> str:
    """``path`` with a leading ~ (HOME of ``env``) or ~user (that user's home) expanded."""
    if not path.startswith("~"):
        return path
    user, sep, rest = path[1:].partition("/")
    if not user:
        return _home(env) + sep + rest
    try:
        home = pwd.getpwnam(user).pw_dir
    except KeyError:
        raise UsageError(f"{what} must be an absolute folder path (or one starting with ~ or ~user of a user who "
                         f"exists), not {path!r}: there is no user {user!r}") from None
    return home + sep + rest


def _nccl_flag(env: Mapping[str, str], name: str) -> bool:
    """An NCCL integer switch read as NCCL reads it (a non-zero integer is on; anything else, off)."""
    raw = _get(env, name)
    return raw is not None and bool(_INT.fullmatch(raw)) and int(raw) != 0


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process stands in a multi-process launch, as the environment says.

    ``source`` is "shimrt" (python -m shimrt.launch), "torchrun", "mpi" or None (not launched).
    ``local_world_size`` is None when the launcher does not say. ``unique_id_error`` is why
    python -m shimrt.launch could not make the unique id (NCCL did not load there), or None.
    ``devices`` is SHIMRT_DEVICES (the GPU of each local rank), or None: local rank i on GPU i.
    ``mps`` is SHIMRT_MPS: the rank is a client of python -m shimrt.launch --mps's own MPS daemon.
    """

    source: str | None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    unique_id: bytes | None = None
    master_addr: str | None = None
    master_port: int | None = None
    local_world_size: int | None = None
    unique_id_error: str | None = None
    devices: tuple[int, ...] | None = None
    mps: bool = False

    @property
    def device(self) -> int:
        """This rank's GPU index: its entry of SHIMRT_DEVICES, or its local rank."""
        return self.devices[self.local_rank] if self.devices is not None else self.local_rank


def _int(env: Mapping[str, str], name: str, *, least: int | None = None, most: int | None = None,
         what: str | None = None) -> int:
    """The integer variable ``name`` within [least, most]; ``what`` names it in the message
    (default: ``name``) where another variable sets a bound."""
    raw = env.get(name, "").strip()
    # Not int(): it takes "1_000" and non-ASCII digits, which no launcher writes; and no more
    # digits than int() converts (a value that long is refused as written).
    value = int(raw) if _INT.fullmatch(raw) and len(raw) <= 40 else env.get(name, "")
    return validate.integer(value, what or name, least=least, most=most)


def _required(env: Mapping[str, str], name: str, because: str) -> None:
    if _get(env, name) is None:
        raise UsageError(f"{name} must be set when {because} is (python -m shimrt.launch sets both)")


def _ranks(env: Mapping[str, str], rank: str, size: str, local: str | None, local_size: str | None,
           *, local_default: int | None = 0) -> tuple[int, int, int, int | None]:
    """(rank, world size, local rank, local world size) from these variables, each checked
    against the others: 0 <= rank < size <= MAX_RANKS (NCCL's C int), 0 <= local rank < local
    size <= size."""
    world = _int(env, size, least=1, most=MAX_RANKS)
    r = _int(env, rank, least=0, most=world - 1, what=f"{rank} (with {size}={world})")
    lsize = None
    if local_size is not None and _get(env, local_size) is not None:
        lsize = _int(env, local_size, least=1, most=world, what=f"{local_size} (with {size}={world})")
    if local is not None and _get(env, local) is not None:
        bound = f"{local_size}={lsize}" if lsize is not None else f"{size}={world}"
        lrank = _int(env, local, least=0, most=(lsize or world) - 1, what=f"{local} (with {bound})")
    elif local_default is None:
        raise UsageError(f"{local} must be set when {rank} is (python -m shimrt.launch sets both)")
    else:
        lrank = local_default
    return r, world, lrank, lsize


def devices_of(value: str, what: str = "SHIMRT_DEVICES") -> tuple[int, ...]:
    """GPU indices from a comma-separated list ("0,0" puts two ranks on GPU 0): one or more
    integers, each at least 0; UsageError naming ``what`` otherwise."""
    text = validate.text(value, what)
    items = [p.strip() for p in text.split(",")]
    # A GPU index is a C int (CUdevice, hipDevice_t): at most 10 digits.
    if not all(_INT.fullmatch(p) and len(p) <= 11 and 0 <= int(p) <= MAX_RANKS for p in items):
        raise UsageError(f"{what} must be comma-separated GPU indices (integers in 0..{MAX_RANKS}, one per local "
                         f"rank, e.g. 0,0 for two ranks on GPU 0), not {validate.shown(text)}")
    return tuple(int(p) for p in items)


def _devices(env: Mapping[str, str], local_rank: int, local_world_size: int | None) -> tuple[int, ...] | None:
    raw = _get(env, "SHIMRT_DEVICES")
    if raw is None:
        return None
    devices = devices_of(raw)
    needed = max(local_rank + 1, local_world_size or 0)
    if len(devices) < needed:
        raise UsageError(f"SHIMRT_DEVICES must name a GPU for each of the {needed} local ranks, not {raw!r} "
                         f"({len(devices)})")
    return devices


def device_map(environ: Mapping[str, str] | None = None) -> tuple[int, ...] | None:
    """SHIMRT_DEVICES from ``environ`` (default: ``os.environ``): the GPU of each local rank, or None."""
    return _devices(os.environ if environ is None else environ, 0, None)


def _unique_id(env: Mapping[str, str]) -> bytes | None:
    raw = _get(env, "SHIMRT_NCCL_UNIQUE_ID")
    if raw is None:
        return None
    if len(raw) != 2 * UNIQUE_ID_BYTES or not _HEX.fullmatch(raw):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise UsageError(f"SHIMRT_NCCL_UNIQUE_ID must be {2 * UNIQUE_ID_BYTES} hex digits (the "
                         f"{UNIQUE_ID_BYTES}-byte ncclUniqueId), not {shown!r} ({len(raw)} characters)")
    return bytes.fromhex(raw)


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """The launch this process is part of: shimrt's launcher first (SHIMRT_RANK), then torchrun
    (RANK and WORLD_SIZE), then MPI (Open MPI's OMPI_COMM_WORLD_*, then PMI_*). UsageError naming
    the variable for a value that cannot be: a rank outside 0..size-1, a size below 1, a local
    rank outside 0..local size-1, a unique id that is not 128 bytes in hex, a SHIMRT_MPS that is
    not a yes/no, or a variable python -m shimrt.launch sets with SHIMRT_RANK without it."""
    env = os.environ if environ is None else environ
    mps = bool(_switch(env, "SHIMRT_MPS"))  # checked even where no launch reads it
    if _get(env, "SHIMRT_RANK") is None:
        for name in _WITH_RANK:
            if _get(env, name) is not None:
                raise UsageError(f"SHIMRT_RANK must be set when {name} is (python -m shimrt.launch sets both); "
                                 f"unset {name} or start with python -m shimrt.launch")
    else:
        _required(env, "SHIMRT_WORLD_SIZE", "SHIMRT_RANK")
        rank, world, local, lsize = _ranks(env, "SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_LOCAL_RANK",
                                           "SHIMRT_LOCAL_WORLD_SIZE", local_default=None)
        uid = _unique_id(env)
        error = None if uid is not None else _get(env, "SHIMRT_NCCL_UNIQUE_ID_ERROR")
        return LaunchEnv("shimrt", rank, world, local, uid, local_world_size=lsize, unique_id_error=error,
                         devices=_devices(env, local, lsize), mps=mps)
    if _get(env, "RANK") is not None and _get(env, "WORLD_SIZE") is not None:
        rank, world, local, lsize = _ranks(env, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        port = _int(env, "MASTER_PORT", least=1, most=65535) if _get(env, "MASTER_PORT") is not None else None
        return LaunchEnv("torchrun", rank, world, local, None, _get(env, "MASTER_ADDR"), port,
                         local_world_size=lsize, devices=_devices(env, local, lsize))
    for names in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OMPI_COMM_WORLD_LOCAL_SIZE"),
                  ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")):
        if _get(env, names[0]) is not None and _get(env, names[1]) is not None:
            rank, world, local, lsize = _ranks(env, *names)
            return LaunchEnv("mpi", rank, world, local, local_world_size=lsize, devices=_devices(env, local, lsize))
    return LaunchEnv(None, devices=_devices(env, 0, None))


def check(environ: Mapping[str, str] | None = None) -> None:
    """Read every variable shimrt reads, refusing the first bad one (UsageError naming it):
    :func:`settings` and :func:`launch_env` (SHIMRT_DEVICES and SHIMRT_MPS included). Commands
    call it before they run, so a bad value ends them at once whether or not the run would
    have reached it."""
    env = os.environ if environ is None else environ
    settings(env)
    launch_env(env)
