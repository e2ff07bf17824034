"""hipRTC: HIP C++ to an AMDGPU code object for one gfx target, with the resources its
metadata records. No GPU needed.

Resources come from the code object's AMDGPU metadata note (NT_AMDGPU_METADATA, a msgpack
map; see LLVM's AMDGPUUsage "Code Object V3+ Metadata"): VGPRs, AGPRs, SGPRs, static LDS
(group segment), scratch (private segment), wavefront size and max flat workgroup size.
"""

from __future__ import annotations

import os
import re
import tempfile

from .. import elf, includes
from ..backends import Rtc, members
from ..errors import CompileError, NoDeviceError
from ..program import KernelResources
from .check import bindings, check, describe, loaded
from .check import library_path as _library_path

#: what the core may call (Rtc, :mod:`shimrt.backends`)
__all__ = members(Rtc)

EM_AMDGPU = 224
NT_AMDGPU_METADATA = 32

# How hipRTC finds headers (strace of hipRTC 5.2.3): its options are clang's, and comgr compiles a
# copy of the source in a fresh temporary folder, so a quote include of the main source finds nothing
# beside it; then come comgr's own include folder, the -I, -isystem, -iquote and -idirafter folders,
# and the host's system folders (libstdc++'s, /usr/local/include, /usr/include); clang takes more
# folders from CPATH and CPLUS_INCLUDE_PATH. -include files are looked for in the working directory,
# then in the search folders. Clang's -MD -MF FILE makes it list every file it read, system headers
# too, which compile_with_reads() returns. Options that move the search where shimrt cannot follow
# it (a sysroot, prefixes, response files, modules, -Xclang) make the reads unknowable.
_INCLUDE_FLAGS = {"-I": ("folder", "joined"), "--include-directory": ("folder", "eq"),
                  "-isystem": ("folder", "joined"), "-iquote": ("folder", "joined"),
                  "-idirafter": ("folder", "joined"), "--include-directory-after": ("folder", "eq"),
                  "-cxx-isystem": ("folder", "joined"), "-include": ("file", "joined"),
                  "--include": ("file", "eq"), "-imacros": ("file", "joined"), "--imacros": ("file", "eq")}
_UNTRACKED = ("@", "-I-", "-include-pch", "-iprefix", "-iwithprefix", "-isysroot", "--sysroot", "-isystem-after",
              "-iframework", "-F", "-ivfsoverlay", "-Xclang", "-Xpreprocessor", "-Wp,", "-fmodule", "-fprebuilt",
              "--rocm-path", "--hip-path", "--cuda-path", "--config", "-B", "--gcc-toolchain", "--gcc-install-dir",
              "-resource-dir", "--embed-dir")
#: The environment variables clang reads for include folders (NVRTC reads none): the header scan follows them.
INCLUDE_VARIABLES = ("CPATH", "CPLUS_INCLUDE_PATH")
_MAX_DEPFILE_BYTES = 16 << 20
_DEP_WORD = re.compile(r"(?:\\.|[^\s\\]|\\$)+")


def version() -> str:
    """'hiprtc MAJOR.MINOR (HIP runtime N)' of the hipRTC that will compile."""
    hip, hiprtc = bindings()
    major, minor = loaded(lambda: check(hiprtc.hiprtcVersion(), "hiprtcVersion"))
    runtime = loaded(lambda: check(hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion"))
    return f"hiprtc {major}.{minor} (HIP runtime {runtime})"


def library_path() -> str | None:
    """The hipRTC shared library in use."""
    return _library_path("libhiprtc.so")


def default_options(arch: str) -> list[str]:
    return [f"--offload-arch={arch}", "-O3", "-std=c++17"]


def include_search(options: list[str], name: str) -> includes.SearchPath:
    """Where hipRTC will look for the headers of source ``name`` compiled with ``options`` (and
    the folders clang takes from CPATH and CPLUS_INCLUDE_PATH, an empty entry being the working
    directory)."""
    env = [f"-I{d or '.'}" for var in INCLUDE_VARIABLES for d in os.environ.get(var, "").split(os.pathsep)
           if os.environ.get(var)]
    return includes.search_path(list(options) + env, flags=_INCLUDE_FLAGS, untracked=_UNTRACKED, main_folder=None)


def compile_source(source: str, arch: str, options: list[str], name: str,
                   expressions: tuple[str, ...] = ()) -> tuple[bytes, str, dict, dict, dict]:
    """Compile ``source`` for ``arch``; return (code object, log, {kernel: KernelResources},
    {kernel: ((offset, size), ...)}, {name expression: its lowered name}). ``expressions`` are
    C++ names of kernels (``k<float>``) hipRTC instantiates and lowers (hiprtcAddNameExpression,
    hiprtcGetLoweredName)."""
    return _compile(source, arch, options, name, [], expressions)


def compile_with_reads(source: str, arch: str, options: list[str], name: str, expressions: tuple[str, ...] = ()
                       ) -> tuple[bytes, str, dict, dict, dict, tuple[str, ...] | None]:
    """:func:`compile_source`, and the files the compiler read (clang's -MD -MF): absolute paths,
    comgr's own temporary copies left out; None if hipRTC wrote no list."""
    with tempfile.TemporaryDirectory(prefix="shimrt-deps-") as tmp:
        depfile = os.path.join(tmp, "reads.d")
        code, log, resources, params, lowered = _compile(source, arch, options, name, ["-MD", "-MF", depfile],
                                                         expressions)
        return code, log, resources, params, lowered, _reads(depfile)


def _reads(depfile: str) -> tuple[str, ...] | None:
    """The prerequisites of a make rule clang wrote, less the main source's temporary copy and
    whatever else sat in comgr's temporary folder, if that is gone (it held only comgr's files)."""
    try:
        data = includes.read_regular(depfile, _MAX_DEPFILE_BYTES, follow=False)
    except OSError:
        return None
    if not data:
        return None
    text = data.decode("utf-8", "surrogateescape").replace("\\\r\n", " ").replace("\\\n", " ")
    words = [re.sub(r"\\(.)", r"\1", w).replace("$$", "$") for w in _DEP_WORD.findall(text)]
    if not words or not words[0].endswith(":"):
        return None
    paths = [w for w in words[1:] if w]
    if not paths:
        return None
    comgr = os.path.dirname(os.path.dirname(paths[0]))  # <tmp>/comgr-XXXXXX/input/CompileSource
    internal = comgr not in ("", "/") and not os.path.exists(comgr)
    return tuple(p for p in paths[1:] if os.path.isabs(p) and not (internal and p.startswith(comgr + os.sep)))


def _compile(source: str, arch: str, options: list[str], name: str, extra: list[str],
             expressions: tuple[str, ...] = ()) -> tuple[bytes, str, dict, dict, dict]:
    """compile_source() with ``extra`` options that errors do not show (they are shimrt's, not the caller's)."""
    _, hiprtc = bindings()
    prog = loaded(lambda: check(hiprtc.hiprtcCreateProgram(source.encode(), name.encode(), 0, None, None),
                                "hiprtcCreateProgram"))
    try:
        for expression in expressions:
            check(hiprtc.hiprtcAddNameExpression(prog, expression.encode()), "hiprtcAddNameExpression")
        opts = [o.encode() for o in list(options) + extra]
        (err,) = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        size = check(hiprtc.hiprtcGetProgramLogSize(prog), "hiprtcGetProgramLogSize")
        raw_log = bytearray(size)
        if size:
            check(hiprtc.hiprtcGetProgramLog(prog, raw_log), "hiprtcGetProgramLog")
        log = bytes(raw_log).rstrip(b"\0").decode(errors="replace")
        if int(err) != 0:
            ename, _, _ = describe(err)
            raise CompileError(f"hipRTC could not compile {name} for {arch}: {ename}",
                               log=log, options=tuple(options), name=name)
        size = check(hiprtc.hiprtcGetCodeSize(prog), "hiprtcGetCodeSize")
        raw_code = bytearray(size)
        check(hiprtc.hiprtcGetCode(prog, raw_code), "hiprtcGetCode")
        lowered = {e: _lowered(e, hiprtc.hiprtcGetLoweredName(prog, e.encode())) for e in expressions}
    finally:
        hiprtc.hiprtcDestroyProgram(prog.createRef())  # takes hiprtcProgram*
    code = bytes(raw_code)
    built = binary_arch(code)
    if built != arch:
        raise CompileError(f"hipRTC built for {built}, not {arch}", log=log, options=tuple(options), name=name)
    resources, params = _parse_metadata(code)
    return code, log, resources, params, lowered


def _lowered(expression: str, result: tuple) -> str:
    """hiprtcGetLoweredName's answer as text (hip-python gives a CStr); CompileError naming an
    expression hipRTC could not resolve."""
    err, value = result
    if int(err) != 0 or value is None:
        ename = describe(err)[0] if int(err) != 0 else "no name"
        raise CompileError(f"hipRTC could not resolve the name expression {expression!r}: {ename} (it must name a "
                           "__global__ function, with its template arguments)", log="", options=(), name=expression)
    return value.decode() if hasattr(value, "decode") else str(value)


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
