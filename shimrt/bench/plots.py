"""Draw PNG plots of overlap benchmark results: per-SM block timelines and makespans per policy.

Reads the results of the overlap benchmark (schema ``shimrt.bench.overlap/1``, checked by
:mod:`shimrt.bench.results`) and writes
makespan.png (one panel per workload: the makespan of each policy beside T_comp + T_comm and
max(T_comp, T_comm)) and timeline_<workload>.png (one panel per policy: every thread block as a
bar on its SM, compute and communication in two colors). Needs matplotlib:
pip install 'shimrt[plot]'.
"""

from __future__ import annotations

import argparse
import math
import re
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .. import cli
from ..errors import ShimrtError
from ..validate import argument
from .results import load, validate

__all__ = ["write_all", "new_figure", "save_png", "add_arguments", "run"]

# Panels follow the order in which the controls build on one another; unknown policies go last.
POLICIES = ("sequential", "concurrent", "priority", "shaping", "shaping+priority", "partition", "auto")
DPI = 100
COMPUTE_COLOR, COMM_COLOR = "#4C72B0", "#E8642B"
# Figure sizes in inches; fixed per layout so that the pixel size of a PNG is predictable.
TIMELINE_WIDTH, TIMELINE_PANEL, TIMELINE_EXTRA = 12.0, 2.2, 0.9
MAKESPAN_PANEL_HEIGHT, MAKESPAN_EXTRA, MAKESPAN_COLUMNS = 4.5, 0.9, 3


def workloads(results: Any) -> list[str]:
    """The workload labels of ``results``, in order of first appearance."""
    return list(dict.fromkeys(run["workload"] for run in results["runs"]))


def slug(workload: str) -> str:
    """A safe file-name part for a workload label: 'sgemm-4096 + all_reduce-64MiB' -> 'sgemm-4096_all_reduce-64MiB'."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", workload).strip("_.") or "workload"


def timeline_png(results: Any, workload: str, path: Any) -> Path:
    """Write the block timeline of one workload: a panel per policy, SM id against time in ms.

    Each thread block is a horizontal bar on its SM from its start to its end, compute in blue and
    communication in orange (drawn on top, at least 2 pt thick). Panels share the time axis. Returns
    the path.
    """
    validate(results)
    runs = _runs_of(results, workload)
    figure = new_figure(TIMELINE_WIDTH, TIMELINE_EXTRA + TIMELINE_PANEL * len(runs))
    from matplotlib.collections import LineCollection, PolyCollection
    from matplotlib.lines import Line2D

    blocks = [(run, _blocks(run, "compute"), _blocks(run, "comm")) for run in runs]
    end = max([b[:, 1].max() for _, *kinds in blocks for b in kinds if len(b)] + [run["metrics"]["makespan_ms"]
                                                                                     for run in runs])
    sms = (results.get("device") or {}).get("num_sms")
    rows = int(sms or max([b[:, 2].max() + 1 for _, *kinds in blocks for b in kinds if len(b)] + [1]))
    # Compute blocks fill their SM's row exactly (in data units), so a full SM reads as a solid area.
    # The few communication blocks are lines at least 2 pt thick on top, or they vanish among thousands.
    comm_pt = max(2.0, 0.6 * (TIMELINE_PANEL - 0.5) * 72 / rows)
    axes = figure.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (run, compute, comm) in zip(axes, blocks, strict=True):
        s, e, sm = compute.T
        rects = np.stack([np.c_[s, sm - 0.5], np.c_[e, sm - 0.5], np.c_[e, sm + 0.5], np.c_[s, sm + 0.5]], axis=1)
        # matplotlib's stubs ask for a Sequence; an (n, 4, 2) array is set_verts' own fast path.
        ax.add_collection(PolyCollection(rects, facecolors=COMPUTE_COLOR,  # type: ignore[arg-type, unused-ignore]
                                         edgecolors="none", antialiased=False))
        segments = np.stack([comm[:, [0, 2]], comm[:, [1, 2]]], axis=1)  # (n, 2 ends, (t, sm))
        ax.add_collection(LineCollection(segments, colors=COMM_COLOR,  # type: ignore[arg-type, unused-ignore]
                                         linewidths=comm_pt, capstyle="butt"))  # an array, as above
        ax.set_xlim(0, end * 1.01 or 1)
        ax.set_ylim(-0.5, rows - 0.5)
        ax.set_ylabel("SM")
        ax.set_title(f"{run['policy']}: makespan {run['metrics']['makespan_ms']:.3f} ms   ({_choice(run)})"
                     f"{sampled_note(run)}", loc="left", fontsize=10)
    axes[-1].set_xlabel("time since the first block started (ms)")
    handles = [Line2D([], [], color=COMPUTE_COLOR, lw=6, label="compute block"),
               Line2D([], [], color=COMM_COLOR, lw=6, label="communication block")]
    figure.legend(handles=handles, loc="outside upper right", ncols=2, frameon=False)
    # Wrapped so that a long label leaves room for the legend at the right.
    figure.suptitle(textwrap.fill(f"{workload}: thread blocks per SM{_where(results)}", 80), x=0.01, ha="left")
    return save_png(figure, path)


def makespan_png(results: Any, path: Any) -> Path:
    """Write makespans: a panel per workload with a bar per policy, marked with T_comp + T_comm
    (no overlap) and max(T_comp, T_comm) (perfect overlap), each bar labelled with its reduction
    against sequential execution. Returns the path."""
    validate(results)
    names = workloads(results)
    policies = _ordered({run["policy"] for run in results["runs"]})
    columns = min(len(names), MAKESPAN_COLUMNS)
    rows = math.ceil(len(names) / columns)
    figure = new_figure(columns * _makespan_panel_width(len(policies)), MAKESPAN_EXTRA + rows * MAKESPAN_PANEL_HEIGHT)
    from matplotlib.lines import Line2D

    colors = _policy_colors(policies)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, name in zip(axes, names, strict=False):
        runs = _runs_of(results, name)
        x = range(len(runs))
        makespans = [run["metrics"]["makespan_ms"] for run in runs]
        ax.bar(x, makespans, width=0.7, color=[colors[run["policy"]] for run in runs])
        summed = [run["metrics"]["t_comp_ms"] + run["metrics"]["t_comm_ms"] for run in runs]
        limit = [max(run["metrics"]["t_comp_ms"], run["metrics"]["t_comm_ms"]) for run in runs]
        ax.hlines(summed, [i - 0.42 for i in x], [i + 0.42 for i in x], colors="black", linestyles="--", lw=1.3)
        ax.hlines(limit, [i - 0.42 for i in x], [i + 0.42 for i in x], colors="black", linestyles=":", lw=1.6)
        model = model_ms(results, name)
        if model is not None:  # the occupancy model's estimate: a line across the panel
            ax.axhline(model, color="tab:red", ls="-.", lw=1.1)
        top = max(makespans + summed)
        for i, run in enumerate(runs):
            ax.annotate(_reduction(run), (i, max(makespans[i], summed[i])), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, top * 1.15)
        ax.set_xticks(list(x), [run["policy"] for run in runs], rotation=30, ha="right", rotation_mode="anchor")
        ax.set_ylabel("makespan (ms)")
        ax.set_title(textwrap.fill(name, 40), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    # Policies are named under their bars; the legend explains only the marks and the labels.
    handles = [Line2D([], [], color="black", ls="--", lw=1.3, label="T_comp + T_comm (sequential sum)"),
               Line2D([], [], color="black", ls=":", lw=1.6, label="max(T_comp, T_comm) (limit)"),
               Line2D([], [], ls="none", label="over bars: makespan change vs sequential")]
    if any(model_ms(results, name) is not None for name in names):
        handles.insert(2, Line2D([], [], color="tab:red", ls="-.", lw=1.1, label="occupancy model's estimate"))
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles) if figure.get_figwidth() >= 9 else 1,
                  frameon=False, fontsize=9)
    figure.suptitle(f"Makespan per policy{_where(results)}", x=0.01, ha="left")
    return save_png(figure, path)


def write_all(results: Any, out_dir: Any) -> list[Path]:
    """Write makespan.png and one timeline_<slug>.png per workload into ``out_dir``; return the paths."""
    validate(results)
    for run in results["runs"]:  # every timeline readable before any file is written
        for kind in ("compute", "comm"):
            _blocks(run, kind)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [makespan_png(results, out / "makespan.png")]
    used = set()
    for name in workloads(results):
        base = stem = f"timeline_{slug(name)}"
        n = 1
        while stem in used:  # two labels that differ only in punctuation must not overwrite each other
            n += 1
            stem = f"{base}-{n}"
        used.add(stem)
        paths.append(timeline_png(results, name, out / f"{stem}.png"))
    return paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``bench plot``."""
    p.add_argument("results", metavar="RESULTS.json", help="results of the overlap benchmark (its --json)")
    p.add_argument("--out", metavar="DIR", type=argument(cli.writable_folder, "--out"),
                   help="folder for the PNGs, made if missing (default: the folder of RESULTS.json)")
    p.set_defaults(run=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The results are read and checked, and the folder the PNGs go to (RESULTS.json's own by
    default), before anything is drawn."""
    args.loaded = load(args.results)
    if args.out is None:
        args.out = cli.writable_folder(str(Path(args.results).parent), "the folder of RESULTS.json (--out)")


def run(args: argparse.Namespace) -> int:
    """``bench plot``: write the PNGs, print their paths."""
    for path in write_all(args.loaded, args.out):
        print(path)
    return 0


def new_figure(width: float, height: float):
    """A Figure rendered through Agg. No pyplot: it would keep every figure alive in its registry and
    switch the process's backend, and a library should do neither."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ShimrtError(f"plots need matplotlib ({exc}): pip install 'shimrt[plot]'") from None
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def save_png(figure, path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)  # --plots may name a folder not made yet
    figure.savefig(path, dpi=DPI, format="png")
    return path


def model_ms(results, workload: str) -> float | None:
    """The occupancy model's makespan for a workload (results from before it was reported: None)."""
    for s in results.get("summary", []):
        if s.get("workload") == workload and isinstance(s.get("model_ms"), (int, float)):
            return float(s["model_ms"])
    return None


def _runs_of(results, workload: str) -> list[dict]:
    runs = [run for run in results["runs"] if run["workload"] == workload]
    if not runs:
        raise ShimrtError(f"no runs of workload {workload!r}; the results have {', '.join(workloads(results))}")
    order = _ordered({run["policy"] for run in runs})
    return sorted(runs, key=lambda run: order.index(run["policy"]))


def _ordered(policies) -> list[str]:
    return [p for p in POLICIES if p in policies] + sorted(set(policies) - set(POLICIES))


def _policy_colors(policies) -> dict:
    """The same color for a policy in every panel and every file (tab10 by canonical order)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    extra = [p for p in policies if p not in POLICIES]
    return {p: cmap((POLICIES.index(p) if p in POLICIES else len(POLICIES) + extra.index(p)) % 10)
            for p in policies}


def _makespan_panel_width(policies: int) -> float:
    return max(4.0, 0.6 * policies + 1.2)


def _blocks(run: dict, kind: str):
    """The (start_ms, end_ms, sm) rows of one kind of block of a run, as an (n, 3) float array."""
    timeline = run.get("timeline")
    if not isinstance(timeline, dict) or kind not in timeline:
        raise ShimrtError(f"run ({run['workload']}, {run['policy']}) has no timeline.{kind}")
    try:
        rows = np.asarray(timeline[kind], dtype=float)
    except (TypeError, ValueError):
        rows = None
    if rows is not None and rows.size == 0:
        return np.empty((0, 3))
    if rows is None or rows.ndim != 2 or rows.shape[1] != 3:
        raise ShimrtError(f"run ({run['workload']}, {run['policy']}): timeline.{kind} is not a list of "
                          "[start_ms, end_ms, sm]")
    return rows


def sampled_note(run: dict) -> str:
    """A note when the timeline holds an even sample of the blocks rather than all of them."""
    total, kept = run.get("timeline_blocks") or {}, run.get("timeline") or {}
    parts = [f"{len(kept.get(k, []))} of {n} {k} blocks" for k, n in total.items() if n > len(kept.get(k, []))]
    return f"   [shown: {', '.join(parts)}]" if parts else ""


def _choice(run: dict) -> str:
    """The run's settings in words (the benchmark's own description when it wrote one)."""
    if run.get("describe"):
        return run["describe"]
    c = run.get("choice") or {}
    parts = []
    if c.get("resident_blocks") is not None:
        parts.append(f"{c['resident_blocks']} compute block(s)/SM")
    if c.get("partition_sms") is not None:
        parts.append(f"{c['partition_sms']} SMs for communication")
    if c.get("comm_priority"):
        parts.append(f"comm priority {c['comm_priority']}")
    if c.get("comm_blocks") is not None or c.get("comm_threads") is not None:
        parts.append(f"comm {c.get('comm_blocks') or 'default'} blocks x {c.get('comm_threads') or 'default'} threads")
    return ", ".join(parts) or "no settings recorded"


def _reduction(run: dict) -> str:
    m = run["metrics"]
    r = m.get("reduction")
    if r is None:
        r = 1 - m["makespan_ms"] / (m["t_comp_ms"] + m["t_comm_ms"])
    text = f"{-r:+.0%}"
    return "0%" if text in ("+0%", "-0%") else text


def _where(results) -> str:
    device = (results.get("device") or {}).get("name")
    comm = results.get("comm")
    parts = [p for p in (device, comm and f"comm: {comm}") if p]
    return f" ({', '.join(parts)})" if parts else ""
