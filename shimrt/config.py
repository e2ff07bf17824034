"""Every SHIMRT_* environment variable, read in one place.

Nothing here is read at import: callers ask for :func:`settings` when they need a value, so a
test or a script may change the environment between calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import ShimrtError

#: name -> what it does; the README's table is written from this.
VARIABLES = {
    "SHIMRT_BACKEND": "force the GPU backend: 'cuda' or 'hip' (default: the first one with a device)",
    "SHIMRT_CACHE_DIR": "where compiled kernels are cached (default: $XDG_CACHE_HOME/shimrt or ~/.cache/shimrt)",
    "SHIMRT_DISABLE_CACHE": "set to 1 to compile every time and never touch the cache",
    "SHIMRT_NCCL_LIBRARY": "path of the NCCL (or RCCL) library to load, before any other place is searched",
    "ROCM_PATH": "where ROCm is installed; librccl.so is looked for in its lib/ (read, not owned, by shimrt)",
    "SHIMRT_RANK": "set by python -m shimrt.launch: this process's rank",
    "SHIMRT_WORLD_SIZE": "set by python -m shimrt.launch: the number of ranks",
    "SHIMRT_LOCAL_RANK": "set by python -m shimrt.launch: the rank on this machine (its GPU index)",
    "SHIMRT_NCCL_UNIQUE_ID": "set by python -m shimrt.launch: the shared ncclUniqueId, in hex",
}

# Set by other launchers and read (never written) by shimrt.launch.rendezvous(): torchrun's, and
# Open MPI's and MPICH/PMI's.
FOREIGN_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                            "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                            "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")

_BACKENDS = ("cuda", "hip")


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment's shimrt settings."""

    backend: str | None
    cache_dir: Path
    cache_enabled: bool
    nccl_library: str | None = None
    rocm_path: str | None = None

    def __post_init__(self):
        if self.backend is not None and self.backend not in _BACKENDS:
            raise ShimrtError(f"SHIMRT_BACKEND must be one of {', '.join(_BACKENDS)}, not {self.backend!r}")


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``environ`` (default: ``os.environ``)."""
    env = os.environ if environ is None else environ
    backend = env.get("SHIMRT_BACKEND", "").strip().lower() or None
    cache = env.get("SHIMRT_CACHE_DIR", "").strip()
    if cache:
        cache_dir = Path(cache).expanduser()
    else:
        base = env.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
        cache_dir = Path(base) / "shimrt"
    return Settings(backend=backend, cache_dir=cache_dir,
                    cache_enabled=not _flag(env.get("SHIMRT_DISABLE_CACHE")),
                    nccl_library=env.get("SHIMRT_NCCL_LIBRARY", "").strip() or None,
                    rocm_path=env.get("ROCM_PATH", "").strip() or None)


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process stands in a multi-process launch, as the environment says.

    ``source`` is "shimrt" (python -m shimrt.launch), "torchrun", "mpi" or None (not launched).
    """

    source: str | None
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    unique_id: bytes | None = None
    master_addr: str | None = None
    master_port: int | None = None


def _int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise ShimrtError(f"{name} must be an integer, not {env[name]!r}") from None


def launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """The launch this process is part of: shimrt's launcher first, then torchrun, then MPI."""
    env = os.environ if environ is None else environ
    if "SHIMRT_RANK" in env:
        try:
            uid = bytes.fromhex(env.get("SHIMRT_NCCL_UNIQUE_ID", ""))
        except ValueError:
            raise ShimrtError("SHIMRT_NCCL_UNIQUE_ID is not hex") from None
        return LaunchEnv("shimrt", _int(env, "SHIMRT_RANK"), _int(env, "SHIMRT_WORLD_SIZE"),
                         _int(env, "SHIMRT_LOCAL_RANK"), uid or None)
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv("torchrun", _int(env, "RANK"), _int(env, "WORLD_SIZE"),
                         _int(env, "LOCAL_RANK") if "LOCAL_RANK" in env else 0, None,
                         env.get("MASTER_ADDR"), _int(env, "MASTER_PORT") if "MASTER_PORT" in env else None)
    for rank, size, local in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                              ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")):
        if rank in env and size in env:
            return LaunchEnv("mpi", _int(env, rank), _int(env, size), _int(env, local) if local in env else 0)
    return LaunchEnv(None)
