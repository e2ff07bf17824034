"""The whole selftest on a GPU machine: every section runs, nothing fails, under 60 s."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def test_full_selftest_passes_quickly(device):
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "shimrt.selftest", "--json", "--quiet"], capture_output=True,
                         text=True, timeout=300)
    elapsed = time.monotonic() - t0
    results = json.loads(run.stdout)["results"]
    by = {(r["section"], r["name"]): r for r in results}
    failed = [r for r in results if r["status"] == "fail"]
    assert not failed and run.returncode == 0, failed
    for name in ("launch correctness", "large dynamic shared memory", "stream priorities",
                 "shaping confirmed by the driver", "overlap: prioritized comm beside shaped compute"):
        assert by[("device", name)]["status"] == "pass", by[("device", name)]
    assert by[("communication", "single-rank collective")]["status"] in ("pass", "skip")
    n_rank = by[("communication", "N-rank collective")]
    # Passes with 2+ GPUs, or 2 ranks on one GPU where NCCL can; else skipped, saying why.
    assert n_rank["status"] == "pass" or "puts several ranks on one GPU" in n_rank["detail"], n_rank
    # MPS: found (and whether a daemon runs), or skipped saying it is not installed.
    mps_row = by[("environment", "MPS")]
    assert (mps_row["status"] == "pass" and "nvidia-cuda-mps-control" in mps_row["detail"]
            or mps_row["status"] == "skip" and "MPS is not installed here" in mps_row["detail"]), mps_row
    # Two rank processes on the GPU under MPS where MPS and a GPU NCCL can share (or two GPUs) are here.
    processes = by[("communication", "N-rank collective, processes under MPS")]
    if processes["status"] == "skip":
        assert (mps_row["status"] == "skip" or "already runs" in processes["detail"]
                or "puts several ranks on one GPU" in processes["detail"]), processes
    else:
        assert processes["status"] == "pass" and "under MPS equals numpy" in processes["detail"], processes
    shown = [r for r in results if r["section"] in ("device", "communication")]
    print(f"\nselftest took {elapsed:.1f} s:")
    for r in shown:
        print(f"  {r['status']:4s} {r['section']}: {r['name']}: {r['detail'].splitlines()[0] if r['detail'] else ''}")
    assert elapsed < 60
