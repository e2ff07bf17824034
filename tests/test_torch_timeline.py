"""bench torch --profile's reading of a torch.profiler Chrome trace (shimrt.bench.torch_timeline):
figures worked out by hand from kernels laid out in kineto's format."""

import gzip
import json

import pytest

from shimrt.bench.torch_timeline import describe, kind_of, summarise
from shimrt.errors import UsageError


def kernel(name, ts, dur, grid=(1, 1, 1)):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": list(grid)}}


def annotation(name, ts, dur):
    return {"ph": "X", "cat": "gpu_user_annotation", "name": name, "ts": ts, "dur": dur}


# Two steps of 1000 us each; times in us.
TRACE = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host side: not a kernel
    annotation("FSDP::all_gather_copy_in (blocks.0)", 0, 100),
    kernel("void at::native::elementwise_kernel", 0, 100),  # copy-in: inside the range
    kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 100, 300, (16, 1, 1)),
    kernel("sm90_xmma_gemm_bf16", 200, 400),  # 200..600: hides 200..400 of the all-gather
    annotation("FSDP::all_gather_copy_out (blocks.0)", 600, 50),
    kernel("void at::native::split_with_sizes_copy_out", 600, 50),  # copy-out
    kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 700, 300, (8, 1, 1)),  # 700..1000, all exposed
    kernel("ampere_bf16_gemm", 1000, 500),
    kernel("ncclDevKernel_AllGather_RING_LL", 1400, 200, (32, 1, 1)),  # 1500..1600 exposed
    kernel("chunk_cat_cuda_kernel", 1600, 100),  # copy-in by its own name
    kernel("ncclDevKernel_Generic", 1700, 300),  # no kind in its name: NCCL's all the same
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 1900, "dur": 50},  # not a kernel
]}


def test_a_trace_is_read_into_per_step_figures():
    s = summarise(TRACE, 2)
    assert s["span_ms"] == pytest.approx(2000 / 2e3)
    assert s["collectives"] == {"AllGather": {"ms": 0.25, "kernels": 1.0, "blocks": 32},
                                "NCCL": {"ms": 0.15, "kernels": 0.5, "blocks": 1},
                                "ReduceScatter": {"ms": 0.15, "kernels": 0.5, "blocks": 8}}
    assert s["copy-in_ms"] == pytest.approx((100 + 100) / 2e3)
    assert s["copy-out_ms"] == pytest.approx(50 / 2e3)
    assert s["compute_ms"] == pytest.approx((400 + 500) / 2e3)  # the gemms' union
    # the collectives' union: 100..400, 700..1000, 1400..1600, 1700..2000 = 1100 us
    assert s["comm_ms"] == pytest.approx(1100 / 2e3)
    # exposed, while no other kernel runs: 100..200 (the gemm starts at 200), 700..1000, 1500..1600,
    # 1700..2000 (the memcpy is no kernel): 100 + 300 + 100 + 300
    assert s["exposed_ms"] == pytest.approx(800 / 2e3)
    line = describe("plain DDP", s)
    assert "AllGather 1 kernels 0.25 ms on up to 32 blocks" in line and "exposed 0.40 ms (73%)" in line, line


def test_a_gzipped_trace_file_reads_as_the_dict(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(TRACE, f)
    assert summarise(path, 2) == summarise(TRACE, 2)


def test_collective_kinds_by_kernel_name():
    assert kind_of("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "AllReduce"
    assert kind_of("ncclSymkDevKernel_AllGather_LL") == "AllGather"
    assert kind_of("void at::native::reduce_kernel<512, 1>") is None  # "reduce" outside NCCL's names


def test_no_kernels_or_bad_steps_are_refused():
    with pytest.raises(UsageError, match="no GPU kernels"):
        summarise({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]}, 1)
    with pytest.raises(UsageError, match="steps must be a positive int, not 0"):
        summarise(TRACE, 0)


def test_a_failed_timeline_says_why():
    assert describe("auto", {"failed": "RuntimeError: x"}) == "auto: no timeline (RuntimeError: x)"


def test_a_copy_engine_all_gather_counts_as_communication_and_ranges_hold_only_their_own_streams_kernels():
    s = summarise({"traceEvents": [
        # torch.distributed's range on NCCL's stream (tid 20) holds a peer copy: the copy engines' all-gather
        dict(annotation("nccl:all_gather_into_tensor", 0, 500), pid=0, tid=20),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "ts": 100, "dur": 300,
         "pid": 0, "tid": 20},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 600, "dur": 100, "pid": 0, "tid": 7},
        # FSDP2's copy-in range on its all-gather stream (tid 20) does not hold the gemm on stream 7
        dict(annotation("FSDP::all_gather_copy_in (blocks.0)", 0, 100), pid=0, tid=20),
        dict(kernel("sm90_xmma_gemm_bf16", 0, 200), pid=0, tid=7),
        dict(kernel("void at::native::elementwise_kernel", 0, 50), pid=0, tid=20),
    ]}, 1)
    assert s["collectives"] == {"AllGather (copy engine)": {"ms": 0.3, "kernels": 1.0, "blocks": 0}}
    assert s["compute_ms"] == pytest.approx(0.2) and s["copy-in_ms"] == pytest.approx(0.05)
    assert s["comm_ms"] == pytest.approx(0.3) and s["exposed_ms"] == pytest.approx(0.2)  # 200..400: nothing beside
    assert "AllGather (copy engine) 1 copies 0.30 ms; copy-in" in describe("zero-sm", s)
