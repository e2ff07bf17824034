"""FSDP2 under shimrt.torch.overlap (shimrt.torch.fsdp), on the CPU: real fully_shard models over
gloo, their groups moved between process groups step by step, against a plain FSDP2 copy."""

from __future__ import annotations

import pytest

#: The collectives each of the two groups took (first+second): 4 FSDP2 groups, 8 steps, steps 0, 2 and
#: 4 on the first group, 1, 3, 5, 6 and 7 on the second (the first destroyed before step 6); each
#: group all-gathers twice a step (forward, then backward after its reshard) and reduce-scatters once.
CALLS = "calls all_gather 24+40 reduce_scatter 12+20"


def _two_ranks(gloo_ranks, *argv: str) -> list[str]:
    torch = pytest.importorskip("torch")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard)")
    return gloo_ranks("fsdp_ranks.py", *argv)


def test_an_fsdp2_model_moved_between_groups_trains_as_plain_fsdp2_bit_for_bit(gloo_ranks):
    """Two ranks: every group's all-gathers and reduce-scatters change process group each step,
    then the first group is destroyed and training goes on through the second alone (each
    collective's group counted at torch's function); the parameters end as a plain FSDP2 copy's,
    bit for bit (the root holds no parameters: 4 groups)."""
    for rank, line in enumerate(_two_ranks(gloo_ranks)):
        assert line == f"rank {rank}: {CALLS}; fsdp True groups 4 moveable None diff 0.0", line


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


def test_the_custom_route_trains_as_plain_fsdp2_bit_for_bit(gloo_ranks):
    """The same steps, the groups moved through FSDP2's public set_custom_all_gather and
    set_custom_reduce_scatter (shimrt.torch.fsdp.install): shimrt's collectives run on the group it
    sets, whatever group FSDP2 passes; after the first group is destroyed, training goes on through
    the second, and the parameters end as plain FSDP2's, bit for bit. A model with an all-gather
    of its user's is refused, naming it, with nothing changed; uninstall puts FSDP2's own back."""
    torch = pytest.importorskip("torch")
    from torch.distributed.fsdp import FSDPModule
    if not hasattr(FSDPModule, "set_custom_all_gather"):
        pytest.skip(f"torch {torch.__version__}'s FSDP2 has no set_custom_all_gather")
    for rank, line in enumerate(_two_ranks(gloo_ranks, "custom")):
        assert line == (f"rank {rank}: refused (True, DefaultAllGather) restored DefaultAllGather,"
                        f"DefaultReduceScatter; {CALLS}; fsdp True groups 4 moveable None diff 0.0"), line


def test_overlap_refuses_an_unknown_fsdp_route_before_anything_else():
    pytest.importorskip("torch")
    from shimrt import UsageError
    from shimrt.torch import overlap
    with pytest.raises(UsageError, match="fsdp_route must be one of mesh, custom, not 'tree'"):
        overlap(object(), "ddp", fsdp_route="tree")


def test_fsdp2_prefetching_ahead_trains_as_plain_fsdp2_bit_for_bit(gloo_ranks):
    """The same moves with FSDP2's explicit prefetch set between steps (2 modules ahead, then the
    user's own list back, then 1, then the user's again: shimrt.torch.fsdp.prefetch,
    held_prefetch, restore_prefetch): every collective once, as without, and the parameters as
    plain FSDP2's, bit for bit."""
    # each block's (forward, backward) prefetch list lengths, as FSDP2 holds them after each change
    held = "prefetch 20,21,12,02 10,00,00,00 10,11,11,01 10,00,00,00"
    for rank, line in enumerate(_two_ranks(gloo_ranks, "prefetch")):
        assert line == f"rank {rank}: {held}; {CALLS}; fsdp True groups 4 moveable None diff 0.0", line


def test_fsdp2_kept_all_gathered_trains_as_plain_fsdp2_bit_for_bit(gloo_ranks):
    """The same moves, on a model whose root holds a fifth layer of its own, with the blocks kept
    all-gathered from forward to backward for steps 0-2 and 5-7 (shimrt.torch.fsdp.keep_gathered,
    then reshard_again, then again). Each group's post-forward state (the root's first): k, kept
    gathered; r, resharded. The root reads r before its first forward and k after, as FSDP2 sets it,
    and keep_gathered never changes it (a restore would make it r). Kept steps all-gather each
    block once, not twice: first+second 4x(1+1+2) + 3 and 4x(1+2+1+1+1) + 5 with the root's one a
    step; the reduce-scatters are as without (5 groups); the parameters end as plain FSDP2's, bit
    for bit. gathered_bytes: the 4 blocks' parameters, whole, in float32 (not the root's)."""
    bytes_ = 4 * (32 * 32 + 32) * 4
    for rank, line in enumerate(_two_ranks(gloo_ranks, "reshard")):
        assert line == (f"rank {rank}: reshard bytes {bytes_} rkkkk krrrr kkkkk krrrr; calls all_gather 19+29 "
                        "reduce_scatter 15+25; fsdp True groups 5 moveable None diff 0.0"), line


def test_two_fsdp2_models_on_one_mesh_have_the_same_settings_until_a_policys_changes_and_after_they_go(gloo_ranks):
    """shimrt.torch.fsdp.settings (what bench torch --in-turn sets a way's model against the plain
    one by): the same for two models on one mesh; the group, the prefetch lists and the resharding
    told apart while one is moved, prefetches 2 ahead and is kept gathered; the same once each is
    put back."""
    for rank, line in enumerate(_two_ranks(gloo_ranks, "settings")):
        assert line == f"rank {rank}: settings same gathered,groups,prefetch same", line


def test_zero_sm_is_refused_with_the_reason_where_ranks_share_a_gpu():
    """zero-sm's symmetric memory failed in NCCL (invalid usage) with two ranks on one GPU: the
    FSDP2 adapter refuses it there, before any collective, saying why; with one rank per GPU it
    is refused only for the route or this torch's missing parts."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from shimrt.torch import policies
    from shimrt.torch.fsdp import Fsdp, symmetric_refusal
    zero = policies.parse("zero-sm")
    custom = SimpleNamespace(route="custom")  # the one attribute refusal reads
    assert Fsdp.refusal(custom, zero, 2) == ("zero-sm needs NCCL's symmetric memory, which NCCL refused (invalid "
                                             "usage) with 2 ranks on one GPU (NCCL 2.32.3, torch 2.11); it is for "
                                             "one rank per GPU")
    assert Fsdp.refusal(custom, zero, 1) == symmetric_refusal()
    assert "fsdp_route='custom'" in Fsdp.refusal(SimpleNamespace(route="mesh"), zero, 2)
    assert Fsdp.refusal(custom, policies.parse("priority"), 2) is None


def test_fsdp2_refuses_sequential_which_is_a_ddps():
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from shimrt import UsageError
    from shimrt.torch import policies
    from shimrt.torch.fsdp import Fsdp
    said = "sequential all-reduces a DDP's gradients after backward; FSDP2 reduce-scatters each module's as"
    assert Fsdp.refusal(SimpleNamespace(route="mesh"), policies.parse("sequential"), 1).startswith(said)
    Fsdp.after_backward(None, False)  # nothing to put back
    with pytest.raises(UsageError, match=said):
        Fsdp.after_backward(None, True)
