"""``bench launch``'s grid-form rows, judged and printed from a result made up here (the
measurement itself needs a GPU: tests/gpu and scripts/gpu_run.sh run it)."""

from __future__ import annotations

import json

from shimrt.bench.launch import FORMS_GOAL, judge_forms, report


def _row(enqueue, ratio, throughput, tratio, baseline):
    return {"enqueue_us": enqueue, "enqueue_ratio": ratio, "throughput_us": throughput, "throughput_ratio": tratio,
            "baseline": baseline, "enqueue_batches_us": [enqueue], "throughput_rounds_us": [throughput]}


def _pair(form, grid, block, scalars, cupy=True):
    mine = f"six, {form} grid, {scalars} scalars: shimrt"
    return {"form": form, "grid": grid, "block": block, "cupy_grid": "(4,)", "cupy_block": "(256,)",
            "scalars": scalars, "shimrt": mine, "cupy": mine.replace("shimrt", "CuPy") if cupy else None}


def test_each_form_is_judged_against_cupy_on_both_figures():
    floor = "six: cuda.bindings pre-packed"
    pairs = [_pair("int", "4", "256", "Python"), _pair("tuple", "(4,)", "(256,)", "Python"),
             _pair("list", "[4]", "[256]", "numpy"), _pair("numpy int", "np.int64(4)", "np.int64(256)", "Python",
                                                           cupy=False)]
    methods = {
        floor: _row(4.0, 1.1, 3.0, 1.0, "cuda.bindings pre-packed"),
        pairs[0]["shimrt"]: _row(4.94, 0.970, 3.1, 1.02, pairs[0]["cupy"]),
        pairs[0]["cupy"]: _row(5.09, 1.27, 3.04, 1.01, floor),
        pairs[1]["shimrt"]: _row(5.70, 1.12, 3.1, 1.0, pairs[1]["cupy"]),   # enqueue over the goal
        pairs[1]["cupy"]: _row(5.09, 1.27, 3.1, 1.0, floor),
        pairs[2]["shimrt"]: _row(5.0, 1.0, 3.5, 1.15, pairs[2]["cupy"]),   # throughput over the goal
        pairs[2]["cupy"]: _row(5.0, 1.25, 3.04, 1.0, floor),
        pairs[3]["shimrt"]: _row(5.2, 1.3, 3.1, 1.03, floor),
    }
    judged = judge_forms(methods, pairs)
    assert [j["met"] for j in judged] == [True, False, False, None]
    assert [(j["enqueue_ratio"], j["throughput_ratio"]) for j in judged] == \
        [(0.970, 1.02), (1.12, 1.0), (1.0, 1.15), (None, None)]
    assert all(j["goal"] == FORMS_GOAL == 1.10 for j in judged)
    result = {"device": "NVIDIA H200", "batch": 200, "batches": 200, "launches": 20000, "rounds": 5,
              "methods": methods, "forms": judged}
    json.dumps(result)  # what --json writes
    text = report(result)
    lines = text.splitlines()
    assert "goal: at most 1.10x on each" in text
    assert any(line.startswith("4, 256 ") and "Python" in line and "4.94" in line and "0.970x" in line
               and line.endswith("met") for line in lines)
    assert any(line.startswith("(4,), (256,)") and "1.120x" in line and line.endswith("MISSED") for line in lines)
    assert any(line.startswith("[4], [256]") and "numpy" in line and "1.150x" in line and line.endswith("MISSED")
               for line in lines)
    assert any(line.startswith("np.int64(4), np.int64(256)") and line.endswith("CuPy is not installed: no ratio")
               for line in lines)
    # The full table keeps a line per method, its name in full.
    assert all(any(line.startswith(name + " ") for line in lines) for name in methods)
