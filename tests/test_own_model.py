"""scripts/own_model.py's reading of blocks timed in turn (plain, policy, policy, plain per round),
and its arguments refused before any GPU or rank is touched."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "own_model.py"


def test_blocks_in_turn_give_each_ways_mean_and_the_ratio_per_round(script):
    pytest.importorskip("torch")
    m = script("own_model")
    # the host slows by 20% from the first round to the second; the policy is 10% faster in each
    plain = [100.0, 100.0, 120.0, 120.0]
    policy = [90.0, 90.0, 108.0, 108.0]
    out = m.alternated(plain, policy)
    assert out["ratios"] == pytest.approx([0.9, 0.9]) and out["ratio"] == pytest.approx(0.9)
    assert out["ratio_standard_error"] == pytest.approx(0.0)
    assert out["plain_ms"] == pytest.approx(110.0) and out["policy_ms"] == pytest.approx(99.0)
    # the standard error over the blocks: stdev 11.547 over sqrt(4)
    assert out["plain_standard_error_ms"] == pytest.approx(5.7735, rel=1e-4)
    # a ratio that moves between rounds: 0.9 and 1.0, mean 0.95, standard error 0.05
    out = m.alternated([100.0, 100.0, 100.0, 100.0], [90.0, 90.0, 100.0, 100.0])
    assert out["ratio"] == pytest.approx(0.95) and out["ratio_standard_error"] == pytest.approx(0.05)


@pytest.mark.parametrize("plain, policy", [([], []), ([1.0, 2.0], [1.0]), ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])])
def test_blocks_in_turn_must_come_two_of_each_way_a_round(script, plain, policy):
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="two blocks of each way per round"):
        script("own_model").alternated(plain, policy)


def test_a_negative_block_or_no_round_is_refused_before_any_gpu_or_rank_is_touched():
    pytest.importorskip("torch")
    counts = "--alternate must be 0 or more and --rounds 1 or more"
    for flags, said in ((["--alternate", "-1"], counts), (["--alternate", "10", "--rounds", "0"], counts),
                        (["--alternate", "10", "--diagnose"], "--diagnose reads the phases one after the other")):
        done = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr
