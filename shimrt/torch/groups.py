"""The communication side of a policy under DDP: process groups of torch's own ProcessGroupNCCL,
made with the policy's stream priority and NCCL channel count, and DDP moved between them.

DDP's reducer all-reduces each bucket through ``ddp.process_group``, from C++, with no Python
on its path. A comm hook puts Python, a CUDA future and a second GIL acquisition on that path
for every bucket, and turns off the scaling DDP does while copying gradients into its buckets:
on a step bound by the host it cost 15 ms of a 36 ms step (``docs/ddp.md``). So a policy's
communication is not a hook but a process group over the same ranks whose options carry it:
``is_high_priority_stream`` (NCCL's kernels on a stream of the greatest priority) and NCCL's
``min_ctas``/``max_ctas`` (its channels, one block each, on the SMs a policy keeps for it).
:func:`use` points the DDP's reducer at one of them between two steps; the buckets, their
order and their memory stay as they are.
"""

from __future__ import annotations

import datetime
from typing import Any

from .. import validate
from ..errors import UsageError
from ..stream import PRIORITIES

#: A group's options, as (stream priority, NCCL channels or None for NCCL's own choice).
Key = tuple[str, "int | None"]


def moveable(ddp: Any) -> str | None:
    """Why ``ddp``'s all-reduces cannot be moved to another process group (None: they can)."""
    reducer = getattr(ddp, "reducer", None)
    if reducer is None or getattr(ddp, "_use_python_reducer", False):
        return "it has no C++ reducer (torch.compile's Python reducer, or every all-reduce delayed)"
    if not hasattr(reducer, "_update_process_group"):
        return "this torch's reducer cannot change its process group (Reducer._update_process_group)"
    if getattr(ddp, "_delay_all_reduce_params", None):
        return "its delay_all_reduce_named_params (those all-reduces run outside the reducer)"
    return None


def use(ddp: Any, group: Any) -> None:
    """Make ``group`` the process group of ``ddp`` and of its reducer. Call it between steps, on
    every rank at the same step. Unlike ``DDP._update_process_group`` the reducer's state is kept:
    the ranks are the same, so its buckets and their order still hold, and no rebuild (with its
    host synchronisation) falls into the next step."""
    if ddp.process_group is group:
        return
    ddp.reducer._update_process_group(group)
    ddp.process_group = group


def options(dist: Any, priority: str, ctas: int | None) -> Any:
    """ProcessGroupNCCL's options for streams of ``priority`` ("high": the greatest) and NCCL
    held to ``ctas`` channels (None: NCCL's choice). UsageError where this torch cannot say it."""
    validate.one_of(priority, "priority", PRIORITIES)
    if ctas is not None:
        ctas = validate.integer(ctas, "ctas", least=1, most=64)
    if not dist.is_available() or not dist.is_nccl_available():
        raise UsageError("this torch has no NCCL process group (torch.distributed with NCCL)")
    made = dist.ProcessGroupNCCL.Options()
    made.is_high_priority_stream = priority == "high"
    if ctas is not None:
        config = getattr(made, "config", None)
        if config is None or not hasattr(config, "max_ctas"):
            raise UsageError("this torch's ProcessGroupNCCL.Options has no NCCL config (min_ctas, max_ctas): "
                             "a policy that sizes NCCL's channels cannot run")
        config.min_ctas = config.max_ctas = ctas
    return made


class Groups:
    """Process groups over the ranks of ``group`` (the DDP's), one per :data:`Key`, made on
    first use: collective over those ranks only (``use_local_synchronization``), in the same
    order on each, so every rank must ask for the same keys in the same order."""

    def __init__(self, dist: Any, group: Any, timeout: float):
        self.dist, self.parent = dist, group
        self.ranks = dist.get_process_group_ranks(group)
        self.timeout = datetime.timedelta(seconds=validate.number(timeout, "timeout", positive=True))
        self.made: dict[Key, Any] = {}

    def get(self, key: Key) -> Any:
        if key not in self.made:
            self.made[key] = self.dist.new_group(self.ranks, timeout=self.timeout, backend="nccl",
                                                 pg_options=options(self.dist, *key),
                                                 use_local_synchronization=True)
        return self.made[key]

    def close(self, keep: Any = ()) -> None:
        """Destroy every group made but those in ``keep`` (NCCL's communicators and buffers go
        with them)."""
        stays = {id(pg) for pg in keep}
        gone = [pg for pg in self.made.values() if id(pg) not in stays]
        self.made = {k: pg for k, pg in self.made.items() if id(pg) in stays}
        for pg in gone:
            self.dist.destroy_process_group(pg)
