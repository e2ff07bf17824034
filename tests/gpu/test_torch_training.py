"""A real torch training step with its gradients all-reduced bucket by bucket over two NCCL
ranks of this process: the peers' sums come back, rank 0's gradients stay bit for bit, and the
step gives the same loss under a partition."""

from __future__ import annotations

import pytest

from shimrt import ShimrtError, UsageError


@pytest.fixture
def setup(device):
    torch = pytest.importorskip("torch")
    if device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA on a CUDA device")
    from shimrt.bench.torch_model import ModelSize, batch, build
    from shimrt.bench.torch_trainer import Trainer
    from shimrt.launch import local_devices
    from shimrt.nccl import CommOptions, Communicator
    from shimrt.torch.step import GradientBuckets
    try:
        devices = local_devices(device, 2)
        comms = Communicator.local(devices, options=CommOptions(blocking=True))
    except ShimrtError as exc:
        pytest.skip(f"needs two NCCL ranks in this process: {exc}")
    torch.cuda.set_device(device.index)
    size = ModelSize(width=256, heads=2, layers=2, vocab=1000, seq=128, batch=2)
    where = torch.device("cuda", device.index)
    model = build(size, where, seed=1)
    buckets = GradientBuckets(model, 1 << 20)
    trainer = Trainer(model, batch(size, where, seed=1), buckets)
    yield torch, comms, buckets, trainer
    for c in comms:
        c.close()


def test_an_overlapped_step_all_reduces_every_bucket_and_keeps_rank0s_gradients(setup):
    from shimrt.torch.step import NcclBuckets
    torch, comms, buckets, trainer = setup
    flats = {f.untyped_storage().data_ptr() for f in buckets.flats}
    assert len(buckets.flats) > 1 and all(p.grad.untyped_storage().data_ptr() in flats for p in buckets.params)
    trainer.reset()
    alone = trainer.step(None)
    want = buckets.copy()
    # The gradients landed in the buckets (autograd accumulated into the views in place).
    assert all(bool(f.abs().sum() > 0) for f in want)
    assert all(p.grad.untyped_storage().data_ptr() in flats for p in buckets.params)
    comm = NcclBuckets(comms, buckets, "low")
    try:
        for overlap in (True, False):
            trainer.reset()
            loss = trainer.step(comm, overlap)
            torch.cuda.synchronize()
            assert torch.equal(loss, alone)
            assert all(torch.equal(g, w) for g, w in zip(buckets.flats, want, strict=True))
            # The peer received 0 + rank 0's gradient of the last bucket launched (the first layers'),
            # on its own GPU (one rank per GPU where there are two).
            last = buckets.flats[-1]
            assert comm.peers[0][1].device == torch.device("cuda", comms[1].device.index)
            assert torch.equal(comm.peers[0][1][: last.numel()].to(last.device), last)
    finally:
        comm.close()


def test_a_step_after_zero_grad_set_to_none_is_refused_before_any_all_reduce(setup):
    """torch's default zero_grad() sets .grad to None: backward then writes new tensors, and the
    buckets' all-reduces would carry the previous step's gradients. Every step's launches check
    their bucket first (issue 24): the step fails saying what to do, and attach() mends it."""
    from shimrt.torch.step import NcclBuckets
    torch, comms, buckets, trainer = setup
    comm = NcclBuckets(comms, buckets, "high")
    try:
        for overlap in (True, False):  # launched from backward's hooks, and after backward
            trainer.reset()
            trainer.optimizer.zero_grad()
            with pytest.raises(UsageError, match=r"gradient bucket .*zero_grad\(set_to_none=False\)"):
                trainer.step(comm, overlap)
            buckets.attach()
        trainer.reset()
        assert bool(torch.isfinite(trainer.step(comm)))
        ready = torch.cuda.Event()
        ready.record()
        trainer.optimizer.zero_grad()  # a loop of the user's own, launching bucket by bucket
        with pytest.raises(UsageError, match="must be its view of gradient bucket 0, not None"):
            comm.launch(0, ready)
        buckets.attach()
        torch.cuda.synchronize()
    finally:
        comm.close()


def test_nccl_buckets_refuse_what_is_not_communicators_and_gradient_buckets(setup):
    from shimrt.torch.step import NcclBuckets
    torch, comms, buckets, _ = setup
    for bad in ([], None, [object()], [buckets.flats[0]]):
        with pytest.raises(UsageError, match="comms must be a non-empty list of Communicators"):
            NcclBuckets(bad, buckets)
    with pytest.raises(UsageError, match="buckets must be a GradientBuckets"):
        NcclBuckets(comms, buckets.flats)


def test_a_step_on_a_partition_gives_the_same_loss(setup, partition16):
    from shimrt.torch.policies import Partition, Policy
    from shimrt.torch.resources import compute_context
    from shimrt.torch.step import NcclBuckets
    torch, comms, buckets, trainer = setup
    trainer.reset()
    want = trainer.step(None)
    s = partition16[2]
    comm = NcclBuckets(comms, buckets, "high")
    try:
        with compute_context(Policy("p", compute=Partition(16), ctas=8), partition_stream=s):
            trainer.reset()
            loss = trainer.step(comm)
        s.synchronize(30)
        torch.cuda.synchronize()
        assert torch.allclose(loss.float(), want.float(), rtol=1e-2), (loss, want)
    finally:
        comm.close()


def test_a_torch_process_group_on_high_priority_streams_all_reduces(device):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    import shimrt.torch as st
    if device.backend != "cuda" or not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("needs torch with CUDA and NCCL")
    options = st.process_group_options()
    assert options.is_high_priority_stream is True
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, pg_options=options,
                            device_id=torch.device("cuda", device.index))
    try:
        x = torch.arange(1 << 16, dtype=torch.float32, device=torch.device("cuda", device.index))
        dist.all_reduce(x)
        torch.cuda.synchronize()
        assert torch.equal(x, torch.arange(1 << 16, dtype=torch.float32, device=x.device))
    finally:
        dist.destroy_process_group()


def test_a_windowed_carveout_holds_only_while_all_reduces_run(setup):
    """NcclBuckets(beside=): cuBLAS's carveout is set from the step's first bucket until backward's
    join, and the gradients stay rank 0's own, bit for bit."""
    from shimrt.torch import sm_carveout
    from shimrt.torch.step import NcclBuckets
    torch, comms, buckets, trainer = setup
    getter = getattr(torch._C, "_get_sm_carveout_experimental", None)
    if getter is None:
        pytest.skip(f"torch {torch.__version__} has no SM carveout")
    trainer.reset()
    trainer.step(None)
    want = buckets.copy()
    seen = []

    def beside():
        seen.append("enter")
        return sm_carveout(32)
    comm = NcclBuckets(comms, buckets, "high", beside=beside)
    try:
        ready = torch.cuda.Event()
        ready.record()
        comm.launch(0, ready)
        assert getter() == 32  # held while the all-reduce runs
        comm.launch(1, ready)
        comm.join(torch.cuda.current_stream())
        assert getter() is None and seen == ["enter"]  # entered once, left at the join
        trainer.reset()
        trainer.step(comm)
        torch.cuda.synchronize()
        assert getter() is None and seen == ["enter", "enter"]
        assert all(torch.equal(g, w) for g, w in zip(buckets.flats, want, strict=True))
    finally:
        comm.close()


def test_a_step_that_fails_in_backward_leaves_no_carveout_behind(setup):
    """An error after the first bucket's all-reduce (here a hook of the last gradient raising)
    ends the windowed carveout with the step, not with the next join."""
    from shimrt.torch import sm_carveout
    from shimrt.torch.step import NcclBuckets
    torch, comms, buckets, trainer = setup
    getter = getattr(torch._C, "_get_sm_carveout_experimental", None)
    if getter is None:
        pytest.skip(f"torch {torch.__version__} has no SM carveout")
    comm = NcclBuckets(comms, buckets, "high", beside=lambda: sm_carveout(32))

    def fail(param):
        assert getter() == 32  # the earlier buckets' all-reduces hold it
        raise RuntimeError("a hook failed")
    handle = buckets.params[-1].register_post_accumulate_grad_hook(fail)  # the last gradient backward makes
    try:
        trainer.reset()
        with pytest.raises(RuntimeError, match="a hook failed"):
            trainer.step(comm)
        assert getter() is None
    finally:
        handle.remove()
        comm.close()
