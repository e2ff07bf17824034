"""Prepared calls: a collective checked and packed once (:meth:`Communicator.prepare`), and several
of them made one group once (:func:`prepare_group`), for the loops that repeat them on the same
buffers every step. Each call still refuses what has gone away since (a closed or aborted
communicator, a closed stream, a freed shimrt Buffer) before NCCL sees it."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .group import Queued, enqueue, members_of, open_calls, refuse_shared_stream, run, run_group

__all__ = ["PreparedCall", "PreparedGroup", "prepare_group"]


class _Live:
    """What a prepared call checks where there is no shimrt object to check: always live."""
    device_pointer, closed = 1, False


_ALWAYS = _Live()


class _AllOf:
    """Views and their bases, checked together: no pointer once any of them is freed."""

    def __init__(self, buffers: list) -> None:
        self.buffers = buffers

    @property
    def device_pointer(self) -> int | None:
        return None if any(b.device_pointer is None for b in self.buffers) else 1


class PreparedCall:
    """One collective as :meth:`Communicator.prepare` packed it: calling it makes the call
    (queued inside an open :func:`~shimrt.nccl.group`). ``queued`` is the packed call."""

    __slots__ = ("queued", "_first", "_last", "_stream")

    def __init__(self, queued: Queued, buffers: list, stream: Any):
        # What each call checks, as plain attribute reads (the call is a loop's whole host cost):
        # the communicator's handle (close and abort replace it), the stream when it is a shimrt
        # Stream, and the memory of each shimrt Buffer (its base's pointer is None once freed).
        held = [b for b in buffers if b is not None and hasattr(b, "array_info")]
        held = list({id(b): b for b in held + [b.base for b in held]}.values()) or [_ALWAYS]
        self._first: Any = held[0] if len(held) <= 2 else _AllOf(held)
        self._last: Any = held[-1] if len(held) <= 2 else _ALWAYS
        self._stream = stream if hasattr(stream, "closed") else _ALWAYS
        queued.pack()
        self.queued = queued

    def live(self) -> bool:
        """Whether the call can still be made (else :meth:`refuse` says why)."""
        q = self.queued
        return q.state.handle is q.handle and not self._stream.closed and self._first.device_pointer is not None \
            and self._last.device_pointer is not None

    def refuse(self) -> None:
        """Raise why the call cannot be made; nothing when it can."""
        q = self.queued
        if q.state.handle is not q.handle:
            raise q.state.dead()
        if self._stream.closed:
            raise UsageError("the stream this collective was prepared for is closed")
        if self._first.device_pointer is None or self._last.device_pointer is None:
            raise UsageError("the buffer has been freed")

    def __call__(self) -> None:
        q = self.queued
        if q.state.handle is q.handle and not self._stream.closed and self._first.device_pointer is not None \
                and self._last.device_pointer is not None:
            calls = open_calls()
            if calls is None:
                run(q)
            else:
                enqueue(calls, q)
            return
        self.refuse()

    def __repr__(self) -> str:
        q = self.queued
        return f"<shimrt prepared {q.what} of rank {q.comm.rank}/{q.comm.size}>"


class PreparedGroup:
    """Prepared calls made one group once (:func:`prepare_group`)."""

    __slots__ = ("calls", "_queued", "_members")

    def __init__(self, calls: tuple[PreparedCall, ...]):
        self.calls = calls
        self._queued = [c.queued for c in calls]
        for i, q in enumerate(self._queued):
            refuse_shared_stream("prepare_group()", q, self._queued[:i])
        self._members = members_of([q.comm for q in self._queued])

    def __call__(self) -> None:
        for call in self.calls:
            if not call.live():
                call.refuse()
        outer = open_calls()
        if outer is not None:
            outer.extend(self._queued)
            return
        run_group(self._members, self._queued)

    def __repr__(self) -> str:
        return f"<shimrt prepared group of {len(self.calls)} calls>"


def prepare_group(*calls: PreparedCall) -> PreparedGroup:
    """Calls made by :meth:`Communicator.prepare` (one per rank of this process, say) as one
    group, checked once: a function of no arguments that refuses what each call refuses (a
    closed communicator or stream, a freed Buffer), then hands them to NCCL between
    ncclGroupStart and ncclGroupEnd and polls non-blocking communicators, as
    :func:`~shimrt.nccl.group` does. Inside an open group its calls join that group."""
    if not calls or not all(isinstance(c, PreparedCall) for c in calls):
        raise UsageError(f"prepare_group() takes calls made by Communicator.prepare, not {calls!r:.200}")
    return PreparedGroup(calls)
