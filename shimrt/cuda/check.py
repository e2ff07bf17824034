"""The one place CUDA results become exceptions.

cuda-python returns ``(err, *values)``; :func:`check` raises :class:`DriverError` named after
the CUDA, NVRTC or CUPTI error, with the vendor's description, and returns the values. CUPTI's
ctypes calls return a bare int: wrapped in :class:`CuptiResult` it takes the same path.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from ..backends import Check, members
from ..errors import NoDeviceError
from ..vendor import checker

#: what the core may call (Check, :mod:`shimrt.backends`), and what this backend's other modules import
__all__ = members(Check) + ["bindings", "nvrtc_bindings", "CuptiResult"]


def bindings():
    """Import cuda.bindings, or say plainly that it is missing."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:  # the package itself is absent
        raise NoDeviceError("cuda-python is not installed (pip install 'shimrt[cuda]'): " + str(exc),
                            missing=True) from None
    return driver, nvrtc


@functools.cache  # one look per process: loading is what costs
def _nvrtc_problem() -> str | None:
    """Why NVRTC's library does not load (cuda.bindings loads it at the first NVRTC call), or None."""
    _, nvrtc = bindings()
    try:
        nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - cuda.pathfinder's DynamicLibNotFoundError, an OSError from dlopen
        return f"{type(exc).__name__}: {exc}"
    return None


def nvrtc_bindings() -> Any:
    """cuda.bindings' nvrtc module, once its library is known to load; NoDeviceError saying what
    to install otherwise (never the loader's own exception from inside a compile)."""
    why = _nvrtc_problem()
    if why is not None:
        raise NoDeviceError(f"NVRTC is not installed (pip install 'shimrt[cuda]', which brings nvidia-cuda-nvrtc): "
                            f"{why}")
    return bindings()[1]


class CuptiResult(int):
    """A CUptiResult (cupti_result.h) from a ctypes call into CUPTI: the wrapper tells
    :func:`describe` to ask CUPTI, not the CUDA driver, what the code means."""

    __slots__ = ()


# name -> (restype, argtypes) of what describe() needs from CUPTI. Bound here on first use, apart
# from shimrt.cuda.trace's table, so this module neither imports trace nor needs CUPTI to import.
_CUPTI_TABLE = {
    # CUptiResult cuptiGetResultString(CUptiResult result, const char **str);
    "cuptiGetResultString": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
    # CUptiResult cuptiGetErrorMessage(CUptiResult result, const char **str);  (newer CUPTI only)
    "cuptiGetErrorMessage": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]),
}


@functools.cache  # a race can only bind twice; dlopen hands both the same library
def _cupti() -> dict:
    """{name: bound function} of the _CUPTI_TABLE entries CUPTI exports; empty if it does not load."""
    path = library_path("cupti")
    if path is None:
        return {}
    lib, bound = ctypes.CDLL(path), {}
    for name, (restype, argtypes) in _CUPTI_TABLE.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = restype, argtypes
            bound[name] = fn
    return bound


def _cupti_text(name: str, code: int) -> tuple[int | None, str]:
    """(result, text) of cuptiGetResultString or cuptiGetErrorMessage for ``code``; result None
    where CUPTI lacks the function or does not load."""
    fn = _cupti().get(name)
    if fn is None:
        return None, ""
    text = ctypes.c_char_p()
    result = fn(code, ctypes.byref(text))
    return result, (text.value or b"").decode(errors="replace")


def _describe_cupti(code: int) -> tuple[str, int, str]:
    result, name = _cupti_text("cuptiGetResultString", code)
    if result != 0 or not name:
        # Without a working NVIDIA driver every CUPTI call fails, this one included (CUPTI_ERROR_UNKNOWN).
        why = ("CUPTI is not loaded" if result is None else
               f"cuptiGetResultString failed too ({result}): CUPTI answers nothing without a working NVIDIA driver")
        return f"CUptiResult {code}", code, f"(no description: {why})"
    _, desc = _cupti_text("cuptiGetErrorMessage", code)
    return name, code, desc or name


def describe(err: Any) -> tuple[str, int, str]:
    """(name, code, description) of a CUresult, nvrtcResult or :class:`CuptiResult`."""
    if isinstance(err, CuptiResult):  # needs CUPTI, not cuda-python
        return _describe_cupti(int(err))
    driver, nvrtc = bindings()
    code = int(err)
    if isinstance(err, nvrtc.nvrtcResult):
        if _nvrtc_problem() is not None:  # the enum still knows its own name
            return getattr(err, "name", str(err)), code, "(no description: NVRTC does not load)"
        _, text = nvrtc.nvrtcGetErrorString(err)
        name = text.decode() if isinstance(text, bytes) else str(text)
        return name, code, name
    try:
        e1, name = driver.cuGetErrorName(err)
        e2, desc = driver.cuGetErrorString(err)
    except Exception:  # no libcuda: the enum still knows its own name
        return getattr(err, "name", str(err)), code, "(no description: the CUDA driver is not loaded)"
    name = name.decode() if int(e1) == 0 else getattr(err, "name", str(err))
    desc = desc.decode() if int(e2) == 0 else ""
    return name, code, desc


# The one check helper of this backend: vendor results in, DriverError (named after the
# vendor's error, with its description) out.
check, raise_for = checker(describe)


def library_path(name: str) -> str | None:
    """Where cuda.pathfinder loaded an NVIDIA library from ("nvrtc", "cuda"), or None."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        return load_nvidia_dynamic_lib(name).abs_path
    except Exception:
        return None
