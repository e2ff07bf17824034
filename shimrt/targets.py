"""GPU target profiles: the per-SM limits the occupancy model and the compiler need.

A :class:`Target` describes one GPU product (or one GCD of a multi-die part). Profiles here are
written from vendor documentation so that plans can be made without owning the GPU; a
:class:`shimrt.Device` builds its own ``Target`` from the real device's attributes.

Sources for the NVIDIA numbers:
- per compute capability (threads, blocks, registers, shared memory per SM and per block, the
  1 KiB reserved per block): CUDA C++ Programming Guide, "Compute Capabilities", table
  "Technical Specifications per Compute Capability"; allocation granularities: the
  ``cuda_occupancy.h`` header shipped with the CUDA runtime (register unit 256 per warp,
  shared memory unit 128 B on 8.x/9.x, 4 sub-partitions per SM).
- SM counts: NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs), NVIDIA A40
  datasheet / GA102 whitepaper (84 SMs), NVIDIA H100 Tensor Core GPU Architecture whitepaper
  (132 SMs for H100 SXM5), H200 (132 SMs: the same GH100 configuration as H100 SXM5, confirmed
  by the device attributes in shared/notes/h200-measurements.md).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, replace
from typing import Any

from . import validate
from .errors import UsageError

__all__ = ["MAX_SMS", "MAX_BLOCK_THREADS", "Target", "get"]

_KIB = 1024

#: Bounds no GPU exceeds, for values given before a device is known (a policy's SMs, a
#: collective's threads per block): the largest have 148 SMs (B200) and 304 CUs (MI300X), and
#: every NVIDIA and AMD GPU runs at most 1024 threads per block.
MAX_SMS = 1024
MAX_BLOCK_THREADS = 1024


@dataclass(frozen=True)
class Target:
    """Resource limits of one GPU (per SM or CU unless said otherwise).

    Fields follow the CUDA names; for AMD targets an SM is a CU and a warp a wavefront.
    """

    name: str
    backend: str                  # "cuda" or "hip"
    arch: str                     # "sm_80", "sm_86", "sm_90", "gfx90a"
    num_sms: int
    warp_size: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    smem_per_sm: int              # bytes of shared memory the SM can give to blocks
    smem_per_block_optin: int     # largest a single block may ask for, after opting in
    reserved_smem_per_block: int  # bytes the driver reserves for every resident block
    max_threads_per_block: int = 1024
    max_smem_per_block_default: int = 48 * 1024  # above this a kernel must opt in
    reg_alloc_unit: int = 256     # registers are allocated per warp in units of this many
    smem_alloc_unit: int = 128    # shared memory per block is rounded up to this
    warp_alloc_granularity: int = 1
    subpartitions_per_sm: int = 4  # register file partitions (NVIDIA) or SIMDs (AMD) per SM/CU
    regs_per_block: int = 65536    # largest register allocation one block may have (NVIDIA)
    sgprs_per_simd: int = 0        # AMD: scalar registers per SIMD (0: not modelled)
    sgpr_alloc_unit: int = 0       # AMD: scalar register allocation granule

    def __post_init__(self) -> None:
        for name in ("name", "arch"):
            validate.text(getattr(self, name), f"Target.{name}")
        validate.one_of(self.backend, "Target.backend", ("cuda", "hip"))
        for name in ("num_sms", "warp_size", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm",
                     "max_regs_per_thread", "smem_per_sm", "smem_per_block_optin", "max_threads_per_block",
                     "max_smem_per_block_default", "reg_alloc_unit", "smem_alloc_unit", "warp_alloc_granularity",
                     "subpartitions_per_sm", "regs_per_block"):
            self._set_int(name, 1)
        for name in ("reserved_smem_per_block", "sgprs_per_simd", "sgpr_alloc_unit"):
            self._set_int(name, 0)
        if self.sgprs_per_simd and not self.sgpr_alloc_unit:  # the occupancy model divides by it
            raise UsageError(f"Target.sgpr_alloc_unit must be an int >= 1 when sgprs_per_simd is set, "
                             f"not {self.sgpr_alloc_unit!r}")

    def _set_int(self, name: str, least: int) -> None:
        # numpy integers (a driver's attributes) become ints, so equal targets compare and hash alike;
        # every field is a device attribute, a C int.
        object.__setattr__(self, name, validate.integer(getattr(self, name), f"Target.{name}", least=least,
                                                        most=validate.MAX_INT32))

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) for CUDA targets, None for others."""
        m = re.fullmatch(r"sm_(\d+)(\d)a?", self.arch)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def with_(self, **changes: Any) -> "Target":
        """A copy with some fields changed (for example a device's measured values)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise UsageError(f"Target has no field {', '.join(unknown)}; its fields are {', '.join(sorted(known))}")
        return replace(self, **changes)


def _mi250x_gcd() -> Target:
    """One GCD of an AMD Instinct MI250X (gfx90a, CDNA2); a CU is an "SM", a wavefront a "warp".

    - 110 CUs per GCD (220 per MI250X), wavefront 64, 64 KiB LDS per CU, 512 KiB VGPR file
      per CU: ROCm documentation, "GPU hardware specifications" table (rocm-docs,
      docs/reference/gpu-specs.rst, MI250X row).
    - 4 SIMDs per CU and 8 wave slots per SIMD on gfx90a (so 32 waves, 2048 work-items per CU):
      LLVM AMDGPU, Utils/AMDGPUBaseInfo.cpp, getEUsPerCU() and getMaxWavesPerEU()
      ("if (isGFX90A(*STI)) return 8").
    - 512 VGPRs per SIMD lane (unified ArchVGPR + AccVGPR, at most 256 of each per wave),
      allocated in granules of 8: AMDGPUBaseInfo.cpp getTotalNumVGPRs(), getVGPRAllocGranule().
      So regs_per_sm = 4 SIMDs x 512 x 64 lanes, and a wave's registers come in 8 x 64.
    - LDS allocated in blocks of 128 dwords (512 B) on GFX7-GFX9: LLVM docs/AMDGPUUsage.rst,
      GRANULATED_LDS_SIZE; at most 64 KiB per workgroup, no opt-in needed.
    - 800 SGPRs per SIMD, allocated in granules of 16: AMDGPUBaseInfo.cpp getTotalNumSGPRs(),
      getSGPRAllocGranule() (ROCm's CLR runtime uses the same, sgprsPerSimd_ = 800).
    - At most 32 workgroups per CU (single-wave workgroups; multi-wave ones are bounded by the
      32 wave slots first): AMDGPUBaseInfo.cpp getMaxWorkGroupsPerCU(). 1024 work-items per
      workgroup: getMaxFlatWorkGroupSize().
    """
    return Target(name="MI250X", backend="hip", arch="gfx90a", num_sms=110, warp_size=64,
                  max_threads_per_sm=2048, max_blocks_per_sm=32, regs_per_sm=4 * 512 * 64,
                  max_regs_per_thread=512, smem_per_sm=64 * _KIB, smem_per_block_optin=64 * _KIB,
                  reserved_smem_per_block=0, max_threads_per_block=1024, max_smem_per_block_default=64 * _KIB,
                  reg_alloc_unit=8 * 64, smem_alloc_unit=512, subpartitions_per_sm=4,
                  sgprs_per_simd=800, sgpr_alloc_unit=16)


def _ampere_hopper(name, arch, num_sms, *, threads, blocks, smem_per_sm, optin):
    return Target(name=name, backend="cuda", arch=arch, num_sms=num_sms, warp_size=32,
                  max_threads_per_sm=threads, max_blocks_per_sm=blocks, regs_per_sm=65536,
                  max_regs_per_thread=255, smem_per_sm=smem_per_sm, smem_per_block_optin=optin,
                  reserved_smem_per_block=1024)



# CC 8.0: 2048 threads, 32 blocks, 164 KiB smem per SM, 163 KiB per block.
# CC 8.6: 1536 threads, 16 blocks, 100 KiB per SM, 99 KiB per block.
# CC 9.0: 2048 threads, 32 blocks, 228 KiB per SM, 227 KiB per block.
PROFILES: dict[str, Target] = {
    t.name: t for t in (
        _ampere_hopper("A100", "sm_80", 108, threads=2048, blocks=32, smem_per_sm=164 * _KIB, optin=163 * _KIB),
        _ampere_hopper("A40", "sm_86", 84, threads=1536, blocks=16, smem_per_sm=100 * _KIB, optin=99 * _KIB),
        _ampere_hopper("H100", "sm_90", 132, threads=2048, blocks=32, smem_per_sm=228 * _KIB, optin=227 * _KIB),
        _ampere_hopper("H200", "sm_90", 132, threads=2048, blocks=32, smem_per_sm=228 * _KIB, optin=227 * _KIB),
        _mi250x_gcd(),
    )
}

# Other spellings users type; keys are lower case with spaces, dashes and underscores removed.
_ALIASES = {
    "h100sxm": "H100", "h100sxm5": "H100", "nvidiah100": "H100", "nvidiah10080gbhbm3": "H100",
    "nvidiah200": "H200", "nvidiaa100": "A100", "nvidiaa40": "A40",
    "mi250": "MI250X", "amdinstinctmi250x": "MI250X", "amdinstinctmi250": "MI250X",
    "a10040gb": "A100", "a10080gb": "A100", "a100sxm": "A100", "a100sxm480gb": "A100",
}

# An arch names the first profile written for it.
_BY_ARCH = {t.arch: t.name for t in reversed(PROFILES.values())}


def _key(text: str) -> str:
    return re.sub(r"[\s_\-]", "", text.lower())


def names() -> list[str]:
    """The profile names, then the arches, that :func:`get` accepts."""
    return list(PROFILES) + sorted(_BY_ARCH)


def get(name: "str | Target") -> Target:
    """The profile for a product name ("H200", "a100") or an arch ("sm_90", "gfx90a").

    Case and separators are ignored. An arch gives the first profile of that arch (sm_90 -> H100).
    """
    if isinstance(name, Target):
        return name
    if not isinstance(name, str):
        raise UsageError(f"target must be a Target or a name such as 'H200' or 'sm_90' (known: {', '.join(names())}), "
                         f"not {validate.shown(name)}")
    key = _key(name)
    for pname in PROFILES:
        if _key(pname) == key:
            return PROFILES[pname]
    if key in _ALIASES:
        return PROFILES[_ALIASES[key]]
    for arch, pname in _BY_ARCH.items():
        if _key(arch) == key:
            return PROFILES[pname]
    raise UsageError(f"target must be one of {', '.join(names())} (or a Target), not {validate.shown(name)}: "
                     "unknown target")
