"""CUPTI timelines of one training step per policy, from ``bench torch``'s results (PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plots import new_figure, save_png


def timelines_png(name: str, result: dict, path: Any) -> Path:
    """One row per policy of configuration ``name``: compute kernels above, NCCL's below, in ms
    from the step's first kernel; the step time in the row's label."""
    rows = [(k, e) for k, e in result["policies"].items() if e.get("timeline")]
    figure = new_figure(12, 1.0 + 0.55 * max(len(rows), 1))
    ax = figure.add_subplot()
    for i, (_, entry) in enumerate(rows):
        y = len(rows) - 1 - i
        for lane, comm, color in ((0.22, False, "#4c72b0"), (-0.22, True, "#dd8452")):
            bars = [(start / 1e3, (end - start) / 1e3) for _, start, end, is_comm in entry["timeline"]
                    if is_comm == comm]
            if bars:
                ax.broken_barh(bars, (y + lane - 0.18, 0.36), facecolors=color, linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{k} ({e['step_ms']:.1f} ms)" for k, e in reversed(rows)], fontsize=8)
    ax.set_xlabel("ms from the step's first kernel (upper lane: compute, lower: NCCL)")
    ax.set_title(f"bench torch, {name}: one step per policy (CUPTI)", fontsize=10)
    return save_png(figure, path)
