"""``auto``: measure the planner's candidates on the device and keep the winner per workload.

:func:`search` runs every choice :func:`~shimrt.overlap.planner.candidates` does not rule out
(with fewer repeats than a report) and returns the fastest; :class:`ChoiceCache` keeps what it
picked per device model and workload in a JSON file under ``SHIMRT_CACHE_DIR``, so a later run
starts from the answer. The planner stays pure arithmetic; the file I/O and the measuring live
here.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import choose, validate
from ..config import cache_folder
from ..errors import ShimrtError, UsageError
from . import planner
from .planner import Choice

__all__ = ["ChoiceCache", "search"]

if TYPE_CHECKING:
    from .engine import Engine


class ChoiceCache:
    """What auto chose per workload, in a JSON file (one per device model), written atomically."""

    def __init__(self, directory: Path, device_key: str):
        directory = cache_folder(Path(directory), "the cache of auto's choices",
                                 ": point SHIMRT_CACHE_DIR at a folder, or pass --fresh")
        self.path = directory / f"overlap-auto-{hashlib.sha256(device_key.encode()).hexdigest()[:16]}.json"
        self.device_key = device_key

    def _read(self) -> dict:
        """The file's content when it is this device's and well formed (a "choices" object);
        else nothing: a file of another device, version or hand is measured again and rewritten."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        if not isinstance(data, dict) or data.get("device") != self.device_key \
                or not isinstance(data.get("choices", {}), dict):
            return {}
        return data

    def get(self, key: str) -> Choice | None:
        entry = self._read().get("choices", {}).get(key)
        if entry is None:
            return None
        try:
            return Choice.from_dict(entry)
        except (UsageError, TypeError):
            return None  # written by another version: measure again

    def put(self, key: str, choice: Choice) -> None:
        data = self._read() or {"device": self.device_key, "choices": {}}
        data.setdefault("choices", {})[key] = choice.as_dict()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".overlap-auto-")
        except OSError as exc:  # a file where a folder above it should be, no permission, a full disk
            raise UsageError(f"the cache of auto's choices cannot be written in {str(self.path.parent)!r}: "
                             f"{exc.strerror or exc}; point SHIMRT_CACHE_DIR at a folder, or pass --fresh") from None
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def pick(choices: list[Choice], measure: Callable[[Choice], float]) -> tuple[Choice, dict[Choice, float]]:
    """The choice with the least ``measure(choice)`` (a makespan); also every measured value
    (:func:`shimrt.choose.pick`; inf for a choice the device refused, which is never kept unless
    all were)."""
    if not choices:
        raise ShimrtError("auto has no feasible choice to measure")
    times = {c: float(measure(c)) for c in choices}
    try:
        return choose.fastest(times), times
    except ShimrtError:  # every one refused (each in the caller's rejected list): the first, never cached
        return choices[0], times


def key(engine: "Engine") -> str:
    """What auto's cached choice depends on: the workload and its communication."""
    a = engine.schedule.of("comm")[0].comm
    fp = a.footprint()
    return f"{engine.schedule.label}|{engine.comm_kind}|{a.blocks()}x{fp.threads}|{fp.registers}r|" \
           f"{fp.static_smem}+{fp.dynamic_smem}B"


def search(engine: "Engine", cache: ChoiceCache | None = None, key_: str | None = None, threads: Any = (None,),
           blocks: Any = (None,), progress: Any = None) -> tuple[Choice, dict[Choice, float], list[planner.Rejected]]:
    """Auto's choice for ``engine``'s schedule: a cached one, or the fastest of the planner's
    candidates. Returns (choice, {choice: makespan}, rejected). Every argument is checked first:
    a cached choice skips the planner, which checks ``threads`` and ``blocks`` too."""
    if cache is not None and not isinstance(cache, ChoiceCache):
        raise UsageError(f"cache must be an auto.ChoiceCache or None, not {cache!r}")
    if key_ is not None:
        validate.text(key_, "key")
    if progress is not None and not callable(progress):
        raise UsageError(f"progress must be a function of a Choice, or None, not {progress!r:.100}")
    planner.sweeps(engine.problem(), threads, blocks)
    key_ = key_ or key(engine)
    if cache is not None:
        cached = cache.get(key_)
        if cached is not None:
            return cached, {}, []
    feasible, rejected = planner.candidates(engine.problem(), threads=threads, blocks=blocks)
    if engine.comm_kind != "stand-in":
        # NCCL's CTAs and threads are fixed when its communicator is made, and its kernels
        # have not been tried in a green context: only the rest is measured.
        unfit = [c for c in feasible if c.comm_blocks or c.comm_threads or c.policy == "partition"]
        rejected += [planner.Rejected(c.describe(), "not with NCCL (fixed per communicator, or untried in a "
                                                    "green context)") for c in unfit]
        feasible = [c for c in feasible if c not in unfit]
    quick = max(3, engine.repeats // 2)

    def makespan(c: Choice) -> float:
        if progress is not None:
            progress(c)
        try:
            return float(np.median([t.makespan for t in engine.run(c, repeats=quick)]))
        except ShimrtError as exc:  # a choice the device refuses (e.g. a partition size)
            rejected.append(planner.Rejected(c.describe(), str(exc)))
            return float("inf")

    best, times = pick(feasible, makespan)
    if cache is not None and np.isfinite(times[best]):
        cache.put(key_, best)
    return best, times, rejected
