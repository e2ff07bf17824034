"""Occupancy arithmetic and occupancy shaping: pure Python, no GPU, no vendor bindings.

- :func:`occupancy` / :func:`max_active_blocks`: how many blocks of a kernel fit on one SM
  (CU), and which resource limits that. For CUDA targets this follows NVIDIA's calculator
  (``cuda_occupancy.h``: warps, blocks, registers allocated per warp in 256-register units
  within 4 sub-partitions, shared memory in 128-byte units plus the 1 KiB the driver reserves
  per block), with the default shared-memory carveout and the opt-in limit per block. For
  AMD targets it follows the rule of ROCm's HIP runtime, which answers
  hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: wave slots per SIMD, VGPRs (in granules
  of 8 on gfx90a) and SGPRs (granules of 16) per SIMD, pooled over the CU's SIMDs, and LDS
  per CU.
- :class:`Footprint`: what a communication kernel needs on an SM.
- :func:`shape`: the dynamic shared memory to launch a compute kernel with so that exactly N
  of its blocks fit per SM, N the largest residency that leaves a footprint room on every
  resource (threads, block slots, registers, shared memory). Shared memory is the only lever;
  lowering N is how registers and threads are freed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence

from . import validate
from .errors import ShimrtError, UsageError
from .program import KernelResources
from .targets import Target
from .targets import get as _get_target

__all__ = ["occupancy", "max_active_blocks", "Footprint", "NCCL_2_28_SM90", "Shaping", "resource_counts", "shape",
           "coresident"]

_UNLIMITED = 1 << 30


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _count(name: str, value, minimum: int = 0) -> int:
    return validate.integer(value, name, least=minimum)


@dataclass(frozen=True)
class Occupancy:
    """Blocks per SM and the limit each resource sets (``limits[name]``); ``limited_by`` names
    the resources whose limit equals the result."""

    blocks: int
    limits: dict[str, int]
    smem_per_block: int      # shared memory (LDS) one block takes, as allocated
    registers_per_block: int  # registers one block takes, as allocated

    @property
    def limited_by(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.limits.items() if v == self.blocks)


def occupancy(target: "Target | str", *, block_size: int, registers: int, static_smem: int = 0,
              dynamic_smem: int = 0, sgprs: int = 0) -> Occupancy:
    """Blocks of a kernel that fit on one SM at once, with the limit of every resource.

    ``registers`` per thread (AMD: the code object's VGPR count, AGPRs included), ``static_smem``
    and ``dynamic_smem`` in bytes, ``sgprs`` per wave (AMD only). Shared memory above the default
    48 KiB per block is taken as opted in, as :meth:`shimrt.Kernel.launch` does.
    """
    t = _get_target(target)
    block_size = _count("block_size", block_size, 1)
    registers = _count("registers", registers)
    static_smem, dynamic_smem = _count("static_smem", static_smem), _count("dynamic_smem", dynamic_smem)
    sgprs = _count("sgprs", sgprs)
    if t.backend == "cuda":
        return _cuda(t, block_size, registers, static_smem, dynamic_smem)
    return _hip(t, block_size, registers, static_smem, dynamic_smem, sgprs)


def max_active_blocks(target: "Target | str", *, block_size: int, registers: int, static_smem: int = 0,
                      dynamic_smem: int = 0, sgprs: int = 0) -> int:
    """Blocks of a kernel that fit on one SM at once (see :func:`occupancy`)."""
    return occupancy(target, block_size=block_size, registers=registers, static_smem=static_smem,
                     dynamic_smem=dynamic_smem, sgprs=sgprs).blocks


def _cuda_smem_per_block(t: Target, static_smem: int, dynamic_smem: int) -> int:
    return _round_up(static_smem + dynamic_smem + t.reserved_smem_per_block, t.smem_alloc_unit)


def _cuda_regs_per_warp(t: Target, registers: int) -> int:
    return _round_up(registers * t.warp_size, t.reg_alloc_unit)


def _cuda(t: Target, block_size, registers, static_smem, dynamic_smem) -> Occupancy:
    warps = -(-block_size // t.warp_size)
    max_warps = t.max_threads_per_sm // t.warp_size
    limits = {"warps": max_warps // warps if block_size <= t.max_threads_per_block else 0,
              "blocks": t.max_blocks_per_sm}

    # Registers go to warps, per sub-partition; the hardware's per-block check assumes the
    # block's warps are rounded up to a multiple of the sub-partitions.
    per_warp = _cuda_regs_per_warp(t, registers)
    per_block = per_warp * warps
    if registers == 0:
        limits["registers"] = _UNLIMITED
    elif (registers > t.max_regs_per_thread or per_block > t.regs_per_block
          or per_warp * _round_up(warps, t.subpartitions_per_sm) > t.regs_per_block):
        limits["registers"] = 0
    else:
        per_partition = (t.regs_per_sm // t.subpartitions_per_sm) // per_warp
        limits["registers"] = per_partition * t.subpartitions_per_sm // warps

    # Shared memory: static + dynamic + the driver's reserve, in allocation units; the default
    # carveout gives the SM's whole shared memory; a block may take up to the opt-in limit.
    smem = _cuda_smem_per_block(t, static_smem, dynamic_smem)
    limit = t.smem_per_block_optin if static_smem + dynamic_smem + t.reserved_smem_per_block > \
        t.max_smem_per_block_default else t.max_smem_per_block_default
    limits["shared_memory"] = 0 if smem > limit + t.reserved_smem_per_block else t.smem_per_sm // smem
    return Occupancy(min(limits.values()), limits, smem, per_block)


def _hip_waves_per_simd(t: Target, registers: int, sgprs: int) -> dict[str, int]:
    slots = t.max_threads_per_sm // t.warp_size // t.subpartitions_per_sm
    vgpr_file = t.regs_per_sm // t.subpartitions_per_sm // t.warp_size   # VGPRs per lane per SIMD
    granule = t.reg_alloc_unit // t.warp_size
    by_vgpr = vgpr_file // _round_up(registers, granule) if registers else slots
    by_sgpr = t.sgprs_per_simd // _round_up(sgprs, t.sgpr_alloc_unit) if sgprs and t.sgprs_per_simd else slots
    return {"warps": slots, "registers": by_vgpr, "sgprs": by_sgpr}


def _hip(t: Target, block_size, registers, static_smem, dynamic_smem, sgprs) -> Occupancy:
    # ROCm CLR, hip_platform.cpp ihipOccupancyMaxActiveBlocksPerMultiprocessor: the waves a
    # SIMD can hold (slots, VGPRs, SGPRs) times the SIMDs give the work-items a CU can hold;
    # blocks are that over the block size rounded up to whole waves, and LDS per CU over the
    # block's LDS.
    if block_size > t.max_threads_per_block:
        zero = dict.fromkeys(("warps", "registers", "sgprs", "shared_memory"), 0)
        return Occupancy(0, zero, static_smem + dynamic_smem, 0)
    waves = _hip_waves_per_simd(t, registers, sgprs)
    rounded = _round_up(block_size, t.warp_size)
    limits = {k: t.subpartitions_per_sm * v * t.warp_size // rounded for k, v in waves.items()}
    lds = static_smem + dynamic_smem
    limits["shared_memory"] = t.smem_per_sm // lds if lds else _UNLIMITED
    vgprs = _round_up(registers, t.reg_alloc_unit // t.warp_size) * t.warp_size
    return Occupancy(min(limits.values()), limits, lds, vgprs * (rounded // t.warp_size))


# --- footprints and shaping -----------------------------------------------------------------

@dataclass(frozen=True)
class Footprint:
    """What a communication kernel needs on each SM it runs on: ``blocks`` resident blocks of
    ``threads`` threads with ``registers`` per thread and ``static_smem`` + ``dynamic_smem``
    bytes of shared memory each (``sgprs`` per wave on AMD)."""

    name: str
    blocks: int
    threads: int
    registers: int
    static_smem: int
    dynamic_smem: int
    sgprs: int = 0

    def __post_init__(self) -> None:
        validate.text(self.name, "Footprint.name")
        # numpy integers become ints, so equal footprints compare and hash alike.
        for f, least in (("blocks", 1), ("threads", 1), ("registers", 0), ("static_smem", 0), ("dynamic_smem", 0),
                         ("sgprs", 0)):
            object.__setattr__(self, f, _count(f"Footprint.{f}", getattr(self, f), least))

    @classmethod
    def of_record(cls, record: dict) -> tuple[int, "Footprint"]:
        """(blocks launched, the footprint per block) of a CUPTI kernel record (``Device.
        record_kernels``): the one reader of those records. An NCCL kernel has one block per
        channel; the name is the mangled function's own, else the start of the record's."""
        blocks = max(1, record["grid_x"] * record["grid_y"] * record["grid_z"])
        threads = max(1, record["block_x"] * record["block_y"] * record["block_z"])
        name = record["name"]
        mangled = re.match(r"_Z([0-9]+)", name)  # "_Z<length><name>..."
        short = name[mangled.end():mangled.end() + int(mangled.group(1))] if mangled else name[:48]
        return blocks, cls(f"{short} (CUPTI)", 1, threads, record["registers"], max(record["static_smem"], 0),
                           max(record["dynamic_smem"], 0))

    def with_threads(self, threads: int) -> "Footprint":
        """The same kernel launched with another thread count (NCCL_NTHREADS, for example)."""
        base = self.name.split(", ")[0]  # the kernel's own name, without an earlier thread count
        threads = _count("threads", threads, 1)
        return Footprint(f"{base}, {threads} threads", self.blocks, threads, self.registers,
                         self.static_smem, self.dynamic_smem, self.sgprs)


#: NCCL 2.28's device kernels on sm_90, as CUPTI recorded ncclDevKernel_SendRecv of NCCL 2.28.9
#: on an H200 (python -m shimrt.overlap.footprint): 640 threads, 96 registers, 21568 B static
#: and 82240 B dynamic shared memory, one block per channel (64 channels there). The ELF
#: reports 22592 B static (shared/notes) because it counts the 1 KiB per-block reserve, which
#: the occupancy arithmetic adds itself. NCCL's collective kernels use the same registers
#: (-maxrregcount=96) and shared memory, with 512 threads for the LL protocol.
NCCL_2_28_SM90 = Footprint("NCCL 2.28 device kernel (sm_90)", blocks=1, threads=640, registers=96,
                           static_smem=21568, dynamic_smem=82240)


@dataclass(frozen=True)
class Free:
    """Resources left on one SM beside the compute blocks."""

    threads: int
    registers: int
    smem: int
    blocks: int


@dataclass(frozen=True)
class Shaping:
    """A shaped launch: ``dynamic_smem`` bytes make exactly ``resident_blocks`` compute blocks
    fit per SM; ``free`` is what those blocks leave on the SM; ``explanation`` says why."""

    target: Target
    block_size: int
    dynamic_smem: int
    resident_blocks: int
    natural_blocks: int
    free: Free
    reserve: Footprint | None
    explanation: str = field(compare=False)

    def __str__(self) -> str:
        return self.explanation


#: The keys a resources mapping may have: what the model reads, and the rest of KernelResources.to_dict().
RESOURCE_KEYS = ("registers", "static_smem", "sgprs", "local_bytes", "spill_bytes", "max_threads_per_block", "extra")


def resource_counts(resources: Any) -> tuple[int, int, int]:
    """(registers, static smem, sgprs) from KernelResources or a mapping with ``registers`` (and
    optionally ``static_smem``, ``sgprs``); UsageError naming a missing key or a bad value."""
    if isinstance(resources, KernelResources):
        return resources.registers, resources.static_smem, resources.sgprs
    if not isinstance(resources, Mapping):
        raise UsageError(f"resources must be KernelResources or a dict with 'registers' (and optionally "
                         f"'static_smem', 'sgprs'), not {resources!r}")
    if "registers" not in resources:
        raise UsageError(f"resources must have the key 'registers' (and optionally 'static_smem', 'sgprs'); "
                         f"missing 'registers' in {dict(resources)!r}")
    unknown = sorted(map(str, set(resources) - set(RESOURCE_KEYS)))
    if unknown:  # a misspelt key would otherwise be read as 0
        raise UsageError(f"resources keys must be among {', '.join(RESOURCE_KEYS)}, not {', '.join(unknown)}")
    return (_count("resources['registers']", resources["registers"]),
            _count("resources['static_smem']", resources.get("static_smem", 0)),
            _count("resources['sgprs']", resources.get("sgprs", 0)))


def _reserve(reserve) -> Footprint:
    if not isinstance(reserve, Footprint):
        raise UsageError(f"reserve must be a Footprint (e.g. occupancy.NCCL_2_28_SM90), not {reserve!r}")
    return reserve


def _min_smem_for(t: Target, n: int, static_smem: int) -> int:
    """Smallest dynamic smem with which shared memory alone admits at most n blocks per SM."""
    if t.backend == "cuda":
        # floor(smem_per_sm / alloc) <= n  <=>  alloc > smem_per_sm / (n + 1)
        alloc = _round_up(t.smem_per_sm // (n + 1) + 1, t.smem_alloc_unit)
        return max(0, alloc - static_smem - t.reserved_smem_per_block)
    return max(0, t.smem_per_sm // (n + 1) + 1 - static_smem)


def fits(t: Target, occ: Occupancy, n: int, block_size: int, registers: int,
         r: Footprint) -> tuple[str, str] | None:
    """None if n compute blocks (as ``occ`` allocates them) and the footprint ``r`` fit on one SM
    of ``t``, else (the resource short, a message with the numbers)."""
    w = t.warp_size
    c_warps, r_warps = -(-block_size // w), -(-r.threads // w)
    max_warps = t.max_threads_per_sm // w
    if n * c_warps + r.blocks * r_warps > max_warps:
        return "threads", (f"{n} compute blocks x {c_warps} warps + {r.blocks} x {r_warps} warps of {r.name} "
                           f"> {max_warps} warps per SM")
    if n + r.blocks > t.max_blocks_per_sm:
        return "blocks", f"{n} compute blocks + {r.blocks} of {r.name} > {t.max_blocks_per_sm} block slots per SM"
    parts = t.subpartitions_per_sm
    if t.backend == "cuda":
        c_reg, r_reg = _cuda_regs_per_warp(t, registers), _cuda_regs_per_warp(t, r.registers)
        per_part = t.regs_per_sm // parts
        # Each kernel's warps spread over the sub-partitions; count the fuller ones.
        need = -(-n * c_warps // parts) * c_reg + -(-r.blocks * r_warps // parts) * r_reg
        if need > per_part:
            return "registers", (f"{n} compute blocks ({n * c_warps} warps x {c_reg} registers) + {r.blocks} x "
                                 f"{r.name} ({r.blocks * r_warps} warps x {r_reg} registers) need {need} registers "
                                 f"in a sub-partition of {per_part} ({t.regs_per_sm} per SM)")
        r_smem = _cuda_smem_per_block(t, r.static_smem, r.dynamic_smem)
    else:
        waves = _hip_waves_per_simd(t, registers, 0)
        vgpr_file = t.regs_per_sm // parts // w
        granule = t.reg_alloc_unit // w
        need = (-(-n * c_warps // parts) * _round_up(registers, granule)
                + -(-r.blocks * r_warps // parts) * _round_up(r.registers, granule))
        if need > vgpr_file or -(-n * c_warps // parts) + -(-r.blocks * r_warps // parts) > waves["warps"]:
            return "registers", (f"{n} compute blocks ({n * c_warps} waves x {registers} VGPRs) + {r.blocks} x "
                                 f"{r.name} ({r.blocks * r_warps} waves x {r.registers} VGPRs) need {need} VGPRs "
                                 f"per lane of a SIMD that has {vgpr_file}")
        r_smem = r.static_smem + r.dynamic_smem
    used = n * occ.smem_per_block + r.blocks * r_smem
    if used > t.smem_per_sm:
        return "shared_memory", (f"{n} compute blocks x {occ.smem_per_block} B + {r.blocks} x {r.name} x {r_smem} B "
                                 f"= {used} B > {t.smem_per_sm} B per SM")
    return None


def shape(target: "Target | str", resources: Any, block_size: int, *, resident_blocks: int | None = None,
          reserve: Footprint | None = None) -> Shaping:
    """The dynamic shared memory that caps a compute kernel at N resident blocks per SM.

    ``resources``: the kernel's :class:`KernelResources` (or a dict with ``registers`` and
    ``static_smem``). With ``reserve`` (a :class:`Footprint`), N is the largest residency that
    leaves the footprint room on every resource, or exactly ``resident_blocks`` if given (an
    error if that leaves no room). Without ``reserve``, ``resident_blocks`` is required.
    A request that cannot be met raises :class:`ShimrtError` naming the resource and numbers.
    """
    t = _get_target(target)
    registers, static_smem, sgprs = resource_counts(resources)
    block_size = _count("block_size", block_size, 1)
    if reserve is not None:
        _reserve(reserve)
    if resident_blocks is not None:
        resident_blocks = _count("resident_blocks", resident_blocks, 1)
    if reserve is None and resident_blocks is None:
        raise UsageError("shape() needs resident_blocks, a reserve Footprint, or both")
    natural = occupancy(t, block_size=block_size, registers=registers, static_smem=static_smem, sgprs=sgprs)
    if natural.blocks == 0:
        raise UsageError(f"a block of {block_size} threads with {registers} registers and {static_smem} B static "
                         f"smem cannot run on {t.name} at all (limited by {', '.join(natural.limited_by)})")
    if resident_blocks is not None:
        if resident_blocks > natural.blocks:
            raise UsageError(f"resident_blocks must be an int in 1..{natural.blocks}, not {resident_blocks}: that is "
                             f"more than fit unshaped ({natural.blocks}, limited by {', '.join(natural.limited_by)})")
        candidates: Sequence[int] = [resident_blocks]
    else:
        candidates = range(natural.blocks, 0, -1)
    failure: tuple[str, str] | None = None
    for n in candidates:
        smem = 0 if natural.blocks <= n else _min_smem_for(t, n, static_smem)
        if static_smem + smem > t.smem_per_block_optin:
            failure = ("shared_memory", f"capping at {n} needs {smem} B of dynamic shared memory, more than the "
                       f"{t.smem_per_block_optin - static_smem} B a block may have")
            continue
        occ = occupancy(t, block_size=block_size, registers=registers, static_smem=static_smem,
                        dynamic_smem=smem, sgprs=sgprs)
        if occ.blocks != n:  # the arithmetic above and the calculator must agree
            raise ShimrtError(f"internal: shaping to {n} blocks gave {occ.blocks} (smem {smem} B)")
        if reserve is not None:
            failure = fits(t, occ, n, block_size, registers, reserve)
            if failure is not None:
                continue
        free = Free(threads=t.max_threads_per_sm - n * _round_up(block_size, t.warp_size),
                    registers=t.regs_per_sm - n * occ.registers_per_block,
                    smem=t.smem_per_sm - n * occ.smem_per_block, blocks=t.max_blocks_per_sm - n)
        why = (f"{t.name}: {block_size}-thread blocks with {registers} registers and {static_smem} B static "
               f"smem fit {natural.blocks} per SM unshaped (limited by {', '.join(natural.limited_by)}); "
               f"{smem} B of dynamic smem ({occ.smem_per_block} B allocated per block) caps them at {n}, leaving "
               f"{free.threads} threads, {free.registers} registers, {free.smem} B smem and {free.blocks} "
               f"block slots per SM" + (f" for {reserve.name}" if reserve is not None else ""))
        return Shaping(t, block_size, smem, n, natural.blocks, free, reserve, why)
    if failure is None:  # never: a block fits unshaped (refused above), and each candidate skipped says why
        raise ShimrtError(f"internal: shaping on {t.name} tried no candidate")
    resource, message = failure
    raise ShimrtError(f"cannot leave room for {reserve.name if reserve else 'the request'} on {t.name} "
                      f"({resource}): {message}")


def coresident(target: "Target | str", resources: Any, block_size: int, reserve: Footprint) -> int:
    """Unshaped compute blocks that fit on one SM beside ``reserve`` (0: none, the footprint
    takes the SM for itself). How much compute an SM that hosts communication keeps."""
    t = _get_target(target)
    registers, static_smem, sgprs = resource_counts(resources)
    block_size = _count("block_size", block_size, 1)
    _reserve(reserve)
    natural = occupancy(t, block_size=block_size, registers=registers, static_smem=static_smem, sgprs=sgprs)
    for n in range(natural.blocks, -1, -1):
        if fits(t, natural, n, block_size, registers, reserve) is None:
            return n
    raise ShimrtError(f"{reserve.name} does not fit on one SM of {t.name} by itself")
