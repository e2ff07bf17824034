"""A policy's process group under DDP (shimrt.torch.groups), on the CPU: real DDPs over gloo moved
between process groups step by step, against a plain DDP copy."""

from __future__ import annotations

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


def test_a_ddp_whose_all_reduces_cannot_move_is_said_why(gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from shimrt.torch.groups import moveable
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

    from shimrt.torch.groups import use
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
    for bad in (0, -1, float("inf"), "5"):
        with pytest.raises(UsageError, match="timeout must be a finite positive number"):
            Groups(dist, dist.group.WORLD, bad)


@pytest.mark.parametrize("ctas", [0, 65, 1.5, True])
def test_process_group_options_check_ctas_before_anything_else(ctas):
    """A bad NCCL channel count is named whether or not this torch has NCCL."""
    pytest.importorskip("torch")
    from shimrt.torch import process_group_options
    with pytest.raises(UsageError, match="ctas must be an int in 1..64"):
        process_group_options(ctas=ctas)
