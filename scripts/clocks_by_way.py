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

#: What gpu_run.sh asks nvidia-smi for, in this order (``--fields`` prints it): the CSV is read by
#: position, since nvidia-smi heads a column by the field's full name (``clocks.current.sm`` for
#: ``clocks.sm``), not by the name asked.
FIELDS = ("timestamp", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_event_reasons.active")

# nvml.h's nvmlClocksEventReason* bits.
REASONS = {0x1: "idle", 0x2: "app clocks", 0x4: "SW power cap", 0x8: "HW slowdown", 0x10: "sync boost",
           0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake", 0x100: "display clocks"}


def _number(text: str) -> float:
    """A sample's value; NaN for what nvidia-smi says it cannot read ("[N/A]", "[Not Supported]")."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _mean(values: list[float]) -> float:
    """The mean of the values read (NaN where none was)."""
    read = [v for v in values if v == v]
    return statistics.fmean(read) if read else float("nan")


def samples(path: str) -> list[dict]:
    """nvidia-smi's CSV rows, keyed by :data:`FIELDS` (by position), each with ``t`` (epoch s).
    Rows that are not samples (its header, a line cut off when it was stopped) are left out."""
    out = []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) != len(FIELDS):
                continue
            d = dict(zip(FIELDS, (v.strip() for v in row), strict=True))
            try:
                local = datetime.datetime.strptime(d["timestamp"], "%Y/%m/%d %H:%M:%S.%f")
            except ValueError:
                continue  # the header
            d["t"] = local.timestamp()  # nvidia-smi prints the machine's local time
            out.append(d)
    return out


def reasons(mask_text: str) -> str:
    try:
        mask = int(mask_text, 16)
    except ValueError:
        return "unknown"
    return "+".join(n for b, n in REASONS.items() if mask & b) or "none"


def main() -> int:
    if sys.argv[1:] == ["--fields"]:  # what gpu_run.sh passes to nvidia-smi's --query-gpu
        print(",".join(FIELDS))
        return 0
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
            sm = [v for v in (_number(s["clocks.sm"]) for s in inside) if v == v] or [float("nan")]
            watts = _mean([_number(s["power.draw"]) for s in inside])
            temp = _mean([_number(s["temperature.gpu"]) for s in inside])
            why = sorted({reasons(s["clocks_event_reasons.active"]) for s in inside})
            print(f"{label:42s} {ms:8.2f} {_mean(sm):7.0f} {min(sm):6.0f} {watts:6.0f} {temp:4.0f}  "
                  f"{', '.join(why)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
