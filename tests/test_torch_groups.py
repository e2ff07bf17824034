"""A policy's process group under DDP (shimrt.torch.groups), on the CPU: real DDPs over gloo moved
between process groups step by step, against a plain DDP copy."""

from __future__ import annotations

import datetime
import types

import pytest

from shimrt import UsageError


@pytest.mark.parametrize("view", [False, True])
def test_a_ddp_moved_between_groups_trains_as_plain_ddp_bit_for_bit(view, gloo_ranks):
    """Two ranks: the DDP changes group every step (the first step's included, before DDP rebuilds
    its buckets, and around a no_sync() step), then its first group is destroyed and it trains on
    through the second alone; the parameters end as a plain DDP copy's, bit for bit."""
    lines = gloo_ranks("groups_ranks.py", *(["--bucket-view"] if view else []))
    for rank, line in enumerate(lines):
        assert line == f"rank {rank}: diff 0.0 moveable None on-second True", line


def test_sequential_all_reduces_after_backward_and_trains_as_plain_ddp_bit_for_bit(gloo_ranks):
    """Two ranks: a DDP whose reducer sits out every synced step (AfterBackward all-reduces its
    gradients once backward ends), through an evaluation without grad, a no_sync() step whose
    gradients are all-reduced with the next step's and a backward that fails below the output,
    then back on its reducer after close(); its parameters and BatchNorm's buffers (DDP
    broadcasts them at each synced forward) end as a plain DDP copy's, bit for bit, and DDP's
    no_sync switch is as the user left it after every forward. DDPs whose output is a dataclass,
    or an object of no container kind (the parameters' gradients queue the all-reduce), train as
    plain DDP too, though rank 0 alone takes torch.autograd.grad through one (nothing reduced)."""
    lines = gloo_ranks("after_backward_ranks.py")
    for rank, line in enumerate(lines):
        assert line == (f"rank {rank}: diff 0.0 buffers 0.0 ranks apart 0.0 sync flags [False, True] "
                        "no_sync kept [False, False] dataclass, boxed [0.0, 0.0]"), line


@pytest.mark.parametrize("make, says", [
    (lambda t, DDP: DDP(t.nn.Linear(4, 4), find_unused_parameters=True), "its find_unused_parameters"),
    (lambda t, DDP: DDP(t.nn.Linear(4, 4), static_graph=True), "its static_graph"),
    (lambda t, DDP: DDP(t.nn.Sequential(t.nn.Embedding(8, 4, sparse=True), t.nn.Linear(4, 4))),
     "an embedding with sparse gradients"),
    (lambda t, DDP: DDP(t.nn.Linear(4, 4)), None)])
def test_sequential_says_which_ddps_it_cannot_take(gloo, make, says):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import after_backward_refusal
    why = after_backward_refusal(make(gloo, DDP))
    assert (why is None) if says is None else why.startswith(says), why


def test_sequential_all_reduces_a_gradient_of_a_bucket_or_more_alone_and_holds_the_rest_in_a_flat_buffer(gloo):
    """A DDP of 16 KiB buckets: the 64 KiB weights go alone, in place; the 512 B biases and the
    8 KiB weight through the flat buffer, whose bytes auto weighs against the free memory."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch import policies
    from shimrt.torch.ddp import Ddp, alone, flat_bytes, reduced_params
    model = gloo.nn.Sequential(gloo.nn.Linear(128, 128), gloo.nn.Linear(128, 128), gloo.nn.Linear(128, 16))
    model[1].bias.requires_grad_(False)  # not all-reduced: not counted
    ddp = DDP(model, bucket_cap_mb=16 / 1024)
    assert [tuple(p.shape) for p in reduced_params(ddp)] == [(128, 128), (128,), (128, 128), (16, 128), (16,)]
    assert [alone(ddp, p) for p in reduced_params(ddp)] == [True, False, True, False, False]
    assert flat_bytes(ddp) == 4 * (128 + 16 * 128 + 16)
    # what auto weighs for sequential alone (Ddp's own checks want NCCL: its method on the DDP alone)
    alike = types.SimpleNamespace(ddp=ddp)
    held = [Ddp.held_bytes(alike, policies.parse(p)) for p in ("sequential", "priority", "ctas:8")]
    assert held == [flat_bytes(ddp), 0, 0]
    assert flat_bytes(DDP(model)) == 4 * sum(p.numel() for p in reduced_params(ddp))  # 25 MiB buckets: all flat


def test_sequential_refuses_a_ddp_that_join_was_made_for_and_one_without_its_reducer(gloo):
    from torch.distributed.algorithms import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import after_backward_refusal
    ddp = DDP(gloo.nn.Linear(4, 4))
    with Join([ddp]):
        pass
    assert after_backward_refusal(ddp).startswith("a Join made for it")
    ddp = DDP(gloo.nn.Linear(4, 4))
    ddp._use_python_reducer = True  # torch.compile's compiled autograd
    assert after_backward_refusal(ddp).startswith("its all-reduces are not all its reducer's")


def test_sequential_refuses_a_ddp_whose_reducer_has_more_to_do_than_all_reduce(gloo):
    """A comm hook or an optimizer run in backward runs from DDP's reducer, which sits out a
    sequential step: refused when AfterBackward is made, saying why."""
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import AfterBackward, after_backward_refusal
    ddp = DDP(gloo.nn.Linear(4, 4))
    ddp.register_comm_hook(None, lambda state, bucket: None)
    assert after_backward_refusal(ddp).startswith("a comm hook")
    layer = gloo.nn.Linear(4, 4)
    _apply_optimizer_in_backward(gloo.optim.SGD, layer.parameters(), {"lr": 0.1})
    ddp = DDP(layer)
    with pytest.raises(UsageError, match="cannot take this DDP: an optimizer applied in backward"):
        AfterBackward(ddp)


def test_sequential_refuses_at_the_next_forward_a_join_made_since_and_close_gives_the_reducer_back(gloo):
    from torch.distributed.algorithms import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import AfterBackward
    ddp = DDP(gloo.nn.Linear(4, 4))
    deferred = AfterBackward(ddp)
    ddp(gloo.ones(2, 4)).sum().backward()
    with Join([ddp]):
        pass
    with pytest.raises(UsageError, match="cannot go on with this DDP: a Join made for it"):
        ddp(gloo.ones(2, 4))
    assert ddp.require_backward_grad_sync  # as the user left it
    deferred.close()
    ddp(gloo.ones(2, 4)).sum().backward()  # the reducer's own step again
    assert ddp.require_forward_param_sync


def test_a_ddp_whose_all_reduces_cannot_move_is_said_why(gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import moveable
    torch = gloo
    ddp = DDP(torch.nn.Linear(4, 4))
    assert moveable(ddp) is None
    ddp._delay_all_reduce_params = [object()]  # as DDP(delay_all_reduce_named_params=...) leaves it
    assert "delay_all_reduce_named_params" in moveable(ddp)
    ddp._delay_all_reduce_params = []
    ddp._use_python_reducer = True  # torch.compile's compiled autograd
    assert "no C++ reducer" in moveable(ddp)


def test_use_leaves_a_ddp_already_on_the_group_as_it_is(gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import use
    torch = gloo
    ddp = DDP(torch.nn.Linear(4, 4))
    group = ddp.process_group
    use(ddp, group)
    assert ddp.process_group is group
    other = torch.distributed.new_group([0])
    use(ddp, other)
    assert ddp.process_group is other
    ddp(torch.randn(2, 4)).sum().backward()  # one rank: the all-reduce through other is the identity


def test_groups_check_their_timeout(gloo):
    import torch.distributed as dist

    from shimrt.torch.groups import Groups
    for bad in (5, datetime.timedelta(0), datetime.timedelta(seconds=-1), "5"):
        with pytest.raises(UsageError, match="Groups' timeout must be a positive datetime.timedelta"):
            Groups(dist, dist.group.WORLD, bad)


def test_groups_keep_their_timeout_in_whole_milliseconds_as_nccls_options_do(gloo):
    """ProcessGroupNCCL's options keep a timeout in whole milliseconds; a group made with more
    digits than that would differ from its options, and torch warn of it: the groups' timeout is
    the nearest whole millisecond (at least one), which the options then carry unchanged."""
    import torch
    import torch.distributed as dist

    from shimrt.torch.groups import Groups, options
    for given, kept in ((1.2345678, 1235), (12.0, 12000), (0.0001, 1)):
        groups = Groups(dist, dist.group.WORLD, datetime.timedelta(seconds=given))
        assert groups.timeout == datetime.timedelta(milliseconds=kept)
        if dist.is_nccl_available() and hasattr(dist.ProcessGroupNCCL.Options(), "_timeout"):
            assert options(dist, "high", None, timeout=groups.timeout)._timeout == groups.timeout, torch.__version__


@pytest.mark.parametrize("ctas", [0, 65, 1.5, True])
def test_process_group_options_check_ctas_before_anything_else(ctas):
    """A bad NCCL channel count is named whether or not this torch has NCCL."""
    pytest.importorskip("torch")
    from shimrt.torch import process_group_options
    with pytest.raises(UsageError, match="ctas must be an int in 1..64"):
        process_group_options(ctas=ctas)


def test_comm_hooks_are_told_apart_python_and_built_in_refused_mixed_precisions_own_allowed(gloo):
    """Real DDPs over gloo: a Python hook and a built-in (C++) one keep the all-reduces out of a
    policy's reach and are named; DDP's own mixed_precision hook (the same function DDP registers
    for ``mixed_precision``) all-reduces through the reducer's group, and is not refused."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.algorithms.ddp_comm_hooks.mixed_precision_hooks import (
        _AllreduceUpcastHookState,
        _reducer_allreduce_and_upcast_hook,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import hook_refusal
    torch = gloo
    assert hook_refusal(DDP(torch.nn.Linear(4, 4))) is None
    python = DDP(torch.nn.Linear(4, 4))
    python.register_comm_hook(None, allreduce_hook)
    assert hook_refusal(python) == "a comm hook (allreduce_hook, register_comm_hook)"
    builtin = DDP(torch.nn.Linear(4, 4))
    builtin._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    assert builtin._comm_hooks == []  # where a check of _comm_hooks alone would miss it
    assert "a built-in comm hook (" in hook_refusal(builtin) and "ALLREDUCE" in hook_refusal(builtin)
    mixed = DDP(torch.nn.Linear(4, 4))
    mixed.register_comm_hook(_AllreduceUpcastHookState(ddp_weakref=None, upcast_stream=None),
                             _reducer_allreduce_and_upcast_hook)
    assert hook_refusal(mixed) is None


def test_a_ddp_a_join_was_made_for_cannot_move_and_is_told_why(gloo):
    """torch's Join keeps the process group it found; DDP keeps Join's config after the block."""
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.ddp import moveable
    torch = gloo
    ddp = DDP(torch.nn.Linear(4, 4))
    assert moveable(ddp) is None
    with Join([ddp]):
        assert "Join was made for it" in moveable(ddp) and "after auto has decided" in moveable(ddp)
    assert "Join was made for it" in moveable(ddp)


def test_groups_over_the_whole_world_are_made_by_every_rank_and_a_world_group_is_no_sub_group(gloo):
    import torch.distributed as dist

    from shimrt.torch.groups import Groups, subgroup_refusal
    assert subgroup_refusal(dist, dist.group.WORLD) is None
    groups = Groups(dist, dist.group.WORLD, datetime.timedelta(seconds=5))
    assert groups.local is False and groups.ranks == [0] and groups.device is None
    assert groups.report() == {"made_mib": {}, "alive_mib": 0.0, "alive": 0}


def test_both_adapters_refuse_alike_a_model_off_one_cuda_device_and_a_group_not_nccls(gloo):
    import torch.distributed as dist

    from shimrt.torch.groups import one_cuda_device, require_nccl
    torch = gloo
    with pytest.raises(UsageError, match=r"needs every parameter on one CUDA device .*not on \['cpu'\]"):
        one_cuda_device({torch.device("cpu")}, "every parameter")
    with pytest.raises(UsageError, match=r"needs FSDP2 on one CUDA device .*\['cuda:0', 'cuda:1'\]"):
        one_cuda_device({torch.device("cuda", 0), torch.device("cuda", 1)}, "FSDP2")
    assert one_cuda_device({torch.device("cuda", 3)}, "x") == 3
    with pytest.raises(UsageError, match=r"needs FSDP2 over NCCL \(its process group's backend is 'gloo'\)"):
        require_nccl(dist, dist.group.WORLD, "FSDP2")


def test_a_zero_sm_group_asks_nccl_for_its_cta_policy_zero_and_no_channel_count():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from shimrt.torch.groups import options
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip(f"torch {torch.__version__} has no NCCL process group")
    zero = getattr(dist.ProcessGroupNCCL, "NCCL_CTA_POLICY_ZERO", None)
    if zero is None:
        with pytest.raises(UsageError, match="has no NCCL CTA policy ZERO .*zero-sm cannot run"):
            options(dist, "high", None, zero_sm=True)
        return
    made = options(dist, "high", None, zero_sm=True)
    assert made.config.cta_policy == zero and made.is_high_priority_stream
    assert options(dist, "high", 8).config.cta_policy != zero  # NCCL's default policy elsewhere
    with pytest.raises(UsageError, match="CTA policy ZERO takes no channel count, not ctas=8"):
        options(dist, "high", 8, zero_sm=True)


def test_a_groups_options_carry_the_timeout_it_is_made_with_so_torch_has_none_to_warn_of():
    """torch warns ("backend_options._timeout was specified ...") where a new group's options
    carry another timeout than the group's: a policy's group carries overlap()'s; a bad timeout
    is refused by name before anything is made."""
    torch = pytest.importorskip("torch")
    import datetime

    import torch.distributed as dist

    from shimrt.torch import process_group_options
    from shimrt.torch.groups import options
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip(f"torch {torch.__version__} has no NCCL process group")
    fresh = dist.ProcessGroupNCCL.Options()
    if not hasattr(fresh, "_timeout"):
        pytest.skip(f"torch {torch.__version__}'s ProcessGroupNCCL.Options carry no timeout")
    short = datetime.timedelta(seconds=42)
    assert options(dist, "high", 8, timeout=short)._timeout == short
    assert options(dist, "low", None)._timeout == fresh._timeout  # none given: the options' own
    assert process_group_options(ctas=4, timeout=short)._timeout == short
    for bad in (42, datetime.timedelta(0), "1m"):
        with pytest.raises(UsageError, match="timeout must be a positive datetime.timedelta or None, not"):
            options(dist, "high", None, timeout=bad)
