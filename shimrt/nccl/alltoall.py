"""all_to_all as NCCL has it: no function of its own, a send and a receive per peer in one group
(as torch.distributed's all_to_all_single makes it). This packs those calls, one block of each
buffer per peer, checked once for both buffers; :meth:`Communicator.all_to_all` makes them."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from .. import arrays
from ..errors import UsageError
from .collectives import datatype_of, rank_of, row_of
from .group import Queued

__all__ = ["block_calls"]

if TYPE_CHECKING:
    from .communicator import Communicator


def block_calls(comm: "Communicator", send: Any, recv: Any, stream: Any) -> list[Queued]:
    """The send of block j of ``send`` to rank j and the receive of rank j's block into block j of
    ``recv``, for every rank j (this one too), on ``stream`` (default: the communicator's)."""
    s = arrays.describe(send, "all_to_all: send buffer")
    r = arrays.describe(recv, "all_to_all: receive buffer")
    if r.dtype != s.dtype:
        raise UsageError(f"all_to_all: send is {s.dtype} but receive is {r.dtype}")
    if s.count != r.count or s.count % comm.size:
        raise UsageError(f"all_to_all: send and receive must hold the same count, a multiple of the {comm.size} "
                         f"ranks, not {s.count} and {r.count}")
    if r.pointer < s.pointer + s.nbytes and s.pointer < r.pointer + r.nbytes:
        raise UsageError("all_to_all: send and receive must not overlap (NCCL reads one while it writes the other)")
    block, datatype = s.count // comm.size, datatype_of(s, "all_to_all")
    target = stream if stream is not None else comm.stream
    stream_handle = comm.device.stream_handle(target)
    handle = comm.state.handle
    if not handle:
        raise comm.state.dead()
    calls = []
    for peer in range(comm.size):
        for name, base in (("send", s.pointer), ("recv", r.pointer)):
            row = row_of(name)
            at = base + peer * block * s.itemsize
            args = row.arguments(at, at, block, datatype, None, rank_of(name, row, comm.size, None, peer), handle,
                                 ctypes.c_void_p(stream_handle))
            calls.append(Queued(comm, target, stream_handle, row.function, args, handle, "all_to_all"))
    return calls
