"""shimrt: computation and collective communication that truly overlap on multi-GPU machines.

Public names: :class:`Device` (and its Module, Kernel, Stream, Event, Buffer), :func:`compile`,
:mod:`targets`, :mod:`kernels`, :mod:`occupancy` (the calculator and shaping), and the errors.
"""

from . import kernels, occupancy, targets
from .compiler import compile
from .device import Device, Partition
from .errors import CollectiveError, CompileError, DriverError, NoDeviceError, ShimrtError, UsageError
from .kernel import Kernel, Module
from .memory import Buffer
from .program import KernelResources, Program
from .stream import Event, Stream
from .targets import Target

__version__ = "0.1.0"

__all__ = [
    "Buffer", "CollectiveError", "CompileError", "Device", "DriverError", "Event", "Kernel",
    "KernelResources", "Module", "NoDeviceError", "Partition", "Program", "ShimrtError", "Stream", "Target",
    "UsageError", "compile", "kernels", "occupancy", "targets", "__version__",
]

#: The subpackages and command modules of the public API, imported on use (``shimrt.nccl``, ...).
PACKAGES = ("nccl", "overlap", "torch", "launch", "selftest", "bench")


def __dir__() -> list[str]:
    """The public API only: what ``__all__`` names and the public subpackages, not the helper
    modules Python binds here as they are imported (``shimrt.validate``, ``shimrt.cache``, ...)."""
    return sorted({*__all__, *PACKAGES})
