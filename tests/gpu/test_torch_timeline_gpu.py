"""bench torch --profile's recording (shimrt.bench.torch_timeline.record) on a real GPU: a trace
of torch's own kernels, read back into figures that add up."""

from __future__ import annotations

import pytest


def test_a_recorded_trace_holds_the_steps_kernels(device, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    from shimrt.bench.torch_timeline import record, summarise
    torch.cuda.set_device(device.index)
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = []

    def step(i):
        out.append((a @ a).float().sum())
    path = record(torch, step, 3, tmp_path / "t.json.gz")
    s = summarise(path, 3)
    assert path.exists() and len(out) == 3
    # no collectives ran: nothing to expose; the matmuls and reductions are compute
    assert s["collectives"] == {} and s["comm_ms"] == 0 and s["exposed_ms"] == 0
    assert 0 < s["compute_ms"] <= s["span_ms"]
    assert s["copy-in_ms"] == 0 and s["copy-out_ms"] == 0
    expected = (a.float() @ a.float()).sum()
    assert torch.allclose(out[-1], expected, rtol=2e-2), (out[-1], expected)


def test_the_allocators_record_over_steps_counts_what_they_reserved_and_no_retry(device):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    from shimrt.bench.torch_measure import allocator_mark, allocator_since
    torch.cuda.set_device(device.index)
    torch.cuda.empty_cache()  # the 256 MiB below come from the device, not from blocks cached by earlier tests
    free_before, total = torch.cuda.mem_get_info(device.index)
    reserved_before = torch.cuda.memory_reserved(device.index)
    mark = allocator_mark(torch, device.index)
    held = torch.ones(64 << 20, device="cuda", dtype=torch.float32)  # 256 MiB, kept while the record is read
    seen = allocator_since(torch, device.index, mark)
    assert seen["retries"] == 0  # 256 MiB fits: nothing was freed and tried again
    assert seen["reserved"] >= held.numel() * 4
    # the least free of the two ends: what the allocator took from the device since is no longer free
    # (a segment still cached from before may have served part of the 256 MiB: only its growth counts)
    grown = seen["reserved"] - reserved_before
    assert grown >= 0 and seen["device_free"] <= free_before - grown + (2 << 20) and seen["device_free"] < total
    assert float(held.sum()) == 64 << 20
