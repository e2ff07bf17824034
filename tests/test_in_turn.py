"""shimrt.bench.in_turn: blocks of two ways timed in turn (plain, way, way, plain per round), and
their reading (bench torch --in-turn, scripts/own_model.py --alternate)."""

import pytest

from shimrt import UsageError
from shimrt.bench.in_turn import ORDER, blocks_reading, reading, run_rounds


def test_blocks_in_turn_give_each_ways_mean_and_the_ratio_per_round():
    # the host slows by 20% from the first round to the second; the way is 10% faster in each
    plain = [100.0, 100.0, 120.0, 120.0]
    way = [90.0, 90.0, 108.0, 108.0]
    out = reading(plain, way)
    assert out["ratios"] == pytest.approx([0.9, 0.9]) and out["ratio"] == pytest.approx(0.9)
    assert out["ratio_standard_error"] == pytest.approx(0.0)
    assert out["plain_ms"] == pytest.approx(110.0) and out["way_ms"] == pytest.approx(99.0)
    assert out["plain_blocks_ms"] == plain and out["way_blocks_ms"] == way  # each block, as it came
    # the standard error over the blocks: stdev 11.547 over sqrt(4)
    assert out["plain_standard_error_ms"] == pytest.approx(5.7735, rel=1e-4)
    # a ratio that moves between rounds: 0.9 and 1.0, mean 0.95, standard error 0.05
    out = reading([100.0, 100.0, 100.0, 100.0], [90.0, 90.0, 100.0, 100.0])
    assert out["ratio"] == pytest.approx(0.95) and out["ratio_standard_error"] == pytest.approx(0.05)


@pytest.mark.parametrize("plain, way", [([], []), ([1.0, 2.0], [1.0]), ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])])
def test_blocks_in_turn_must_come_two_of_each_way_a_round(plain, way):
    with pytest.raises(ValueError, match="two blocks of each way per round"):
        reading(plain, way)


def test_rounds_run_plain_way_way_plain_and_a_drift_within_a_round_cancels():
    """Each block's time grows by 1 ms over the one before (a host slowing steadily): plain's blocks
    and the way's sum alike within each round, so a way as fast as plain reads 1.0 every round."""
    clock = iter(range(100))
    blocks = run_rounds(lambda which: 50.0 + next(clock), 3)
    assert [w for w, _ in blocks] == list(ORDER) * 3
    out = blocks_reading(blocks)
    assert out["ratios"] == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(UsageError, match="rounds must be an int in 1..10000, not 0"):
        run_rounds(lambda which: 1.0, 0)


def test_blocks_are_read_at_the_times_the_ranks_agree_on():
    """agree (the slowest rank's, in bench torch and own_model.py) replaces each block's time before
    the blocks are split by way: here the way's blocks are 10% slower on another rank."""
    blocks = run_rounds(lambda which: 100.0, 2)
    slower_way = [1.1 if w == "way" else 1.0 for w, _ in blocks]
    out = blocks_reading(blocks, lambda ms: [t * f for t, f in zip(ms, slower_way, strict=True)])
    assert out["ratios"] == pytest.approx([1.1, 1.1]) and out["plain_ms"] == pytest.approx(100.0)
    with pytest.raises(ValueError):  # an agree that lost a block
        blocks_reading(blocks, lambda ms: ms[:-1])
