"""Which clock each way of a bench torch run ran at: the GPU's samples (``gpu_run.sh ddp`` writes
them, nvidia-smi four times a second) matched to each way's timed steps by the host's clock.

    python scripts/clocks_by_way.py OUT/torch_ddp.json OUT/gpu_clocks.csv

Per configuration and way: its mean step (ms, slowest rank), and over the samples taken while its
timed steps ran the SM clock (MHz, mean and least), board power (W), temperature (C), and the
throttle reasons NVML reported (``clocks_event_reasons.active``: a bit mask, named below), so
that plain DDP's two speeds can be told apart from a clock that fell (power or thermal limits).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import statistics
import sys

# nvml.h's nvmlClocksEventReason* bits.
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown", 0x10: "sync boost",
           0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake", 0x100: "display clocks"}


def samples(path: str) -> list[dict]:
    """nvidia-smi's CSV rows (header names as given, units dropped), each with ``t`` (epoch s)."""
    out = []
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = [h.strip().split(" [")[0] for h in next(rows)]
        for row in rows:
            if len(row) != len(header):
                continue  # a line nvidia-smi cut off when it was stopped
            d = dict(zip(header, (v.strip() for v in row), strict=True))
            local = datetime.datetime.strptime(d["timestamp"], "%Y/%m/%d %H:%M:%S.%f")
            d["t"] = local.timestamp()  # nvidia-smi prints the machine's local time
            out.append(d)
    return out


def reasons(mask_text: str) -> str:
    mask = int(mask_text, 16)
    return "+".join(n for b, n in REASONS.items() if mask & b) or "none"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_json")
    p.add_argument("clocks_csv")
    a = p.parse_args()
    with open(a.bench_json) as f:
        bench = json.load(f)
    rows = samples(a.clocks_csv)
    if not rows:
        sys.exit(f"{a.clocks_csv}: no samples")
    print(f"{'configuration / way':42s} {'mean ms':>8s} {'SM MHz':>7s} {'least':>6s} {'W':>6s} {'C':>4s}  throttled by")
    for config, r in bench["configs"].items():
        for way, e in r["ways"].items():
            if "timed_between" not in e:
                continue
            t0, t1 = e["timed_between"]
            inside = [s for s in rows if t0 <= s["t"] <= t1]
            label = f"{config} / {way}"
            ms = statistics.fmean(e["steps_ms"]) if e.get("steps_ms") else float("nan")
            if not inside:
                print(f"{label:42s} {ms:8.2f}  no sample in its {t1 - t0:.2f} s")
                continue
            sm = [float(s["clocks.sm"]) for s in inside]
            watts = statistics.fmean(float(s["power.draw"]) for s in inside)
            temp = statistics.fmean(float(s["temperature.gpu"]) for s in inside)
            why = sorted({reasons(s["clocks_event_reasons.active"]) for s in inside})
            print(f"{label:42s} {ms:8.2f} {statistics.fmean(sm):7.0f} {min(sm):6.0f} {watts:6.0f} {temp:4.0f}  "
                  f"{', '.join(why)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
