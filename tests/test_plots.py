"""PNG plots of overlap benchmark results, from synthetic results (no GPU)."""

from __future__ import annotations

import copy
import json
import math
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import require_matplotlib

from shimrt import ShimrtError
from shimrt.bench import __main__ as bench
from shimrt.bench import plots
from shimrt.bench.results import SCHEMA

POLICIES = ("sequential", "shaping+priority", "concurrent")  # out of order on purpose
WORKLOADS = ("sgemm-4096 + all_reduce-64MiB", "sgemm-1024 + all_reduce/1MiB")


def synthetic(num_sms=16, compute_blocks=240, comm_blocks=8, seed=0) -> dict:
    """2 workloads x 3 policies, a few hundred blocks each: compute in waves over every SM, the
    communication blocks after the compute (sequential) or beside it."""
    rng = np.random.default_rng(seed)
    runs = []
    for w, workload in enumerate(WORKLOADS):
        t_comp, t_comm = 1.0 + w, 0.8
        for policy in POLICIES:
            overlap = policy != "sequential"
            per_block = t_comp / (compute_blocks / num_sms)
            starts = np.arange(compute_blocks) // num_sms * per_block + rng.uniform(0, 0.01, compute_blocks)
            compute = [[s, s + per_block * 0.95, i % num_sms] for i, s in enumerate(starts)]
            comm_start = 0.05 if overlap else t_comp
            comm = [[comm_start, comm_start + t_comm, int(sm)] for sm in rng.choice(num_sms, comm_blocks, False)]
            makespan = max(t_comp * 1.05, comm_start + t_comm) if overlap else t_comp + t_comm
            runs.append({
                "workload": workload, "policy": policy,
                "choice": {"resident_blocks": 1 if overlap else None, "priority": "high" if overlap else None,
                           "partition_sms": None, "comm_blocks": comm_blocks, "comm_threads": 640},
                "metrics": {"t_comp_ms": t_comp, "t_comm_ms": t_comm, "t_seq_ms": t_comp + t_comm,
                            "makespan_ms": makespan, "efficiency": 0.9, "ratio": makespan / max(t_comp, t_comm),
                            "compute_slowdown": 1.05, "comm_start_delay_ms": comm_start,
                            "reduction": 1 - makespan / (t_comp + t_comm)},
                "timeline": {"compute": compute, "comm": comm}})
    return {"schema": SCHEMA, "comm": "stand-in", "runs": runs,
            "device": {"name": "NVIDIA H200", "arch": "sm_90", "num_sms": num_sms, "backend": "cuda"}}


def png_size(path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which a PNG must start with."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_write_all_writes_makespan_and_one_timeline_per_workload(tmp_path):
    paths = plots.write_all(synthetic(), tmp_path / "plots")
    names = [p.name for p in paths]
    assert names == ["makespan.png", "timeline_sgemm-4096_all_reduce-64MiB.png",
                     "timeline_sgemm-1024_all_reduce_1MiB.png"]
    for path in paths:
        assert path.is_file() and path.parent == tmp_path / "plots"
    # Two panels of 3 policies: 2 x 4 in wide; one row: 0.9 + 4.5 in high; at 100 dpi.
    assert png_size(paths[0]) == (800, 540)
    # One panel per policy: 12 in wide, 0.9 + 3 x 2.2 in high.
    for path in paths[1:]:
        assert png_size(path) == (1200, 750)


def test_timeline_of_a_large_grid_is_quick(tmp_path):
    results = synthetic(num_sms=132, compute_blocks=20000, comm_blocks=16)
    t0 = time.perf_counter()
    path = plots.timeline_png(results, WORKLOADS[0], tmp_path / "t.png")
    assert time.perf_counter() - t0 < 20  # one collection per kind, not a patch per block
    assert png_size(path) == (1200, 750)


def test_an_unknown_policy_and_an_empty_timeline_still_plot(tmp_path):
    results = synthetic()
    results["runs"][0]["policy"] = "experimental"
    results["runs"][0]["timeline"]["comm"] = []
    del results["device"]
    for path in plots.write_all(results, tmp_path):
        png_size(path)


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(schema="shimrt.bench.overlap/0"), "schema"),
    (lambda r: r.pop("schema"), "schema"),
    (lambda r: r.update(runs=[]), "runs"),
    (lambda r: r["runs"][1].pop("policy"), "'policy'"),
    (lambda r: r["runs"][2]["metrics"].pop("makespan_ms"), "metrics.makespan_ms"),
    (lambda r: r["runs"].append(copy.deepcopy(r["runs"][0])), "two runs"),
    # Issue 24: values that passed the schema's first look, then raised or were drawn anyway.
    (lambda r: r["runs"][0]["metrics"].update(makespan_ms=-1.0), r"metrics.makespan_ms \(a positive number"),
    (lambda r: r["runs"][0]["metrics"].update(makespan_ms=1e308), r"metrics.makespan_ms .* up to 1e\+09\): 1e\+308"),
    (lambda r: r["runs"][0]["metrics"].update(t_comp_ms=0.0), "metrics.t_comp_ms"),
    (lambda r: r["runs"][0]["metrics"].update(reduction="lots"), "metrics.reduction must be a finite number"),
    (lambda r: r["runs"][0]["timeline"].update(compute=[["0", "1", "0"]]),
     r"timeline.compute is not a list of \[start_ms, end_ms, sm\] numbers"),
    (lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, True]]), "timeline.comm is not a list"),
    (lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, math.inf]]), "an SM index in 0..15 .*not inf"),
    (lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, 16]]), "an SM index in 0..15 .*not 16"),
    (lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, 2.5]]), "an SM index in 0..15 .*not 2.5"),
    (lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, -2]]), r"an SM index .*\(or -1: not known\)"),
    (lambda r: r["runs"][0]["timeline"].update(comm=[[0.0, 1.0, 10**400]]), "too large for a time or an SM"),
    (lambda r: r["runs"][0]["timeline"].update(compute=[[math.nan, 1.0, 0]]), "row 0 must have 0 <= start_ms"),
    (lambda r: r["runs"][0]["timeline"].update(compute=[[0.0, 1.0, 0], [2.0, 1.0, 0]]), "row 1 must have"),
    (lambda r: r["runs"][0]["timeline"].update(compute=[[-1.0, 1.0, 0]]), "row 0 must have 0 <= start_ms"),
    (lambda r: r["runs"][0]["timeline"].update(compute=[[0.0, 1e308, 0]]), r"end_ms <= 1e\+09"),
    (lambda r: r["runs"][0].update(timeline_blocks={"compute": "many"}), "timeline_blocks.compute must be an int"),
    (lambda r: r["runs"][0].update(describe=5), "describe must be a string"),
    (lambda r: r["runs"][0].update(workload="w" * 201), "'workload' \\(a string of 1..200 characters\\)"),
    (lambda r: r.update(device={"num_sms": 10**400}), "num_sms must be an int in 1..1024"),
    (lambda r: r.update(summary=[{"workload": WORKLOADS[0], "model_ms": math.nan}]), "model_ms must be a positive"),
    (lambda r: r.update(summary=[{"workload": WORKLOADS[0], "model_ms": True}]), "model_ms must be a positive"),
])
def test_bad_results_raise(tmp_path, change, message):
    results = synthetic()
    change(results)
    with pytest.raises(ShimrtError, match=message):
        plots.write_all(results, tmp_path)
    assert not list(tmp_path.glob("*.png"))


def test_an_unknown_sm_and_numpy_numbers_are_drawn(tmp_path):
    """CUPTI's blocks (NCCL's kernels) have no SM: -1, drawn off the rows; numpy's own numbers
    (results made in-process) pass as JSON's do."""
    results = synthetic()
    results["runs"][0]["timeline"]["comm"] = [[np.float64(0.5), np.float64(1.5), -1]]
    results["device"]["num_sms"] = np.int64(16)
    for path in plots.write_all(results, tmp_path):
        png_size(path)


def test_bad_timeline_and_unknown_workload_raise(tmp_path):
    results = synthetic()
    with pytest.raises(ShimrtError, match="no runs of workload 'nope'"):
        plots.timeline_png(results, "nope", tmp_path / "t.png")
    results["runs"][0]["timeline"]["compute"] = [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]
    with pytest.raises(ShimrtError, match=r"timeline.compute is not a list of \[start_ms, end_ms, sm\]"):
        plots.timeline_png(results, WORKLOADS[0], tmp_path / "t.png")
    del results["runs"][0]["timeline"]
    require_matplotlib()  # what follows is checked as the plot is drawn
    with pytest.raises(ShimrtError, match="has no timeline.compute"):
        plots.timeline_png(results, WORKLOADS[0], tmp_path / "t.png")


def test_slug_is_a_safe_file_name():
    assert plots.slug("sgemm-4096 + all_reduce-64MiB") == "sgemm-4096_all_reduce-64MiB"
    assert plots.slug("a/../b c") == "a_.._b_c"
    assert plots.slug("///") == "workload"


def test_cli_writes_next_to_the_results_by_default(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(synthetic()))
    require_matplotlib()
    assert bench.main(["plot", str(results)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "makespan.png"), str(tmp_path / "timeline_sgemm-4096_all_reduce-64MiB.png"),
                       str(tmp_path / "timeline_sgemm-1024_all_reduce_1MiB.png")]
    assert bench.main(["plot", str(results), "--out", str(tmp_path / "out")]) == 0
    assert len(list((tmp_path / "out").glob("*.png"))) == 3


def test_cli_reports_bad_input_in_one_line(tmp_path, capsys):
    assert bench.main(["plot", str(tmp_path / "missing.json")]) == 2
    assert "shimrt.bench plot: cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    assert bench.main(["plot", str(tmp_path / "bad.json")]) == 2
    assert "schema is 'other'" in capsys.readouterr().err


def test_importing_shimrt_leaves_matplotlib_alone():
    code = "import sys, shimrt.bench.plots, shimrt.bench.__main__; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_without_matplotlib_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(ShimrtError, match=r"pip install 'shimrt\[plot\]'"):
        plots.makespan_png(synthetic(), tmp_path / "m.png")


def test_a_sampled_timeline_says_so():
    run = {"timeline": {"compute": [[0.0, 1.0, 0]] * 3, "comm": [[0.0, 1.0, 1]] * 2},
           "timeline_blocks": {"compute": 65536, "comm": 2}}
    assert plots.sampled_note(run) == "   [shown: 3 of 65536 compute blocks]"
    run["timeline_blocks"]["compute"] = 3
    assert plots.sampled_note(run) == ""
    assert plots.sampled_note({"timeline": {}}) == ""  # results from before the count was written


def test_makespan_plot_draws_the_occupancy_model_when_reported(tmp_path):
    plain = synthetic()
    modelled = copy.deepcopy(plain)
    modelled["summary"] = [{"workload": WORKLOADS[0], "model_ms": 1.1}, {"workload": WORKLOADS[1], "model_ms": None}]
    assert plots.model_ms(modelled, WORKLOADS[0]) == 1.1
    assert plots.model_ms(modelled, WORKLOADS[1]) is None and plots.model_ms(plain, WORKLOADS[0]) is None
    a = plots.makespan_png(plain, tmp_path / "plain.png").read_bytes()
    b = plots.makespan_png(modelled, tmp_path / "modelled.png").read_bytes()
    assert a != b  # the line (and its legend entry) were drawn
