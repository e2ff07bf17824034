"""``compile()``: source to a :class:`Program` for one target, through NVRTC or hipRTC, cached on disk.

The cache key covers everything that changes the output: the source, its name, the options,
the arch, the compiler's version and the contents of every header in the include folders.
Entries are written atomically (temporary file + rename) and carry a SHA-256 of their bytes;
an entry that fails the check is recompiled and rewritten, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Iterable

from . import backends, kernels, targets, validate
from .config import settings
from .errors import UsageError
from .program import KernelResources, Program
from .targets import Target

log = logging.getLogger(__name__)

_MAGIC = b"SHIMRT-PROGRAM-2\n"
_DIGEST = 32


# Options that pick the GPU architecture (NVRTC's, hipRTC's and clang's spellings): the target
# does that, and an option saying otherwise would label a Program with an arch its binary is not.
_ARCH_OPTION = re.compile(r"^--?(gpu-architecture|arch|offload-arch|cuda-gpu-arch|amdgpu-target|march|mcpu|"
                          r"gencode|generate-code|gpu-code)(?:[=\s]|$)", re.IGNORECASE)


def compile(source: str, target: "str | Target", *, options: Iterable[str] = (), name: str = "kernel.cu",
            include_dirs: "str | os.PathLike | Iterable[str | os.PathLike] | None" = None,
            cache: bool | None = None) -> Program:
    """Compile ``source`` for ``target`` (a :class:`Target` or a name such as "sm_90", "H200").

    ``options``: a list of compiler options (not the architecture: ``target`` sets it).
    ``include_dirs``: one folder or a list of folders, each of which must exist; ``kernels_src/``
    is on the include path unless this replaces it. No GPU is needed. ``cache``: True or False,
    or None to follow ``SHIMRT_DISABLE_CACHE``. Raises :class:`CompileError` with the log, and
    :class:`UsageError` for a bad argument.
    """
    source = validate.text(source, "source")
    name = validate.text(name, "name")
    options = _options(options)
    if cache is not None:
        cache = validate.boolean(cache, "cache")
    target = targets.get(target)
    dirs = kernels.include_folders(include_dirs)
    backend = backends.load(target.backend, "rtc")
    full = tuple(backend.default_options(target.arch)) + tuple(f"-I{d}" for d in dirs) + options
    cfg = settings()
    use_cache = cfg.cache_enabled if cache is None else cache
    compiler = backend.version()
    entry = None
    if use_cache:
        entry = cfg.cache_dir / (_key(source, name, options, target.arch, compiler, dirs) + ".bin")
        cached = _read(entry)
        if cached is not None:
            binary, meta = cached
            try:
                return Program(binary=binary, log=meta["log"], target=target, name=name, options=full,
                               compiler=compiler, from_cache=True,
                               resources={k: KernelResources.from_dict(v) for k, v in meta["resources"].items()},
                               params={k: tuple(tuple(p) for p in v) for k, v in meta.get("params", {}).items()})
            except (KeyError, TypeError, ValueError) as exc:  # UsageError is a ValueError too
                log.warning("shimrt: ignoring corrupt cache entry %s (%s); recompiling", entry, exc)
    binary, text, resources, params = backend.compile_source(source, target.arch, list(full), name)
    program = Program(binary=binary, log=text, target=target, resources=resources, name=name,
                      options=full, compiler=compiler, params=params)
    if entry is not None:
        _write(entry, program)
    return program


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


def _key(source, name, options, arch, compiler, dirs) -> str:
    h = hashlib.sha256()
    headers = {}
    for d in dirs:
        for p in kernels.headers([d]):
            headers[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
    blob = json.dumps({"source": source, "name": name, "options": list(options), "arch": arch,
                       "compiler": compiler, "headers": headers, "format": _MAGIC.decode()}, sort_keys=True)
    h.update(blob.encode())
    return h.hexdigest()


def _read(path: Path):
    """(binary, meta) of a valid entry, or None for a miss or a corrupt entry."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        body, digest = data[:-_DIGEST], data[-_DIGEST:]
        if not body.startswith(_MAGIC) or hashlib.sha256(body).digest() != digest:
            raise ValueError("bad magic or checksum")
        rest = body[len(_MAGIC):]
        meta_len = int.from_bytes(rest[:8], "little")
        meta = json.loads(rest[8:8 + meta_len])
        binary = rest[8 + meta_len:]
        if len(binary) != meta["binary_size"]:
            raise ValueError("truncated")
        return binary, meta
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("shimrt: ignoring corrupt cache entry %s (%s); recompiling", path, exc)
        return None


def _write(path: Path, program: Program) -> None:
    meta = json.dumps({"log": program.log, "binary_size": len(program.binary),
                       "resources": {k: v.to_dict() for k, v in program.resources.items()},
                       "params": {k: [list(p) for p in v] for k, v in program.params.items()}}).encode()
    body = _MAGIC + len(meta).to_bytes(8, "little") + meta + program.binary
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body + hashlib.sha256(body).digest())
            os.replace(tmp, path)  # atomic: readers see the old entry or the whole new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:  # an unwritable cache slows compiles down; it must not fail them
        log.warning("shimrt: could not write the compile cache at %s: %s", path.parent, exc)
