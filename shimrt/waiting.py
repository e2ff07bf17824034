"""Bounded waiting: poll a condition with growing pauses, never past a deadline."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["until"]


def until(done: Any, timeout: float, first: float = 1e-5, longest: float = 1e-3, spin: float = 0.0) -> bool:
    """Call ``done()`` until it returns true (then True) or ``timeout`` seconds pass (then False).

    For the first ``spin`` seconds ``done()`` is called back to back (a sleep costs tens of
    microseconds, more than what finishes within them); then pauses start at ``first`` seconds
    and double up to ``longest``, so short waits stay short and long ones do not spin.
    """
    start = time.monotonic()
    deadline = start + timeout
    if spin > 0:
        stop_spinning = start + min(spin, timeout)
        while not done():
            if time.monotonic() > stop_spinning:
                break
        else:
            return True
    pause = first
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, longest)
    return True
