"""NCCL and RCCL through ctypes: ``library.py`` finds the library and declares its functions,
``config.py`` lays out ncclConfig_t per version, ``collectives.py`` holds the table of
collectives and their buffer-size rule (``buffer_counts``, ``nccl_count``), ``communicator.py``
the Communicator."""

from .collectives import COLLECTIVES, buffer_counts, nccl_count
from .communicator import Communicator, group, prepare_group, unique_id
from .config import CommOptions
from .library import load

__all__ = ["COLLECTIVES", "CommOptions", "Communicator", "buffer_counts", "group", "load", "nccl_count",
           "prepare_group", "unique_id"]
