"""auto's decisions replayed on step times a bench torch run recorded (a diagnostic, not a test).

Each configuration's trial and check times (``--json`` of ``bench torch`` with one process per
rank, the slowest rank's) go through :class:`shimrt.torch.trials.Trials` as it is now, stage by
stage, and what it would keep is printed beside what the run kept. Only the stages the run made
are replayed: where the run kept plain DDP without a check, or its check measured another pair,
the replay has no check times to give and says so. The times are rank 0's (``ov.report()`` on
rank 0), while the run decided on the ranks' slowest means, so a close call can go the other way.
Times, not a run: what a different pick would have run at is not in the file.

    python scripts/replay_trials.py docs/data/torch_ddp_h100_6d87e95.json
"""

from __future__ import annotations

import argparse
import json

from shimrt.torch.policies import Auto
from shimrt.torch.trials import Trials, how_held


class Named:
    def __init__(self, name: str):
        self.name = name


def replay(trials: dict, rounds: int, check_steps: int) -> str:
    names = trials["candidates"]
    check = trials.get("check") or {}
    # a check in blocks (Auto()'s default since b0f05c9) is replayed as one: its block, checked
    # always, run to as many rounds as Auto() allows
    block = check.get("block", 1)
    blocks = dict(check_block=block, check_always=True, check_most=Auto(check_steps=check_steps).most_check_rounds) \
        if block > 1 else {}
    # a guard (since auto's guard) is replayed where the run ran one, on its own times (untimed
    # lead-in steps cost nothing here)
    # and so is the reference's own guard, after a check that gave way (since e888d1f's run)
    guard = check.get("guard") or {}
    ref_alone = check.get("reference_alone") or {}
    # visits in blocks and candidates dropped after the first round (since 87ff11c), as the run made them
    t = Trials([Named(n) for n in names], steps=rounds, warmup=0, block=trials.get("block", 1), drop=trials.get("drop"),
               margin=trials["margin"], reference=trials["reference"], check=check_steps,
               guard=guard.get("steps", ref_alone.get("steps", 0)), **blocks)
    queues = {n: list(v) for n, v in trials["times_ms"].items()}
    check_queues = {n: list(v) for n, v in (check.get("times_ms") or {}).items()}
    guard_queue = {check.get("policy"): list(guard.get("times_ms") or []),
                   trials["reference"]: list(ref_alone.get("times_ms") or [])}
    while t.picked is None:
        while not t.exhausted:
            p, _ = t.schedule[t.position]
            index = t.done(True)
            source = guard_queue if t.guarding is not None else check_queues if t.checking is not None else queues
            if not source.get(p.name):
                if source is check_queues and check.get("policy") == getattr(t.checking, "name", None):
                    return (f"its check of {t.checking.name} runs on past the {check.get('rounds_run', 0)} rounds the "
                            "run recorded (the visits cannot tell yet): no times to go on with")
                return f"no recorded time for {p.name} at this stage: the run took another path"
            t.record(index, source[p.name].pop(0))
        t.decide()
    said = f"keeps {t.picked.name}"
    if t.check:
        said += f" (check of {t.check['policy']}: {how_held(t.check)})"
    return said


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("json")
    p.add_argument("--rounds", type=int, default=3, help="the run's --trial-steps (default 3)")
    p.add_argument("--check-steps", type=int, default=4)
    args = p.parse_args()
    with open(args.json) as f:
        run = json.load(f)
    for name, config in run["configs"].items():
        auto = config["ways"].get("auto") or {}
        trials = auto.get("trials")
        if not trials:
            continue
        print(f"{name}: the run kept {auto.get('kept')}; replayed now: "
              f"{replay(trials, args.rounds, args.check_steps)}")


if __name__ == "__main__":
    main()
