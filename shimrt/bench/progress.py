"""A one-line progress bar on stderr for long benchmark runs (elapsed time and an estimate)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .. import validate

__all__ = ["Progress"]


class Progress:
    """``step(label)`` before each of ``total`` units of work; ``close()`` at the end."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24, stream: TextIO | None = None):
        # max(1): a run of no work still draws a bar without dividing by zero.
        self.total = max(validate.integer(total, "total", least=0), 1)
        self.enabled = validate.boolean(enabled, "enabled")
        self.width = validate.integer(width, "width", least=1)
        self.stream = stream or sys.stderr
        self.done = 0
        self.start = time.monotonic()

    def step(self, label: str = "") -> None:
        if not self.enabled:
            self.done += 1
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        self.done += 1
        print(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s (~{eta:.0f}s left) {label[:60]:60s}",
              end="", file=self.stream, flush=True)

    def close(self) -> None:
        if self.enabled:
            print(f"\r{' ' * (self.width + 100)}\r", end="", file=self.stream, flush=True)
