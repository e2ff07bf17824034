"""Which vendor backends exist, and loading one part of one of them.

The backend-agnostic layer reaches vendor code only through here: ``shimrt.<backend>.<part>``
modules (``driver``, ``rtc``, ``check``) that mirror each other name for name.
"""

from __future__ import annotations

import importlib

from .errors import NoDeviceError, UsageError

NAMES = ("cuda", "hip")


def load(backend: str, part: str):
    """The module ``shimrt.<backend>.<part>``; NoDeviceError if this version lacks it."""
    if backend not in NAMES:
        raise UsageError(f"backend must be one of {', '.join(NAMES)}, not {backend!r}")
    name = f"shimrt.{backend}.{part}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise NoDeviceError(f"the {backend} backend has no {part} in this version of shimrt") from None
        raise
