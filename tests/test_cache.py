"""The on-disk compile cache: hits, keys, corrupt, swapped, unsafe and forged entries, atomic writes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import pytest

import shimrt
from shimrt import UsageError, cache, kernels


def entries(d):
    return sorted(p for p in d.iterdir() if p.suffix == ".bin") if d.exists() else []


def test_hit_returns_the_same_program(cache_dir):
    src = kernels.source("vector_ops")
    first = shimrt.compile(src, "sm_90", name="vector_ops.cu")
    second = shimrt.compile(src, "sm_90", name="vector_ops.cu")
    assert not first.from_cache and second.from_cache
    assert second.binary == first.binary and second.resources == first.resources and second.log == first.log
    assert len(entries(cache_dir)) == 1
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tmp")]


def test_key_changes_with_source_options_arch_and_name(cache_dir):
    src = kernels.source("vector_ops")
    shimrt.compile(src, "sm_90")
    for variant in (dict(source=src + "\n// changed"), dict(options=["-DX=1"]), dict(target="sm_80"),
                    dict(name="other.cu")):
        args = {"source": src, "target": "sm_90", **variant}
        assert not shimrt.compile(args.pop("source"), args.pop("target"), **args).from_cache, variant
    assert len(entries(cache_dir)) == 5


def test_key_changes_with_included_headers(cache_dir, tmp_path):
    inc = tmp_path / "inc"
    shutil.copytree(kernels.directory(), inc)
    src = kernels.source("probe")
    assert not shimrt.compile(src, "sm_90", include_dirs=[inc]).from_cache
    assert shimrt.compile(src, "sm_90", include_dirs=[inc]).from_cache
    header = inc / "shimrt_portable.h"
    header.write_text(header.read_text() + "\n// a change in a header\n")
    assert not shimrt.compile(src, "sm_90", include_dirs=[inc]).from_cache


def test_corrupt_entries_are_recompiled_not_trusted(cache_dir):
    src = kernels.source("smem_ops")
    good = shimrt.compile(src, "sm_90")
    (entry,) = entries(cache_dir)
    data = entry.read_bytes()
    for damaged in (data[: len(data) // 2], data[:-40] + bytes(40), b"garbage",
                    data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]):
        entry.write_bytes(damaged)
        again = shimrt.compile(src, "sm_90")
        assert not again.from_cache and again.binary == good.binary
        rewritten = shimrt.compile(src, "sm_90")  # the entry was rewritten whole and valid
        assert rewritten.from_cache and rewritten.binary == good.binary
        assert rewritten.resources == good.resources


def test_cache_can_be_disabled(cache_dir, monkeypatch):
    monkeypatch.setenv("SHIMRT_DISABLE_CACHE", "1")
    src = kernels.source("vector_ops")
    assert not shimrt.compile(src, "sm_90").from_cache
    assert not shimrt.compile(src, "sm_90").from_cache
    assert entries(cache_dir) == []
    monkeypatch.delenv("SHIMRT_DISABLE_CACHE")
    assert not shimrt.compile(src, "sm_90", cache=False).from_cache
    assert entries(cache_dir) == []


def test_unwritable_cache_does_not_fail_the_compile(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("SHIMRT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("SHIMRT_DISABLE_CACHE", raising=False)
    assert shimrt.compile(kernels.source("vector_ops"), "sm_90").binary


# --- entries that must not be trusted: each a miss with one warning, never a hang -------------------

SMALL = 'extern "C" __global__ void k(int* out) { __shared__ int buf[SIZE]; buf[threadIdx.x % SIZE] = 1; ' \
        '__syncthreads(); out[threadIdx.x] = buf[(threadIdx.x + 1) % SIZE]; }'


def small(size):
    return f"#define SIZE {size}\n{SMALL}"


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("shimrt")]


def only_entry(folder, before=()):
    (entry,) = [p for p in entries(folder) if p not in before]
    return entry


def split(entry):
    """(magic, metadata, binary) of an entry, read by the format's own framing (magic line, 8-byte
    little-endian metadata length, JSON metadata, binary, SHA-256 of all that)."""
    data = entry.read_bytes()
    body = data[:-32]
    assert hashlib.sha256(body).digest() == data[-32:]
    magic = body[:body.index(b"\n") + 1]
    size = int.from_bytes(body[len(magic):len(magic) + 8], "little")
    return magic, json.loads(body[len(magic) + 8:len(magic) + 8 + size]), body[len(magic) + 8 + size:]


def forge(entry, magic, meta, binary):
    """Write an entry whose framing and checksum are right, whatever its metadata says."""
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    body = magic + len(raw).to_bytes(8, "little") + raw + binary
    entry.write_bytes(body + hashlib.sha256(body).digest())


def test_an_entry_copied_over_another_keys_file_is_refused(cache_dir, caplog):
    a = shimrt.compile(small(32), "sm_90")
    entry_a = only_entry(cache_dir)
    b = shimrt.compile(small(64), "sm_90")
    entry_b = only_entry(cache_dir, [entry_a])
    assert a.binary != b.binary
    shutil.copyfile(entry_a, entry_b)  # valid checksum, valid metadata, another source's binary
    again = shimrt.compile(small(64), "sm_90")
    assert not again.from_cache and again.binary == b.binary and again.resources["k"].static_smem == 4 * 64
    (message,) = warnings_of(caplog)
    assert "another key" in message and entry_b.name in message
    assert shimrt.compile(small(64), "sm_90").from_cache  # rewritten with its own key


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "symlink to a valid entry", "folder",
                                  "larger than the limit"])
def test_an_entry_that_is_not_a_small_regular_file_is_never_read(kind, cache_dir, caplog):
    good = {32: shimrt.compile(small(32), "sm_90")}
    entry_32 = only_entry(cache_dir)
    good[64] = shimrt.compile(small(64), "sm_90")
    entry_64 = only_entry(cache_dir, [entry_32])

    def spoil(entry):
        saved = cache_dir / f"saved-{entry.stem}"
        shutil.copyfile(entry, saved)
        entry.unlink()
        if kind == "fifo":
            os.mkfifo(entry)  # reading it would block for good
        elif kind == "symlink to /dev/zero":
            entry.symlink_to("/dev/zero")  # reading it would never end
        elif kind == "symlink to a valid entry":
            entry.symlink_to(saved)  # shimrt never writes a symlink: refused, not followed
        elif kind == "folder":
            entry.mkdir()
        else:
            with open(entry, "wb") as f:
                f.truncate(cache.MAX_ENTRY_BYTES + 1)  # sparse: its size alone refuses it
    for size, entry in ((32, entry_32), (64, entry_64)):
        spoil(entry)
        again = shimrt.compile(small(size), "sm_90")
        assert not again.from_cache and again.binary == good[size].binary
    (message,) = warnings_of(caplog)[:1]
    expected = {"fifo": "not a regular file", "symlink to /dev/zero": "symbolic link",
                "symlink to a valid entry": "symbolic link", "folder": "not a regular file",
                "larger than the limit": "larger than"}[kind]
    assert expected in message
    if kind == "folder":  # the compile still works; the folder cannot be replaced by an entry
        assert len(warnings_of(caplog)) == 2 and "could not write" in warnings_of(caplog)[1]
        assert not shimrt.compile(small(32), "sm_90").from_cache
    else:  # one warning for the folder and the problem, not one per entry; each was rewritten whole
        assert len(warnings_of(caplog)) == 1
        assert shimrt.compile(small(32), "sm_90").from_cache and shimrt.compile(small(64), "sm_90").from_cache


def _set(path, value):
    def change(meta):
        *parents, last = path
        node = meta
        for part in parents:
            node = node[part]
        node[last] = value
        return meta
    return change


def _drop(*path):
    def change(meta):
        node = meta
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]
        return meta
    return change


FORGED = {
    "metadata a list": lambda meta: [1, 2],
    "metadata nested past the recursion limit": lambda meta: b"[" * 100_000 + b"]" * 100_000,
    "metadata not JSON": lambda meta: b"\xff\xfe not json",
    "key missing": _drop("key"),
    "key a number": _set(["key"], 5),
    "a field too many": _set(["trusted"], True),
    "log a number": _set(["log"], 5),
    "binary_size a bool": _set(["binary_size"], True),
    "binary_size off by one": lambda meta: _set(["binary_size"], meta["binary_size"] + 1)(meta),
    "resources a list": _set(["resources"], []),
    "resources of a kernel a string": _set(["resources", "k"], "fast"),
    "resources missing registers": _drop("resources", "k", "registers"),
    "registers negative": _set(["resources", "k", "registers"], -1),
    "registers huge": _set(["resources", "k", "registers"], 2**40),
    "registers a float": _set(["resources", "k", "registers"], 32.0),
    "max_threads_per_block zero": _set(["resources", "k", "max_threads_per_block"], 0),
    "extra a list": _set(["resources", "k", "extra"], [1]),
    "params a list": _set(["params"], []),
    "params not pairs": _set(["params"], {"k": [[0]]}),
    "params negative": _set(["params"], {"k": [[-8, 8]]}),
    "params bools": _set(["params"], {"k": [[True, 8]]}),
    "params of a kernel not in the program": _set(["params"], {"other": [[0, 8]]}),
    "reads a relative path": _set(["reads"], {"x.h": "0" * 64}),
    "reads not a digest": _set(["reads"], {"/x.h": "zz"}),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(FORGED))
def test_forged_metadata_with_a_valid_checksum_is_a_miss(case, cache_dir, caplog):
    good = shimrt.compile(small(32), "sm_90")
    entry = only_entry(cache_dir)
    magic, meta, binary = split(entry)
    assert meta["resources"]["k"]["static_smem"] == 4 * 32  # the field names the forgeries touch
    for round_ in range(2):
        forge(entry, magic, FORGED[case](json.loads(json.dumps(meta))), binary)
        again = shimrt.compile(small(32), "sm_90")
        assert not again.from_cache and again.binary == good.binary and again.resources == good.resources
        assert len(warnings_of(caplog)) == 1, (round_, warnings_of(caplog))  # once per folder and problem
    assert "ignoring the compile cache entry" in warnings_of(caplog)[0]
    assert shimrt.compile(small(32), "sm_90").from_cache


def test_a_cache_folder_that_is_a_device_is_refused_once_with_its_name(tmp_path, monkeypatch):
    # The sweep's SHIMRT_CACHE_DIR=/dev/null (it printed one warning per compile), through a link so
    # that the path is this test's own: refused where the variable is read, with one message.
    (tmp_path / "null").symlink_to("/dev/null")
    monkeypatch.setenv("SHIMRT_CACHE_DIR", str(tmp_path / "null"))
    monkeypatch.delenv("SHIMRT_DISABLE_CACHE", raising=False)
    with pytest.raises(UsageError, match="SHIMRT_CACHE_DIR") as refused:
        shimrt.compile(small(32), "sm_90")
    assert str(tmp_path / "null") in str(refused.value)


def test_an_unwritable_cache_warns_once(tmp_path, monkeypatch, caplog):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("SHIMRT_CACHE_DIR", str(tmp_path / "file" / "cache"))
    monkeypatch.delenv("SHIMRT_DISABLE_CACHE", raising=False)
    for _ in range(3):
        assert shimrt.compile(small(32), "sm_90").resources["k"].static_smem == 4 * 32
    (message,) = warnings_of(caplog)
    assert "could not write the compile cache" in message
