#!/usr/bin/env bash
# One call on a GPU machine: the whole test suite, the selftest and the benchmarks.
# Usage (device tool): bash scripts/gpu_run.sh        results land in $OUT (default ./out)
# The device machine has no network: the checkout runs from PYTHONPATH, nothing is installed.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SHIMRT_CACHE_DIR=${SHIMRT_CACHE_DIR:-/tmp/shimrt-cache}
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, numpy, cuda.bindings; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__)"
} 2>&1 | tee "$OUT/machine.txt"
python3 -m pytest -q -rs -s -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest.log" || status=1
python3 -m shimrt.selftest --quiet 2>&1 | tee "$OUT/selftest.txt" || status=1
python3 -m shimrt.bench launch --json "$OUT/bench_launch.json" 2>&1 | tee "$OUT/bench_launch.txt" || status=1
python3 -m shimrt.overlap.footprint --json "$OUT/footprint.json" 2>&1 | tee "$OUT/footprint.txt" || status=1
exit $status
