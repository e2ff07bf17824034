"""Which vendor backends exist, and loading one part of one of them.

The backend-agnostic layer reaches vendor code only through here: ``shimrt.<backend>.<part>``
modules (``driver``, ``rtc``, ``check``) that mirror each other name for name.
"""

from __future__ import annotations

import importlib

from .errors import NoDeviceError, UsageError

NAMES = ("cuda", "hip")

# What every backend provides, module by module; tests hold both backends to it, signatures too.
INTERFACE = {
    "check": ("check", "describe", "raise_for", "library_path"),
    "rtc": ("version", "library_path", "default_options", "compile_source", "binary_arch"),
    "driver": (
        "NAME", "DLPACK_DEVICE_TYPE", "library_path", "binding_version", "init", "version", "device_count",
        "get_device", "device_name", "device_properties", "timestamp_hz", "context_retain", "context_release",
        "make_current", "synchronize", "priority_range", "module_load", "module_unload", "module_function",
        "function_attributes", "function_param_layout", "function_set_max_dynamic_smem", "function_set_carveout",
        "occupancy",
        "launcher", "launch_error", "is_invalid_context", "mem_alloc", "mem_free", "mem_info", "memcpy_htod",
        "memcpy_dtoh", "memcpy_dtod", "memset_d8", "stream_create", "stream_priority", "stream_destroy",
        "stream_synchronize", "stream_query", "stream_wait_event", "stream_handle", "null_stream",
        "event_create", "event_record", "event_synchronize", "event_query", "event_elapsed_ms", "event_destroy",
        "sm_partition", "partition_stream_create", "partition_destroy",
    ),
}


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


# --- helpers the vendor backends share (they differ only in the vendor's names) --------------

def checker(describe):
    """(check, raise_for) for a backend whose ``describe(err)`` gives (name, code, description).

    ``check(result, call)`` unpacks a binding's ``(err, *values)`` tuple: it raises
    :class:`DriverError` named after the vendor error, else returns the value(s).
    """
    from .errors import DriverError

    def raise_for(call: str, err):
        name, code, desc = describe(err)
        raise DriverError(call, name, code, desc)

    def check(result, call: str):
        err = result[0]
        if int(err) != 0:
            raise_for(call, err)
        if len(result) == 1:
            return None
        return result[1] if len(result) == 2 else result[1:]

    return check, raise_for


def read_attributes(check, table: dict, enum, prefix: str, query, call: str) -> dict:
    """{our name: value} for a table of our name -> the vendor enum member's name less ``prefix``."""
    return {ours: check(query(getattr(enum, prefix + theirs)), call) for ours, theirs in table.items()}


def ready(check, result, not_ready, call: str) -> bool:
    """A stream or event query's answer: False for the vendor's not-ready error, True for success."""
    if result[0] == not_ready:
        return False
    check(result, call)
    return True
