"""Finds the kernel sources in ``kernels_src/``: in a checkout, or inside an installed wheel."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ShimrtError, UsageError

__all__ = ["directory", "names", "source", "include_folders"]

_HERE = Path(__file__).resolve().parent
# A wheel carries the folder inside the package; a checkout (or editable install) has it beside.
_CANDIDATES = (_HERE / "kernels_src", _HERE.parent / "kernels_src")
SUFFIXES = (".cu",)
HEADER_SUFFIXES = (".h", ".cuh")


def directory() -> Path:
    """The kernels_src folder in use."""
    for path in _CANDIDATES:
        if path.is_dir():
            return path
    raise ShimrtError("kernels_src/ not found beside the shimrt package: "
                      + ", ".join(str(p) for p in _CANDIDATES))


def names() -> list[str]:
    """File names of the kernel sources (``*.cu``), sorted."""
    return sorted(p.name for p in directory().iterdir() if p.suffix in SUFFIXES)


def path(name: str) -> Path:
    """Path of one source; ``name`` may omit the ``.cu``."""
    base = directory()
    if isinstance(name, str) and 0 < len(name) <= 255 and "\0" not in name and "/" not in name:
        for candidate in (name, name + ".cu"):  # short, plain names only: the file system raises on others
            p = base / candidate
            if p.suffix in SUFFIXES and p.is_file() and p.parent == base:
                return p
    raise UsageError(f"kernel source name must name a source in {base} (the .cu may be left out), not {name!r}; "
                     f"there are: {', '.join(names())}")


def source(name: str) -> str:
    """The text of one kernel source, e.g. ``source("vector_ops")``."""
    return path(name).read_text()


def include_folders(include_dirs: Any) -> list[Path]:
    """The include folders of a compile, resolved: ``kernels_src/`` for None, one folder for a str
    or path, else each item of a list; each must be an existing folder."""
    if include_dirs is None:
        return [directory()]
    if isinstance(include_dirs, (str, os.PathLike)):
        include_dirs = [include_dirs]  # one folder, not a sequence of one-character ones
    elif not isinstance(include_dirs, (list, tuple)):
        raise UsageError(f"include_dirs must be a folder or a list of folders, not {include_dirs!r}")
    dirs = []
    for d in include_dirs:
        if not isinstance(d, (str, os.PathLike)) or isinstance(os.fspath(d), bytes):
            raise UsageError(f"each include dir must be a folder path (str or pathlib.Path), not {d!r}")
        path = os.fspath(d)
        if not path or "\0" in path or not Path(path).is_dir():
            raise UsageError(f"each include dir must be an existing folder, not {path!r}")
        dirs.append(Path(path).resolve())
    return dirs


def headers(include_dirs: Any) -> list[Path]:
    """Every ``*.h`` and ``*.cuh`` file in the include folders (one folder, or a list of them), sorted.
    (Not what keys the compile cache: that is every file a compile can read, whatever its name; see
    :mod:`shimrt.includes`.)"""
    found = []
    for d in include_folders(include_dirs):
        found.extend(sorted(p for p in d.rglob("*") if p.suffix in HEADER_SUFFIXES and p.is_file()))
    return found
