"""Minimal ELF64 reading with the standard library: section headers and note records.

Follows the System V ABI ELF layout (little-endian ELF64 only, which is what CUBINs and AMDGPU
code objects are); enough to find a note section's records by name and type.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

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
