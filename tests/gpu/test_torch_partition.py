"""torch's own kernels on a green-context partition stay on its SMs: a kernel torch compiles and
launches itself (its jiterator, with %smid read inline) reports the SMs it ran on, on the
partition's stream and, for contrast, on torch's default stream."""

from __future__ import annotations

import numpy as np
import pytest

from shimrt import kernels

# A torch elementwise kernel (torch compiles it with NVRTC and launches it itself) whose every
# element is the id of the SM that computed it.
SMID = ('template <typename T> T smid_of(T x) { unsigned int s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); '
        'return T(s); }')


def test_torchs_kernels_on_a_partition_stream_run_only_on_its_sms(device, partition16):
    torch = pytest.importorskip("torch")
    if device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA on a CUDA device")
    jiterator = getattr(torch.cuda, "jiterator", None)
    if jiterator is None or not hasattr(jiterator, "_create_jit_fn"):
        pytest.skip(f"torch {torch.__version__} has no jiterator")
    import shimrt.torch as st
    kept, rest, s = partition16
    smid_of = jiterator._create_jit_fn(SMID)
    x = torch.zeros(1 << 24, device=torch.device("cuda", device.index))
    everywhere = set(smid_of(x).unique().int().tolist())
    torch.cuda.synchronize()
    with torch.cuda.stream(st.stream(s)):
        y = smid_of(x)
    s.synchronize(30)
    confined = set(y.unique().int().tolist())
    # shimrt's probe in the other partition: the SMs torch was kept off.
    probe = kept.load(device.compile(kernels.source("probe"), name="probe.cu"))["sm_probe"]
    blocks = 4 * device.target.num_sms
    sm, start, stop = device.empty(blocks, np.uint32), device.empty(blocks, np.uint64), device.empty(blocks, np.uint64)
    with kept.stream() as ks:
        kept.activate()
        probe.launch(blocks, 256, sm, start, stop, device.timestamp_hz // 100000, stream=ks)
        ks.synchronize(30)
        device.activate()
    others = set(sm.numpy().tolist())
    print(f"torch's kernel ran on {len(everywhere)} SMs on its own stream, {len(confined)} on a partition of "
          f"{rest.target.num_sms}; the other partition's probe on {len(others)}")
    assert len(everywhere) > rest.target.num_sms  # unconfined, it spreads over more SMs than the partition has
    assert len(confined) <= rest.target.num_sms and not confined & others
