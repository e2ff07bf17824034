"""The communication side of a policy: process groups of torch's own ProcessGroupNCCL over the
model's ranks, made with the policy's stream priority and NCCL channel count, for DDP and FSDP2
alike (their adapters, :mod:`shimrt.torch.ddp` and :mod:`shimrt.torch.fsdp`, move the model's
collectives onto them).

DDP's reducer all-reduces each bucket through ``ddp.process_group``, from C++, with no Python
on its path. A comm hook puts Python, a CUDA future and a second GIL acquisition on that path
for every bucket, and turns off the scaling DDP does while copying gradients into its buckets:
on a step bound by the host it cost 15 ms of a 36 ms step (``docs/ddp.md``). So a policy's
communication is not a hook but a process group over the same ranks whose options carry it:
``is_high_priority_stream`` (NCCL's kernels on a stream of the greatest priority) and NCCL's
``min_ctas``/``max_ctas`` (its channels, one block each, on the SMs a policy keeps for it), or
NCCL's CTA policy ZERO (``zero-sm``: collectives on the copy engines where NCCL can).
:func:`shimrt.torch.ddp.use` points the DDP's reducer at one of them between two steps; the
buckets, their order and their memory stay as they are.
"""

from __future__ import annotations

import datetime
from typing import Any

from .. import validate
from ..errors import UsageError
from ..stream import PRIORITIES

__all__ = ["options", "require_nccl", "one_cuda_device", "subgroup_refusal", "Groups"]

#: A group's options, as (stream priority, NCCL channels or None for NCCL's own choice, NCCL's
#: CTA policy ZERO).
Key = tuple[str, "int | None", bool]


def options(dist: Any, priority: str, ctas: int | None, zero_sm: bool = False,
            timeout: datetime.timedelta | None = None) -> Any:
    """ProcessGroupNCCL's options for streams of ``priority`` ("high": the greatest) and NCCL
    held to ``ctas`` channels (None: NCCL's choice), or (``zero_sm``) of NCCL's CTA policy ZERO,
    carrying ``timeout`` (None: the options' own), the one the group is made with: torch warns,
    once per group, where the options' timeout and the group's differ (the options keep whole
    milliseconds: give the group one of those). UsageError where this torch cannot say it."""
    validate.one_of(priority, "priority", PRIORITIES)
    if ctas is not None:
        ctas = validate.integer(ctas, "ctas", least=1, most=64)
    if validate.boolean(zero_sm, "zero_sm") and ctas is not None:
        raise UsageError(f"a group of NCCL's CTA policy ZERO takes no channel count, not ctas={ctas}")
    if timeout is not None and (not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0):
        raise UsageError(f"timeout must be a positive datetime.timedelta or None, not {validate.shown(timeout)}")
    if not dist.is_available() or not dist.is_nccl_available():
        raise UsageError("this torch has no NCCL process group (torch.distributed with NCCL)")
    made = dist.ProcessGroupNCCL.Options()
    made.is_high_priority_stream = priority == "high"
    if timeout is not None and hasattr(made, "_timeout"):  # absent: torch has no second timeout to differ
        made._timeout = timeout
    config = getattr(made, "config", None)
    if ctas is not None:
        if config is None or not hasattr(config, "max_ctas"):
            raise UsageError("this torch's ProcessGroupNCCL.Options has no NCCL config (min_ctas, max_ctas): "
                             "a policy that sizes NCCL's channels cannot run")
        config.min_ctas = config.max_ctas = ctas
    if zero_sm:
        zero = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", None)
        if zero is None or config is None or not hasattr(config, "cta_policy"):
            raise UsageError("this torch's ProcessGroupNCCL has no NCCL CTA policy ZERO (Options().config.cta_policy "
                             "and ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO: torch 2.10+ built with NCCL 2.28+): zero-sm "
                             "cannot run")
        config.cta_policy = zero
    return made


def require_nccl(dist: Any, group: Any, what: str) -> None:
    """UsageError unless torch.distributed is up and ``group`` (``what``'s, e.g. "a DDP") is NCCL's:
    a policy's groups are ProcessGroupNCCL over the same ranks. Both adapters' first refusals."""
    if not dist.is_initialized():
        raise UsageError("torch.distributed is not initialised: call torch.distributed.init_process_group first")
    backend = str(dist.get_backend(group)).lower()
    if "nccl" not in backend:
        raise UsageError(f"overlap() needs {what} over NCCL (its process group's backend is {backend!r}): the "
                         "policies' process groups are NCCL's; init_process_group('nccl')")


def one_cuda_device(devices: set, what: str) -> int:
    """The index of the one CUDA device in ``devices`` (where ``what`` lives); UsageError for
    several, or for one that is not CUDA's (one process per GPU)."""
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise UsageError(f"overlap() needs {what} on one CUDA device (one process per GPU), not on "
                         f"{sorted(map(str, devices))}")
    return next(iter(devices)).index


def subgroup_refusal(dist: Any, group: Any) -> str | None:
    """Why policy groups cannot be made over the ranks of ``group`` (None: they can). A group
    over some ranks of the world is made by splitting the default group's NCCL communicator when
    that group is bound to a device (``init_process_group(device_id=...)``), and every rank of the
    world must then join the split; the ranks outside ``group`` never call :func:`overlap`."""
    if dist.get_world_size(group) == dist.get_world_size():
        return None
    default = dist.distributed_c10d._get_default_group()
    if getattr(default, "bound_device_id", None) is not None:
        return ("its process group is a sub-group of the world, and the default group is bound to a device "
                "(init_process_group(device_id=...)): a new group splits the default one's NCCL communicator, "
                "which every rank of the world must join, and the others never call overlap(); initialise "
                "without device_id, or give overlap() a DDP over every rank")
    return None


def comm_memory(torch: Any, device: Any) -> int:
    """Bytes free on ``device`` (every process's allocations counted, NCCL's among them)."""
    return int(torch.cuda.mem_get_info(device)[0])


class Groups:
    """Process groups over the ranks of ``group`` (the DDP's), one per :data:`Key`, made on
    first use, in the same order on every rank, so every rank must ask for the same keys in the
    same order. Over the whole world every rank makes them (names by torch's count, which never
    repeats); over a sub-group only its ranks do (``use_local_synchronization``; refused where
    that cannot work: :func:`subgroup_refusal`). A group's communicator is made at once, by an
    all-reduce of one element on ``device`` (a CUDA device, or None: left to torch), and the
    device memory it took is measured around it (:attr:`memory`)."""

    def __init__(self, dist: Any, group: Any, timeout: datetime.timedelta, device: Any = None):
        if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0:
            raise UsageError(f"Groups' timeout must be a positive datetime.timedelta (overlap() checks the number "
                             f"it is given and makes it one), not {validate.shown(timeout)}")
        self.dist, self.parent, self.device = dist, group, device
        self.ranks = dist.get_process_group_ranks(group)
        self.local = dist.get_world_size(group) != dist.get_world_size()
        # in whole milliseconds, as ProcessGroupNCCL's options keep it: the group's and the options'
        # then agree, and torch has no difference to warn of
        self.timeout = datetime.timedelta(milliseconds=max(1, round(timeout.total_seconds() * 1000)))
        self.made: dict[Key, Any] = {}
        #: key -> bytes of device memory its communicator took (on a GPU shared by several ranks,
        #: all of theirs, made at the same time), for each group made, alive or not
        self.memory: dict[Key, int] = {}

    def get(self, key: Key) -> Any:
        if key not in self.made:
            import torch
            # the one element first, so that its allocation is not counted as NCCL's
            one = torch.zeros(1, device=self.device) if self.device is not None else None
            before = comm_memory(torch, self.device) if self.device is not None else 0
            try:
                pg = self.dist.new_group(self.ranks, timeout=self.timeout, backend="nccl",
                                         pg_options=options(self.dist, *key, timeout=self.timeout),
                                         use_local_synchronization=self.local)
            except ValueError as exc:
                if "already been created" not in str(exc):
                    raise
                # torch 2.11 names a sub-group by its ranks and the count of groups alive (2.14 by a
                # count that never falls): once a group made earlier is destroyed, a new one can take a
                # live one's name.
                raise UsageError(f"torch could not name a new process group over ranks {self.ranks} ({exc}): this "
                                 "torch names groups over some ranks by how many are alive, and another overlap() "
                                 "of this process still holds one; close() it first, or give overlap() a model "
                                 "over every rank") from None
            self.made[key] = pg
            if one is not None:
                self.dist.all_reduce(one, group=pg)
                torch.cuda.synchronize(self.device)
                self.memory[key] = max(0, before - comm_memory(torch, self.device))
        return self.made[key]

    def report(self) -> dict:
        """The device memory of the groups' communicators, in MiB: each made, and those alive."""
        mib = {f"{priority}-priority, {'NCCL' if ctas is None else ctas} channels"
               + (", CTA policy ZERO" if zero else ""): round(n / 2**20, 1)
               for (priority, ctas, zero), n in self.memory.items()}
        alive = sum(n for k, n in self.memory.items() if k in self.made)
        return {"made_mib": mib, "alive_mib": round(alive / 2**20, 1), "alive": len(self.made)}

    def close(self, keep: Any = ()) -> None:
        """Destroy every group made but those in ``keep`` (NCCL's communicators and buffers go
        with them)."""
        stays = {id(pg) for pg in keep}
        gone = [pg for pg in self.made.values() if id(pg) not in stays]
        self.made = {k: pg for k, pg in self.made.items() if id(pg) in stays}
        for pg in gone:
            self.dist.destroy_process_group(pg)
