"""FSDP2 under shimrt.torch.overlap (shimrt.torch.fsdp), on the CPU: real fully_shard models over
gloo, their groups moved between process groups step by step, against a plain FSDP2 copy."""

from __future__ import annotations

import pytest


def _two_ranks(gloo_ranks, *argv: str) -> list[str]:
    torch = pytest.importorskip("torch")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard)")
    return gloo_ranks("fsdp_ranks.py", *argv)


def test_an_fsdp2_model_moved_between_groups_trains_as_plain_fsdp2_bit_for_bit(gloo_ranks):
    """Two ranks: every group's all-gathers and reduce-scatters change process group each step,
    then the first group is destroyed and training goes on through the second alone; the
    parameters end as a plain FSDP2 copy's, bit for bit (the root holds no parameters: 4 groups)."""
    for rank, line in enumerate(_two_ranks(gloo_ranks)):
        assert line == f"rank {rank}: fsdp True groups 4 moveable None diff 0.0", line


@pytest.mark.parametrize("option, why", [
    ("hsdp", "its HSDP (2-D) mesh"),
    ("offload", "CPU offload"),
])
def test_what_a_policy_cannot_move_under_fsdp2_is_said_why(option, why, gloo_ranks):
    for line in _two_ranks(gloo_ranks, option):
        assert why in line, line


def test_a_plain_module_is_no_fsdp2_module():
    torch = pytest.importorskip("torch")
    from shimrt.torch.fsdp import is_fsdp
    assert not is_fsdp(torch.nn.Linear(2, 2)) and not is_fsdp(object())
