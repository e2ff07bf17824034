"""What a compile can read: every header a source can reach through its compiler's search path.

NVRTC reports none of the files it opens, and hipRTC (clang's ``-MD -MF``) only the ones it did
open, after the compile; the compile cache must know before it looks anything up. So :func:`scan`
finds them as the compilers do (as strace shows NVRTC 13.5 and hipRTC 5.2.3 doing it): a quote
include looks in the including file's folder, then in every search folder (-I and its kin, in
order); an angled one in the search folders only; an absolute name is opened as it is; a forced
include (``-include``) is looked for in the working directory, then in the search folders. Each
backend's ``include_search()`` says how its options spell those folders and which folder it takes
for the main source's own.

For every directive the scan takes every file the search could open, not only the first it
finds: each with its SHA-256, each followed in turn. Run before every lookup, the scan then sees a
header change, a header that appears earlier on the search path (it joins the files found) and one
that goes; and a record of all candidates stays right whatever the exact search order, with
``--no-source-include`` or ``-iquote``, and for directives in branches the preprocessor skips (they
cost a few hashes). A directive whose header is named by a macro cannot be followed: the scan says
so (``untracked``), and so do options that make the compiler read files it cannot see (response
files, precompiled headers, a sysroot).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field

__all__ = ["SearchPath", "Scan", "search_path", "scan", "file_digest", "read_regular", "canonical"]

#: Headers larger than this, or more of them than MAX_HEADERS, make a compile untracked.
MAX_HEADER_BYTES = 64 << 20
MAX_HEADERS = 10_000

# A directive may start with '#', its digraph or its trigraph, with blanks and comments around
# the name; a line splice has been removed before. Found anywhere, not only at a line's start:
# a match inside a comment or a string costs a hash, a directive missed would cost a stale binary.
_GAP = rb"(?:[ \t\f\v]|/\*.*?\*/)*"
_DIRECTIVE = re.compile(rb"(?:#|%:|\?\?=)" + _GAP + rb"(include_next|include|import|embed)(?![\w$])" + _GAP
                        + rb"(?:\"([^\"\n]*)\"|<([^>\n]*)>|([^\s\"<]?))", re.S)
_HAS = re.compile(rb"__has_(?:include_next|include|embed)\s*\(\s*(?:\"([^\"\n]*)\"|<([^>\n]*)>)")
_SPLICE = re.compile(rb"\\[ \t]*\r?\n")
_COMMENT = re.compile(rb"/\*.*?\*/", re.S)


@dataclass(frozen=True)
class SearchPath:
    """Where a compile looks for headers: ``folders`` (absolute, in the compiler's order),
    ``main_folder`` (where a quote include of the main source looks first; None where the
    compiler copies the source somewhere no user file is), ``forced`` (``-include`` files, as
    given), ``cwd``, ``alt_suffixes`` (NVRTC also tries ``<name>.stdh`` for an angled name without
    a suffix) and ``untracked`` (why the options make the reads unknowable, or None)."""

    folders: tuple[str, ...]
    main_folder: str | None
    forced: tuple[str, ...] = ()
    cwd: str = ""
    alt_suffixes: tuple[str, ...] = ()
    untracked: str | None = None


@dataclass(frozen=True)
class Scan:
    """What a compile can read: ``inputs`` maps each header path to the SHA-256 of its bytes;
    ``untracked`` says why the scan cannot vouch for them (then the compile must not be cached)."""

    inputs: dict[str, str] = field(default_factory=dict)
    untracked: str | None = None

    def digest(self) -> str:
        """SHA-256 over every path and hash, the part of a cache key that headers make."""
        blob = json.dumps([sorted(self.inputs.items()), self.untracked])
        return hashlib.sha256(blob.encode()).hexdigest()


def search_path(options: list[str], *, flags: dict[str, tuple[str, str]], untracked: tuple[str, ...],
                main_folder: str | None, alt_suffixes: tuple[str, ...] = ()) -> SearchPath:
    """The :class:`SearchPath` of ``options`` in one compiler's dialect.

    ``flags`` maps an option to (``"folder"`` or ``"file"``, its form): ``"eq"`` takes
    ``FLAG=value`` or ``FLAG value``; ``"joined"`` takes ``FLAGvalue`` (verbatim; a leading ``=``
    means the sysroot, which the cache cannot follow) or ``FLAG value``; ``"joined-eq"`` is
    ``"joined"`` with a leading ``=`` dropped (NVRTC's ``-I=dir``). ``untracked`` lists option
    prefixes that make the compiler read what the cache cannot see. Relative values (and a
    relative ``main_folder``) are taken from the working directory, as the compilers take them.
    """
    try:
        cwd = os.getcwd()
    except OSError as exc:  # removed under the process: relative paths lead nowhere anyone can name
        return SearchPath((), None, untracked=f"the working directory cannot be read ({exc})")
    if main_folder is not None:
        main_folder = os.path.join(cwd, main_folder)
    folders, forced, why = [], [], None
    ordered = sorted(flags, key=len, reverse=True)  # "--include-directory" before "--include"
    args = list(options)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if any(arg.startswith(p) for p in untracked):
            why = why or f"the option {arg!r} makes the compiler read files the cache cannot follow"
            continue
        for flag in ordered:
            kind, form = flags[flag]
            if not arg.startswith(flag):
                continue
            rest = arg[len(flag):]
            if rest and form == "eq" and not rest.startswith("="):
                continue  # another option that only starts alike
            if not rest:
                if i >= len(args):
                    break
                value, i = args[i], i + 1
            elif form == "joined":
                value = rest
            else:
                value = rest[1:] if rest.startswith("=") else rest
            if not value or (form == "joined" and value.startswith("=")):
                why = why or f"the option {arg!r} names a path the cache cannot follow"
                break
            if kind == "folder":
                folders.append(os.path.join(cwd, value))
            else:
                forced.append(value)  # looked for like a quote include of a file in the working directory
            break
    return SearchPath(tuple(folders), main_folder, tuple(forced), cwd, tuple(alt_suffixes), why)


def scan(source: str, search: SearchPath) -> Scan:
    """Every header ``source`` can reach through ``search``, recursively, with its SHA-256 (see
    the module's docstring)."""
    if search.untracked:
        return Scan(untracked=search.untracked)
    state = _State(search)
    for name in search.forced:
        state.search(name, "quote", search.cwd)
    state.follow(source.encode("utf-8", "replace"), search.main_folder)
    while state.queue and state.untracked is None:
        text, folder = state.queue.pop()
        state.follow(text, folder)
    if state.untracked:
        return Scan(untracked=state.untracked)
    return Scan(state.inputs)


def file_digest(path: str, limit: int = MAX_HEADER_BYTES) -> str | None:
    """SHA-256 (hex) of the regular file at ``path`` (a symlink to one is followed, as compilers
    follow it), or None when there is none, it is larger than ``limit`` or it cannot be read."""
    try:
        data = read_regular(path, limit)
    except OSError:
        return None
    return None if data is None else hashlib.sha256(data).hexdigest()


def read_regular(path: str, limit: int, *, follow: bool = True) -> bytes | None:
    """The bytes of the regular file at ``path``, or None when it is not one or holds more than
    ``limit`` bytes. Checked with stat before opening, opened non-blocking and checked again on
    the open file, so a FIFO or a device is never read and nothing blocks. OSError passes on."""
    st = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        return None
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return None if total > limit else b"".join(chunks)
    finally:
        os.close(fd)


def canonical(path: str) -> str:
    """``path`` with its folder resolved as the kernel resolves it (symlinks, ``..``); the last
    part is kept, since the compiler opens that name (through a symlink if it is one)."""
    folder, name = os.path.split(path)
    return os.path.join(os.path.realpath(folder or "."), name)


class _State:
    """The walk of one scan: what was found and what is left to read."""

    def __init__(self, search: SearchPath):
        self.path = search
        self.inputs: dict[str, str] = {}
        self.seen: set[str] = set()
        self.queue: list[tuple[bytes, str]] = []
        self.untracked: str | None = None

    def follow(self, text: bytes, folder: str | None) -> None:
        """Search for every header the directives of ``text`` (a file in ``folder``) name."""
        text = _SPLICE.sub(b"", text)
        for m in _DIRECTIVE.finditer(text):
            quoted, angled, other = m.group(2), m.group(3), m.group(4)
            if quoted is not None or angled is not None:
                self.search(os.fsdecode(quoted if quoted is not None else angled),
                            "quote" if quoted is not None else "angled", folder)
            elif other and _at_line_start(text, m.start()):
                end = text.find(b"\n", m.start())
                line = text[m.start():end if end >= 0 else len(text)].decode("utf-8", "replace")
                self.untracked = f"the header of {line.strip()!r} is named by a macro, which the cache cannot follow"
                return
        for m in _HAS.finditer(text):
            quoted, angled = m.group(1), m.group(2)
            self.search(os.fsdecode(quoted if quoted is not None else angled),
                        "quote" if quoted is not None else "angled", folder)

    def search(self, name: str, form: str, includer: str | None) -> None:
        """Visit every path where the compiler could look for ``name``."""
        if not name or "\0" in name:
            return
        if os.path.isabs(name):
            self.visit(name)
            return
        folders = ([includer] if form == "quote" and includer else []) + list(self.path.folders)
        names = [name]
        if form == "angled" and "." not in os.path.basename(name):
            names += [name + suffix for suffix in self.path.alt_suffixes]
        for folder in folders:
            for n in names:
                self.visit(os.path.join(folder, n))

    def visit(self, path: str) -> None:
        path = canonical(path)
        if path in self.seen or self.untracked:
            return
        self.seen.add(path)
        try:
            st = os.stat(path)
        except OSError:  # nothing there (a file there later joins the inputs, so the key changes)
            return
        if not stat.S_ISREG(st.st_mode):
            return
        if len(self.inputs) >= MAX_HEADERS or st.st_size > MAX_HEADER_BYTES:
            self.untracked = (f"more than {MAX_HEADERS} headers" if len(self.inputs) >= MAX_HEADERS else
                              f"the header {path} is larger than {MAX_HEADER_BYTES >> 20} MiB")
            return
        try:
            data = read_regular(path, MAX_HEADER_BYTES)
        except OSError as exc:  # the compiler cannot read it either; a change of that is a change
            self.inputs[path] = f"unreadable: {errno.errorcode.get(exc.errno or 0, exc.errno)}"
            return
        if data is None:  # replaced by something else since the stat
            return
        self.inputs[path] = hashlib.sha256(data).hexdigest()
        self.queue.append((data, os.path.dirname(path)))


def _at_line_start(text: bytes, pos: int) -> bool:
    """Whether only blanks and comments come before ``pos`` on its line (a directive proper)."""
    prefix = _COMMENT.sub(b" ", text[text.rfind(b"\n", 0, pos) + 1:pos])
    if b"*/" in prefix:  # the end of a comment begun on an earlier line
        prefix = prefix[prefix.rfind(b"*/") + 2:]
    return not prefix.strip()
