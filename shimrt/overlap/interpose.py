"""Shape every kernel launched inside a block, whoever launches it: PyTorch, cuBLAS, Triton.

``with Interposer(device, cap=2, footprint=...) as ip: step()`` pads each launch's dynamic
shared memory so that at most ``cap`` of its blocks stay resident per SM, leaving room for the
communication kernel's ``footprint``, as :func:`shimrt.overlap.foreign.decide` works it out
from the function's own attributes; cluster, cooperative and persistent one-wave launches, and
those already under the cap, are left alone and reported.

Driver calls are not made inside a launch callback. A function seen for the first time is
launched unchanged, and its attributes are read (and its dynamic shared memory limit raised,
where the padding needs it) when the block ends or at :meth:`Interposer.settle`, outside the
callbacks. A training loop therefore runs one step to learn its kernels, and every later step is
shaped. ``ip.report()`` says what was padded, what was skipped and why, what was first seen,
and any failure; a failure inside a callback leaves that launch as it was.
"""

from __future__ import annotations

import threading
from typing import Any

from .. import validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..occupancy import Footprint
from .foreign import Decisions, Launch


class Interposer:
    """Shapes the launches inside its block on ``device`` (see the module's docstring)."""

    def __init__(self, device: Any, cap: int, footprint: Footprint | None = None):
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        cap = validate.integer(cap, "cap", least=1)
        if footprint is not None and not isinstance(footprint, Footprint):
            raise UsageError(f"footprint must be an occupancy.Footprint or None, not {footprint!r}")
        self.device, self.cap, self.footprint = device, cap, footprint
        self.decisions = Decisions(device.target, cap, footprint)
        self._attributes: dict[int, dict] = {}   # handle -> its attributes, read outside callbacks
        self._limits: dict[int, int] = {}        # handle -> the dynamic smem it may launch with
        self._first_seen: set[int] = set()       # handles to read at the next settle
        self._wants: dict[int, int] = {}         # handle -> a padded size above its limit
        self._lock = threading.Lock()            # callbacks come from every launching thread
        self._names: dict[int, str] = {}         # handle -> the kernel's name, as CUPTI gave it
        self._inner: Any = None
        self._last: Any = None
        self.launches = 0

    def _rewrite(self, launch: dict) -> int | None:
        handle = launch["f"]
        self.launches += 1
        attributes = self._attributes.get(handle)
        if attributes is None:
            with self._lock:
                self._first_seen.add(handle)
                self._names.setdefault(handle, launch.get("name") or f"function {handle:#x}")
            return None
        grid = launch["grid_x"] * launch["grid_y"] * launch["grid_z"]
        block = launch["block_x"] * launch["block_y"] * launch["block_z"]
        decision = self.decisions(handle, Launch(self._names.get(handle, f"function {handle:#x}"), grid, block,
                                                 attributes["registers"], attributes["static_smem"],
                                                 launch["dynamic_smem"], launch["cluster_blocks"],
                                                 launch["cooperative"]))
        if decision.action != "pad":
            return None
        if decision.dynamic_smem > self._limits.get(handle, attributes["max_dynamic_smem"]):
            with self._lock:
                self._wants[handle] = max(self._wants.get(handle, 0), decision.dynamic_smem)
            return None  # the limit is raised at the next settle; until then, unchanged
        return decision.dynamic_smem

    def settle(self) -> None:
        """Outside the callbacks: read the attributes of the functions first seen, and raise
        the dynamic shared memory limit of those whose padding needs it."""
        with self._lock:
            seen, self._first_seen = self._first_seen, set()
            wants, self._wants = self._wants, {}
        for handle in seen:
            if handle not in self._attributes:
                self._attributes[handle] = self.device.foreign_function_attributes(handle)
        for handle, nbytes in wants.items():
            self.device.set_foreign_max_dynamic_smem(handle, nbytes)
            self._limits[handle] = nbytes

    def report(self) -> dict:
        """What was padded (launches per kernel), skipped (launches per kernel and reason), first
        seen (functions whose launches went unchanged until a settle) and failed."""
        inner = self._inner or self._last
        return {"launches": self.launches, "padded": dict(self.decisions.padded),
                "skipped": {f"{name}: {why}": n for (name, why), n in self.decisions.skipped.items()},
                "functions": len(self._attributes),
                "failures": list(inner.failures) if inner is not None else [],
                # graphs captured before the block and replayed in it: their kernels are not shaped
                "graph_launches_not_shaped": inner.graph_launches if inner is not None else 0,
                "failure_count": inner.failure_count if inner is not None else 0}

    def __enter__(self) -> "Interposer":
        if self._inner is not None:
            raise ShimrtError("this Interposer is already active")
        self._inner = self.device.interpose_launches(self._rewrite)
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        inner, self._inner = self._inner, None
        self._last = inner
        inner.__exit__(*exc)
        self.settle()
