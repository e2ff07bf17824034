"""A one-line progress bar on stderr for long benchmark runs (elapsed time and an estimate)."""

from __future__ import annotations

import sys
import time


class Progress:
    """``step(label)`` before each of ``total`` units of work; ``close()`` at the end."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24, stream=None):
        self.total, self.enabled, self.width = max(int(total), 1), enabled, width
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
