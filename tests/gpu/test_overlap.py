"""The overlap engine on a real GPU: the stand-in's ring, every policy leaving results unchanged,
shaping+priority starting communication before concurrent does, and SM partitions."""

from __future__ import annotations

import numpy as np
import pytest

from shimrt.overlap import planner
from shimrt.overlap.engine import Engine, Schedule
from shimrt.overlap.standin import CommStandIn, StandInSpec
from shimrt.overlap.workloads import ComputeSpec, ComputeWorkload


@pytest.fixture(scope="module")
def standin(device):
    return CommStandIn(device, StandInSpec(nbytes=8 << 20, blocks=16, threads=512))


def run_alone(device, standin) -> np.ndarray:
    """One launch from a zeroed output, checked exact; its per-block stamps rows."""
    stamps = device.empty(3 * standin.spec.blocks, np.uint64).memset(0)
    with device.stream("high") as s:
        standin.reset()
        standin.launch(s, stamps=stamps)
        s.synchronize(timeout=30)
    standin.raise_if_stalled()
    standin.check()
    return stamps.numpy().reshape(-1, 3).astype(np.int64)


def test_standin_ring_is_exact_and_all_blocks_are_resident_together(device, standin):
    rows = run_alone(device, standin)
    assert (rows[:, 0] > 0).all() and (rows[:, 1] >= rows[:, 0]).all()
    assert (rows[:, 2] < device.target.num_sms).all()
    # A ring cannot finish unless every block ran at some common moment.
    assert rows[:, 0].max() < rows[:, 1].min()
    fp = standin.footprint()
    assert (fp.registers, fp.static_smem, fp.dynamic_smem, fp.threads) == (96, 21568, 82240, 512)


def test_paced_standin_keeps_the_links_rate_and_stays_exact(device):
    paced = CommStandIn(device, StandInSpec(nbytes=32 << 20, blocks=16, threads=512, link_gbps=25.0))
    rows = run_alone(device, paced)
    took_ns = rows[:, 1].max() - rows[:, 0].min()
    floor = paced.spec.steps * paced.spec.step_ns()  # every step lasts at least its slice / rate
    print(f"\npaced stand-in: {took_ns / 1e6:.3f} ms for {paced.spec.steps} steps of >= {paced.spec.step_ns()} ns")
    assert floor <= took_ns < 1.5 * floor + 200_000


def test_standin_refuses_a_grid_that_cannot_be_resident(device, standin):
    import shimrt
    per_sm = standin.kernel.max_active_blocks(640, standin.dynamic_smem)
    with pytest.raises(shimrt.UsageError, match="cannot all be resident"):
        standin.launch(None, blocks=per_sm * device.target.num_sms + 1, threads=640)


def _choices(engine):
    problem = engine.problem()
    out = []
    for policy in planner.FIXED:
        try:
            out.append(planner.plan(policy, problem))
        except Exception:
            pass
    feasible, _ = planner.candidates(problem, threads=(None, 256))
    return out + [c for c in feasible if c not in out]


@pytest.mark.parametrize("spec", [ComputeSpec("sgemm", 512), ComputeSpec("bias_gelu", 1000),
                                  ComputeSpec("softmax", 777), ComputeSpec("layernorm", 640)],
                         ids=lambda s: s.label)
def test_every_policy_leaves_every_output_unchanged(device, standin, spec):
    compute = ComputeWorkload(device, spec, seed=3)
    engine = Engine(device, Schedule.pair(compute, standin), repeats=1)
    try:
        choices = _choices(engine)
        assert {c.policy for c in choices} >= {"sequential", "concurrent", "priority", "partition"}
        assert any(c.shaped for c in choices)
        reference = None
        for choice in choices:
            compute.reset()
            standin.reset()
            engine.run_once(choice)
            out = compute.result()
            compute.check(out)  # against numpy, element by element
            if reference is None:
                reference = out
            assert np.array_equal(out, reference), choice  # bit for bit under every policy
            standin.check(choice.comm_blocks)
    finally:
        engine.close()


def test_shaping_and_priority_start_communication_before_concurrent(device, standin):
    # A single-wave compute kernel: exactly as many blocks as fit on the device, each looping
    # over its share (grid-stride), so no block retires early to make room.
    probe = ComputeWorkload(device, ComputeSpec("bias_gelu", 4096))
    natural = probe.kernel.max_active_blocks(256, 0)
    compute = ComputeWorkload(device, ComputeSpec("bias_gelu", 16384, grid=natural * device.target.num_sms))
    engine = Engine(device, Schedule.pair(compute, standin), repeats=5)
    try:
        problem = engine.problem()
        concurrent = engine.measure(planner.plan("concurrent", problem))
        seed = engine.measure(planner.plan("shaping+priority", problem))
    finally:
        engine.close()
    c, s = concurrent.metrics, seed.metrics
    print(f"\ncomm start: concurrent {c.comm_start_delay_ms:.3f} ms, shaping+priority {s.comm_start_delay_ms:.3f} ms "
          f"(compute alone {c.t_comp_ms:.3f} ms)")
    # Concurrent must wait for compute blocks to drain; the seed method starts as soon as it is
    # launched (the host's launch of the collective comes tens of microseconds after compute's).
    assert c.comm_start_delay_ms > 0.5 * c.t_comp_ms
    assert s.comm_start_delay_ms < 0.25 * c.comm_start_delay_ms


def test_backward_schedule_waits_for_each_layer_and_keeps_every_output(device):
    # Three layers: layer i's collective waits for layer i's compute (an event) and runs beside
    # layer i+1's. Distinct inputs and sizes per layer, so a mixed-up output cannot pass.
    layers = 3
    computes = [ComputeWorkload(device, ComputeSpec("bias_gelu", 4096), seed=10 + i) for i in range(layers)]
    comms = [CommStandIn(device, StandInSpec(nbytes=(4 + 2 * i) << 20, blocks=16, threads=512), seed=20 + i)
             for i in range(layers)]
    engine = Engine(device, Schedule.backward(computes, comms), repeats=1)
    try:
        problem = engine.problem()
        for policy in ("sequential", "concurrent", "priority", "shaping+priority", "partition"):
            choice = planner.plan(policy, problem)
            for w in computes + comms:
                w.reset()
            t = engine.run_once(choice)
            for c in computes:
                c.check(c.result())  # against numpy, element by element
            for a in comms:
                a.check()
            spans = [(t.ops[2 * i], t.ops[2 * i + 1]) for i in range(layers)]
            for i, (comp, comm) in enumerate(spans):
                assert comm.start >= comp.end, (policy, i)  # the event held the collective back
            if policy == "sequential":  # one stream: each layer's compute after the collective before it
                assert all(spans[i + 1][0].start >= spans[i][1].end for i in range(layers - 1))
            if policy in ("priority", "partition"):  # the collective ran beside the next layer's compute
                assert all(spans[i][1].start < spans[i + 1][0].end for i in range(layers - 1)), policy
    finally:
        engine.close()


def test_partition_keeps_each_side_on_its_own_sms(device, standin):
    compute = ComputeWorkload(device, ComputeSpec("sgemm", 1024))
    engine = Engine(device, Schedule.pair(compute, standin), repeats=1)
    try:
        choice = planner.plan("partition", engine.problem())
        timing = engine.run_once(choice)
    finally:
        engine.close()
    comm_sms = set(timing.rows["comm"][:, 2].astype(int))
    compute_sms = set(timing.rows["compute"][:, 2].astype(int))
    assert comm_sms and compute_sms and not comm_sms & compute_sms
    assert len(comm_sms) <= choice.partition_sms
    assert len(compute_sms) <= device.target.num_sms - choice.partition_sms


def test_device_partition_sizes(device):
    split, rest = device.partition(16)
    try:
        assert split.target.num_sms >= 16
        assert split.target.num_sms + rest.target.num_sms <= device.target.num_sms
        with split.stream("high") as s:
            assert s.priority == device.priority_range[1]
            if device.backend == "cuda":  # the thread is left on the device's own (primary) context
                from cuda.bindings import driver as cu
                _, primary = cu.cuDevicePrimaryCtxRetain(cu.CUdevice(device.index))
                _, current = cu.cuCtxGetCurrent()
                cu.cuDevicePrimaryCtxRelease(cu.CUdevice(device.index))
                assert int(current) == int(primary)
    finally:
        split.close()
        rest.close()


def test_real_nccl_kernel_beside_compute_on_one_gpu(device):
    """NCCL's own SendRecv kernel (a grouped send/recv to the one rank), timed by CUPTI beside
    the SGEMM: outputs unchanged, and priority starts it well before sequential does. (NCCL's
    host side takes about a millisecond to enqueue its kernel, so the SGEMM must be longer.)"""
    from shimrt import CollectiveError
    from shimrt.nccl import CommOptions, Communicator, unique_id
    from shimrt.overlap.collective import NcclCollective
    try:
        comm = Communicator(device, unique_id(), 0, 1, options=CommOptions(timeout=30))  # a stall fails in 30 s
    except CollectiveError as exc:
        pytest.skip(f"NCCL is not available: {exc}")
    from shimrt.cuda import trace
    if trace.library_path() is None:
        comm.close()
        pytest.skip("CUPTI is not available (pip install nvidia-cuda-cupti)")
    try:
        nccl = NcclCollective(comm, "send_recv", 64 << 20)
        compute = ComputeWorkload(device, ComputeSpec("sgemm", 4096))
        engine = Engine(device, Schedule.pair(compute, nccl), repeats=3)
        try:
            results = {}
            for policy in ("sequential", "concurrent", "priority"):
                compute.reset()
                nccl.reset()
                results[policy] = engine.measure(planner.plan(policy, engine.problem()))
                compute.check()
                nccl.check()
        finally:
            engine.close()
    finally:
        comm.close()
    seq, conc, prio = (results[p].metrics for p in ("sequential", "concurrent", "priority"))
    print(f"\nNCCL SendRecv ({nccl.channels} channels) beside sgemm-4096: start delay sequential "
          f"{seq.comm_start_delay_ms:.3f} ms, concurrent {conc.comm_start_delay_ms:.3f}, priority "
          f"{prio.comm_start_delay_ms:.3f}; makespans {seq.makespan_ms:.3f} / {conc.makespan_ms:.3f} / "
          f"{prio.makespan_ms:.3f} ms")
    assert seq.comm_start_delay_ms >= 0.9 * seq.t_comp_ms  # sequential really is one after the other
    assert prio.comm_start_delay_ms < 0.8 * seq.comm_start_delay_ms
