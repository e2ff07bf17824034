"""scripts/zero_sm_probe.py on a machine without a GPU, and its reading of a profiler trace."""

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "zero_sm_probe.py"


def test_it_counts_nccls_kernels_and_the_memory_copies_of_a_trace(tmp_path, script):
    path = tmp_path / "t.json.gz"
    events = [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 0, "dur": 5},
              {"ph": "X", "cat": "kernel", "name": "void at::native::fill_kernel", "ts": 5, "dur": 1},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "ts": 6, "dur": 3},
              {"ph": "X", "cat": "cpu_op", "name": "nccl:all_gather", "ts": 0, "dur": 9}]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert script("zero_sm_probe").kernels_and_copies(path) == (1, 1)


@pytest.mark.parametrize("argv, line", [([], None), (["--mib", "0"], "--mib must be 1..4096 and --calls 1..100")])
def test_without_a_gpu_or_with_a_bad_size_it_says_so_in_one_line(argv, line):
    if not argv and importlib.util.find_spec("torch") is not None:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA GPU: the probe runs under a launcher there")
    run = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=120,
                         cwd=SCRIPT.parents[1], env={"PYTHONPATH": str(SCRIPT.parents[1]), "PATH": "/usr/bin:/bin"})
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    if line is not None:
        assert line in lines[0]
    else:
        assert lines[0].startswith("zero_sm_probe.py: needs") or "CTA policy" in lines[0], lines
