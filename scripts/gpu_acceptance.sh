#!/usr/bin/env bash
# The GPU acceptance run, in one device call: environment, the GPU test suite (time-boxed), then
# compute-sanitizer memcheck over scripts/sanitize_kernels.py's grid and racecheck over its Gluon (hopper)
# cases. Logs go to $OUT (the device tool's output folder) or ./gpu_out: environment.txt, gpu_tests.log,
# gpu_tests.xml (JUnit, every test's time), precompile.log, sanitizer.log (memcheck), racecheck.log.
#     FLASHTILE_COMMIT=<commit> PYTHONPATH=src bash scripts/gpu_acceptance.sh [test files, -k ...]
# Without arguments pytest runs every GPU test under tests/, in collection order. Time boxes in seconds
# (a box that runs out stops its step, which then reports exit 124): FLASHTILE_TESTS_S (pytest, 270),
# FLASHTILE_PRECOMPILE_S (150, beside pytest), FLASHTILE_MEMCHECK_S (180), FLASHTILE_RACECHECK_S (60);
# pytest workers FLASHTILE_TEST_WORKERS (4). The defaults keep the call under 9 minutes.
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
tests_s=${FLASHTILE_TESTS_S:-270}
precompile_s=${FLASHTILE_PRECOMPILE_S:-150}
memcheck_s=${FLASHTILE_MEMCHECK_S:-180}
racecheck_s=${FLASHTILE_RACECHECK_S:-60}
workers=${FLASHTILE_TEST_WORKERS:-4}
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cudnn", torch.backends.cudnn.version())'
  compute-sanitizer --version | tail -n 1
  echo "commit ${FLASHTILE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
} | tee "$OUT/environment.txt"

# Fill Triton's disk cache with the sanitizer grid's kernels in 8 processes while the tests run (the H100
# machine has 16 cores): compiling them inside compute-sanitizer, in one process, takes longer than a device
# call may run.
shards=$(mktemp -d)
pids=()
for i in 0 1 2 3 4 5 6 7; do
  FLASHTILE_SANITIZE_SHARD=$i/8 timeout "$precompile_s" python3 scripts/sanitize_kernels.py > "$shards/$i.log" 2>&1 &
  pids+=($!)
done

# pytest-xdist spreads the cases (mostly compilation) over 4 processes sharing the one GPU (8 ran out of
# memory on an H100 with the float64 oracles of the N = 4096 option cases). SIGINT at the time box stops
# pytest as Ctrl-C would: the tests that finished are reported, and the JUnit file is written.
timeout -s INT -k 30 "$tests_s" python3 -m pytest -m gpu -q -p no:cacheprovider -n "$workers" --durations=15 \
  --junitxml="$OUT/gpu_tests.xml" "$@" 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 30
tests=${PIPESTATUS[0]}

for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  echo "== shard $i/8: exit $?"
  tail -n 3 "$shards/$i.log"
done > "$OUT/precompile.log"
rm -rf "$shards"

# Without the caching allocator every tensor is its own cudaMalloc, so memcheck sees an overrun past any of them.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -s INT -k 30 "$memcheck_s" compute-sanitizer --tool memcheck \
  --error-exitcode 1 python3 scripts/sanitize_kernels.py 2>&1 | tee "$OUT/sanitizer.log" | tail -n 20
memcheck=${PIPESTATUS[0]}
# Shared-memory hazards of the warp-specialised Gluon kernels (TMA rings and mbarriers); skipped off 9.x.
timeout -s INT -k 30 "$racecheck_s" compute-sanitizer --tool racecheck --error-exitcode 1 \
  python3 scripts/sanitize_kernels.py --only hopper 2>&1 | tee "$OUT/racecheck.log" | tail -n 20
racecheck=${PIPESTATUS[0]}
echo "gpu tests exit $tests, memcheck exit $memcheck, racecheck exit $racecheck (124: its time box ran out)" |
  tee -a "$OUT/environment.txt"
[ "$tests" -eq 0 ] && [ "$memcheck" -eq 0 ] && [ "$racecheck" -eq 0 ]
