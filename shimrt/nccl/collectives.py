"""What each collective takes: one row per Communicator operation (:data:`COLLECTIVES`), the one
buffer-size rule (:func:`buffer_counts`, :func:`nccl_count`), and the checks of a call's
datatype, buffers, op and root or peer. Pure: no NCCL call, no device."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import arrays, validate
from ..errors import UsageError
from . import library

__all__ = ["COLLECTIVES", "MAX_RANKS", "row_of", "buffer_counts", "nccl_count", "count_of", "datatype_of", "buffers_of",
           "op_of", "rank_of"]


@dataclass(frozen=True)
class Collective:
    """One row of the table: a Communicator operation and the NCCL function that does it.

    ``ranks_in``: the buffer that holds one block per rank, "recv" (all_gather) or "send"
    (reduce_scatter); None when send and receive hold the same count. ``reduces``: takes a
    reduction op. ``rank``: takes a "root" or a "peer". ``in_place``: recv may be None (the send
    buffer is then the receive buffer too). ``buffers``: 2, or 1 for send and recv.
    """

    function: str
    ranks_in: str | None = None
    reduces: bool = False
    rank: str | None = None
    in_place: bool = False
    buffers: int = 2

    def arguments(self, send: int, recv: int, count: int, datatype: int, op: int | None, rank: int | None,
                  comm: ctypes.c_void_p, stream: ctypes.c_void_p | int) -> tuple:
        """The C arguments in the order of the function's prototype: the buffers, count,
        datatype, [op], [root or peer], comm, stream."""
        if self.reduces and self.rank is None:  # all_reduce, reduce_scatter: the calls a loop makes most
            return send, recv, count, datatype, op, comm, stream
        return ((send, recv)[:self.buffers] + (count, datatype) + ((op,) if self.reduces else ())
                + ((rank,) if self.rank else ()) + (comm, stream))


#: Communicator method -> its row. Each method of that name is a thin call of
#: :meth:`Communicator.collective`.
COLLECTIVES: dict[str, Collective] = {
    "all_reduce": Collective("ncclAllReduce", reduces=True, in_place=True),
    "broadcast": Collective("ncclBroadcast", rank="root", in_place=True),
    "reduce": Collective("ncclReduce", reduces=True, rank="root", in_place=True),
    "all_gather": Collective("ncclAllGather", ranks_in="recv"),
    "reduce_scatter": Collective("ncclReduceScatter", ranks_in="send", reduces=True),
    "send": Collective("ncclSend", rank="peer", buffers=1),
    "recv": Collective("ncclRecv", rank="peer", buffers=1),
}

#: What the ``count`` of :func:`buffer_counts` is: NCCL's count argument, the send buffer's
#: count, or the larger buffer's (nccl-tests' size convention).
GIVEN = ("nccl", "send", "largest")


MAX_RANKS = 2**31 - 1  # the largest rank count NCCL's C int takes
MAX_COUNT = 2**64 - 1  # the largest count NCCL's size_t takes


def row_of(collective: str) -> Collective:
    """The row of ``collective`` (a Communicator method's name)."""
    row = COLLECTIVES.get(collective) if isinstance(collective, str) else None
    if row is None:
        raise UsageError(f"collective must be one of {', '.join(COLLECTIVES)}, not {collective!r}")
    return row


def buffer_counts(collective: str, count: int, size: int, *, given: str = "nccl") -> tuple[int, int]:
    """(send, receive) element counts of ``collective`` over ``size`` ranks.

    ``count`` is, by ``given``: "nccl", the count NCCL takes (all_gather's send count,
    reduce_scatter's receive count, the one count of the others); "send", the send buffer's;
    "largest", the larger buffer's. A count that does not split into ``size`` blocks where one
    buffer holds a block per rank is rounded down. all_gather receives ``size`` x its send,
    reduce_scatter sends ``size`` x its receive, the others (send and recv: their one buffer)
    hold the same count on both sides.
    """
    row = row_of(collective)
    count = validate.integer(count, "count", least=0, most=MAX_COUNT)
    size = validate.integer(size, "size", least=1, most=MAX_RANKS)
    validate.one_of(given, "given", GIVEN)
    per_send = size if row.ranks_in == "send" else 1  # elements per element of NCCL's count
    per_recv = size if row.ranks_in == "recv" else 1
    per = {"nccl": 1, "send": per_send, "largest": max(per_send, per_recv)}[given]
    n = count // per
    return n * per_send, n * per_recv


def nccl_count(collective: str, send: arrays.ArrayInfo, recv: arrays.ArrayInfo, size: int) -> int:
    """The count NCCL takes for ``collective`` over ``size`` ranks with these buffers (for
    send and recv, pass their one buffer twice); UsageError naming the counts when the buffers
    do not fit :func:`buffer_counts`. A gathering receive or a scattered send may be larger
    than needed; where both sides hold one count they must be equal."""
    return count_of(collective, row_of(collective), send, recv, validate.integer(size, "size", least=1,
                                                                                   most=MAX_RANKS))


def count_of(collective: str, row: Collective, send: arrays.ArrayInfo, recv: arrays.ArrayInfo, size: int) -> int:
    """:func:`nccl_count` for a caller that already holds ``collective``'s row and a checked
    ``size`` (a Communicator's): the one-off call's path, which checks nothing twice."""
    if row.ranks_in is None and recv.count == send.count:  # one count on both sides: nothing to split
        return send.count
    count = recv.count if row.ranks_in == "send" else send.count  # NCCL counts the per-rank side
    need_send, need_recv = buffer_counts(collective, count, size)
    if row.ranks_in is None:
        if recv.count != send.count:
            raise UsageError(f"{collective}: receive holds {recv.count} elements, send {send.count}; "
                             "they must be equal")
        return count
    which, have, need = (("receive", recv.count, need_recv) if row.ranks_in == "recv" else
                         ("send", send.count, need_send))
    if have < need:
        raise UsageError(f"{collective}: {which} holds {have} elements, needs {count} x {size} ranks = {need}")
    return count


def datatype_of(info: arrays.ArrayInfo, name: str, buffers: int = 2) -> int:
    """NCCL's ncclDataType_t for the dtype of collective ``name``'s buffer(s) (``buffers`` of
    them); the refusal's message is built only for a refusal (the one-off call's path)."""
    code = library.DATATYPES.get(info.dtype)
    if code is None:
        what = f"{name}: the buffer" if buffers == 1 else f"{name}: the buffers"
        raise UsageError(f"{what} has dtype {info.dtype}, which NCCL cannot carry "
                         f"(it takes {', '.join(library.DATATYPES)})")
    return code


def buffers_of(name: str, row: Collective, send: Any, recv: Any) -> tuple[arrays.ArrayInfo, arrays.ArrayInfo]:
    """(send, receive) ArrayInfo of a call, the same one twice for one buffer or in place."""
    if row.buffers == 1:
        if recv is not None:
            raise UsageError(f"{name} takes one buffer, not a receive buffer as well")
        one = arrays.describe(send, f"{name}: buffer")
        return one, one
    s = arrays.describe(send, f"{name}: send buffer")
    if recv is None:
        if not row.in_place:
            in_place = ", ".join(n for n, r in COLLECTIVES.items() if r.in_place)
            raise UsageError(f"{name} needs a receive buffer (recv=None, in place, is for {in_place})")
        return s, s
    r = s if recv is send else arrays.describe(recv, f"{name}: receive buffer")
    if r.dtype != s.dtype:
        raise UsageError(f"{name}: send is {s.dtype} but receive is {r.dtype}")
    return s, r


def op_of(name: str, row: Collective, op: str | None) -> int | None:
    """NCCL's ncclRedOp_t for ``op`` (default "sum"), or None for a collective that reduces nothing."""
    if not row.reduces:
        if op is not None:
            raise UsageError(f"{name} takes no op (it reduces nothing)")
        return None
    if type(op) is str:  # the common case, shimrt's own names: one lookup
        code = library.REDOPS.get(op)
        if code is not None:
            return code
    op = "sum" if op is None else _torch_op(op)
    code = library.REDOPS.get(op) if isinstance(op, str) else None  # str subclasses too (np.str_)
    if code is None:
        validate.one_of(op, "op", library.REDOPS)  # refuses it, naming what is allowed
        code = library.REDOPS[op]
    return code


#: torch.distributed.ReduceOp's names -> shimrt's (no torch import: its enum says its name).
_TORCH_OPS = {"SUM": "sum", "PRODUCT": "prod", "MAX": "max", "MIN": "min", "AVG": "avg"}


def _torch_op(op: Any) -> Any:
    """A ``torch.distributed.ReduceOp`` (its enum, ``ReduceOp.SUM``) as shimrt's name; anything
    else as it is (UsageError for ops NCCL's table here lacks: BAND, BOR, BXOR, PREMUL_SUM)."""
    kind = type(op).__name__
    if kind not in ("RedOpType", "ReduceOp") or not hasattr(op, "name"):
        return op
    name = str(op.name).upper()
    if name not in _TORCH_OPS:
        raise UsageError(f"op must be one of {', '.join(library.REDOPS)} or torch's ReduceOp."
                         f"{', ReduceOp.'.join(_TORCH_OPS)}, not ReduceOp.{name}")
    return _TORCH_OPS[name]


def rank_of(name: str, row: Collective, size: int, root: int | None, peer: int | None) -> int | None:
    """The root (default 0) or peer rank the collective takes, checked against ``size``; None
    for one that takes neither."""
    if row.rank is None and root is None and peer is None:  # the common case: neither taken nor given
        return None
    for kind, value in (("root", root), ("peer", peer)):
        if value is not None and row.rank != kind:
            raise UsageError(f"{name} takes no {kind}")
    if row.rank is None:
        return None
    value = root if row.rank == "root" else peer
    if value is None and row.rank == "root":
        value = 0
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
        raise UsageError(f"{row.rank} must be a rank in 0..{size - 1}, not {value!r}")
    return int(value)
