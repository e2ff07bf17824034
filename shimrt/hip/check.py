"""The one place HIP results become exceptions.

hip-python returns ``(err, *values)`` like cuda-python; :func:`check` raises
:class:`DriverError` named after the HIP or hipRTC error, with HIP's description.
"""

from __future__ import annotations

from typing import Any

from ..backends import Check, members
from ..errors import NoDeviceError
from ..vendor import checker

#: what the core may call (Check, :mod:`shimrt.backends`), and what this backend's other modules import
__all__ = members(Check) + ["bindings", "loaded"]

# What to do when the libraries cannot be loaded (hip-python dlopens these plain names).
INSTALL_HINT = ("install hip-python (pip install 'shimrt[hip]') and ROCm; on Debian bookworm "
                "'apt-get install libamdhip64-5 libhiprtc-builtins5' gives ROCm 5.2.3's HIP runtime and "
                "hipRTC, and libhiprtc.so and libamdhip64.so must resolve to libamdhip64.so.5 (see README)")


def bindings():
    """Import hip-python's HIP and hipRTC modules, or say plainly what is missing."""
    try:
        from hip import hip, hiprtc
    except ImportError as exc:
        raise NoDeviceError(f"hip-python is not installed ({exc}): {INSTALL_HINT}", missing=True) from None
    return hip, hiprtc


def _text(value) -> str:
    """hip-python hands strings back as CStr, bytes or str."""
    if isinstance(value, tuple):  # (hipSuccess, text) from hipGetErrorName/String
        value = value[-1]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode(errors="replace")
    return str(value)


def describe(err: Any) -> tuple[str, int, str]:
    """(name, code, description) of a hipError_t or hiprtcResult."""
    hip, hiprtc = bindings()
    code = int(err)
    try:
        if isinstance(err, hiprtc.hiprtcResult):
            name = _text(hiprtc.hiprtcGetErrorString(err))
            return name, code, name
        return _text(hip.hipGetErrorName(err)), code, _text(hip.hipGetErrorString(err))
    except RuntimeError:  # the library is not loadable: the enum still knows its own name
        return getattr(err, "name", str(err)), code, "(no description: the HIP runtime is not loaded)"


# The one check helper of this backend: vendor results in, DriverError (named after the
# vendor's error, with its description) out.
check, raise_for = checker(describe)


def loaded(call: Any) -> Any:
    """Run ``call()``; a library hip-python cannot dlopen becomes NoDeviceError with the fix."""
    try:
        return call()
    except RuntimeError as exc:
        if "dlopen" in str(exc) or "dlsym" in str(exc):
            raise NoDeviceError(f"the HIP libraries cannot be loaded ({exc}): {INSTALL_HINT}") from None
        raise


def library_path(name: str) -> str | None:
    """The file a HIP library name ("libamdhip64.so", "libhiprtc.so") resolves to, if loadable."""
    import ctypes
    import os
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        return None
    link_map = ctypes.c_void_p()
    dlinfo = ctypes.CDLL(None).dlinfo
    if dlinfo(ctypes.c_void_p(lib._handle), 2, ctypes.byref(link_map)) != 0 or not link_map.value:  # RTLD_DI_LINKMAP
        return name
    # struct link_map { ElfW(Addr) l_addr; char *l_name; ... }
    path = ctypes.cast(link_map.value + ctypes.sizeof(ctypes.c_void_p), ctypes.POINTER(ctypes.c_char_p))[0]
    return os.path.realpath(path.decode()) if path else name
