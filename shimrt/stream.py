"""Streams and events of a Device.

A :class:`Stream` is non-blocking with a fixed priority; an :class:`Event` is recorded on a stream,
waited for, or timed against another. Waits may be bounded (``timeout``): a ShimrtError then says
what did not finish instead of hanging.
"""

from __future__ import annotations

import datetime
import threading
from typing import TYPE_CHECKING, Any

from . import validate, waiting
from .errors import ShimrtError, UsageError
from .lifetime import Owning, finalizer

__all__ = ["PRIORITIES", "MAX_TIMEOUT", "timeout_seconds", "Stream", "Event"]

if TYPE_CHECKING:
    from .device import Device

#: The longest wait shimrt takes, in seconds (the threading module's limit, about 292 years): a
#: longer one would fail deep inside the wait instead of where it is given.
#: The named stream priorities (``Device.stream(priority)``, a policy's communication): the
#: device's least and greatest.
PRIORITIES = ("low", "high")
MAX_TIMEOUT = float(threading.TIMEOUT_MAX)


def timeout_seconds(value: Any, what: str = "timeout") -> float:
    """``value`` as a wait in seconds: a positive, finite number (never a bool) up to MAX_TIMEOUT,
    or a ``datetime.timedelta`` (what torch.distributed takes)."""
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    seconds = validate.number(value, what, positive=True)
    if seconds > MAX_TIMEOUT:
        raise UsageError(f"{what} must be a finite positive number of seconds up to {MAX_TIMEOUT:.0f}, not {value!r}")
    return seconds


def wait_until(query: Any, timeout: float, what: str) -> None:
    """Poll ``query`` until it is true; ShimrtError after ``timeout`` seconds."""
    if not waiting.until(query, timeout):
        raise ShimrtError(f"{what} did not finish within {timeout} s")


class Stream(Owning):
    """A non-blocking stream with a fixed priority (``priority`` is read back from the driver).
    Made by :meth:`Device.stream`."""

    def __init__(self, device: "Device", handle: Any):
        # Read by launch fast paths (shimrt.launchpath) on every launch: the device a launch may use
        # the handle on, and the handle; both None once closed.
        self.device, self.launch_handle = device, handle
        self.launch_device: Device | None = device
        self._finalizer = finalizer(self, device.driver.stream_destroy, handle)

    def __repr__(self) -> str:
        return f"<shimrt.Stream on device {self.device.index}{', closed' if self.launch_handle is None else ''}>"

    @property
    def priority(self) -> int:
        return self.device.driver.stream_priority(self.ref())

    @property
    def handle(self) -> int:
        """The stream as an integer, for other libraries."""
        return self.device.driver.stream_handle(self.ref())

    @property
    def closed(self) -> bool:
        return self.launch_handle is None

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)

    def ref(self) -> Any:
        """The backend's handle, for driver calls (UsageError once closed)."""
        if self.launch_handle is None:
            raise UsageError("the stream is closed")
        return self.launch_handle

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for the stream's work (ShimrtError after ``timeout`` seconds, a positive number, when
        given)."""
        if timeout is not None:
            timeout = timeout_seconds(timeout)
        # A partition's stream waits under its parent device's context: a green context left
        # current would move this thread's runtime users (torch) to another default stream.
        (getattr(self.device, "parent", None) or self.device).activate()
        if timeout is not None:
            wait_until(self.query, timeout, "the stream's work")
        self.device.driver.stream_synchronize(self.ref())

    def query(self) -> bool:
        """True when everything queued on the stream has finished."""
        return self.device.driver.stream_query(self.ref())

    def wait(self, event: "Event") -> None:
        """Make later work on this stream wait for ``event``."""
        if not isinstance(event, Event):
            raise UsageError(f"wait() takes a shimrt Event, not {event!r:.100}")
        self.device.driver.stream_wait_event(self.ref(), event.ref())

    def record(self, event: "Event | None" = None) -> "Event":
        """Record ``event`` (or a new timing event) on this stream and return it."""
        if event is not None and not isinstance(event, Event):
            raise UsageError(f"record() takes a shimrt Event or None, not {event!r:.100}")
        event = event if event is not None else self.device.event()
        event.record(self)
        return event

    def close(self) -> None:
        self.launch_handle = self.launch_device = None
        self._finalizer()


class Event(Owning):
    """A device event: record on a stream, wait for it, time between two of them. Made by
    :meth:`Device.event`."""

    def __init__(self, device: "Device", handle: Any, timing: bool):
        self.device, self._handle, self.timing = device, handle, timing
        self._finalizer = finalizer(self, device.driver.event_destroy, handle)

    def ref(self) -> Any:
        """The backend's handle, for driver calls (UsageError once closed)."""
        if self._handle is None:
            raise UsageError("the event is closed")
        return self._handle

    def record(self, stream: Any = None) -> "Event":
        """Record on ``stream`` (a shimrt Stream, None for the legacy default stream, or another
        library's stream)."""
        self.device.driver.event_record(self.ref(), self.device.stream_ref(stream))
        return self

    def query(self) -> bool:
        """True when the event has completed."""
        return self.device.driver.event_query(self.ref())

    def synchronize(self, timeout: float | None = None) -> None:
        """Wait for the event (ShimrtError after ``timeout`` seconds, a positive number, when given)."""
        if timeout is not None:
            timeout = timeout_seconds(timeout)
            wait_until(self.query, timeout, "the event")
        self.device.driver.event_synchronize(self.ref())

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded, both with timing)."""
        if not isinstance(end, Event):
            raise UsageError(f"elapsed_ms() takes a shimrt Event, not {end!r:.100}")
        if not (self.timing and end.timing):
            raise UsageError("elapsed time needs events created with timing=True")
        return self.device.driver.event_elapsed_ms(self.ref(), end.ref())

    def close(self) -> None:
        self._handle = None
        self._finalizer()
