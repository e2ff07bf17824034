"""The one place CUDA results become exceptions.

cuda-python returns ``(err, *values)``; :func:`check` raises :class:`DriverError` named after
the CUDA or NVRTC error, with the vendor's description, and returns the values.
"""

from __future__ import annotations

from ..backends import checker
from ..errors import NoDeviceError


def _bindings():
    """Import cuda.bindings, or say plainly that it is missing."""
    try:
        from cuda.bindings import driver, nvrtc
    except ImportError as exc:  # the package itself is absent
        raise NoDeviceError("cuda-python is not installed (pip install 'shimrt[cuda]'): " + str(exc)) from None
    return driver, nvrtc


def describe(err) -> tuple[str, int, str]:
    """(name, code, description) of a CUresult or nvrtcResult."""
    driver, nvrtc = _bindings()
    code = int(err)
    if isinstance(err, nvrtc.nvrtcResult):
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
