"""Finds the kernel sources in ``kernels_src/``: in a checkout, or inside an installed wheel."""

from __future__ import annotations

from pathlib import Path

from .errors import ShimrtError

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
    for candidate in (name, name + ".cu"):
        p = base / candidate
        if p.is_file() and p.parent == base:
            return p
    raise ShimrtError(f"no kernel source {name!r} in {base}; there are: {', '.join(names())}")


def source(name: str) -> str:
    """The text of one kernel source, e.g. ``source("vector_ops")``."""
    return path(name).read_text()


def headers(include_dirs) -> list[Path]:
    """Every header in the include folders, sorted (their contents key the compile cache)."""
    found = []
    for d in include_dirs:
        d = Path(d)
        if d.is_dir():
            found.extend(sorted(p for p in d.rglob("*") if p.suffix in HEADER_SUFFIXES and p.is_file()))
    return found
