#!/usr/bin/env bash
# One call on a GPU machine: the whole test suite, the selftest and the benchmarks.
# Usage (device tool): bash scripts/gpu_run.sh [all|tests|benches|nccl|latency|ddp|ddp-turn|levels|fsdp|fsdp-turn|own|link|link-torch]   results land in $OUT (default ./out):
#   tests: pytest, the soak and the selftest; benches: the benchmarks; nccl: the real-NCCL runs that
#   need ranks sharing the GPU (NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE=1, e.g. SHIMRT_NCCL_LIBRARY
#   pointing at nvidia-nccl-cu13 2.32's library: ../shared/tools/nccl-multirank.sh); latency: the nccl part's
#   host-cost and latency runs alone; ddp: the README's DDP example and bench torch with one process per rank
#   (its five configurations, a user's loop: fused AdamW, the loss read every 10 steps; DDP_EXAMPLE=0 leaves the
#   example out; DDP_ARGS more flags, e.g. --one-bucket: plain DDP with its all-reduces after backward beside it);
#   ddp-turn: bench torch --in-turn 6 --rounds 6 under DDP (each way in blocks in turn with a plain DDP of its own,
#   the ratio per round, as fsdp-turn below; DDP_TURN_ARGS in place of the default --configs
#   balanced-1024,comm-heavy-1024 --policies carveout,windowed-carveout,partition,auto); levels: plain DDP's two
#   speeds against the host's loss reads (docs/ddp.md): bench torch's compute-heavy, balanced and balanced-1024:
#   plain DDP, priority, paced and carveout:32 (which held plain DDP's fast level at b0f05c9), the loss read never,
#   every step and every 10th
#   (LEVELS_ARGS more flags; python scripts/speed_levels.py OUT/levels_N.json reads each);
#   fsdp: scripts/zero_sm_probe.py (does NCCL all-gather on the copy engines here?), then bench
#   torch --fsdp (plain FSDP2, its candidates and auto, each way timed once two windows of 6 steps agree;
#   FSDP_ROUTE=custom for FSDP2's custom collectives (both: priority over them beside the mesh route's), which adds zero-sm (refused, said so, with the two ranks
#   on GPU 0 here: NCCL's symmetric memory failed there; FSDP_PROBE=0 leaves the probe out); FSDP_ARGS in place of the default
#   --configs comm-heavy,balanced-1024,comm-heavy-1024) with --profile: where each way's step went, each rank's
#   torch.profiler trace in profile.tar; fsdp-turn: bench torch --fsdp --in-turn 6 --rounds 4 (each way in blocks in
#   turn with a plain FSDP2 of its own, the ratio per round: FSDP2's host drifts; FSDP_ARGS in place of the default
#   --configs balanced-1024,comm-heavy-1024 --policies priority,ctas,no-reshard,auto); own: a model of a user's own
#   (scripts/own_model.py, OWN_ARGS its flags, e.g. "--fsdp --alternate 10": auto against plain FSDP2 in 10-step
#   blocks in turn, as a host-bound job needs) under torchrun, two ranks on GPU 0 under an MPS daemon of its own;
#   link: host-cost, and two ranks on GPU 0 whose collectives cross NCCL's socket transport on loopback (python -m
#   shimrt.launch --link socket: any NCCL, no multi-rank build needed): bench collectives' bus bandwidth per size,
#   and bench overlap --comm nccl (the paper's two controls on a collective that waits on the link, beside the stand-in);
#   link-torch: bench torch over that link, its configurations sized to it (link-comm-heavy, link-balanced,
#   link-compute-heavy; LINK_ARGS more flags);
#   all: every part but latency, ddp (which nccl includes), own and link.
#   pytest.log, summary.txt (machine, selftest, benchmark tables), and the benchmarks' JSON
#   (plot the overlap results anywhere: python -m shimrt.bench plot overlap.json).
# The device machine has no network: the checkout runs from PYTHONPATH, nothing is installed.
set -uo pipefail
part=${1:-all}
case $part in all|tests|benches|nccl|latency|ddp|ddp-turn|levels|fsdp|fsdp-turn|own|link|link-torch) ;; *) echo "usage: bash scripts/gpu_run.sh [all|tests|benches|nccl|latency|ddp|ddp-turn|levels|fsdp|fsdp-turn|own|link|link-torch]" >&2; exit 2;; esac
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 SHIMRT_CACHE_DIR=${SHIMRT_CACHE_DIR:-/tmp/shimrt-cache}
# Made before any test runs: the suite fails a run that leaves a new shimrt-* entry in /tmp (tests/conftest.py),
# and on a fresh machine the first compile made this one (the CPU half's "all passed", exit status 1, at 71ad7d8).
mkdir -p "$SHIMRT_CACHE_DIR"
export NCCL_NVLS_ENABLE=0  # never NVLink multicast on shared machines
status=0
summary="$OUT/summary.txt"
# Every failing step is named at the end of summary.txt, so a non-zero exit says where it came from.
failed=()
fail() { failed+=("$1"); status=1; }
# A progress line ends in a carriage return: each becomes a line, passed on as it comes. tr and grep write
# in blocks into a pipe, so a run cut short by a call's time limit lost what they held (fsdp-turn at be4344c
# left summary.txt with its command line alone): both flush each line.
lines() { if command -v stdbuf > /dev/null; then stdbuf -oL tr '\r' '\n'; else tr '\r' '\n'; fi; }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import sys, numpy, cuda.bindings; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__)"
  # What this call shares the machine with: a process left by an earlier call on the same machine (a rank
  # of a run cut short) takes SMs and host cores from every timing that follows.
  apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
  echo "GPU processes at the start: ${apps:-none}; load average $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$summary"
# A test that hangs fails after PYTEST_TIMEOUT seconds (pytest-timeout), and faulthandler dumps every thread's
# stack after 150 s, even when the main thread is blocked in C,
# instead of taking the whole call with it; the slowest tests are listed at the end.
if [ "$part" = all ] || [ "$part" = tests ]; then
# PYTEST_PATHS (default tests) runs a part of the suite, e.g. tests/gpu, where one call cannot hold it all;
# SUITE_PART names the three parts that each fit one 10-minute call (the whole suite, GPU tests over 330 s of it,
# does not): ddp (tests/gpu/test_ddp.py, the two-rank torch tests), gpu (the other GPU tests, the soak and the
# selftest, and tests/test_mps.py), cpu (the rest of the suite), and ddp+cpu: the two at once in one call, the CPU
# half (which touches no GPU) in OUT/cpu, since device time, not the machine's 16 cores, is what is short; then gpu.
# The CPU half beside the DDP half leaves out tests/test_mps.py: its stand-in daemons and the DDP half's real one
# would each be refused as a second MPS daemon on the machine (mps.running), as they should be.
case ${SUITE_PART:-} in
  "") paths=${PYTEST_PATHS:-tests} ;;
  ddp|ddp+cpu) paths=tests/gpu/test_ddp.py ;;
  gpu) paths="tests/gpu --ignore=tests/gpu/test_ddp.py tests/test_mps.py" ;;
  cpu) paths="tests --ignore=tests/gpu" ;;
  cpu-beside) paths="tests --ignore=tests/gpu --ignore=tests/test_mps.py" ;;
  *) echo "SUITE_PART must be ddp, gpu, cpu or ddp+cpu, not ${SUITE_PART}" >&2; exit 2 ;;
esac
beside=
if [ "${SUITE_PART:-}" = ddp+cpu ]; then
  # As it runs alone: without the multi-rank NCCL preloaded (it runs no collective across ranks). A temporary
  # folder of its own, so that neither run's net for shimrt-* entries left in it (tests/conftest.py) sees, or
  # removes, the other's (the DDP half's MPS folders).
  mkdir -p /tmp/cpu-half
  env -u LD_PRELOAD -u SHIMRT_NCCL_LIBRARY -u NCCL_MULTI_RANK_GPU_ENABLE OUT="$OUT/cpu" SUITE_PART=cpu-beside \
    TMPDIR=/tmp/cpu-half PYTEST_ADDOPTS="--basetemp=/tmp/cpu-half/pytest" bash "$0" tests > /dev/null 2>&1 &
  beside=$!
fi
echo "== pytest $paths" | tee -a "$summary"
python3 -m pytest -q -rs -s -p no:cacheprovider --timeout="${PYTEST_TIMEOUT:-180}" -o faulthandler_timeout=150 --durations=15 $paths 2>&1 \
  | tee "$OUT/pytest.log" | tail -3 | tee -a "$summary"
# pytest's own status, said: a run whose summary says all passed once ended non-zero (71ad7d8, H100)
rc=${PIPESTATUS[0]}
if [ -n "$beside" ]; then
  wait "$beside" || fail "the CPU half (OUT/cpu/summary.txt)"
  { echo "== the CPU half, beside it (OUT/cpu)"; tail -n 4 "$OUT/cpu/summary.txt"; } 2>&1 | tee -a "$summary"
fi
[ "$rc" = 0 ] || { echo "pytest exit status $rc" | tee -a "$summary"; fail pytest; }
# pytest's summary line ("1 failed, ...", "1 error in ..."), not any log line that says "error" (torch's warnings do)
# (grep reads it all, -q would not: tail must not die of SIGPIPE under pipefail)
tail -n 3 "$OUT/pytest.log" | grep -E "(^|[ =])[0-9]+ (failed|errors?)( |,|$)" >/dev/null && fail "pytest's summary"
if [ -z "${SUITE_PART:-}" ] || [ "$SUITE_PART" = gpu ]; then
python3 scripts/soak.py --json "$OUT/soak.json" 2>&1 | lines | grep --line-buffered -v "^soak [0-9]" | tee -a "$summary" || fail soak
echo "== python -m shimrt.selftest --quiet" | tee -a "$summary"
python3 -m shimrt.selftest --quiet 2>&1 | tee -a "$summary" || fail selftest
fi
fi
steps=()
if [ "$part" = all ] || [ "$part" = benches ]; then
  steps+=("shimrt.bench launch --json $OUT/bench_launch.json" \
            "shimrt.overlap.footprint --json $OUT/footprint.json" \
            "shimrt.bench collectives --max-bytes 268435456 --json $OUT/collectives.json" \
            "shimrt.bench gemm --json $OUT/gemm.json" \
            "shimrt.bench overlap --quiet --json $OUT/overlap.json" \
            "shimrt.bench overlap --quiet --compute bias_gelu:8192:1024,softmax:8192:1024 --comm-threads 256 --json $OUT/overlap_256.json" \
            "shimrt.bench host-cost --timeout 240 --json $OUT/host_cost.json")
fi
# Processes sharing the GPU run side by side under MPS; where it cannot be had, they time-slice (said so).
# A daemon already running (an earlier call's, killed mid-run) is named. The timed parts stop there: their
# ranks time-sliced would be set against figures measured under MPS.
mps_flag() {
  if python3 -c "import sys; from shimrt.launch import mps
try: left = mps.running(mps.find_control())
except mps.MpsError as e: sys.exit(str(e))
sys.exit(f'an MPS daemon is running already: {left}' if left else 0)" 2>&1 | tee -a "$summary"; then mpsflag=--mps
  else
    mpsflag=
    case $part in
      ddp|ddp-turn|levels|fsdp|fsdp-turn|own|link-torch) echo "MPS not usable here (above): the timed part $part stops" | tee -a "$summary"
                                      echo "FAILED: MPS for $part" | tee -a "$summary"; exit 1 ;;
      *) echo "MPS not usable here (above): two processes time-slice the GPU" | tee -a "$summary" ;;
    esac
  fi
}
if [ "$part" = link ]; then
  # Each rank a host of its own in NCCL's eyes: the shared-GPU check does not apply (docs/regimes.md).
  mps_flag
  steps+=("shimrt.bench host-cost --no-torch --batches 20 --timeout 70 --json $OUT/host_cost.json" \
          "shimrt.launch --nproc 2 --devices 0,0 $mpsflag --link socket --timeout 150 -m shimrt.bench collectives --ops all_reduce -b 1M -e 256M -f 4 -n 5 -w 2 --json $OUT/link_socket.json" \
          "shimrt.launch --nproc 2 --devices 0,0 $mpsflag --link socket --timeout 300 -m shimrt.bench overlap --comm nccl --stand-in-too --quiet --json $OUT/overlap_link.json")
fi
if [ "$part" = link-torch ]; then
  mps_flag
  export MASTER_ADDR=localhost MASTER_PORT=29514
  steps+=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --link socket --timeout 560 -m shimrt.bench torch --steps 8 --settle 4 --sms 32 --optimizer adamw --loss-every 10 --comm-timeout 120 --timeout 540 ${LINK_ARGS:-} --json $OUT/torch_link.json")
fi
if [ "$part" = all ] || [ "$part" = nccl ] || [ "$part" = latency ] || [ "$part" = ddp ] || [ "$part" = ddp-turn ] || [ "$part" = levels ] || [ "$part" = fsdp ] || [ "$part" = fsdp-turn ] || [ "$part" = own ]; then
  if python3 -c "from shimrt.nccl import library; from shimrt.nccl.config import check_shared_gpu as c; c(library.load(), 'cuda', 'two ranks')" 2>>"$summary"; then
    # Latency against torch.distributed, 8 B to 256 MiB, blocking and non-blocking communicators: two processes
    # on the GPU under MPS (the launcher's own daemon), and two ranks in one process.
    lat="--ops all_reduce -b 8 -e 256M -f 2 -n 10 -w 3 --torch"
    # torch loads its own libnccl.so.2 unless the one shimrt uses is preloaded (the bench refuses two side by side).
    [ -n "${SHIMRT_NCCL_LIBRARY:-}" ] && export LD_PRELOAD=$SHIMRT_NCCL_LIBRARY
    mps_flag
    latency_steps=("shimrt.bench host-cost --timeout 240 --json $OUT/host_cost_multirank.json" \
            "shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 400 -m shimrt.bench collectives $lat --json $OUT/latency_2procs.json" \
            "shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 400 -m shimrt.bench collectives $lat --nonblocking --json $OUT/latency_2procs_nonblocking.json" \
            "shimrt.bench collectives $lat --json $OUT/latency_2ranks.json" \
            "shimrt.bench collectives $lat --nonblocking --json $OUT/latency_2ranks_nonblocking.json")
    # Bounded to fit one 10-minute device call together: the example 150 s, bench torch 440 s (a bench cut
    # short by its deadline keeps the configurations it finished in --json).
    # DDP_EXAMPLE=0 leaves the example out (a call short of device time: the bench alone).
    ddp_steps=()
    [ "${DDP_EXAMPLE:-1}" = 0 ] || ddp_steps+=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 150 examples/ddp_overlap.py --policy auto --compare --steps 480")
    ddp_steps+=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 440 -m shimrt.bench torch --steps 24 --settle 30 --sms 32 --optimizer adamw --loss-every 10 --timeout 430 ${DDP_ARGS:-} --json $OUT/torch_ddp.json --plots $OUT/plots")
    case $part in
      latency) steps=("${latency_steps[@]}") ;;
      ddp) steps=("${ddp_steps[@]}") ;;
      levels) steps=()
              for every in 0 1 10; do
                steps+=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 200 -m shimrt.bench torch --configs compute-heavy,balanced,balanced-1024 --policies priority,paced,carveout --steps 40 --settle 20 --sms 32 --optimizer adamw --loss-every $every --timeout 190 ${LEVELS_ARGS:-} --json $OUT/levels_$every.json")
              done ;;
      fsdp) mkdir -p "$OUT/profile"
            steps=()
            [ "${FSDP_PROBE:-1}" = 0 ] || steps+=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 150 scripts/zero_sm_probe.py")
            steps+=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 430 -m shimrt.bench torch --fsdp --fsdp-route ${FSDP_ROUTE:-mesh} --steps 16 --settle 10 --steady 6 --sms 32 --optimizer adamw --loss-every 10 --timeout 410 --profile $OUT/profile ${FSDP_ARGS:---configs comm-heavy,balanced-1024,comm-heavy-1024} --json $OUT/torch_fsdp.json") ;;
      ddp-turn) steps=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 440 -m shimrt.bench torch --in-turn 6 --rounds 6 --settle 10 --sms 32 --optimizer adamw --loss-every 10 --timeout 430 ${DDP_TURN_ARGS:---configs balanced-1024,comm-heavy-1024 --policies carveout,windowed-carveout,partition,auto} --json $OUT/torch_ddp_turn.json") ;;
      fsdp-turn) steps=("shimrt.launch --nproc 2 --devices 0,0 $mpsflag --timeout 560 -m shimrt.bench torch --fsdp --in-turn 6 --rounds 4 --settle 10 --sms 32 --optimizer adamw --loss-every 10 --timeout 540 ${FSDP_ARGS:---configs balanced-1024,comm-heavy-1024 --policies priority,ctas,no-reshard,auto} --json $OUT/torch_fsdp_turn.json") ;;
      own) steps=() ;;
      *) steps+=("${latency_steps[@]}" \
            "shimrt.bench collectives --max-bytes 268435456 --json $OUT/collectives_2ranks.json" \
            "shimrt.bench overlap --comm nccl --stand-in-too --quiet --json $OUT/overlap_nccl.json" \
            "shimrt.bench torch --quiet --timeout 300 --json $OUT/torch.json --plots $OUT/plots" \
            "${ddp_steps[@]}") ;;
    esac
    export MASTER_ADDR=localhost MASTER_PORT=29512  # torch.distributed's rendezvous for one process per rank
  else
    echo "nccl part skipped: the NCCL loaded cannot put two ranks on this GPU (see above)" | tee -a "$summary"
    fail "the $part part: no NCCL that puts two ranks on one GPU"  # a run of nothing is no success
  fi
fi
# The GPU's clocks, power and throttle reasons, 4 a second, beside the DDP runs (plain DDP runs at two speeds;
# python scripts/clocks_by_way.py OUT/torch_ddp.json OUT/gpu_clocks.csv says which ran at which clock).
if [ "$part" = ddp ] || [ "$part" = ddp-turn ] || [ "$part" = levels ] || [ "$part" = own ]; then
  nvidia-smi --query-gpu="$(python3 scripts/clocks_by_way.py --fields)" --format=csv,nounits -lms 250 \
    > "$OUT/gpu_clocks.csv" 2>>"$summary" &
  sampler=$!
fi
# torchrun and MPS as a user starts them by hand; every rank bounded (the script's group timeout, then timeout).
if [ "$part" = own ] && [ -n "${mpsflag+set}" ]; then
  control=$(python3 -c "from shimrt.launch import mps; print(mps.find_control())")
  mpsdir=$(mktemp -d /tmp/own-mps.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY=$mpsdir/pipe CUDA_MPS_LOG_DIRECTORY=$mpsdir/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  [ -n "$mpsflag" ] && "$control" -d
  echo "== torchrun scripts/own_model.py ${OWN_ARGS:-}" | tee -a "$summary"
  timeout -k 10 ${OWN_TIMEOUT:-500} python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
    scripts/own_model.py --json "$OUT/own_model.json" ${OWN_ARGS:-} 2>&1 | tee -a "$summary" || fail own_model
  [ -n "$mpsflag" ] && { echo quit | "$control"; sleep 1; }
  rm -rf "$mpsdir"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
for step in ${steps[@]+"${steps[@]}"}; do
  echo "== python -m $step" | tee -a "$summary"
  python3 -m $step 2>&1 | lines | grep --line-buffered -v -E "^(batch|round) |\[[0-9]+/[0-9]+\]$" | tee -a "$summary" \
    || fail "$step"
done
[ -n "${sampler:-}" ] && kill "$sampler" 2>/dev/null
# The device tool brings back at most 8 files: the plots come as one tar.
for d in plots profile; do
  if [ -d "$OUT/$d" ]; then tar -C "$OUT" -cf "$OUT/$d.tar" "$d" && rm -rf "${OUT:?}/$d"; fi
done
# Nothing of --mps may outlive the run: no daemon, no private folder. (The CPU half starts none and may
# run beside a part that does: a call short of device time runs it beside the DDP half.)
case ${SUITE_PART:-} in
  cpu|cpu-beside) ;;
  *) python3 -c "import glob, sys; from shimrt.launch import mps; left = mps.running(); f = glob.glob(mps.temp_root() + '/shimrt-mps-*'); print('MPS left behind:', left or 'no daemon', f or 'no folder'); sys.exit(1 if left or f else 0)" 2>&1 | tee -a "$summary" || fail "MPS clean-up" ;;
esac
for f in ${failed[@]+"${failed[@]}"}; do echo "FAILED: $f" | tee -a "$summary"; done
exit $status
