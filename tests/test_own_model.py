"""scripts/own_model.py's arguments refused before any GPU or rank is touched (its reading of blocks
timed in turn is shimrt.bench.in_turn's: tests/test_in_turn.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "own_model.py"


def test_a_negative_block_or_no_round_is_refused_before_any_gpu_or_rank_is_touched():
    pytest.importorskip("torch")
    counts = "--alternate must be 0 or more and --rounds 1 or more"
    for flags, said in ((["--alternate", "-1"], counts), (["--alternate", "10", "--rounds", "0"], counts),
                        (["--alternate", "10", "--diagnose"], "--diagnose reads the phases one after the other"),
                        (["--against", "kept"], "--against kept sets auto against its kept policy in blocks in turn"),
                        (["--before", "partition:32"], "--before runs pairs in blocks in turn: give --alternate N"),
                        (["--alternate", "6", "--before", "partition:32", "--before-steps", "0"],
                         "--before-steps must be 1 or more (not 0)"),
                        (["--before-steps", "-3"], "--before-steps must be 1 or more (not -3)"),
                        (["--alternate", "6", "--before", "partition:32,bogus:3"], "policy must be")):
        done = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr
