"""Checks for values where they enter shimrt: options dataclasses, function arguments, command
lines and environment variables all use these, so every refusal reads the same way:
"<what> must be <what is allowed>, not <the value>" (a :class:`UsageError`).

numpy integers are taken wherever ints are, and numpy floats wherever floats are; ``bool`` is
never taken for a number (``True`` is not a timeout). :func:`argument` adapts any check to an
argparse ``type=``, so command lines refuse a bad value before anything runs. A refused value is
shown by :func:`shown`: cut short, and an int too long to print (10**5000) by its size.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from .errors import UsageError

__all__ = ["MAX_INT32", "MAX_UINT32", "shown", "integer", "number", "boolean", "text", "one_of", "nbytes",
           "writable_file", "readable_file", "available_host_memory", "require_memory", "argument", "listed"]

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# ASCII digits only (\d would take "١٢"), and few enough for int() (Python refuses 4300+ digits).
_SIZE = re.compile(r"^\s*([0-9]{1,30})\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)
_SHOWN = 200  # characters of a refused value a message quotes

#: The largest value of a C ``int``: vendor APIs take counts, ranks, indices and grids as one.
MAX_INT32 = 2**31 - 1
#: The largest ``unsigned int``: what cuLaunchKernel and hipModuleLaunchKernel take shared memory as.
MAX_UINT32 = 2**32 - 1


def shown(value: Any) -> str:
    """``repr(value)`` for a message: at most 200 characters, and an int too long for ``repr``
    (Python refuses to print 4300+ digits) by its size."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"an int of about {int(abs(int(value)).bit_length() * 0.30103) + 1} digits"
    except Exception as exc:  # a repr that fails: name the type, never fail the refusal itself
        return f"<{type(value).__name__} ({type(exc).__name__} in its repr)>"
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def integer(value: Any, what: str, *, least: int | None = None, most: int | None = None) -> int:
    """``value`` as an int (a Python or numpy integer, never a bool) within [least, most]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{what} must be an int{_range(least, most)}, not {shown(value)}")
    value = int(value)
    if (least is not None and value < least) or (most is not None and value > most):
        raise UsageError(f"{what} must be an int{_range(least, most)}, not {shown(value)}")
    return value


def number(value: Any, what: str, *, positive: bool = False, least: float | None = None,
           most: float | None = None) -> float:
    """``value`` as a finite float (an int or float, Python or numpy, never a bool); ``positive``
    refuses 0 and below."""
    allowed = ("a finite positive number" if positive else "a finite number") + _range(least, most)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UsageError(f"{what} must be {allowed}, not {shown(value)}")
    try:
        result = float(value)
    except OverflowError:  # an int beyond any float (10**400)
        raise UsageError(f"{what} must be {allowed}, not {shown(value)}") from None
    if not math.isfinite(result) or (positive and result <= 0) or (least is not None and result < least) \
            or (most is not None and result > most):
        raise UsageError(f"{what} must be {allowed}, not {shown(value)}")
    return result


def boolean(value: Any, what: str) -> bool:
    """``value`` when it is True or False (or a numpy bool); strings like "no" are refused."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise UsageError(f"{what} must be True or False, not {shown(value)}")


def text(value: Any, what: str, *, empty: bool = False, path: bool = False) -> str:
    """``value`` when it is a str (non-empty unless ``empty``) with no NUL character that can be
    written out: as UTF-8 (what compilers and C libraries read), or with ``path`` as the OS
    encodes a file name or argument (undecodable bytes, which Python holds as surrogates from
    U+DC80, are taken there). A lone surrogate ("\\ud800") is refused."""
    allowed = "a string" + ("" if empty else " (not empty)") + " without NUL characters"
    if not isinstance(value, str) or (not empty and not value) or "\0" in value:
        raise UsageError(f"{what} must be {allowed}, not {shown(value)}")
    try:
        os.fsencode(value) if path else value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{what} must be {allowed} or lone surrogates (valid Unicode), not {shown(value)} "
                         f"({value[exc.start]!r} at {exc.start})") from None
    return value


def one_of(value: Any, what: str, allowed: Iterable) -> Any:
    """``value`` when it is one of ``allowed``."""
    allowed = tuple(allowed)
    # Compared one by one, by type first: an array or an unhashable value is simply not allowed.
    # True == 1: a bool is taken only where the allowed values hold that very bool.
    if not any(_same(value, a) for a in allowed):
        raise UsageError(f"{what} must be one of {', '.join(map(str, allowed))}, not {shown(value)}")
    return value


def _same(value: Any, allowed: Any) -> bool:
    if value is allowed:
        return True
    if isinstance(value, (bool, np.bool_)) or isinstance(allowed, bool) or isinstance(value, np.ndarray):
        return False
    try:
        return bool(value == allowed)
    except (TypeError, ValueError):  # an object whose == is not a truth value
        return False


def nbytes(value: Any, what: str, *, least: int = 0, most: int | None = None) -> int:
    """A byte count: an int, or a string with an optional K/M/G/T suffix (powers of 1024, as
    nccl-tests reads them): "8", "64K", "256M", "1G"."""
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m is None:
            raise UsageError(f"{what} must be a byte count such as 8, 64K, 256M or 1G, not {shown(value)}")
        value = int(m.group(1)) * _SUFFIX[m.group(2).upper()]
    return integer(value, what, least=least, most=most)


def writable_file(value: Any, what: str) -> Path:
    """A path a run will write: its folder must exist and be writable and the path must not be a
    folder. Checked before the run, so a long run never ends unable to save its results."""
    path = Path(text(value, what, path=True))
    if path.is_dir():
        raise UsageError(f"{what} must be a file path, not the folder {str(path)!r}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{what}: the folder {str(folder)!r} does not exist")
    if path.exists() and not os.access(path, os.W_OK) or not os.access(folder, os.W_OK):
        raise UsageError(f"{what}: {str(path)!r} is not writable")
    return path


def readable_file(value: Any, what: str) -> Path:
    """A path a run will read: an existing, readable file."""
    path = Path(text(value, what, path=True))
    if not path.is_file() or not os.access(path, os.R_OK):
        raise UsageError(f"{what}: {str(path)!r} is not a readable file")
    return path


def available_host_memory() -> int | None:
    """Bytes of host memory available now: MemAvailable of /proc/meminfo (free memory and what the
    kernel can reclaim), else the free pages sysconf reports; None when neither can say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _bytes(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes / 2**30:.1f} GiB)"


def require_memory(needed: int, available: int | None, what: str, where: str) -> None:
    """UsageError naming both sizes when ``needed`` bytes exceed ``available`` (None: unknown, taken)."""
    if available is not None and needed > available:
        raise UsageError(f"{what} must fit in {where} memory: it needs {_bytes(needed)}, and {_bytes(available)} "
                         "are available")


def argument(check: Callable[..., Any], name: str, **limits: Any) -> Callable[[str], Any]:
    """An argparse ``type=`` for ``check`` (one of this module's functions): the command-line
    string is converted (ints and floats as written) and refused with the check's message."""
    def convert(raw: str):
        value: Any = raw
        if check in (integer, number):
            try:
                value = int(raw) if check is integer else float(raw)
            except ValueError:
                kind = "an int" if check is integer else "a number"
                raise argparse.ArgumentTypeError(f"{name} must be {kind}, not {shown(raw)}") from None
        try:
            return check(value, name, **limits)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = name  # argparse names the type in its messages
    return convert


def listed(check: Callable[..., Any], name: str, **limits: Any) -> Callable[[str], list]:
    """An argparse ``type=`` for a comma-separated list whose items pass ``check``."""
    one = argument(check, name, **limits)

    def convert(raw: str) -> list:
        items = [p.strip() for p in raw.split(",") if p.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{name} must be a comma-separated list, not {shown(raw)}")
        return [one(p) for p in items]
    convert.__name__ = name
    return convert


def _range(least, most) -> str:
    if least is not None and most is not None:
        return f" in {least}..{most}"
    if least is not None:
        return f" >= {least}"
    if most is not None:
        return f" <= {most}"
    return ""
