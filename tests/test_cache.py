"""The on-disk compile cache: hits, keys, corrupt entries, atomic writes."""

from __future__ import annotations

import shutil

import shimrt
from shimrt import kernels


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
