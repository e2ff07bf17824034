"""Object lifetime shared by everything that owns a driver resource.

Every such object frees it on ``close()``, on leaving its ``with`` block, when it is garbage
collected, or at interpreter exit (children before the device). Errors during that late cleanup
are ignored rather than printed: the driver may already be gone.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Self

__all__ = ["finalizer", "close_each", "Closing", "Owning"]


def _quiet(release: Callable[..., Any], *args) -> None:
    """Run a release call from a finalizer; the driver may already be gone at exit."""
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
