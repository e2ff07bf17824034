"""A library named by SHIMRT_NCCL_LIBRARY (or found in the wheel) that is truncated, foreign or no
file at all is refused with CollectiveError naming it, before dlopen could map it: a truncated
libnccl.so.2 killed Python with SIGBUS inside dlopen (issue 24), and a FIFO blocked it for good.

The truncated libraries are cut from the real NCCL of the nvidia-nccl wheel; each load runs in a
subprocess, so that a crash is a failed test and not a dead pytest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import skip_or_fail

from shimrt import elf
from shimrt.nccl import library

# Loads SHIMRT_NCCL_LIBRARY and prints what happened: "loaded <version>" or "refused <message>".
LOAD = textwrap.dedent("""
    from shimrt.errors import CollectiveError
    from shimrt.nccl import library
    try:
        print("loaded", library.load().version_text)
    except CollectiveError as exc:
        print("refused", exc)
""")


@pytest.fixture(scope="module")
def nccl() -> str:
    """The wheel's libnccl.so.2 (the first path candidates() lists without SHIMRT_NCCL_LIBRARY)."""
    saved = os.environ.pop("SHIMRT_NCCL_LIBRARY", None)
    try:
        path = library.candidates()[0]
    finally:
        if saved is not None:
            os.environ["SHIMRT_NCCL_LIBRARY"] = saved
    if os.sep not in path or not os.path.isfile(path):
        skip_or_fail("nccl", f"no NCCL wheel library to cut ({path}): pip install nvidia-nccl-cu13")
    return path


def cut(src: str, dst, nbytes: int):
    """The first ``nbytes`` of ``src`` in ``dst``."""
    with open(src, "rb") as f, open(dst, "wb") as g:
        left = nbytes
        while left:
            chunk = f.read(min(left, 8 << 20))
            if not chunk:
                break
            g.write(chunk)
            left -= len(chunk)
    return dst


def load(path) -> str:
    """What loading ``path`` as SHIMRT_NCCL_LIBRARY says, in a process of its own."""
    run = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SHIMRT_NCCL_LIBRARY": str(path)})
    assert run.returncode == 0, f"killed by signal {-run.returncode}" if run.returncode < 0 else run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    return run.stdout.strip()


def test_the_whole_library_loads(nccl):
    assert elf.library_problem(nccl) is None
    assert load(nccl).startswith("loaded 2.")


@pytest.mark.parametrize("keep", ["64", "4096", "1M", "half", "all but 1M", "all but 1"])
def test_a_truncated_library_is_refused_not_a_crash(nccl, tmp_path, keep):
    size = os.path.getsize(nccl)
    nbytes = {"64": 64, "4096": 4096, "1M": 1 << 20, "half": size // 2, "all but 1M": size - (1 << 20),
              "all but 1": size - 1}[keep]
    path = cut(nccl, tmp_path / "libnccl.so.2", nbytes)
    said = load(path)
    assert said.startswith(f"refused SHIMRT_NCCL_LIBRARY={str(path)!r} could not be loaded"), said
    assert f"it is truncated: {nbytes} bytes" in said, said


def test_a_library_shorter_than_its_last_segment_names_the_segment(nccl, tmp_path):
    """Section headers aside (a stripped library may lack them), the end of the last PT_LOAD
    segment is what dlopen maps: one byte short of it is refused."""
    import struct
    with open(nccl, "rb") as f:
        head = f.read(64)
        phoff, phentsize, phnum = struct.unpack_from("<Q", head, 32)[0], *struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    ends = [offset + filesz for p_type, _, offset, _, _, filesz, _, _ in
            (struct.unpack_from("<IIQQQQQQ", table, i * phentsize) for i in range(phnum)) if p_type == 1]
    path = cut(nccl, tmp_path / "libnccl.so.2", max(ends) - 1)
    with open(path, "r+b") as f:  # no section headers: the segments alone say it is short
        f.seek(40)
        f.write(struct.pack("<Q", 0))
    assert "it is truncated" in elf.library_problem(str(path))
    assert "segment" in elf.library_problem(str(path))
    assert "it is truncated" in load(path)


@pytest.mark.parametrize("what, offset, data, reason", [
    ("32-bit", 4, b"\x01", "it is a 32-bit ELF file; this Python is 64-bit"),
    ("big-endian", 5, b"\x02", "its byte order (big-endian) is not this machine's"),
    ("an executable", 16, b"\x02\x00", "it is not a shared library (ELF type 2, not ET_DYN)"),
    ("another machine", 18, b"\x28\x00", "it is built for another machine (ELF machine 40)"),
])
def test_a_foreign_elf_is_refused(nccl, tmp_path, what, offset, data, reason):
    head = bytearray(open(nccl, "rb").read(64 << 10))
    head[offset:offset + len(data)] = data
    path = tmp_path / "libforeign.so"
    path.write_bytes(bytes(head))
    assert reason in load(path)


def test_files_that_are_no_library_are_refused(tmp_path):
    text = tmp_path / "libnccl.so.2"
    text.write_text("INPUT(libnccl.so.3)\n")  # a linker script, say
    assert "it is not an ELF file (20 bytes)" in load(text)
    (tmp_path / "empty.so").write_bytes(b"")
    assert "it is not an ELF file (0 bytes)" in load(tmp_path / "empty.so")
    assert "it is a folder, not a library file" in load(tmp_path)
    assert "No such file or directory" in load(tmp_path / "missing.so")
    if os.path.exists("/dev/zero"):
        assert "it is a device, not a library file" in load("/dev/zero")


@pytest.mark.timeout(60)
def test_a_fifo_is_refused_instead_of_read_for_ever(tmp_path):
    os.mkfifo(tmp_path / "libnccl.so.2")
    assert "it is a FIFO, not a library file" in load(tmp_path / "libnccl.so.2")


def test_an_executable_or_a_library_without_nccl_is_refused(tmp_path):
    true = shutil.which("true")
    if true is not None:
        assert load(true).startswith(f"refused SHIMRT_NCCL_LIBRARY={true!r} could not be loaded")
    import ctypes.util
    libc = ctypes.util.find_library("c")
    if libc is not None and os.sep not in libc:  # a bare name: copy the file the loader would open
        libc = next((p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6",
                                 "/lib64/libc.so.6") if os.path.exists(p)), None)
    if libc is not None:
        assert "is not an NCCL or RCCL library: it has no ncclGetVersion" in load(libc)


def test_a_truncated_wheel_library_is_skipped_for_the_next_candidate(nccl, tmp_path):
    """Without SHIMRT_NCCL_LIBRARY the search goes on past a damaged candidate, saying why."""
    bad = cut(nccl, tmp_path / "libnccl.so.2", 1 << 20)
    code = (f"from shimrt.nccl import library\n"
            f"library.candidates = lambda backend='cuda': [{str(bad)!r}, {nccl!r}]\n" + LOAD)
    env = {k: v for k, v in os.environ.items() if k != "SHIMRT_NCCL_LIBRARY"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0 and run.stdout.startswith("loaded 2."), (run.returncode, run.stdout, run.stderr)
    code = code.replace(repr(nccl), repr(str(tmp_path / "missing.so")))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert f"{bad} ({bad}: it is truncated: {1 << 20} bytes" in run.stdout, run.stdout
