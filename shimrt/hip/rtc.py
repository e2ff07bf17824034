"""hipRTC: HIP C++ to an AMDGPU code object for one gfx target, with the resources its
metadata records. No GPU needed.

Resources come from the code object's AMDGPU metadata note (NT_AMDGPU_METADATA, a msgpack
map; see LLVM's AMDGPUUsage "Code Object V3+ Metadata"): VGPRs, AGPRs, SGPRs, static LDS
(group segment), scratch (private segment), wavefront size and max flat workgroup size.
"""

from __future__ import annotations

from .. import elf
from ..errors import CompileError, NoDeviceError
from ..program import KernelResources
from .check import _bindings, check, describe, loaded
from .check import library_path as _library_path

EM_AMDGPU = 224
NT_AMDGPU_METADATA = 32


def version() -> str:
    """'hiprtc MAJOR.MINOR (HIP runtime N)' of the hipRTC that will compile."""
    hip, hiprtc = _bindings()
    major, minor = loaded(lambda: check(hiprtc.hiprtcVersion(), "hiprtcVersion"))
    runtime = loaded(lambda: check(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion"))
    return f"hiprtc {major}.{minor} (HIP runtime {runtime})"


def library_path() -> str | None:
    """The hipRTC shared library in use."""
    return _library_path("libhiprtc.so")


def default_options(arch: str) -> list[str]:
    return [f"--offload-arch={arch}", "-O3", "-std=c++17"]


def compile_source(source: str, arch: str, options: list[str], name: str) -> tuple[bytes, str, dict, dict]:
    """Compile ``source`` for ``arch``; return (code object, log, {kernel: KernelResources},
    {kernel: ((offset, size), ...)})."""
    _, hiprtc = _bindings()
    prog = loaded(lambda: check(hiprtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, None, None),
                                "hiprtcCreateProgram"))
    try:
        opts = [o.encode() for o in options]
        (err,) = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        size = check(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        log = bytearray(size)
        if size:
            check(hiprtc.hiprtcGetProgramLog(prog, log), "hiprtcGetProgramLog")
        log = bytes(log).rstrip(b"\0").decode(errors="replace")
        if int(err) != 0:
            ename, _, _ = describe(err)
            raise CompileError(f"hipRTC could not compile {name} for {arch}: {ename}",
                               log=log, options=tuple(options), name=name)
        size = check(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        code = bytearray(size)
        check(hiprtc.hiprtcGetCode(prog, code), "hiprtcGetCode")
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())  # takes hiprtcProgram*
    code = bytes(code)
    built = binary_arch(code)
    if built != arch:
        raise CompileError(f"hipRTC built for {built}, not {arch}", log=log, options=tuple(options), name=name)
    resources, params = _parse_metadata(code)
    return code, log, resources, params


def metadata(code: bytes) -> dict:
    """The code object's AMDGPU metadata map (msgpack in the 'AMDGPU' note)."""
    try:
        import msgpack
    except ImportError:
        raise NoDeviceError("reading AMDGPU code objects needs msgpack (pip install 'shimrt[hip]')") from None
    for name, ntype, desc in elf.notes(code):
        if name == "AMDGPU" and ntype == NT_AMDGPU_METADATA:
            return msgpack.unpackb(desc)
    raise ValueError("no AMDGPU metadata note in the code object")


def _parse_metadata(code: bytes) -> tuple[dict, dict]:
    """({kernel: KernelResources}, {kernel: ((offset, size), ...) of explicit parameters})."""
    resources, params = {}, {}
    for k in metadata(code).get("amdhsa.kernels", []):
        name = k[".name"]
        resources[name] = KernelResources(
            registers=k[".vgpr_count"],
            static_smem=k[".group_segment_fixed_size"],
            local_bytes=k[".private_segment_fixed_size"],
            spill_bytes=4 * k.get(".vgpr_spill_count", 0),  # spilled VGPRs are dwords per lane
            max_threads_per_block=k[".max_flat_workgroup_size"],
            extra={"agprs": k.get(".agpr_count", 0), "sgprs": k[".sgpr_count"],
                   "sgpr_spills": k.get(".sgpr_spill_count", 0), "wavefront_size": k[".wavefront_size"]})
        # Hidden arguments (hidden_*) are filled in by the runtime, not passed by the caller.
        params[name] = tuple((a[".offset"], a[".size"]) for a in k.get(".args", [])
                             if not a[".value_kind"].startswith("hidden_"))
    return resources, params


def binary_arch(binary: bytes) -> str:
    """The gfx target of a code object, from its metadata (amdhsa.target, e.g.
    'amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-' -> 'gfx90a')."""
    if elf.header(binary).machine != EM_AMDGPU:
        raise ValueError("not an AMDGPU code object")
    target = metadata(binary)["amdhsa.target"]
    return target.rsplit("-", 1)[-1].split(":", 1)[0]
