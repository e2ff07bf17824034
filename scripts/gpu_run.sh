#!/usr/bin/env bash
# One call on a GPU machine: the whole test suite, the selftest and the benchmarks.
# Usage (device tool): bash scripts/gpu_run.sh        results land in $OUT (default ./out):
#   pytest.log, summary.txt (machine, selftest, benchmark tables), and the benchmarks' JSON
#   (plot the overlap results anywhere: python -m shimrt.bench plot overlap.json).
# The device machine has no network: the checkout runs from PYTHONPATH, nothing is installed.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SHIMRT_CACHE_DIR=${SHIMRT_CACHE_DIR:-/tmp/shimrt-cache}
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared machines
status=0
summary="$OUT/summary.txt"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, numpy, cuda.bindings; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__)"
} 2>&1 | tee "$summary"
# A test that hangs fails after PYTEST_TIMEOUT seconds (pytest-timeout), and faulthandler dumps every thread's
# stack after 150 s, even when the main thread is blocked in C,
# instead of taking the whole call with it; the slowest tests are listed at the end.
python3 -m pytest -q -rs -s -p no:cacheprovider --timeout="${PYTEST_TIMEOUT:-180}" -o faulthandler_timeout=150 --durations=15 tests 2>&1 \
  | tee "$OUT/pytest.log" | tail -3 || status=1
grep -q " failed" "$OUT/pytest.log" && status=1
python3 scripts/soak.py --json "$OUT/soak.json" 2>&1 | tr '\r' '\n' | grep -v "^soak [0-9]" | tee -a "$summary" || status=1
for step in "shimrt.selftest --quiet" \
            "shimrt.bench launch --json $OUT/bench_launch.json" \
            "shimrt.overlap.footprint --json $OUT/footprint.json" \
            "shimrt.bench collectives --max-bytes 268435456 --json $OUT/collectives.json" \
            "shimrt.bench gemm --json $OUT/gemm.json" \
            "shimrt.bench overlap --quiet --json $OUT/overlap.json" \
            "shimrt.bench overlap --quiet --compute bias_gelu:8192:1024,softmax:8192:1024 --comm-threads 256 --json $OUT/overlap_256.json"; do
  echo "== python -m $step" | tee -a "$summary"
  python3 -m $step 2>&1 | tr '\r' '\n' | grep -v -E "^(batch|round) |\[[0-9]+/[0-9]+\]$" | tee -a "$summary" || status=1
done
exit $status
