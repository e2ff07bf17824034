"""The overlap planner and metrics on a CPU: choices from the occupancy model for real targets,
checked against the arithmetic by hand, and the metric formulas on known numbers."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import shimrt
from shimrt import UsageError, kernels, occupancy, targets
from shimrt.occupancy import NCCL_2_28_SM90
from shimrt.overlap import auto, metrics, planner
from shimrt.overlap.engine import Op, Schedule
from shimrt.overlap.standin import StandInSpec

H200 = targets.get("H200")
FMA = {"registers": 18, "static_smem": 0}  # the shared notes' FMA-bound compute kernel


def problem(threads=512, compute=FMA, block=256, target=H200, blocks=16):
    return planner.Problem(target, compute, block, NCCL_2_28_SM90.with_threads(threads), blocks)


def test_fixed_policies():
    p = problem()
    assert planner.plan("sequential", p) == planner.Choice("sequential")
    assert planner.plan("priority", p).comm_priority == "high"
    seed = planner.plan("shaping+priority", p)
    # NCCL's block takes 21568 + 82240 + 1024 B: one 256-thread compute block must then take more
    # than 233472 / 2 B so that no second one fits, and leave 104832 B.
    assert seed.resident_blocks == 1 and seed.comm_priority == "high"
    alloc = -(-(seed.dynamic_smem + 1024) // 128) * 128
    assert 2 * alloc > H200.smem_per_sm and H200.smem_per_sm - alloc >= 21568 + 82240 + 1024
    assert occupancy.max_active_blocks(H200, block_size=256, registers=18, dynamic_smem=seed.dynamic_smem) == 1
    assert planner.plan("shaping", p).comm_priority == "low"
    part = planner.plan("partition", p)
    assert part.partition_sms == 16  # one 512-thread NCCL block per SM, 16 channels
    # Two 256-thread blocks fit per SM, yet each channel keeps an SM of its own (8 would hold
    # them all); with 80 channels, one each would be most of the device: the fewest, 40.
    assert planner.partition_sms(problem(256)) == 8 and planner.plan("partition", problem(256)).partition_sms == 16
    assert planner.plan("partition", problem(256, blocks=80)).partition_sms == 40
    with pytest.raises(shimrt.UsageError):
        planner.plan("auto", p)


def test_640_threads_leave_no_room_and_say_why():
    # 640 threads x 96 registers = 61440 of the SM's 65536: not even one 256-thread block fits.
    with pytest.raises(shimrt.ShimrtError, match=r"\(registers\).*16896 registers in a sub-partition of 16384"):
        planner.plan("shaping+priority", problem(threads=640))


def test_candidates_are_feasible_by_the_model_and_rejections_give_reasons():
    p = problem()
    feasible, rejected = planner.candidates(p, threads=(None, 256), blocks=(None, 8))
    policies = {c.policy for c in feasible}
    assert {"sequential", "concurrent", "priority", "shaping", "shaping+priority", "partition"} <= policies
    for c in feasible:
        if c.shaped:  # the residency cap holds by the calculator, and the footprint fits beside it
            fp = p.footprint(c.comm_threads)
            occ = occupancy.occupancy(H200, block_size=256, registers=18, dynamic_smem=c.dynamic_smem)
            assert occ.blocks == c.resident_blocks
            assert planner.occupancy.fits(H200, occ, c.resident_blocks, 256, 18, fp) is None
        if c.partition_sms:
            per_sm = p.comm_per_sm(c.comm_threads)
            assert c.partition_sms * per_sm >= (c.comm_blocks or 16) and c.partition_sms <= H200.num_sms // 2
    assert len(set(feasible)) == len(feasible)
    assert rejected and all(r.why for r in rejected)
    assert planner.Choice("priority", comm_priority="high", comm_blocks=8) in feasible
    # 256-thread NCCL blocks: two fit per SM, so 8 SMs hold 16 channels.
    assert planner.Choice("partition", partition_sms=8, comm_priority="high", comm_threads=256) in feasible


def test_heavier_compute_shapes_to_fewer_blocks_on_every_target():
    for name in ("A100", "A40", "H100", "H200"):
        t = targets.get(name)
        fp = NCCL_2_28_SM90.with_threads(256)
        p = planner.Problem(t, {"registers": 32, "static_smem": 8192}, 128, fp, 8)
        try:
            c = planner.plan("shaping+priority", p)
        except shimrt.ShimrtError as exc:
            assert "cannot leave room" in str(exc)
            continue
        occ = occupancy.occupancy(t, block_size=128, registers=32, static_smem=8192, dynamic_smem=c.dynamic_smem)
        assert occ.blocks == c.resident_blocks


def test_mi250x_plan_uses_the_hip_rules():
    t = targets.get("MI250X")
    rccl = occupancy.Footprint("RCCL-like", 1, 256, 128, 0, 16384)
    p = planner.Problem(t, {"registers": 64, "static_smem": 0}, 256, rccl, 16)
    c = planner.plan("shaping+priority", p)
    occ = occupancy.occupancy(t, block_size=256, registers=64, dynamic_smem=c.dynamic_smem)
    assert occ.blocks == c.resident_blocks >= 1
    assert t.smem_per_sm - c.resident_blocks * occ.smem_per_block >= 16384


def test_choice_and_problem_validation():
    with pytest.raises(shimrt.UsageError):
        planner.Choice("fastest")
    with pytest.raises(shimrt.UsageError):
        planner.Choice("shaping", resident_blocks=0)
    with pytest.raises(shimrt.UsageError):
        planner.Choice("priority", comm_priority="max")
    with pytest.raises(shimrt.UsageError):
        planner.Choice("shaping", dynamic_smem=1024)  # padding without a cap
    with pytest.raises(shimrt.UsageError):
        planner.Problem(H200, {"registers": 18}, 256, NCCL_2_28_SM90, 16)
    with pytest.raises(shimrt.UsageError):
        planner.Problem(H200, FMA, 256, NCCL_2_28_SM90, 0)
    c = planner.Choice("partition", partition_sms=16, comm_priority="high", comm_threads=256)
    assert planner.Choice.from_dict(json.loads(json.dumps(c.as_dict()))) == c
    assert c.describe() == "partition: comm on 16 SMs, high priority, 256 threads"


def test_choice_cache_round_trip_and_isolation(tmp_path):
    cache = auto.ChoiceCache(tmp_path, "NVIDIA H200|sm_90")
    assert cache.get("w") is None
    c = planner.Choice("shaping+priority", resident_blocks=1, dynamic_smem=115840, comm_priority="high")
    cache.put("w", c)
    cache.put("v", planner.Choice("partition", partition_sms=8, comm_priority="high"))
    assert auto.ChoiceCache(tmp_path, "NVIDIA H200|sm_90").get("w") == c
    assert auto.ChoiceCache(tmp_path, "NVIDIA A100|sm_80").get("w") is None  # another device
    cache.path.write_text("{not json")
    assert cache.get("w") is None  # a damaged file means: measure again
    for wrong in ('{"device": "NVIDIA H200|sm_90", "choices": ["w"]}', '{"device": "NVIDIA H200|sm_90", "choices": 3}',
                  "[1, 2]", "[" * 100000):
        cache.path.write_text(wrong)
        assert cache.get("w") is None, wrong  # not this version's file: measure again
        cache.put("w", c)  # and rewrite it
        assert cache.get("w") == c


def test_pick_takes_the_fastest_and_refuses_nothing_to_pick():
    a, b = planner.Choice("sequential"), planner.Choice("priority", comm_priority="high")
    best, times = auto.pick([a, b], {a: 2.0, b: 1.5}.get)
    assert best == b and times == {a: 2.0, b: 1.5}
    with pytest.raises(shimrt.ShimrtError):
        auto.pick([], lambda c: 0)


def test_occupancy_model_for_the_real_sgemm_beside_nccls_footprint(cache_dir):
    res = shimrt.compile(kernels.source("workloads"), "sm_90", name="workloads.cu").resources["sgemm"]
    sgemm = {"registers": res.registers, "static_smem": res.static_smem}
    assert 96 < res.registers <= 128  # launch bounds (256, 2)
    # 512 threads x 96 registers leave 4096 registers per sub-partition: not one SGEMM block
    # (2 warps there x 32 x 128): the 16 SMs that host the collective do no compute at all.
    b = planner.estimate(problem(512, sgemm), 3.0, 3.0)
    assert (b.natural, b.kept, b.comm_sms, b.lost, b.slots) == (2, 0, 16, 32, 264)
    assert b.makespan_ms == pytest.approx(3.0 * (1 + 32 / 264)) and b.ratio == pytest.approx(1 + 16 / 132)
    assert "0 of 2 compute blocks still fit" in b.why
    # 256 threads leave 10240 per sub-partition: one SGEMM block stays on each of those SMs.
    half = planner.estimate(problem(256, sgemm), 3.0, 3.0)
    assert (half.kept, half.lost) == (1, 16) and half.ratio == pytest.approx(1 + 16 / 264)
    # Where the collective is 4x longer, compute fits in what it leaves: R reaches 1.
    assert planner.estimate(problem(512, sgemm), 1.0, 4.0).ratio == 1.0
    # Compute 4x longer: only T_comm x 32/264 is added.
    assert planner.estimate(problem(512, sgemm), 4.0, 1.0).makespan_ms == pytest.approx(4.0 + 32 / 264)
    with pytest.raises(shimrt.UsageError):
        planner.estimate(problem(), 0.0, 1.0)


def test_occupancy_model_packs_small_collective_blocks_where_that_loses_least():
    # 128-thread blocks with 32 registers and no shared memory; FMA blocks are limited by
    # threads (8 x 256 per SM). One or two such blocks per SM cost one compute block (7 x 8 + 4
    # or 8 warps <= 64); three or four cost two: two per SM loses least, 8 slots for 16 blocks.
    small = occupancy.Footprint("small", 1, 128, 32, 0, 0)
    b = planner.estimate(planner.Problem(H200, FMA, 256, small, 16), 1.0, 1.0)
    assert (b.natural, b.kept, b.comm_sms, b.lost) == (8, 7, 8, 8)
    assert occupancy.coresident(H200, FMA, 256, small) == 7
    assert occupancy.coresident(H200, FMA, 256, dataclasses.replace(small, blocks=3)) == 6
    assert occupancy.coresident(H200, FMA, 256, dataclasses.replace(small, blocks=16)) == 0
    with pytest.raises(shimrt.ShimrtError, match="does not fit"):
        occupancy.coresident(H200, FMA, 256, dataclasses.replace(small, blocks=17))


def test_metrics_formulas():
    # compute 4 ms, comm 1 ms, sequential 5 ms; overlapped in 4.2 ms.
    m = metrics.compute(4.0, 1.0, 5.0, 4.2, comp_span=4.1, comm_start_delay=0.05)
    assert m.efficiency == pytest.approx(0.8)       # (5 - 4.2) / min(4, 1)
    assert m.ratio == pytest.approx(1.05)           # 4.2 / max(4, 1)
    assert m.compute_slowdown == pytest.approx(1.025)
    assert m.reduction == pytest.approx(0.16)       # 1 - 4.2 / 5
    perfect = metrics.compute(2.0, 2.0, 4.0, 2.0, 2.0, 0.0)
    assert (perfect.efficiency, perfect.ratio, perfect.reduction) == (1.0, 1.0, 0.5)
    with pytest.raises(shimrt.UsageError):
        metrics.compute(0.0, 1.0, 1.0, 1.0, 1.0, 0.0)


def test_block_rows_from_raw_stamps():
    hz = 1e9  # CUDA's %globaltimer counts nanoseconds
    raw = np.array([1_000_000, 1_500_000, 3, 1_200_000, 2_000_000, 7], dtype=np.uint64)
    rows = metrics.blocks(raw, hz, origin=1_000_000)
    assert np.allclose(rows, [[0.0, 0.5, 3.0], [0.2, 1.0, 7.0]], rtol=0, atol=1e-12)
    s = metrics.span(rows)
    assert (s.start, s.end, s.length) == (0.0, 1.0, 1.0)
    # HIP's wall clock at 100 MHz: 100 ticks are 1 us.
    assert metrics.blocks(np.array([100, 200, 0], np.uint64), 1e8, 100).tolist() == [[0.0, 0.001, 0.0]]
    with pytest.raises(shimrt.UsageError, match="left no timestamps"):
        metrics.blocks(np.array([0, 0, 0, 5, 9, 1], np.uint64), hz, 0)
    assert metrics.median_run([3.0, 1.0, 2.0, 5.0]) == 2  # the lower median, 2.0


def test_standin_spec():
    s = StandInSpec(nbytes=64 << 20)
    assert s.steps == 14 and s.label == "all_reduce-64MiB"
    assert s.chunk() == (64 << 20) // 8 // 16 // 16
    assert StandInSpec(nbytes=1 << 20, collective="all_gather", ranks=4).steps == 3
    assert s.step_ns() == 0  # unpaced
    paced = StandInSpec(nbytes=64 << 20, link_gbps=25.0)
    assert paced.step_ns() == int(paced.chunk() * 16 / 25.0)  # 512 KiB at 25 GB/s: 20972 ns
    assert abs(paced.step_ns(8) - 2 * paced.step_ns()) <= 1  # half the channels, twice the time
    for bad in ({"nbytes": 8}, {"nbytes": 1 << 20, "threads": 700}, {"nbytes": 1 << 20, "collective": "x"},
                {"nbytes": 1 << 20, "ranks": 1}, {"nbytes": 1 << 20, "timeout_s": 0},
                {"nbytes": 1 << 20, "link_gbps": 0}):
        with pytest.raises(shimrt.UsageError):
            StandInSpec(**bad)


def test_standin_has_nccls_footprint_on_every_nvidia_target(cache_dir, spill_allowance):
    src = kernels.source("comm_standin")
    for arch in ("sm_80", "sm_86", "sm_90"):
        res = shimrt.compile(src, arch, options=["--maxrregcount=96"], name="comm_standin.cu").resources["comm_ring"]
        assert res.registers == NCCL_2_28_SM90.registers and res.spill_bytes <= spill_allowance["comm_ring"]
        assert res.static_smem == NCCL_2_28_SM90.static_smem
        assert res.max_threads_per_block == 640


class _Work:
    def __init__(self, label):
        self.label = label


def test_schedule_validation_and_labels():
    c, a = _Work("sgemm-4096"), _Work("all_reduce-64MiB")
    assert Schedule.pair(c, a).label == "sgemm-4096 + all_reduce-64MiB"
    b = Schedule.backward([c, c], [a, a])
    assert [(o.kind, o.after) for o in b.ops] == [("compute", None), ("comm", 0), ("compute", None), ("comm", 2)]
    assert b.label.endswith("x2 layers")
    with pytest.raises(shimrt.UsageError):
        Schedule([Op("comm", a, after=0), Op("compute", c)])  # waits for a later op
    with pytest.raises(shimrt.UsageError):
        Schedule([Op("compute", c)])  # nothing to overlap
    with pytest.raises(shimrt.UsageError):
        Op("io", c)


def test_bench_overlap_arguments():
    """--bytes and --compute as bench overlap's own parser reads them."""
    import argparse

    from shimrt.bench import overlap
    parser = argparse.ArgumentParser(exit_on_error=False)
    overlap.add_arguments(parser)
    args = parser.parse_args(["--bytes", "16MiB,256MiB,1G", "--compute", "sgemm:4096,softmax:8192:1024"])
    assert args.bytes == [16 << 20, 256 << 20, 1 << 30]
    with pytest.raises(argparse.ArgumentError, match="--bytes must be whole MiB .*not '4096'"):  # bytes, not MiB
        parser.parse_args(["--bytes", "16MiB,4096"])
    assert [(s.kind, s.size, s.block) for s in args.compute] == [("sgemm", 4096, 256), ("softmax", 8192, 1024)]
    for bad in ("sgemm", "sgemm:x", "softmax:1:2:3", "sgemm:100"):  # sgemm:100: not a multiple of 128
        with pytest.raises(argparse.ArgumentError, match="--compute"):
            parser.parse_args(["--compute", bad])
    from shimrt.bench.__main__ import main
    assert main(["overlap", "--policies", "sequential,fastest"]) == 2  # refused before any GPU work


def test_result_timeline_samples_large_grids_and_counts_all_blocks():
    from shimrt.overlap.engine import Result, Timing
    rng = np.random.default_rng(0)
    start = rng.uniform(0, 1, 10000)
    rows = {"compute": np.c_[start, start + 0.01, rng.integers(0, 132, 10000)], "comm": np.array([[0.0, 2.0, 5]])}
    timings = [Timing(rows, m, metrics.span(rows["compute"]), metrics.span(rows["comm"])) for m in (3.0, 1.0, 2.0)]
    result = Result("priority", planner.Choice("priority", comm_priority="high"), timings)
    assert result.makespan == 2.0 and result.blocks() == {"compute": 10000, "comm": 1}
    kept = np.array(result.timeline(max_blocks=500)["compute"])
    assert 500 <= len(kept) <= 502
    # The sample keeps the first start and the last end, so the span drawn is the real one.
    assert kept[:, 0].min() == pytest.approx(start.min(), abs=1e-4)
    assert kept[:, 1].max() == pytest.approx(start.max() + 0.01, abs=1e-4)
    assert result.timeline()["comm"] == [[0.0, 2.0, 5.0]]


class _Kernel:
    def __init__(self, name):
        self.name = name


class _Timed:
    """What the CUPTI path reads of a workload: its label and its kernel's name."""

    def __init__(self, label, kernel=None):
        self.label, self.kernel, self.channels = label, _Kernel(kernel) if kernel else None, None

    def observe(self, record):  # as NcclCollective.observe, without the footprint
        self.channels = record["grid_x"] * record["grid_y"] * record["grid_z"]


def test_cupti_records_become_spans_per_op_of_a_backward_schedule():
    from shimrt.overlap.engine import Engine
    sched = Schedule.backward([_Timed("sgemm", "sgemm"), _Timed("sgemm", "sgemm")],
                              [_Timed("all_reduce"), _Timed("all_reduce")])
    ops = list(enumerate(sched.ops))

    def rec(name, start, end, grid=24):
        return {"name": name, "start": start, "end": end, "grid_x": grid, "grid_y": 1, "grid_z": 1}

    # ns; the records come in no particular order. Layer 0's collective waits for layer 0's
    # compute (ends 2 ms) and runs beside layer 1's.
    records = [rec("_Z22ncclDevKernel_AllReduce", 6_000_000, 9_000_000), rec("sgemm", 1_000_000, 3_000_000),
               rec("_Z22ncclDevKernel_AllReduce", 3_000_000, 5_500_000), rec("sgemm", 3_000_000, 5_000_000)]
    t = Engine.timing_from_records(ops, records)
    spans = {i: (s.start, s.end) for i, s in t.ops.items()}
    assert spans == {0: (0.0, 2.0), 1: (2.0, 4.5), 2: (2.0, 4.0), 3: (5.0, 8.0)}
    assert t.makespan == 8.0 and (t.compute.start, t.compute.end, t.comm.end) == (0.0, 4.0, 8.0)
    assert sched.ops[1].work.channels == 24  # NCCL's CTAs, read from its grid
    # Two ranks of this process: two kernels per collective, by start, to each op in turn.
    two = records + [rec("_Z22ncclDevKernel_AllReduce", 6_100_000, 9_200_000),
                     rec("_Z22ncclDevKernel_AllReduce", 3_100_000, 5_400_000)]
    t = Engine.timing_from_records(ops, two)
    spans = {i: (s.start, s.end) for i, s in t.ops.items()}
    assert spans == {0: (0.0, 2.0), 1: (2.0, 4.5), 2: (2.0, 4.0), 3: (5.0, 8.2)} and len(t.rows["comm"]) == 4
    # Kernels that are no whole number per collective: the side's kernels all go to its first op.
    records.append(rec("_Z22ncclDevKernel_AllReduce", 9_000_000, 9_500_000))
    t = Engine.timing_from_records(ops, records)
    assert set(t.ops) == {0, 1, 2} and t.ops[1].end == 8.5 and len(t.rows["comm"]) == 3


def test_an_nccl_kernel_record_gives_its_channels_and_footprint():
    record = {"name": "_Z32ncclDevKernel_AllReduce_f32_RING24ncclDevKernelArgsStorageILm4096EE", "grid_x": 64,
              "grid_y": 1, "grid_z": 1, "block_x": 544, "block_y": 1, "block_z": 1, "registers": 96,
              "static_smem": 36800, "dynamic_smem": 82240}
    channels, fp = occupancy.Footprint.of_record(record)
    assert channels == 64
    assert (fp.blocks, fp.threads, fp.registers, fp.static_smem, fp.dynamic_smem) == (1, 544, 96, 36800, 82240)
    assert fp.name == "ncclDevKernel_AllReduce_f32_RING (CUPTI)"


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_autos_choice_cache_refuses_a_file_where_its_folder_should_be(tmp_path, where):
    """One message for both caches: a file where the folder should be is named, never a bare OSError."""
    from shimrt.overlap.auto import ChoiceCache
    from shimrt.overlap.planner import Choice
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    if where == "file":
        refusal = "the cache of auto's choices must be a folder .*blocker', which is not a folder: .*--fresh"
        with pytest.raises(UsageError, match=refusal):
            ChoiceCache(blocker, "dev")
        return
    cache = ChoiceCache(blocker / "below", "dev")
    assert cache.get("k") is None
    with pytest.raises(UsageError, match="the cache of auto's choices cannot be written in .*below'"):
        cache.put("k", Choice("sequential"))
