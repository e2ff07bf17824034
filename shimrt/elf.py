"""Minimal ELF64 reading with the standard library: section headers and note records, and
whether a shared library on disk is whole and for this machine.

Follows the System V ABI ELF layout (little-endian ELF64 only, which is what CUBINs and AMDGPU
code objects are); enough to find a note section's records by name and type.
:func:`library_problem` reads only a library's headers (in this machine's byte order), so that a
truncated or foreign file is refused before ``dlopen`` maps it: a mapped page past the end of
the file kills the process with SIGBUS, with no message.
"""

from __future__ import annotations

import os
import platform
import stat
import struct
import sys
from dataclasses import dataclass

__all__ = ["header", "notes", "library_problem"]

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")   # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")         # Elf64_Shdr
_NHDR = struct.Struct("<III")                # Elf64_Nhdr: namesz, descsz, type
SHT_NOTE = 7


@dataclass(frozen=True)
class Header:
    machine: int
    flags: int
    abi_version: int


def _check(data: bytes) -> None:
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")


def header(data: bytes) -> Header:
    _check(data)
    ident, _type, machine, _version, _entry, _phoff, _shoff, flags, *_ = _EHDR.unpack_from(data, 0)
    return Header(machine=machine, flags=flags, abi_version=ident[8])


def sections(data: bytes) -> list[tuple[int, bytes]]:
    """(sh_type, contents) of every section."""
    _check(data)
    fields = _EHDR.unpack_from(data, 0)
    shoff, shentsize, shnum = fields[6], fields[11], fields[12]
    out = []
    for i in range(shnum):
        _name, sh_type, _flags, _addr, offset, size, *_ = _SHDR.unpack_from(data, shoff + i * shentsize)
        out.append((sh_type, data[offset:offset + size] if sh_type != 8 else b""))  # 8: SHT_NOBITS
    return out


def notes(data: bytes) -> list[tuple[str, int, bytes]]:
    """(name, type, descriptor) of every note record in the SHT_NOTE sections (4-byte aligned)."""
    found = []
    for sh_type, body in sections(data):
        if sh_type != SHT_NOTE:
            continue
        pos = 0
        while pos + _NHDR.size <= len(body):
            namesz, descsz, ntype = _NHDR.unpack_from(body, pos)
            pos += _NHDR.size
            name = body[pos:pos + namesz].rstrip(b"\0").decode(errors="replace")
            pos += (namesz + 3) & ~3
            found.append((name, ntype, body[pos:pos + descsz]))
            pos += (descsz + 3) & ~3
    return found


ET_DYN = 3
PT_LOAD = 1
# e_machine of the machines shimrt runs on (the ELF ABI supplements): platform.machine() -> EM_*.
MACHINES = {"x86_64": (62, "x86-64"), "amd64": (62, "x86-64"), "aarch64": (183, "aarch64"),
            "arm64": (183, "aarch64"), "ppc64le": (21, "ppc64le")}


def library_problem(path: str) -> str | None:
    """Why ``path`` cannot be a whole shared library for this process, or None when its headers
    say it can: it must be a regular file, an ELF of this process's class (64-bit), byte order
    and machine (x86-64, aarch64), a shared object, and as long as its headers claim: the
    program and section header tables and every segment's file extent (the end of the last
    PT_LOAD above all) inside the file. Only the headers are read; nothing is mapped."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{exc.strerror or exc}"
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else \
            "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file"
        return f"it is {kind}, not a library file"
    try:
        with open(path, "rb") as f:
            return _problem(f, st.st_size)
    except OSError as exc:
        return f"it cannot be read: {exc.strerror or exc}"


def _problem(f, size: int) -> str | None:
    head = f.read(64)
    if len(head) < 16 or head[:4] != b"\x7fELF":
        return f"it is not an ELF file ({size} bytes)"
    bits = struct.calcsize("P") * 8
    if head[4] != (2 if bits == 64 else 1):
        return f"it is a {64 if head[4] == 2 else 32}-bit ELF file; this Python is {bits}-bit"
    order = "<" if sys.byteorder == "little" else ">"
    if head[5] != (1 if order == "<" else 2):
        return f"its byte order ({'little' if head[5] == 1 else 'big'}-endian) is not this machine's"
    if bits != 64 or len(head) < _EHDR.size:
        return f"it is truncated: {size} bytes, shorter than its ELF header" if bits == 64 else None
    (_ident, e_type, machine, _v, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum,
     _shstrndx) = struct.unpack(order + _EHDR.format[1:], head)
    if e_type != ET_DYN:
        return f"it is not a shared library (ELF type {e_type}, not ET_DYN)"
    ours = MACHINES.get(platform.machine().lower())
    if ours is not None and machine != ours[0]:
        return f"it is built for another machine (ELF machine {machine}); this one is {ours[1]} ({ours[0]})"
    phdr = struct.Struct(order + "IIQQQQQQ")  # Elf64_Phdr
    if phnum == 0 or phentsize != phdr.size:
        return f"its program headers are not ELF64's ({phnum} of {phentsize} bytes)"
    if phoff + phnum * phentsize > size:
        return f"it is truncated: {size} bytes, and its program headers end at byte {phoff + phnum * phentsize}"
    if shoff and (shentsize != _SHDR.size or shoff + max(shnum, 1) * shentsize > size):
        return f"it is truncated: {size} bytes, and its section headers end at byte {shoff + max(shnum, 1) * shentsize}"
    f.seek(phoff)
    table = f.read(phnum * phentsize)
    if len(table) < phnum * phentsize:
        return "it is truncated: its program headers cannot be read whole"
    last = 0
    for i in range(phnum):
        p_type, _flags, offset, _vaddr, _paddr, filesz, _memsz, _align = phdr.unpack_from(table, i * phentsize)
        if filesz and offset + filesz > size:
            what = "segment" if p_type == PT_LOAD else f"segment of type {p_type:#x}"
            return f"it is truncated: {size} bytes, and its {what} {i} ends at byte {offset + filesz}"
        if p_type == PT_LOAD:
            last = max(last, offset + filesz)
    if not last:
        return "it has no loadable segment"
    return None
