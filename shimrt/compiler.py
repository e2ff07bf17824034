"""``compile()``: source to a :class:`Program` for one target, through NVRTC or hipRTC, cached on disk.

The cache key covers everything the compile reads: the source, its name, every option (the include
folders among them), the arch, the compiler (its version and the library file that will compile),
and every header the source can reach through the compiler's search path, found by
:func:`shimrt.includes.scan` before each lookup: every file the search could open (any extension,
through ``include_dirs``, ``-I`` in any spelling, an absolute path, the including file's folder or a
forced include, at any depth) with the SHA-256 of its bytes, so a changed header, and a header that
appears earlier on the search path, are misses. Where the compiler itself lists what it read
(hipRTC), files the scan could not predict (system headers) are stored with the entry and checked
before it is served. A source whose headers cannot be known (a header named by a macro, an option
such as ``-Xcudafe``) compiles without the cache, with one warning.

Entries are written atomically and carry a SHA-256, their own key and metadata checked field by
field (:mod:`shimrt.cache`); anything else is recompiled and rewritten, never trusted.

C++ kernels keep mangled names: ``name_expressions`` (``["k<float>", "ns::scale"]``) asks the
compiler to instantiate and lower them, and the Program maps each back (``program.kernel(e)``,
``module[e]``). A source that defines ``__global__`` functions none of which the Program can reach
by a plain name (no ``extern "C"``, no name expression: a template that was never instantiated
yields no kernel at all) compiles with a warning saying so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable

from . import backends, includes, kernels, targets, validate
from . import cache as disk
from .config import settings
from .errors import CompileError, UsageError
from .program import Program
from .targets import Target

__all__ = ["compile"]

# Options that pick the GPU architecture (NVRTC's, hipRTC's and clang's spellings): the target
# does that, and an option saying otherwise would label a Program with an arch its binary is not.
_ARCH_OPTION = re.compile(r"^--?(gpu-architecture|arch|offload-arch|cuda-gpu-arch|amdgpu-target|march|mcpu|"
                          r"gencode|generate-code|gpu-code)(?:[=\s]|$)", re.IGNORECASE)


def compile(source: str, target: "str | Target", *, options: Iterable[str] = (), name: str = "kernel.cu",
            include_dirs: "str | os.PathLike | Iterable[str | os.PathLike] | None" = None,
            cache: bool | None = None, name_expressions: Iterable[str] = ()) -> Program:
    """Compile ``source`` for ``target`` (a :class:`Target` or a name such as "sm_90", "H200").

    ``options``: a list of compiler options (not the architecture: ``target`` sets it).
    ``include_dirs``: one folder or a list of folders, each of which must exist; ``kernels_src/``
    is on the include path unless this replaces it. No GPU is needed. ``cache``: True or False,
    or None to follow ``SHIMRT_DISABLE_CACHE``. ``name_expressions``: C++ names of kernels
    (``"k<float>"``) to instantiate and reach by that name (``program.kernel``, ``module[...]``).
    Raises :class:`CompileError` with the log, and :class:`UsageError` for a bad argument.
    """
    source = validate.text(source, "source")
    name = validate.text(name, "name")
    options = _options(options)
    expressions = _expressions(name_expressions)
    if cache is not None:
        cache = validate.boolean(cache, "cache")
    target = targets.get(target)
    dirs = kernels.include_folders(include_dirs)
    backend = backends.load(target.backend, "rtc")
    full = tuple(backend.default_options(target.arch)) + tuple(f"-I{d}" for d in dirs) + options
    cfg = settings()
    use_cache = cfg.cache_enabled if cache is None else cache
    job = _Job(backend, source, target, name, full, backend.version(), expressions)
    try:
        program = job.cached(cfg.cache_dir) if use_cache else job.program(*backend.compile_source(*job.args))
    except CompileError as exc:
        raise _said_of_expressions(exc, expressions) from None
    _warn_unreachable(source, program)
    return program


def _said_of_expressions(exc: CompileError, expressions: tuple[str, ...]) -> CompileError:
    """``exc`` with a first line naming the name expression the compiler could not read, where
    its log says so (NVRTC compiles each in a pragma of its own, "__nv_name_map"); the log stays."""
    if not expressions or "__nv_name_map" not in exc.log:
        return exc
    bad = [e for e in expressions if re.search(r"nv_mangled_name\s+" + re.escape(e) + r"\s*$", exc.log, re.M)]
    first = next((line.split("error:", 1)[1].strip() for line in exc.log.splitlines() if "error:" in line), "")
    shown = ", ".join(repr(e) for e in bad) if bad else "one of " + ", ".join(repr(e) for e in expressions)
    return CompileError(f"name expression {shown} names no kernel the source can instantiate ({first}): "
                        "write it as the kernel's C++ name with its template arguments, e.g. 'scale<float>'",
                        log=exc.log, options=exc.options, name=exc.name)


class _Job:
    """One compile: its inputs, the backend that runs it, and the way through the cache."""

    def __init__(self, backend: Any, source: str, target: Target, name: str, options: tuple[str, ...],
                 compiler: str, expressions: tuple[str, ...] = ()):
        self.backend, self.source, self.target, self.name = backend, source, target, name
        self.options, self.compiler, self.expressions = options, compiler, expressions
        self.args = (source, target.arch, list(options), name, expressions)

    def program(self, binary: bytes, log: str, resources: dict, params: dict, names: dict, *,
                from_cache: bool = False) -> Program:
        return Program(binary=binary, log=log, target=self.target, resources=resources, name=self.name,
                       options=self.options, compiler=self.compiler, params=params, names=names,
                       from_cache=from_cache)

    def cached(self, folder: Path) -> Program:
        search = self.backend.include_search(list(self.options), self.name)
        before = includes.scan(self.source, search)
        if before.untracked:
            disk.warn_once(folder, before.untracked,
                           f"shimrt: compiling {self.name} without the cache: {before.untracked}")
            return self.program(*self.backend.compile_source(*self.args))
        key = self.key(before)
        entry = disk.load(folder, key)
        if entry is not None and all(includes.file_digest(p) == d for p, d in entry.reads.items()):
            try:
                return self.program(entry.binary, entry.log, entry.resources, entry.params, entry.names,
                                    from_cache=True)
            except UsageError as exc:  # what the cache checks cannot see, the Program refuses
                disk.warn_once(folder, "invalid", f"shimrt: ignoring the compile cache entry {key}: {exc}")
        binary, log, resources, params, names, read = self.backend.compile_with_reads(*self.args)
        program = self.program(binary, log, resources, params, names)
        # A header changed while the compiler read it: the key may not describe this binary.
        if includes.scan(self.source, search).digest() == before.digest():
            reads = _reported(read, before)
            if reads is not None:
                disk.store(folder, key, disk.Entry(binary, log, resources, params, reads, names))
        return program

    def key(self, scan: includes.Scan) -> str:
        blob = json.dumps({"format": disk.MAGIC.decode(), "source": self.source, "name": self.name,
                           "options": list(self.options), "arch": self.target.arch,
                           "name_expressions": list(self.expressions),
                           "compiler": [self.compiler, _library_stamp(self.backend.library_path())],
                           "headers": scan.digest()}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _reported(read: tuple[str, ...] | None, scan: includes.Scan) -> dict[str, str] | None:
    """{path: SHA-256} of the files the compiler says it read that the scan did not predict;
    None when one of them cannot be read now (the entry could not be checked later)."""
    known = set(scan.inputs)
    extra = {}
    for path in read or ():
        path = includes.canonical(path)
        if path in known or path in extra:
            continue
        digest = includes.file_digest(path, disk.MAX_ENTRY_BYTES)
        if digest is None:
            return None
        extra[path] = digest
    return extra


def _library_stamp(path: str | None) -> list:
    """The compiler library's path, size and modification time: a patch release that keeps the
    version number (nvrtc 13.5) still changes the key."""
    if not path:
        return []
    try:
        st = os.stat(path)
    except OSError:
        return [path]
    return [os.path.realpath(path), st.st_size, st.st_mtime_ns]


#: A __global__ function's definition (its declaration's name is the word before the first "(").
_GLOBAL = re.compile(r"__global__[^;{(]*?\b(\w+)\s*\(")


def _warn_unreachable(source: str, program: Program) -> None:
    """Warn where ``source`` defines __global__ functions and ``program`` has no kernel reachable by
    a plain name: every one mangled (C++ linkage) and no name expression given, or none at all (a
    template never instantiated)."""
    defined = _GLOBAL.findall(re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S))
    if not defined or program.names or any(not k.startswith("_Z") for k in program.kernels):
        return
    found = f"only mangled names ({', '.join(program.kernels[:4])})" if program.kernels else "no kernel at all"
    warnings.warn(f"shimrt.compile: {program.name} defines __global__ {', '.join(sorted(set(defined))[:4])} but "
                  f"the program has {found}: declare kernels extern \"C\" (or SHIMRT_KERNEL), or pass "
                  f"name_expressions=[\"{defined[0]}<...>\"] to instantiate and reach C++ and template kernels",
                  stacklevel=3)


def _expressions(expressions: Any) -> tuple[str, ...]:
    """``name_expressions`` as a tuple of distinct non-empty strings."""
    if isinstance(expressions, (str, bytes)) or not isinstance(expressions, (list, tuple)):
        raise UsageError(f"name_expressions must be a list of C++ kernel names such as ['k<float>'], not "
                         f"{validate.shown(expressions)}")
    for e in expressions:
        validate.text(e, "each name expression")
    if len(set(expressions)) != len(expressions):
        raise UsageError(f"name_expressions must list each name once, not {list(expressions)!r:.200}")
    return tuple(expressions)


def _options(options) -> tuple[str, ...]:
    """``options`` as a tuple of strings; refuses one string (which would be split into characters)
    and options that set the architecture."""
    if not isinstance(options, (list, tuple)):
        raise UsageError(f"options must be a sequence of strings (a list or tuple) such as ['-DN=4'], not {options!r}")
    for option in options:
        validate.text(option, "each option")
        if _ARCH_OPTION.match(option.strip()):
            raise UsageError(f"options must not set the architecture: pass the target instead "
                             f"(shimrt.compile(source, 'sm_80') or 'gfx90a'), not {option!r}")
    return tuple(options)
