"""scripts/clocks_by_way.py on an nvidia-smi CSV as nvidia-smi writes it (its header names the full
field, clocks.current.sm, not the clocks.sm asked for; [N/A] where it cannot read), matched to a
bench torch result's ways by the host's clock."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "clocks_by_way.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_fields_asked_for_and_the_ways_matched_by_time(tmp_path):
    fields = _run("--fields")
    assert fields.returncode == 0 and fields.stdout.strip().split(",")[:2] == ["timestamp", "clocks.sm"]
    t = 1_800_000_000.0
    bench = {"configs": {"c": {"ways": {"plain DDP": {"timed_between": [t, t + 1.0], "steps_ms": [66.0, 67.0]},
                                        "auto": {"timed_between": [t + 5, t + 6], "steps_ms": [70.0]},
                                        "failed way": {"steps_ms": [float("nan")]}}}}}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    rows = ["timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu, "
            "clocks_event_reasons.active"]
    for i in range(5):
        stamp = datetime.datetime.fromtimestamp(t + 0.25 * i).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        rows.append(f"{stamp}, {1980 - 20 * i}, 2619, {'[N/A]' if i == 1 else 600 + i}, 55, "
                    f"{'0x0000000000000004' if i < 4 else '0x0000000000000040'}")
    rows.append("2026/12/0")  # cut off when the sampler was stopped
    (tmp_path / "c.csv").write_text("\n".join(rows) + "\n")
    run = _run(str(tmp_path / "b.json"), str(tmp_path / "c.csv"))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    plain = next(x for x in lines if x.startswith("c / plain DDP"))
    # 5 samples in its second: SM 1980..1900 (mean 1940, least 1900), power without the [N/A] (602.25)
    assert plain.split()[4:8] == ["66.50", "1940", "1900", "602"], plain
    assert plain.endswith("HW thermal, SW power cap"), plain
    assert next(x for x in lines if x.startswith("c / auto")).endswith("no sample in its 1.00 s")
    assert not any(x.startswith("c / failed way") for x in lines)  # no timed steps: nothing to match
