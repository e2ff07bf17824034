"""``bench torch``'s tables with one process per rank (:mod:`.torch_ddp` measures): each
configuration's ways set against plain DDP (or plain FSDP2), what each auto kept beside the same
policy fixed, how the goals of issues 41 and 43 stand by the medians and by the means, and a bar
chart per configuration.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..choose import standard_error
from ..torch.policies import FIXED_ONLY
from ..torch.trials import alone_said, how_held

__all__ = ["AUTOS", "REFERENCES", "CUSTOM_WAY", "ONE_BUCKET_WAY", "report", "bars_png", "noise", "in_turn_noise",
           "block_noise"]

#: The goals of the DDP benchmark: auto at least this much below plain DDP on these configurations,
#: never above it (a miss by less than the run's noise, plain DDP's first and last runs apart, is
#: said as such: it is no pass), within this of the best fixed policy.
GOAL_BELOW = {"comm-heavy-1024": 0.03, "link-balanced": 0.15}
#: Where communication can hide (a network link): the best way hides at least this share of the
#: all-reduces alone.
GOAL_HIDDEN = {"link-balanced": 0.5}
GOAL_BEST = 0.02
#: The autos of a run: the way's name -> its Auto options beyond --sms and --trial-steps.
AUTOS: dict[str, dict[str, Any]] = {"auto": {},
                                     "auto-steps": {"check_block": 1, "check_always": False, "trial_block": 1,
                                                    "trial_drop": None}}
#: The ways that are plain DDP (the last under overlap(policy="ddp")): references, set apart in the goals.
REFERENCES = ("plain DDP", "plain DDP again", "ddp")
#: Under ``--fsdp-route both``: ``priority`` again, its collectives through FSDP2's public custom
#: collectives rather than its groups' mesh (what each route costs per step, side by side); no auto
#: runs on it, so it is no fixed way of auto's either.
CUSTOM_WAY = "priority (custom route)"
#: Under ``--one-bucket``: plain DDP with a ``bucket_cap_mb`` that holds every gradient, so that its
#: all-reduce runs once backward has ended (no overlap; a ``bucket_cap_mb`` given caps DDP's first
#: bucket too, so one bucket in all: its JSON row's ``bucket_bytes`` says what DDP made): what a
#: user can run without shimrt where overlapping costs more than it hides. No policy: no fixed way of
#: auto's either, said beside the goals as the ways no auto tries are.
ONE_BUCKET_WAY = "plain DDP, one bucket"
#: The ways said beside the goals, not as the best fixed way: no auto tries them.
UNTRIED = (*FIXED_ONLY, ONE_BUCKET_WAY)


def noise(r: dict) -> float:
    """The run's noise: plain DDP's first and last runs apart, as a share of the first (by the
    means, what a run's total time follows); 0 where either is missing."""
    first, last = r["ways"]["plain DDP"], r["ways"].get("plain DDP again")
    if last is None or any(math.isnan(t) for t in first["steps_ms"] + last["steps_ms"]):
        return 0.0
    a, b = statistics.fmean(first["steps_ms"]), statistics.fmean(last["steps_ms"])
    return abs(a - b) / a


#: Steps per block for :func:`block_noise`: a stretch at one speed outlasts a few steps, so a
#: way's steps are not independent draws; means of blocks of this many are nearer to it.
NOISE_BLOCK = 6


def block_noise(steps_ms: list[float], block: int = NOISE_BLOCK) -> float:
    """The standard error of a way's mean step from the means of its ``block``-step blocks (each
    full block; those steps' own spread where fewer than two fit), as a share of the mean: how far
    the mean of as many steps may move with nothing changed, where steps come in stretches at two
    speeds (plain DDP of ranks sharing a GPU, docs/ddp.md) that one-step noise understates. 0 where
    the steps are missing or NaN."""
    if not steps_ms or any(math.isnan(t) for t in steps_ms):
        return 0.0
    means = [statistics.fmean(steps_ms[i:i + block]) for i in range(0, len(steps_ms) - block + 1, block)]
    return standard_error(means if len(means) > 1 else steps_ms) / statistics.fmean(steps_ms)


def slower(way: dict) -> str:
    """How much longer a way's forward and backward ran than alone, as the table gives it (blank
    where it was not measured: FSDP2, whose forward waits on its all-gathers)."""
    c = way.get("contention")
    return "" if c is None or math.isnan(c) else f"{c:+.1%}"


def report(name: str, r: dict) -> str:
    """Configuration ``name``'s table (each way's median step, mean step and slowest step, the
    share of the all-reduces hidden, how much longer its forward and backward ran than alone,
    ``ov.step()``'s host time per step) and how its goals stand, by the medians and by the means (what a
    run's total time follows: a way whose steps run at two speeds has a median that depends on the
    stretch the run caught). Under ``--fsdp`` the reference is said as plain FSDP2."""
    ways, base = r["ways"], r["ways"]["plain DDP"]["step_ms"]
    means = {w: statistics.fmean(e["steps_ms"]) for w, e in ways.items()}
    loop = f"{r.get('optimizer', 'sgd')}, loss read every {r.get('loss_every') or 'no'} step(s)"
    lines = [f"{name}{' (FSDP2)' if r.get('fsdp') else ''}: "
             f"{r['model']['parameters'] / 1e6:.0f} M parameters, {r['gradient_bytes'] / 2**30:.2f} GiB of "
             f"gradients ({loop}); compute alone {r['compute_ms']:.2f} ms, all-reduces alone {r['comm_ms']:.2f} ms "
             f"(no overlap can beat {max(r['compute_ms'], r['comm_ms']):.2f} ms)"
             + (f"; forward and backward alone {r['compute_span_ms']:.2f} ms (slower: a way's beside its "
                f"all-reduces against that)" if "compute_span_ms" in r else "")
             + (f"; DDP's order allows {r['order_bound']['ms']:.2f} ms at best (the all-reduces alone after "
                f"the forward's {r['order_bound']['forward_ms']:.2f} ms): at most "
                f"{r['order_bound']['hideable']:.1%} of them can hide" if "order_bound" in r else ""),
             f"{'way':24s} {'step ms':>8s} {'mean':>8s} {'slowest':>8s} {'vs DDP':>7s} {'hidden':>7s} {'slower':>7s}"
             "  notes"]
    for way, e in ways.items():
        notes = e.get("failed") or (f"kept {e['kept']} after {e['trial_steps']} trial steps" if way in AUTOS else
                                    f"loss max diff {e['loss_max_diff']:.3g}" if "loss_max_diff" in e else "")
        host = e.get("host_us") or {}
        if host.get("step_us") is not None:
            notes += f"; ov.step() {host['step_us']:.0f} us/step"
        if (e.get("allocator") or {}).get("retries"):  # device-wide waits of torch's own: not the policy's time
            notes += f"; allocator retried {e['allocator']['retries']}x"
        if e.get("unsteady"):
            notes += f"; not steady after {len(e['steady_windows_ms'])} windows"
        if e.get("in_turn"):
            t = e["in_turn"]
            notes += (f"; in turn {t['ratio']:.3f}x (+-{t['ratio_standard_error']:.3f}) plain beside it "
                      f"{t['plain_ms']:.2f}")
            if "unlike_plain" in e and (e.get("kept") == "ddp" or way in REFERENCES):  # a plain job's model
                unlike = e["unlike_plain"]
                notes += f"; its model unlike plain's in {', '.join(unlike)}" if unlike else "; its model as plain's"
        lines.append(f"{way:24s} {e['step_ms']:8.2f} {means[way]:8.2f} {max(e['steps_ms']):8.2f} "
                     f"{e['step_ms'] / base:6.3f}x {e['hidden']:6.1%} {slower(e):>7s}  {notes}")
    if any("timeline" in e for e in ways.values()):
        from .torch_timeline import describe
        lines += ["where rank 0's steps went (torch.profiler, 3 steps after the timed ones):"]
        lines += ["  " + describe(way, e["timeline"]) for way, e in ways.items() if "timeline" in e]
    if ONE_BUCKET_WAY in ways and not any(math.isnan(means[w]) for w in (ONE_BUCKET_WAY, "plain DDP")):
        lines.append(f"its all-reduces after backward, by the means: {ONE_BUCKET_WAY} {means[ONE_BUCKET_WAY]:.2f} ms, "
                     f"{means[ONE_BUCKET_WAY] / means['plain DDP']:.3f}x plain DDP; compute alone and the "
                     f"all-reduces alone add up to {r['compute_ms'] + r['comm_ms']:.2f}")
    if CUSTOM_WAY in ways and "priority" in ways:
        lines.append(f"the two routes, by the means: priority {means['priority']:.2f} ms over FSDP2's groups' mesh, "
                     f"{means[CUSTOM_WAY]:.2f} over its custom collectives "
                     f"({means[CUSTOM_WAY] / means['priority']:.3f}x)")
    autos = [a for a in AUTOS if a in ways and not math.isnan(ways[a]["step_ms"])]
    lines += [kept_line(r, means, a) for a in autos]
    if autos:
        blocks = max(block_noise(ways[w]["steps_ms"]) for w in ("plain DDP", "plain DDP again") if w in ways)
        lines.append(f"noise: plain DDP's first and last runs {noise(r):.1%} apart (by their means); "
                     f"its {NOISE_BLOCK}-step blocks give its mean a standard error of {blocks:.1%}")
    for a in autos:
        lines.append(_goals(name, "medians", {w: e["step_ms"] for w, e in ways.items()}, noise(r), a))
        lines.append(_goals(name, "means", means, noise(r), a))
    lines += _in_turn_lines(name, ways, autos)
    if name in GOAL_HIDDEN:
        hidden = {w: e["hidden"] for w, e in ways.items() if not math.isnan(e["hidden"])}
        if hidden:
            best = max(hidden, key=hidden.__getitem__)
            lines.append(f"goal: the best way hides at least {GOAL_HIDDEN[name]:.0%} of the all-reduces: {best} "
                         f"{hidden[best]:.1%}, {'met' if hidden[best] >= GOAL_HIDDEN[name] else 'NOT met'}")
    text = "\n".join(lines)
    # under --fsdp the reference is plain FSDP2: its rows keep plain DDP's names in the JSON (the
    # scripts read them), and are said as what they are here
    return text.replace("plain DDP", "plain FSDP2").replace("vs DDP", "vs FSDP") if r.get("fsdp") else text


def in_turn_noise(ways: dict) -> float:
    """With ``--in-turn``: how far plain against plain (its first and last ways, each in turn with
    the plain model beside them) reads from 1, the larger of the two; 0 where neither ran."""
    return max((abs(ways[w]["in_turn"]["ratio"] - 1) for w in ("plain DDP", "plain DDP again")
                if (ways.get(w) or {}).get("in_turn")), default=0.0)


def _in_turn_lines(name: str, ways: dict, autos: list[str]) -> list[str]:
    """With ``--in-turn``: the run's noise in turn, the plain model's drift over the configuration
    (what the rounds cancel), and the goals by the ratios in turn."""
    turns = {w: e["in_turn"] for w, e in ways.items() if e.get("in_turn")}
    if not turns:
        return []
    some = next(iter(turns.values()))
    plain = [t["plain_ms"] for t in turns.values()]
    lines = [f"in turn: each way in {some['rounds']} rounds of {some['block']}-step blocks with plain DDP beside it "
             f"(plain, way, way, plain); noise: plain against plain {in_turn_noise(ways):.1%} from 1; plain's own "
             f"mean from {min(plain):.2f} to {max(plain):.2f} ms over the configuration "
             f"({max(plain) / min(plain) - 1:.1%} apart: the drift the rounds cancel)"]
    ratios = dict({w: t["ratio"] for w, t in turns.items()}, **{"plain DDP": 1.0})
    lines += [_goals(name, "ratios in turn", ratios, in_turn_noise(ways), a, "x") for a in autos if a in turns]
    return lines


def kept_line(r: dict, means: dict[str, float], way: str = "auto") -> str:
    """What auto (``way``: one of :data:`AUTOS`) kept beside the same policy fixed in this run (by
    the means), and its check."""
    auto = r["ways"][way]
    kept = auto.get("kept")
    said = f"{way} kept {kept}: {means[way]:.2f} ms"
    if kept in means and not math.isnan(means[kept]):
        said += f"; fixed {kept} in this run {means[kept]:.2f} ms ({way} {means[way] / means[kept]:.3f}x)"
    check = (auto.get("trials") or {}).get("check")
    if check:
        times = ", ".join(f"{n} {t:.2f}" for n, t in check["means_ms"].items())
        blocks = f" in blocks of {check['block']}" if check.get("block") else ""
        if check.get("rounds_run"):
            blocks += f" over {check['rounds_run']} rounds"
        said += (f"; its check{blocks} beside plain DDP: {times} ms, {check['policy']} "
                 f"{how_held(check)}")
        if alone := alone_said(check):
            said += "; " + alone
    return said


def _goals(name: str, by: str, ms: dict[str, float], slack: float, way: str = "auto", unit: str = " ms") -> str:
    """How configuration ``name``'s goals stand by ``ms`` (way -> its step time; NaN for a way that
    failed) for ``way`` (one of :data:`AUTOS`): never above plain DDP (a miss within ``slack``, the
    run's noise, is said as one) and, where the configuration has one, a goal below it (a noise as
    large as that goal makes it no reading). The best fixed way is of those auto tries; a
    fixed-only way (``paced``, ``zero-sm``) or plain DDP in one bucket (no auto tries them) is said
    beside it, as what auto leaves untried. ``unit`` follows each way's figure ("x" for ratios in turn)."""
    auto, base = ms[way], ms["plain DDP"]
    best = min((w for w, t in ms.items() if w not in (*AUTOS, *REFERENCES, *UNTRIED, CUSTOM_WAY)
                and not math.isnan(t)),
               key=ms.__getitem__, default=None)
    below = 1 - auto / base
    said = [f"goals by the {by}: {way} {auto / base:.3f}x plain DDP ({below:+.1%} below); at most 1.00x "
            f"(+{slack:.1%} noise): {_at_most(auto, base, slack)}"]
    if name in GOAL_BELOW:
        goal = GOAL_BELOW[name]
        said.append(f"at least {goal:.0%} below: " + ("NOT met" if below < goal else "met" if slack < goal else
                                                       f"met, but the noise ({slack:.1%}) is as large: no reading"))
    def shown(value: float) -> str:
        return f"{value:.{3 if unit == 'x' else 2}f}{unit}"
    if best is not None:
        said.append(f"within {GOAL_BEST:.0%} of the best fixed way ({best}, {shown(ms[best])}): "
                    f"{'met' if auto <= ms[best] * (1 + GOAL_BEST) else 'NOT met'}")
    said += [f"{w}, which no auto tries, {shown(ms[w])} ({way} {auto / ms[w]:.3f}x)" for w in UNTRIED
             if w in ms and not math.isnan(ms[w])]
    return "; ".join(said)


def _at_most(auto: float, base: float, slack: float) -> str:
    """The verdict on "at most 1.00x": met at or below ``base``; above it, by no more than the
    noise ``slack``, a miss the noise could make (said so, never called met); else NOT met."""
    if auto <= base:
        return "met"
    return "NOT met, within the noise" if auto <= base * (1 + slack) else "NOT met"


def bars_png(name: str, r: dict, path: Any) -> Any:
    """A bar per way (step ms), with compute alone, all-reduces alone and their sum drawn across."""
    from .plots import new_figure, save_png
    ways = [w for w, e in r["ways"].items() if not math.isnan(e["step_ms"])]
    figure = new_figure(max(6, 0.6 * len(ways) + 2), 4)
    ax = figure.add_subplot()
    ax.bar(range(len(ways)), [r["ways"][w]["step_ms"] for w in ways], color="tab:blue")
    for y, label, style in ((r["compute_ms"], "compute alone", "--"), (r["comm_ms"], "all-reduces alone", ":"),
                            (r["compute_ms"] + r["comm_ms"], "compute + all-reduces", "-.")):
        ax.axhline(y, color="black", linestyle=style, linewidth=1, label=label)
    ax.set_xticks(range(len(ways)), ways, rotation=45, ha="right")
    ax.set_ylabel("step time (ms), slowest rank")
    ax.set_title(f"bench torch, DDP: {name}")
    ax.legend(fontsize=8)
    return save_png(figure, path)
