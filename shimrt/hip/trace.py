"""Kernel tracing on HIP: not available yet.

The mirror of :mod:`shimrt.cuda.trace` for what the core calls (:class:`shimrt.backends.Trace`:
the kernel recorder, the launch interposer, the library's path). On ROCm the counterpart is
roctracer (rocprofiler), which shimrt does not bind yet: making either raises ShimrtError.
"""

from __future__ import annotations

from typing import Any

from ..errors import ShimrtError

# The trace part's public names (backends.Trace); shimrt.cuda.trace has the same ones with the same
# signatures, and more of its own (CUPTI's layouts).
__all__ = ["KernelRecorder", "LaunchInterposer", "library_path"]

_UNAVAILABLE = ("kernel tracing is not available on HIP yet: it needs roctracer (rocprofiler), "
                "which shimrt does not bind yet")


def library_path() -> str | None:
    """Where the tracing library loads from: always None, none is bound on HIP yet (never raises)."""
    return None


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
