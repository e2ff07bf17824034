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

__all__ = ["Interposer"]

#: Why a launch that should be padded went unchanged: its limit is raised at the next settle.
DEFERRED = "its dynamic shared memory limit is raised at the block's end; launched unchanged until then"


class Interposer:
    """Shapes the launches inside its block on ``device`` (see the module's docstring). Usable
    for many blocks (one per training step); :meth:`close` restores the dynamic shared memory
    limits it raised."""

    def __init__(self, device: Device, cap: int, footprint: Footprint | None = None):
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        cap = validate.integer(cap, "cap", least=1)
        if footprint is not None and not isinstance(footprint, Footprint):
            raise UsageError(f"footprint must be an occupancy.Footprint or None, not {footprint!r}")
        self.device, self.cap, self.footprint = device, cap, footprint
        self.decisions = Decisions(device.target, cap, footprint)
        self._attributes: dict[int, dict] = {}   # handle -> its attributes, read outside callbacks
        self._limits: dict[int, int] = {}        # handle -> the dynamic smem it may launch with now
        self._raised: dict[int, int] = {}        # handle -> its own limit, before this raised it
        self._first_seen: dict[int, dict] = {}   # handle -> its first launch, to read at the next settle
        self._wants: dict[int, int] = {}         # handle -> a padded size above its limit
        self._lock = threading.Lock()            # callbacks come from every launching thread
        self._names: dict[int, str] = {}         # handle -> the kernel's name, as CUPTI gave it
        self._inner: Any = None
        self._last: Any = None
        self.launches = 0

    def _launch(self, handle: int, launch: dict) -> Launch:
        attributes = self._attributes[handle]
        return Launch(self._names[handle], launch["grid_x"] * launch["grid_y"] * launch["grid_z"],
                      launch["block_x"] * launch["block_y"] * launch["block_z"], attributes["registers"],
                      attributes["static_smem"], launch["dynamic_smem"], launch["cluster_blocks"],
                      launch["cooperative"])

    def _rewrite(self, launch: dict) -> int | None:
        handle = launch["f"]
        self.launches += 1
        if handle not in self._attributes:
            with self._lock:
                if handle not in self._first_seen:
                    self._first_seen[handle] = {k: v for k, v in launch.items() if not k.endswith("_at")}
                    self._names.setdefault(handle, launch.get("name") or f"function {handle:#x}")
            return None
        shape = self._launch(handle, launch)
        decision = self.decisions(handle, shape)
        if decision.action != "pad":
            self.decisions.record(shape.name, False, decision.reason)
            return None
        if decision.dynamic_smem > self._limits[handle]:
            with self._lock:
                self._wants[handle] = max(self._wants.get(handle, 0), decision.dynamic_smem)
            self.decisions.record(shape.name, False, DEFERRED)
            return None
        self.decisions.record(shape.name, True)
        return decision.dynamic_smem

    def settle(self) -> None:
        """Outside the callbacks: read the attributes of the functions first seen, and raise the
        dynamic shared memory limit of those whose padding needs it (worked out from the first
        launch seen, so the next launch of the same shape is padded)."""
        with self._lock:
            seen, self._first_seen = self._first_seen, {}
            wants, self._wants = self._wants, {}
        for handle, launch in seen.items():
            if handle not in self._attributes:
                attributes = self.device.foreign_function_attributes(handle)
                # The limit before the attributes: a callback on another thread that finds the
                # attributes reads the limit next.
                self._limits[handle] = attributes["max_dynamic_smem"]
                self._attributes[handle] = attributes
                decision = self.decisions(handle, self._launch(handle, launch))
                if decision.action == "pad":
                    wants[handle] = max(wants.get(handle, 0), decision.dynamic_smem)
        for handle, nbytes in wants.items():
            if nbytes > self._limits[handle]:
                self.device.set_foreign_max_dynamic_smem(handle, nbytes)
                self._raised.setdefault(handle, self._limits[handle])
                self._limits[handle] = nbytes

    def close(self) -> None:
        """Put back the dynamic shared memory limits this raised (a raised limit changes no
        launch by itself: it only allows larger ones)."""
        if self._inner is not None:
            raise ShimrtError("close the Interposer after its block has ended")
        raised, self._raised = self._raised, {}
        for handle, nbytes in raised.items():
            self.device.set_foreign_max_dynamic_smem(handle, nbytes)
            self._limits[handle] = nbytes

    def report(self) -> dict:
        """What was padded (launches per kernel), left alone (launches per kernel and reason),
        the functions known, and failures inside the callbacks."""
        inner = self._inner or self._last
        return {"launches": self.launches, "padded": dict(self.decisions.padded),
                "skipped": {f"{name}: {why}": n for (name, why), n in self.decisions.skipped.items()},
                "functions": len(self._attributes),
                # kernel -> its handle and the dynamic shared memory limit raised, from and to
                "raised_limits": {self._names[h]: {"handle": h, "from": old, "to": self._limits[h]}
                                  for h, old in self._raised.items()},
                "failures": list(inner.failures) if inner is not None else [],
                # graphs captured before the block and replayed in it: their kernels are not shaped
                "graph_launches_not_shaped": inner.graph_launches if inner is not None else 0,
                "failure_count": inner.failure_count if inner is not None else 0}

    def __enter__(self) -> "Interposer":
        if self._inner is not None:
            raise ShimrtError("this Interposer is already active")
        inner = self.device.interpose_launches(self._rewrite)
        inner.__enter__()  # may fail (CUPTI held by another tool): nothing is active then
        self._inner = inner
        return self

    def __exit__(self, *exc: Any) -> None:
        inner, self._inner = self._inner, None
        self._last = inner
        inner.__exit__(*exc)
        self.settle()
