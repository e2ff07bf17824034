"""The occupancy model against NVIDIA's own calculator, AMD's rules, and shape()'s promises."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

import shimrt
from shimrt import ShimrtError, UsageError, kernels, occupancy
from shimrt.occupancy import NCCL_2_28_SM90, Footprint

HERE = Path(__file__).parent
CUDA_TARGETS = ["A100", "A40", "H100", "H200"]


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """NVIDIA's cuda_occupancy.h built into a small program: cases in, answers out."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        include = find_nvidia_header_directory("cudart")
    except Exception as exc:  # not installed, or no such header
        include, why = None, f": {exc}"
    else:
        why = ""
    if not include or not (Path(include) / "cuda_occupancy.h").is_file():
        skip_or_fail("occupancy-reference", f"cuda_occupancy.h not found (pip install nvidia-cuda-runtime){why}")
    if shutil.which("g++") is None:
        skip_or_fail("occupancy-reference", "g++ is needed to build NVIDIA's header-only calculator")
    exe = tmp_path_factory.mktemp("occref") / "occref"
    subprocess.run(["g++", "-O1", f"-I{include}", "-o", str(exe), str(HERE / "data" / "occupancy_reference.cpp")],
                   check=True, timeout=300)

    def run(cases):
        """cases: (target, block_size, registers, static, dynamic) -> (blocks, warps, blocks_lim, regs, smem)."""
        lines = []
        for t, bs, regs, static, dyn in cases:
            major, minor = t.compute_capability
            lines.append(f"{major} {minor} {t.max_threads_per_block} {t.max_threads_per_sm} {t.regs_per_block} "
                         f"{t.regs_per_sm} {t.warp_size} {t.max_smem_per_block_default} {t.smem_per_sm} "
                         f"{t.smem_per_block_optin} {t.reserved_smem_per_block} {bs} {regs} {static} {dyn}")
        out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True,
                             check=True, timeout=600).stdout.split("\n")
        return [tuple(int(v) for v in line.split()) for line in out if line]
    return run


def _grid():
    """A generated grid of launches around every boundary that matters."""
    block_sizes = [1, 32, 33, 64, 96, 128, 160, 192, 256, 288, 384, 512, 640, 768, 1024, 1025]
    registers = [0, 1, 8, 16, 18, 24, 32, 33, 40, 48, 56, 64, 72, 80, 96, 128, 168, 200, 255]
    statics = [0, 1, 1000, 2048, 16384, 48 * 1024]
    dynamics = [0, 1, 127, 128, 1000, 8192, 30928, 48 * 1024, 65536, 100000, 150000, 200000, 232448]
    return itertools.product(block_sizes, registers, statics, dynamics)


@pytest.mark.parametrize("name", CUDA_TARGETS)
def test_cuda_model_equals_nvidias_calculator(name, reference):
    t = shimrt.targets.get(name)
    cases = [(t, *c) for c in _grid()]
    answers = reference(cases)
    assert len(answers) == len(cases)
    mismatches = []
    for (_, bs, regs, static, dyn), ref in zip(cases, answers, strict=True):
        occ = occupancy.occupancy(t, block_size=bs, registers=regs, static_smem=static, dynamic_smem=dyn)
        ours = (occ.blocks, occ.limits["warps"], occ.limits["blocks"], occ.limits["registers"],
                occ.limits["shared_memory"])
        # The reference reports INT_MAX for "no limit" (no registers); compare finite limits.
        if tuple(min(v, 1 << 30) for v in ours) != tuple(min(v, 1 << 30) for v in ref):
            mismatches.append(((bs, regs, static, dyn), ours, ref))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} differ, e.g. {mismatches[:5]}"
    assert len(cases) > 20000


def test_the_notes_table_is_reproduced():
    # shared/notes/h200-measurements.md: the driver's answers for an 18-register kernel.
    kib = [0, 16, 24, 28, 32, 40, 48, 64, 76, 113, 114, 227]
    table = {128: [16, 13, 9, 7, 6, 5, 4, 3, 2, 2, 1, 1], 256: [8, 8, 8, 7, 6, 5, 4, 3, 2, 2, 1, 1],
             512: [4, 4, 4, 4, 4, 4, 4, 3, 2, 2, 1, 1]}
    got = {bs: [occupancy.max_active_blocks("H200", block_size=bs, registers=18, dynamic_smem=k * 1024)
                for k in kib] for bs in table}
    assert got == table


def test_limiting_resources_are_named():
    occ = occupancy.occupancy("H200", block_size=128, registers=18, dynamic_smem=100 * 1024)
    assert occ.blocks == 2 and occ.limited_by == ("shared_memory",)
    occ = occupancy.occupancy("H200", block_size=256, registers=128)
    assert occ.limited_by == ("registers",) and occ.blocks == 2
    occ = occupancy.occupancy("A40", block_size=32, registers=8)
    assert occ.limited_by == ("blocks",) and occ.blocks == 16
    assert occupancy.occupancy("H100", block_size=2048, registers=8).blocks == 0
    with pytest.raises(UsageError):
        occupancy.occupancy("H100", block_size=0, registers=8)


# --- shape() ---------------------------------------------------------------------------------

def _compiled_resources():
    """(name, KernelResources) of every kernel in kernels_src, compiled for sm_90."""
    out = []
    for src in kernels.names():
        program = shimrt.compile(kernels.source(src), "sm_90", name=src)
        out.extend(sorted(program.resources.items()))
    return out


def _smem_only(footprint: Footprint) -> Footprint:
    return Footprint(footprint.name + " (shared memory only)", footprint.blocks, 32, 0,
                     footprint.static_smem, footprint.dynamic_smem)


def test_nccl_sized_shared_memory_leaves_room_for_one_compute_block_only():
    # shared/notes: with NCCL's ~105 KB per block on an H200, only N = 1 satisfies both
    # "N + 1 compute blocks exceed the SM" and "the SM minus N blocks holds the reserve".
    s = occupancy.shape("H200", {"registers": 18, "static_smem": 0}, 256, reserve=_smem_only(NCCL_2_28_SM90))
    assert s.resident_blocks == 1 and s.natural_blocks == 8
    assert s.free.smem >= NCCL_2_28_SM90.static_smem + NCCL_2_28_SM90.dynamic_smem + 1024
    assert occupancy.max_active_blocks("H200", block_size=256, registers=18, dynamic_smem=s.dynamic_smem) == 1


def test_nccl_registers_do_not_fit_beside_a_256_thread_block():
    with pytest.raises(ShimrtError, match=r"\(registers\).*65536"):
        occupancy.shape("H200", {"registers": 18, "static_smem": 0}, 256, reserve=NCCL_2_28_SM90)
    # With NCCL at 512 threads (NCCL_NTHREADS, or its LL protocol) two such blocks fit.
    s = occupancy.shape("H200", {"registers": 18, "static_smem": 0}, 256, reserve=NCCL_2_28_SM90.with_threads(512))
    assert s.resident_blocks == 1  # shared memory then allows one
    s = occupancy.shape("H200", {"registers": 18, "static_smem": 0}, 128,
                        reserve=_smem_only(NCCL_2_28_SM90).with_threads(512))
    assert s.resident_blocks == 1


@pytest.mark.parametrize("target", ["A100", "H200"])
def test_shape_promises_hold_against_nvidias_calculator(target, reference):
    """For real kernels, block sizes and reserves: the reference gives exactly the promised
    residency for the shaped smem; one allocation unit less would admit more; the reserve fits
    at N and not at N + 1."""
    t = shimrt.targets.get(target)
    reserves = [_smem_only(NCCL_2_28_SM90), NCCL_2_28_SM90.with_threads(256), NCCL_2_28_SM90.with_threads(128),
                Footprint("small comm", blocks=2, threads=256, registers=32, static_smem=4096, dynamic_smem=8192)]
    cases, expect = [], []
    for (_, res), bs, reserve in itertools.product(_compiled_resources(), [64, 128, 256, 512], reserves):
        if bs > res.max_threads_per_block:
            continue
        try:
            s = occupancy.shape(t, res, bs, reserve=reserve)
        except ShimrtError as exc:
            assert any(f"({r})" in str(exc) for r in ("registers", "shared_memory", "threads", "blocks"))
            continue
        cases.append((t, bs, res.registers, res.static_smem, s.dynamic_smem))
        expect.append(lambda got, n=s.resident_blocks: got == n)
        if s.dynamic_smem:
            cases.append((t, bs, res.registers, res.static_smem, s.dynamic_smem - t.smem_alloc_unit))
            expect.append(lambda got, n=s.resident_blocks: got > n)
        occ = occupancy.occupancy(t, block_size=bs, registers=res.registers, static_smem=res.static_smem,
                                  dynamic_smem=s.dynamic_smem)
        assert occupancy.fits(t, occ, s.resident_blocks, bs, res.registers, reserve) is None
        if s.resident_blocks < s.natural_blocks:
            assert occupancy.fits(t, occ, s.resident_blocks + 1, bs, res.registers, reserve) is not None
    answers = reference(cases)
    for case, ok, answer in zip(cases, expect, answers, strict=True):
        assert ok(answer[0]), (case[1:], answer)
    assert len(cases) >= 30


def test_shape_to_a_requested_residency():
    res = {"registers": 18, "static_smem": 0}
    for n in range(1, 17):
        s = occupancy.shape("H200", res, 128, resident_blocks=n)
        assert s.resident_blocks == n
        assert occupancy.max_active_blocks("H200", block_size=128, registers=18, dynamic_smem=s.dynamic_smem) == n
        if s.dynamic_smem:
            one_less = s.dynamic_smem - 128
            assert occupancy.max_active_blocks("H200", block_size=128, registers=18, dynamic_smem=one_less) > n
    assert occupancy.shape("H200", res, 128, resident_blocks=16).dynamic_smem == 0
    with pytest.raises(ShimrtError, match="more than fit unshaped"):
        occupancy.shape("H200", res, 128, resident_blocks=17)
    with pytest.raises(UsageError, match="needs resident_blocks"):
        occupancy.shape("H200", res, 128)
    with pytest.raises(ShimrtError, match="leave room"):
        occupancy.shape("H200", res, 256, resident_blocks=4, reserve=_smem_only(NCCL_2_28_SM90))


def test_shape_explains_itself():
    s = occupancy.shape("H100", {"registers": 32, "static_smem": 2048}, 256, reserve=_smem_only(NCCL_2_28_SM90))
    text = str(s)
    assert "caps them at 1" in text and "unshaped" in text and NCCL_2_28_SM90.name in text
    assert s.free.blocks == s.target.max_blocks_per_sm - 1


# --- gfx90a: worked examples from AMD's documentation ----------------------------------------
# (VGPRs, SGPRs, waves per SIMD, source). A 64-thread workgroup is one wave, so a CU holds
# 4 SIMDs x waves of them.
AMD_WAVES_PER_SIMD = [
    # AMD lab notes, "Register pressure in AMD CDNA2 GPUs" (MI200, gfx90a)
    (102, 98, 4, "register-pressure"), (100, 98, 4, "register-pressure"), (96, 94, 5, "register-pressure"),
    (94, 86, 5, "register-pressure"), (96, 78, 5, "register-pressure"),
    # ROCm blog, "Reading AMD GPU ISA" (MI250)
    (3, 11, 8, "amdgcn-isa"), (4, 14, 8, "amdgcn-isa"), (21, 22, 8, "amdgcn-isa"), (42, 22, 8, "amdgcn-isa"),
    (74, 22, 6, "amdgcn-isa"),
]


@pytest.mark.parametrize("vgprs,sgprs,waves,source", AMD_WAVES_PER_SIMD)
def test_gfx90a_waves_per_simd_match_amds_examples(vgprs, sgprs, waves, source):
    occ = occupancy.occupancy("MI250X", block_size=64, registers=vgprs, sgprs=sgprs)
    assert occ.blocks == 4 * waves


def test_gfx90a_omniperf_occupancy_limiter_examples():
    # Omniperf / rocprofiler-compute tutorial "occupancy limiters" (MI250, 32 wave slots per CU):
    # vgprbound: 256 threads, 128 VGPRs (124 + 4 AGPRs) -> 16 of 32 waves (50 %), limited by VGPRs.
    occ = occupancy.occupancy("MI250X", block_size=256, registers=128, sgprs=80)
    assert occ.blocks * 4 == 16 and occ.limited_by == ("registers",)
    # ldsbound: 256 threads, 96 VGPRs, 64 KiB LDS -> 1 workgroup = 4 waves per CU (12.5 %), limited by LDS.
    occ = occupancy.occupancy("MI250X", block_size=256, registers=96, sgprs=80, static_smem=65536)
    assert occ.blocks == 1 and occ.limited_by == ("shared_memory",)
    # sgprbound: 1024 threads, 64 VGPRs, 80 SGPRs -> 8 waves per SIMD, all 32 waves of the CU.
    occ = occupancy.occupancy("MI250X", block_size=1024, registers=64, sgprs=80)
    assert occ.blocks * 16 == 32


def test_gfx90a_shaping_leaves_lds_for_a_comm_workgroup():
    # RCCL's workgroups: 256 threads (__launch_bounds__(256, 1)); a made-up LDS need of 16 KiB.
    rccl_like = Footprint("RCCL-like", blocks=1, threads=256, registers=64, static_smem=16384, dynamic_smem=0)
    s = occupancy.shape("MI250X", {"registers": 32, "static_smem": 0}, 256, reserve=rccl_like)
    occ = occupancy.occupancy("MI250X", block_size=256, registers=32, dynamic_smem=s.dynamic_smem)
    assert occ.blocks == s.resident_blocks and s.free.smem >= 16384
    assert occupancy.fits(s.target, occ, s.resident_blocks, 256, 32, rccl_like) is None
