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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import validate
from ..errors import ShimrtError, UsageError
from ..nccl import Communicator, buffer_counts
from ..occupancy import NCCL_2_28_SM90, Footprint
from ..validate import available_host_memory, require_memory
from .standin import size_label

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS
# send_recv is a grouped send and recv of one buffer each: the Communicator's "send" sizes it.
_SIZED_AS = {"send_recv": "send"}


class NcclCollective:
    """``collective`` of ``nbytes`` (per rank, float32) on ``communicator``. ``footprint``:
    NCCL's kernel per SM (default: NCCL 2.28 on sm_90, 512 threads for the ring collectives and
    640 for send/recv); ``channels``: its blocks, as NCCL picks them (corrected from CUPTI's
    records after the first timed run)."""

    kind = "nccl"
    kernel = None  # NCCL loads its own kernels

    def __init__(self, communicator: Any, collective: str = "all_reduce", nbytes: int = 64 << 20, *,
                 footprint: Footprint | None = None, channels: int = 16):
        if not isinstance(communicator, Communicator):
            raise UsageError(f"communicator must be a shimrt.nccl.Communicator, not {communicator!r:.100}")
        validate.one_of(collective, "collective", COLLECTIVES)
        nbytes = validate.integer(nbytes, "nbytes", least=4 * communicator.size)
        if footprint is not None and not isinstance(footprint, Footprint):
            raise UsageError(f"footprint must be a Footprint or None, not {footprint!r}")
        channels = validate.integer(channels, "channels", least=1, most=MAX_CHANNELS)
        self.comm, self.collective, self.nbytes = communicator, collective, nbytes
        self.device = communicator.device
        send_count, recv_count = buffer_counts(_SIZED_AS.get(collective, collective), nbytes // 4,
                                               communicator.size, given="send")
        # The device's send and receive buffers, then the host input, before anything is allocated.
        device_bytes = 4 * (send_count + recv_count)
        require_memory(device_bytes, self.device.mem_info()[0], f"the buffers of nccl {collective}",
                       f"{self.device.name}'s free device")
        require_memory(4 * send_count, available_host_memory(), f"the input of nccl {collective}", "host")
        threads = 640 if collective == "send_recv" else 512
        self._footprint = footprint or NCCL_2_28_SM90.with_threads(threads)
        self.channels = channels
        self.max_blocks = MAX_CHANNELS
        rank = communicator.rank
        self.host = np.full(send_count, rank + 1, np.float32)
        self.send = self.device.to_device(self.host)
        self.recv = self.device.empty(recv_count, np.float32)

    def __repr__(self) -> str:
        return f"<NcclCollective {self.label} on rank {self.comm.rank}/{self.comm.size}>"

    @property
    def label(self) -> str:
        return f"nccl {self.collective}-{size_label(self.nbytes)}"

    def footprint(self, threads: int | None = None) -> Footprint:
        """NCCL's kernel per SM, with ``threads`` per block when given."""
        return self._footprint if threads is None else self._footprint.with_threads(threads)

    def blocks(self, blocks: int | None = None) -> int:
        """The blocks (channels) of a launch: ``blocks``, or NCCL's when None."""
        return self.channels if blocks is None else validate.integer(blocks, "blocks (or None)", least=1,
                                                                      most=MAX_CHANNELS)

    def launch(self, stream: Any = None, *, stamps: Any = None, kernel: Any = None, blocks: int | None = None,
               threads: int | None = None) -> None:
        """Enqueue the collective on ``stream``. NCCL's channels and threads are set when the
        communicator is made, so ``blocks``/``threads`` must be None here."""
        if blocks is not None or threads is not None:
            raise UsageError("NCCL's channels and threads are fixed per communicator (CommOptions, NCCL_NTHREADS)")
        c, n = self.comm, self.comm.size
        if self.collective != "send_recv":
            c.collective(self.collective, self.send, self.recv, stream=stream)
            return
        with c.group():
            c.send(self.send, (c.rank + 1) % n, stream=stream)
            c.recv(self.recv, (c.rank - 1) % n, stream=stream)

    def prepare(self, stream: Any = None, *, stamps: Any = None, kernel: Any = None, blocks: int | None = None,
                threads: int | None = None) -> Any:
        """A function that enqueues the collective (NCCL packs its arguments at the call)."""
        if blocks is not None or threads is not None:
            raise UsageError("NCCL's channels and threads are fixed per communicator (CommOptions, NCCL_NTHREADS)")
        return lambda: self.launch(stream)

    def raise_if_stalled(self) -> None:
        """NCCL reports its own failures through the communicator's calls."""

    def reset(self) -> None:
        self.recv.memset(0)

    def check(self, blocks: int | None = None) -> None:
        """Every received element is what the collective must give for inputs rank + 1."""
        n, rank, got = self.comm.size, self.comm.rank, self.recv.numpy()
        if self.collective in ("all_reduce", "reduce_scatter"):  # every element: the sum of 1..n
            want = np.full_like(got, n * (n + 1) / 2)
        elif self.collective == "all_gather":
            want = np.repeat(np.arange(1, n + 1, dtype=np.float32), got.size // n)
        else:
            want = np.full_like(got, (rank - 1) % n + 1)
        bad = np.flatnonzero(got != want)
        if bad.size:
            raise ShimrtError(f"{self.label}: {bad.size} of {got.size} elements wrong (first {bad[0]}: "
                              f"{got[bad[0]]} != {want[bad[0]]})")
