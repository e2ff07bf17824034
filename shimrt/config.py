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
}

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
