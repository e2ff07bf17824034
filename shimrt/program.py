"""What a compile produces: the binary and what the compiler says each kernel needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from .targets import Target


@dataclass(frozen=True)
class KernelResources:
    """Per-kernel resources from the compiler's report.

    ``registers`` per thread (for AMD: the code object's ``.vgpr_count``, which on gfx90a is the
    combined ArchVGPR + AccVGPR total; ``extra`` holds AGPRs, SGPRs and the wavefront size),
    ``static_smem`` bytes of static shared memory (LDS), ``local_bytes`` of stack frame /
    scratch per thread, ``spill_bytes`` stored to local memory by register spills,
    ``max_threads_per_block`` the launch bound the kernel was compiled for.
    """

    registers: int
    static_smem: int
    local_bytes: int
    spill_bytes: int
    max_threads_per_block: int
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def sgprs(self) -> int:
        """Scalar registers per wave (AMD code objects; 0 where the compiler reports none)."""
        return int(self.extra.get("sgprs", 0))

    def to_dict(self) -> dict:
        return {"registers": self.registers, "static_smem": self.static_smem,
                "local_bytes": self.local_bytes, "spill_bytes": self.spill_bytes,
                "max_threads_per_block": self.max_threads_per_block, "extra": dict(self.extra)}

    @classmethod
    def from_dict(cls, d: dict) -> "KernelResources":
        return cls(int(d["registers"]), int(d["static_smem"]), int(d["local_bytes"]),
                   int(d["spill_bytes"]), int(d["max_threads_per_block"]), dict(d.get("extra", {})))


@dataclass(frozen=True)
class Program:
    """A compiled program: ``binary`` (CUBIN or AMDGPU code object) for exactly ``target``."""

    binary: bytes
    log: str
    target: Target
    resources: dict[str, KernelResources]
    name: str = "kernel.cu"
    options: tuple[str, ...] = ()
    compiler: str = ""          # e.g. "nvrtc 13.5"
    from_cache: bool = field(default=False, compare=False)
    # kernel -> ((offset, size), ...) of its explicit parameters, where the compiler's metadata
    # says (AMDGPU code objects); CUDA asks the driver instead (cuFuncGetParamInfo).
    params: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @property
    def kernels(self) -> list[str]:
        """Names of the kernels (entry functions) in the program."""
        return sorted(self.resources)
