"""The communication side of ``bench overlap``: stand-ins, or real NCCL collectives on this
process's rank(s), and (in one process) communicators of other channel counts, which
:func:`auto_nccl` measures."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import choose
from ..config import LaunchEnv, launch_env
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..launch import local_devices
from ..overlap.auto import search
from ..overlap.engine import Engine, Result
from ..overlap.schedule import Schedule
from ..overlap.standin import CommStandIn, StandInSpec
from ..overlap.workloads import ComputeWorkload

__all__ = ["comm_kind", "Communication", "Retune", "auto_nccl"]

if TYPE_CHECKING:
    from ..nccl import Communicator
    from ..overlap.collective import NcclCollective

_PROBE_BYTES = 64 << 20


def comm_kind(comm: str, env: LaunchEnv) -> str:
    """"stand-in" or "nccl": --comm auto is NCCL when launched with 2+ ranks."""
    if comm != "auto":
        return comm
    return "nccl" if env.source is not None and env.world_size >= 2 else "stand-in"


class Communication:
    """Makes the collectives of the matrix: stand-ins, or NCCL collectives on the communicator of
    this process's rank(s): one rank per process under a launcher, else ``--local-ranks`` ranks
    in this process (see ``NcclCollective``). In one process auto may also retune NCCL's channel
    count (``--auto-ctas``): each count is a communicator of its own, made once."""

    def __init__(self, dev: Device, args: argparse.Namespace) -> None:
        self.dev, self.args = dev, args
        env = launch_env()
        self.kind = comm_kind(args.comm, env)
        self.comm: Communicator | None = None  # None: the stand-in
        self.comms: list[Communicator] = []
        self.devices: list[Device] = []
        self._by_ctas: dict[int | str | None, list[Communicator]] = {}
        if self.kind != "nccl":
            return
        from ..launch import init
        if env.source is not None:
            self.comms = [init(dev)]
        else:
            self.devices = local_devices(dev, args.local_ranks)
            self.comms = self._local(None)
        self.comm = self.comms[0]

    def _local(self, ctas: int | str | None) -> list[Communicator]:
        """This process's ranks with ``ctas`` channels (None: NCCL's choice; "efficiency": NCCL's
        CTA policy that uses the fewest), made once."""
        from ..nccl import CommOptions, Communicator
        if ctas not in self._by_ctas:
            options = CommOptions() if ctas is None else CommOptions(cta_policy=ctas) if isinstance(ctas, str) \
                else CommOptions(min_ctas=ctas, max_ctas=ctas)
            self._by_ctas[ctas] = Communicator.local(self.devices, options=options)
        return self._by_ctas[ctas]

    def channel_settings(self) -> list[int | str]:
        """What auto may try besides NCCL's own channels: --auto-ctas, and NCCL's "efficiency" CTA
        policy where this NCCL has it (2.27+); none with the stand-in."""
        from ..nccl.config import has_field
        if self.comm is None:
            return []
        extra = ["efficiency"] if has_field(self.comm.lib.version, "CTAPolicy") else []
        return list(self.args.auto_ctas) + extra

    @property
    def root(self) -> bool:
        return self.comm is None or self.comm.rank == 0

    @property
    def retunable(self) -> bool:
        """Whether auto may make communicators of other channel counts (ranks of this process only)."""
        return bool(self.devices)

    def make(self, nbytes: int, ctas: int | str | None = None) -> CommStandIn | NcclCollective:
        nbytes = max(nbytes // (1 << 20), 1) << 20
        a = self.args
        if self.comm is None:
            return CommStandIn(self.dev, StandInSpec(nbytes=nbytes, collective=a.collective, ranks=a.ranks,
                                                     blocks=a.comm_blocks, threads=a.comm_threads,
                                                     link_gbps=a.link_gbps or None))
        from ..overlap.collective import NcclCollective
        comms = self.comms if ctas is None else self._local(ctas)
        return NcclCollective(comms, a.collective, nbytes)

    def agree(self, values: list[float]) -> list[float]:
        """The largest of every rank's ``values`` (so that all ranks size alike)."""
        if self.comm is None or len(self.comms) == self.comm.size:  # every rank is here: one measurement
            return values
        buf = self.dev.to_device(np.array(values, np.float32))
        self.comm.all_reduce(buf, op="max")
        self.comm.wait()
        return [float(v) for v in buf.numpy()]

    def sized(self, compute: ComputeWorkload, ratio: float) -> CommStandIn | NcclCollective:
        """A collective whose time alone is about ``ratio`` x the compute's (two measured steps)."""
        comm = self.make(_PROBE_BYTES)
        for _ in range(2):
            engine = Engine(self.dev, Schedule.pair(compute, comm), repeats=3)
            t_comp, t_comm = self.agree(list(engine.alone()))
            engine.close()
            nbytes = int(comm.nbytes * ratio * t_comp / t_comm)
            self.release(comm)
            comm = self.make(nbytes)
        return comm

    def stand_in_like(self, comm: NcclCollective) -> CommStandIn:
        """The stand-in playing ``comm`` (an NCCL collective that has run): its bytes, ring size,
        blocks on this GPU (every local rank's channels) and threads, as CUPTI saw NCCL's kernel."""
        a = self.args
        threads = min(max(32, comm.footprint().threads // 32 * 32), 640)
        collective = a.collective if a.collective != "send_recv" else "all_reduce"
        return CommStandIn(self.dev, StandInSpec(nbytes=comm.nbytes, collective=collective,
                                                 ranks=max(comm.comm.size, 2), blocks=comm.blocks(), threads=threads,
                                                 link_gbps=a.link_gbps or None))

    def release(self, comm: CommStandIn | NcclCollective) -> None:
        """Free what a collective made (the other ranks' streams)."""
        if hasattr(comm, "close"):
            comm.close()

    def describe(self) -> str:
        a = self.args
        if self.comm is None:
            pace = f"{a.link_gbps:g} GB/s per channel" if a.link_gbps else "unpaced"
            return (f"stand-in (NCCL's footprint, {a.comm_blocks} blocks x {a.comm_threads} threads, ring of "
                    f"{a.ranks}, {pace})")
        where = ""
        if self.devices:
            gpus = sorted({d.index for d in self.devices})
            where = f", {len(self.devices)} in this process on GPU{'s' if len(gpus) > 1 else ''} " \
                    f"{','.join(map(str, gpus))}, every rank's kernels counted"
        return (f"NCCL {a.collective} on {self.comm.size} rank(s){where} ({self.comm.lib.version_text}), "
                "timed by CUPTI")

    def close(self) -> None:
        for comms in self._by_ctas.values():
            for c in comms:
                c.close()
        if not self.devices:
            for c in self.comms:
                c.close()


@dataclass
class Retune:
    """``make(ctas)``: an Engine of the same schedule whose NCCL collective has ``ctas`` channels
    (or that CTA policy); ``settings``: those auto tries besides NCCL's own."""

    make: Callable[[int | str], Engine]
    settings: list[int | str]

    def __call__(self, ctas: int | str) -> Engine:
        return self.make(ctas)


def auto_nccl(engine: Engine, seq: Result, args: Any, retune: Retune | None) -> tuple[Result | None, dict]:
    """Auto with real NCCL: the engine's candidates (priority, shaping, ...) on NCCL's own
    channel count and, where ``retune(ctas)`` can make one, on communicators with each of
    ``--auto-ctas`` channels (fewer blocks leave compute more room, but take longer); the fastest
    run of all. Every rank of this process runs the same candidates in the same order, so no
    cache. Returns (the result, auto's details)."""
    from ..overlap.collective import NcclCollective
    comm = engine.schedule.of("comm")[0].comm
    if not isinstance(comm, NcclCollective):
        raise UsageError(f"auto_nccl needs an engine whose collective is NCCL's, not {comm!r:.100}")
    settings_: list[int | str | None] = [None]
    if retune is not None:
        settings_ += [c for c in retune.settings if c != comm.channels]
    results: dict[int | str | None, Result] = {}
    measured: dict[str, float] = {}
    rejected: list[str] = []
    for ctas in settings_:
        setting = _channels(ctas)
        eng = engine
        try:
            if ctas is not None and retune is not None:  # the settings besides None are retune's
                eng = retune(ctas)
                eng.alone()  # one run first: the planner then sees this communicator's channels, from CUPTI
            choice, times, rej = search(eng, None)
            rejected += [f"{r.what}: {r.why}" for r in rej]
            measured.update({f"{c.describe()} @ {setting}": round(t, 4) for c, t in times.items()})
            result = eng.measure(choice, t_seq=seq.makespan)
        except ShimrtError as exc:
            rejected.append(f"{setting}: {exc}")
            continue
        finally:
            if eng is not engine:  # a result keeps its timings, not the engine
                eng.close()
        result.policy, result.detail = "auto", setting
        results[ctas] = result
    if not results:
        return None, {"rejected": rejected}
    best = results[choose.fastest({ctas: r.makespan for ctas, r in results.items()})]
    auto = {"choice": f"{best.choice.describe()}, {best.detail}", "cached": False,
            "measured": dict(sorted(measured.items(), key=lambda x: x[1])), "rejected": rejected}
    return best, auto


def _channels(ctas: int | str | None) -> str:
    """An NCCL channel setting as reports name it."""
    if ctas is None:
        return "NCCL default channels"
    return f"NCCL {ctas} channels" if isinstance(ctas, int) else f"NCCL CTA policy {ctas}"
