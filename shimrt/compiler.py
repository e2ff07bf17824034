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
import tempfile
from pathlib import Path
from typing import Iterable

from . import backends, kernels, targets
from .config import settings
from .errors import UsageError
from .program import KernelResources, Program
from .targets import Target

log = logging.getLogger(__name__)

_MAGIC = b"SHIMRT-PROGRAM-2\n"
_DIGEST = 32


def compile(source: str, target: "str | Target", *, options: Iterable[str] = (), name: str = "kernel.cu",
            include_dirs: Iterable[str | os.PathLike] | None = None, cache: bool | None = None) -> Program:
    """Compile ``source`` for ``target`` (a :class:`Target` or a name such as "sm_90", "H200").

    ``kernels_src/`` is on the include path unless ``include_dirs`` replaces it. No GPU is needed.
    ``cache=None`` follows ``SHIMRT_DISABLE_CACHE``. Raises :class:`CompileError` with the log.
    """
    if not isinstance(source, str):
        raise UsageError(f"source must be str, not {type(source).__name__}")
    if isinstance(options, (str, bytes)):
        raise UsageError("options must be a sequence of strings, e.g. ['-DN=4'], not one string")
    options = tuple(options)
    if not all(isinstance(o, str) for o in options):
        raise UsageError("every option must be a str")
    target = targets.get(target)
    dirs = [Path(d).resolve() for d in (include_dirs if include_dirs is not None else [kernels.directory()])]
    backend = backends.load(target.backend, "rtc")
    full = tuple(backend.default_options(target.arch)) + tuple(f"-I{d}" for d in dirs) + options
    cfg = settings()
    use_cache = cfg.cache_enabled if cache is None else bool(cache)
    compiler = backend.version()
    entry = None
    if use_cache:
        entry = cfg.cache_dir / (_key(source, name, options, target.arch, compiler, dirs) + ".bin")
        cached = _read(entry)
        if cached is not None:
            binary, meta = cached
            return Program(binary=binary, log=meta["log"], target=target, name=name, options=full,
                           compiler=compiler, from_cache=True,
                           resources={k: KernelResources.from_dict(v) for k, v in meta["resources"].items()},
                           params={k: tuple(tuple(p) for p in v) for k, v in meta.get("params", {}).items()})
    binary, text, resources, params = backend.compile_source(source, target.arch, list(full), name)
    program = Program(binary=binary, log=text, target=target, resources=resources, name=name,
                      options=full, compiler=compiler, params=params)
    if entry is not None:
        _write(entry, program)
    return program


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
