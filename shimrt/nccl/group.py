"""Handing calls to NCCL: one call or a group of them, settled and followed, never hanging.

A call is packed once into a :class:`Queued` (the communicator's state, the C function, its
arguments, the stream). :func:`run` makes one; :func:`group` queues the calls of several
communicators and :func:`run_group` hands them to NCCL between ncclGroupStart and ncclGroupEnd.
Either way the call is made under each communicator's lock (the watchdog never aborts a
communicator under a call), a non-blocking communicator's ncclInProgress is polled until it
settles within the timeout (:func:`settle`), and every collective is then followed by the
watchdog (:meth:`CommState.follow`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .. import waiting
from ..errors import CollectiveError, UsageError
from ..lifetime import never_waiting, never_waits_here
from . import library
from .watchdog import CommState

__all__ = ["Queued", "bounded", "settle", "run", "open_calls", "enqueue", "group", "refuse_shared_stream", "members_of",
           "run_group"]

if TYPE_CHECKING:
    from .communicator import Communicator

# The open group of this thread (see group()): ``calls`` is None outside one.
class _Open(threading.local):
    """This thread's open group: ``calls`` (None outside one), read with no AttributeError
    raised and caught on every call outside a group (400 ns a call, measured)."""
    calls: list | None = None


_GROUP = _Open()
_monotonic = time.monotonic


class Queued:
    """One call, checked and packed: ``comm`` (its Communicator), ``stream`` (what the call runs
    on, as given) and ``stream_handle`` (its integer handle), ``name`` (the NCCL function's
    name), ``function`` (the bound C function), ``args`` (its C arguments) and ``handle`` (the
    ncclComm_t among them, which must still be the communicator's when the call is made).
    :meth:`pack` readies a call that is made again and again."""

    __slots__ = ("comm", "state", "stream", "stream_handle", "name", "function", "args", "handle", "what")

    def __init__(self, comm: "Communicator", stream: Any, stream_handle: int, name: str, args: tuple,
                 handle: Any, what: str):
        self.comm, self.state, self.stream, self.stream_handle = comm, comm.state, stream, stream_handle
        # ``name`` comes from the collectives' table, a TABLE name: read straight from the library
        self.name, self.function, self.args, self.handle, self.what = name, getattr(comm.lib, name), args, handle, what

    def pack(self) -> None:
        """Convert the arguments to their C types once, and call the function bound without a
        prototype (:meth:`Library.packed`): for a call made again and again, which then costs
        the host no conversion per call."""
        self.function, self.args = self.comm.lib.packed(self.name, self.args)


def bounded(call: Callable[[], Any], name: str, timeout: float, hint: str = "") -> Any:
    """``call()`` (a ctypes call, which lets go of the GIL) on a daemon thread, for at most
    ``timeout`` seconds: its result, or its exception. CollectiveError when it does not return
    in time; the thread is left behind (NCCL cannot be interrupted safely from outside)."""
    box: dict[str, Any] = {}
    # the watchdog's abort calls from a never-waiting thread: a release that waits for the GPU must
    # not run on this helper before ncclCommAbort ends the kernel it would wait for (shimrt.lifetime)
    quiet = never_waits_here()

    def work() -> None:
        try:
            with never_waiting() if quiet else contextlib.nullcontext():
                box["result"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=work, name=f"shimrt {name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise CollectiveError(f"{name} did not complete within {timeout:g} s{hint}; NCCL's thread is left behind "
                              "(the process cannot reuse this GPU's NCCL state safely; exit and start again)")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def abort_all(comms: list["Communicator"]) -> CollectiveError | None:
    """Abort every communicator of ``comms``, each whatever the others do; the first error
    (an abort that did not return in time), or None."""
    first = None
    for c in comms:
        try:
            c.abort()
        except CollectiveError as exc:
            first = first or exc
    return first


def settle(comms: list["Communicator"], result: int, call: str, *, abort_every: bool = False) -> None:
    """Finish ``call``, which answered ``result`` for every communicator of ``comms``: nothing
    when it succeeded, CollectiveError when it failed, and when it answered ncclInProgress
    (a non-blocking communicator, or a group of them) poll each one's ncclCommGetAsyncError
    until none is in progress or one reports an error, for at most their longest timeout.
    Stuck communicators are aborted; ``abort_every`` (a grouped init, whose members are useless
    alone) aborts every member on any error."""
    if result == 0:
        return
    lib = comms[0].lib
    if result != library.IN_PROGRESS:
        try:
            lib.check(result, call, comms[0].state.handle if len(comms) == 1 else None)
        finally:
            if abort_every or result in library.BROKEN:
                abort_all(comms)
    states = dict.fromkeys(range(len(comms)), library.IN_PROGRESS)

    def settled() -> bool:
        for i, c in enumerate(comms):
            if states[i] == library.IN_PROGRESS:
                states[i] = c.async_error()
                if states[i] not in (0, library.IN_PROGRESS):
                    return True  # an error: no use waiting for the others
        return all(v != library.IN_PROGRESS for v in states.values())

    timeout = max(c.options.timeout for c in comms)
    # Spin for a millisecond first: a launch NCCL finishes on its own thread settles in tens of
    # microseconds, less than one sleep takes.
    if not waiting.until(settled, timeout, first=1e-4, longest=0.01, spin=1e-3):
        abort_all(comms)
        raise CollectiveError(f"{call} did not complete within {timeout:g} s (is every rank running?); "
                              f"the communicator{'s were' if len(comms) > 1 else ' was'} aborted")
    failed = [(i, v) for i, v in states.items() if v not in (0, library.IN_PROGRESS)]
    if failed:
        i, state = failed[0]
        handle = comms[i].state.handle
        stuck = [c for j, c in enumerate(comms) if abort_every or states[j] == library.IN_PROGRESS]
        try:
            lib.check(state, call, handle)
        finally:
            abort_all(stuck)  # those still in progress would never finish


def run(q: Queued) -> None:
    """Make the one call ``q`` (outside any group), settle it and follow it."""
    state = q.state
    lock = state.lock
    lock.acquire()  # acquire/release rather than with: a loop's whole host cost is this function's
    try:
        if state.handle is not q.handle or state.error is not None:
            raise state.dead()
        start = _monotonic()
        state.call, state.entered = q.name, start
        try:
            result = q.function(*q.args)
            if result:
                settle([q.comm], result, q.name)
        finally:
            state.entered = 0.0
        state.follow(q.stream, q.what, start)  # counted from the call: its settling is part of the wait
    finally:
        lock.release()


def open_calls() -> list | None:
    """The calls queued in this thread's open :func:`group`, or None outside one."""
    return _GROUP.calls


def enqueue(calls: list, q: Queued) -> None:
    """Queue ``q`` in an open group, after refusing two ranks of one communicator on one stream."""
    refuse_shared_stream(q.what, q, calls)
    calls.append(q)


@contextlib.contextmanager
def group(*comms: "Communicator") -> Iterator[tuple[Communicator, ...]]:
    """``with group(c0, c1):`` fuses the collectives inside, on any communicators (each rank of
    this process, for one), into one NCCL launch. Several ranks in one thread must be grouped: a
    lone collective of one rank waits for the others for good.

    The calls are checked as they are made and handed to NCCL together when the block ends
    (ncclGroupStart, the calls, ncclGroupEnd), so a refused call (two ranks of one communicator
    on one stream, which would wait for each other for good) or an exception in the block leaves
    NCCL untouched. When NCCL answers ncclInProgress (non-blocking communicators), every
    communicator of the group is polled until it settles, within the timeout. Groups nest: the
    outermost one hands the calls over."""
    if not comms or not all(isinstance(getattr(c, "state", None), CommState) for c in comms):
        raise UsageError(f"group() takes one or more shimrt.nccl.Communicators, not {comms!r:.200}")
    outer = open_calls()
    if outer is not None:  # nested: the outer group makes the calls, without this one's on an error
        mark = len(outer)
        try:
            yield comms
        except BaseException:
            del outer[mark:]
            raise
        return
    _GROUP.calls = []
    try:
        yield comms
        calls = _GROUP.calls
    finally:
        _GROUP.calls = None
    if calls:
        run_group(members_of([*comms, *(q.comm for q in calls)]), calls)


def refuse_shared_stream(what: str, q: Queued, earlier: list[Queued]) -> None:
    """UsageError when ``q`` would share its stream with another rank's call of the same
    communicator among ``earlier``: in one group, two ranks on one stream wait for each other
    for good."""
    comm = q.comm
    for other in earlier:
        if other.comm.unique_id == comm.unique_id and other.comm.rank != comm.rank \
                and other.stream_handle == q.stream_handle:
            raise UsageError(f"{what} of rank {comm.rank} on the stream of rank {other.comm.rank}'s call in the same "
                             "group: two ranks of one communicator need a stream each (two ranks of one "
                             "communicator on one stream wait for each other for good); pass each rank its own, "
                             "e.g. its comm.stream")


def members_of(comms: list["Communicator"]) -> list["Communicator"]:
    """The distinct communicators of a group, in order; UsageError unless they share one NCCL."""
    members = list(dict.fromkeys(comms))
    if any(c.lib is not members[0].lib for c in members):
        raise UsageError("a group takes communicators of one NCCL library")
    return members


def run_group(members: list["Communicator"], calls: list[Queued]) -> None:
    """``calls`` between ncclGroupStart and ncclGroupEnd under every member's lock, settled over
    ``members`` and followed."""
    lib = members[0].lib
    with contextlib.ExitStack() as held:
        for c in sorted(members, key=id):  # one order everywhere: two groups never wait on each other
            held.enter_context(c.state.lock)
        for q in calls:
            if q.state.handle is not q.handle or q.state.error is not None:
                raise q.state.dead()
        start = time.monotonic()
        for c in members:
            c.state.call, c.state.entered = "ncclGroupEnd", start
        try:
            lib.group_start()
            failed = None
            try:
                for q in calls:
                    result = q.function(*q.args)
                    if result not in (0, library.IN_PROGRESS) and failed is None:
                        failed = (result, q.name, q.state.handle)
            finally:
                end = lib.group_end()  # a group is always closed, even after a failed call
            if failed is not None:
                lib.check(failed[0], f"{failed[1]} (in a group)", failed[2])
            settle(members, end, "ncclGroupEnd")
        finally:
            for c in members:
                c.state.entered = 0.0
        for q in calls:
            q.state.follow(q.stream, q.what, start)
