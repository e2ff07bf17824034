"""The communication stand-in: a kernel with NCCL's footprint whose blocks form a ring.

On one GPU there is no peer to talk to, yet the scheduling problem of overlap is all on the
device: a communication kernel whose blocks must all be resident competes with a compute kernel
for SMs. :class:`CommStandIn` launches ``kernels_src/comm_standin.cu`` as a ring all-reduce (or
all-gather / reduce-scatter) of ``nbytes`` over ``ranks`` virtual ranks would move data: the
same number of steps, each block reducing its slice per step, with NCCL's registers and shared
memory per block, one block per channel. Every report says the stand-in was used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import kernels, validate
from ..device import Device
from ..errors import ShimrtError, UsageError
from ..kernel import Kernel
from ..memory import Buffer
from ..occupancy import NCCL_2_28_SM90, Footprint
from ..stream import timeout_seconds
from ..validate import available_host_memory, require_memory

__all__ = ["STEPS", "MIN_LINK_GBPS", "MAX_LINK_GBPS", "size_label", "StandInSpec", "CommStandIn"]

#: Ring steps per rank count: an all-reduce is a reduce-scatter then an all-gather.
STEPS = {"all_reduce": lambda r: 2 * (r - 1), "all_gather": lambda r: r - 1, "reduce_scatter": lambda r: r - 1}
_KERNEL = "comm_ring"
_MAX_THREADS = 640  # the kernel's launch bounds, NCCL's largest block
_MAX_INT32 = 2**31 - 1
#: The pacing a stand-in channel takes, in GB/s: slower than 1 MB/s would make a step's sleep
#: outgrow the kernel's 64-bit nanoseconds, and faster than 1 PB/s paces nothing (0 ns a step).
MIN_LINK_GBPS, MAX_LINK_GBPS = 1e-3, 1e6


def size_label(nbytes: int) -> str:
    """A message size in words for labels, e.g. "64MiB"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"


@dataclass(frozen=True)
class StandInSpec:
    """The collective a stand-in plays: ``collective`` of ``nbytes`` over a ring of ``ranks``,
    on ``blocks`` channels of ``threads`` threads, each block launched with ``dynamic_smem``
    bytes (None: NCCL's 82240 B). ``link_gbps``: each channel's bandwidth in GB/s, as a link
    between GPUs would set it (a step then lasts its slice over that rate, the block asleep once
    its copy is done); None: as fast as the block copies through local memory. ``timeout_s``:
    how long a block waits for its neighbour before the ring gives up (an error, never a hang).
    """

    nbytes: int
    collective: str = "all_reduce"
    ranks: int = 8
    blocks: int = 16
    threads: int = 512
    dynamic_smem: int | None = None
    link_gbps: float | None = None
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        validate.one_of(self.collective, "collective", STEPS)
        # numpy integers become ints, so equal specs compare and hash alike.
        # The kernel takes its step count, 2 (ranks - 1) at most, and its blocks as int32s.
        for name, low, high in (("nbytes", 16, None), ("ranks", 2, 2**30), ("blocks", 1, _MAX_INT32),
                                ("threads", 32, None)):
            object.__setattr__(self, name, validate.integer(getattr(self, name), name, least=low, most=high))
        # The kernel takes each block's float4s per step as an int32: with one block, nbytes / ranks / 16.
        most = _MAX_INT32 * 16 * self.ranks
        if self.nbytes > most:
            raise UsageError(f"nbytes must be at most {most} for {self.ranks} ranks, not {self.nbytes}")
        if self.threads > _MAX_THREADS or self.threads % 32:
            raise UsageError(f"threads must be a multiple of 32 up to {_MAX_THREADS}, not {self.threads}")
        if self.dynamic_smem is not None:
            # cuLaunchKernel takes it as an unsigned int.
            object.__setattr__(self, "dynamic_smem", validate.integer(self.dynamic_smem, "dynamic_smem (or None)",
                                                                      least=0, most=validate.MAX_UINT32))
        if self.link_gbps is not None:
            object.__setattr__(self, "link_gbps", validate.number(self.link_gbps, "link_gbps (GB/s, or None)",
                                                                  positive=True, least=MIN_LINK_GBPS,
                                                                  most=MAX_LINK_GBPS))
        object.__setattr__(self, "timeout_s", timeout_seconds(self.timeout_s, "timeout_s"))

    def _blocks(self, blocks) -> int:
        return self.blocks if blocks is None else validate.integer(blocks, "blocks (or None)", least=1)

    @property
    def steps(self) -> int:
        return STEPS[self.collective](self.ranks)

    @property
    def label(self) -> str:
        return f"{self.collective}-{size_label(self.nbytes)}"

    def chunk(self, blocks: int | None = None) -> int:
        """float4 elements each block reduces per step."""
        return max(1, self.nbytes // self.ranks // self._blocks(blocks) // 16)

    def step_ns(self, blocks: int | None = None) -> int:
        """The shortest time a block's step may take: its slice over the link (0: unpaced)."""
        chunk = self.chunk(blocks)  # checks ``blocks`` whether paced or not
        return 0 if self.link_gbps is None else int(chunk * 16 / self.link_gbps)


class CommStandIn:
    """A stand-in collective on ``device``: :meth:`launch` runs it once on a stream."""

    kind = "stand-in"

    def __init__(self, device: Device, spec: StandInSpec, seed: int = 0):
        if not isinstance(spec, StandInSpec):
            raise UsageError(f"spec must be a StandInSpec, not {spec!r:.100}")
        seed = validate.integer(seed, "seed", least=0)
        if not isinstance(device, Device):
            raise UsageError(f"device must be a shimrt Device, not {device!r:.100}")
        # src and dst (float4s for any grid up to max_blocks), before anything is drawn or allocated.
        capacity = spec.steps * (spec.nbytes // spec.ranks // 16 + device.target.num_sms * 8)
        require_memory(2 * 16 * capacity, device.mem_info()[0], f"the buffers of the stand-in {spec.label}",
                       f"{device.name}'s free device")
        require_memory(16 * capacity, available_host_memory(), f"the input of the stand-in {spec.label}", "host")
        self.device, self.spec = device, spec
        # NVRTC caps registers at NCCL's 96 (it builds with -maxrregcount=96); hipRTC has no such
        # option, and the launch bounds keep the kernel within 640 threads there.
        options = ["--maxrregcount=96"] if device.backend == "cuda" else []
        self.program = device.compile(kernels.source("comm_standin"), options=options, name="comm_standin.cu")
        self.kernel = device.load(self.program)[_KERNEL]
        t = device.target
        default = NCCL_2_28_SM90.dynamic_smem
        static = self.kernel.attributes["static_smem"]
        self.dynamic_smem = spec.dynamic_smem if spec.dynamic_smem is not None else \
            min(default, t.smem_per_block_optin - static)
        self._check_resident(spec.blocks, spec.threads)
        self._checked = {(spec.blocks, spec.threads)}
        self.max_blocks = t.num_sms * 8
        # float4s: steps x grid x chunk(grid) for any grid up to max_blocks
        self.capacity = spec.steps * (spec.nbytes // spec.ranks // 16 + self.max_blocks)
        rng = np.random.default_rng(seed)
        self.src = device.to_device(rng.standard_normal(self.capacity * 4, dtype=np.float32))
        self.dst = device.empty(self.capacity * 4, np.float32).memset(0)
        self.flags = device.empty(self.max_blocks, np.uint32).memset(0)
        self.error = device.empty(1, np.uint32).memset(0)
        self._counter = 0  # the ring counters' value: launches so far x steps

    def __repr__(self) -> str:
        return f"<CommStandIn {self.spec.label} x{self.spec.ranks} ranks, {self.spec.blocks} blocks>"

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    def footprint(self, threads: int | None = None) -> Footprint:
        """What one block needs per SM, from the compiled kernel's own attributes."""
        res = self.kernel.occupancy_resources
        threads = self.spec.threads if threads is None else self._threads(threads)
        return Footprint(f"stand-in ({res['registers']} regs)", 1, threads, res["registers"],
                         res["static_smem"], self.dynamic_smem, res["sgprs"])

    def blocks(self, blocks: int | None = None) -> int:
        """The blocks (channels) of a launch: ``blocks``, or the spec's when None."""
        return self.spec._blocks(blocks)

    @staticmethod
    def _threads(threads) -> int:
        threads = validate.integer(threads, "threads (or None)", least=32, most=_MAX_THREADS)
        if threads % 32:
            raise UsageError(f"threads must be a multiple of 32 up to {_MAX_THREADS}, not {threads}")
        return threads

    def _check_resident(self, blocks: int, threads: int) -> None:
        per_sm = self.kernel.max_active_blocks(threads, self.dynamic_smem)
        if per_sm * self.device.target.num_sms < blocks:
            raise UsageError(f"{blocks} stand-in blocks of {threads} threads cannot all be resident on "
                             f"{self.device.target.name} ({per_sm} per SM x {self.device.target.num_sms} SMs); "
                             "the ring would never finish")

    def launch(self, stream: Any = None, *, stamps: Any = None, kernel: Kernel | None = None,
               blocks: int | None = None, threads: int | None = None) -> None:
        """Enqueue one collective. ``kernel``: the same kernel loaded elsewhere (an SM
        partition); ``blocks``/``threads``: other channel and thread counts than the spec's."""
        self.prepare(stream, stamps=stamps, kernel=kernel, blocks=blocks, threads=threads)()

    def prepare(self, stream: Any = None, *, stamps: Any = None, kernel: Kernel | None = None,
                blocks: int | None = None, threads: int | None = None) -> Callable[[], None]:
        """:meth:`launch` with every check and the argument packing done now; returns the
        function that enqueues it (call it once: it takes this launch's ring counters)."""
        g = self.spec.blocks if blocks is None else validate.integer(blocks, "blocks (or None)", least=1,
                                                                       most=self.max_blocks)
        nt = self.spec.threads if threads is None else self._threads(threads)
        if stamps is not None:
            if not isinstance(stamps, Buffer) or stamps.dtype != np.uint64:
                raise UsageError(f"stamps must be a uint64 shimrt Buffer or None, not {stamps!r}")
            if stamps.nbytes < 24 * g:
                raise UsageError(f"stamps must hold 3 words for each of the launch's {g} blocks, not "
                                 f"{stamps.nbytes // 24} blocks' worth")
        if (g, nt) not in self._checked:
            self._check_resident(g, nt)
            self._checked.add((g, nt))
        if self._counter + self.spec.steps > 0xFFFFFFFF:  # the 32-bit ring counters would wrap
            self.flags.memset(0)  # waits for the device first
            self._counter = 0
        base = self._counter
        self._counter += self.spec.steps
        timeout_ns = np.uint64(int(self.spec.timeout_s * 1e9))
        stamps = 0 if stamps is None else stamps  # a null pointer: the kernel skips its timeline
        return (kernel or self.kernel).prepare(g, nt, self.src, self.dst, np.int32(self.spec.chunk(g)), self.flags,
                                               np.uint32(base), np.int32(self.spec.steps),
                                               np.uint64(self.spec.step_ns(g)), timeout_ns, self.error, stamps,
                                               stream=stream, dynamic_smem=self.dynamic_smem)

    def observe(self, record: dict) -> None:
        """Nothing to learn from a CUPTI record: the stand-in's footprint is its own compiled kernel's."""

    def raise_if_stalled(self) -> None:
        """After the work finished: ShimrtError if the ring gave up waiting (and clear the flag)."""
        if int(self.error.numpy()[0]):
            self.error.memset(0)
            raise ShimrtError(f"the communication stand-in stalled: its blocks were not all resident within "
                              f"{self.spec.timeout_s} s (compute held the SMs), so it stopped early")

    def reset(self) -> None:
        """Zero the output: after one launch it equals the input over the slices touched."""
        self.dst.memset(0)

    def touched(self, blocks: int | None = None) -> int:
        """float32 elements one launch writes."""
        g = self.spec._blocks(blocks)
        return self.spec.steps * g * self.spec.chunk(g) * 4

    def check(self, blocks: int | None = None) -> None:
        """After :meth:`reset` and one launch: every touched element equals the input."""
        n = self.touched(blocks)
        got, want = self.dst.numpy()[:n], self.src.numpy()[:n]
        bad = np.flatnonzero(got != want)
        if bad.size:
            raise ShimrtError(f"stand-in output wrong at {bad.size} of {n} elements (first {bad[0]}: "
                              f"{got[bad[0]]} != {want[bad[0]]})")
