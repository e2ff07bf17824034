"""The compile cache misses whenever a header the compiler reads changes, however it finds it (issue 24).

Real compiles, NVRTC for sm_90 and hipRTC for gfx90a (where it is installed), of a kernel whose
static shared memory is 4 * SIZE bytes, SIZE a #define in a header: after the header changes (or a
new one shadows it) the next compile must be a miss that reports the new size, and the one after a
hit with it.
"""

from __future__ import annotations

import logging
import os

import pytest

import shimrt
from shimrt.cuda import rtc as nvrtc

BODY = ('extern "C" __global__ void k(int* out) { __shared__ int buf[SIZE]; buf[threadIdx.x % SIZE] = threadIdx.x;'
        ' __syncthreads(); out[threadIdx.x] = buf[(SIZE - 1 - threadIdx.x) % SIZE]; }\n')
TARGETS = ["sm_90", "gfx90a"]


def usable(target: str, request) -> str:
    if target == "gfx90a":
        request.getfixturevalue("hiprtc")  # skips, saying what to install, without hipRTC
    return target


@pytest.fixture(params=TARGETS)
def target(request):
    return usable(request.param, request)


def kernel(*lines: str) -> str:
    return "\n".join(lines) + "\n" + BODY


def header(path, size: int, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#pragma once\n{text}#define SIZE {size}\n")


def smem(program) -> int:
    return program.resources["k"].static_smem


def entries(folder):
    return sorted(p for p in folder.iterdir() if p.suffix == ".bin") if folder.exists() else []


def assert_follows(build, change) -> None:
    """``build()`` compiles; ``change()`` alters what it reads from SIZE 64 to SIZE 128."""
    first = build()
    assert not first.from_cache and smem(first) == 4 * 64
    assert build().from_cache
    change()
    second = build()
    assert not second.from_cache, "a changed header must be a miss"
    assert smem(second) == 4 * 128, "the miss must compile the new header"
    third = build()
    assert third.from_cache and smem(third) == 4 * 128 and third.binary == second.binary


# route -> (backends it applies to, set-up: (tmp_path, monkeypatch) -> (source, compile kwargs, header path))
def _inc(tmp, name="size.h"):
    header(tmp / "inc" / name, 64)
    return tmp / "inc", tmp / "inc" / name


def _dirs(tmp, mp):
    inc, h = _inc(tmp)
    return kernel('#include "size.h"'), {"include_dirs": [inc]}, h


def _option(*spelling):
    def setup(tmp, mp):
        inc, h = _inc(tmp)
        return kernel("#include <size.h>"), {"options": [s.format(inc) for s in spelling]}, h
    return setup


def _suffix(name):
    def setup(tmp, mp):
        inc, h = _inc(tmp, name)
        return kernel(f'#include "{name}"'), {"include_dirs": [inc]}, h
    return setup


def _absolute(tmp, mp):
    _, h = _inc(tmp)
    return kernel(f'#include "{h}"'), {}, h


def _nested(tmp, mp):
    inc, h = _inc(tmp, "deep/size.h")
    (inc / "outer.hpp").write_text('#include "deep/size.h"\n')
    return kernel('#include "outer.hpp"'), {"include_dirs": [inc]}, h


def _relative_option(tmp, mp):
    _, h = _inc(tmp)
    mp.chdir(tmp)
    return kernel("#include <size.h>"), {"options": ["-Iinc"]}, h


def _forced(flag):
    def setup(tmp, mp):
        inc, h = _inc(tmp)
        return BODY, {"options": [flag, "size.h", f"-I{inc}"]}, h
    return setup


def _working_directory(tmp, mp):  # NVRTC: the main source's folder is its name's, from the cwd
    h = tmp / "size.h"
    header(h, 64)
    mp.chdir(tmp)
    return kernel('#include "size.h"'), {}, h


def _named_folder(tmp, mp):
    h = tmp / "src" / "size.h"
    header(h, 64)
    mp.chdir(tmp)
    return kernel('#include "size.h"'), {"name": "src/k.cu"}, h


def _cpath(tmp, mp):
    inc, h = _inc(tmp)
    mp.setenv("CPATH", str(inc))
    return kernel("#include <size.h>"), {}, h


ROUTES = {
    "include_dirs": (TARGETS, _dirs),
    "-I dir": (TARGETS, _option("-I", "{}")),
    "-Idir": (TARGETS, _option("-I{}")),
    "-I=dir": (["sm_90"], _option("-I={}")),
    "--include-path=dir": (["sm_90"], _option("--include-path={}")),
    "--include-path dir": (["sm_90"], _option("--include-path", "{}")),
    "--include-directory=dir": (["gfx90a"], _option("--include-directory={}")),
    "-isystem dir": (["gfx90a"], _option("-isystem", "{}")),
    "-idirafter dir": (["gfx90a"], _option("-idirafter{}")),
    "a .hpp header": (TARGETS, _suffix("size.hpp")),
    "a .inc header": (TARGETS, _suffix("size.inc")),
    "a header without a suffix": (TARGETS, _suffix("SIZE")),
    "an absolute path": (TARGETS, _absolute),
    "a header included by a header": (TARGETS, _nested),
    "a relative -I": (TARGETS, _relative_option),
    "--pre-include": (["sm_90"], _forced("--pre-include")),
    "-include": (["gfx90a"], _forced("-include")),
    "the working directory": (["sm_90"], _working_directory),
    "the folder of the source's name": (["sm_90"], _named_folder),
    "CPATH": (["gfx90a"], _cpath),
}


@pytest.mark.parametrize("route, target_name", [(r, t) for r, (ts, _) in sorted(ROUTES.items()) for t in ts])
def test_a_header_change_is_a_miss_whatever_the_route(route, target_name, cache_dir, tmp_path, monkeypatch, request):
    target = usable(target_name, request)
    source, kwargs, path = ROUTES[route][1](tmp_path, monkeypatch)
    assert_follows(lambda: shimrt.compile(source, target, **kwargs), lambda: header(path, 128))


@pytest.mark.parametrize("spelled", ["include_dirs", "options"])
def test_an_earlier_include_folder_shadows_a_later_one(spelled, target, cache_dir, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    header(second / "same.h", 64)
    kwargs = ({"include_dirs": [first, second]} if spelled == "include_dirs" else
              {"options": [f"-I{first}", "-I", str(second)]})
    source = kernel('#include "same.h"')
    assert_follows(lambda: shimrt.compile(source, target, **kwargs), lambda: header(first / "same.h", 128))


def test_the_including_headers_folder_comes_first(target, cache_dir, tmp_path):
    # outer.h (in inner/) includes "same.h": the compiler looks beside outer.h before any -I folder.
    inner, outer = tmp_path / "inner", tmp_path / "outer"
    (inner / "outer.h").parent.mkdir()
    (inner / "outer.h").write_text('#include "same.h"\n')
    header(outer / "same.h", 64)
    source = kernel('#include "outer.h"')
    assert_follows(lambda: shimrt.compile(source, target, include_dirs=[outer, inner]),
                   lambda: header(inner / "same.h", 128))


def test_nvrtc_looks_in_the_working_directory_before_the_include_folders(cache_dir, tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    header(inc / "size.h", 64)
    monkeypatch.chdir(tmp_path)
    source = kernel('#include "size.h"')
    assert_follows(lambda: shimrt.compile(source, "sm_90", include_dirs=[inc]),
                   lambda: header(tmp_path / "size.h", 128))


def test_a_header_whose_presence_is_tested_is_followed(target, cache_dir, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()  # __has_include reads nothing: the file being there at all changes the code
    source = kernel('#if __has_include("tuning.h")', "#define SIZE 128", "#else", "#define SIZE 64", "#endif")
    assert_follows(lambda: shimrt.compile(source, target, include_dirs=[inc]), lambda: (inc / "tuning.h").touch())


def test_paths_the_cache_cannot_follow_are_named(tmp_path):
    from shimrt.hip import rtc as hiprtc  # the option parsing needs no hipRTC
    for options in (["-I=/usr/include"], [f"@{tmp_path}/options.txt"], ["-isysroot", "/opt"], ["-Xclang", "-v"]):
        assert hiprtc.include_search(options, "k.cu").untracked, options
    for options in (["-Xcudafe", "--diag_suppress=1"], ["--use-pch=k.pch"], ["--pch-dir", "/tmp"]):
        assert nvrtc.include_search(options, "k.cu").untracked, options
    spelled = (["-I", str(tmp_path)], [f"-I{tmp_path}"], [f"-I={tmp_path}"], [f"--include-path={tmp_path}"],
               ["--include-path", str(tmp_path)])
    for options in spelled:
        search = nvrtc.include_search(options + ["-DN=1", "-Xptxas=-v"], "k.cu")
        assert search.folders == (str(tmp_path),) and search.untracked is None, options


def test_a_header_named_by_a_macro_compiles_without_the_cache(target, cache_dir, tmp_path, caplog):
    inc = tmp_path / "inc"
    header(inc / "size.h", 64)
    source = kernel("#define TUNING <size.h>", "#include TUNING")
    for _ in range(3):
        program = shimrt.compile(source, target, include_dirs=[inc])
        assert not program.from_cache and smem(program) == 4 * 64
    assert entries(cache_dir) == []
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "named by a macro" in warned[0] and "#include TUNING" in warned[0]


@pytest.mark.parametrize("target, option", [("sm_90", ["-Xcudafe", "--display_error_number"]),
                                            ("gfx90a", ["-Xclang", "-fno-caret-diagnostics"])])
def test_options_the_cache_cannot_follow_compile_without_it(target, option, cache_dir, caplog, request):
    target = usable(target, request)
    source = kernel("#define SIZE 64")
    assert not any(shimrt.compile(source, target, options=option).from_cache for _ in range(2))
    assert entries(cache_dir) == []
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and repr(option[0]) in warned[0]


def test_hiprtc_reports_what_it_read_and_the_entry_checks_it(hiprtc, cache_dir, tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    header(inc / "size.h", 64)
    code, _, _, _, _, read = hiprtc.compile_with_reads(kernel("#include <size.h>"), "gfx90a",
                                                    ["--offload-arch=gfx90a", f"-I{inc}"], "k.cu")
    assert read == (str(inc / "size.h"),)  # comgr's temporary copies are left out
    # A folder the compiler searches and the scan does not know (as the host's system folders are):
    # the file it read there is recorded from the compiler's own list, and checked before a hit.
    monkeypatch.setattr(hiprtc, "INCLUDE_VARIABLES", ())
    monkeypatch.setenv("CPATH", str(inc))
    assert_follows(lambda: shimrt.compile(kernel("#include <size.h>"), "gfx90a"), lambda: header(inc / "size.h", 128))


def test_nvrtc_reports_nothing(cache_dir):
    binary, _, resources, _, _, read = nvrtc.compile_with_reads(kernel("#define SIZE 64"), "sm_90",
                                                             nvrtc.default_options("sm_90"), "k.cu")
    assert binary and resources["k"].static_smem == 4 * 64 and read is None


def test_a_header_changed_during_the_compile_is_not_cached(cache_dir, tmp_path, monkeypatch):
    inc = tmp_path / "inc"
    header(inc / "size.h", 64)
    real = nvrtc.compile_with_reads

    def then_edit(*args):
        out = real(*args)  # compiled with SIZE 64; the header says 128 by the time the cache would store it
        header(inc / "size.h", 128)
        return out
    monkeypatch.setattr(nvrtc, "compile_with_reads", then_edit)
    source = kernel('#include "size.h"')
    assert smem(shimrt.compile(source, "sm_90", include_dirs=[inc])) == 4 * 64
    assert entries(cache_dir) == []
    monkeypatch.setattr(nvrtc, "compile_with_reads", real)
    again = shimrt.compile(source, "sm_90", include_dirs=[inc])
    assert not again.from_cache and smem(again) == 4 * 128


def test_an_unchanged_header_elsewhere_keeps_the_hit(target, cache_dir, tmp_path):
    inc = tmp_path / "inc"
    header(inc / "size.h", 64)
    (inc / "unrelated.h").write_text("#define OTHER 1\n")
    source = kernel('#include "size.h"')
    assert not shimrt.compile(source, target, include_dirs=[inc]).from_cache
    (inc / "unrelated.h").write_text("#define OTHER 2\n")
    (inc / "notes.txt").write_text("not a header anyone includes\n")
    os.utime(inc / "size.h")  # a touch without a change
    assert shimrt.compile(source, target, include_dirs=[inc]).from_cache
