"""scripts/speed_levels.py: two levels found in a run's steps, and where the steps switch between them."""

import json


def test_levels_need_a_fifth_of_the_steps_each_and_five_percent_between_them(script):
    m = script("speed_levels")
    assert m.levels([10.0] * 6 + [12.0] * 4) == (10.0, 12.0)
    assert m.levels([10.0] * 9 + [30.0]) is None  # one slow step is no level
    assert m.levels([10.0] * 5 + [10.3] * 5) is None  # 3% apart: one level
    assert m.levels([10.0 + 0.1 * i for i in range(40)]) is None  # a spread, no gap


def test_switches_after_a_loss_read_are_counted_apart(tmp_path, capsys, script):
    m = script("speed_levels")
    # 2 untimed steps, the loss read every 5: timed steps 3, 8, 13 follow a read
    fast, slow = 10.0, 12.0
    steps = [slow] * 3 + [fast] * 5 + [slow] * 5 + [fast, slow, fast] + [fast] * 4
    result = {"configs": {"c": {"loss_every": 5, "ways": {
        "plain DDP": {"steps_ms": steps, "untimed_steps": 2},
        "auto": {"steps_ms": [slow] * 20, "untimed_steps": 2, "kept": "carveout:32"},  # runs carveout: left out
        "carveout:32": {"steps_ms": [fast] * 20, "untimed_steps": 2}}}}}
    out = m.analyse(result)
    # 3 (after a read) and 8 (after a read) switch and hold; 13 is one step alone; 15 holds (not after a
    # read); of steps 1-19, 3, 8, 13 and 18 follow a read
    assert out["configs"]["c"]["ways"] == {"plain DDP": [(3, True), (8, True), (15, False)]}
    assert out["after_read"] == [2, 4] and out["elsewhere"] == [1, 15]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    assert m.main([str(path)]) == 0
    said = capsys.readouterr().out
    assert "switches on 2 of 4 steps after a loss read (50%), on 1 of 15 others (6.7%)" in said
    assert ("c: two levels (10.00 and 12.00 ms), steps 10.00-12.00 ms (median 10.00), the loss read every 5 "
            "steps") in said
    assert out["spread"]["c"] == ((10.0, 12.0), 10.0, 10.0, 12.0, 5)
    # every way's own spread, the ways left out of the levels too (an auto that kept another policy, paced)
    auto, plain = out["by_way"]["c"]["auto"], out["by_way"]["c"]["plain DDP"]
    assert (auto["median"], auto["fast"], auto["steps"]) == (slow, 0, 20) and auto["slow_median"] == slow
    assert (plain["median"], plain["fastest"], plain["slowest"], plain["fast"]) == (fast, fast, slow, 11)
    assert (plain["fast_median"], plain["slow_median"]) == (fast, slow)
    assert ("  carveout:32            median 10.00 ms, steps 10.00-10.00; 20 of 20 at the fast level (median "
            "10.00), the slow's median nan") in said
    # one level: no level counts
    assert "fast" not in m._spread([10.0, 10.1], None) and m._spread([10.0, 10.1], None)["median"] == 10.05
    assert m.main([str(tmp_path / "none.json")]) == 2
