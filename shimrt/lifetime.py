"""Object lifetime shared by everything that owns a driver resource.

Every such object frees it on ``close()``, on leaving its ``with`` block, when it is garbage
collected, or at interpreter exit (children before the device). Errors during that late cleanup
are ignored rather than printed: the driver may already be gone.

Garbage collection runs finalizers on whatever thread allocates at the time, and a release can wait
for the GPU (freeing memory or unloading a module waits for running kernels). A thread that must
never wait (:func:`never_waiting`: shimrt's NCCL watchdog, the one that aborts a collective stuck
on the GPU) leaves such releases to the next release on another thread, or to the exit: on an H100
at db6b765 the watchdog, starting its abort with the communicator's lock held, ran a collected
module's cuModuleUnload, which waited for the stuck collective the abort was to end, and the
test's rank waited on that lock until pytest's timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections import deque
from typing import Any, Callable, Iterator, Self

__all__ = ["finalizer", "close_each", "Closing", "Owning", "never_waiting", "never_waits_here"]

_thread = threading.local()
#: (release, args) that a never-waiting thread left for later. No lock: a collection that starts
#: inside a locked section would run a finalizer that waits on the lock its own thread holds; a
#: deque's append and popleft are atomic, so each release is taken once, by whichever thread.
_left: deque[tuple[Callable[..., Any], tuple]] = deque()
_at_exit = [False]  # whether the exit's release of what was left is registered


@contextlib.contextmanager
def never_waiting() -> Iterator[None]:
    """Within: releases that garbage collection runs on this thread are left to the next release
    on another thread, or to the exit (see the module's docstring)."""
    before = never_waits_here()
    _thread.never_waits = True
    try:
        yield
    finally:
        _thread.never_waits = before


def never_waits_here() -> bool:
    """Whether this thread is within :func:`never_waiting` (a helper thread it starts for its own
    work should be too)."""
    return bool(getattr(_thread, "never_waits", False))


def _quiet(release: Callable[..., Any], *args) -> None:
    """Run a release call from a finalizer; the driver may already be gone at exit. On a
    never-waiting thread it is left for later (:func:`never_waiting`)."""
    if never_waits_here():
        _left.append((release, args))
        if not _at_exit[0]:  # registered once, after weakref.finalize's: at exit it runs first
            _at_exit[0] = True
            atexit.register(_release_left)
        return
    _release_left()
    try:
        release(*args)
    except Exception:
        pass


def _release_left() -> None:
    """Run the releases a never-waiting thread left, oldest first, each once (a release's own cost
    where none was left: one length check)."""
    while _left:
        try:
            release, args = _left.popleft()
        except IndexError:
            return
        try:
            release(*args)
        except Exception:
            pass


def finalizer(owner: object, release: Callable[..., Any], *args: Any) -> weakref.finalize:
    """A finalizer that calls ``release(*args)`` once: when called, when ``owner`` is collected, or
    at exit; never raising from the late paths."""
    return weakref.finalize(owner, _quiet, release, *args)


def close_each(things: list) -> None:
    """Close every one of ``things`` in order, each whatever the others do (the list is emptied);
    the first error after all."""
    first = None
    for thing in things:
        try:
            thing.close()
        except Exception as exc:  # noqa: BLE001 - the rest must still be closed
            first = first or exc
    things.clear()
    if first is not None:
        raise first


class Closing:
    """``with obj:`` closes ``obj`` on leaving the block."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Owning(Closing):
    """An object that owns one driver resource, released once by its ``_finalizer``."""

    _finalizer: weakref.finalize

    def keep_open(self) -> None:
        """Never release the resource: not on ``close()``, collection or exit; the process's end
        frees it. For a resource other code may still use during its own teardown, after anything
        shimrt could close (torch's caching allocator records an event on every stream a freed
        tensor was recorded on, whenever that tensor goes)."""
        self._finalizer.detach()
