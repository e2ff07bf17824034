"""Where a bench torch run's steps change speed: at the host's synchronisations, or anywhere
(a diagnostic, not a test; docs/ddp.md, "The two speeds switch at host synchronisations").

    python scripts/speed_levels.py OUT/torch_ddp.json [--ways "plain DDP,ddp,..."] [--hold 3]

Plain DDP of two ranks sharing a GPU runs its steps at one of two levels, in stretches. Per
configuration, the two levels are found from the ways named (by default plain DDP's kind: the ways
whose steps run plain DDP's collectives; an auto only where it kept ``ddp``) as the two means of a
split of their steps at the widest gap leaving a fifth of them on either side; a configuration whose
widest such gap is under 5% has no two levels and is left out. A switch is a step at the
other level than the one before, held ``--hold`` steps; it is counted apart where it follows a step
whose loss the host read (``loss_every`` from the JSON, the way's untimed steps before). Printed:
per configuration its levels and every way's spread (with two levels, how many of its steps ran
at the fast one and each level's median: ways set against each other at the same level), its
switches, and the share of steps after a read that switch against the share of the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

#: The ways that run plain DDP's collectives (the autos when they kept ddp).
PLAIN = ("plain DDP", "low-priority", "priority", "ddp", "auto", "auto-steps", "auto-blocks", "plain DDP again")
#: Two levels are split by a gap of at least APART (a share of the time below it), and each holds
#: at least LEAST of the steps.
APART = 0.05
LEAST = 0.2


def levels(times: list[float]) -> tuple[float, float] | None:
    """The two levels of ``times`` (the means below and above the widest gap between sorted
    times that leaves each side :data:`LEAST` of them: a few slow steps are no level), or None
    where that gap is under :data:`APART` (of the time below it)."""
    ordered = sorted(times)
    least = max(1, int(LEAST * len(ordered)))
    if len(ordered) < 2 * least:
        return None
    gap = max(range(least, len(ordered) - least + 1), key=lambda i: ordered[i] - ordered[i - 1])
    if ordered[gap] - ordered[gap - 1] <= APART * ordered[gap - 1]:
        return None  # no gap of APART between them: a spread, not two levels
    low, high = ordered[:gap], ordered[gap:]
    return sum(low) / len(low), sum(high) / len(high)


def _median(times: list[float]) -> float:
    return statistics.median(times) if times else float("nan")


def _spread(times: list[float], threshold: float | None) -> dict:
    """``times``' median, fastest and slowest step (NaN, a step that failed, left out), and where
    the configuration has two levels (``threshold``: the midpoint between them), how many of its
    steps ran at the fast one and the median of each level's steps: a way set against another at
    the same level."""
    kept = sorted(t for t in times if t == t)
    out = {"median": _median(kept), "fastest": kept[0], "slowest": kept[-1], "steps": len(kept)}
    if threshold is not None:
        fast, slow = [t for t in kept if t <= threshold], [t for t in kept if t > threshold]
        out.update(fast=len(fast), fast_median=_median(fast), slow_median=_median(slow))
    return out


def switches(times: list[float], threshold: float, hold: int) -> list[int]:
    """The indices where ``times`` cross ``threshold`` and stay on the new side ``hold`` steps."""
    side = [t > threshold for t in times]
    return [i for i in range(1, len(side)) if side[i] != side[i - 1]
            and all(side[j] == side[i] for j in range(i, min(len(side), i + hold)))]


def analyse(result: dict, ways: tuple[str, ...] = PLAIN, hold: int = 3) -> dict:
    """Per configuration of a bench torch JSON: its levels, and each way's switches with whether
    each follows a loss read; in all, switches and steps after a read and elsewhere."""
    out: dict = {"configs": {}, "after_read": [0, 0], "elsewhere": [0, 0],  # [switches, steps]
                 "spread": {},  # per configuration: (its levels or None, fastest, median, slowest step, every)
                 "by_way": {}}  # per configuration, every way's spread (:func:`_spread`): paced's too
    for name, config in result.get("configs", {}).items():
        every = config.get("loss_every") or 0
        present = {w: e for w, e in config.get("ways", {}).items() if w in ways and e.get("steps_ms")
                   and (not w.startswith("auto") or e.get("kept") == "ddp")}  # an auto runs what it kept
        times = sorted(t for e in present.values() for t in e["steps_ms"] if t == t)
        found = levels(times)
        threshold = None if found is None else sum(found) / 2
        out["by_way"][name] = {w: _spread(e["steps_ms"], threshold) for w, e in config.get("ways", {}).items()
                               if any(t == t for t in e.get("steps_ms") or [])}
        if times:
            out["spread"][name] = (found, times[0], times[len(times) // 2], times[-1], every)
        if threshold is None or not every:
            continue
        mine: dict = {"levels_ms": found, "ways": {}}
        for way, e in present.items():
            before = e.get("untimed_steps", 0)
            after = [(before + i) % every == 0 for i in range(len(e["steps_ms"]))]
            at = switches(e["steps_ms"], threshold, hold)
            mine["ways"][way] = [(i, after[i]) for i in at]
            for i in range(1, len(after)):
                key = "after_read" if after[i] else "elsewhere"
                out[key][1] += 1
                out[key][0] += i in at
        out["configs"][name] = mine
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json", help="bench torch --json's file (one process per rank)")
    p.add_argument("--ways", default=",".join(PLAIN), help="the ways to read, comma-separated")
    p.add_argument("--hold", type=int, default=3, help="steps a switch must hold (default 3)")
    args = p.parse_args(argv)
    try:
        with open(args.json) as f:
            result = json.load(f)
    except (OSError, ValueError) as exc:
        print(f"speed_levels.py: cannot read {args.json}: {exc}", file=sys.stderr)
        return 2
    if args.hold < 1:
        print(f"speed_levels.py: --hold must be 1 or more, not {args.hold}", file=sys.stderr)
        return 2
    out = analyse(result, tuple(w.strip() for w in args.ways.split(",") if w.strip()), args.hold)
    for name, (found, fastest, median, slowest, every) in out["spread"].items():
        level = "one level" if found is None else f"two levels ({found[0]:.2f} and {found[1]:.2f} ms)"
        read = ("the loss read every step" if every == 1 else f"the loss read every {every} steps" if every
                else "the loss never read")
        print(f"{name}: {level}, steps {fastest:.2f}-{slowest:.2f} ms (median {median:.2f}), {read}")
        for way, s in out["by_way"].get(name, {}).items():
            said = f"  {way:22s} median {s['median']:.2f} ms, steps {s['fastest']:.2f}-{s['slowest']:.2f}"
            if "fast" in s:
                said += (f"; {s['fast']} of {s['steps']} at the fast level (median {s['fast_median']:.2f}), "
                         f"the slow's median {s['slow_median']:.2f}")
            print(said)
    for name, c in out["configs"].items():
        low, high = c["levels_ms"]
        print(f"{name}: switches between {low:.2f} and {high:.2f} ms")
        for way, at in c["ways"].items():
            said = ", ".join(f"{i}{' (after a read)' if after else ''}" for i, after in at) or "none"
            print(f"  {way:22s} switches at {said}")
    (a, na), (e, ne) = out["after_read"], out["elsewhere"]
    if na or ne:
        print(f"switches on {a} of {na} steps after a loss read ({a / max(na, 1):.0%}), on {e} of {ne} others "
              f"({e / max(ne, 1):.1%})")
    else:
        print("no configuration with two levels and a loss read to count switches at")
    return 0


if __name__ == "__main__":
    sys.exit(main())
