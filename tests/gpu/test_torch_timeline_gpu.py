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
