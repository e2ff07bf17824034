"""NCCL and RCCL through ctypes: ``library.py`` finds the library and declares its functions,
``config.py`` lays out ncclConfig_t per version, ``collectives.py`` holds the table of
collectives and their buffer-size rule (``buffer_counts``, ``nccl_count``), ``communicator.py``
the Communicator, ``group.py`` how calls reach NCCL (alone or grouped, settled, followed),
``prepared.py`` calls packed once, ``watchdog.py`` the thread that bounds every wait, and
``link.py`` which link the ranks' collectives cross (native, or NCCL's sockets between ranks that
each name a host of their own)."""

from .collectives import COLLECTIVES, buffer_counts, nccl_count
from .communicator import Communicator, unique_id
from .config import CommOptions
from .group import group
from .library import load
from .prepared import PreparedCall, PreparedGroup, prepare_group

__all__ = ["COLLECTIVES", "CommOptions", "Communicator", "PreparedCall", "PreparedGroup", "buffer_counts", "group",
           "load", "nccl_count", "prepare_group", "unique_id"]
