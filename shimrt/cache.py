"""The compile cache on disk: one file per key, written atomically, read only when that is safe.

An entry is ``MAGIC``, the length of its metadata (8 bytes, little-endian), the metadata (JSON),
the binary and a SHA-256 of everything before it. The metadata holds the entry's own key, so an
entry copied over another key's file is refused, not served; the log, the binary's size, the
resources and parameter layouts of each kernel, and ``reads``: files only the compiler said it read
(hipRTC's system headers), with their SHA-256, which must still match for the entry to be served.

Only a regular file (not a symlink: entries are never written as one) of at most
:data:`MAX_ENTRY_BYTES` is read, opened non-blocking after a stat and checked again once open, so
a FIFO, a device or ``/dev/zero`` can neither hang nor exhaust a compile. Every field of the
metadata is checked before use. Whatever fails is a miss: the caller compiles and rewrites the
entry. Each kind of problem is logged once per cache folder per process, never once per call.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from . import includes
from .errors import UsageError
from .program import KernelResources

__all__ = ["MAX_ENTRY_BYTES", "MAGIC", "Entry", "warn_once", "load", "store"]

log = logging.getLogger(__name__)

#: Entries larger than this are neither read nor written.
MAX_ENTRY_BYTES = 256 << 20
MAGIC = b"SHIMRT-PROGRAM-4\n"
_LENGTH = 8
_DIGEST = 32
_FIELDS = frozenset({"key", "log", "binary_size", "resources", "params", "reads", "names"})
_RESOURCE_FIELDS = frozenset({"registers", "static_smem", "local_bytes", "spill_bytes", "max_threads_per_block",
                              "extra"})
_LIMIT = 2**31 - 1  # no register count, size or offset of a kernel comes near it
_SHA256 = re.compile(r"[0-9a-f]{64}")

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


@dataclass(frozen=True)
class Entry:
    """What an entry holds besides its key: the compile's output and the ``reads`` only the
    compiler reported ({path: SHA-256})."""

    binary: bytes
    log: str
    resources: dict[str, KernelResources]
    params: dict[str, tuple[tuple[int, int], ...]]
    reads: dict[str, str]
    #: name expression -> lowered name (compile's name_expressions)
    names: dict[str, str] = field(default_factory=dict)


def warn_once(folder: object, problem: str, message: str) -> bool:
    """Log ``message`` as a warning unless this ``problem`` was already logged for ``folder`` in
    this process; True when it was logged."""
    topic = (str(folder), problem)
    with _warned_lock:
        if topic in _warned:
            return False
        _warned.add(topic)
    log.warning("%s", message)
    return True


def load(folder: Path, key: str) -> Entry | None:
    """The entry for ``key`` in ``folder``, or None: none yet, or one that cannot be trusted
    (logged once per folder and kind of problem)."""
    path = folder / f"{key}.bin"
    try:
        if not _usable_folder(folder):
            return None
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing cached there (yet)
        return None
    except OSError as exc:
        warn_once(folder, "unreadable", f"shimrt: cannot read the compile cache in {folder}: {exc}; compiling")
        return None
    problem = _unsafe(st)
    if problem:
        _ignore(folder, path, problem[0], problem[1])
        return None
    try:
        data = includes.read_regular(str(path), MAX_ENTRY_BYTES, follow=False)
    except OSError as exc:  # e.g. swapped for a symlink since the lstat (O_NOFOLLOW refuses it)
        _ignore(folder, path, "unreadable", f"cannot be read ({exc})")
        return None
    if data is None:
        _ignore(folder, path, "special", "changed into something other than a regular file while read")
        return None
    try:
        meta, binary = _parse(data)
    except (ValueError, TypeError, RecursionError) as exc:
        _ignore(folder, path, "damaged", f"is damaged ({exc})")
        return None
    try:
        if not isinstance(meta, dict) or not isinstance(meta.get("key"), str):
            raise ValueError("the metadata must be a map with the entry's key")
        if meta["key"] != key:
            _ignore(folder, path, "foreign", "holds the entry of another key (copied or swapped in)")
            return None
        return _entry(meta, binary)
    except (ValueError, TypeError, RecursionError) as exc:  # UsageError is a ValueError
        _ignore(folder, path, "invalid", f"has invalid metadata ({exc})")
        return None


def store(folder: Path, key: str, entry: Entry) -> None:
    """Write ``entry`` for ``key`` atomically (a temporary file renamed over the old entry, or a
    FIFO or symlink where it should be). A cache that cannot be written is logged once; the
    compile it would have saved has already succeeded."""
    meta = json.dumps({"key": key, "log": entry.log, "binary_size": len(entry.binary),
                       "resources": {k: v.to_dict() for k, v in entry.resources.items()},
                       "params": {k: [list(p) for p in v] for k, v in entry.params.items()},
                       "reads": entry.reads, "names": entry.names}).encode()
    body = MAGIC + len(meta).to_bytes(_LENGTH, "little") + meta + entry.binary
    if len(body) + _DIGEST > MAX_ENTRY_BYTES:
        warn_once(folder, "program-too-large", f"shimrt: a compiled program of {len(body)} bytes is larger than the "
                                               f"cache's limit of {MAX_ENTRY_BYTES} bytes; it is not cached")
        return
    try:
        if os.path.lexists(folder) and not _usable_folder(folder):
            return
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # private: entries are code that will run
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body + hashlib.sha256(body).digest())
            os.replace(tmp, folder / f"{key}.bin")  # readers see the old entry or the whole new one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:  # an unwritable cache slows compiles down; it must not fail them
        warn_once(folder, "unwritable", f"shimrt: could not write the compile cache in {folder}: {exc}; "
                                        "compiling without it")


def _usable_folder(folder: Path) -> bool:
    """Whether ``folder`` is a folder (FileNotFoundError passes on); warns once when it is not."""
    if stat.S_ISDIR(os.stat(folder).st_mode):
        return True
    warn_once(folder, "not-a-folder", f"shimrt: the compile cache {str(folder)!r} is not a folder (SHIMRT_CACHE_DIR); "
                                      "compiling without the cache")
    return False


def _unsafe(st: os.stat_result) -> tuple[str, str] | None:
    """(problem, why) when an entry with this lstat must not be read."""
    if stat.S_ISLNK(st.st_mode):
        return "symlink", "is a symbolic link (entries are written as regular files only)"
    if not stat.S_ISREG(st.st_mode):
        return "special", "is not a regular file (a FIFO, device, socket or folder)"
    if st.st_size > MAX_ENTRY_BYTES:
        return "too-large", f"is larger than the cache's limit of {MAX_ENTRY_BYTES} bytes"
    return None


def _ignore(folder: Path, path: Path, problem: str, why: str) -> None:
    warn_once(folder, problem, f"shimrt: ignoring the compile cache entry {path}: it {why}; recompiling "
                               f"(further entries in {folder} with this problem are ignored silently)")


def _parse(data: bytes) -> tuple[object, bytes]:
    """(metadata, binary) of an entry's bytes whose framing and checksum hold."""
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if len(data) < len(MAGIC) + _LENGTH + _DIGEST or not body.startswith(MAGIC):
        raise ValueError("not a shimrt cache entry of this version")
    if hashlib.sha256(body).digest() != digest:
        raise ValueError("checksum mismatch")
    rest = body[len(MAGIC):]
    size = int.from_bytes(rest[:_LENGTH], "little")
    if size > len(rest) - _LENGTH:
        raise ValueError("metadata length past the end")
    return json.loads(rest[_LENGTH:_LENGTH + size]), rest[_LENGTH + size:]


def _entry(meta: dict, binary: bytes) -> Entry:
    """An :class:`Entry` from checked metadata; ValueError naming the first field that is wrong."""
    if set(meta) != _FIELDS:
        raise ValueError(f"fields must be {', '.join(sorted(_FIELDS))}, not {', '.join(sorted(map(str, meta)))}")
    if not isinstance(meta["log"], str):
        raise ValueError("log must be a string")
    size = meta["binary_size"]
    if not _count(size) or size == 0 or size != len(binary):
        raise ValueError(f"binary_size must be the binary's length {len(binary)}, not {size!r}")
    resources = meta["resources"]
    if not isinstance(resources, dict) or not all(isinstance(k, str) and k for k in resources):
        raise ValueError("resources must map kernel names to resources")
    params = meta["params"]
    if not isinstance(params, dict) or not set(params) <= set(resources):
        raise ValueError("params must map kernels of the program to parameter layouts")
    reads = meta["reads"]
    if not isinstance(reads, dict) or not all(
            isinstance(p, str) and os.path.isabs(p) and isinstance(d, str) and _SHA256.fullmatch(d)
            for p, d in reads.items()):
        raise ValueError("reads must map absolute paths to SHA-256 digests")
    names = meta["names"]
    if not isinstance(names, dict) or not all(isinstance(k, str) and k and v in resources for k, v in names.items()):
        raise ValueError("names must map name expressions to kernels of the program")
    return Entry(binary, meta["log"], {k: _resources(k, v) for k, v in resources.items()},
                 {k: _layout(k, v) for k, v in params.items()}, dict(reads), dict(names))


def _resources(kernel: str, value: object) -> KernelResources:
    if not isinstance(value, dict) or not set(value) <= _RESOURCE_FIELDS:
        raise ValueError(f"resources of {kernel} must be a map of {', '.join(sorted(_RESOURCE_FIELDS))}")
    extra = value.get("extra", {})
    if not isinstance(extra, dict) or not all(isinstance(k, str) and _count(v) for k, v in extra.items()):
        raise ValueError(f"resources of {kernel}: extra must map names to counts")
    if not all(_count(v) for k, v in value.items() if k != "extra"):
        raise ValueError(f"resources of {kernel} must be counts (ints in 0..{_LIMIT})")
    try:
        return KernelResources.from_dict(value)
    except (UsageError, TypeError, ValueError) as exc:
        raise ValueError(f"resources of {kernel}: {exc}") from None


def _layout(kernel: str, value: object) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(_count(n) for n in p) for p in value):
        raise ValueError(f"params of {kernel} must be a list of [offset, size] pairs of counts")
    return tuple((p[0], p[1]) for p in value)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _LIMIT
