"""shimrt.torch.overlap on an FSDP2 model (fully_shard) over NCCL, one rank: the policy's group
and streams in force, and the parameters set against a plain FSDP2 copy trained on the same data
(the two-rank runs: bench torch's FSDP2 mode, not yet written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _one_rank(device, policy: str, margin: float = 0.01, steps: int = 12, route: str = "mesh") -> dict:
    torch = pytest.importorskip("torch")
    if device.backend != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA on a CUDA device")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        pytest.skip(f"torch {torch.__version__} has no FSDP2")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SHIMRT_RANK", "SHIMRT_WORLD_SIZE", "SHIMRT_DEVICES"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("fsdp_one_rank.py")), policy, str(margin),
                          str(steps), route], capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_priority_under_fsdp2_moves_its_groups_and_streams_and_trains_as_plain_fsdp2(device):
    """priority: every group on a ProcessGroupNCCL of shimrt's, FSDP2's reduce-scatter stream of
    the greatest priority; one rank's reduction is the identity: bit for bit; once closed, the
    groups are FSDP2's own again."""
    got = _one_rank(device, "priority")
    assert got["policy"] == "priority" and not got["own_group"] and got["own_group_after_close"], got
    assert got["stream_priority"] < -1 and got["diff"] == 0.0, got  # FSDP2's own streams are at -1


@pytest.mark.timeout(300)
def test_the_custom_route_moves_fsdp2s_collectives_through_its_public_api(device):
    """fsdp_route="custom": FSDP2's own mesh untouched, its all-gathers and reduce-scatters run by
    shimrt's custom collectives on the policy's group, bit for bit as plain FSDP2; once closed they
    run on FSDP2's own group again."""
    got = _one_rank(device, "priority", route="custom")
    assert got["policy"] == "priority" and not got["own_group"] and got["own_group_after_close"], got
    assert got["mesh_untouched"] and got["diff"] == 0.0, got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("policy", ["carveout:32", "partition:32", "prefetch:2"])
def test_a_compute_policy_under_fsdp2_trains_as_plain_fsdp2_within_rounding(device, policy):
    got = _one_rank(device, policy)
    assert got["policy"] == policy and got["diff"] <= 1e-5, got


@pytest.mark.timeout(300)
def test_no_reshard_keeps_fsdp2s_blocks_gathered_and_trains_as_plain_fsdp2_bit_for_bit(device):
    """no-reshard: every block (not the root) keeps its parameters all-gathered from forward to
    backward while the policy runs, the same parameters as plain FSDP2's bit for bit; once closed,
    each block reshards after forward again, as fully_shard set it."""
    got = _one_rank(device, "no-reshard")
    assert got["policy"] == "no-reshard" and got["diff"] == 0.0, got
    assert got["gathered"] == "kkk" and got["gathered_after_close"] == "rrr", got


@pytest.mark.timeout(300)
def test_auto_under_fsdp2_keeps_plain_fsdp2_unless_beaten_and_offers_no_window(device):
    """margin 0.5: nothing on one rank is half plain FSDP2's time, so auto keeps the plain job,
    on FSDP2's own groups, with nothing of its trials left; windowed-carveout is dropped, saying why."""
    got = _one_rank(device, "auto", margin=0.5, steps=60)
    assert got["policy"] == "ddp" and got["own_group"] and got["reference"]["mean_ms"] > 0, got
    assert any("no gradient hook" in why for why in got["dropped"].values()), got
    assert got["diff"] <= 1e-5, got
    # the trials ran policies that change each part of the model's FSDP2 state a policy may touch
    tried = set(got["trials"]["candidates"])
    assert {"priority", "no-reshard"} <= tried and any(n.startswith("prefetch:") for n in tried), tried
    # and nothing of them is left: 12 steps after auto kept plain FSDP2, the model's FSDP2 state is
    # the plain copy's (its groups, resharding, prefetch lists, collectives and stream priorities),
    # no group, Interposer or carveout of the trials lives, and torch's BLAS choice is as it was
    assert got["state"] == got["plain_state"], (got["state"], got["plain_state"])
    left = got["left"]
    assert left["nccl_groups"] == 0 and left["interposers_caps"] == [] and left["carveout"] is None, left
    assert left["blas_restored"], left
