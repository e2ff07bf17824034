"""NVRTC: CUDA C++ to a CUBIN for exactly one sm_XX, with ptxas' resource report. No GPU needed."""

from __future__ import annotations

import os
import re

from .. import elf, includes
from ..backends import Rtc, members
from ..errors import CompileError
from ..program import KernelResources
from .check import check, describe, nvrtc_bindings
from .check import library_path as _library_path

#: what the core may call (Rtc, :mod:`shimrt.backends`)
__all__ = members(Rtc)

# ptxas -v: "Compiling entry function 'k' for 'sm_90'", then stack/spill and register lines.
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
# PTX: ".visible .entry name(" ... optional ".maxntid x, y, z" before the body.
_PTX_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\((.*?)\)\s*([^{]*)\{", re.S)
_PTX_ENTRY_NAME = re.compile(r"\.entry\s+([\w$]+)\s*\(")
_MAXNTID = re.compile(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def version() -> str:
    """'nvrtc MAJOR.MINOR' of the NVRTC library that will compile."""
    nvrtc = nvrtc_bindings()
    major, minor = check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"nvrtc {major}.{minor}"


def library_path() -> str | None:
    """The NVRTC shared library in use."""
    return _library_path("nvrtc")


def default_options(arch: str) -> list[str]:
    # -Xptxas=-v makes ptxas report registers, smem, stack and spills in the program log.
    options = [f"--gpu-architecture={arch}", "-Xptxas=-v", "--std=c++17"]
    # From 12.9 on, NVRTC reuses CUBINs from the driver's compute cache when a driver is present,
    # skipping ptxas and so its report (seen on an H200 with NVRTC 13.0: an empty log on every
    # repeat). shimrt keeps its own cache, so NVRTC's is turned off.
    nvrtc = nvrtc_bindings()
    if tuple(check(nvrtc.nvrtcVersion(), "nvrtcVersion")) >= (12, 9):
        options.append("--no-cache")
    return options


# How NVRTC finds headers, as strace shows NVRTC 13.5 doing it (NVRTC reports none of it: no API
# lists the files opened, and it refuses -M, -MD, -MF, --dependency-output, --generate-dependencies
# and -H). A quote include looks in the including file's folder (for the main source: the folder of
# its name, taken from the working directory), then in each -I folder; an angled one in the -I
# folders, trying NAME.stdh too for a name without a suffix; --pre-include files are looked for in
# the working directory, then in the -I folders. -Xcudafe hands the front end options shimrt cannot
# read, and precompiled headers in files are read outside any #include.
_INCLUDE_FLAGS = {"-I": ("folder", "joined-eq"), "--include-path": ("folder", "eq"),
                  "--pre-include": ("file", "eq"), "-include": ("file", "eq")}
_UNTRACKED = ("-Xcudafe", "--use-pch", "--use_pch", "--create-pch", "--create_pch", "--pch-dir", "--pch_dir")


def include_search(options: list[str], name: str) -> includes.SearchPath:
    """Where NVRTC will look for the headers of source ``name`` compiled with ``options``."""
    return includes.search_path(options, flags=_INCLUDE_FLAGS, untracked=_UNTRACKED,
                                main_folder=os.path.dirname(name) or ".",
                                alt_suffixes=(".stdh",))


def compile_with_reads(source: str, arch: str, options: list[str], name: str, expressions: tuple[str, ...] = ()
                       ) -> tuple[bytes, str, dict, dict, dict, tuple[str, ...] | None]:
    """:func:`compile_source`, and the files the compiler read: None, since NVRTC cannot say."""
    return (*compile_source(source, arch, options, name, expressions), None)


def _text(buf) -> str:
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def compile_source(source: str, arch: str, options: list[str], name: str,
                   expressions: tuple[str, ...] = ()) -> tuple[bytes, str, dict, dict, dict]:
    """Compile ``source`` for ``arch``; return (cubin, log, {kernel: KernelResources}, {},
    {name expression: its lowered name}). ``expressions`` are C++ names of kernels (``k<float>``,
    ``ns::k``) that NVRTC instantiates and whose lowered (mangled) names it reports
    (nvrtcAddNameExpression, nvrtcGetLoweredName).

    The last item, parameter layouts, stays empty: the CUDA driver reports them at load time.
    """
    nvrtc = nvrtc_bindings()
    prog = check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        for expression in expressions:
            check(nvrtc.nvrtcAddNameExpression(prog, expression.encode()), "nvrtcAddNameExpression")
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * size
        check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log = _text(log)
        if int(err) != 0:
            ename, _, _ = describe(err)
            raise CompileError(f"NVRTC could not compile {name} for {arch}: {ename}",
                               log=log, options=tuple(options), name=name)
        size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        if size == 0:
            raise CompileError(f"NVRTC produced no CUBIN for {arch} (a virtual compute_XX arch gives PTX only)",
                               log=log, options=tuple(options), name=name)
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        size = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * size
        check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        lowered = {e: _lowered(e, nvrtc.nvrtcGetLoweredName(prog, e.encode())) for e in expressions}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    resources = _parse_resources(log, _text(ptx))
    missing = sorted(set(_PTX_ENTRY_NAME.findall(_text(ptx))) - set(resources))
    if missing:
        raise CompileError(f"ptxas reported no resources for {', '.join(missing)} (is -Xptxas=-v "
                           "overridden, or did a compiler cache skip ptxas?)",
                           log=log, options=tuple(options), name=name)
    return bytes(cubin), log, resources, {}, lowered


def _lowered(expression: str, result: tuple) -> str:
    """nvrtcGetLoweredName's answer as text; CompileError naming an expression NVRTC could not
    resolve (no such kernel, or not a __global__ function)."""
    err, value = result
    if int(err) != 0:
        ename, _, _ = describe(err)
        raise CompileError(f"NVRTC could not resolve the name expression {expression!r}: {ename} (it must name a "
                           "__global__ function, with its template arguments)", log="", options=(), name=expression)
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_resources(log: str, ptx: str) -> dict[str, KernelResources]:
    """Per-kernel resources from ptxas' -v report, with launch bounds from the PTX's .maxntid."""
    bounds = {}
    for kernel in _PTX_ENTRY.finditer(ptx):
        nt = _MAXNTID.search(kernel.group(3))
        if nt:
            bounds[kernel.group(1)] = int(nt.group(1)) * int(nt.group(2) or 1) * int(nt.group(3) or 1)
    found: dict[str, dict] = {}
    current = None
    for line in log.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current = found.setdefault(entry.group(1), {"registers": 0, "static_smem": 0,
                                                        "local_bytes": 0, "spill_bytes": 0})
            continue
        if current is None:
            continue
        if (m := _FRAME.search(line)):
            current["local_bytes"], current["spill_bytes"] = int(m.group(1)), int(m.group(2))
        if (m := _USED.search(line)):
            current["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            current["static_smem"] = int(s.group(1)) if s else 0
    return {k: KernelResources(max_threads_per_block=bounds.get(k, 1024), **v) for k, v in found.items()}


def binary_arch(binary: bytes) -> str:
    """The sm_XX a CUBIN was built for, from its ELF header.

    EM_CUDA (190) in e_machine; the SM number sits in e_flags bits 8-15 from CUDA ELF ABI
    version 8 on (EI_ABIVERSION, byte 8) and in bits 0-7 before.
    """
    head = elf.header(binary)
    if head.machine != 190:
        raise ValueError("not a CUDA ELF (CUBIN)")
    sm = (head.flags >> 8) & 0xFF if head.abi_version >= 8 else head.flags & 0xFF
    return f"sm_{sm}"
