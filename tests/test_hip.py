"""The HIP backend without an AMD GPU: real hipRTC compiles for gfx90a, code-object metadata,
the HIP runtime's errors, and calls checked up to the point HIP says there is no device."""

from __future__ import annotations

import inspect
import itertools
import re
import typing

import pytest

import shimrt
from shimrt import CompileError, DriverError, NoDeviceError, backends, elf, kernels

_DECL = re.compile(r"SHIMRT_KERNEL(?:_BOUNDS\((\w+)\))?\s+void\s+(\w+)\s*\(([^)]*)\)")


def declared(name):
    """{kernel: number of parameters} from the source."""
    return {m.group(2): len([p for p in m.group(3).split(",") if p.strip()])
            for m in _DECL.finditer(kernels.source(name))}


def declared_bounds(name):
    """{kernel: the max threads its SHIMRT_KERNEL_BOUNDS names (1024, hipRTC's default, without)}."""
    src = kernels.source(name)
    defines = dict(re.findall(r"#define\s+(\w+)\s+(\d+)", src))
    return {m.group(2): int(defines.get(m.group(1), m.group(1)) if m.group(1) else 1024) for m in _DECL.finditer(src)}


@pytest.mark.parametrize("name", kernels.names())
def test_every_kernel_compiles_for_gfx90a_with_plausible_resources(name, hiprtc, cache_dir):
    program = shimrt.compile(open(kernels.path(name)).read(), "gfx90a")
    assert hiprtc.binary_arch(program.binary) == "gfx90a"
    assert elf.header(program.binary).machine == 224  # EM_AMDGPU
    decl = declared(name)
    assert set(program.resources) == set(decl)
    for kernel, res in program.resources.items():
        assert res.extra["wavefront_size"] == 64
        assert (res.registers > 0) or kernel == "empty", (kernel, res)  # an empty body needs none
        assert 0 <= res.registers <= 512 and res.spill_bytes == 0 and res.extra["sgprs"] <= 112
        assert res.max_threads_per_block == declared_bounds(name)[kernel]
        layout = program.params[kernel]
        assert len(layout) == decl[kernel]
        for (o1, s1), (o2, s2) in itertools.pairwise(layout):
            assert o2 >= o1 + s1 and o2 % s2 == 0  # ascending, naturally aligned


def test_gfx90a_metadata_matches_the_source(hiprtc, cache_dir):
    program = shimrt.compile(kernels.source("reduce"), "MI250X")
    meta = hiprtc.metadata(program.binary)
    assert meta["amdhsa.target"].startswith("amdgcn-amd-amdhsa--gfx90a")
    (k,) = meta["amdhsa.kernels"]
    res = program.resources["block_sum"]
    assert k[".name"] == "block_sum" and res.static_smem == k[".group_segment_fixed_size"] == 256 * 8
    assert res.max_threads_per_block == 256  # __launch_bounds__(256)
    assert program.params["block_sum"] == ((0, 8), (8, 8), (16, 4))  # double*, const float*, int
    saxpy = shimrt.compile(kernels.source("vector_ops"), "gfx90a").params["saxpy"]
    assert saxpy == ((0, 8), (8, 8), (16, 4), (20, 4))  # float*, const float*, float, int


def test_same_sources_compile_for_every_vendor_target(hiprtc, cache_dir):
    for name in kernels.names():
        kernels_by_target = {arch: set(shimrt.compile(kernels.source(name), arch).resources)
                             for arch in ("sm_80", "sm_86", "sm_90", "gfx90a")}
        assert len({frozenset(v) for v in kernels_by_target.values()}) == 1, kernels_by_target


def test_broken_source_carries_hiprtcs_log(hiprtc, cache_dir):
    src = kernels.source("vector_ops") + "\nSHIMRT_KERNEL void broken(int* p) { *p = not_declared_here; }\n"
    with pytest.raises(CompileError) as info:
        shimrt.compile(src, "gfx90a", name="broken_hip.cu")
    err = info.value
    assert "HIPRTC_ERROR_COMPILATION" in str(err)
    assert re.search(r"error: use of undeclared identifier 'not_declared_here'", err.log)
    assert err.name == "broken_hip.cu" and "--offload-arch=gfx90a" in err.options


def test_gfx90a_programs_are_cached(hiprtc, cache_dir):
    first = shimrt.compile(kernels.source("smem_ops"), "gfx90a")
    second = shimrt.compile(kernels.source("smem_ops"), "gfx90a")
    assert not first.from_cache and second.from_cache
    assert second.binary == first.binary and second.params == first.params
    assert second.resources == first.resources


def test_mi250x_profile():
    t = shimrt.targets.get("MI250X")
    assert (t.backend, t.arch, t.num_sms, t.warp_size) == ("hip", "gfx90a", 110, 64)
    assert (t.smem_per_sm, t.smem_per_block_optin, t.reserved_smem_per_block) == (65536, 65536, 0)
    assert t.max_threads_per_sm == 4 * 8 * 64  # 4 SIMDs x 8 wave slots x wave64
    assert shimrt.targets.get("gfx90a") is t and t.compute_capability is None


def test_hip_device_without_an_amd_gpu_names_hips_error(hiprtc):
    with pytest.raises(NoDeviceError, match=r"hip: .*hipError\w+"):
        shimrt.Device(backend="hip")


def test_hip_errors_are_named_and_described(hiprtc):
    from hip import hip

    from shimrt.hip import check
    with pytest.raises(DriverError) as info:
        check.check((hip.hipError_t.hipErrorOutOfMemory,), "hipMalloc")
    assert info.value.name == "hipErrorOutOfMemory" and info.value.code == int(hip.hipError_t.hipErrorOutOfMemory)
    assert check.check((hip.hipError_t.hipSuccess, 7), "x") == 7


def test_hip_runtime_calls_take_their_arguments(hiprtc, cache_dir):
    """Each wrapped call reaches HIP (which answers that there is no device) rather than failing
    in the binding on an argument's type: the calling conventions hold as far as this machine
    can check them."""
    from shimrt.hip import driver
    code = shimrt.compile(kernels.source("vector_ops"), "gfx90a").binary
    calls = {
        "module_load": lambda: driver.module_load(code),
        "mem_alloc": lambda: driver.mem_alloc(64),
        "mem_free": lambda: driver.mem_free(0x1000),
        "memcpy_htod": lambda: driver.memcpy_htod(0x1000, 0x2000, 16, driver.null_stream()),
        "memset_d8": lambda: driver.memset_d8(0x1000, 7, 16, None),
        "stream_create": lambda: driver.stream_create(-1),
        "event_create": lambda: driver.event_create(True),
        "occupancy": lambda: driver.occupancy(None, 128, 0),
        "function_set_max_dynamic_smem": lambda: driver.function_set_max_dynamic_smem(None, 1024),
        "synchronize": driver.synchronize,
        "partition_stream_create": lambda: driver.partition_stream_create((0xFFFF, 0, 0, 0), 0),
        "launch": lambda: driver.launch_error(driver.launcher()(None, 1, 1, 1, 64, 1, 1, 0, None, 0, None)[0]),
    }
    for name, call in calls.items():
        with pytest.raises(DriverError) as info:
            call()
        assert info.value.name.startswith("hipError"), (name, info.value)


def test_cu_masks_split_an_mi250x_gcd():
    from shimrt.hip.driver import cu_masks
    split, rest = cu_masks(110, 16)  # one MI250X GCD has 110 CUs
    assert split == (0xFFFF, 0, 0, 0)
    assert rest == (0xFFFF0000, 0xFFFFFFFF, 0xFFFFFFFF, (1 << 14) - 1)
    assert sum(bin(w).count("1") for w in split + rest) == 110
    assert all(a & b == 0 for a, b in zip(split, rest, strict=True))
    with pytest.raises(NoDeviceError):
        cu_masks(110, 110)


@pytest.mark.parametrize("part", sorted(backends.PARTS))
def test_backends_satisfy_the_protocol_name_for_name(part):
    """Both backends provide every member of the part's Protocol, with the Protocol's parameter
    names (methods) or type (attributes)."""
    protocol = backends.PARTS[part]
    names = backends.members(protocol)
    assert names, part
    hints = typing.get_type_hints(protocol)
    for backend in backends.NAMES:
        module = backends.load(backend, part)
        for name in names:
            assert hasattr(module, name), f"shimrt.{backend}.{part} lacks {name}"
            ours = getattr(module, name)
            if name in hints:
                assert isinstance(ours, hints[name]), f"shimrt.{backend}.{part}.{name} is not {hints[name]}"
            else:
                want = list(inspect.signature(getattr(protocol, name)).parameters)[1:]  # less self
                assert list(inspect.signature(ours).parameters) == want, f"shimrt.{backend}.{part}.{name}"
