"""The CUPTI record layout shimrt reads equals the C compiler's for the installed header, and the
NCCL library loads from the wheel (both without a GPU)."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

from shimrt import CollectiveError
from shimrt.cuda import cupti
from shimrt.nccl import library

HERE = Path(__file__).parent


def test_kernel_record_layout_matches_cupti_activity_h(tmp_path):
    try:  # the cupti and runtime wheels share nvidia/cuXX/include (cupti_activity.h needs cuda.h)
        from cuda.pathfinder import find_nvidia_header_directory
        include = cuda_include = find_nvidia_header_directory("cudart")
    except Exception as exc:
        include = cuda_include = None
        why = str(exc)
    else:
        why = "header not found"
    needed = ("cupti_activity.h", "cuda.h", "crt/host_defines.h")
    if not include or not all((Path(include) / h).is_file() for h in needed) or shutil.which("gcc") is None:
        skip_or_fail("cupti-layout", "needs gcc and the headers of nvidia-cuda-cupti, nvidia-cuda-runtime and "
                     f"nvidia-cuda-crt (pip install -e '.[test]'): {why}")
    exe = tmp_path / "offsets"
    subprocess.run(["gcc", f"-I{include}", f"-I{cuda_include}", "-o", str(exe), str(HERE / "data" / "cupti_offsets.c")],
                   check=True, timeout=300)
    rows = [line.split() for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                    check=True).stdout.splitlines()]
    c_layout = {name: (int(off), int(size)) for name, off, size in rows}
    assert c_layout.pop("KIND_KERNEL")[0] == cupti.KIND_KERNEL
    assert c_layout.pop("KIND_CONCURRENT_KERNEL")[0] == cupti.KIND_CONCURRENT_KERNEL
    ours = {k: (o, struct.calcsize("<" + f)) for k, (o, f) in cupti.KERNEL_RECORD.items()}
    assert ours == c_layout


def test_nccl_loads_from_the_wheel_with_every_table_entry():
    try:
        lib = library.load("cuda")
    except CollectiveError as exc:
        skip_or_fail("nccl", f"NCCL is not installed (pip install 'shimrt[nccl]'): {exc}")
    assert lib.version >= 21700 and lib.missing == ()
    uid = library.UniqueId()
    lib.check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    assert ctypes.sizeof(uid) == 128 and any(bytes(uid))
    with pytest.raises(CollectiveError, match=r"ncclAllReduce failed: ncclInvalidArgument \(4\): invalid argument"):
        lib.check(4, "ncclAllReduce")


def test_missing_library_names_every_place_searched(monkeypatch, tmp_path):
    monkeypatch.setenv("SHIMRT_NCCL_LIBRARY", str(tmp_path / "libnccl-nope.so"))
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    with pytest.raises(CollectiveError, match="RCCL.*libnccl-nope.so.*rocm/lib/librccl.so.*librccl.so"):
        library.load("hip")
