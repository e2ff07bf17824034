"""Shaping kernels shimrt did not compile (PyTorch's, cuBLAS's, Triton's): the decision per launch.

A launch interposer (CUPTI's driver-API callbacks on CUDA) sees each launch's function, grid,
block and dynamic shared memory; :func:`decide` says, from those and the function's attributes,
whether to pad its dynamic shared memory so that at most ``cap`` of its blocks stay resident per
SM beside the communication ``footprint``, and by how much, or why it is left alone:

- cluster and cooperative launches, whose blocks must be co-resident or co-scheduled;
- persistent one-wave kernels (no more blocks than SMs), which a cap cannot change and
  padding could only break;
- kernels whose natural residency is already at most the cap;
- kernels that cannot leave the footprint room at any residency, or whose padded size would pass
  the device's per-block limit.

Pure arithmetic on :mod:`shimrt.occupancy`; no driver call. The padding is worked out once per
(function, block size, dynamic shared memory) and reused: :class:`Decisions` caches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import occupancy, validate
from ..errors import ShimrtError, UsageError
from ..targets import Target
from ..targets import get as get_target

__all__ = ["Launch", "Decisions"]

#: What a decision does: pad the launch's dynamic shared memory, or leave the launch as it is.
ACTIONS = ("pad", "skip")


@dataclass(frozen=True)
class Launch:
    """What the interposer knows of one launch: the function's registers per thread and static
    shared memory (its attributes), and the launch's grid (blocks in all), threads per block,
    dynamic shared memory, cluster size (1: none) and whether it is cooperative."""

    name: str
    grid_blocks: int
    block_threads: int
    registers: int
    static_smem: int
    dynamic_smem: int = 0
    cluster_blocks: int = 1
    cooperative: bool = False

    def __post_init__(self) -> None:
        validate.text(self.name, "Launch.name", empty=True)
        for name, least in (("grid_blocks", 1), ("block_threads", 1), ("registers", 0), ("static_smem", 0),
                            ("dynamic_smem", 0), ("cluster_blocks", 1)):
            object.__setattr__(self, name, validate.integer(getattr(self, name), f"Launch.{name}", least=least))
        object.__setattr__(self, "cooperative", validate.boolean(self.cooperative, "Launch.cooperative"))


@dataclass(frozen=True)
class Decision:
    """``action`` "pad": launch with ``dynamic_smem`` bytes (the kernel's own plus the padding),
    so ``resident_blocks`` fit per SM where ``natural_blocks`` did; "skip": launch unchanged,
    ``reason`` says why. ``needs_opt_in``: the padded size is above the default per-block limit,
    so the function's limit must be raised (outside the launch callback) before it applies."""

    action: str
    reason: str
    dynamic_smem: int
    natural_blocks: int
    resident_blocks: int
    needs_opt_in: bool = False

    @property
    def padding(self) -> int:
        return 0 if self.action == "skip" else self.dynamic_smem


def decide(target: Target | str, launch: Launch, cap: int, footprint: occupancy.Footprint | None = None) -> Decision:
    """The decision for ``launch`` on ``target`` under a cap of ``cap`` resident blocks per SM,
    leaving room for ``footprint`` (the communication kernel per SM) when given: the residency
    used is the smaller of ``cap`` and the largest that leaves that room."""
    t = get_target(target)
    if not isinstance(launch, Launch):
        raise UsageError(f"launch must be a foreign.Launch, not {launch!r:.100}")
    cap = validate.integer(cap, "cap", least=1)
    if footprint is not None and not isinstance(footprint, occupancy.Footprint):
        raise UsageError(f"footprint must be an occupancy.Footprint or None, not {footprint!r}")
    own = launch.dynamic_smem
    # The kernel's own dynamic shared memory counts as fixed: the padding comes on top of it.
    resources = {"registers": launch.registers, "static_smem": launch.static_smem + own}
    natural = occupancy.max_active_blocks(t, block_size=launch.block_threads, **resources)

    def skip(why: str) -> Decision:
        return Decision("skip", why, own, natural, natural)

    if launch.cluster_blocks > 1:
        return skip(f"a cluster launch ({launch.cluster_blocks} blocks per cluster): its blocks are scheduled "
                    "together, so padding would change how clusters fit")
    if launch.cooperative:
        return skip("a cooperative launch: all its blocks must be resident at once")
    if natural == 0:
        return skip("cannot run on this device as launched (no block fits)")
    if launch.grid_blocks <= t.num_sms:
        return skip(f"persistent or one-wave ({launch.grid_blocks} blocks on {t.num_sms} SMs, at most one per SM): "
                    "a cap cannot change it and padding could break a kernel that waits for its other blocks")
    try:
        room = occupancy.shape(t, resources, launch.block_threads, reserve=footprint) if footprint is not None \
            else None
    except ShimrtError as exc:
        return skip(f"cannot leave the communication room at any residency: {exc}")
    limit = min(cap, room.resident_blocks if room is not None else cap)
    if natural <= limit:
        return skip(f"already at most {limit} resident blocks per SM ({natural})"
                    + (", room left for the footprint" if footprint is not None else ""))
    shaped = occupancy.shape(t, resources, launch.block_threads, resident_blocks=limit)
    total = own + shaped.dynamic_smem
    if launch.static_smem + total > t.smem_per_block_optin:
        return skip(f"padding to {total} B of dynamic shared memory passes the device's {t.smem_per_block_optin} B "
                    "per block")
    return Decision("pad", f"{natural} -> {limit} resident blocks per SM", total, natural, limit,
                    needs_opt_in=launch.static_smem + total > t.max_smem_per_block_default)


@dataclass
class Decisions:
    """Decisions cached per (function, block threads, own dynamic smem, grid class), with counts
    of the launches padded and left alone and why, for the interposer's report."""

    target: Target
    cap: int
    footprint: occupancy.Footprint | None = None
    _cache: dict = field(default_factory=dict, repr=False)
    padded: dict = field(default_factory=dict)   # name -> launches padded
    skipped: dict = field(default_factory=dict)  # (name, reason) -> launches skipped

    def __call__(self, function: Any, launch: Launch) -> Decision:
        """The decision for ``launch`` of ``function`` (any hashable handle); not counted: the
        caller says what it did with :meth:`record`."""
        key = (function, launch.block_threads, launch.dynamic_smem, launch.grid_blocks <= self.target.num_sms,
               launch.cluster_blocks, launch.cooperative)
        d = self._cache.get(key)
        if d is None:
            d = self._cache[key] = decide(self.target, launch, self.cap, self.footprint)
        return d

    def __len__(self) -> int:
        """How many distinct launches (function, block, smem, wave, cluster, cooperative) were decided."""
        return len(self._cache)

    def record(self, name: str, padded: bool, reason: str = "") -> None:
        """Count one launch of kernel ``name``: padded, or left alone for ``reason``."""
        if padded:
            self.padded[name] = self.padded.get(name, 0) + 1
        else:
            k = (name, reason)
            self.skipped[k] = self.skipped.get(k, 0) + 1
