"""Kernel tracing without a GPU: the CUPTI record layout shimrt reads equals the C compiler's for
the installed header, CUPTI's results reach the CUDA backend's one check helper, the HIP trace
part mirrors the CUDA one and says what it lacks; and the NCCL library loads from the wheel."""

from __future__ import annotations

import ctypes
import inspect
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

from shimrt import CollectiveError, DriverError, ShimrtError, backends
from shimrt.cuda import check
from shimrt.cuda import trace as cuda_trace
from shimrt.hip import trace as hip_trace
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
    assert c_layout.pop("KIND_KERNEL")[0] == cuda_trace.KIND_KERNEL
    assert c_layout.pop("KIND_CONCURRENT_KERNEL")[0] == cuda_trace.KIND_CONCURRENT_KERNEL
    ours = {k: (o, struct.calcsize("<" + f)) for k, (o, f) in cuda_trace.KERNEL_RECORD.items()}
    assert ours == c_layout


def cupti_path() -> str:
    """The CUPTI of the nvidia-cuda-cupti wheel (CI must have it: a skip hides nothing there)."""
    path = cuda_trace.library_path()
    if path is None:
        skip_or_fail("cupti-layout", "CUPTI does not load (pip install nvidia-cuda-cupti)")
    return path


def test_cupti_results_become_driver_errors_named_by_cupti():
    # What the library itself says of CUPTI_ERROR_INVALID_PARAMETER (1), asked directly. Without an
    # NVIDIA driver CUPTI answers nothing, not even this: then shimrt must say so, not make a name up.
    lib = ctypes.CDLL(cupti_path())
    lib.cuptiGetResultString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    text = ctypes.c_char_p()
    answered = lib.cuptiGetResultString(1, ctypes.byref(text))

    assert check.check((check.CuptiResult(0),), "cuptiActivityEnable") is None
    with pytest.raises(DriverError) as info:
        check.check((check.CuptiResult(1),), "cuptiActivityEnable")
    err = info.value
    assert (err.call, err.code) == ("cuptiActivityEnable", 1)
    assert str(err).startswith(f"cuptiActivityEnable failed: {err.name} (1): ")
    if answered == 0:
        assert err.name == text.value.decode() == "CUPTI_ERROR_INVALID_PARAMETER"
        assert err.description
    else:
        assert err.name == "CUptiResult 1"
        assert f"cuptiGetResultString failed too ({answered})" in err.description
        assert "NVIDIA driver" in err.description


def test_kernel_recorder_failures_come_through_the_check_helper():
    path = cupti_path()
    try:
        with cuda_trace.KernelRecorder() as rec:
            pass
    except DriverError as exc:  # no NVIDIA driver here: CUPTI refuses to start, as a DriverError
        assert exc.call in ("cuptiActivityRegisterCallbacks", "cuptiActivityEnable")
        assert exc.code != 0 and (exc.name, exc.code, exc.description) == check.describe(check.CuptiResult(exc.code))
    else:  # a driver: recording nothing works
        assert isinstance(rec.kernels, list) and rec.path == path


def test_hip_trace_says_roctracer_is_not_bound():
    assert hip_trace.library_path() is None
    with pytest.raises(ShimrtError, match=r"not available on HIP yet: it needs roctracer \(rocprofiler\)"):
        hip_trace.KernelRecorder()
    with pytest.raises(ShimrtError, match="roctracer"):
        hip_trace.LaunchInterposer(lambda launch: None)


def public_names(module) -> set[str]:
    """What ``module`` defines itself without a leading underscore (imports left out)."""
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and not inspect.ismodule(value)
            and getattr(value, "__module__", module.__name__) == module.__name__}


def test_trace_parts_mirror_each_other_in_what_the_core_calls():
    shared = backends.members(backends.Trace)
    assert hip_trace.__all__ == shared == cuda_trace.__all__[:len(shared)]
    for module in (cuda_trace, hip_trace):
        assert public_names(module) == set(module.__all__), module.__name__
    for name in shared:
        assert str(inspect.signature(getattr(cuda_trace, name))) == str(inspect.signature(getattr(hip_trace, name))), \
            name
    assert cuda_trace.KernelRecorder.__annotations__ == hip_trace.KernelRecorder.__annotations__
    assert cuda_trace.LaunchInterposer.__annotations__ == hip_trace.LaunchInterposer.__annotations__


def test_nccl_loads_from_the_wheel_with_every_table_entry():
    try:
        lib = library.load("cuda")
    except CollectiveError as exc:
        skip_or_fail("nccl", f"NCCL is not installed (pip install 'shimrt[nccl]'): {exc}")
    assert lib.version >= 21700 and lib.missing == ()
    uid = lib.unique_id()
    assert ctypes.sizeof(uid) == 128 and any(bytes(uid))
    with pytest.raises(CollectiveError, match=r"ncclAllReduce failed: ncclInvalidArgument \(4\): invalid argument"):
        lib.check(4, "ncclAllReduce")


def test_missing_library_names_every_place_searched(monkeypatch, tmp_path):
    monkeypatch.delenv("SHIMRT_NCCL_LIBRARY", raising=False)  # when set, it is the only place (test_bad_inputs)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    with pytest.raises(CollectiveError, match="RCCL.*rocm/lib/librccl.so.*librccl.so"):
        library.load("hip")


def _run_c(tmp_path, source: str) -> str:
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        include = find_nvidia_header_directory("cudart")
    except Exception as exc:
        include, why = None, str(exc)
    else:
        why = "header not found"
    needed = ("cupti_callbacks.h", "cupti_driver_cbid.h", "generated_cuda_meta.h", "cuda.h", "crt/host_defines.h")
    if not include or not all((Path(include) / h).is_file() for h in needed) or shutil.which("gcc") is None:
        skip_or_fail("cupti-layout", "needs gcc and the headers of nvidia-cuda-cupti, nvidia-cuda-runtime and "
                     f"nvidia-cuda-crt (pip install -e '.[test]'): {why}")
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{include}", "-o", str(exe), str(HERE / "data" / source)], check=True, timeout=300)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_launch_callback_layouts_match_the_headers(tmp_path):
    out = _run_c(tmp_path, "cupti_launch_offsets.c")
    tables, consts, blobs = {}, {}, {}
    for line in out.splitlines():
        kind, name, *rest = line.split()
        if kind == "CONST":
            consts[name] = int(rest[0])
        elif kind == "bytes":
            blobs[name] = bytes.fromhex(rest[0])
        else:
            tables.setdefault(kind, {})[name] = (int(rest[0]), int(rest[1]))
    for table in ("CALLBACK_DATA", "LAUNCH_PARAMS", "LAUNCH_EX_PARAMS", "LAUNCH_CONFIG", "LAUNCH_ATTRIBUTE"):
        ours = {k: (o, struct.calcsize("<" + f) if f else 0) for k, (o, f) in getattr(cuda_trace, table).items()}
        assert ours == tables[table], table
    # The per-thread-stream variants share the layouts.
    assert tables["LAUNCH_PARAMS_PTSZ"]["dynamic_smem"] == tables["LAUNCH_PARAMS"]["dynamic_smem"]
    assert tables["LAUNCH_EX_PARAMS_PTSZ"]["f"] == tables["LAUNCH_EX_PARAMS"]["f"]
    assert cuda_trace.LAUNCH_CALLBACKS == {consts[n]: n for n in ("cuLaunchKernel", "cuLaunchKernel_ptsz",
                                                                  "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")}
    assert (consts["DRIVER_DOMAIN"], consts["API_ENTER"]) == (1, 0)
    assert cuda_trace.GRAPH_LAUNCHES == {consts[n]: n for n in ("cuGraphLaunch", "cuGraphLaunch_ptsz")}

    # A plain launch as the C compiler laid it out: read, then its dynamic smem rewritten in place.
    launch = ctypes.create_string_buffer(blobs["launch"], len(blobs["launch"]))
    got = cuda_trace.read_launch(307, ctypes.addressof(launch))
    assert {k: got[k] for k in ("f", "grid_x", "grid_y", "block_x", "block_y", "dynamic_smem", "stream",
                                "cluster_blocks", "cooperative")} == \
        {"f": 0x1234, "grid_x": 1000, "grid_y": 2, "block_x": 128, "block_y": 2, "dynamic_smem": 4096,
         "stream": 0x5678, "cluster_blocks": 1, "cooperative": False}
    cuda_trace.write_dynamic_smem(got, 77824)
    off = tables["LAUNCH_PARAMS"]["dynamic_smem"][0]
    assert struct.unpack_from("<I", launch.raw, off)[0] == 77824
    assert launch.raw[:off] == blobs["launch"][:off] and launch.raw[off + 4:] == blobs["launch"][off + 4:]

    # An Ex launch: its config and attributes (a cluster of 2, cooperative) behind pointers.
    attrs = ctypes.create_string_buffer(blobs["attrs"], len(blobs["attrs"]))
    config = ctypes.create_string_buffer(blobs["config"], len(blobs["config"]))
    struct.pack_into("<Q", config, tables["LAUNCH_CONFIG"]["attrs"][0], ctypes.addressof(attrs))
    params = ctypes.create_string_buffer(32)
    struct.pack_into("<Q", params, tables["LAUNCH_EX_PARAMS"]["config"][0], ctypes.addressof(config))
    struct.pack_into("<Q", params, tables["LAUNCH_EX_PARAMS"]["f"][0], 0xBEEF)
    got = cuda_trace.read_launch(652, ctypes.addressof(params))
    assert (got["f"], got["grid_x"], got["block_x"], got["dynamic_smem"], got["stream"]) == \
        (0xBEEF, 132, 384, 188604, 0x9ABC)
    assert (got["cluster_blocks"], got["cooperative"]) == (2, True)
    cuda_trace.write_dynamic_smem(got, 1024)
    assert struct.unpack_from("<I", config.raw, tables["LAUNCH_CONFIG"]["dynamic_smem"][0])[0] == 1024
    with pytest.raises(ShimrtError, match="callback 999 is not a kernel launch"):
        cuda_trace.read_launch(999, ctypes.addressof(params))


def _c_layouts(tmp_path):
    tables, blobs = {}, {}
    for line in _run_c(tmp_path, "cupti_launch_offsets.c").splitlines():
        kind, name, *rest = line.split()
        if kind == "bytes":
            blobs[name] = bytes.fromhex(rest[0])
        elif kind != "CONST":
            tables.setdefault(kind, {})[name] = (int(rest[0]), int(rest[1]))
    return tables, blobs


def test_the_interposer_rewrites_a_launch_as_cupti_hands_it_over(tmp_path):
    """The callback path, on a CUpti_CallbackData and a launch laid out by the C compiler: the
    rewrite's value lands in the launch; exit sites, other callbacks and a failing rewrite leave
    it unchanged, the failure recorded."""
    cupti_path()
    tables, blobs = _c_layouts(tmp_path)
    launch = ctypes.create_string_buffer(blobs["launch"], len(blobs["launch"]))
    data = ctypes.create_string_buffer(80)
    struct.pack_into("<Q", data, tables["CALLBACK_DATA"]["params"][0], ctypes.addressof(launch))
    smem_at = tables["LAUNCH_PARAMS"]["dynamic_smem"][0]

    def smem() -> int:
        return struct.unpack_from("<I", launch.raw, smem_at)[0]

    seen = []
    li = cuda_trace.LaunchInterposer(lambda launch: seen.append(launch["block_x"]) or launch["dynamic_smem"] + 1024)
    li.on_callback(None, 1, 307, ctypes.addressof(data))  # driver domain, cuLaunchKernel, API enter
    assert smem() == 4096 + 1024 and seen == [128] and li.failure_count == 0
    struct.pack_into("<I", data, tables["CALLBACK_DATA"]["site"][0], 1)  # CUPTI_API_EXIT: too late, left alone
    li.on_callback(None, 1, 307, ctypes.addressof(data))
    struct.pack_into("<I", data, tables["CALLBACK_DATA"]["site"][0], 0)
    li.on_callback(None, 1, 17, ctypes.addressof(data))  # not a launch
    li.on_callback(None, 1, 514, ctypes.addressof(data))  # a graph replayed: counted, not rewritable
    assert li.graph_launches == 1
    li.on_callback(None, 2, 307, ctypes.addressof(data))  # the runtime domain
    assert smem() == 5120 and seen == [128]

    def broken(launch):
        raise ValueError("no attributes for this function")
    failing = cuda_trace.LaunchInterposer(broken)
    failing.on_callback(None, 1, 307, ctypes.addressof(data))  # must not raise into the launch
    assert smem() == 5120 and failing.failure_count == 1
    assert failing.failures == ["ValueError: no attributes for this function"]
    with pytest.raises(ShimrtError, match="rewrite must be a function of a launch"):
        cuda_trace.LaunchInterposer(42)
    with pytest.raises(ShimrtError, match="roctracer"):
        hip_trace.LaunchInterposer(lambda launch: None)


def test_the_interposer_without_a_driver_says_so():
    """Subscribing needs the NVIDIA driver: without one the error is CUPTI's, by name."""
    cupti_path()
    from shimrt import Device, NoDeviceError
    try:
        Device()
    except NoDeviceError:
        pass
    else:
        pytest.skip("this machine has a GPU: tests/gpu covers the interposer there")
    with pytest.raises(DriverError, match="cuptiSubscribe failed"):
        with cuda_trace.LaunchInterposer(lambda launch: None):
            pass


def test_a_kernel_record_is_read_field_by_field():
    """parse_kernel_record on a record written at KERNEL_RECORD's offsets (checked against the
    header above), with its name behind a pointer."""
    name = ctypes.create_string_buffer(b"ncclDevKernel_AllReduce_f32_RING")
    size = max(o + struct.calcsize(f) for o, f in cuda_trace.KERNEL_RECORD.values())
    raw = ctypes.create_string_buffer(size)
    values = {"kind": 10, "registers": 96, "start": 1_000, "end": 5_000, "device_id": 0, "stream_id": 7,
              "grid_x": 64, "grid_y": 1, "grid_z": 1, "block_x": 544, "block_y": 1, "block_z": 1,
              "static_smem": 36800, "dynamic_smem": 82240, "local_per_thread": 0, "name": ctypes.addressof(name)}
    for key, (offset, code) in cuda_trace.KERNEL_RECORD.items():
        struct.pack_into("<" + code, raw, offset, values[key])
    rec = cuda_trace.parse_kernel_record(ctypes.addressof(raw))
    assert rec == {**values, "name": "ncclDevKernel_AllReduce_f32_RING"}
