"""NCCL and RCCL through ctypes: ``library.py`` finds the library and declares its functions,
``config.py`` lays out ncclConfig_t per version, ``communicator.py`` holds the Communicator."""

from .communicator import Communicator, unique_id
from .config import CommOptions
from .library import load

__all__ = ["CommOptions", "Communicator", "load", "unique_id"]
