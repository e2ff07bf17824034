"""Rewriting launches of kernels shimrt did not compile (torch's), through CUPTI's launch
callbacks: the rewrite takes effect (CUPTI's activity records show it), outputs are unchanged,
and nothing is left once the interposer's block ends."""

from __future__ import annotations

import pytest

from shimrt.cuda import trace


@pytest.fixture
def torch_gelu(device):
    torch = pytest.importorskip("torch")
    if device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA on a CUDA device")
    if trace.library_path() is None:
        pytest.skip("CUPTI is not available (pip install nvidia-cuda-cupti)")
    x = torch.randn(1 << 22, device=f"cuda:{device.index}")
    ref = torch.nn.functional.gelu(x)
    torch.cuda.synchronize()
    return torch, x, ref


def _gelu_records(kernels):
    return [r for r in kernels if "gelu" in r["name"].lower()]


def test_a_torch_kernel_launched_inside_takes_the_rewritten_dynamic_smem(device, torch_gelu):
    torch, x, ref = torch_gelu
    pad = 16384  # below the default 48 KiB limit: no attribute to raise first
    with device.record_kernels() as rec:
        with device.interpose_launches(lambda launch: launch["dynamic_smem"] + pad) as li:
            y = torch.nn.functional.gelu(x)
        torch.cuda.synchronize()
    assert li.failure_count == 0, li.failures
    assert torch.equal(y, ref)  # the padding is shared memory the kernel never touches
    gelu = _gelu_records(rec.kernels)
    assert gelu and all(r["dynamic_smem"] >= pad for r in gelu), gelu
    # Once the block has ended, launches are torch's own again.
    with device.record_kernels() as rec:
        z = torch.nn.functional.gelu(x)
        torch.cuda.synchronize()
    assert torch.equal(z, ref)
    assert all(r["dynamic_smem"] < pad for r in _gelu_records(rec.kernels))


def test_a_graph_captured_inside_replays_the_rewritten_launch(device, torch_gelu):
    """A CUDA graph captured inside the block holds the rewritten dynamic shared memory: each
    replay, inside the block or after it, launches padded."""
    torch, x, ref = torch_gelu
    pad = 16384
    y = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    def rewrite(launch):
        return launch["dynamic_smem"] + pad if "gelu" in launch["name"].lower() else None
    with device.interpose_launches(rewrite) as li:
        with torch.cuda.graph(graph):
            y.copy_(torch.nn.functional.gelu(x))
    assert li.failure_count == 0, li.failures
    with device.record_kernels() as rec:
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(y, ref)
    gelu = _gelu_records(rec.kernels)
    assert gelu and all(r["dynamic_smem"] >= pad for r in gelu), gelu


def test_a_failing_rewrite_leaves_the_launch_as_it_was(device, torch_gelu):
    torch, x, ref = torch_gelu

    def broken(launch):
        raise RuntimeError("no decision for this kernel")
    with device.record_kernels() as rec:
        with device.interpose_launches(broken) as li:
            y = torch.nn.functional.gelu(x)
        torch.cuda.synchronize()
    assert torch.equal(y, ref)
    assert li.failure_count >= 1 and li.failures[0] == "RuntimeError: no decision for this kernel"
    assert all(r["dynamic_smem"] < 16384 for r in _gelu_records(rec.kernels))


def test_the_interposer_caps_torch_kernels_from_the_second_step_on(device, torch_gelu):
    """Step 1 learns the kernels (launched unchanged; attributes read at the block's end); step
    2 launches them padded to 2 resident blocks per SM, outputs unchanged; a persistent GEMM
    (bf16 on Hopper: one CTA per SM) is reported, not padded."""
    from shimrt import occupancy
    from shimrt.overlap.interpose import Interposer
    torch, x, ref = torch_gelu
    a = torch.randn(8192, 8192, device=x.device, dtype=torch.bfloat16)
    mm_ref = a @ a
    torch.cuda.synchronize()
    ip = Interposer(device, cap=2)
    with ip:
        torch.nn.functional.gelu(x)
        a @ a
        torch.cuda.synchronize()
    first = ip.report()
    assert first["padded"] == {} and first["functions"] >= 2 and first["failure_count"] == 0, first
    with device.record_kernels() as rec:
        with ip:
            y = torch.nn.functional.gelu(x)
            mm = a @ a
            torch.cuda.synchronize()
    report = ip.report()
    print("\ninterposer report:", report)
    assert report["failure_count"] == 0, report["failures"]
    assert torch.equal(y, ref) and torch.equal(mm, mm_ref)
    gelu = _gelu_records(rec.kernels)
    assert gelu and any("gelu" in name.lower() for name in report["padded"]), report
    for r in gelu:  # the padding really caps it at 2 per SM
        threads = r["block_x"] * r["block_y"] * r["block_z"]
        assert occupancy.max_active_blocks(device.target, block_size=threads, registers=r["registers"],
                                           static_smem=r["static_smem"] + r["dynamic_smem"]) <= 2, r
    # 2 per SM of a 128-thread kernel needs more than the default 48 KiB: the limit was raised at
    # the first block's end, and close() puts it back.
    raised = [v for name, v in report["raised_limits"].items() if "gelu" in name.lower()]
    assert raised and raised[0]["to"] > 48 * 1024, report["raised_limits"]
    handle = raised[0]["handle"]
    assert device.foreign_function_attributes(handle)["max_dynamic_smem"] == raised[0]["to"]
    ip.close()
    assert device.foreign_function_attributes(handle)["max_dynamic_smem"] == raised[0]["from"]
    with device.record_kernels() as rec:
        assert torch.equal(torch.nn.functional.gelu(x), ref)
        torch.cuda.synchronize()
    assert all(r["dynamic_smem"] == 0 for r in _gelu_records(rec.kernels))


def test_torch_runs_on_a_partition_stream_and_leaves_cublas_sms_free(device, torch_gelu, partition16):
    """A green context's stream as torch's stream: torch's kernels run there and give the same
    result; the cuBLAS carveout is set inside its block and restored after."""
    import shimrt.torch as st
    torch, x, ref = torch_gelu
    s = partition16[2]
    with torch.cuda.stream(st.stream(s)):
        y = torch.nn.functional.gelu(x)
    s.synchronize(30)
    assert torch.equal(y, ref)
    before, blas = torch._C._get_sm_carveout_experimental(), torch.backends.cuda.preferred_blas_library()
    with st.sm_carveout(16):
        assert torch._C._get_sm_carveout_experimental() == 16
        assert torch.backends.cuda.preferred_blas_library() == torch._C._BlasBackend.Cublaslt
        a = torch.randn(4096, 4096, device=x.device, dtype=torch.bfloat16)
        with device.record_kernels() as rec:
            a @ a
            torch.cuda.synchronize()
    assert torch._C._get_sm_carveout_experimental() == before
    assert torch.backends.cuda.preferred_blas_library() == blas
    # cuBLASLt's GEMM was told 116 SMs: a persistent one launches at most that many blocks.
    gemms = [r for r in rec.kernels if r["name"].startswith(("nvjet", "sm90_xmma", "sm80_xmma", "cutlass"))]
    print("GEMM kernels under a 16-SM carveout:", [(r["name"][:40], r["grid_x"] * r["grid_y"] * r["grid_z"])
                                                   for r in gemms])
    assert gemms
