"""bench torch's arithmetic without a GPU: the policies, the model's size, the report's ratios,
and a clear refusal where torch is missing."""

from __future__ import annotations

import importlib.util

import pytest

from shimrt import UsageError
from shimrt.bench import torch_step
from shimrt.bench.torch_model import ModelSize
from shimrt.torch import policies
from shimrt.torch.policies import Carveout, Partition, Policy, Shaping


def test_the_parameter_count_matches_a_count_by_hand():
    size = ModelSize(width=64, heads=2, layers=1, vocab=100, seq=8, batch=1)
    embed, position, head = 100 * 64, 8 * 64, 64 * 100
    block = 3 * 64 * 64 + 64 * 64 + 2 * 64 * 256 + 2 * 2 * 64  # qkv, out, MLP, two LayerNorms
    assert size.parameters == embed + position + block + 2 * 64 + head
    assert size.tokens == 8


@pytest.mark.parametrize("fields, message", [
    (dict(width=100, heads=3), "ModelSize.width must be a multiple of heads"),
    (dict(width=72, heads=6), "head size that is a multiple of 8"),
    (dict(batch=0), "ModelSize.batch must be an int in 1..2147483647"),
    (dict(width=2**40, heads=16), "ModelSize.width must be an int in 1..2147483647"),
    (dict(weights="float16"), "ModelSize.weights must be one of bfloat16, float32"),
])
def test_bad_model_sizes_are_refused(fields, message):
    with pytest.raises(UsageError, match=message):
        ModelSize(**fields)


@pytest.mark.parametrize("make, message", [
    (lambda: Policy("p", priority="urgent"), "Policy.priority must be one of"),
    (lambda: Shaping(0), "Shaping.cap must be an int"),
    (lambda: Policy("p", compute=(Shaping(2), Carveout(16))), "Policy.compute must be a Shaping, Partition, "
                                                              "Carveout or None"),
    (lambda: Policy("p", compute=16), "Policy.compute must be"),
    (lambda: Policy("p", ctas=65), "Policy.ctas must be an int"),
    (lambda: Policy("p", baseline="yes"), "Policy.baseline must be one of"),
    (lambda: Policy("p", compute=Carveout(16, window=True), baseline="sequential"),
     "a windowed carveout needs the all-reduces beside backward"),
    (lambda: Carveout(16, window=1), "Carveout.window must be"),
])
def test_bad_policies_are_refused(make, message):
    with pytest.raises(UsageError, match=message):
        make()


def test_a_policys_compute_side_is_one_of_three_or_none():
    assert Policy("p", compute=Shaping(2)).cap == 2 and Policy("p", compute=Shaping(2)).carveout is None
    windowed = Policy("p", compute=Carveout(16, window=True))
    assert windowed.carveout == 16 and windowed.window and windowed.partition is None
    assert Policy("p").cap is None and not Policy("p").window


@pytest.mark.parametrize("fields, message", [
    (dict(priority="urgent"), "priority must be one of"),
    (dict(beside=48), "beside must be a function giving a context manager, or None, not 48"),
    (dict(), r"comms must be a non-empty list of Communicators, not \[\]"),
])
def test_bad_nccl_bucket_options_are_refused_before_anything_is_made(fields, message):
    from shimrt.torch.step import NcclBuckets
    with pytest.raises(UsageError, match=message):
        NcclBuckets([], None, **fields)


def test_the_policies_keep_one_nccl_block_per_kept_sm():
    fixed = torch_step.policies([16, 32], ranks_per_gpu=2)
    names = [p.name for p in fixed]
    assert names[:3] == ["sequential", "low-priority", "priority"]
    assert fixed[0].sequential and fixed[1].priority == "low" and fixed[2].priority == "high"
    by_name = {p.name: p for p in fixed}
    assert by_name["partition:32"].ctas == 16 and by_name["carveout:16"].ctas == 8
    assert by_name["ctas:4"].ctas == 4 and by_name["ctas:8"].ctas == 8 and by_name["ctas:8"].priority == "high"
    assert torch_step.policies([16], ranks_per_gpu=1)[-1].ctas == 16
    # NCCL takes at most 64 channels: more SMs kept than that still give 64 (one rank per GPU, 96 SMs).
    assert torch_step.policies([96], ranks_per_gpu=1)[-1].ctas == 64
    assert torch_step.policies([112], ranks_per_gpu=2)[-1].ctas == 56
    assert "cuBLAS leaves 16 SMs, NCCL 8 channels/rank" in by_name["carveout:16"].describe()
    assert [policies.kind(p) for p in fixed] == ["sequential", "low-priority", "priority", "ctas", "ctas", "shaping",
                                                   "shaping", "partition", "carveout", "windowed-carveout",
                                                   "partition", "carveout", "windowed-carveout"]
    window = by_name["windowed-carveout:32"]
    assert window.window and window.carveout == 32 and window.ctas == 16
    assert "cuBLAS leaves 32 SMs while all-reduces run, NCCL 16 channels/rank" in window.describe()
    assert [p.name for p in torch_step.policies([16, 32], 2, ("sequential", "carveout"))] == \
        ["sequential", "carveout:16", "carveout:32"]
    assert "ddp" not in torch_step.KINDS  # one process holds every rank there: no process group


def _entry(step_ms, slowdown=1.0, **more):
    return dict(policy="p", choice="c", step_ms=step_ms, compute_slowdown=slowdown, comm_hidden=0.5,
                losses_bitwise=True, loss_max_diff=0.0, grads_bitwise=more.pop("grads_bitwise", True),
                grad_max_diff=more.pop("grad_max_diff", 0.0), **more)


def test_the_report_gives_ratios_to_torchs_default_and_autos_distance_from_the_best():
    result = {"model": {"parameters": 537e6, "tokens": 8192}, "gradient_bytes": 1 << 30, "buckets": 41,
              "compute_ms": 10.0, "comm_ms": {"None": 5.0},
              "policies": {"sequential": _entry(15.0), "low-priority": _entry(14.0),
                           "carveout 16 SMs": _entry(11.2, 1.1, grads_bitwise=False, grad_max_diff=0.004),
                           "windowed carveout 16 SMs": _entry(11.5, None),
                           "auto": _entry(11.27, picked="carveout 16 SMs", tuning_s=2.5)},
              "failed": {"partition 16 SMs": "DriverError: no green contexts"}}
    text = torch_step.report("balanced", result)
    assert "ratio 0.50" in text and "0.800x" in text and "grad diff 0.004" in text
    # A windowed carveout's compute alone is the plain one: no slowdown of its own is claimed.
    assert [line.split()[-4] for line in text.splitlines() if line.startswith("windowed")] == ["-"]
    assert "auto picked carveout 16 SMs after 2.5 s of trials: 1.006x the best fixed (carveout 16 SMs), " \
           "-19.5% step time against low-priority" in text  # 11.27 ms against 14.0: faster, so negative
    assert "partition 16 SMs          failed: DriverError: no green contexts" in text


def test_bench_torch_without_torch_says_how_to_get_it(capsys):
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    from shimrt.bench.__main__ import main
    assert main(["torch", "--configs", "balanced"]) == 2
    err = capsys.readouterr().err
    assert "bench torch needs PyTorch" in err and "shimrt[torch]" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", [["--bucket-view"], ["--one-bucket"], ["--loss-every", "10"], ["--optimizer", "adamw"],
                                  ["--fsdp"], ["--settle", "4"], ["--steady", "8"], ["--profile", "/tmp"],
                                  ["--in-turn", "6"]])
def test_the_ddp_only_options_are_refused_with_ranks_in_one_process(capsys, monkeypatch, flag):
    pytest.importorskip("torch")
    from shimrt.bench.__main__ import main
    for name in ("RANK", "WORLD_SIZE", "SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert main(["torch", *flag, "--configs", "balanced"]) == 2
    err = capsys.readouterr().err
    assert f"{flag[0]} applies to one process per rank (DDP)" in err and "Traceback" not in err


def test_bad_bench_torch_options_are_refused(capsys):
    from shimrt.bench.__main__ import main
    for argv, needle in ((["--configs", "huge"], "--configs"), (["--sms", "0"], "--sms"), (["--sms", "32,32"], "--sms"),
                         (["--steps", "0"], "--steps"), (["--local-ranks", "1"], "--local-ranks"),
                         (["--policies", "sequential,fast"], "--policies"), (["--timeout", "0"], "--timeout"),
                         (["--width", "32"], "--width"), (["--layers", "0"], "--layers"),
                         (["--batch", "0"], "--batch"), (["--seq", "7"], "--seq"),
                         (["--loss-every", "-1"], "--loss-every"), (["--optimizer", "adam"], "--optimizer"),
                         (["--settle", "-1"], "--settle"), (["--settle", "x"], "--settle")):
        assert main(["torch", *argv]) == 2
        err = capsys.readouterr().err
        assert f"argument {needle}" in err and "Traceback" not in err


def test_zero_sm_is_refused_without_fsdp2s_custom_route_and_added_with_it(capsys):
    import argparse

    from shimrt.bench.__main__ import main
    from shimrt.bench.torch_step import check
    for argv in (["--policies", "zero-sm"], ["--fsdp", "--policies", "priority,zero-sm"]):
        assert main(["torch", *argv]) == 2
        err = capsys.readouterr().err
        assert "zero-sm is FSDP2's over its custom collectives" in err and "--fsdp --fsdp-route custom" in err, err
    base = dict(plots=None, trial_steps=None, in_turn=0, rounds=None, configs=["balanced"],
                width=None, layers=None, batch=None, seq=None, one_bucket=False)
    custom = argparse.Namespace(**base, fsdp=True, fsdp_route="custom", policies=None)
    check(custom)
    assert "zero-sm" in custom.policies and "prefetch" in custom.policies
    mesh = argparse.Namespace(**base, fsdp=True, fsdp_route="mesh", policies=None)
    check(mesh)
    assert "zero-sm" not in mesh.policies and "ctas" in mesh.policies


def test_paced_is_in_the_default_of_one_process_per_rank_and_refused_asked_for_in_one(capsys, monkeypatch):
    import argparse

    pytest.importorskip("torch")
    from shimrt.bench.__main__ import main
    from shimrt.bench.torch_step import check, policies
    for name in ("SHIMRT_WORLD_SIZE", "WORLD_SIZE"):  # one process: no launcher's ranks
        monkeypatch.delenv(name, raising=False)
    assert main(["torch", "--policies", "priority,paced"]) == 2
    err = capsys.readouterr().err
    assert "paced waits at the end of each rank's ov.step(), which needs one process per rank" in err, err
    base = dict(plots=None, trial_steps=None, in_turn=0, rounds=None, configs=["balanced"],
                width=None, layers=None, batch=None, seq=None,
                fsdp=False, fsdp_route="mesh", one_bucket=False)
    default = argparse.Namespace(**base, policies=None)
    check(default)
    assert "paced" in default.policies and not default.paced_asked
    # one process's own list leaves it out: one host drives every rank
    assert "paced" not in [p.name for p in policies([32], 2, default.policies)]


def test_a_width_the_heads_do_not_divide_is_refused_before_the_gpu_is_looked_for(capsys):
    from shimrt.bench.__main__ import main
    assert main(["torch", "--width", "257"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("shimrt.bench torch: --width must be a multiple of heads (2) with a head size that is a multiple "
                   "of 8, not 257"), err


def test_every_configuration_is_native_linked_or_one_processs_and_builds():
    import argparse

    from shimrt.bench.torch_step import CONFIGS, LINKED, NATIVE, WIDE, model_size
    assert set(NATIVE) | set(LINKED) == set(CONFIGS) and not set(NATIVE) & set(LINKED)
    assert set(WIDE) <= set(NATIVE)
    none = argparse.Namespace(width=None, layers=None, batch=None, seq=None)
    # the linked ones: one model, bf16 weights (half the all-reduce bytes), more tokens as the compute grows
    sizes = [model_size(n, none) for n in LINKED]
    assert len({(s.width, s.layers, s.weights) for s in sizes}) == 1 and sizes[0].weights == "bfloat16"
    tokens = {n: model_size(n, none).tokens for n in LINKED}
    assert tokens["link-comm-heavy"] < tokens["link-balanced"] < tokens["link-compute-heavy"]
    assert LINKED[0] == "link-balanced"  # the goals' configuration first: a run cut short keeps it


def test_batch_and_seq_size_every_configuration_and_the_rest_keep_their_own():
    import argparse

    from shimrt.bench.torch_step import CONFIGS, model_size
    args = argparse.Namespace(width=None, layers=None, batch=16, seq=512)
    for name, own in CONFIGS.items():
        size = model_size(name, args)
        assert (size.batch, size.seq, size.width, size.layers) == (16, 512, own["width"], own["layers"])
        assert size.tokens == 16 * 512
    assert model_size("balanced", argparse.Namespace(width=None, layers=None, batch=None, seq=None)).batch == 1


def test_shimrt_torch_without_torch_says_how_to_get_it():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    import shimrt.torch as st
    for call in (st.process_group_options, lambda: st.sm_carveout(8).__enter__(), lambda: st.overlap(object())):
        with pytest.raises(UsageError, match=r"needs PyTorch: pip install 'shimrt\[torch\]'"):
            call()


def test_the_bound_adds_the_first_bucket_the_fastest_all_reduces_and_the_optimizer():
    from shimrt.bench.torch_measure import bound
    b = bound({"first bucket": 4.0, "backward": 8.0, "end": 11.0}, 10.98, {"None": 6.12, "16": 7.45, "32": 5.27})
    assert b == {"ms": 4.0 + 5.27 + 3.0, "first_bucket_ms": 4.0, "comm_ms": 5.27, "channels": "32",
                 "optimizer_ms": 3.0}
    # Never below compute alone: all-reduces that would fit in no time still leave the compute.
    assert bound({"first bucket": 1.0, "backward": 8.0, "end": 9.0}, 10.0, {"None": 0.5})["ms"] == 10.0


def _record(name, threads, registers, smem, us):
    return {"name": name, "grid_x": 132, "grid_y": 1, "grid_z": 1, "block_x": threads, "block_y": 1, "block_z": 1,
            "registers": registers, "static_smem": smem, "dynamic_smem": 0, "start": 0, "end": int(us * 1e3)}


def test_sharing_counts_compute_time_in_kernels_that_cannot_sit_beside_an_nccl_block():
    from shimrt.bench.torch_measure import sharing
    from shimrt.occupancy import Footprint
    # NCCL 2.32's AllReduce on the H200: 544 threads x 96 registers, 36800 + 82240 B of smem.
    nccl = Footprint("AllReduce", 1, 544, 96, 36800, 82240)
    small = Footprint("small", 1, 128, 32, 0, 1024)
    records = [_record("nvjet_gemm", 384, 168, 188604, 300.0), _record("tiny_copy", 32, 16, 0, 100.0)]
    out = sharing("sm_90", records, nccl)
    # The GEMM's 188604 B of smem and 384 x 168 registers fit on no SM holding the NCCL block;
    # one warp of 16 registers still does.
    assert out["compute_us"] == 400.0 and out["exclusive_share"] == 0.75
    assert out["top_exclusive"] == {"name": "nvjet_gemm", "us": 300.0, "threads": 384, "registers": 168,
                                    "smem": 188604}
    assert sharing("sm_90", records[1:], small)["exclusive_share"] == 0.0


def test_the_exclusive_bound_adds_the_all_reduces_sm_time_to_the_rest_of_backward():
    from shimrt.bench.torch_measure import bound
    from shimrt.bench.torch_report import report
    # comm-heavy on the H200 (run 29): first bucket 2.04 ms, backward to 5.96, the optimizer 5.11 ms.
    phases = {"first bucket": 2.04, "backward": 5.96, "end": 11.07}
    comm = {"None": 6.19, "16": 7.45, "24": 6.04, "32": 5.27}
    blocks = {"None": 128, "16": 32, "24": 48, "32": 64}
    b = bound(phases, 11.07, comm, blocks, 132)
    # 24 channels: max(6.04, 3.92 + 48 x 6.04 / 132 = 6.116) ms, the least of the four settings.
    assert b["exclusive_channels"] == "24" and b["exclusive_blocks"] == 48
    assert abs(b["exclusive_ms"] - (2.04 + 3.92 + 48 * 6.04 / 132 + 5.11)) < 1e-9
    assert b["ms"] == 2.04 + 5.27 + 5.11 < b["exclusive_ms"]
    assert "exclusive_ms" not in bound(phases, 11.07, comm)
    e = dict(policy="p", choice="c", step_ms=16.33, compute_slowdown=1.0, comm_hidden=0.1, losses_bitwise=True,
             loss_max_diff=0.0, grads_bitwise=True, grad_max_diff=0.0)
    text = report("comm-heavy", {"model": {"parameters": 1.07e9, "tokens": 256}, "gradient_bytes": 2 << 30,
                                 "buckets": 23, "compute_ms": 11.07, "comm_ms": comm, "bound": b,
                                 "policies": {"low-priority": e}})
    assert "bound if NCCL's blocks never share an SM with compute: 13.27 ms (24 channels/rank, 48 blocks on " \
           "this GPU): at most 18.8% below low-priority" in text


def test_overlap_share_is_the_hidden_part_of_the_shorter_work():
    from shimrt.bench.torch_measure import overlap_share
    assert overlap_share(4.0, 10.0, 10.0) == 1.0  # the longer's time: the shorter wholly hidden
    assert overlap_share(4.0, 10.0, 14.0) == 0.0  # their sum: one after the other
    assert overlap_share(10.0, 4.0, 12.0) == 0.5
    assert overlap_share(4.0, 10.0, 16.0) == -0.5  # slower together than one after the other
    with pytest.raises(UsageError, match="alone_ms"):
        overlap_share(0.0, 10.0, 10.0)


def test_the_report_gives_the_contention_measured_or_why_not():
    from shimrt.bench.torch_measure import overlap_share
    from shimrt.bench.torch_report import report
    # The H200 probe (run 16): all-reduces of 2 ranks, 24 channels/rank, torch on the other 84 SMs.
    contention = {"sms_kept": 48, "channels": 24}
    for name, alone, together in (("copy", 10.85, 19.03), ("gemm", 9.95, 13.68)):
        contention[name] = {"count": 1, "alone_ms": alone, "comm_ms": 10.79, "together_ms": together,
                            "overlap": overlap_share(alone, 10.79, together)}
    e = dict(policy="p", choice="c", step_ms=16.33, compute_slowdown=1.0, comm_hidden=0.1, losses_bitwise=True,
             loss_max_diff=0.0, grads_bitwise=True, grad_max_diff=0.0)
    r = {"model": {"parameters": 1.07e9, "tokens": 256}, "gradient_bytes": 2 << 30, "buckets": 23,
         "compute_ms": 11.07, "comm_ms": {"None": 6.19}, "policies": {"low-priority": e}, "contention": contention}
    assert "contention (torch kept off the 48 SMs left to NCCL's 24 channels/rank): all-reduces alone 10.79 ms; " \
           "beside them a memory-bound copy 10.85 -> 19.03 ms together (24% overlap), a compute-bound GEMM " \
           "9.95 -> 13.68 ms (71%)" in report("comm-heavy", r)
    r["contention"] = {"error": "DriverError: CUDA_ERROR_NOT_SUPPORTED"}
    assert "contention: not measured (DriverError: CUDA_ERROR_NOT_SUPPORTED)" in report("comm-heavy", r)


def test_contention_runs_where_nccls_channels_were_fastest_alone():
    comm_ms = {None: 6.06, 16: 7.40, 24: 5.97, 32: 5.24}
    assert torch_step.fastest_kept([32, 48, 64], 2, comm_ms) == 64
    assert torch_step.fastest_kept([32, 48], 2, comm_ms) == 48
    assert torch_step.fastest_kept([32, 48], 2, {None: 6.06}) == 32  # none ran alone: the first
    # Above 64 SMs per rank NCCL still has 64 channels: 96 SMs with one rank per GPU is 64's setting.
    assert torch_step.fastest_kept([96], 1, {64: 5.0}) == 96
    assert [torch_step.channels(k, r) for k, r in ((96, 1), (112, 2), (1, 2), (48, 2))] == [64, 56, 1, 24]


class _NoGreenContexts:
    """A device whose partitions fail as a driver without green contexts fails them."""

    def __init__(self, name):
        self.name = name

    def partition(self, sms):
        from shimrt import DriverError
        raise DriverError("cuGreenCtxCreate", self.name, 801, "operation not supported")


def test_contention_without_green_contexts_is_reported_and_a_sticky_error_ends_the_run():
    from shimrt import DriverError
    bench = torch_step.Bench(_NoGreenContexts("CUDA_ERROR_NOT_SUPPORTED"), [])
    out = torch_step.contention_at(bench, None, None, None, {}, 2, [48])
    assert out == {"error": "DriverError: cuGreenCtxCreate failed: CUDA_ERROR_NOT_SUPPORTED (801): operation not "
                            "supported"}
    bench = torch_step.Bench(_NoGreenContexts("CUDA_ERROR_ILLEGAL_ADDRESS"), [])
    with pytest.raises(DriverError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        torch_step.contention_at(bench, None, None, None, {}, 2, [48])


def test_sticky_driver_errors_are_the_ones_that_poison_the_context():
    from shimrt import DriverError
    assert DriverError("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS", 700, "").sticky
    assert DriverError("hipStreamSynchronize", "hipErrorLaunchFailure", 719, "").sticky
    assert not DriverError("cuGreenCtxCreate", "CUDA_ERROR_NOT_SUPPORTED", 801, "").sticky
    assert not DriverError("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", 2, "").sticky
    assert torch_step.is_fatal(DriverError("cuLaunchKernel", "CUDA_ERROR_LAUNCH_FAILED", 719, ""))
    assert not torch_step.is_fatal(DriverError("cuGreenCtxCreate", "CUDA_ERROR_NOT_SUPPORTED", 801, ""))
    assert torch_step.is_fatal(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_rounds_leave_out_the_warm_up_and_check_their_count():
    from shimrt.bench.torch_measure import rounds
    times = iter([9.0, 1.0, 2.0, 3.0])
    assert rounds(lambda: next(times), 3) == [1.0, 2.0, 3.0]
    assert rounds(lambda: 4.0, 0) == [4.0]  # one round only: it is the result
    with pytest.raises(UsageError, match="repeats"):
        rounds(lambda: 4.0, -1)


# --- issue 24: the torch extra's pure parts refuse what they cannot use --------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: Carveout(10**12), "Carveout.sms must be an int in 1..1024, not 1000000000000"),
    (lambda: Partition(1025), "Partition.sms must be an int in 1..1024, not 1025"),
    (lambda: Policy("p\ud800"), "Policy.name must be a string .*lone surrogates"),
])
def test_policies_beyond_any_gpu_are_refused(make, message):
    with pytest.raises(UsageError, match=message):
        make()


def _model():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch, torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _backward(torch, model):
    model(torch.ones(2, 4)).square().sum().backward()


def test_gradient_buckets_refuse_a_model_without_gradients():
    from shimrt.torch.step import GradientBuckets
    torch, model = _model()
    model.requires_grad_(False)
    with pytest.raises(UsageError, match="model must have a parameter with requires_grad=True .*none of its 4"):
        GradientBuckets(model, 1 << 20)
    with pytest.raises(UsageError, match="model must be a torch.nn.Module, not 'model'"):
        GradientBuckets("model", 1 << 20)


def test_zero_grad_set_to_none_is_caught_at_the_next_bucket_check():
    """torch's default zero_grad() drops the views: backward then writes new tensors, and an
    all-reduce of the buckets would reduce the previous step's gradients without a word."""
    from shimrt.torch.step import GradientBuckets
    torch, model = _model()
    buckets = GradientBuckets(model, 24)  # small buckets: several of them
    assert len(buckets.flats) > 1
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):  # zeroed as the buckets expect: the views hold step after step
        optimizer.zero_grad(set_to_none=False)
        _backward(torch, model)
        buckets.check_views()
        for p in buckets.params:
            assert p.grad.data_ptr() == buckets.views[p].data_ptr()
    optimizer.zero_grad()  # set_to_none=True
    for i in range(len(buckets.flats)):
        with pytest.raises(UsageError, match=rf"\.grad of parameter .* must be its view of gradient bucket {i}, not "
                                             r"None: .*zero_grad\(set_to_none=False\)"):
            buckets.check_bucket(i)
    _backward(torch, model)  # fresh tensors, not the views
    with pytest.raises(UsageError, match="not a tensor of its own"):
        buckets.check_views()


def test_attach_puts_the_views_back_and_backward_fills_them():
    from shimrt.torch.step import GradientBuckets
    torch, model = _model()
    buckets = GradientBuckets(model, 1 << 20)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.zero_grad()
    buckets.attach()
    buckets.zero()
    _backward(torch, model)
    buckets.check_views()
    reference = torch.cat([p.grad.reshape(-1) for p in buckets.params])
    assert torch.equal(buckets.flats[0], reference)  # one bucket, in the order of buckets.params
    assert reference.abs().sum() > 0


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0, 0, True, "0.1", 10**400])
def test_the_trainer_refuses_a_learning_rate_that_is_none(lr):
    from shimrt.bench.torch_trainer import Trainer
    from shimrt.torch.step import GradientBuckets
    torch, model = _model()
    with pytest.raises(UsageError, match="lr must be a finite positive number"):
        Trainer(model, (torch.ones(2, 4),), GradientBuckets(model, 1 << 20), lr=lr)


def test_the_trainer_and_compute_context_check_what_they_take():
    from shimrt.bench.torch_trainer import Trainer
    from shimrt.torch.resources import compute_context
    from shimrt.torch.step import GradientBuckets
    torch, model = _model()
    with pytest.raises(UsageError, match="buckets must be a GradientBuckets, not None"):
        Trainer(model, (torch.ones(2, 4),), None)
    with pytest.raises(UsageError, match="batch must be a tuple"):
        Trainer(model, torch.ones(2, 4), GradientBuckets(model, 1 << 20))
    with pytest.raises(UsageError, match="policy must be a Policy, not 'sequential'"):
        with compute_context("sequential"):
            pass


@pytest.mark.parametrize("sms", [-1, 1025, 10**12])
def test_sm_carveout_is_refused_beyond_any_gpu(sms):
    pytest.importorskip("torch")
    import shimrt.torch
    with pytest.raises(UsageError, match=r"sms must be an int in 0..1024"):
        with shimrt.torch.sm_carveout(sms):
            pass


def test_a_window_holds_the_carveout_from_its_opening_to_its_close_and_only_when_aimed():
    """resources.Window on torch's real carveout knob (present in CPU builds too): aimed, opened
    once, closed back to what was there; unaimed, opening does nothing; as NcclBuckets' beside."""
    torch = pytest.importorskip("torch")
    from shimrt.torch.resources import Window
    get = torch._C._get_sm_carveout_experimental
    before = get()
    w = Window()
    w.open()
    assert not w.is_open and get() == before, "nothing aimed: no carveout"
    w.aim(24)
    w.open()
    w.open()  # held once
    assert w.is_open and get() == 24
    w.close()
    assert not w.is_open and get() == before
    w.close()  # closing an unopened window does nothing
    with Window(8).held():
        assert get() == 8
    assert get() == before
    w.aim(24)
    w.open()
    w.clear()  # closed, and aimed at nothing: the next opening does nothing
    assert not w.is_open and get() == before
    w.open()
    assert not w.is_open and get() == before
    with pytest.raises(UsageError, match="Window sms must be an int"):
        w.aim(-1)


def test_the_window_hook_opens_the_window_at_the_first_gradient_and_never_keeps_it_alive():
    """window_hook on a real CPU parameter: backward accumulates its gradient, the hook opens the
    aimed window; once the Window is gone, the hook does nothing."""
    torch = pytest.importorskip("torch")
    import gc

    from shimrt.torch.resources import Window, window_hook
    get = torch._C._get_sm_carveout_experimental
    before = get()
    layer = torch.nn.Linear(4, 4)
    w = Window()
    handle = window_hook(layer.weight, w)
    try:
        layer(torch.ones(2, 4)).sum().backward()
        assert not w.is_open, "not aimed: the gradient opens nothing"
        w.aim(16)
        layer(torch.ones(2, 4)).sum().backward()
        assert w.is_open and get() == 16
        w.close()
        assert get() == before
        del w
        gc.collect()
        layer(torch.ones(2, 4)).sum().backward()  # the hook's Window is gone: nothing happens
        assert get() == before
    finally:
        handle.remove()


def test_the_step_timer_takes_the_median_of_the_timed_steps_after_the_warm_up():
    """median_step_ms with a clock standing in for CUDA's events (each record reads it): the
    warm-up steps are run but not timed, every step's result comes back, the collector is paused
    while the steps run and on again after."""
    import gc
    from types import SimpleNamespace

    from shimrt.bench.torch_measure import median_step_ms, step_times_ms
    now = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = now[0]

        def synchronize(self):
            pass

        def elapsed_time(self, later):
            return later.t - self.t

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: None))
    lengths = [100.0, 50.0, 3.0, 9.0, 5.0]  # two warm-up steps, then three timed ones
    collector = []

    def step(i):
        collector.append(gc.isenabled())
        now[0] += lengths[i]
        return i * 10
    ms, out = median_step_ms(torch, step, warmup=2, steps=3)
    assert (ms, out) == (5.0, [0, 10, 20, 30, 40])
    assert collector == [False] * 5 and gc.isenabled()
    now[0] = 0.0
    assert step_times_ms(torch, step, warmup=2, steps=3) == ([3.0, 9.0, 5.0], [0, 10, 20, 30, 40])


def test_hidden_is_the_share_of_the_all_reduces_a_step_saves_clipped_to_0_1():
    import math

    from shimrt.bench.torch_measure import comm_hidden
    assert comm_hidden(15.96, 9.58, 24.71) == pytest.approx((15.96 + 9.58 - 24.71) / 9.58)  # ~8.7%
    assert comm_hidden(10.0, 4.0, 10.0) == 1.0 and comm_hidden(10.0, 4.0, 9.0) == 1.0
    assert comm_hidden(10.0, 4.0, 14.0) == 0.0 and comm_hidden(10.0, 4.0, 20.0) == 0.0
    assert math.isnan(comm_hidden(10.0, 4.0, math.nan))


def test_steady_runs_windows_until_two_in_a_row_agree():
    from shimrt.bench import torch_ddp
    assert torch_ddp.STEADY_TOLERANCE == 0.02

    def windows(means):
        it = iter(means)
        return torch_ddp.steady(lambda: next(it))
    # fast at first, then a stretch slower (plain DDP of two ranks on a GPU): timed once it holds
    assert windows([50.0, 50.5, 60.0]) == [50.0, 50.5]
    assert windows([50.0, 60.0, 59.0]) == [50.0, 60.0, 59.0]
    assert windows([50.0, 51.0]) == [50.0, 51.0]  # 2% of the first: still agree
    assert windows([50.0, 51.5, 53.0, 54.5, 56.0, 57.5, 59.0, 60.5, 62.0]) == \
        [50.0, 51.5, 53.0, 54.5, 56.0, 57.5, 59.0, 60.5]  # never steady: STEADY_WINDOWS, then timed
    assert len(windows([50.0, 51.5, 53.0, 54.5, 56.0, 57.5, 59.0, 60.5, 62.0])) == torch_ddp.STEADY_WINDOWS


def test_steady_is_an_option_of_one_process_per_rank():
    import argparse
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    assert p.parse_args([]).steady == 0 and p.parse_args(["--steady", "8"]).steady == 8
    with pytest.raises(SystemExit):
        p.parse_args(["--steady", "-1"])


def test_ctas_ways_run_under_ddp_and_fsdp2_and_fsdp2s_own_kinds_under_fsdp2_alone():
    import argparse
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    for argv, has_ctas in (([], True), (["--fsdp"], True), (["--policies", "priority,auto"], False)):
        args = p.parse_args(["--configs", "balanced", *argv])
        torch_step.check(args)
        assert ("ctas" in args.policies) == has_ctas, argv
    args = p.parse_args(["--configs", "balanced"])
    torch_step.check(args)
    assert list(args.policies) == [k for k in torch_step.KINDS if k not in ("prefetch", "no-reshard", "zero-sm")]
    args = p.parse_args(["--configs", "balanced", "--fsdp"])
    torch_step.check(args)
    assert "prefetch" in args.policies and "ctas" in args.policies and "no-reshard" in args.policies
    args = p.parse_args(["--configs", "balanced", "--policies", "priority,prefetch"])
    with pytest.raises(UsageError, match="prefetch:N is FSDP2's"):
        torch_step.check(args)
    args = p.parse_args(["--configs", "balanced", "--policies", "priority,no-reshard"])
    with pytest.raises(UsageError, match="no-reshard is FSDP2's"):
        torch_step.check(args)


def test_bucket_mb_leaves_ddp_its_own_buckets_unless_given():
    """Unset, DDP is made as DDP(model) makes it (torch's 25 MiB buckets after a 1 MiB first one: a
    bucket_cap_mb given caps the first bucket too); the all-reduces alone are cut at 25 MiB then."""
    import argparse
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    from shimrt.torch.ddp import DEFAULT_BUCKET_MB
    assert p.parse_args([]).bucket_mb is None and DEFAULT_BUCKET_MB == 25
    assert p.parse_args(["--bucket-mb", "40"]).bucket_mb == 40
    with pytest.raises(SystemExit):
        p.parse_args(["--bucket-mb", "0"])


def test_one_bucket_adds_plain_ddp_in_one_bucket_after_plain_ddp_and_is_refused_under_fsdp():
    import argparse

    from shimrt.bench.torch_ddp import ways_of
    from shimrt.bench.torch_ddp_report import ONE_BUCKET_WAY
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    argv = ["--configs", "balanced", "--sms", "32", "--policies", "priority"]
    args = p.parse_args([*argv, "--one-bucket"])
    torch_step.check(args)
    assert ways_of(args, list(args.policies)) == [
        ("plain DDP", None, "mesh"), (ONE_BUCKET_WAY, None, "mesh"), ("priority", "priority", "mesh"),
        ("plain DDP again", None, "mesh")]
    args = p.parse_args(argv)
    torch_step.check(args)
    assert ONE_BUCKET_WAY not in [w for w, _, _ in ways_of(args, list(args.policies))]
    args = p.parse_args([*argv, "--one-bucket", "--fsdp"])
    with pytest.raises(UsageError, match="--one-bucket is DDP's"):
        torch_step.check(args)


def test_sequential_is_a_way_of_ddp_and_refused_under_fsdp_where_named():
    import argparse

    from shimrt.bench.torch_ddp import ways_of
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    args = p.parse_args(["--configs", "balanced", "--sms", "32", "--policies", "sequential,priority"])
    torch_step.check(args)
    assert ways_of(args, list(args.policies)) == [
        ("plain DDP", None, "mesh"), ("sequential", "sequential", "mesh"), ("priority", "priority", "mesh"),
        ("plain DDP again", None, "mesh")]
    args = p.parse_args(["--configs", "balanced", "--sms", "32", "--fsdp"])  # the default list: left out
    torch_step.check(args)
    assert "sequential" not in [w for w, _, _ in ways_of(args, list(args.policies))]
    args = p.parse_args(["--configs", "balanced", "--fsdp", "--policies", "sequential,priority"])
    with pytest.raises(UsageError, match="sequential all-reduces a DDP's gradients after backward"):
        torch_step.check(args)


def test_fsdp_route_both_runs_priority_over_the_custom_route_beside_the_mesh():
    import argparse

    from shimrt.bench.torch_ddp import ways_of
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    argv = ["--configs", "balanced", "--fsdp", "--sms", "32", "--policies", "priority,no-reshard,auto"]
    args = p.parse_args([*argv, "--fsdp-route", "both"])
    torch_step.check(args)
    assert ways_of(args, list(args.policies)) == [
        ("plain DDP", None, "mesh"), ("priority", "priority", "mesh"), ("no-reshard", "no-reshard", "mesh"),
        ("priority (custom route)", "priority", "custom"), ("ddp", "ddp", "mesh"), ("auto", "auto", "mesh"),
        ("auto-steps", "auto-steps", "mesh"), ("plain DDP again", None, "mesh")]
    args = p.parse_args([*argv, "--fsdp-route", "custom"])
    torch_step.check(args)
    assert {route for _, _, route in ways_of(args, list(args.policies))} == {"custom"}
    assert "priority (custom route)" not in [w for w, _, _ in ways_of(args, list(args.policies))]
    for bad, message in ((["--configs", "balanced", "--fsdp-route", "both"], "--fsdp-route applies with --fsdp"),
                         ([*argv[:-1], "zero-sm", "--fsdp-route", "both"], "add --fsdp --fsdp-route custom")):
        args = p.parse_args(bad)
        with pytest.raises(UsageError, match=message):
            torch_step.check(args)


def test_rounds_apply_with_blocks_in_turn_only_and_default_to_four():
    import argparse
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    args = p.parse_args(["--configs", "balanced", "--rounds", "3"])
    with pytest.raises(UsageError, match="--rounds applies with --in-turn"):
        torch_step.check(args)
    args = p.parse_args(["--configs", "balanced", "--in-turn", "6"])
    torch_step.check(args)
    assert (args.in_turn, args.rounds) == (6, 4)
    for bad in (["--in-turn", "-1"], ["--in-turn", "6", "--rounds", "0"]):
        with pytest.raises(SystemExit):
            p.parse_args(["--configs", "balanced", *bad])


def test_fsdp_route_applies_with_fsdp_only(capsys):
    import argparse
    p = argparse.ArgumentParser()
    torch_step.add_arguments(p)
    args = p.parse_args(["--configs", "balanced", "--fsdp-route", "custom"])
    with pytest.raises(UsageError, match="--fsdp-route applies with --fsdp"):
        torch_step.check(args)
    args = p.parse_args(["--configs", "balanced", "--fsdp", "--fsdp-route", "custom"])
    torch_step.check(args)
    assert args.fsdp_route == "custom"
    with pytest.raises(SystemExit):
        p.parse_args(["--fsdp-route", "tree"])


def test_releasing_torchs_cache_where_cuda_never_started_starts_nothing():
    """release_cached (auto's, between its stages) on a process that has not touched CUDA (a CPU
    build, or gloo ranks): nothing to give back, and CUDA stays uninitialised (no context made)."""
    torch = pytest.importorskip("torch")
    from shimrt.torch.interop import release_cached
    if torch.cuda.is_initialized():
        pytest.skip("CUDA is initialised in this process already")
    release_cached()
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize("before", [True, False])
def test_accumulation_across_streams_turns_torchs_warning_off_inside_and_back_as_it_was_after(before):
    """partition:K's compute runs beside DDP's accumulators on another stream: torch's warning
    that DDP should be made on the forwards' stream is off inside the block (a user of partition:K
    cannot act on it) and set back after, as the user had it, also when the block raises."""
    torch = pytest.importorskip("torch")
    from shimrt.torch.interop import accumulation_across_streams
    getter = getattr(torch._C, "_warn_on_accumulate_grad_stream_mismatch", None)
    if getter is None:
        pytest.skip(f"torch {torch.__version__} cannot say whether it warns (the block leaves it as it is)")
    found = getter()
    torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(before)
    try:
        with accumulation_across_streams():
            assert getter() is False
        assert getter() is before
        with pytest.raises(KeyError), accumulation_across_streams():
            raise KeyError("a step that fails")
        assert getter() is before
    finally:
        torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(found)
