"""Real NVRTC compiles of every kernel in kernels_src for sm_80, sm_86 and sm_90 (no GPU needed)."""

from __future__ import annotations

import re

import pytest

import shimrt
from shimrt import CompileError, kernels
from shimrt.cuda.rtc import binary_arch

ARCHES = ["sm_80", "sm_86", "sm_90"]
_DECL = re.compile(r"SHIMRT_KERNEL(?:_BOUNDS\((\w+)\))?\s+void\s+(\w+)\s*\(")


def declared(name):
    """Kernel names declared in a source, with their launch bound macro if any."""
    return {m.group(2): m.group(1) for m in _DECL.finditer(kernels.source(name))}


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", kernels.names())
def test_every_kernel_compiles_with_plausible_resources(name, arch, cache_dir, spill_allowance):
    program = shimrt.compile(open(kernels.path(name)).read(), arch)  # no options: kernels_src is included
    assert binary_arch(program.binary) == arch
    assert program.target.arch == arch
    assert set(program.resources) == set(declared(name))
    for kernel, res in program.resources.items():
        assert 1 <= res.registers <= 255, (kernel, res)
        assert res.spill_bytes <= spill_allowance.get(kernel, 0) and res.local_bytes >= 0, (kernel, res)
        assert 0 <= res.static_smem <= program.target.smem_per_block_optin
        assert 1 <= res.max_threads_per_block <= 1024


def test_static_smem_and_launch_bounds_are_parsed(cache_dir):
    res = shimrt.compile(kernels.source("reduce"), "sm_90", name="reduce.cu").resources["block_sum"]
    assert res.static_smem == 256 * 8          # __shared__ double lane[256]
    assert res.max_threads_per_block == 256    # __launch_bounds__(256)
    assert shimrt.compile(kernels.source("vector_ops"), "sm_90").resources["saxpy"].max_threads_per_block == 1024


def test_register_count_follows_the_options(cache_dir):
    src = kernels.source("vector_ops")
    capped = shimrt.compile(src, "sm_90", options=["--maxrregcount=24"]).resources["add_i64"]
    free = shimrt.compile(src, "sm_90").resources["add_i64"]
    assert capped.registers <= 24 < free.registers  # ptxas' floor on sm_90 is 24


def test_broken_source_raises_compile_error_with_the_log(cache_dir):
    src = kernels.source("vector_ops") + "\nSHIMRT_KERNEL void broken(int* p) { *p = not_declared_anywhere; }\n"
    with pytest.raises(CompileError) as info:
        shimrt.compile(src, "sm_90", options=["-DEXTRA=1"], name="broken.cu")
    err = info.value
    assert re.search(r'broken\.cu\(\d+\): error: identifier "not_declared_anywhere" is undefined', err.log)
    assert "not_declared_anywhere" in str(err) and "broken.cu" in str(err) and "-DEXTRA=1" in str(err)
    assert err.name == "broken.cu" and "-DEXTRA=1" in err.options
    assert "--gpu-architecture=sm_90" in err.options


def test_rejected_option_is_a_compile_error(cache_dir):
    with pytest.raises(CompileError, match="NVRTC_ERROR_INVALID_OPTION"):
        shimrt.compile(kernels.source("vector_ops"), "sm_90", options=["-O3"])


def test_bad_arguments_are_usage_errors(cache_dir):
    with pytest.raises(shimrt.UsageError, match="sequence of strings"):
        shimrt.compile(kernels.source("vector_ops"), "sm_90", options="-DX")
    with pytest.raises(shimrt.UsageError):
        shimrt.compile(b"bytes", "sm_90")
    with pytest.raises(shimrt.ShimrtError, match="unknown target"):
        shimrt.compile(kernels.source("vector_ops"), "sm_99")


def test_kernel_sources_are_found_by_name():
    assert "vector_ops.cu" in kernels.names()
    assert kernels.source("vector_ops") == kernels.source("vector_ops.cu")
    assert '#include "shimrt_portable.h"' in kernels.source("probe")
    with pytest.raises(shimrt.ShimrtError, match="there are: .*vector_ops.cu"):
        kernels.source("missing")
    with pytest.raises(shimrt.ShimrtError):
        kernels.source("../pyproject.toml")


def test_repeated_compiles_keep_the_resource_report(cache_dir):
    # NVRTC >= 12.9 with a driver present would serve repeats from the driver's cache with an
    # empty log (seen on the H200); shimrt turns that cache off so the report is always there.
    src = kernels.source("smem_ops")
    first, second = (shimrt.compile(src, "sm_90", cache=False) for _ in range(2))
    assert first.resources == second.resources and "reverse_tiles" in second.resources
