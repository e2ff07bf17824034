"""The watchdog: one thread per process that bounds every wait on a communicator.

Blocking communicators (the default) let each NCCL call return as soon as its work is enqueued,
at NCCL's own speed, but nothing then polls them: a collective whose peer is gone would hold its
stream, and whoever waits on that stream, for good. So every collective shimrt enqueues is
followed by an event (:meth:`CommState.follow`), and this thread, as torch's ProcessGroupNCCL
watchdog does, looks at every open communicator a few times per timeout (:meth:`Watchdog.check`):

- a host call into NCCL still running after the timeout (a blocking call waiting for a peer that
  never answers) aborts the communicator: ncclCommAbort is what makes such a call return;
- otherwise, when no call is in flight: the collectives' events, oldest first; one that has not
  finished ``timeout`` seconds after it was enqueued aborts the communicator, and an
  asynchronous NCCL error (ncclCommGetAsyncError: a peer failed) aborts it at once.

The reason is kept on the communicator's :class:`CommState`, so its next call and any wait on it
raise it as a :class:`CollectiveError`. The logic works on :class:`CommState` alone (its events
need only ``record`` and ``query``, its communicator only ``poll`` and ``abort``), which the CPU
tests drive with a clock of their own.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from ..errors import CollectiveError
from ..lifetime import never_waiting

__all__ = ["CommState", "watchdog"]

#: How many followed collectives a communicator keeps before the caller reaps finished ones even
#: when it has spare events (a tight loop enqueues faster than the watchdog looks).
REAP_AT = 64
#: The watchdog looks at each communicator this many times per timeout, every 5 ms to 1 s.
LOOKS_PER_TIMEOUT = 20
SHORTEST_PAUSE, LONGEST_PAUSE = 0.005, 1.0
#: Seconds after an event within which a collective on the communicator's own stream gets none of
#: its own (see :meth:`CommState.follow`).
GAP = 0.002


class CommState:
    """What the callers of one communicator and the watchdog share.

    ``handle``: the ncclComm_t (a ctypes pointer; replaced by an empty one once closed or
    aborted: a call checks it is still the one it packed). ``lock``: held by every host call
    into NCCL on this communicator and by the watchdog while it looks, so an abort never frees
    the communicator under a call. ``entered``: when the host call in flight began (0: none).
    ``pending``: (event, when enqueued, what) of the collectives not yet seen finished, oldest
    first; ``tail``: (stream, when enqueued, what) of collectives no event covers yet.
    ``error``: why the communicator was aborted, raised by its next use.

    ``new_event()`` makes an event (``record(stream)``, ``query()``); ``poll()`` answers NCCL's
    asynchronous error (0: none); ``abort(reason)`` aborts the communicator.
    """

    def __init__(self, handle: Any, *, timeout: float, blocking: bool, new_event: Callable[[], Any],
                 poll: Callable[[], int], abort: Callable[[str], None], name: str = "communicator",
                 own: Any = None, record: Callable[[Any, Any], None] | None = None):
        self.handle = handle
        self.lock = threading.RLock()
        self.entered = 0.0
        self.call = ""
        self.pending: deque = deque()
        self.error: CollectiveError | None = None
        self.timeout, self.blocking, self.name = timeout, blocking, name
        self._new_event, self.poll, self.abort = new_event, poll, abort
        self._spare: list = []
        self._swap = threading.Lock()
        # ``own``: the communicator's own stream, which only it closes (under the lock), so the
        # watchdog's thread may record on it; ``record(event, stream)`` records from any thread.
        self.own, self.record = own, record or (lambda event, stream: event.record(stream))
        self.tail: tuple[Any, float, str] | None = None
        self.last_record = float("-inf")

    def take_handle(self, empty: Any) -> Any:
        """The handle, replaced by ``empty``; None when it was already taken (closed or aborted).
        Atomic: of two threads aborting at once, one frees the communicator."""
        with self._swap:
            handle = self.handle
            if not handle:
                return None
            self.handle = empty
            return handle

    def dead(self) -> CollectiveError:
        """The error a call on a closed or aborted communicator raises (also while the watchdog's
        abort is under way)."""
        return self.error or CollectiveError("the communicator is closed or was aborted")

    def follow(self, stream: Any, what: str, now: float) -> None:
        """Follow the collective ``what`` just enqueued on ``stream``: an event after it, for the
        watchdog. On the communicator's own stream (``own``), a collective that comes within
        :data:`GAP` seconds of the last event is left as the ``tail`` instead: an event between
        back-to-back NCCL kernels costs each a few microseconds of GPU time (measured: 135 against
        139 us per 32 MiB all_reduce on an H200), so the next event, or the watchdog's next look
        (:meth:`flush`), covers it, counted from when it was enqueued. Called with the lock held."""
        tail = self.tail
        if stream is self.own and now - self.last_record < GAP:
            if tail is None:  # the tail is on the own stream only: its oldest call is what it reports
                self.tail = (stream, now, what)
            return
        since = tail[1] if tail is not None and tail[0] is stream else now
        if tail is not None and tail[0] is stream:
            self.tail = None
        self._record(stream, what, since, now)

    def flush(self, now: float) -> None:
        """Cover the ``tail`` with an event (from the watchdog's thread too). Called with the lock held."""
        tail, self.tail = self.tail, None
        if tail is not None:
            self._record(tail[0], tail[2], tail[1], now)

    def _record(self, stream: Any, what: str, since: float, now: float) -> None:
        if not self._spare or len(self.pending) >= REAP_AT:  # recycle before making: a loop keeps a few events
            self.reap()
        event = self._spare.pop() if self._spare else self._new_event()
        self.record(event, stream)
        self.last_record = now
        self.pending.append((event, since, what))

    def reap(self) -> None:
        """Drop the finished collectives at the head of ``pending``, keeping their events."""
        pending, spare = self.pending, self._spare
        while pending and pending[0][0].query():
            spare.append(pending.popleft()[0])

    def release(self) -> None:
        """Close every event (the communicator is gone; one still pending is freed once done)."""
        events = [e for e, _, _ in self.pending] + self._spare
        self.pending.clear()
        self.tail = None
        self._spare = []
        for e in events:
            close = getattr(e, "close", None)
            if close is not None:
                close()

    def overdue(self, now: float) -> str | None:
        """Why the communicator must be aborted at ``now``, or None: its oldest unfinished
        collective outlived the timeout, or NCCL reports an asynchronous error. Called with the
        lock held."""
        if self.tail is not None and now - self.last_record >= GAP:
            self.flush(now)
        self.reap()
        if self.pending:
            _, since, what = self.pending[0]
            if now - since > self.timeout:
                return (f"{what} enqueued {now - since:.1f} s ago had not finished within the timeout of "
                        f"{self.timeout:g} s (is every rank running?)")
        state = self.poll()
        if state not in (0, 7):  # 7: ncclInProgress, a non-blocking call still settling
            return f"NCCL reported an asynchronous error ({state})"
        return None

    def stuck(self, now: float) -> str | None:
        """The reason when a blocking host call has been in flight longer than the timeout."""
        entered = self.entered
        if self.blocking and entered and now - entered > self.timeout:
            return (f"{self.call} did not return within {self.timeout:g} s (a peer that never answers?); the "
                    "communicator was aborted to release it")
        return None


class Watchdog:
    """Looks at every registered :class:`CommState` in a daemon thread of its own (started with
    the first registration) and aborts those :meth:`check` finds overdue."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, abort_in_thread: bool = True,
                 looks_itself: bool = True):
        # looks_itself=False: no thread, the owner calls check() (the CPU tests, on a clock of their own).
        self.clock, self.abort_in_thread, self.looks_itself = clock, abort_in_thread, looks_itself
        self._states: dict[int, CommState] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        #: Looks that raised past every guard (none expected; counted so a test can tell).
        self.failures = 0
        self.last_failure: Exception | None = None

    def register(self, state: CommState) -> None:
        """Follow ``state`` until :meth:`unregister`; starts the thread if it is not running."""
        with self._lock:
            self._states[id(state)] = state
            if self.looks_itself and not self.alive:
                self._thread = threading.Thread(target=self._run, args=(weakref.ref(self),),
                                                name="shimrt NCCL watchdog", daemon=True)
                self._thread.start()
        self._wake.set()  # a shorter timeout may need an earlier look

    @property
    def alive(self) -> bool:
        """Whether the looking thread runs (started by the first registration)."""
        return self._thread is not None and self._thread.is_alive()

    def unregister(self, state: CommState) -> None:
        with self._lock:
            self._states.pop(id(state), None)

    def watched(self) -> list[CommState]:
        with self._lock:
            return list(self._states.values())

    def check(self) -> list[tuple[CommState, str]]:
        """One look at every communicator: abort each one that is overdue (see the module
        docstring) and return (state, reason) for each aborted. A communicator whose look
        fails (its events or NCCL raised) is aborted with that error as the reason. Releases that
        garbage collection runs meanwhile wait for another thread (:func:`never_waiting`): one
        that waits for the GPU would wait for the collective this look is to abort."""
        with never_waiting():
            return self._check()

    def _check(self) -> list[tuple[CommState, str]]:
        aborted = []
        for state in self.watched():
            now = self.clock()
            reason = state.stuck(now)
            if reason is None:
                if not state.lock.acquire(blocking=False):
                    continue  # a call is in flight: look again next time
                try:
                    if not state.handle:
                        continue
                    try:
                        reason = state.overdue(now)
                    except Exception as exc:  # noqa: BLE001 - whatever it is, the thread must live on
                        reason = f"following its collectives failed: {exc}"
                    if reason is not None:
                        self._abort(state, reason)
                finally:
                    state.lock.release()
            else:
                self._abort(state, reason)  # without the lock: the stuck call holds it
            if reason is not None:
                aborted.append((state, reason))
        return aborted

    def _abort(self, state: CommState, reason: str) -> None:
        """Mark ``state`` aborted (its next use raises why, and no new call starts: callers check
        ``error`` under the lock), then abort the communicator on a thread of its own, so a slow
        ncclCommAbort never holds up the looks at the others."""
        self.unregister(state)
        state.error = CollectiveError(f"shimrt's watchdog aborted the {state.name}: {reason}")
        if self.abort_in_thread:
            threading.Thread(target=self._finish, args=(state, reason), name="shimrt NCCL abort", daemon=True).start()
        else:
            self._finish(state, reason)

    @staticmethod
    def _finish(state: CommState, reason: str) -> None:
        try:
            with never_waiting():  # a collected module's unload would wait for the kernel this abort ends
                state.abort(reason)
        except Exception as exc:  # noqa: BLE001 - ncclCommAbort stuck or failed: said on the next use too
            state.error = CollectiveError(f"{state.error}; then {exc}")

    def pause(self) -> float:
        """Seconds between looks: a twentieth of the shortest timeout, 5 ms to 1 s."""
        timeouts = [s.timeout for s in self.watched()]
        shortest = min(timeouts) if timeouts else LONGEST_PAUSE * LOOKS_PER_TIMEOUT
        return min(max(shortest / LOOKS_PER_TIMEOUT, SHORTEST_PAUSE), LONGEST_PAUSE)

    @staticmethod
    def _run(ref: "weakref.ref[Watchdog]") -> None:
        while True:
            dog = ref()
            if dog is None:
                return
            try:
                dog.check()
            except Exception as exc:  # noqa: BLE001 - a thread that died would leave every wait unbounded
                dog.failures += 1
                dog.last_failure = exc
            wake, pause = dog._wake, dog.pause()
            del dog  # the thread does not keep its watchdog alive
            wake.wait(pause)
            wake.clear()


_dog: Watchdog | None = None
_dog_lock = threading.Lock()


def watchdog() -> Watchdog:
    """The process's one watchdog (made at first use)."""
    global _dog
    with _dog_lock:
        if _dog is None:
            _dog = Watchdog()
        return _dog
