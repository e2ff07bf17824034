"""What a compile produces: the binary and what the compiler says each kernel needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import validate
from .errors import UsageError
from .targets import Target

__all__ = ["KernelResources", "Program"]


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

    def __post_init__(self) -> None:
        for name in ("registers", "static_smem", "local_bytes", "spill_bytes"):
            object.__setattr__(self, name, validate.integer(getattr(self, name), f"KernelResources.{name}", least=0))
        object.__setattr__(self, "max_threads_per_block", validate.integer(
            self.max_threads_per_block, "KernelResources.max_threads_per_block", least=1))
        if not isinstance(self.extra, dict):
            raise UsageError(f"KernelResources.extra must be a dict, not {self.extra!r}")

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
        """The inverse of :meth:`to_dict`; UsageError naming a missing or bad entry."""
        if not isinstance(d, dict):
            raise UsageError(f"KernelResources.from_dict takes a dict, not {d!r}")
        names = ("registers", "static_smem", "local_bytes", "spill_bytes", "max_threads_per_block")
        missing = [n for n in names if n not in d]
        if missing:
            raise UsageError(f"KernelResources.from_dict needs {', '.join(names)}; missing {', '.join(missing)}")
        return cls(**{n: d[n] for n in names}, extra=dict(d.get("extra", {})))


class Resources(dict):
    """A program's kernel name -> :class:`KernelResources`, where a name expression given to
    ``compile(..., name_expressions=...)`` (``"k<float>"``) finds its kernel too."""

    def __init__(self, resources: dict, names: dict[str, str]):
        super().__init__(resources)
        self.names = dict(names)

    def __missing__(self, name: Any) -> KernelResources:
        if isinstance(name, str) and name in self.names:
            return self[self.names[name]]
        raise KeyError(name)

    def get(self, name: Any, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and name in self.names)


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
    #: name expression given to compile() ("k<float>") -> the kernel's lowered (mangled) name
    names: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A Program is loaded as it is (Device.load): what is not a binary for ``target`` must not get there.
        if not isinstance(self.binary, bytes) or not self.binary:
            shown = self.binary[:16] if isinstance(self.binary, (bytes, bytearray, str)) else self.binary
            raise UsageError(f"Program.binary must be non-empty bytes (a CUBIN or code object), not {shown!r}")
        if not isinstance(self.target, Target):
            raise UsageError(f"Program.target must be a Target, not {self.target!r}")
        if not isinstance(self.log, str):
            raise UsageError(f"Program.log must be a str, not {self.log!r}")
        validate.text(self.name, "Program.name")
        if not isinstance(self.resources, dict) or not all(
                isinstance(k, str) and isinstance(v, KernelResources) for k, v in self.resources.items()):
            raise UsageError(f"Program.resources must be a dict of kernel name -> KernelResources, "
                             f"not {self.resources!r}")
        if not isinstance(self.options, tuple) or not all(isinstance(o, str) for o in self.options):
            raise UsageError(f"Program.options must be a tuple of strings, not {self.options!r}")
        object.__setattr__(self, "params", _layouts(self.params))
        if not isinstance(self.names, dict) or not all(
                isinstance(k, str) and k and v in self.resources for k, v in self.names.items()):
            raise UsageError(f"Program.names must be a dict of name expression -> a kernel of the program, "
                             f"not {self.names!r:.200}")
        # resources["k<float>"] finds a kernel by a name expression of the compile too
        object.__setattr__(self, "resources", Resources(self.resources, self.names))

    @property
    def kernels(self) -> list[str]:
        """Names of the kernels (entry functions) in the program."""
        return sorted(self.resources)

    def kernel(self, name: str) -> str:
        """The name in the binary of kernel ``name``: a kernel's own name, or a name expression
        given to ``compile(..., name_expressions=...)`` (``"k<float>"``) mapped to its lowered
        name. UsageError naming what the program has."""
        if isinstance(name, str) and name in self.names:
            return self.names[name]
        if isinstance(name, str) and name in self.resources:
            return name
        known = ", ".join([*self.kernels, *(f"{e} ({n})" for e, n in self.names.items())]) or "no kernels"
        raise UsageError(f"kernel must be a kernel or name expression of {self.name}, not {name!r:.100}; it has: "
                         f"{known}")


def _layouts(params: object) -> dict[str, tuple[tuple[int, int], ...]]:
    """``params`` as {kernel: ((offset, size), ...)}, each a pair of ints >= 0; UsageError otherwise."""
    def pair(p: object) -> bool:
        return isinstance(p, (tuple, list)) and len(p) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in p)
    if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, (tuple, list)) and all(pair(p) for p in v) for k, v in params.items()):
        raise UsageError(f"Program.params must be a dict of kernel name -> ((offset, size), ...) pairs of ints >= 0, "
                         f"not {params!r}")
    return {k: tuple((p[0], p[1]) for p in v) for k, v in params.items()}
