"""Which link the ranks' collectives cross: ``"native"``, what NCCL finds between them (NVLink,
PCIe, shared memory between processes of one machine), or ``"socket"``, a network between
machines, on one machine.

``"socket"`` gives each rank a host of its own (``NCCL_HOSTID``), so that NCCL treats every rank
as a node and carries its collectives over its socket transport, here on the loopback interface
(``NCCL_NET=Socket``, ``NCCL_SOCKET_IFNAME=lo``, InfiniBand off). As across real nodes, the data
goes through host memory by NCCL's proxy threads, and NCCL's kernels wait on the link while they
hold their SMs: the regime where communication can hide behind compute, unlike two ranks of one
GPU whose all-reduces run at memory speed beside it. Two ranks then share a GPU whatever NCCL's
version (each names a different host, so NCCL sees no GPU used twice). NCCL's own variables pace
the link (``NCCL_SOCKET_NTHREADS``, ``NCCL_NSOCKS_PERTHREAD``).

NCCL reads its environment once, at its first communicator, so the variables are set before the
rank's process starts (``python -m shimrt.launch --link socket``), or by :func:`use_link` before
the first communicator of a process started by another launcher (torchrun). Ranks in one process
cannot each name a host: a link other than native is refused there.
"""

from __future__ import annotations

import os
from typing import Iterable

from .. import validate
from ..config import given, settings
from ..errors import UsageError

__all__ = ["LINKS", "link_env", "use_link", "clashes", "link_of_process"]

#: The links a run's collectives can cross (see the module's docstring).
LINKS = ("native", "socket")
_HOSTID = "shimrt-link-rank-"  # each rank's host name: this and its rank


def link_env(link: str, rank: int) -> dict[str, str]:
    """NCCL's variables that put rank ``rank``'s collectives on ``link`` (none for native)."""
    validate.one_of(link, "link", LINKS)
    rank = validate.integer(rank, "rank", least=0, most=validate.MAX_INT32)
    if link == "native":
        return {}
    return {"NCCL_HOSTID": f"{_HOSTID}{rank}", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1"}


def use_link(link: str, rank: int) -> dict[str, str]:
    """Set :func:`link_env`'s variables in this process's environment, for a process whose
    launcher did not (torchrun); call it before the process's first NCCL communicator (NCCL reads
    them once). UsageError naming a variable already set to another value (the user's or a
    launcher's: one of them would be ignored). Returns what it set."""
    wanted = link_env(link, rank)
    if clash := clashes(link, [rank]):
        name, value = next(iter(clash.items()))
        raise UsageError(f"link {link!r} sets {name}={wanted[name]}, but the environment already has "
                         f"{name}={value}: unset it, or leave the link native")
    os.environ.update(wanted)  # putenv too: NCCL's getenv sees them
    return wanted


def clashes(link: str, ranks: Iterable[int]) -> dict[str, str]:
    """The variables :func:`link_env` sets for any of ``ranks`` that the environment already sets
    to another value (name -> the environment's value): setting them would silently override it."""
    out: dict[str, str] = {}
    for rank in ranks:
        wanted = link_env(link, rank)
        out.update({name: value for name, value in given(wanted).items() if value != wanted[name]})
    return out


def link_of_process() -> str | None:
    """The link this process's environment selects other than native ("socket": its NCCL_HOSTID
    is one :func:`link_env` gives), or None."""
    hostid = settings().nccl_hostid
    return "socket" if hostid is not None and hostid.startswith(_HOSTID) else None
