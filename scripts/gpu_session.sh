#!/usr/bin/env bash
# The GPU session's device calls, one part each, every call under 10 minutes (the device tool's limit).
# docs/testing.md, "On the GPU", has the expected times and what each call brings back.
#
#   a  tests and sanitizer: scripts/gpu_acceptance.sh over the GPU suite (or the test files given), the new
#      kernels' tests first (pytest time-boxed, FLASHTILE_TESTS_S), then memcheck over the sanitizer grid
#      and racecheck over its Gluon cases
#   b  benchmarks: flashtile bench --paper, --decode --quick, --masks --quick
#   c  training and the rest: examples/train_llama.py at 8k context with flashtile then sdpa (300 steps
#      each), scripts/hopper_bwd_check.py timing of backward variants, flashtile bench --options, then the
#      GPU tests named by the arguments, until the deadline
#
# A session adds its own parts (s<session><letter>) before the `*)` case, from the helpers below (step,
# gpu_tests_step, bench_knob_values, bench_main_exp with exp_patch_step, paper_grid_whole, memcheck_group),
# and drops them once their runs are recorded under docs/test-runs. Earlier sessions' parts (a hundred and
# more, from d to s50c) are in git history: each docs/test-runs/<session>/README.md names the part and the
# commit it ran, and `git show <commit>:scripts/gpu_session.sh` has its definition.
#
#     FLASHTILE_COMMIT=<12 hex digits of HEAD> bash scripts/gpu_session.sh a|b|c [test files for a and c]
#
# The device machine's copy has no git history: pass the commit, which the benchmark CSVs record. In b and c
# each step has a time box and no step starts after the call's deadline, FLASHTILE_PART_S seconds (520)
# after the start; $OUT gets summary.txt (each step's exit status, seconds and log tail), <part>.tar.gz
# (every log, CSV and plot) and the CSVs or plot worth reading first.
set -uo pipefail
part=${1:-}
shift || true
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
# New kernels first, then the portable kernels' and the API's suites, which passed before this session's
# changes; tests/test_bench_masks.py's GPU test is part b's bench --masks --quick at 2k, so it is left out.
NEW_TESTS=(tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_gpu_kvcache.py
  tests/test_decode_kernel.py tests/test_block_sparse.py tests/test_sinks.py tests/test_head_dims.py
  tests/test_gpu_transformers.py)
OLD_TESTS=(tests/test_kernel_options.py tests/test_gpu_api.py tests/test_kernels.py tests/test_gpu_hardening.py
  tests/test_cli_bench.py)
# The GPU tests of a part: 4 xdist workers share the GPU (8 ran out of memory on the float64 oracles).
pytest_gpu=(python3 -m pytest -m gpu -q -p no:cacheprovider -n 4)
start=$SECONDS
deadline=${FLASHTILE_PART_S:-520}
summary="$OUT/summary.txt"
work=

# step NAME MAX_S COMMAND...: COMMAND in a time box of MAX_S or the time left, whichever is less; its
# output in $work/NAME.log; a line and the log's tail in summary.txt.
step() {
  local name=$1 max=$2
  shift 2
  local left=$((deadline - (SECONDS - start)))
  local box=$((max < left ? max : left))
  # Under 30 s left before the deadline a step is not started; a short box of its own still runs.
  if [ "$left" -lt 30 ]; then
    echo "== $name: not started, $left s left before the deadline" | tee -a "$summary"
    return
  fi
  local t0=$SECONDS
  # SIGINT stops a benchmark as Ctrl-C would: the rows it has appended stay in its CSV.
  timeout -s INT -k 20 "$box" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s (box $box s; 124: the box ran out)" | tee -a "$summary"
  tail -n 25 "$work/$name.log" >> "$summary"
}

begin() {
  work=$(mktemp -d)
  if [ -z "${FLASHTILE_COMMIT:-}" ]; then
    echo "gpu_session: FLASHTILE_COMMIT is not set; the CSV rows will say commit 'unknown'" >&2
  fi
  {
    date -u +%FT%TZ
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "commit ${FLASHTILE_COMMIT:-unknown}, part $part"
  } > "$summary"
}

finish() {
  tar -czf "$OUT/$part.tar.gz" -C "$work" .
  rm -rf "$work"
  echo "part $part: $((SECONDS - start)) s" >> "$summary"
  cat "$summary"
}

# flashtile bench with ARGS alternating this commit's code and an experiment (build/exp_src, which the
# device call carries or exp_patch_step makes), twice each; the steps are bench_main_1, bench_exp_1, ...,
# the CSVs in $work/bench_main and $work/bench_exp, a plain bench's brought back as main_bench.csv and
# exp_bench.csv.
#     bench_main_exp BOX_S ARGS...
bench_main_exp() {
  local box=$1 round
  shift
  for round in 1 2; do
    step "bench_main_$round" "$box" python3 -m flashtile bench "$@" --out-dir "$work/bench_main"
    step "bench_exp_$round" "$box" env PYTHONPATH=build/exp_src python3 -m flashtile bench "$@" \
      --out-dir "$work/bench_exp"
  done
  cp "$work"/bench_main/bench.csv "$OUT"/main_bench.csv 2>/dev/null
  cp "$work"/bench_exp/bench.csv "$OUT"/exp_bench.csv 2>/dev/null
}

# The paper grid in MODE (flashtile bench --paper --mode MODE ARGS...) in a box of BOX_S, its CSV brought
# back as NAME.csv.
#     paper_mode_step NAME BOX_S MODE [bench arguments]
paper_mode_step() {
  local name=$1 box=$2 mode=$3
  shift 3
  step "$name" "$box" python3 -m flashtile bench --paper --mode "$mode" "$@" --out-dir "$work/bench" \
    --name "$name"
  cp "$work/bench/$name.csv" "$OUT"/ 2>/dev/null
}

# The paper grid whole, a mode at a time (backward first), with cuDNN and SDPA flash (Flex was never the
# best peer of a paper cell on the H200), each mode in a box of BOX_S; its CSVs brought back as MODE.csv.
#     paper_grid_whole BOX_S
paper_grid_whole() {
  local mode
  for mode in bwd fwd fwd_bwd; do
    step "bench_$mode" "$1" python3 -m flashtile bench --paper --mode "$mode" \
      --peers flashtile sdpa-cudnn sdpa-flash --no-plot --out-dir "$work/bench" --name "$mode"
    cp "$work/bench/$mode.csv" "$OUT"/ 2>/dev/null
  done
}

# flashtile bench with ARGS under the knob ENV at each of VALUES ("0 1", say) in turn, twice over; the
# steps are NAME_VALUE_ROUND, the CSVs NAME_VALUE.csv, brought back.
#     bench_knob_values ENV "VALUES" NAME BOX_S ARGS...
bench_knob_values() {
  local knob=$1 values=$2 name=$3 box=$4 round value
  shift 4
  for round in 1 2; do
    for value in $values; do
      step "${name}_${value}_$round" "$box" env "$knob=$value" python3 -m flashtile bench "$@" --no-plot \
        --out-dir "$work/bench" --name "${name}_$value"
    done
  done
  cp "$work"/bench/"$name"_*.csv "$OUT"/
}

# The GPU tests named by the arguments, time-boxed, their JUnit XML brought back as gpu_tests_PART.xml.
#     gpu_tests_step BOX_S [pytest arguments]
gpu_tests_step() {
  local box=$1
  shift
  step gpu_tests "$box" "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_$part.xml" "$@"
  cp "$work/gpu_tests_$part.xml" "$OUT"/ 2>/dev/null
}

# build/exp_src: this tree's src with the patch PATCH (paths relative to src, as `git diff --relative=src`
# writes them) applied, by git apply or else patch; a step of its own, so that a patch that no longer
# applies shows in summary.txt.
#     exp_patch_step PATCH
exp_patch_step() {
  rm -rf build/exp_src && mkdir -p build && cp -r src build/exp_src
  step exp_made 30 bash -c "git apply --directory=build/exp_src '$1' 2>/dev/null || patch -d build/exp_src -p1 < '$1'"
}

# The GPU tests named by the arguments under the experiment (build/exp_src), time-boxed, their JUnit XML
# brought back as gpu_tests_exp.xml.
#     gpu_tests_exp_step BOX_S [pytest arguments]
gpu_tests_exp_step() {
  local box=$1
  shift
  step gpu_tests_exp "$box" env PYTHONPATH=build/exp_src "${pytest_gpu[@]}" \
    --junitxml="$work/gpu_tests_exp.xml" "$@"
  cp "$work/gpu_tests_exp.xml" "$OUT"/ 2>/dev/null
}

# The sanitizer grid's GROUP (comma-separated groups too): its kernels compiled first, then memcheck with
# the caching allocator off; further arguments go to sanitize_kernels.py (--repeat 2).
#     memcheck_group GROUP PRECOMPILE_S MEMCHECK_S [sanitize_kernels.py arguments]
memcheck_group() {
  local group=$1 pre=$2 mem=$3
  shift 3
  step precompile "$pre" python3 scripts/sanitize_kernels.py --only "$group" "$@"
  step memcheck "$mem" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
    --error-exitcode 1 python3 scripts/sanitize_kernels.py --only "$group" "$@"
}

case "$part" in
  a)
    tests=("$@")
    [ ${#tests[@]} -gt 0 ] || tests=("${NEW_TESTS[@]}" "${OLD_TESTS[@]}")
    exec bash scripts/gpu_acceptance.sh "${tests[@]}"
    ;;
  b)
    begin
    bench=(python3 -m flashtile bench --out-dir "$work/bench")
    step bench_paper 340 "${bench[@]}" --paper
    step bench_decode 60 "${bench[@]}" --decode --quick
    step bench_masks 200 "${bench[@]}" --masks --quick
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  c)
    begin
    tests=("$@")
    [ ${#tests[@]} -gt 0 ] || tests=("${OLD_TESTS[@]}")
    train=(python3 examples/train_llama.py --context 8192 --steps 300 --out-dir "$work/train")
    step train_flashtile 170 "${train[@]}" --attn flashtile
    step train_sdpa 170 "${train[@]}" --attn sdpa
    # D = 64's m64-cols and m128 and D = 256's n64 (correctness is tests/test_gpu_hopper_bwd.py's, in part a).
    step hopper_bwd_timing 150 python3 scripts/hopper_bwd_check.py --only 64:m64-cols,64:m128,256 \
      --skip-correctness --timeout 100
    step bench_options 150 python3 -m flashtile bench --options --out-dir "$work/bench"
    step gpu_tests_rest 600 "${pytest_gpu[@]}" --durations=15 \
      --junitxml="$work/gpu_tests_rest.xml" "${tests[@]}"
    cp "$work"/train/loss.png "$work"/bench/bench_options.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s52a)
    # The GPU files that reach the D = 256 causal forward with options, not run since its own 64-key tiles
    # (a3157ed); the paper forward at D = 256; fwd_bwd D = 256 causal 512 twice; racecheck over the Gluon
    # cases.
    begin
    gpu_tests_step 320 tests/test_sinks.py tests/test_kernel_options.py tests/test_gpu_api.py
    paper_mode_step fwd256 110 fwd --head-dim 256 --peers flashtile sdpa-cudnn sdpa-flash --no-plot
    for round in 1 2; do
      step "fb256c512_$round" 30 python3 -m flashtile bench --mode fwd_bwd --head-dim 256 --seqlen 512 \
        --causal true --peers flashtile sdpa-cudnn sdpa-flash --no-plot --out-dir "$work/bench" --name fb256c512
    done
    cp "$work/bench/fb256c512.csv" "$OUT"/ 2>/dev/null
    step racecheck 80 compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_kernels.py \
      --only hopper
    finish
    ;;
  s52b)
    # torch.func (vmap, per-sample gradients, jacrev) and the packed S_dmask under compile on the GPU, the
    # API file whole; then where the short backward's time goes, kernel by kernel (preprocess, fused
    # kernel, dQ conversion; cuDNN's beside them).
    begin
    gpu_tests_step 300 tests/test_func_transforms.py tests/test_compile.py tests/test_gpu_api.py
    step bwd_kernels 150 python3 scripts/bwd_causal_gap.py --head-dims 128 64 --seqlens 512 2048 \
      --csv "$work/bwd_kernels.csv" --label s52b
    cp "$work/bwd_kernels.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  *)
    echo "usage: FLASHTILE_COMMIT=<commit> bash scripts/gpu_session.sh a|b|c [test files for a and c]" >&2
    exit 2
    ;;
esac
