"""Kernel tracing on HIP: not available yet.

The mirror of :mod:`shimrt.cuda.trace` (CUPTI activity records, later launch callbacks for
PyTorch interposition). On ROCm the counterpart is roctracer (rocprofiler), which shimrt does
not bind yet: the names are here, with the same signatures, and recording raises ShimrtError.
"""

from __future__ import annotations

from typing import Any

from ..errors import ShimrtError

# The trace part's public names; shimrt.cuda.trace has the same ones with the same signatures.
__all__ = ["KIND_KERNEL", "KIND_CONCURRENT_KERNEL", "KERNEL_RECORD", "parse_kernel_record", "KernelRecorder",
           "library_path", "LAUNCH_CALLBACKS", "CALLBACK_DATA", "LAUNCH_PARAMS", "LAUNCH_EX_PARAMS", "LAUNCH_CONFIG",
           "LAUNCH_ATTRIBUTE", "read_launch", "write_dynamic_smem", "LaunchInterposer"]

_UNAVAILABLE = ("kernel tracing is not available on HIP yet: it needs roctracer (rocprofiler), "
                "which shimrt does not bind yet")

# CUPTI's activity kinds, kept so code written against the CUDA backend reads the same here.
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10

# The keys of a kernel record, as on CUDA. No layout is bound (roctracer's records are not read
# yet), so each key maps to None where CUDA has its (offsetof, struct code).
KERNEL_RECORD = dict.fromkeys((
    "kind", "registers", "start", "end", "device_id", "stream_id", "grid_x", "grid_y", "grid_z",
    "block_x", "block_y", "block_z", "static_smem", "dynamic_smem", "local_per_thread", "name",
))


# Launch callbacks: roctracer's HIP API callbacks (hipLaunchKernel, hipExtLaunchKernel,
# hipModuleLaunchKernel) would be the counterpart; none is bound, so the tables are empty.
LAUNCH_CALLBACKS: dict = {}
CALLBACK_DATA: dict = {}
LAUNCH_PARAMS: dict = {}
LAUNCH_EX_PARAMS: dict = {}
LAUNCH_CONFIG: dict = {}
LAUNCH_ATTRIBUTE: dict = {}


def read_launch(cbid: int, params: int) -> dict:
    """Would read a launch from a HIP API callback; raises ShimrtError: roctracer is not bound."""
    raise ShimrtError(_UNAVAILABLE)


def write_dynamic_smem(launch: dict, value: int) -> None:
    """Would rewrite a launch's dynamic shared memory; raises ShimrtError: roctracer is not bound."""
    raise ShimrtError(_UNAVAILABLE)


def library_path() -> str | None:
    """Where the tracing library loads from: always None, none is bound on HIP yet (never raises)."""
    return None


def parse_kernel_record(address: int) -> dict:
    """Would read a kernel record at ``address``; raises ShimrtError: no record layout is bound on HIP."""
    raise ShimrtError(_UNAVAILABLE)


class KernelRecorder:
    """The CUDA backend's kernel recorder, not available on HIP: constructing one raises
    ShimrtError naming what is missing (roctracer)."""

    kernels: list[dict]
    path: str

    def __init__(self) -> None:
        raise ShimrtError(_UNAVAILABLE)


class LaunchInterposer:
    """The CUDA backend's launch interposer, not available on HIP: constructing one raises
    ShimrtError naming what is missing (roctracer's HIP API callbacks)."""

    failures: list[str]
    failure_count: int
    graph_launches: int
    path: str

    def __init__(self, rewrite: Any) -> None:
        raise ShimrtError(_UNAVAILABLE)
