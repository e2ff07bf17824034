"""Real NCCL/RCCL collectives as the engine's communication side.

:class:`NcclCollective` runs one collective through a shimrt :class:`~shimrt.nccl.Communicator`
on the stream the engine gives it. NCCL launches its own kernels, so their times come from
CUPTI's kernel records (CUDA only; RCCL would need roctracer, which shimrt does not bind yet),
and their channel count and threads are fixed when the communicator is made (``CommOptions``
``min_ctas``/``max_ctas``, ``NCCL_NTHREADS``), not per launch.

With two or more ranks every collective is real traffic. With one rank NCCL does an all-reduce
with a copy and no kernel; ``send_recv`` (a grouped send and receive to the rank itself, or
to the ring neighbours with more ranks) makes it launch its SendRecv kernel, NCCL's own
footprint on one GPU, though its blocks then wait for no peer.

Several ranks of one process (``Communicator.local([dev, dev])``: NCCL 2.30+ puts them on one
GPU) make one NcclCollective: each launch is one NCCL group of every rank's call, rank 0's on
the engine's stream and each other rank's on a stream of its own (same place, same priority)
that forks from it and joins back, so the engine waits on one stream as with one rank. The
blocks on the engine's GPU are then every co-located rank's: the planner counts them all.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import validate
from ..errors import ShimrtError, UsageError
from ..kernel import Kernel
from ..nccl import Communicator, buffer_counts, group
from ..occupancy import NCCL_2_28_SM90, Footprint
from ..validate import available_host_memory, require_memory
from .standin import size_label

__all__ = ["COLLECTIVES", "NcclCollective"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS
# send_recv is a grouped send and recv of one buffer each: the Communicator's "send" sizes it.
_SIZED_AS = {"send_recv": "send"}


def _ranks(communicator: Any) -> list:
    comms = list(communicator) if isinstance(communicator, (list, tuple)) else [communicator]
    if not comms or not all(isinstance(c, Communicator) for c in comms):
        raise UsageError(f"communicator must be a shimrt.nccl.Communicator or a list of them (the ranks of this "
                         f"process, from Communicator.local), not {communicator!r:.100}")
    if len({(c.size, c.unique_id) for c in comms}) > 1 or len({c.rank for c in comms}) < len(comms):
        raise UsageError("the communicators must be distinct ranks of one communicator (Communicator.local)")
    return comms


class NcclCollective:
    """``collective`` of ``nbytes`` (per rank, float32) on ``communicator``: one rank, or the
    list of this process's ranks (from ``Communicator.local``), all launched together.
    ``footprint``: NCCL's kernel per SM (default: NCCL 2.28 on sm_90, 512 threads for the ring
    collectives and 640 for send/recv); ``channels``: its blocks per rank, as NCCL picks them
    (corrected from CUPTI's records after the first timed run)."""

    kind = "nccl"
    kernel = None  # NCCL loads its own kernels

    def __init__(self, communicator: Any, collective: str = "all_reduce", nbytes: int = 64 << 20, *,
                 footprint: Footprint | None = None, channels: int = 16):
        comms = _ranks(communicator)
        validate.one_of(collective, "collective", COLLECTIVES)
        communicator = comms[0]
        nbytes = validate.integer(nbytes, "nbytes", least=4 * communicator.size)
        if footprint is not None and not isinstance(footprint, Footprint):
            raise UsageError(f"footprint must be a Footprint or None, not {footprint!r}")
        channels = validate.integer(channels, "channels", least=1, most=MAX_CHANNELS)
        self.comm, self.comms, self.collective, self.nbytes = communicator, comms, collective, nbytes
        self.device = communicator.device
        # The ranks whose kernels share the engine's GPU: their blocks are all on it.
        self.colocated = sum(c.device.index == self.device.index for c in comms)
        send_count, recv_count = buffer_counts(_SIZED_AS.get(collective, collective), nbytes // 4,
                                               communicator.size, given="send")
        # The device's send and receive buffers, then the host input, before anything is allocated.
        device_bytes = 4 * (send_count + recv_count) * self.colocated
        require_memory(device_bytes, self.device.mem_info()[0], f"the buffers of nccl {collective}",
                       f"{self.device.name}'s free device")
        require_memory(4 * send_count * len(comms), available_host_memory(), f"the input of nccl {collective}",
                       "host")
        threads = 640 if collective == "send_recv" else 512
        self._footprint = footprint or NCCL_2_28_SM90.with_threads(threads)
        self.channels = channels
        self.max_blocks = MAX_CHANNELS * self.colocated
        # Each rank's input is rank + 1 everywhere, so every result is known in closed form.
        self.sends = [c.device.to_device(np.full(send_count, c.rank + 1, np.float32)) for c in comms]
        self.recvs = [c.device.empty(recv_count, np.float32) for c in comms]
        self.send, self.recv = self.sends[0], self.recvs[0]
        self._joins: dict[int, tuple] = {}  # id(stream) -> (stream, the other ranks' streams, events)

    def __repr__(self) -> str:
        ranks = ",".join(str(c.rank) for c in self.comms)
        return f"<NcclCollective {self.label} on rank{'s' if len(self.comms) > 1 else ''} {ranks}/{self.comm.size}>"

    @property
    def label(self) -> str:
        return f"nccl {self.collective}-{size_label(self.nbytes)}"

    def footprint(self, threads: int | None = None) -> Footprint:
        """NCCL's kernel per SM, with ``threads`` per block when given."""
        return self._footprint if threads is None else self._footprint.with_threads(threads)

    def blocks(self, blocks: int | None = None) -> int:
        """The blocks of a launch on the engine's GPU: ``blocks``, or NCCL's channels times the
        ranks that share the GPU when None."""
        return self.channels * self.colocated if blocks is None else \
            validate.integer(blocks, "blocks (or None)", least=1, most=MAX_CHANNELS)

    def launch(self, stream: Any = None, *, stamps: Any = None, kernel: Kernel | None = None,
               blocks: int | None = None, threads: int | None = None) -> None:
        """Enqueue the collective on ``stream``. NCCL's channels and threads are set when the
        communicator is made, so ``blocks``/``threads`` must be None here."""
        if blocks is not None or threads is not None:
            raise UsageError("NCCL's channels and threads are fixed per communicator (CommOptions, NCCL_NTHREADS)")
        if len(self.comms) == 1:
            self._enqueue([(self.comm, stream, self.send, self.recv)])
            return
        others, events = self._streams(stream)
        fork, joins = events[0], events[1:]
        if stream is not None:
            fork.record(stream)
            for s in others:
                s.wait(fork)
        with group(*self.comms):
            self._enqueue(list(zip(self.comms, [stream, *others], self.sends, self.recvs, strict=True)))
        if stream is not None:
            for s, e in zip(others, joins, strict=True):
                e.record(s)
                stream.wait(e)

    def _enqueue(self, ranks: list) -> None:
        """Each rank's call (in one group when there are several) on its stream."""
        for c, s, send, recv in ranks:
            if self.collective != "send_recv":
                c.collective(self.collective, send, recv, stream=s)
                continue
            with c.group():
                c.send(send, (c.rank + 1) % c.size, stream=s)
                c.recv(recv, (c.rank - 1) % c.size, stream=s)

    def _streams(self, stream: Any) -> tuple[list, list]:
        """The other ranks' streams beside ``stream`` (in its place, at its priority; their own
        comm.stream when None) and the fork and join events, made once per stream."""
        if stream is None:
            return [c.stream for c in self.comms[1:]], [None] * len(self.comms)
        got = self._joins.get(id(stream))
        if got is None or got[0] is not stream:
            if not hasattr(stream, "device") or not hasattr(stream, "priority"):
                raise UsageError(f"several ranks launch beside a shimrt Stream (or None), not {stream!r:.100}")
            place, priority = stream.device, stream.priority
            others = [(place if c.device.index == place.index else c.device).stream(priority) for c in self.comms[1:]]
            events = [place.event(timing=False)] + [s.device.event(timing=False) for s in others]
            got = self._joins[id(stream)] = (stream, others, events)
        return got[1], got[2]

    def close(self) -> None:
        """Free the other ranks' streams and events made for the engine's streams."""
        for _, others, events in self._joins.values():
            for x in (*others, *events):
                x.close()
        self._joins.clear()

    def prepare(self, stream: Any = None, *, stamps: Any = None, kernel: Kernel | None = None,
                blocks: int | None = None, threads: int | None = None) -> Callable[[], None]:
        """A function that enqueues the collective (NCCL packs its arguments at the call)."""
        if blocks is not None or threads is not None:
            raise UsageError("NCCL's channels and threads are fixed per communicator (CommOptions, NCCL_NTHREADS)")
        return lambda: self.launch(stream)

    def observe(self, record: dict) -> None:
        """Take the channel count and footprint from a CUPTI record of this collective's kernel
        (NCCL picks its channels, threads and shared memory itself), so the planner counts what
        really runs."""
        self.channels, self._footprint = Footprint.of_record(record)

    def raise_if_stalled(self) -> None:
        """NCCL reports its own failures through the communicator's calls."""

    def reset(self) -> None:
        for r in self.recvs:
            r.memset(0)

    def check(self, blocks: int | None = None) -> None:
        """Every received element of every rank is what the collective must give for inputs
        rank + 1."""
        for c, recv in zip(self.comms, self.recvs, strict=True):
            n, rank, got = c.size, c.rank, recv.numpy()
            if self.collective in ("all_reduce", "reduce_scatter"):  # every element: the sum of 1..n
                want = np.full_like(got, n * (n + 1) / 2)
            elif self.collective == "all_gather":
                want = np.repeat(np.arange(1, n + 1, dtype=np.float32), got.size // n)
            else:
                want = np.full_like(got, (rank - 1) % n + 1)
            bad = np.flatnonzero(got != want)
            if bad.size:
                raise ShimrtError(f"{self.label} rank {rank}: {bad.size} of {got.size} elements wrong (first "
                                  f"{bad[0]}: {got[bad[0]]} != {want[bad[0]]})")
