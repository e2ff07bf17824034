"""``bench torch``'s results shown: the table of each configuration, and CUPTI timelines of one
training step per policy (PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plots import new_figure, save_png

__all__ = ["timelines_png", "report"]


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


def report(name: str, r: dict) -> str:
    """The table of one configuration and its summary lines."""
    ran = r["policies"]
    base_name = "low-priority" if "low-priority" in ran else next(iter(ran), None)
    comm = r["comm_ms"]["None"]
    lines = [f"== {name}: {r['model']['parameters'] / 1e6:.0f} M parameters ({r['model'].get('weights', 'bfloat16')} "
             f"weights, bf16 compute), {r['model']['tokens']} tokens/step, "
             f"{r['gradient_bytes'] / 2**20:.0f} MiB of gradients in {r['buckets']} buckets; compute alone "
             f"{r['compute_ms']:.2f} ms, all-reduces alone {comm:.2f} ms (ratio {comm / r['compute_ms']:.2f})"]
    if "nccl" in r:
        n = r["nccl"]
        lines.append(f"   NCCL: {n['kernel']}, {n['channels_per_rank']} channels x {n['ranks_on_this_gpu']} ranks "
                     f"on this GPU = {n['blocks_on_this_gpu']} blocks of {n['threads']} threads, "
                     f"{n['registers']} registers, {n['smem']} B smem (one rank per GPU would need "
                     f"{n['channels_per_rank']})")
    if "bound" in r and base_name in ran:
        b, base = r["bound"], ran[base_name]["step_ms"]
        lines.append(f"   bound: no policy keeping DDP's order beats {b['ms']:.2f} ms here (first bucket full at "
                     f"{b['first_bucket_ms']:.2f} ms + every all-reduce back to back at its fastest, "
                     f"{b['comm_ms']:.2f} ms with {_channels(b['channels'])}, + the optimizer's "
                     f"{b['optimizer_ms']:.2f} ms): at most "
                     f"{1 - b['ms'] / base:.1%} below {base_name} ({base:.2f} ms; 20% below would be "
                     f"{0.8 * base:.2f} ms)")
        if "exclusive_ms" in b:
            lines.append(f"   bound if NCCL's blocks never share an SM with compute: {b['exclusive_ms']:.2f} ms "
                         f"({_channels(b['exclusive_channels'])}, {b['exclusive_blocks']} blocks on this GPU): at most "
                         f"{1 - b['exclusive_ms'] / base:.1%} below {base_name}")
    if r.get("sharing"):
        sh, top = r["sharing"], r["sharing"]["top_exclusive"]
        lines.append(f"   sharing: {sh['exclusive_share']:.0%} of compute time is in kernels no block of which fits "
                     "on an SM beside an NCCL block" + ("" if top is None else
                     f" (most: {top['name'][:40]}, {top['threads']} threads x {top['registers']} registers, "
                     f"{top['smem']} B smem)"))
    if r.get("contention"):
        c = r["contention"]
        if "error" in c:
            lines.append(f"   contention: not measured ({c['error']})")
        else:
            copy, gemm = c["copy"], c["gemm"]
            lines.append(f"   contention (torch kept off the {c['sms_kept']} SMs left to NCCL's {c['channels']} "
                         f"channels/rank): all-reduces alone {copy['comm_ms']:.2f} ms; beside them a memory-bound "
                         f"copy {copy['alone_ms']:.2f} -> {copy['together_ms']:.2f} ms together "
                         f"({copy['overlap']:.0%} overlap), a compute-bound GEMM {gemm['alone_ms']:.2f} -> "
                         f"{gemm['together_ms']:.2f} ms ({gemm['overlap']:.0%}); overlap = (a + b - together) / "
                         "min(a, b): 100% fully hidden, 0% one after the other")
    lines.append(f"{'policy':25s} {'choice':60s} {'step ms':>8s} {'vs ' + str(base_name)[:13]:>16s} {'hidden':>7s} "
                 f"{'slowdown':>8s}  losses/grads as {next(iter(ran), '-')}")
    for key, e in ran.items():
        same = ("" if e.get("finite", True) else "NOT FINITE: ") + \
               ("bitwise" if e["losses_bitwise"] else f"loss diff {e['loss_max_diff']:.2g}") + " / " + \
               ("bitwise" if e["grads_bitwise"] else f"grad diff {e['grad_max_diff']:.2g}")
        ratio = e["step_ms"] / ran[base_name]["step_ms"]
        slowdown = "-" if e["compute_slowdown"] is None else f"{e['compute_slowdown']:.3f}x"
        lines.append(f"{key:25s} {e['choice'][:60]:60s} {e['step_ms']:8.2f} {ratio:15.3f}x "
                     f"{e['comm_hidden']:6.0%} {slowdown:>8s}  {same}")
    if "reference_repeat" in r:
        rep = r["reference_repeat"]
        lines.append(f"   {next(iter(ran), '-')} run again: losses "
                     + ("bitwise" if rep["losses_bitwise"] else f"differ by {rep['loss_max_diff']:.2g}")
                     + ", gradients "
                     + ("bitwise" if rep["grads_bitwise"] else f"differ by {rep['grad_max_diff']:.2g}")
                     + ("" if rep["losses_bitwise"] and rep["grads_bitwise"] else
                      " (nondeterministic kernels: no policy can be bitwise where this is not)"))
    for key, why in r.get("failed", {}).items():
        lines.append(f"{key:25s} failed: {why}")
    fixed = {k: e for k, e in ran.items() if k != "auto" and e.get("finite", True)}
    if "auto" in ran and fixed:
        best = min(fixed, key=lambda k: fixed[k]["step_ms"])
        auto = ran["auto"]
        lines.append(f"   auto picked {auto['picked']} after {auto['tuning_s']:.1f} s of trials: "
                     f"{auto['step_ms'] / fixed[best]['step_ms']:.3f}x the best fixed ({best}), "
                     f"{auto['step_ms'] / ran[base_name]['step_ms'] - 1:+.1%} step time against {base_name}")
    return "\n".join(lines)


def _channels(setting: str) -> str:
    """A channel setting as bench torch keys it ("None": NCCL's own choice)."""
    return "NCCL's own channels" if setting == "None" else f"{setting} channels/rank"
