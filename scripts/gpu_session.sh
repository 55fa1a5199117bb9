#!/usr/bin/env bash
# The GPU session's plan: three device calls on one H100, each under 9 minutes (the device tool allows 10 a
# call and brings back at most 8 files of $OUT, 2 folders deep). docs/testing.md, "On the GPU", has the
# expected times and what each call brings back.
#
#   a  tests and sanitizer: scripts/gpu_acceptance.sh over the GPU suite, the new kernels' tests first
#      (pytest time-boxed at 270 s), then memcheck over the sanitizer grid and racecheck over its Gluon cases
#   b  benchmarks: flashtile bench --paper, --decode --quick, --masks --quick
#   c  training and the rest: examples/train_llama.py at 8k context with flashtile then sdpa (300 steps each),
#      scripts/hopper_bwd_check.py timing of the backward variants not yet timed, flashtile bench --options,
#      then the GPU tests that call a did not reach, until the deadline
#   d  first after the fourth session: the dropout and block-sparse GPU cases, bench --options (dropout's
#      speed), a short training pair
#   e  the fifth session's last call: GPU tests named by the arguments, the small-N cells against cuDNN
#      (host-bound), the option rows' forward against Flex
#   f  the sixth session's first call: GPU tests named by the arguments, the training example profiled
#      (flashtile, then sdpa: where the step time goes), then memcheck over the sanitizer cases from 157 on
#   g  the sixth session's second call: the training pair (300 steps each, after the varlen backward's fix
#      of mid-run compilations), then the paper grid's D = 256 cells (its backward now the Gluon one)
#   h  the sixth session's decode call: the decode and KV-cache GPU tests (the page number now loaded to a
#      register), bench --decode --quick, scripts/decode_check.py --quick (batch-1 config and split sweep),
#      then the training pair in the other order (sdpa first: does the order move the host-bound ratio?)
#   i  the sixth session's Gluon backward options: the GPU tests named by the arguments with
#      FLASHTILE_HOPPER_BWD_OPTIONS=1, bench --options window softcap alibi with it, bench --decode --quick
#   k  the Gluon varlen forward: the GPU tests named by the arguments, bench --options varlen and training
#      runs with FLASHTILE_HOPPER_FWD_VARLEN=1
#   j  the sixth session's last call: the training pairs in both orders (sdpa, flashtile, flashtile, sdpa),
#      then bench --decode --quick and scripts/decode_check.py (the new split heuristic at every cache length)
#   l  the seventh session's host call: scripts/host_profile_packed.py (the example's attention layer: host µs
#      against SDPA, cProfile of the forward and the backward), the example's steps under cProfile
#      (flashtile, then sdpa), then a training pair sdpa, flashtile (150 steps)
#   m  the seventh session's option forwards: the GPU tests named by the arguments, bench --options softcap
#      alibi (ALiBi's distances in fp32; at c6565ef also half of softcap's exponentials as an FMA-pipe
#      polynomial, compared there with FLASHTILE_HOPPER_SOFTCAP_EXP2=mufu: slower, so removed after)
#   n  the seventh session's Gluon varlen backward: the GPU tests named by the arguments with
#      FLASHTILE_HOPPER_BWD_VARLEN=1, bench --options varlen with it, training runs (flashtile with it, sdpa,
#      flashtile with it; 150 steps)
#
#   o  the eighth session's training call: the example at hidden 1024 (its new default: 8 heads of 128) and
#      512, the backward on the calling thread (--backward-thread caller) and in autograd's device thread
#      (engine, PyTorch's default), flashtile then sdpa (300 steps each)
#
#   p  first after the eighth session: memcheck over the decode group (the paged page-number clamp, not yet
#      run on a GPU) and the hopper_options group (Gluon packed and option cases, new), then the decode,
#      KV-cache, transformers and CLI GPU tests and the Gluon varlen backward's (both epilogues), then bench
#      --options varlen without and with FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=1
#
#   q  the ninth session's second call: the transformers and CLI GPU tests (the first call's box ran out in
#      them), the training pair at the example's default (flashtile, sdpa; 300 steps), then memcheck over the
#      sanitizer grid's mods and portable groups (not run since their kernels last changed)
#
#   r  the ninth session's decode call: the decode GPU tests with the splits' merge both ways (a second
#      kernel, or fused into the decode kernel), memcheck over the decode group with the fused merge, then
#      the stage check (at b28c56a named decode_combine_check.py, timing the two merges at 3 and 2 stages;
#      the fused merge was slower and is gone)
#   s  the ninth session's fourth call: the decode, KV-cache and transformers GPU tests (2 stages for short
#      splits), bench --decode --quick, scripts/decode_stages_check.py
#
#   t  the ninth session's PDL call: scripts/decode_stages_check.py (the default with and without
#      FLASHTILE_DECODE_PDL=1, the combine launched while the split kernel runs), then the decode, KV-cache
#      and transformers GPU tests with it
#
#   u  the ninth session's last call: bench --decode --quick, then the whole bench --decode grid (the
#      combine by programmatic dependent launch now the default)
#
#   v  for the next session: scripts/decode_two_speeds.py (batch 1 at 64k and 128k with the caches allocated
#      fresh, after a freed large block and shifted: the two speeds of the ninth session's decode grid), then
#      test_cli_bench and memcheck over the portable cases the ninth session did not reach
#   w  the tenth session's block masks in the Gluon kernels: their GPU tests and the block-sparse ones,
#      bench --masks --quick, then the Gluon forward and backward tests but varlen (nothing else regressed)
#   x  the tenth session's mask_mods in the Gluon kernels (a block mask's partial blocks): the block-mask
#      GPU tests, the whole bench --masks (prefix-LM too), then the Gluon forward and backward test files
#   y  memcheck over the sanitizer's hopper_sparse group (block masks and mask_mods in the Gluon kernels),
#      then the Gluon forward and backward test files and the causal block-mask test (against the oracle now)
#   z  the mask bits (create_block_mask's mask_mod on the partial tiles, read by the Gluon kernels): the
#      block-mask GPU tests, bench --masks with its new-mask first call, memcheck over hopper_sparse
#   za the mask bits' loop-invariant loads hoisted: the block-mask GPU tests and bench --masks again
#   zb the GPU tests of the files around the session's changes (bench --masks end to end, launch cache, CLI,
#      API, hardening), then memcheck over the portable cases from the 97th
#   zc the block-mask GPU tests after their shared oracle check, and the decode, KV-cache and transformers
#      GPU tests with flash_attn_with_kvcache passing cache_seqlens itself when nothing is appended
#
#   ze the eleventh session's dropout in the Gluon kernels: the dropout, dispatch and option GPU tests, then
#      bench --options dropout with its bits drawn while the wgmmas run and after S lands
#   zf bench --options dropout (one Philox call per eight forward entries, the forward's key schedule
#      hoisted, the backward comparing only its half of each draw), then the Gluon forward and backward test
#      files and the API's option and dropout GPU tests
#   zg memcheck over the new hopper_dropout sanitizer group, scripts/decode_lse_tail.py (the tenth session's
#      decode LSE miss: its seed and 150 others, the kernel's error split into input rounding and its own
#      arithmetic), then the decode, KV-cache and transformers GPU tests
#   zh the KV-cache GPU tests with the tenth session's failing seed pinned (the oracle now attends to the
#      rotary op's rounded q and k), then the rest of the GPU suite on the session's code: kernel options,
#      kernels, sinks, head dims, block masks (portable and Gluon), API, hardening, CLI, launch cache
#   zi bench --options dropout on the portable kernels (FLASHTILE_BACKEND=triton: the new mask rule there),
#      then the GPU test files zh's box did not reach
#   zj the CLI and launch-cache GPU tests (zi's box ran out in the CLI's)
#   zk the session's last kernel change (the dropout threshold unspecialised): the dropout GPU tests and
#      bench --options dropout again
#   zl the session's final code (keep_tile's tile order in a helper): the dropout GPU tests, then the whole
#      bench --options on the H200 (every option against its peers in one run)
#   zn the last review's change to the portable draws (_kept over _kept_half): the dropout GPU tests of the
#      API, the Gluon kernels and the portable kernels' options
#
#   zo the twelfth session's first call, the paper grid's short cells: benchmarks/launch_overhead.py at
#      N = 512, 1k, 2k and D = 64, 128, 256 with SDPA cuDNN beside flashtile (host µs, per-call ms, kernel
#      ms: which cells trail on the host, which in the kernels), then benchmarks/host_path.py on this host
#   zp the persistent Gluon forward: scripts/hopper_persistent_check.py (persistent against one program a
#      work tile and cuDNN, CUDA-graph kernel times), then the Gluon forward's GPU tests (dense, options,
#      varlen, block masks) and the backward's, which run the forward first
#   zq the persistent forward with causal work tiles longest-first across heads: scripts/hopper_persistent_check.py
#      with the eleventh session's forward (scripts/baseline_hopper_fwd.py, untracked: `git show
#      d579e7f:src/flashtile/kernels/hopper/fwd.py`) timed beside
#   zr the persistent grid for plain attention only (causal, options, packed batches and block masks keep one
#      program a work tile): scripts/hopper_persistent_check.py with the baseline, then the Gluon forward,
#      block-mask and backward GPU tests
#   zs scripts/hopper_persistent_check.py with each implementation timed in every position of a cell's
#      order (zr's first-timed kernel read up to 11 % faster than the same kernel timed second)
#   zt the session's final forward (persistent at D = 64 or N_k ≤ 2k; q_bar waited inside the tile as before
#      for one program a tile): the Gluon forward, block-mask and backward GPU tests, then
#      scripts/hopper_persistent_check.py with the baseline
#   zu flashtile bench --paper (every peer in the same run), then benchmarks/launch_overhead.py --peer
#   zv memcheck over the new hopper_persistent sanitizer group (programs looping over several work tiles),
#      benchmarks/launch_overhead.py --peer with the remembered verdicts of plain calls, the API GPU tests
#   zw flashtile bench --paper again (the plain calls' shorter host path in the short cells)
#
#     FLASHTILE_COMMIT=<12 hex digits of HEAD> bash scripts/gpu_session.sh a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t|u|v|w|x|y|z|za|zb|zc|ze|zf|zg|zh|zi|zj|zk|zl|zn|zo|zp|zq|zr|zs|zt|zu|zv|zw|s13a|s13b|s13c|s13d|s13e|s13f|s14a|s14b|s14c|s14d|s14e|s14f|s14g|s14h|s14i|s15a|s15b|s15c|s15d|s15e|s15f|s15g|s15h|s15i|s15j|s15k|s15l|s16a|s16b|s16c|s16d|s16e|s16f|s16g|s16h|s16i|s16j|s16k|s16l|s17a|s17b|s17c|s17d|s17e|s17f|s17g|s17h|s17i|s18a|s18b|s18c|s18d|s18e|s18f|s18g|s18h|s18i|s18j|s18k|s18l|s18m|s18n|s19a|s19b|s19c|s19d|s19e|s19f|s19g|s19h|s19i|s19j|s20a|s20b|s20c|s20d|s20e|s20f|s20g|s20h|s21a|s21b|s21c|s21d|s21e|s21f|s21g|s21h|s21i|s22a|s22b|s22c|s22d|s22e|s22f|s22h|s23a|s23b|s23c|s23d|s23e|s23f|s23g|s24a|s24b|s24c|s24d|s24e|s25a|s26a|s26b|s26c|s26d|s26e|s27a|s27b|s27c|s27d|s27e|s27f|s27g|s27h|s28a|s28b|s28c|s28d|s29a|s29b|s29c|s29d|s29e|s29f|s29g|s29h|s29i|s30a|s30b|s30c|s30d|s30e|s31a|s31b|s31c|s31d|s31e|s31f|s31g|s32a|s32b|s32c|s32d|s33a|s33b|s33c|s33d|s33e|s33f|s33g|s34a|s34b|s34c|s34d|s34e|s34f|s34g|s34h|s34i|s35a|s35b|s35c|s35d|s35e|s36a|s36b|s36c|s36d|s36e|s36f|s37b|s37c|s37e|s38a|s38b|s38c|s38d|s38e|s39a|s39b|s39c|s39d|s39e|s39f|s40a|s40b|s41a|s41b|s41c|s41d|s41e|s42a|s42b|s42c|s42d|s42e|s43a|s43b|s43c|s43d|s43e|s43f|s43g|s43h|s43i|s44a|s44b|s44c|s44d|s45b|s45d|s45e|s45f|s45g|s46a|s46b|s46c|s46d|s46e|s46f|s46g|s47a|s47b|s47c|s47d|s47e|s47f|s47g|s48a|s48b|s48c|s48d|s48e|s48f|s48g|s49c|s50a|s50b|s50c|s51a [test files for a, c, e, f, h, i and k]
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

# bench --options OPTION alternating the previous code (build/old_src, which the device call carries) and
# this commit's, twice each, so the two are compared within one call (the seventeenth session's parts).
#     bench_old_new OPTION BOX_S
bench_old_new() {
  bench_old_new_args "$1" "$2" --options "$1"
}

# The CSVs of an options run with every peer ($work/bench) and of bench_old_new_args over --options, brought
# back (CSVs only: a call brings back at most eight files).
options_csvs_out() {
  cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
  cp "$work"/bench_old/bench_options.csv "$OUT"/old_options.csv 2>/dev/null
  cp "$work"/bench_new/bench_options.csv "$OUT"/new_options.csv 2>/dev/null
}

# flashtile bench with ARGS alternating the previous code (build/old_src) and this commit's, twice each;
# the steps are named bench_NAME_old_1, bench_NAME_new_1, ...
#     bench_old_new_args NAME BOX_S ARGS...
bench_old_new_args() {
  local name=$1 box=$2 round
  shift 2
  for round in 1 2; do
    step "bench_${name}_old_$round" "$box" env PYTHONPATH=build/old_src python3 -m flashtile bench "$@" \
      --out-dir "$work/bench_old"
    step "bench_${name}_new_$round" "$box" python3 -m flashtile bench "$@" --out-dir "$work/bench_new"
  done
}

# The CSVs of bench_old_new_args over a plain bench (not --options), brought back as old_bench.csv and
# new_bench.csv.
old_new_csvs_out() {
  cp "$work"/bench_old/bench.csv "$OUT"/old_bench.csv 2>/dev/null
  cp "$work"/bench_new/bench.csv "$OUT"/new_bench.csv 2>/dev/null
}

# The causal D = 256 backward at 1k-8k with cuDNN, build/old_src against this commit alternating twice
# (bench_old_new_args), the CSVs brought back (old_new_csvs_out): the forty-third session's A/B.
bench_d256_causal_old_new() {
  bench_old_new_args d256c 80 --head-dim 256 --causal true --mode bwd --seqlen 1024 2048 4096 8192 \
    --peers flashtile sdpa-cudnn --no-plot
  old_new_csvs_out
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
  step "$name" "$box" python3 -m flashtile bench --paper --mode "$mode" "$@" --out-dir "$work/bench"
  cp "$work"/bench/bench.csv "$OUT/$name.csv" 2>/dev/null
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

# The paper grid's forward in a box of BOX_S; its CSV (bench_fwd.csv) and plot brought back.
#     paper_fwd_step BOX_S
paper_fwd_step() {
  paper_mode_step bench_fwd "$1" fwd
  cp "$work"/bench/bench_fwd_bf16.png "$OUT"/ 2>/dev/null
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

# The whole flashtile bench --decode grid, its CSV and plot brought back.
bench_decode_step() {
  step bench_decode 330 python3 -m flashtile bench --decode --out-dir "$work/bench"
  cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
}

# scripts/bwd_causal_gap.py at the head dims given (4k and 16k), its CSV and log brought back.
#     bwd_gap_step HEAD_DIM...
bwd_gap_step() {
  step bwd_causal_gap 150 python3 scripts/bwd_causal_gap.py --head-dims "$@" --seqlens 4096 16384 \
    --csv "$OUT/bwd_causal_gap.csv" --label "${FLASHTILE_COMMIT:-unknown}"
  cp "$work/bwd_causal_gap.log" "$OUT/"
}

# build/exp_src: this tree's src with the sed expressions applied to kernels/hopper/bwd.py, a step checking
# that they changed exactly LINES lines (an expression that no longer matches fails it).
#     exp_bwd_step LINES SED_EXPRESSION...
exp_bwd_step() {
  local lines=$1 expression
  shift
  rm -rf build/exp_src && mkdir -p build && cp -r src build/exp_src
  local exp_bwd=build/exp_src/flashtile/kernels/hopper/bwd.py
  for expression in "$@"; do
    sed -i "$expression" "$exp_bwd"
  done
  step exp_made 30 bash -c "test \$(diff src/flashtile/kernels/hopper/bwd.py $exp_bwd | grep -c '^>') -eq $lines"
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

# Nsight Compute (--set full) on the forward of scripts/cell_profile.py's --option cell, for each OPTION in
# turn, then its stall samples summed by opcode and the scheduler and warp-state sections: source_<OPTION>.log.
#     ncu_fwd_options BOX_S OPTION...
ncu_fwd_options() {
  local box=$1 opt
  shift
  for opt in "$@"; do
    step "sampled_$opt" "$box" ncu --nvtx --nvtx-include "profiled/" --kernel-name regex:attn_fwd --set full \
      --import-source no -f -o "$work/$opt" python3 scripts/cell_profile.py --option "$opt"
    step "source_$opt" 60 bash -c "ncu -i '$work/$opt.ncu-rep' --page source --print-source sass --csv \
      > '$work/${opt}_source.csv'; python3 scripts/ncu_source_top.py '$work/${opt}_source.csv' --top 40; \
      ncu -i '$work/$opt.ncu-rep' --page details --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section LaunchStats"
    cp "$work/source_$opt.log" "$OUT/"
  done
  rm -f "$work"/*.ncu-rep "$work"/*_source.csv
}

# scripts/host_profile_dense.py at the paper grid's causal N = 512 cell of a head dim (B = 32), its log
# host_d<D>_causal_512.log.
#     host_profile_512_step HEADS HEAD_DIM
host_profile_512_step() {
  step "host_d$2_causal_512" 150 python3 scripts/host_profile_dense.py --batch 32 --seqlen 512 --heads "$1" \
    --head-dim "$2" --causal
}

# Nsight Compute's launch statistics (grid, block, registers, shared memory, occupancy) of each cell,
# "impl mode D N [--causal]" as scripts/cell_profile.py takes them, gathered into launch_stats.log.
#     launch_stats_steps CELL...
launch_stats_steps() {
  local cell
  for cell in "$@"; do
    # A cell's fifth word (--causal) may be absent: set -u wants it defaulted.
    set -- $cell
    step "launch_$1_$2_d$3_n$4${5:+_causal}" 60 ncu --nvtx --nvtx-include "profiled/" --section LaunchStats \
      --section Occupancy --section SpeedOfLight python3 scripts/cell_profile.py --impl "$1" --mode "$2" \
      --head-dim "$3" --seqlen "$4" ${5:-}
  done
  cat "$work"/launch_*.log > "$OUT/launch_stats.log"
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

# scripts/host_launchers_gpu.py alternating the previous code (build/old_src) and this commit's, ROUNDS
# times each, into host_launchers.csv (brought back).
#     host_launchers_old_new ROUNDS
host_launchers_old_new() {
  local round
  for round in $(seq "$1"); do
    step "host_old_$round" 60 env PYTHONPATH=build/old_src python3 scripts/host_launchers_gpu.py \
      --label "old_$round" --csv "$work/host_launchers.csv"
    step "host_new_$round" 60 python3 scripts/host_launchers_gpu.py --label "new_$round" \
      --csv "$work/host_launchers.csv"
  done
  cp "$work/host_launchers.csv" "$OUT"/ 2>/dev/null
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

# scripts/varlen_bwd_gap.py run twice each way, alternating: under ENV_A (one `env` assignment such as
# PYTHONPATH=build/exp_src, or - for none) with rows labelled A-1, A-2, then under ENV_B as B; the steps
# are named gap_A_1, gap_B_1, ...; the rows go to $work/varlen_gap.csv, brought back.
#     varlen_gap_pair BOX_S A ENV_A B ENV_B [varlen_bwd_gap.py arguments]
varlen_gap_pair() {
  local box=$1 round side label setting
  local -a sides=("$2" "$3" "$4" "$5")
  shift 5
  for round in 1 2; do
    for side in 0 2; do
      label=${sides[side]}
      setting=${sides[side + 1]}
      [ "$setting" = - ] && setting=
      step "gap_${label}_$round" "$box" env ${setting:+"$setting"} python3 scripts/varlen_bwd_gap.py \
        --csv "$work/varlen_gap.csv" --label "$label-$round" "$@"
    done
  done
  cp "$work/varlen_gap.csv" "$OUT"/ 2>/dev/null
}

# A varlen call (parts k and n): the GPU tests named by the arguments, bench --options varlen and training
# runs flashtile / sdpa / flashtile (150 steps), with KNOB=1 where flashtile runs.
#     varlen_call KNOB TESTS_S BENCH_S TRAIN_S PART [test files]
varlen_call() {
  local knob=$1 tests_s=$2 bench_s=$3 train_s=$4 name=$5
  shift 5
  step gpu_tests "$tests_s" env "$knob=1" "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_$name.xml" "$@"
  step bench_varlen "$bench_s" env "$knob=1" python3 -m flashtile bench --options varlen --out-dir "$work/bench"
  local train=(python3 examples/train_llama.py --context 8192 --steps 150 --out-dir "$work/train")
  step train_flashtile_1 "$train_s" env "$knob=1" "${train[@]}" --attn flashtile
  step train_sdpa "$train_s" "${train[@]}" --attn sdpa
  step train_flashtile_2 "$train_s" env "$knob=1" "${train[@]}" --attn flashtile
  cp "$work/gpu_tests_$name.xml" "$work"/bench/*.csv "$work"/train/loss.png "$OUT"/ 2>/dev/null
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
  d)
    # What changed without a GPU at the end of the fourth session, first: dropout's eight-keys-per-Philox
    # draws and the block-list helper (their GPU cases, then the dropout rows' speed), then training.
    begin
    step gpu_dropout_masks 240 "${pytest_gpu[@]}" --junitxml="$work/gpu_dropout_masks.xml" tests/test_kernel_options.py tests/test_gpu_api.py \
      tests/test_block_sparse.py tests/test_launch_cache.py -k "drop or mask or sparse or direct"
    step bench_options 150 python3 -m flashtile bench --options --out-dir "$work/bench"
    train=(python3 examples/train_llama.py --context 8192 --steps 150 --out-dir "$work/train")
    step train_flashtile 60 "${train[@]}" --attn flashtile
    step train_sdpa 60 "${train[@]}" --attn sdpa
    cp "$work"/bench/bench_options.csv "$work"/gpu_dropout_masks.xml "$OUT"/ 2>/dev/null
    finish
    ;;
  e)
    # The fifth session's last call: the Gluon launchers' direct relaunch (and whatever Gluon kernels
    # changed) under the given pytest arguments, the host-bound small-N cells against cuDNN, the option
    # rows' forward against Flex, and the D = 256 Gluon backward (n64, GPU-checked in this session's part
    # a) against the portable one it would replace.
    begin
    step gpu_tests 150 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
      --junitxml="$work/gpu_tests_e.xml" "$@"
    bench=(python3 -m flashtile bench --out-dir "$work/bench" --dtype bf16)
    step bench_small_n 60 "${bench[@]}" --head-dim 128 --seqlen 512 1k 2k --causal both --mode fwd bwd \
      --peers flashtile sdpa-cudnn --name bench_small_n
    step bench_options_fwd 70 "${bench[@]}" --options --mode fwd --peers flashtile flex
    d256=("${bench[@]}" --head-dim 256 --seqlen 4k 16k --causal both --mode bwd --name bench_d256_bwd)
    step bench_d256_portable 30 "${d256[@]}" --peers flashtile sdpa-cudnn
    step bench_d256_gluon 30 env FLASHTILE_HOPPER_BWD_VARIANT=n64 "${d256[@]}" --peers flashtile
    cp "$work"/gpu_tests_e.xml "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  f)
    begin
    # The sanitizer cases not yet run under memcheck are compiled (run once, unsanitised) beside the tests.
    timeout 200 python3 scripts/sanitize_kernels.py --start 157 > "$work/precompile.log" 2>&1 &
    precompile=$!
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_f.xml" "$@"
    wait $precompile
    echo "== precompile: exit $?" >> "$summary"
    train=(python3 examples/train_llama.py --context 8192 --steps 40 --profile 10 --out-dir "$work/train")
    step profile_flashtile 80 "${train[@]}" --attn flashtile
    step profile_sdpa 80 "${train[@]}" --attn sdpa
    step memcheck 150 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --start 157
    cp "$work"/gpu_tests_f.xml "$work"/train/*_profile.txt "$OUT"/ 2>/dev/null
    finish
    ;;
  g)
    begin
    train=(python3 examples/train_llama.py --context 8192 --steps 300 --out-dir "$work/train")
    step train_flashtile 170 "${train[@]}" --attn flashtile
    step train_sdpa 170 "${train[@]}" --attn sdpa
    step bench_d256 200 python3 -m flashtile bench --paper --head-dim 256 --mode fwd bwd \
      --out-dir "$work/bench" --name bench_d256
    cp "$work"/train/loss.png "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  h)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_h.xml" tests/test_decode_kernel.py tests/test_gpu_kvcache.py "$@"
    step bench_decode 70 python3 -m flashtile bench --decode --quick --out-dir "$work/bench"
    step decode_check 120 python3 scripts/decode_check.py --quick
    train=(python3 examples/train_llama.py --context 8192 --steps 150 --out-dir "$work/train")
    step train_sdpa 80 "${train[@]}" --attn sdpa
    step train_flashtile 80 "${train[@]}" --attn flashtile
    cp "$work"/gpu_tests_h.xml "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  i)
    begin
    step gpu_tests 240 env FLASHTILE_HOPPER_BWD_OPTIONS=1 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_i.xml" "$@"
    step bench_options 200 env FLASHTILE_HOPPER_BWD_OPTIONS=1 python3 -m flashtile bench --options window \
      softcap alibi --out-dir "$work/bench"
    step bench_decode 60 python3 -m flashtile bench --decode --quick --out-dir "$work/bench"
    cp "$work"/gpu_tests_i.xml "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  k)
    begin
    varlen_call FLASHTILE_HOPPER_FWD_VARLEN 200 120 50 k "$@"
    finish
    ;;
  j)
    begin
    train=(python3 examples/train_llama.py --context 8192 --steps 150)
    step train_sdpa_1 60 "${train[@]}" --attn sdpa --out-dir "$work/train1"
    step train_flashtile_1 60 "${train[@]}" --attn flashtile --out-dir "$work/train1"
    step train_flashtile_2 60 "${train[@]}" --attn flashtile --out-dir "$work/train2"
    step train_sdpa_2 60 "${train[@]}" --attn sdpa --out-dir "$work/train2"
    step bench_decode 70 python3 -m flashtile bench --decode --quick --out-dir "$work/bench"
    step decode_check 150 python3 scripts/decode_check.py
    cp "$work"/train1/loss.png "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  l)
    begin
    step host_profile 90 python3 scripts/host_profile_packed.py --out "$work/host_profile.txt"
    train=(python3 examples/train_llama.py --context 8192 --steps 40 --python-profile 20 --out-dir "$work/train")
    step python_profile_flashtile 70 "${train[@]}" --attn flashtile
    step python_profile_sdpa 70 "${train[@]}" --attn sdpa
    pair=(python3 examples/train_llama.py --context 8192 --steps 150 --out-dir "$work/pair")
    step train_sdpa 60 "${pair[@]}" --attn sdpa
    step train_flashtile 60 "${pair[@]}" --attn flashtile
    cp "$work"/host_profile.txt "$work"/train/*_python_profile.txt "$OUT"/ 2>/dev/null
    finish
    ;;
  m)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_m.xml" "$@"
    step bench_options 150 python3 -m flashtile bench --options softcap alibi --out-dir "$work/bench"
    cp "$work"/gpu_tests_m.xml "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  n)
    begin
    varlen_call FLASHTILE_HOPPER_BWD_VARLEN 250 90 45 n "$@"
    finish
    ;;
  o)
    begin
    for hidden in 1024 512; do
      for thread in caller engine; do
        train=(python3 examples/train_llama.py --context 8192 --steps 300 --hidden "$hidden"
          --backward-thread "$thread" --out-dir "$work/train_${hidden}_${thread}")
        step "train_flashtile_${hidden}_${thread}" 70 "${train[@]}" --attn flashtile
        step "train_sdpa_${hidden}_${thread}" 70 "${train[@]}" --attn sdpa
        cp "$work/train_${hidden}_${thread}/loss.png" "$OUT/loss_${hidden}_${thread}.png" 2>/dev/null
      done
    done
    grep -h "tokens/s" "$work"/train_*.log | tee "$OUT/tokens.txt"
    finish
    ;;
  p)
    begin
    # Fill Triton's cache outside the sanitizer (compiling inside it is slow), then memcheck the decode group and
    # the Gluon option and packed cases (new in the eighth session, not yet run).
    step precompile 100 python3 scripts/sanitize_kernels.py --only decode,hopper_options
    step memcheck 150 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only decode,hopper_options
    step gpu_tests 170 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_p.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py tests/test_gpu_transformers.py tests/test_cli_bench.py "$@"
    # The varlen cases run with the epilogue experiment off and on (the fixture's two parameters).
    step gpu_tests_varlen 60 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_p_varlen.xml" \
      tests/test_gpu_hopper_bwd.py -k varlen
    # The epilogue experiment against the default, one run each (compare within this call only).
    step bench_varlen 45 python3 -m flashtile bench --options varlen --out-dir "$work/bench"
    step bench_varlen_tma 45 env FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=1 python3 -m flashtile bench \
      --options varlen --out-dir "$work/bench_tma"
    cp "$work"/gpu_tests_p*.xml "$OUT"/ 2>/dev/null
    cp "$work/bench/bench_options.csv" "$OUT/bench_options.csv" 2>/dev/null
    cp "$work/bench_tma/bench_options.csv" "$OUT/bench_options_tma.csv" 2>/dev/null
    finish
    ;;
  q)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_q.xml" tests/test_gpu_transformers.py \
      tests/test_cli_bench.py "$@"
    train=(python3 examples/train_llama.py --context 8192 --steps 300 --out-dir "$work/train")
    step train_flashtile 90 "${train[@]}" --attn flashtile
    step train_sdpa 70 "${train[@]}" --attn sdpa
    step precompile 60 python3 scripts/sanitize_kernels.py --only mods,portable
    step memcheck 300 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only mods,portable
    cp "$work/gpu_tests_q.xml" "$work"/train/loss.png "$work"/train/*_loss.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  r)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_r.xml" tests/test_decode_kernel.py "$@"
    step precompile 60 env FLASHTILE_DECODE_COMBINE=fused python3 scripts/sanitize_kernels.py --only decode
    step memcheck 90 env FLASHTILE_DECODE_COMBINE=fused PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer \
      --tool memcheck --error-exitcode 1 python3 scripts/sanitize_kernels.py --only decode
    step combine_check 200 python3 scripts/decode_stages_check.py
    cp "$work/gpu_tests_r.xml" "$work/combine_check.log" "$OUT"/ 2>/dev/null
    finish
    ;;
  s)
    begin
    step gpu_tests 230 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py tests/test_gpu_transformers.py "$@"
    step bench_decode 70 python3 -m flashtile bench --decode --quick --out-dir "$work/bench"
    step stages_check 90 python3 scripts/decode_stages_check.py
    cp "$work/gpu_tests_s.xml" "$work/stages_check.log" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  t)
    begin
    step stages_check 90 python3 scripts/decode_stages_check.py
    step gpu_tests 230 env FLASHTILE_DECODE_PDL=1 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_t.xml" \
      tests/test_decode_kernel.py tests/test_gpu_kvcache.py tests/test_gpu_transformers.py "$@"
    cp "$work/gpu_tests_t.xml" "$work/stages_check.log" "$OUT"/ 2>/dev/null
    finish
    ;;
  u)
    begin
    step bench_decode_quick 60 python3 -m flashtile bench --decode --quick --out-dir "$work/quick"
    step bench_decode 250 python3 -m flashtile bench --decode --out-dir "$work/bench"
    cp "$work"/quick/bench_decode.csv "$OUT"/bench_decode_quick.csv 2>/dev/null
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  v)
    begin
    step two_speeds 120 python3 scripts/decode_two_speeds.py
    step gpu_tests 120 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_v.xml" tests/test_cli_bench.py "$@"
    step precompile 90 python3 scripts/sanitize_kernels.py --only portable --start 60
    step memcheck 180 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only portable --start 60
    cp "$work/gpu_tests_v.xml" "$work/two_speeds.log" "$OUT"/ 2>/dev/null
    finish
    ;;
  w)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_w.xml" \
      tests/test_gpu_hopper_block_sparse.py tests/test_block_sparse.py "$@"
    step bench_masks 230 python3 -m flashtile bench --masks --quick --out-dir "$work/masks"
    step regression 110 "${pytest_gpu[@]}" --junitxml="$work/regression_w.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_bwd.py -k "not varlen"
    cp "$work/gpu_tests_w.xml" "$work/regression_w.xml" "$work"/masks/*.csv "$work"/masks/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  x)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_x.xml" \
      tests/test_gpu_hopper_block_sparse.py tests/test_block_sparse.py "$@"
    step bench_masks 200 python3 -m flashtile bench --masks --out-dir "$work/masks"
    step regression 150 "${pytest_gpu[@]}" --junitxml="$work/regression_x.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_bwd.py
    cp "$work/gpu_tests_x.xml" "$work/regression_x.xml" "$work"/masks/*.csv "$work"/masks/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  y)
    begin
    memcheck_group hopper_sparse 90 150
    step gpu_tests 270 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_y.xml" tests/test_gpu_hopper_bwd.py \
      tests/test_gpu_hopper.py "tests/test_block_sparse.py::test_gpu_block_mask_from_kernels_default_tiles" "$@"
    cp "$work/gpu_tests_y.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  z)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_z.xml" tests/test_gpu_hopper_block_sparse.py \
      tests/test_block_sparse.py "$@"
    step bench_masks 250 python3 -m flashtile bench --masks --out-dir "$work/masks"
    step memcheck 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only hopper_sparse
    cp "$work/gpu_tests_z.xml" "$work"/masks/*.csv "$work"/masks/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  za)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_za.xml" tests/test_gpu_hopper_block_sparse.py \
      "$@"
    step bench_masks 250 python3 -m flashtile bench --masks --out-dir "$work/masks"
    cp "$work/gpu_tests_za.xml" "$work"/masks/*.csv "$work"/masks/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  zb)
    begin
    step gpu_tests 300 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zb.xml" tests/test_bench_masks.py \
      tests/test_launch_cache.py tests/test_cli_bench.py tests/test_gpu_api.py tests/test_gpu_hardening.py "$@"
    step precompile 60 python3 scripts/sanitize_kernels.py --only portable --start 97
    step memcheck 150 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only portable --start 97
    cp "$work/gpu_tests_zb.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zc)
    begin
    step gpu_tests 330 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zc.xml" tests/test_gpu_hopper_block_sparse.py \
      tests/test_gpu_kvcache.py tests/test_gpu_transformers.py tests/test_decode_kernel.py "$@"
    cp "$work/gpu_tests_zc.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  ze)
    begin
    step gpu_tests 330 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_ze.xml" -k "drop or dispatch or options" \
      tests/test_gpu_api.py tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_kernel_options.py "$@"
    step bench_dropout_early 70 env FLASHTILE_DROPOUT_DRAW_EARLY=1 python3 -m flashtile bench --options dropout \
      --out-dir "$work/early"
    step bench_dropout_late 70 env FLASHTILE_DROPOUT_DRAW_EARLY=0 python3 -m flashtile bench --options dropout \
      --out-dir "$work/late"
    cp "$work/gpu_tests_ze.xml" "$OUT"/ 2>/dev/null
    for f in "$work"/early/*.csv; do cp "$f" "$OUT/early_$(basename "$f")"; done 2>/dev/null
    for f in "$work"/late/*.csv; do cp "$f" "$OUT/late_$(basename "$f")"; done 2>/dev/null
    finish
    ;;
  zf)
    begin
    step bench_dropout 70 python3 -m flashtile bench --options dropout --out-dir "$work/bench"
    step gpu_tests 420 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zf.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_bwd.py "tests/test_gpu_api.py::test_options_match_oracle" \
      "tests/test_gpu_api.py::test_dropout_same_seed_is_bitwise_and_mask_matches_reference" \
      "tests/test_gpu_api.py::test_dropped_fraction_is_p" "$@"
    cp "$work/gpu_tests_zf.xml" "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  zg)
    begin
    memcheck_group hopper_dropout 90 120
    step lse_tail 90 env PYTHONPATH=src:. python3 scripts/decode_lse_tail.py --seeds 150 \
      --extra-seed 1574294081 --out "$work/lse_tail.csv"
    step gpu_tests 270 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zg.xml" tests/test_gpu_kvcache.py \
      tests/test_decode_kernel.py tests/test_gpu_transformers.py "$@"
    cp "$work/gpu_tests_zg.xml" "$work/lse_tail.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  zh)
    begin
    step kvcache_pinned 100 env FLASHTILE_TEST_SEED=124414929 "${pytest_gpu[@]}" --junitxml="$work/kvcache_zh.xml" \
      tests/test_gpu_kvcache.py
    step gpu_tests 420 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zh.xml" tests/test_kernel_options.py \
      tests/test_kernels.py tests/test_sinks.py tests/test_head_dims.py tests/test_block_sparse.py \
      tests/test_gpu_hopper_block_sparse.py tests/test_gpu_api.py tests/test_gpu_hardening.py \
      tests/test_cli_bench.py tests/test_launch_cache.py "$@"
    cp "$work/gpu_tests_zh.xml" "$work/kvcache_zh.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zi)
    begin
    step bench_portable_dropout 80 env FLASHTILE_BACKEND=triton python3 -m flashtile bench --options dropout \
      --out-dir "$work/bench"
    step gpu_tests 400 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zi.xml" tests/test_head_dims.py \
      tests/test_sinks.py tests/test_block_sparse.py tests/test_gpu_hopper_block_sparse.py tests/test_gpu_api.py \
      tests/test_gpu_hardening.py tests/test_cli_bench.py tests/test_launch_cache.py "$@"
    cp "$work/gpu_tests_zi.xml" "$OUT"/ 2>/dev/null
    for f in "$work"/bench/*.csv; do cp "$f" "$OUT/portable_$(basename "$f")"; done 2>/dev/null
    finish
    ;;
  zj)
    begin
    step gpu_tests 300 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zj.xml" tests/test_cli_bench.py \
      tests/test_launch_cache.py "$@"
    cp "$work/gpu_tests_zj.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zk)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zk.xml" -k "drop" tests/test_gpu_api.py \
      tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_launch_cache.py "$@"
    step bench_dropout 70 python3 -m flashtile bench --options dropout --out-dir "$work/bench"
    cp "$work/gpu_tests_zk.xml" "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  zl)
    begin
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zl.xml" -k "drop" tests/test_gpu_api.py \
      tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py "$@"
    step bench_options 330 python3 -m flashtile bench --options --out-dir "$work/bench"
    cp "$work/gpu_tests_zl.xml" "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  zn)
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zn.xml" -k "drop" tests/test_gpu_api.py \
      tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_kernel_options.py "$@"
    cp "$work/gpu_tests_zn.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zo)
    begin
    step launch_overhead 330 python3 benchmarks/launch_overhead.py --head-dim 64 128 256 --peer \
      --csv "$work/launch_overhead.csv" --label "${FLASHTILE_COMMIT:-unknown}"
    step host_path 120 python3 benchmarks/host_path.py --reps 1000
    cp "$work/launch_overhead.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  zp)
    begin
    step persistent_check 200 python3 scripts/hopper_persistent_check.py --csv "$work/persistent_check.csv"
    step gpu_tests 280 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zp.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_block_sparse.py tests/test_gpu_hopper_bwd.py "$@"
    cp "$work/persistent_check.csv" "$work/gpu_tests_zp.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zq)
    begin
    step persistent_check 300 python3 scripts/hopper_persistent_check.py --csv "$work/persistent_check.csv" \
      --baseline scripts/baseline_hopper_fwd.py "$@"
    cp "$work/persistent_check.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  zr)
    begin
    step persistent_check 150 python3 scripts/hopper_persistent_check.py --csv "$work/persistent_check.csv" \
      --baseline scripts/baseline_hopper_fwd.py
    step gpu_tests 340 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zr.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_block_sparse.py tests/test_gpu_hopper_bwd.py "$@"
    cp "$work/persistent_check.csv" "$work/gpu_tests_zr.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zs)
    begin
    step persistent_check 500 python3 scripts/hopper_persistent_check.py --csv "$work/persistent_check.csv" \
      --baseline scripts/baseline_hopper_fwd.py "$@"
    cp "$work/persistent_check.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  zt)
    begin
    step gpu_tests 330 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zt.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_block_sparse.py tests/test_gpu_hopper_bwd.py "$@"
    step persistent_check 200 python3 scripts/hopper_persistent_check.py --csv "$work/persistent_check.csv" \
      --baseline scripts/baseline_hopper_fwd.py --seqlens 512 1024 2048 4096 16384
    cp "$work/persistent_check.csv" "$work/gpu_tests_zt.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zu)
    begin
    step bench_paper 450 python3 -m flashtile bench --paper --out-dir "$work/bench"
    step launch_overhead 100 python3 benchmarks/launch_overhead.py --head-dim 64 128 256 --peer \
      --csv "$work/launch_overhead.csv" --label "${FLASHTILE_COMMIT:-unknown}"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$work/launch_overhead.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  zv)
    begin
    memcheck_group hopper_persistent 120 200
    step launch_overhead 100 python3 benchmarks/launch_overhead.py --head-dim 64 128 256 --peer \
      --csv "$work/launch_overhead.csv" --label "${FLASHTILE_COMMIT:-unknown}"
    step gpu_tests 120 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_zv.xml" tests/test_gpu_api.py "$@"
    cp "$work/launch_overhead.csv" "$work/gpu_tests_zv.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  zw)
    begin
    step bench_paper 450 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s13a)
    # The thirteenth session: sliding windows on the persistent grid (the forward's GPU tests, the window
    # cells timed persistent against one program a tile, then flashtile bench --options window).
    begin
    step gpu_tests 240 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s13a.xml" tests/test_gpu_hopper.py "$@"
    step persistent_check 150 python3 scripts/hopper_persistent_check.py --csv "$work/persistent_check.csv" \
      --seqlens
    step bench_window 150 python3 -m flashtile bench --options window --out-dir "$work/bench"
    cp "$work/persistent_check.csv" "$work/gpu_tests_s13a.xml" "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s13b)
    # The backward's host time on the GPU's host: a short paper cell and the options bench's window cell
    # (scripts/host_profile_dense.py: engine thread against calling thread, the launcher alone, SDPA cuDNN).
    begin
    step host_512 90 python3 scripts/host_profile_dense.py --batch 32 --seqlen 512 --heads 16 --head-dim 128
    step host_window 90 python3 scripts/host_profile_dense.py --batch 2 --seqlen 8192 --heads 16 \
      --head-dim 128 --causal --window 256 0
    finish
    ;;
  s13c)
    # The direct relaunch without run_on_device: the launch-cache, API, hardening, Gluon backward and
    # portable kernel GPU tests; the window and causal cells' kernel time beside their per-call time; the
    # options bench's window row twice (its spread).
    begin
    step gpu_tests 330 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s13c.xml" tests/test_launch_cache.py \
      tests/test_gpu_api.py tests/test_gpu_hardening.py tests/test_gpu_hopper_bwd.py tests/test_kernels.py "$@"
    step host_window 60 python3 scripts/host_profile_dense.py --batch 2 --seqlen 8192 --heads 16 \
      --head-dim 128 --causal --window 256 0
    step host_causal 60 python3 scripts/host_profile_dense.py --batch 2 --seqlen 8192 --heads 16 \
      --head-dim 128 --causal
    step bench_window_1 60 python3 -m flashtile bench --options window --out-dir "$work/bench"
    step bench_window_2 60 python3 -m flashtile bench --options window --out-dir "$work/bench"
    cp "$work/gpu_tests_s13c.xml" "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s13d)
    # Three consumer warpgroups at D = 64 (FLASHTILE_HOPPER_FWD_CONSUMERS=3): the forward's D = 64 GPU tests
    # with it, then its kernel time against two consumers (persistent and per tile) and cuDNN.
    begin
    step gpu_tests 150 env FLASHTILE_HOPPER_FWD_CONSUMERS=3 "${pytest_gpu[@]}" \
      --junitxml="$work/gpu_tests_s13d.xml" tests/test_gpu_hopper.py -k "d64" "$@"
    step consumers_check 200 python3 scripts/hopper_persistent_check.py --csv "$work/consumers_check.csv" \
      --head-dims 64 --consumers --seqlens 512 1024 2048 4096 16384
    cp "$work/consumers_check.csv" "$work/gpu_tests_s13d.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s13e)
    # The final kernels: the persistent-grid and three-consumer GPU tests, then flashtile bench --paper.
    begin
    step gpu_tests 120 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s13e.xml" tests/test_gpu_hopper.py \
      -k "persistent or three" "$@"
    step bench_paper 450 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work/gpu_tests_s13e.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s13f)
    # flashtile bench --paper with the GPU kept busy (100 ms of matrix products) before each shape's first
    # timing, at 6c2f2d5: flashtile, timed first, read 10-15 % slower than in s13e, the peers the same; the
    # warm-up was reverted (README, "Measured").
    begin
    step bench_paper 450 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s14a)
    # Prepared in the thirteenth session, not yet run: memcheck over the three-consumer and sliding-window
    # persistent kernels (sanitizer group hopper_three), then test_launch_cache (693b994's lookup) and the
    # whole test_gpu_hopper.py.
    begin
    memcheck_group hopper_three 150 240
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14a.xml" tests/test_launch_cache.py \
      tests/test_gpu_hopper.py "$@"
    cp "$work/gpu_tests_s14a.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s14b)
    # flashtile bench --paper with the rotated timing order (1704d5e): each row's detail says where
    # flashtile and each peer were timed ("timed k of n").
    begin
    step bench_paper 560 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s14c)
    # Causal on the persistent forward grid, row blocks dealt out in pairs: the whole test_gpu_hopper.py
    # (new paired cases), memcheck over the sanitizer group hopper_paired, then kernel time of the causal
    # cells, paired persistent against one program a tile and cuDNN (and past the key bound at D = 128).
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14c.xml" tests/test_gpu_hopper.py "$@"
    memcheck_group hopper_paired 100 150
    step check 200 python3 scripts/hopper_persistent_check.py --head-dims 64 128 \
      --seqlens 512 1024 2048 4096 8192 16384 --causal-only --consumers --any-keys --csv "$work/check.csv"
    cp "$work/gpu_tests_s14c.xml" "$work/check.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  s14d)
    # flashtile bench --paper after the paired causal persistent grid (the causal forward at D = 64 and
    # D = 128 up to 4k), rotated order.
    begin
    step bench_paper 560 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s14e)
    # The D = 64 backward variants never timed (m64-cols, m128) against the default m64, the portable
    # backward and cuDNN; then test_gpu_hopper_bwd.py (every variant's oracle cases).
    begin
    step variants 200 python3 scripts/hopper_bwd_check.py --only 64 --skip-correctness
    step gpu_tests 300 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14e.xml" tests/test_gpu_hopper_bwd.py "$@"
    cp "$work/gpu_tests_s14e.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s14f)
    # Q double-buffered in the persistent forward at D = 64: kernel time against 21ddb61's forward (the
    # untracked baseline_fwd_21ddb61.py the call carries) at D = 64; test_gpu_hopper.py and test_gpu_api.py
    # (the m128 backward by default for plain D = 64 calls); memcheck over the D = 64 persistent groups.
    begin
    step check 150 python3 scripts/hopper_persistent_check.py --head-dims 64 --seqlens 512 1024 2048 4096 \
      16384 --consumers --baseline baseline_fwd_21ddb61.py --csv "$work/check.csv"
    step gpu_tests 260 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14f.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_api.py "$@"
    step memcheck 120 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only hopper_paired,hopper_three
    cp "$work/gpu_tests_s14f.xml" "$work/check.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  s14g)
    # Q double-buffered at D = 128 too, each tile's output staged in its Q buffer: kernel time against
    # caf6b41's forward (the untracked baseline_fwd_caf6b41.py the call carries) at D = 128, then
    # test_gpu_hopper.py and memcheck over the persistent groups.
    begin
    step check 170 python3 scripts/hopper_persistent_check.py --head-dims 128 --seqlens 512 1024 2048 4096 \
      16384 --baseline baseline_fwd_caf6b41.py --csv "$work/check.csv"
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14g.xml" tests/test_gpu_hopper.py "$@"
    step memcheck 150 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck \
      --error-exitcode 1 python3 scripts/sanitize_kernels.py --only hopper_persistent,hopper_paired,hopper_three
    cp "$work/gpu_tests_s14g.xml" "$work/check.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  s14h)
    # The session's final kernels (pairs, two Q buffers by rule, m128 backward for plain D = 64):
    # test_gpu_hopper.py, then flashtile bench --paper (rotated order).
    begin
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14h.xml" tests/test_gpu_hopper.py "$@"
    step bench_paper 380 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work/gpu_tests_s14h.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s14i)
    # The GPU files the API reaches the forward's persistent grid through, not run earlier this session:
    # test_kernels.py, test_gpu_hardening.py, test_kernel_options.py, test_head_dims.py, test_sinks.py.
    begin
    step gpu_tests 530 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s14i.xml" tests/test_kernels.py \
      tests/test_gpu_hardening.py tests/test_kernel_options.py tests/test_head_dims.py tests/test_sinks.py "$@"
    cp "$work/gpu_tests_s14i.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s15a)
    # The Hopper TMA decode kernel (kernels/hopper/decode.py), first GPU run: the decode and KV-cache GPU
    # tests (each kernel forced on its own cases, the TMA kernel by default elsewhere), then its tilings
    # against the portable kernel and SDPA cuDNN (scripts/decode_tma_check.py).
    begin
    step gpu_tests 230 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15a.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    step check 280 python3 scripts/decode_tma_check.py --rounds 2 --reps 50
    cp "$work/gpu_tests_s15a.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s15b)
    # The TMA decode kernel at its 2-stage default: split counts around the heuristic's and three programs
    # an SM at batch 1, D = 64 and 256 against the portable kernel and cuDNN, memcheck over the decode
    # group (new paged TMA cases), the whole bench --decode grid, then the decode, block-sparse and
    # transformers GPU tests.
    begin
    step splits 110 python3 scripts/decode_tma_check.py --mode splits --rounds 2 --reps 50
    step head_dims 80 python3 scripts/decode_tma_check.py --mode head-dims --rounds 2 --reps 50
    memcheck_group decode 60 90
    step bench_decode 130 python3 -m flashtile bench --decode --out-dir "$work/bench"
    step gpu_tests 200 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15b.xml" tests/test_decode_kernel.py \
      tests/test_block_sparse.py tests/test_gpu_transformers.py "$@"
    cp "$work/gpu_tests_s15b.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s15c)
    # One program an SM for caches of 32k slots or more (hopper.decode.LONG_CACHE_KEYS): the split counts
    # at batch 1 again (32k and 64k too), the whole bench --decode grid, the decode GPU tests.
    begin
    step splits 150 python3 scripts/decode_tma_check.py --mode splits --rounds 2 --reps 50
    step bench_decode 130 python3 -m flashtile bench --decode --out-dir "$work/bench"
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15c.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    cp "$work/gpu_tests_s15c.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s15d)
    # The decode timings after WARMUP_MS of replays (flashtile.bench.decode.graph_time_ms): the split counts
    # at batch 1, then the whole bench --decode grid.
    begin
    step splits 150 python3 scripts/decode_tma_check.py --mode splits --rounds 2 --reps 50
    step bench_decode 250 python3 -m flashtile bench --decode --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s15e)
    # The TMA decode's page lookups a tile ahead of their copies: the decode and KV-cache GPU tests, memcheck
    # over the decode group, the default tiling against the portable kernel and cuDNN (contiguous and
    # paged), the whole bench --decode grid.
    begin
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15e.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    memcheck_group decode 60 60
    step check 90 python3 scripts/decode_tma_check.py --quick --rounds 2 --reps 50
    step bench_decode 130 python3 -m flashtile bench --decode --out-dir "$work/bench"
    cp "$work/gpu_tests_s15e.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s15f)
    # bench --decode with each cell's implementations timed in three rounds, in turn (the median round):
    # the whole grid, then its quick cells.
    begin
    step bench_decode 400 python3 -m flashtile bench --decode --out-dir "$work/bench"
    step bench_decode_quick 60 python3 -m flashtile bench --decode --quick --out-dir "$work/quick"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    cp "$work"/quick/bench_decode.csv "$OUT"/bench_decode_quick.csv 2>/dev/null
    finish
    ;;
  s15g)
    # One TMA decode program an SM where the splits fill every SM exactly (hopper.decode.programs_per_sm):
    # the whole bench --decode grid (three rounds a cell), then the decode GPU tests.
    begin
    step bench_decode 300 python3 -m flashtile bench --decode --out-dir "$work/bench"
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15g.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    cp "$work/gpu_tests_s15g.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s15h)
    # Pages smaller than a tile on the TMA decode kernel at D = 128 and 256, a column block at a time: the
    # decode and KV-cache GPU tests, memcheck over the decode group, the whole bench --decode grid.
    begin
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15h.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    memcheck_group decode 60 60
    step bench_decode 240 python3 -m flashtile bench --decode --out-dir "$work/bench"
    cp "$work/gpu_tests_s15h.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s15i)
    # The TMA decode after the review's refactor (visible_span called, the phases in one loop): the decode
    # and KV-cache GPU tests; then where a batch-1 step's time goes, kernel by kernel, flashtile against
    # cuDNN (scripts/decode_profile.py).
    begin
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15i.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    step profile 90 python3 scripts/decode_profile.py
    cp "$work/gpu_tests_s15i.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s15j)
    # The batch-1 decode step kernel by kernel again, with the combine also launched after the split
    # kernel (its own time) and each step timed in a CUDA graph.
    begin
    step profile 120 python3 scripts/decode_profile.py
    finish
    ;;
  s15k)
    # The combine spread over the SMs (configs.combine_blocks: no more rows a program than fill every SM):
    # the decode and KV-cache GPU tests, the batch-1 step kernel by kernel, then bench --decode --quick.
    begin
    step gpu_tests 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s15k.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    step profile 90 python3 scripts/decode_profile.py
    cp "$work/gpu_tests_s15k.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s15l)
    # The whole bench --decode grid at the session's final decode code.
    begin
    step bench_decode 260 python3 -m flashtile bench --decode --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s16a)
    # Where paged caches trail contiguous ones (0.945-0.947 in three cells of s15l): the same keys contiguous,
    # paged in a random order, paged in order, and paged at other tilings (decode_tma_check.py --mode paged).
    begin
    step paged 240 python3 scripts/decode_tma_check.py --mode paged --rounds 3
    finish
    ;;
  s16b)
    # The paged gap's cause: pages in 2 MB groups against random, and K/V prefetched into L2 1, 2 or 4 tiles
    # ahead of the TMA ring (FLASHTILE_DECODE_PREFETCH, an experiment at 85e0d56, removed after: slower),
    # then the decode GPU tests with it.
    begin
    step paged 240 python3 scripts/decode_tma_check.py --mode paged --rounds 3
    export FLASHTILE_DECODE_PREFETCH=2
    step gpu_tests 150 "${pytest_gpu[@]}" tests/test_decode_kernel.py "$@"
    unset FLASHTILE_DECODE_PREFETCH
    finish
    ;;
  s16c)
    # The paged gap: one line of each tile touched (the page's address translation) 2, 4 or 8 tiles ahead of
    # the ring, against random and 2 MB-grouped page orders (s16b: prefetching whole tiles was slower). At
    # b69727d; the experiment was removed after (no faster).
    begin
    step paged 240 python3 scripts/decode_tma_check.py --mode paged --rounds 3
    finish
    ;;
  s16d)
    # The GPU files not run since the fourteenth session (nothing they reach changed since; a regression
    # check): the Gluon forward, backward and block-sparse files and the API's, then test_cli_bench.
    begin
    step gpu_tests 500 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s16d.xml" tests/test_gpu_hopper.py \
      tests/test_gpu_hopper_bwd.py tests/test_gpu_hopper_block_sparse.py tests/test_gpu_api.py \
      tests/test_cli_bench.py "$@"
    cp "$work/gpu_tests_s16d.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s16e)
    # The rest of the fourteenth session's API-level GPU files (s14i: 380 passed, 1 skipped), a regression
    # check: test_kernels.py, test_gpu_hardening.py, test_kernel_options.py, test_head_dims.py, test_sinks.py.
    begin
    step gpu_tests 540 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s16e.xml" tests/test_kernels.py \
      tests/test_gpu_hardening.py tests/test_kernel_options.py tests/test_head_dims.py tests/test_sinks.py "$@"
    cp "$work/gpu_tests_s16e.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s16f)
    # The two GPU tests s16d and s16e's boxes did not reach, then the whole bench --decode grid again (no
    # decode change since s15l: a second sample of its cells), then host against kernel time at the paper
    # grid's N = 512 and 1k cells on this host (benchmarks/launch_overhead.py --peer).
    begin
    step gpu_tests 120 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s16f.xml" \
      "tests/test_sinks.py::test_rows_without_keys_give_zero_and_the_sink_lse" \
      "tests/test_cli_bench.py::test_head_dims_preset_on_the_gpu_runs_every_pair" "$@"
    step bench_decode 280 python3 -m flashtile bench --decode --out-dir "$work/bench"
    step launch_overhead 120 python3 benchmarks/launch_overhead.py --head-dim 64 128 256 --seqlen 512 1024 \
      --peer --csv "$work/launch_overhead.csv" --label "${FLASHTILE_COMMIT:-unknown}"
    cp "$work/gpu_tests_s16f.xml" "$work"/bench/*.csv "$work"/bench/*.png "$work/launch_overhead.csv" "$OUT"/ \
      2>/dev/null
    finish
    ;;
  s16g)
    # The combine's launch released after the TMA split kernel's key loop, not at its start
    # (FLASHTILE_DECODE_PDL=end): decode_profile.py at batch 1 (graph steps in three alternating rounds),
    # the decode kernel tests with it, and test_sinks' empty-rows test after its tolerance fix.
    begin
    step profile 240 python3 scripts/decode_profile.py
    export FLASHTILE_DECODE_PDL=end
    step gpu_tests 120 "${pytest_gpu[@]}" tests/test_decode_kernel.py "$@"
    unset FLASHTILE_DECODE_PDL
    step sinks 90 "${pytest_gpu[@]}" "tests/test_sinks.py::test_rows_without_keys_give_zero_and_the_sink_lse"
    finish
    ;;
  s16h)
    # The TMA split kernel's combine launched after it ends (no programmatic dependent launch; s16g): the
    # decode and KV-cache GPU tests, the batch-1 profile, then the whole bench --decode grid.
    begin
    step gpu_tests 180 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s16h.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    step profile 150 python3 scripts/decode_profile.py
    step bench_decode 240 python3 -m flashtile bench --decode --out-dir "$work/bench"
    cp "$work/gpu_tests_s16h.xml" "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s16i)
    # The whole bench --decode grid with five rounds a cell (bench.decode.ROUNDS, was three).
    begin
    bench_decode_step
    finish
    ;;
  s16j)
    # Where a forward's host time goes on the GPU host (the paper grid's N = 512 cells are host-bound, s16f):
    # scripts/host_profile_dense.py --profile fwd at D = 128 and 64, non-causal and causal.
    begin
    step host_d128 90 python3 scripts/host_profile_dense.py --profile fwd
    step host_d128_causal 90 python3 scripts/host_profile_dense.py --profile fwd --causal
    step host_d64 90 python3 scripts/host_profile_dense.py --profile fwd --heads 32 --head-dim 64
    finish
    ;;
  s16k)
    # Where a backward's host time goes on the GPU host: host_profile_dense.py's cProfile of the backward
    # (the default) at D = 128, N = 512, non-causal and causal.
    begin
    step host_bwd 90 python3 scripts/host_profile_dense.py
    step host_bwd_causal 90 python3 scripts/host_profile_dense.py --causal
    finish
    ;;
  s16l)
    # Both decode kernels take their program's coordinates and its sequence's keys from one shared helper
    # (kernels/_decode_program.py; no behaviour change): the decode and KV-cache GPU tests, memcheck over
    # the decode group, and the batch-1 profile as a timing check.
    begin
    step gpu_tests 170 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_s16l.xml" tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    memcheck_group decode 60 60
    step profile 90 python3 scripts/decode_profile.py
    cp "$work/gpu_tests_s16l.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s17a)
    # Dropout's 8-bit draws (one Philox call per sixteen entries; each accumulator thread takes two of its
    # four words, so the backward draws a call once, not twice): the dropout GPU tests, then bench --options
    # dropout alternating the previous commit's code (build/old_src, carried) and this one's, twice each.
    begin
    gpu_tests_step 220 -k "dropout or dmask or keep" \
      tests/test_kernel_options.py tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_gpu_api.py \
      tests/test_options_api.py tests/test_head_dims.py "$@"
    bench_old_new dropout 70
    finish
    ;;
  s17b)
    # Dropout's Philox call shared by partner lanes (one call per two points, the other half's decisions
    # handed over by a butterfly shuffle) in the Gluon forward and backward: the GPU test files that run
    # dropout, then bench --options dropout alternating 9c860bd's code (one call a point; build/old_src,
    # carried) and this one's, twice each.
    begin
    bench_old_new dropout 70
    gpu_tests_step 380 tests/test_kernel_options.py \
      tests/test_options_api.py tests/test_gpu_api.py tests/test_head_dims.py tests/test_sinks.py "$@"
    finish
    ;;
  s17c)
    # ALiBi's unmasked key tiles by side of the diagonal in the Gluon forward (one FMA a score where a tile
    # lies on one side; docs/design/hopper.md): bench --options alibi alternating 244d9a5's code
    # (build/old_src, carried) and this one's, twice each, then the Gluon forward's GPU tests.
    begin
    bench_old_new alibi 80
    gpu_tests_step 330 tests/test_gpu_hopper.py "$@"
    finish
    ;;
  s17d)
    # An experiment: ALiBi's P kept in fp32 between key tiles at D = 128 without a window (not the wgmma
    # operand, as the other options have it): bench --options alibi alternating c1cf673's code (build/old_src,
    # carried) and this one's, twice each; then memcheck over the Gluon dropout group (the shuffled draws).
    begin
    bench_old_new alibi 80
    memcheck_group hopper_dropout 90 120
    finish
    ;;
  s17e)
    # After the ALiBi split's removal and the dropout draws' change: the Gluon backward's GPU tests (its
    # dropout draws shared by partner lanes), test_gpu_hopper's ALiBi cases (three new ones at 2k) and the
    # CLI bench tests.
    begin
    gpu_tests_step 520 tests/test_gpu_hopper_bwd.py \
      "tests/test_gpu_hopper.py::test_gluon_fwd_options_match_oracle" tests/test_cli_bench.py "$@"
    finish
    ;;
  s17f)
    # Dropout applied to P in the wgmma operand's dtype, two entries a register (one prmt and one and a pair;
    # dropout.keep_pairs) in the Gluon forward and backward: bench --options dropout alternating 1d160d3's
    # code (build/old_src, carried) and this one's, twice each; the dropout GPU tests; memcheck over the
    # Gluon dropout group.
    begin
    bench_old_new dropout 70
    gpu_tests_step 250 tests/test_kernel_options.py \
      tests/test_options_api.py "$@"
    memcheck_group hopper_dropout 60 60
    finish
    ;;
  s17g)
    # At the final dropout kernels (pair masks): the API's, head dims' and sinks' GPU tests.
    begin
    gpu_tests_step 420 tests/test_gpu_api.py \
      tests/test_head_dims.py tests/test_sinks.py "$@"
    finish
    ;;
  s17h)
    # ALiBi's column offsets converted once a work tile (not at every key tile) in the Gluon forward, where
    # no softcap or dropout sits beside it at D > 64: bench --options alibi alternating c73ccca's code
    # (build/old_src, carried) and this one's, twice each, then the forward's option cases.
    begin
    bench_old_new alibi 80
    gpu_tests_step 200 \
      "tests/test_gpu_hopper.py::test_gluon_fwd_options_match_oracle" \
      "tests/test_gpu_hopper.py::test_options_through_the_api_run_the_gluon_forward" "$@"
    finish
    ;;
  s17i)
    # After the decode kernel's ALiBi argument followed the forward's new form (040f3c4): the decode and
    # KV-cache GPU tests.
    begin
    gpu_tests_step 300 tests/test_decode_kernel.py \
      tests/test_gpu_kvcache.py "$@"
    finish
    ;;
  s18a)
    # The Gluon backward's ALiBi with the score's factor folded into the exponential's FMA and the column
    # offsets converted once a work tile (fewer spills in its key loop): bench --options alibi alternating
    # f468cf4's code (build/old_src, carried) and this one's, twice each; then the direct relaunch's GPU test
    # (the Gluon kernels' cached TMA tensor maps, inputs at new addresses too).
    begin
    bench_old_new alibi 80
    gpu_tests_step 150 tests/test_launch_cache.py "$@"
    finish
    ;;
  s18b)
    # The GPU tests the backward's ALiBi change reaches: the Gluon backward's file (options, varlen, dropout
    # and the deterministic cases) and the option suites through the API.
    begin
    gpu_tests_step 560 tests/test_gpu_hopper_bwd.py tests/test_kernel_options.py tests/test_options_api.py \
      "$@"
    finish
    ;;
  s18c)
    # The host path with the Gluon kernels' TMA tensor maps encoded once per (address, shape, strides):
    # benchmarks/launch_overhead.py alternating f468cf4's code (build/old_src) and this one's, twice each,
    # with SDPA cuDNN's host time in the same rounds.
    begin
    for round in 1 2; do
      step "host_old_$round" 120 env PYTHONPATH=build/old_src python3 benchmarks/launch_overhead.py \
        --head-dim 64 128 --seqlen 512 1024 --peer --csv "$work/launch_overhead.csv" --label "old_$round"
      step "host_new_$round" 120 python3 benchmarks/launch_overhead.py --head-dim 64 128 --seqlen 512 1024 \
        --peer --csv "$work/launch_overhead.csv" --label "new_$round"
    done
    cp "$work/launch_overhead.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  s18d)
    # The Gluon launchers' host µs a call at a tiny shape (scripts/host_launchers_gpu.py, best of seven
    # means of 500 calls), alternating f468cf4's code (build/old_src) and this one's, three times each.
    begin
    host_launchers_old_new 3
    finish
    ;;
  s18e)
    # Causal beside softcap or ALiBi in the Gluon backward: every dense block masked (no branch in the key
    # loop: fewer spills). bench --options softcap alibi --causal true alternating f468cf4's code
    # (build/old_src) and this one's, twice each; then the backward's option GPU tests.
    begin
    bench_old_new_args causal 110 --options softcap alibi --causal true
    gpu_tests_step 150 tests/test_gpu_hopper_bwd.py -k "options or window" "$@"
    finish
    ;;
  s18f)
    # s18e again with build/old_src = this commit's src but f468cf4's kernels/hopper/bwd.py (the session's
    # starting backward; s18e's old code predates the bench's --causal for options and timed non-causal
    # cells): bench --options softcap alibi --causal true alternating, twice each.
    begin
    bench_old_new_args causal 110 --options softcap alibi --causal true
    finish
    ;;
  s18g)
    # The Gluon backward's causal launch order (every head's heaviest key blocks first) and the D = 256 split's
    # causal mask on every block: causal backward at D = 64 / 128 / 256, N = 1k-16k, against SDPA cuDNN,
    # alternating 3b15481's code (build/old_src) and this one's, twice each.
    begin
    bench_old_new_args bwd 120 --head-dim 64 128 256 --causal true --mode bwd --seqlen 1k 2k 4k 16k \
      \
      --peers flashtile sdpa-cudnn
    finish
    ;;
  s18h)
    # The GPU tests of the Gluon backward after the causal launch order: the whole file (causal, GQA,
    # deterministic over 50 runs, options, varlen).
    begin
    gpu_tests_step 420 tests/test_gpu_hopper_bwd.py tests/test_launch_cache.py "$@"
    finish
    ;;
  s18i)
    # After s18g: the launch order reverted (head by head again); left from a6d4e94, the D = 256 split's
    # causal mask on every block (no branch: spills 56 -> 47). Causal backward at D = 256 against SDPA
    # cuDNN, alternating 3b15481's code (build/old_src) and this one's, twice each.
    begin
    bench_old_new_args bwd 90 --head-dim 256 --causal true --mode bwd --seqlen 1k 2k 4k 16k \
      \
      --peers flashtile sdpa-cudnn
    finish
    ;;
  s18j)
    # At the session's final code: the Gluon forward's and the API's GPU tests (their launches relaunched
    # through the cached TMA tensor maps from each signature's second call), then bench --options window
    # (the host-bound window cell after the launchers' shorter host path).
    begin
    gpu_tests_step 400 tests/test_gpu_hopper.py tests/test_gpu_api.py "$@"
    step bench_window 100 python3 -m flashtile bench --options window --out-dir "$work/bench"
    finish
    ;;
  s18k)
    # compute-sanitizer memcheck over the Gluon option and dropout groups with each case run twice: the
    # second call of a signature relaunches directly, through the cached TMA tensor maps (and the backward's
    # ALiBi and causal changes of this session are in the option cases).
    begin
    memcheck_group hopper_options,hopper_dropout 240 200 --repeat 2
    finish
    ;;
  s18l)
    # Dense causal backward launches in four phases (each head by head over a quarter of the key blocks,
    # heaviest first): causal backward at D = 64 / 128 / 256, N = 1k-16k, against SDPA cuDNN, alternating
    # 95ec2b0's code (build/old_src) and this one's, twice each.
    begin
    bench_old_new_args bwd 120 --head-dim 64 128 256 --causal true --mode bwd --seqlen 1k 2k 4k 16k \
      \
      --peers flashtile sdpa-cudnn
    finish
    ;;
  s18m)
    # compute-sanitizer memcheck over the `hopper` group (the Gluon forward and backward, causal or not,
    # GQA/MQA, odd lengths) with each case run twice: the second call relaunches directly, through the
    # cached TMA tensor maps.
    begin
    memcheck_group hopper 330 220 --repeat 2
    finish
    ;;
  s18n)
    # The tensor maps' launcher splices the kernel's arguments between its descriptors (no Python step per
    # argument): the direct relaunch's GPU tests, then scripts/host_launchers_gpu.py alternating 8b60fa1's
    # code (build/old_src) and this one's, twice each.
    begin
    gpu_tests_step 150 tests/test_launch_cache.py "$@"
    host_launchers_old_new 2
    finish
    ;;
  s19a)
    # Regression run of the GPU files not run since the sixteenth session (the launch path changed since:
    # direct relaunch through cached TMA tensor maps): test_kernels, test_gpu_hardening, test_sinks, then the
    # decode and KV-cache files.
    begin
    gpu_tests_step 560 tests/test_kernels.py tests/test_gpu_hardening.py tests/test_sinks.py \
      tests/test_decode_kernel.py tests/test_gpu_kvcache.py "$@"
    finish
    ;;
  s19b)
    # Where the packed backward loses against the dense one: scripts/varlen_bwd_gap.py (kernel times by
    # torch.profiler: dense and packed batches of equal lengths, the bench's four documents packed and each
    # alone), with the masked pointer epilogue (default) and with VARLEN_TMA_STORE, twice each.
    begin
    varlen_gap_pair 120 rows - boxes FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=1
    finish
    ;;
  s19c)
    # An experiment: the packed backward without its end masks (build/exp_src: the at_end selects compiled
    # out; wrong at a sequence's end, exact for the equal-length cases) against this commit's, to see what
    # the selects cost (scripts/varlen_bwd_gap.py, twice each).
    begin
    varlen_gap_pair 120 nomask PYTHONPATH=build/exp_src main -
    finish
    ;;
  s19d)
    # Experiments on the packed backward at equal lengths (no block at a sequence's end): build/exp_src loads
    # the row statistics by TMA as the dense kernel does (valid only where every sequence starts at a
    # multiple of 4 rows), against this commit's, twice each; then Nsight Compute's warp-state and scheduler
    # sections of the fused kernel, dense and packed 4 x 4096, where ncu exists.
    begin
    varlen_gap_pair 90 tmastats PYTHONPATH=build/exp_src main - --cases 4x4096 2x8192
    step which_ncu 30 bash -c 'which ncu nsys; ls /usr/local/cuda*/bin 2>/dev/null | grep -i -E "ncu|nsys"'
    for case in "dense 4x4096" "packed 4x4096"; do
      step "ncu_${case// /_}" 150 ncu -k regex:attn_bwd_kernel -c 1 --section WarpStateStats \
        --section SchedulerStats --section SpeedOfLight --section Occupancy --section LaunchStats \
        python3 scripts/varlen_bwd_gap.py --no-profiler --cases "$case"
    done
    finish
    ;;
  s19e)
    # The packed backward's row statistics at 16-byte aligned offsets, read by TMA as the dense kernel's
    # (no per-block pointer loads in the producer warp): the backward's GPU tests and the varlen cases of
    # the options suites, then scripts/varlen_bwd_gap.py and bench --options varlen alternating the code
    # before (build/old_src) and this one's.
    begin
    gpu_tests_step 300 tests/test_gpu_hopper_bwd.py tests/test_launch_cache.py "$@"
    step gpu_tests_varlen 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_varlen.xml" \
      tests/test_kernel_options.py tests/test_options_api.py tests/test_gpu_api.py -k varlen
    cp "$work/gpu_tests_varlen.xml" "$OUT"/ 2>/dev/null
    varlen_gap_pair 60 old PYTHONPATH=build/old_src new -
    bench_old_new varlen 70
    cp "$work"/bench_new/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s19f)
    # compute-sanitizer memcheck, each case run twice (the second relaunches directly, through the cached
    # TMA tensor maps): the Gluon option and dropout groups (packed batches with an empty sequence: the
    # packed backward's statistics at aligned offsets, s19e) and the sparse, persistent, three-consumer and
    # paired groups (not run with --repeat 2 before).
    begin
    memcheck_group hopper_options,hopper_dropout,hopper_sparse,hopper_persistent,hopper_three,hopper_paired \
      420 150 --repeat 2
    finish
    ;;
  s19g)
    # The rest of the GPU files not run since the sixteenth session, at the packed backward's aligned
    # statistics (the preprocess and postprocess changed for dense batches too): test_head_dims,
    # test_cli_bench.
    begin
    gpu_tests_step 560 tests/test_head_dims.py tests/test_cli_bench.py "$@"
    finish
    ;;
  s19h)
    # An experiment after s19e: build/exp_src is this commit's code with the packed backward's end masks
    # compiled out (wrong at a sequence's end, exact at equal lengths): do they cost now that the producer
    # no longer holds the consumers back? scripts/varlen_bwd_gap.py at equal lengths, twice each.
    begin
    varlen_gap_pair 60 nomask PYTHONPATH=build/exp_src main - --cases 4x4096 2x8192
    finish
    ;;
  s19i)
    # After the statistics by TMA (s19e): the packed backward's TMA store epilogue (VARLEN_TMA_STORE=1, dK and
    # dV by boxes where a block lies inside its sequence) against the pointer stores, varlen_bwd_gap.py with
    # the bench's documents, alternating, twice each.
    begin
    varlen_gap_pair 60 boxes FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=1 rows - --cases 4x4096 2x8192 docs
    finish
    ;;
  s19j)
    # The session's final code (the packed backward's statistics by TMA and its TMA store epilogue by
    # default): bench --options varlen, twice.
    begin
    step bench_varlen_1 70 python3 -m flashtile bench --options varlen --out-dir "$work/bench"
    step bench_varlen_2 70 python3 -m flashtile bench --options varlen --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s20a)
    # The nineteenth session's final code, not run there: memcheck over hopper_options (its two bad
    # cu_seqlens cases through the Gluon packed kernels) with --repeat 2; the varlen cases of the option
    # suites with the packed backward's TMA store epilogue as the default; bench --options varlen twice; the
    # refactored scripts varlen_bwd_gap.py (through varlen_gap_pair) and host_launchers_gpu.py once each.
    begin
    memcheck_group hopper_options 240 150 --repeat 2
    step gpu_tests_varlen 150 "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_varlen.xml" \
      tests/test_kernel_options.py tests/test_options_api.py tests/test_gpu_api.py -k varlen
    cp "$work/gpu_tests_varlen.xml" "$OUT"/ 2>/dev/null
    step bench_varlen_1 70 python3 -m flashtile bench --options varlen --out-dir "$work/bench"
    step bench_varlen_2 70 python3 -m flashtile bench --options varlen --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    step host_launchers 60 python3 scripts/host_launchers_gpu.py --label main --csv "$work/host_launchers.csv"
    cp "$work/host_launchers.csv" "$OUT"/ 2>/dev/null
    varlen_gap_pair 45 a - b - --cases 4x4096
    finish
    ;;
  s20b)
    # The paper grid at the current code (the last full grid ran at 0da8452, the fourteenth session; since
    # then the launch path's cached tensor maps and direct relaunch, and the option kernels), then bench
    # --options window (issue 8's window cell).
    begin
    step bench_paper 400 python3 -m flashtile bench --paper --out-dir "$work/bench"
    step bench_window 90 python3 -m flashtile bench --options window --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s20c)
    # The whole bench --decode grid at the current code (the last at 82d37af, the sixteenth session).
    begin
    bench_decode_step
    finish
    ;;
  s20d)
    # An experiment (build/exp_src, not committed): the D = 256 backward's programs visit their query
    # blocks last to first, so the programs running at once read the same Q/dO block and the masked
    # diagonal block comes last. Its GPU tests at D = 256 (and 192, padded to it), then the backward at
    # D = 256, causal and not, alternating this commit's code and the experiment, twice each.
    begin
    gpu_tests_exp_step 200 tests/test_gpu_hopper_bwd.py -k "d256 or 256 or 192"
    bench_main_exp 100 --head-dim 256 --causal both --mode bwd --seqlen 1k 4k 16k \
      --peers flashtile sdpa-cudnn
    finish
    ;;
  s20e)
    # After s20d: build/exp_src visits the query blocks last to first in every dense backward (both
    # splits, every head dim; block-sparse lists keep their order). The Gluon backward's GPU tests under
    # the experiment, then the backward at D = 64 and 128, causal and not, alternating with this commit's
    # code, twice each.
    begin
    gpu_tests_exp_step 300 tests/test_gpu_hopper_bwd.py
    bench_main_exp 80 --head-dim 64 128 --causal both --mode bwd --seqlen 1k 4k 16k \
      --peers flashtile sdpa-cudnn
    finish
    ;;
  s20f)
    # At the D = 256 backward's query blocks last to first (7b15b9d): the Gluon backward's GPU tests, memcheck
    # over the `hopper` group and the new `hopper_d256` one (the D = 256 backward, never under memcheck
    # before) with --repeat 2, and the backward at D = 256, causal and not, alternating edfc9d2's code
    # (build/old_src) and this one's, twice each.
    begin
    gpu_tests_step 260 tests/test_gpu_hopper_bwd.py "$@"
    memcheck_group hopper,hopper_d256 150 100 --repeat 2
    bench_old_new_args d256 90 --head-dim 256 --causal both --mode bwd --seqlen 1k 4k 16k --peers flashtile \
      sdpa-cudnn
    cp "$work"/bench_new/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s20g)
    # An experiment after s20e (build/exp_src): the D = 128 "keys" split also visiting its query blocks last
    # to first; the backward at D = 128, causal and not, N = 1k-16k, alternating this commit's code and
    # the experiment, twice each.
    begin
    bench_main_exp 80 --head-dim 128 --causal both --mode bwd --seqlen 1k 2k 4k 8k 16k \
      --peers flashtile sdpa-cudnn
    finish
    ;;
  s20h)
    # The options' cells at the session's final code (issue 8's numbers, last timed in the seventeenth and
    # eighteenth sessions): bench --options softcap alibi dropout.
    begin
    step bench_options 300 python3 -m flashtile bench --options softcap alibi dropout --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s21a)
    # The paged batch-1 gap: the block-table row prefetched into L2 or L1 while the sequence's length loads
    # (FLASHTILE_DECODE_BT_PREFETCH, an experiment), and one table shared by the rotated copies (as layers
    # share a block table) against the bench's table per copy; then the decode GPU tests with the L1
    # prefetch.
    begin
    step paged 240 python3 scripts/decode_tma_check.py --mode paged --rounds 3
    export FLASHTILE_DECODE_BT_PREFETCH=2
    gpu_tests_step 150 tests/test_decode_kernel.py tests/test_gpu_kvcache.py "$@"
    unset FLASHTILE_DECODE_BT_PREFETCH
    finish
    ;;
  s21b)
    # ALiBi's forward at D = 128 with the unmasked tiles split at the diagonal (a column term, one FMA a
    # score, and a row term): the ALiBi GPU tests, then bench --options alibi (causal and not, flashtile
    # alone) alternating the previous code (build/old_src) and this commit's.
    begin
    gpu_tests_step 200 tests/test_gpu_hopper.py tests/test_kernel_options.py tests/test_options_api.py \
      tests/test_gpu_api.py -k alibi "$@"
    bench_old_new_args alibi 110 --options alibi --causal both --peers flashtile
    cp -r "$work/bench_old" "$work/bench_new" "$OUT"/ 2>/dev/null
    finish
    ;;
  s21c)
    # An experiment (build/exp_src, not committed): two Q buffers on the persistent grid at D = 128 where a
    # window bounded on both sides keeps a work tile's keys to 1k or fewer (the Q load of the next tile
    # overlaps this one's). The Gluon forward's GPU tests under it, then bench --options window at 4k, 8k,
    # 16k alternating this commit's code and the experiment, twice each.
    begin
    gpu_tests_exp_step 200 tests/test_gpu_hopper.py
    bench_main_exp 100 --options window --seqlen 4096 8192 16384 --peers flashtile
    cp -r "$work/bench_main" "$work/bench_exp" "$OUT"/ 2>/dev/null
    finish
    ;;
  s21d)
    # The same two Q buffers for windows, now in src: kernel time by CUDA graphs (the bench's window cells
    # are host-bound), scripts/hopper_persistent_check.py at D = 128 with the previous forward
    # (scripts/baseline_hopper_fwd.py, untracked: `git show <previous>:src/flashtile/kernels/hopper/fwd.py`)
    # as the baseline.
    begin
    step persistent 400 python3 scripts/hopper_persistent_check.py --head-dims 128 \
      --baseline scripts/baseline_hopper_fwd.py --csv "$work/persistent.csv"
    cp "$work/persistent.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  s21e)
    # The decode acceptance on a second sample: the whole bench --decode grid (the kernels unchanged since
    # s20c's), then decode_tma_check.py --mode paged (the batch-1 4k cell's paged-against-contiguous ratio,
    # three rounds).
    begin
    bench_decode_step
    step paged 150 python3 scripts/decode_tma_check.py --mode paged --rounds 3
    finish
    ;;
  s21f)
    # Batch 1 against cuDNN on an H200 (s21e: 0.93-0.98x at 64k-128k, one query token): the TMA decode
    # kernel's tilings, 2, 3 and 5 stages among them, at batch 1 and more (decode_tma_check.py).
    begin
    step tilings 420 python3 scripts/decode_tma_check.py --mode tilings --rounds 2
    finish
    ;;
  s21g)
    # A ring of 3 tiles where one program an SM is planned at D = 128 (hopper.decode.ring_stages): the
    # decode and KV-cache GPU tests, then the whole bench --decode grid.
    begin
    gpu_tests_step 200 tests/test_decode_kernel.py tests/test_gpu_kvcache.py "$@"
    bench_decode_step
    finish
    ;;
  s21h)
    # The same on an H100: the tilings at batch 1 and more (2 and 3 stages side by side, each forced), then
    # the whole bench --decode grid.
    begin
    step tilings 200 python3 scripts/decode_tma_check.py --mode tilings --rounds 2
    bench_decode_step
    finish
    ;;
  s21i)
    # The deeper ring chosen by the memory's peak bandwidth (hopper.decode.ring_stages): what the device
    # reports and the ring a 128k batch-1 call gets, then the decode and KV-cache GPU tests, then
    # decode_tma_check.py --mode splits (batch 1, the split heuristic's choice beside cuDNN).
    begin
    step ring 60 python3 -c "
import torch
from flashtile.kernels import configs
from flashtile.kernels.hopper import decode
d = torch.device('cuda')
bw = configs.peak_memory_bandwidth(d)
cfg = configs.decode_tma_config(128)
print(torch.cuda.get_device_name(), 'peak', bw / 1e12, 'TB/s; stages one an SM:', decode.ring_stages(128, cfg, 1, bw))
"
    gpu_tests_step 200 tests/test_decode_kernel.py tests/test_gpu_kvcache.py "$@"
    step splits 200 python3 scripts/decode_tma_check.py --mode splits --rounds 2
    finish
    ;;
  s22a)
    # The causal backward's gap at D = 256 (and 128) by kernel times, causal against not, the dQ reduce and
    # deterministic=True beside SDPA cuDNN; then the whole bench --decode grid at the decode code of s21i.
    begin
    bwd_gap_step 256 128
    bench_decode_step
    finish
    ;;
  s22b)
    # bench --decode with each paged cell's paired contiguous timing and the targets' summary, then the
    # causal backward's kernel times at D = 256 and 64 (s22a's script) on this machine.
    begin
    bench_decode_step
    bwd_gap_step 256 64
    finish
    ;;
  s22c)
    # Experiment: the D = 256 ("dim" split) backward's query blocks first to last (build/exp_src) against
    # last to first (this commit), kernel times causal and not, alternating twice; then the D = 256
    # backward GPU tests under the experiment.
    begin
    for round in 1 2; do
      for side in main exp; do
        path=src
        [ "$side" = exp ] && path=build/exp_src
        step "gap_${side}_$round" 100 env PYTHONPATH=$path python3 scripts/bwd_causal_gap.py --head-dims 256 \
          --seqlens 4096 16384 --csv "$OUT/bwd_causal_gap.csv" --label "${side}_$round"
        cp "$work/gap_${side}_$round.log" "$OUT/"
      done
    done
    gpu_tests_exp_step 150 tests/test_gpu_hopper_bwd.py -k "256" "$@"
    finish
    ;;
  s22d)
    # Experiment: the D = 256 causal backward with paired key blocks, unrolled (build/exp_src) and as a
    # runtime loop (build/exp2_src), against the code before (build/old_src): kernel times alternating
    # twice; then the D = 256 backward GPU tests under each.
    begin
    for round in 1 2; do
      for side in old exp exp2; do
        step "gap_${side}_$round" 100 env PYTHONPATH=build/${side}_src python3 scripts/bwd_causal_gap.py \
          --head-dims 256 --seqlens 4096 16384 --csv "$OUT/bwd_causal_gap.csv" --label "${side}_$round"
        cp "$work/gap_${side}_$round.log" "$OUT/"
      done
    done
    for side in exp exp2; do
      step "tests_$side" 120 env PYTHONPATH=build/${side}_src "${pytest_gpu[@]}" tests/test_gpu_hopper_bwd.py \
        -k 256 --junitxml="$work/tests_$side.xml"
      cp "$work/tests_$side.xml" "$OUT"/ 2>/dev/null
    done
    finish
    ;;
  s22e)
    # The D = 256 backward's producer and consumer restructured (this commit's src), the same with the
    # pairing's code left in but off (build/exp_src), the code before (build/old_src): kernel times
    # alternating twice; then the D = 256 backward GPU tests at this commit.
    begin
    for round in 1 2; do
      for side in old exp new; do
        path=build/${side}_src
        [ "$side" = new ] && path=src
        step "gap_${side}_$round" 100 env PYTHONPATH=$path python3 scripts/bwd_causal_gap.py \
          --head-dims 256 --seqlens 4096 16384 --csv "$OUT/bwd_causal_gap.csv" --label "${side}_$round"
        cp "$work/gap_${side}_$round.log" "$OUT/"
      done
    done
    gpu_tests_step 120 tests/test_gpu_hopper_bwd.py -k 256 "$@"
    finish
    ;;
  s22f)
    # Which half of s22e's restructure moves the D = 256 backward: the code before (build/old_src), this
    # commit's src, the new producer with the old consumer (build/exp_src), the old producer with the new
    # consumer (build/exp2_src); kernel times alternating twice. Then the D = 256 backward GPU tests, the
    # new odd-block cases included, on the code before.
    begin
    for round in 1 2; do
      for side in old new exp exp2; do
        path=build/${side}_src
        [ "$side" = new ] && path=src
        step "gap_${side}_$round" 100 env PYTHONPATH=$path python3 scripts/bwd_causal_gap.py \
          --head-dims 256 --seqlens 4096 16384 --csv "$OUT/bwd_causal_gap.csv" --label "${side}_$round"
      done
    done
    step tests_old 120 env PYTHONPATH=build/old_src "${pytest_gpu[@]}" tests/test_gpu_hopper_bwd.py -k 256 \
      --junitxml="$work/tests_old.xml"
    cp "$work/tests_old.xml" "$OUT"/ 2>/dev/null
    finish
    ;;
  s22h)
    # The N = 512 forward cells: the paper grid read flashtile at 0.19-0.23 ms a call where its kernel takes
    # 0.08-0.15. bench at D = 128, N = 512 and 1k, forward, causal and not, beside SDPA cuDNN (twice), then
    # host_profile_dense.py's host, per-call and kernel times for the same cell, non-causal and causal.
    begin
    for round in 1 2; do
      step "bench_$round" 100 python3 -m flashtile bench --head-dim 128 --seqlen 512 1k --mode fwd \
        --causal both --peers flashtile sdpa-cudnn --out-dir "$work/bench"
    done
    cp "$work"/bench/bench.csv "$OUT"/ 2>/dev/null
    step profile_full 90 python3 scripts/host_profile_dense.py --profile fwd
    step profile_causal 90 python3 scripts/host_profile_dense.py --profile fwd --causal
    cp "$work"/profile_*.log "$OUT"/ 2>/dev/null
    finish
    ;;
  s23a)
    # Issue 11's margins: the cells nearest its lines (batch 1 GQA 1 against cuDNN; paged against the same
    # keys contiguous) at other split counts and ring depths (decode_tma_check.py --mode margins, 3 rounds).
    # Then the paper grid's N = 512 anomaly: the N = 512 and 1k forwards at D = 64 then 128 with every
    # default peer (FlexAttention compiled per shape, as in --paper), against s22h's cuDNN-only run.
    begin
    step margins 300 python3 scripts/decode_tma_check.py --mode margins --rounds 3 --reps 50
    step bench_peers 200 python3 -m flashtile bench --head-dim 64 128 --seqlen 512 1k --mode fwd \
      --causal both --out-dir "$work/bench"
    cp "$work"/bench/bench.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s23b)
    # s23a's leads: one program an SM at batch 1 (GQA 1, 4, 8) and a ring of 3 at two programs an SM for
    # batches of 16 and 64, contiguous and paged (decode_tma_check.py --mode margins, 3 rounds).
    begin
    step batch1 200 python3 scripts/decode_tma_check.py --mode margins --rounds 3 --reps 50 \
      --shape 1 65536 1 0 --shape 1 4096 4 0 --shape 1 16384 4 0 --shape 1 16384 8 0 --shape 1 131072 4 0
    step batches 300 python3 scripts/decode_tma_check.py --mode margins --rounds 3 --reps 50 \
      --shape 16 16384 4 0 --shape 64 4096 4 0 --shape 64 16384 4 0 --shape 16 131072 4 0 \
      --shape 16 16384 4 64 --shape 64 4096 4 64
    finish
    ;;
  s23c|s23d)
    # The split rule of s23b (one program an SM where it fills 95 % of the SMs; a ring of 3 where a launch
    # has more programs than SMs): s23c on an H200 its margins at the new defaults, then the decode grid;
    # s23d the grid at the final rule (pages smaller than a tile keep two an SM; the deeper ring for one to
    # two waves of two an SM only), then the decode and KV-cache GPU tests.
    begin
    if [ "$part" = s23c ]; then
      step margins 200 python3 scripts/decode_tma_check.py --mode margins --rounds 3 --reps 50 \
        --shape 1 4096 1 0 --shape 1 16384 1 0 --shape 1 4096 4 0 --shape 1 16384 4 0 --shape 1 16384 8 0 \
        --shape 64 4096 4 0 --shape 64 16384 4 0 --shape 16 16384 4 0 --shape 64 16384 4 256 \
        --shape 1 4096 4 64
    fi
    bench_decode_step
    if [ "$part" = s23d ]; then
      gpu_tests_step 200 tests/test_decode_kernel.py tests/test_gpu_kvcache.py tests/test_kvcache.py \
        tests/test_paged_varlen.py tests/test_rotary.py
    fi
    finish
    ;;
  s23e)
    # The GPU tests of decoding and the KV cache at the split rule of s23c.
    begin
    gpu_tests_step 400 tests/test_decode_kernel.py tests/test_gpu_kvcache.py tests/test_kvcache.py \
      tests/test_paged_varlen.py tests/test_rotary.py
    finish
    ;;
  s23f)
    # The paper grid at the current code (the last was s20b, H100), with the probe's fastest call sizing
    # each cell's timed calls and at least 10 of them.
    begin
    step bench_paper 520 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s23g)
    # The paper grid's slow N = 512 forwards (s23f: every D read about 0.21 ms a call, 0.14 alone): D = 128,
    # N = 512, beside cuDNN, forward alone, then forward with the backward modes (inputs that need grad, as
    # in --paper), then with FlexAttention too; the forward alone again last.
    begin
    args=(--head-dim 128 --seqlen 512 --causal both --warmup-ms 10 --rep-ms 40 --min-reps 10)
    step fwd_1 60 python3 -m flashtile bench "${args[@]}" --mode fwd --peers flashtile sdpa-cudnn \
      --out-dir "$work/fwd"
    step modes 90 python3 -m flashtile bench "${args[@]}" --mode fwd bwd fwd_bwd --peers flashtile sdpa-cudnn \
      --out-dir "$work/modes"
    step flex 120 python3 -m flashtile bench "${args[@]}" --mode fwd bwd fwd_bwd --peers flashtile sdpa-cudnn \
      flex --out-dir "$work/flex"
    step fwd_2 60 python3 -m flashtile bench "${args[@]}" --mode fwd --peers flashtile sdpa-cudnn \
      --out-dir "$work/fwd"
    for d in fwd modes flex; do cp "$work/$d/bench.csv" "$OUT/bench_$d.csv" 2>/dev/null; done
    finish
    ;;
  s24a)
    # Prepared plain calls (kernels/hopper/prepared.py): their GPU tests and the direct launch's, then the
    # host path before (build/old_src: 8b55268) and after at N = 512 and 1k beside cuDNN, then the paper
    # grid's D = 128 cells at N = 512 and 1k before and after, then the API and Gluon backward GPU tests
    # (repeated plain calls there take the prepared launches) until the deadline.
    begin
    step gpu_tests_prepared 90 "${pytest_gpu[@]}" tests/test_prepared_calls.py tests/test_launch_cache.py
    for label in old new; do
      src=src
      [ "$label" = old ] && src=build/old_src
      step "launch_overhead_$label" 80 env PYTHONPATH=$src python3 benchmarks/launch_overhead.py \
        --head-dim 64 128 256 --seqlen 512 1024 --peer --csv "$work/launch_overhead.csv" --label "$label"
    done
    cp "$work/launch_overhead.csv" "$OUT"/ 2>/dev/null
    args=(--head-dim 128 --seqlen 512 1024 --causal both --mode fwd bwd fwd_bwd --peers flashtile sdpa-cudnn)
    step bench_short_old 70 env PYTHONPATH=build/old_src python3 -m flashtile bench "${args[@]}" \
      --out-dir "$work/bench_old"
    step bench_short_new 70 python3 -m flashtile bench "${args[@]}" --out-dir "$work/bench_new"
    cp "$work/bench_old/bench.csv" "$OUT/bench_old.csv" 2>/dev/null
    cp "$work/bench_new/bench.csv" "$OUT/bench_new.csv" 2>/dev/null
    gpu_tests_step 240 tests/test_gpu_api.py tests/test_gpu_hopper_bwd.py
    finish
    ;;
  s24b)
    # The paper grid with the prepared plain calls (s24a: the forward's host time about 85 µs a call on the
    # H100's host, 93-217 before), every peer in the same run.
    begin
    step bench_paper 540 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s24c)
    # flash_attn's options with the prepared plain calls (windows and softcap are plain calls; ALiBi,
    # dropout and packed batches are not): bench --options window before (build/old_src: b960fe0) and
    # after, then the whole bench --options.
    begin
    step bench_window_old 80 env PYTHONPATH=build/old_src python3 -m flashtile bench --options window \
      --out-dir "$work/bench_old"
    step bench_window_new 80 python3 -m flashtile bench --options window --out-dir "$work/bench_new"
    step bench_options 330 python3 -m flashtile bench --options --out-dir "$work/bench"
    cp "$work/bench_old/bench_options.csv" "$OUT/bench_window_old.csv" 2>/dev/null
    cp "$work/bench_new/bench_options.csv" "$OUT/bench_window_new.csv" 2>/dev/null
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s24d)
    # The GPU suite around the prepared plain calls and the autograd change (the sink's gradient): sinks,
    # the API, the Gluon forward, hardening, transformers and the kernel options, until the deadline.
    begin
    gpu_tests_step 540 tests/test_sinks.py tests/test_gpu_api.py tests/test_gpu_hopper.py \
      tests/test_gpu_hardening.py tests/test_gpu_transformers.py tests/test_kernel_options.py
    finish
    ;;
  s24e)
    # Knob reads through flashtile._environ (every per-call environment read): the prepared calls' and the
    # direct launch's GPU tests, then the KV-cache API's (decode kernel choice and PDL read per call).
    begin
    gpu_tests_step 200 tests/test_prepared_calls.py tests/test_launch_cache.py tests/test_gpu_kvcache.py
    finish
    ;;
  s25a)
    # ALiBi by the key tiles' side of the diagonal (hopper/fwd.py, _alibi_scores): the Gluon forward's and
    # the KV cache's GPU tests, then bench --options alibi forward (causal and not, flashtile alone) before
    # (build/old_src) and after, twice in turn; then the D = 64 forward with K/V rings of 3 and 4 tiles
    # against 2 below 4k (scripts/hopper_persistent_check.py --stages, kernel time beside cuDNN).
    begin
    gpu_tests_step 150 tests/test_gpu_hopper.py tests/test_gpu_kvcache.py
    bench_old_new_args alibi 70 --options alibi --causal both --mode fwd --peers flashtile
    cp "$work/bench_old/bench_options.csv" "$OUT/bench_alibi_old.csv" 2>/dev/null
    cp "$work/bench_new/bench_options.csv" "$OUT/bench_alibi_new.csv" 2>/dev/null
    step stages_d64 150 python3 scripts/hopper_persistent_check.py --head-dims 64 \
      --seqlens 512 1024 2048 4096 --only-grid --stages 3 4 --csv "$OUT/stages_d64.csv"
    finish
    ;;
  s26a)
    # The paper grid with each cell's implementations timed in turn over three rounds (bench.timing's
    # time_in_rounds), every peer in the same run.
    begin
    step bench_paper 540 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s26b)
    # flash_attn's options with each cell's implementations timed in turn over three rounds; then the
    # D = 64 causal forward below 8k with K/V tiles of 64 keys against 128 (hopper_persistent_check.py).
    begin
    step bench_options 400 python3 -m flashtile bench --options --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    step block_n_d64 100 python3 scripts/hopper_persistent_check.py --head-dims 64 --causal-only \
      --seqlens 512 1024 2048 4096 --only-grid --block-n 64 --csv "$OUT/block_n_d64.csv"
    finish
    ;;
  s26c)
    # Where the options' forward key loops stall: Nsight Compute's warp-state and instruction sections on
    # one launch of the Gluon forward, plain, softcap, dropout and ALiBi (at the time
    # scripts/option_loop_profile.py, now scripts/cell_profile.py --option), if the machine has ncu.
    begin
    step tools 30 bash -c 'for t in ncu nsys compute-sanitizer; do command -v $t || echo "no $t"; done; ls /usr/local/cuda*/bin 2>/dev/null | grep -i -E "ncu|nsight" || true'
    for option in plain softcap dropout alibi; do
      step "ncu_$option" 45 ncu --nvtx --nvtx-include "profiled/" --kernel-name regex:attn_fwd \
        --section WarpStateStats --section SchedulerStats --section InstructionStats \
        --section ComputeWorkloadAnalysis --csv --page details \
        python3 scripts/cell_profile.py --option "$option"
      cp "$work/ncu_$option.log" "$OUT/" 2>/dev/null
    done
    finish
    ;;
  s26d)
    # (Prepared in the twenty-sixth session, not run there: its device time was spent.) The stall reasons
    # of the options' forward (s26c gave the sections' summaries only): every
    # smsp__average_warps_issue_stalled_*_per_issue_active ratio of one launch, plain, softcap, dropout and
    # ALiBi (scripts/cell_profile.py --option).
    begin
    for option in plain softcap dropout alibi; do
      step "stalls_$option" 60 ncu --nvtx --nvtx-include "profiled/" --kernel-name regex:attn_fwd \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio --csv --page raw \
        python3 scripts/cell_profile.py --option "$option"
      cp "$work/stalls_$option.log" "$OUT/" 2>/dev/null
    done
    finish
    ;;
  s26e)
    # (Prepared in the twenty-sixth session, not run there.) Ring attention on two GPUs (kind
    # nvidia-h200-x2): accuracy against one GPU's fp32 call under the 2×/3× rule, and the ring's time
    # against compute alone, the exchanges alone and one GPU (scripts/context_parallel_check.py).
    begin
    # (8k only: the fp32 reference at 32k would hold a 68 GB score matrix; thirtieth session.)
    step context_parallel 300 python3 -m torch.distributed.run --nproc-per-node 2 \
      scripts/context_parallel_check.py --seqlens 8192 --csv "$OUT/context_parallel.csv"
    finish
    ;;
  s27a)
    # The Gluon forward's consumers issuing their wgmmas in turn (ping-pong, FLASHTILE_HOPPER_FWD_PINGPONG)
    # against not, kernel time alternating, outputs bitwise equal (scripts/pingpong_check.py): D = 128 every
    # option, causal and not, 4k and 16k; D = 64 and 256 softcap and dropout at 4k. Then the Gluon forward's
    # GPU tests with ping-pong forced on for every two-consumer launch (plain attention included).
    begin
    step pingpong_d128 230 python3 scripts/pingpong_check.py --head-dims 128 --csv "$OUT/pingpong.csv"
    step pingpong_d64_256 90 python3 scripts/pingpong_check.py --head-dims 64 256 --seqlens 4096 \
      --causal false --options plain softcap dropout --rounds 2 --csv "$OUT/pingpong.csv"
    FLASHTILE_HOPPER_FWD_PINGPONG=1 gpu_tests_step 200 tests/test_gpu_hopper.py
    finish
    ;;
  s27b)
    # The float8 forward (flashtile.fp8) and ping-pong's options on the GPU: tests/test_fp8.py's GPU cases,
    # the consumers-in-turn bitwise check and the dropout API cases; then bench --options forward for fp8
    # (against flashtile's bf16 kernel), softcap, ALiBi and dropout (ping-pong on) beside the peers.
    begin
    gpu_tests_step 170 tests/test_fp8.py tests/test_gpu_hopper.py tests/test_gpu_api.py -k "fp8 or turns or dropout"
    step bench_options 360 python3 -m flashtile bench --options fp8 softcap alibi dropout --mode fwd \
      --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    cp "$work"/bench/bench_options_fp8_fwd_bf16.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s27c)
    # The float8 forward with Vᵀ's tiles K-major (V transposed on the host): tests/test_fp8.py's GPU cases,
    # bench --options fp8 (forward, against flashtile's bf16 kernel) twice.
    begin
    gpu_tests_step 120 tests/test_fp8.py
    step bench_fp8_1 120 python3 -m flashtile bench --options fp8 --mode fwd --out-dir "$work/bench"
    step bench_fp8_2 120 python3 -m flashtile bench --options fp8 --mode fwd --causal true --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s27d)
    # Tilings of the float8 forward, kernel time beside the bf16 Hopper kernel (scripts/fp8_configs.py).
    begin
    step fp8_configs 400 python3 scripts/fp8_configs.py --csv "$OUT/fp8_configs.csv"
    finish
    ;;
  s27e)
    # The float8 forward at its measured tilings (s27d): tests/test_fp8.py's GPU cases and the sm_90 ones of
    # the portable kernels' float8 compile, then bench --options fp8 forward, causal and not.
    begin
    gpu_tests_step 120 tests/test_fp8.py
    step bench_fp8 200 python3 -m flashtile bench --options fp8 --mode fwd --causal both --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/bench_options_fp8_fwd_bf16.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s27f)
    # compute-sanitizer memcheck over the float8 forward (its Vᵀ reads past N), and the Gluon option and
    # dropout groups, whose forwards now take turns (ping-pong).
    begin
    memcheck_group fp8,hopper_options,hopper_dropout 130 290
    finish
    ;;
  s27g)
    # The Gluon float8 forward: tests/test_fp8.py's GPU cases (Gluon and portable), the Gluon forward's GPU
    # tests (its bf16 kernels share the changed code), then bench --options fp8 forward, causal and not,
    # the Gluon kernel and (FLASHTILE_FP8_KERNEL=portable) the portable one.
    begin
    gpu_tests_step 230 tests/test_fp8.py tests/test_gpu_hopper.py
    step bench_fp8_gluon 90 python3 -m flashtile bench --options fp8 --mode fwd --causal both --out-dir "$work/bench"
    step bench_fp8_portable 90 env FLASHTILE_FP8_KERNEL=portable python3 -m flashtile bench --options fp8 \
      --mode fwd --causal both --out-dir "$work/bench_portable"
    cp "$work"/bench/bench_options.csv "$OUT"/bench_options_gluon.csv 2>/dev/null
    cp "$work"/bench_portable/bench_options.csv "$OUT"/bench_options_portable.csv 2>/dev/null
    cp "$work"/bench/bench_options_fp8_fwd_bf16.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s27h)
    # The prepared plain calls and the public API on the GPU after the float8 pointer joined the Gluon
    # forward's arguments (tests/test_prepared_calls.py caught the missing one on the CPU).
    begin
    gpu_tests_step 330 tests/test_gpu_api.py tests/test_prepared_calls.py tests/test_launch_cache.py
    finish
    ;;
  s28a)
    # The twenty-seventh session's last changes on a GPU (the Gluon decode given _softmax_step's SCALE_FIRST,
    # the float8 custom op), then Nsight Compute on the paper grid's weakest cells: flashtile's D = 64
    # causal N = 512 forward sampled instruction by instruction and cuDNN's in sections, the launch
    # statistics of cuDNN's kernels (its tiling: grid, block, registers, shared memory) beside flashtile's,
    # and the softcap forward sampled (scripts/cell_profile.py, scripts/ncu_source_top.py).
    begin
    gpu_tests_step 180 tests/test_gpu_kvcache.py tests/test_fp8.py tests/test_gpu_api.py
    step sampled_d64c512 90 ncu --nvtx --nvtx-include "profiled/" --kernel-name regex:attn_fwd --set full \
      --import-source no -f -o "$work/d64c512" python3 scripts/cell_profile.py --head-dim 64 --seqlen 512 \
      --causal
    step source_d64c512 60 bash -c "ncu -i '$work/d64c512.ncu-rep' --page source --print-source sass --csv \
      > '$work/d64c512_source.csv'; python3 scripts/ncu_source_top.py '$work/d64c512_source.csv' --top 60; \
      ncu -i '$work/d64c512.ncu-rep' --page details --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats"
    cp "$work/source_d64c512.log" "$OUT/"
    step sampled_cudnn_d64c512 60 ncu --nvtx --nvtx-include "profiled/" --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      python3 scripts/cell_profile.py --impl cudnn --head-dim 64 --seqlen 512 --causal
    cp "$work/sampled_cudnn_d64c512.log" "$OUT/"
    launch_stats_steps "cudnn fwd 64 512 --causal" "cudnn fwd 64 2048 --causal" "cudnn fwd 64 512" \
      "cudnn fwd 128 512" "cudnn bwd 128 16384" "cudnn bwd 256 4096 --causal" "cudnn bwd 256 4096" \
      "flashtile bwd 256 4096 --causal" "flashtile bwd 128 16384"
    step sampled_softcap 90 ncu --nvtx --nvtx-include "profiled/" --kernel-name regex:attn_fwd --set full \
      --import-source no -f -o "$work/softcap" python3 scripts/cell_profile.py --option softcap
    step source_softcap 60 bash -c "ncu -i '$work/softcap.ncu-rep' --page source --print-source sass --csv \
      > '$work/softcap_source.csv'; python3 scripts/ncu_source_top.py '$work/softcap_source.csv' --top 60"
    cp "$work/source_softcap.log" "$OUT/"
    # The reports and the pages' CSVs stay on the device (too large to bring back).
    rm -f "$work"/*.ncu-rep "$work"/*_source.csv
    finish
    ;;
  s28b)
    # The Gluon forward's first key tile without the mask where every row sees it whole, and the causal
    # mask as one compare a score (hopper/fwd.py: _first_tile_partial, _row_terms): kernel time against the
    # forward before (build/old_fwd.py, carried by the device call) and cuDNN at D = 64 and 128 up to 4k
    # (scripts/hopper_persistent_check.py --baseline), then the Gluon forward's and the KV cache's GPU
    # tests (the decode kernel shares the mask's helpers).
    begin
    step first_tile 200 python3 scripts/hopper_persistent_check.py --head-dims 64 128 \
      --seqlens 512 1024 2048 4096 --only-grid --baseline build/old_fwd.py --csv "$OUT/first_tile.csv"
    gpu_tests_step 300 tests/test_gpu_hopper.py tests/test_gpu_kvcache.py
    finish
    ;;
  s28c)
    # The landed first-tile change (tile 0 branching between two whole softmax steps, no spill) against the
    # forward before it (build/old_fwd.py) and cuDNN, kernel time, D = 64 and 128 from 512 to 16k; then the
    # Gluon forward's GPU tests.
    begin
    step first_tile 200 python3 scripts/hopper_persistent_check.py --head-dims 64 128 \
      --seqlens 512 1024 2048 4096 16384 --only-grid --baseline build/old_fwd.py --csv "$OUT/first_tile.csv"
    gpu_tests_step 260 tests/test_gpu_hopper.py
    finish
    ;;
  s28d)
    # The paper grid in rounds (as s26a) on the twenty-eighth session's forward.
    begin
    step bench_paper 540 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s29a)
    # (Prepared in the twenty-eighth session.) Tile 0 without its mask on one program a tile: the forward of
    # 42d8e39 (the change on every grid; `git show 42d8e39:src/flashtile/kernels/hopper/fwd.py >
    # build/ungated_fwd.py`, carried) against the landed one (persistent grid only) at D = 128 and 256,
    # kernel time: is D = 128 from 4k again 9-12 % slower with it (s28c), does D = 256 at N <= 1k gain?
    begin
    step ungated 200 python3 scripts/hopper_persistent_check.py --head-dims 128 256 \
      --seqlens 512 1024 4096 16384 --only-grid --baseline build/ungated_fwd.py --csv "$OUT/ungated.csv"
    finish
    ;;
  s29b)
    # (Branch exp/causal-mask-local, prepared in the twenty-eighth session.) The causal mask as one compare
    # of the tile's key offsets (hopper/fwd.py, _visible) against main's forward (`git show
    # main:src/flashtile/kernels/hopper/fwd.py > build/main_fwd.py`, carried), kernel time, causal cells
    # at D = 64, 128 and 256; then the Gluon forward's and the KV cache's GPU tests (the decode kernel
    # shares the mask).
    begin
    step causal_mask 220 python3 scripts/hopper_persistent_check.py --head-dims 64 128 256 --causal-only \
      --seqlens 512 1024 2048 4096 16384 --baseline build/main_fwd.py --csv "$OUT/causal_mask.csv"
    gpu_tests_step 280 tests/test_gpu_hopper.py tests/test_gpu_kvcache.py
    finish
    ;;
  s29c)
    # (Twenty-ninth session, on branch exp/causal-mask-local, whose D = 128 / 256 compile to main's code.)
    # s29a's and s29b's timings in one call: the ungated tile 0 (42d8e39, build/ungated_fwd.py) against the
    # landed forward at D = 128 / 256, then the one-compare causal mask against main's (build/main_fwd.py).
    begin
    step ungated 200 python3 scripts/hopper_persistent_check.py --head-dims 128 256 \
      --seqlens 512 1024 4096 16384 --only-grid --baseline build/ungated_fwd.py --csv "$OUT/ungated.csv"
    step causal_mask 220 python3 scripts/hopper_persistent_check.py --head-dims 64 128 256 --causal-only \
      --seqlens 512 1024 2048 4096 16384 --baseline build/main_fwd.py --csv "$OUT/causal_mask.csv"
    finish
    ;;
  s29d)
    # (Twenty-ninth session, on branch exp/causal-mask-local.) The Gluon forward's and the KV cache's GPU
    # tests under the one-compare causal mask, then Nsight Compute on the softcap forward (D = 128, N = 4k,
    # `bench --options`' cell; s28a's loop stopped before it) and on the plain one of the same cell: where
    # softcap's extra time goes, summed by opcode (scripts/ncu_source_top.py).
    begin
    gpu_tests_step 280 tests/test_gpu_hopper.py tests/test_gpu_kvcache.py
    ncu_fwd_options 90 softcap plain
    finish
    ;;
  s29e)
    # (Twenty-ninth session, branch exp/three-consumers-local.) Three consumers at D = 64 with the
    # one-compare causal mask, and dense ones with tile 0 unmasked, against main's forward
    # (build/main_fwd.py, 36b336a; "baseline-3"), kernel time; then cuDNN's backward kernels' launch
    # statistics (grid, block, registers, shared memory) at the weakest backward cells beside flashtile's.
    begin
    step three 150 python3 scripts/hopper_persistent_check.py --head-dims 64 --consumers --only-grid \
      --seqlens 2048 4096 16384 --baseline build/main_fwd.py --csv "$OUT/three.csv"
    launch_stats_steps "cudnn bwd 256 4096 --causal" "flashtile bwd 256 4096 --causal" "cudnn bwd 128 16384" \
      "flashtile bwd 128 16384"
    finish
    ;;
  s29f)
    # (Twenty-ninth session, main after the one-compare causal mask.) Two consumers or three at D = 64
    # causal from 4k (the rule takes three from 4k; two got faster since it was set): kernel time, then the
    # same cells through `bench` with two forced; the D = 64 forward of the paper grid for the README; then
    # s29e's launch statistics of the backward kernels (flashtile's and cuDNN's; the backward on the
    # calling thread now, so inside the NVTX range).
    begin
    step consumers 120 python3 scripts/hopper_persistent_check.py --head-dims 64 --consumers --causal-only \
      --seqlens 4096 8192 16384 --csv "$OUT/consumers.csv"
    step bench_d64_fwd 200 python3 -m flashtile bench --paper --head-dim 64 --mode fwd --out-dir "$work/bench"
    step bench_two 120 env FLASHTILE_HOPPER_FWD_CONSUMERS=2 python3 -m flashtile bench --paper --head-dim 64 \
      --mode fwd --causal true --seqlen 4096 8192 16384 --peers flashtile sdpa-cudnn --out-dir "$work/bench_two"
    cp "$work"/bench/bench.csv "$OUT"/bench_d64_fwd.csv
    cp "$work"/bench_two/bench.csv "$OUT"/bench_two.csv
    launch_stats_steps "cudnn bwd 256 4096 --causal" "flashtile bwd 256 4096 --causal" "cudnn bwd 128 16384" \
      "flashtile bwd 128 16384"
    finish
    ;;
  s29g)
    # (Twenty-ninth session, branch exp/d256-local.) The one-compare causal mask at D = 256 too (two
    # consumers, no option) against main's forward (build/main_fwd.py, carried), kernel time, causal cells;
    # then the GPU tests of the Gluon forward's causal, three-consumer (now from 8k causal) and persistent
    # paths.
    begin
    step d256_mask 120 python3 scripts/hopper_persistent_check.py --head-dims 256 --causal-only \
      --seqlens 512 1024 2048 4096 16384 --baseline build/main_fwd.py --csv "$OUT/d256_mask.csv"
    gpu_tests_step 200 tests/test_gpu_hopper.py -k "three_consumer or persistent_grid or gluon_fwd_matches"
    finish
    ;;
  s29h)
    # (Twenty-ninth session, the last call.) The Gluon forward's GPU tests after the one-compare causal mask
    # at D = 64 and 256 and three consumers from 8k causal, then the paper grid's forward (the backward's
    # kernels did not change since s28d) for the README.
    begin
    gpu_tests_step 260 tests/test_gpu_hopper.py
    paper_fwd_step 260
    finish
    ;;
  s29i)
    # (Twenty-ninth session, branch exp/d256-persistent.) The D = 256 forward on the persistent grid, its
    # output staged in the one Q buffer and the next tile's first K/V tiles loaded before its Q
    # (fwd.output_in_q), against one program a tile (main's D = 256 kernel), kernel time; then the GPU
    # tests of the persistent grid (D = 256 cases added) and of the plain forward.
    begin
    step d256_persistent 70 python3 scripts/hopper_persistent_check.py --head-dims 256 --only-grid \
      --seqlens 512 1024 2048 4096 --csv "$OUT/d256_persistent.csv"
    gpu_tests_step 110 tests/test_gpu_hopper.py -k "persistent_grid or gluon_fwd_matches"
    finish
    ;;
  s30a)
    # (Prepared in the twenty-ninth session; branch exp/bwd-dim-persistent.) The D = 256 backward's "dim"
    # split on a persistent grid (one program an SM over K/V blocks, the next block's K and V loaded during
    # this one's dK/dV stores): its GPU tests (the D = 256 cases, two with more K/V blocks than SMs), then
    # the D = 256 backward against cuDNN with FLASHTILE_HOPPER_BWD_PERSISTENT=0 and 1 alternating, twice.
    begin
    gpu_tests_step 200 tests/test_gpu_hopper_bwd.py -k "256"
    bench_knob_values FLASHTILE_HOPPER_BWD_PERSISTENT "0 1" bwd_persistent 90 --head-dim 256 --mode bwd \
      --causal both --seqlen 512 1024 4096 16384 --peers flashtile sdpa-cudnn
    finish
    ;;
  s30b)
    # (Prepared in the twenty-ninth session; main.) The D = 256 forward on the persistent grid (7bb1463):
    # the persistent-grid GPU tests (three D = 256 cases added after s29i, not yet run: several tiles a
    # program, causal N_q > N_k), then memcheck over the sanitizer's hopper_d256_persistent group (the
    # same shapes, forward and backward).
    begin
    gpu_tests_step 150 tests/test_gpu_hopper.py -k "persistent_grid or gluon_fwd_matches"
    memcheck_group hopper_d256_persistent 120 240
    finish
    ;;
  s30c)
    # (Prepared in the twenty-ninth session.) The paper grid in rounds at the current code (the README's
    # forward row is s29h's, before the D = 256 persistent forward; its backward rows are s28d's).
    begin
    step bench_paper 540 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s30d)
    # The D = 256 backward's causal deficit (s30c: 0.88-0.93x cuDNN causal, 1.01-1.14x not): Nsight
    # Compute's speed of light, memory workload (L2 hit rate, DRAM traffic), warp states and scheduler on
    # flashtile's fused backward kernel, causal and not, at N = 1k and 4k, and on cuDNN's at 4k causal.
    begin
    for cell in "flashtile 4096" "flashtile 4096 --causal" "flashtile 1024" "flashtile 1024 --causal" \
      "cudnn 4096 --causal" "cudnn 4096"; do
      set -- $cell
      kernel=()
      [ "$1" = flashtile ] && kernel=(--kernel-name regex:attn_bwd_kernel)
      step "prof_$1_n$2${3:+_causal}" 90 ncu --nvtx --nvtx-include "profiled/" "${kernel[@]}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section LaunchStats --section Occupancy \
        python3 scripts/cell_profile.py --impl "$1" --mode bwd --head-dim 256 --seqlen "$2" ${3:-}
    done
    cat "$work"/prof_*.log > "$OUT/profiles.log"
    finish
    ;;
  s30e)
    # The causal backward's key blocks numbered longest first across a group of heads
    # (bwd.causal_head_group; head by head, the last heads' longest blocks start late: s30d's D = 256
    # causal kernel took 0.59 of the dense one's time at 4k against cuDNN's 0.50). The causal GPU tests
    # of the backward, then FLASHTILE_HOPPER_BWD_HEAD_GROUP=0 and 1 alternating twice against cuDNN.
    # (Ran at 0544c28: no gain; the order and its knob were reverted, docs/design/hopper_bwd.md.)
    begin
    gpu_tests_step 170 tests/test_gpu_hopper_bwd.py -k "causal"
    bench_knob_values FLASHTILE_HOPPER_BWD_HEAD_GROUP "0 1" head_group 100 --head-dim 64 128 256 --mode bwd \
      --causal true --seqlen 512 1024 2048 4096 16384 --peers flashtile sdpa-cudnn
    finish
    ;;
  s31a)
    # (Prepared in the thirtieth session; kind nvidia-h200-x2.) Context parallelism where it should pay:
    # s26e found two GPUs slower than one at 8k (ring forward 1.54 against 0.98 ms). The 8k cells checked
    # and timed again, then 32k and 128k timed only (no fp32 reference there).
    begin
    step context_parallel 420 python3 -m torch.distributed.run --nproc-per-node 2 \
      scripts/context_parallel_check.py --seqlens 8192 --time-seqlens 32768 131072 \
      --csv "$OUT/context_parallel.csv"
    finish
    ;;
  s31b)
    # (Prepared in the thirtieth session; branch exp/softcap-poly-exp2.) One exponential in 2, 4 or 8 of
    # the forward's unmasked tiles on the FMA pipes (hopper.fwd._exp2_shared): its GPU tests (every share,
    # plain and softcap, D = 64 / 128 / 256, causal and not, bf16 and fp16, exponents past the clamp), the
    # options' and ping-pong tests; then `bench --options softcap` (softcap beside the plain kernel at 4k
    # and 16k) with FLASHTILE_HOPPER_FWD_EXP2_POLY at 0, 2 and 4 in turn, twice. s31c: the D = 64 cells.
    begin
    gpu_tests_step 170 tests/test_gpu_hopper.py -k "fma_pipes or options or turns"
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 2 4" softcap_poly 70 --options softcap \
      --head-dim 64 128 256 --causal both --mode fwd --peers flashtile
    finish
    ;;
  s31c)
    # (Prepared in the thirtieth session; branch exp/softcap-poly-exp2, after s31b.) The D = 64 forward's
    # paper cells with FLASHTILE_HOPPER_FWD_EXP2_POLY at 0, 4 and 8 in turn, twice, against cuDNN.
    begin
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 4 8" d64_poly 60 --head-dim 64 --mode fwd \
      --causal both --seqlen 512 1024 2048 4096 16384 --peers flashtile sdpa-cudnn
    finish
    ;;
  s31d)
    # (Thirty-first session, after s31b.) The polynomial's default (one in 4 under softcap at D = 64):
    # the options' and ping-pong tests s31b's time box did not reach, its one missing share case, then
    # `bench --options softcap` at the defaults against cuDNN, for benchmarks/results/bench.csv.
    begin
    gpu_tests_step 240 tests/test_gpu_hopper.py -k "(options or turns or fp16-256-causal-8) and not bf16-"
    step bench_softcap 120 python3 -m flashtile bench --options softcap --head-dim 64 128 --causal both \
      --mode fwd --peers flashtile sdpa-cudnn --no-plot --out-dir "$work/bench" --name bench_options
    cp "$work"/bench/bench_options*.csv "$OUT"/
    finish
    ;;
  s31e)
    # (Thirty-first session.) The D = 64 forward's weak cells with two consumers (causal to 4k, full to 1k):
    # s31b's one gain for plain attention was D = 64 causal 4k with one exponential in 4 on the FMA pipes
    # (0.675 -> 0.653 ms), and ping-pong was never timed for plain D = 64. Each knob in turn, twice,
    # against cuDNN.
    begin
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 4 8" d64_poly 60 --head-dim 64 --mode fwd \
      --causal both --seqlen 512 1024 2048 4096 --peers flashtile sdpa-cudnn
    bench_knob_values FLASHTILE_HOPPER_FWD_PINGPONG "0 1" d64_pingpong 60 --head-dim 64 --mode fwd \
      --causal both --seqlen 512 1024 2048 4096 --peers flashtile sdpa-cudnn
    finish
    ;;
  s31f)
    # (Thirty-first session; branch exp/work-tile-setup.) A persistent program's work tiles without integer
    # divisions on their way to the first wgmma (fwd._divider: a multiply-high and a shift by M and H, made
    # once a program; the causal slot map from the round): the consumer's instructions before its first
    # wait fall from 173 to 78 (D = 64 causal), 71 to 22 (D = 64 full) on sm_90. Its GPU tests, then the
    # D = 64, 128 and 256 forward at 512-4k against main's code (build/old_src), alternating twice.
    begin
    gpu_tests_step 240 tests/test_gpu_hopper.py \
      -k "persistent_grid or gluon_fwd_matches or three_consumer or gluon_fwd_options"
    bench_old_new_args setup 80 --head-dim 64 128 256 --mode fwd --causal both --seqlen 512 1024 2048 4096 \
      --peers flashtile sdpa-cudnn --no-plot
    cp "$work"/bench_old/bench.csv "$OUT"/setup_old.csv
    cp "$work"/bench_new/bench.csv "$OUT"/setup_new.csv
    finish
    ;;
  s31g)
    # (Thirty-first session, the last call.) The Hopper forward's GPU tests s31f did not run (packed
    # batches, block masks, float8, windows: the work tiles' divisions changed for every launch), then the
    # paper grid's forward for the README.
    begin
    gpu_tests_step 170 tests/test_gpu_hopper.py \
      -k "not (persistent_grid or gluon_fwd_matches or three_consumer or gluon_fwd_options)"
    paper_fwd_step 180
    finish
    ;;
  s32a)
    # (Prepared in the thirty-first session.) The forward's GPU tests the device time left unrun after
    # the work tiles' divisions changed (s31g): packed batches, the API's option cases, the three-stage
    # window, block masks and mask_mods in the Gluon kernels, float8; then the paper grid's forward.
    begin
    gpu_tests_step 260 tests/test_gpu_hopper.py tests/test_gpu_hopper_block_sparse.py tests/test_fp8.py \
      -k "varlen or through_the_api or three_stage or block_mask or mask_mod or fp8"
    paper_fwd_step 230
    finish
    ;;
  s32b)
    # (Thirty-second session; kind nvidia-h200-x2.) Context parallelism timed again after the check script
    # took the slowest rank's time (s31a timed rank 0 alone, which under a causal contiguous split has the
    # least work): 8k, 32k and 128k, timed only (8k's accuracy passed in s26e and s31a). Then the D = 64
    # forward's three-consumer rule on GPU 0, after the work tiles lost their divisions (s31f): two and
    # three consumers in turn, twice, against cuDNN, around the thresholds (2k full, 8k causal).
    begin
    step context_parallel 330 python3 -m torch.distributed.run --nproc-per-node 2 \
      scripts/context_parallel_check.py --seqlens --time-seqlens 8192 32768 131072 \
      --csv "$OUT/context_parallel.csv"
    bench_knob_values FLASHTILE_HOPPER_FWD_CONSUMERS "2 3" d64_consumers 60 --head-dim 64 --mode fwd \
      --causal both --seqlen 1024 2048 4096 8192 --peers flashtile sdpa-cudnn
    finish
    ;;
  s32c)
    # (Thirty-second session.) compute-sanitizer memcheck over the forward's work-tile mappings after the
    # divisions became the launcher's magic numbers (s31f; its arithmetic is checked exactly on the CPU):
    # the persistent, three-consumer, paired and D = 256 persistent groups, and the option and block-mask
    # groups (one program a tile, fwd._divmod), each case twice (the second relaunches directly).
    begin
    memcheck_group hopper_persistent,hopper_three,hopper_paired,hopper_d256_persistent,hopper_options,hopper_sparse \
      260 270 --repeat 2
    finish
    ;;
  s32d)
    # (Thirty-second session.) The paper grid's backward and forward + backward at main (the forward ran in
    # s32a): the backward kernels have not changed since s30c, the forward's work tiles have (s31f).
    begin
    step bench_bwd 440 python3 -m flashtile bench --paper --mode bwd fwd_bwd --out-dir "$work/bench"
    cp "$work"/bench/bench.csv "$OUT"/bench_bwd_fwd_bwd.csv
    cp "$work"/bench/bench_bwd_bf16.png "$work"/bench/bench_fwd_bwd_bf16.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s33a)
    # (Prepared in the thirty-second session.) The two paper cells s32d's time box left out, backward and
    # forward + backward: D = 256 causal at 8k and 16k, the peers in the same run.
    begin
    step bench_bwd 300 python3 -m flashtile bench --paper --mode bwd fwd_bwd --head-dim 256 --causal true \
      --seqlen 8192 16384 --no-plot --out-dir "$work/bench"
    cp "$work"/bench/bench.csv "$OUT"/bench_d256_causal.csv
    finish
    ;;
  s33b)
    # (Prepared in the thirty-second session; branch exp/thread-release, carrying build/old_src = main's
    # src/flashtile.) Ring slots released by every consumer thread (fwd._release: cp.async.mbarrier.arrive
    # .noinc, barriers counting 128 a consumer) instead of Gluon's one-thread arrive behind a partition
    # bar.sync: the forward's K/V "empty" barriers (two bar.syncs a key tile fewer, BAR.SYNC 48 -> 36 / 38
    # in the D = 64 / 128 kernels) and the "keys" backward's Q/dO "empty" barrier (one a block fewer,
    # 38 -> 36). The forward's and backward's GPU tests first (the barrier protocol changed), then the
    # forward against main's code, alternating twice, cuDNN in each run.
    begin
    gpu_tests_step 330 tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py -k "persistent_grid or \
      gluon_fwd_matches or three_consumer or gluon_fwd_options or hopper_bwd_matches or bwd_options or \
      does_not_leak or bitwise"
    bench_old_new_args fwd 60 --head-dim 64 128 --mode fwd --causal both --seqlen 512 1024 2048 4096 16384 \
      --peers flashtile sdpa-cudnn
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s33c)
    # (Prepared in the thirty-second session; branch exp/thread-release, after s33b, carrying
    # build/old_src.) The backward (D = 64 and 128, the "keys" split) against main's code, alternating
    # twice, cuDNN in each run; then the options' forward (softcap, ALiBi and dropout take ping-pong turns
    # beside the released slots).
    begin
    bench_old_new_args bwd 80 --head-dim 64 128 --mode bwd --causal both --seqlen 1024 2048 4096 16384 \
      --peers flashtile sdpa-cudnn
    bench_old_new_args options 70 --options softcap alibi dropout --mode fwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s33d)
    # (Thirty-third session; branch exp/thread-release at its measured rule, carrying build/old_src =
    # main's src/flashtile.) s33b/s33c released the slots thread by thread everywhere they could: faster
    # only in the D = 64 forward (two consumers) and the D = 128 backward, 1-4 % slower in the D = 128
    # forward and 8 % in the D = 64 causal backward. The rule now takes them there alone: the GPU tests
    # of the forward and backward at those head dims, then both against main's code, alternating twice.
    begin
    gpu_tests_step 170 tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py -k "persistent_grid or \
      gluon_fwd_matches or three_consumer or hopper_bwd_matches or bitwise"
    bench_old_new_args fwd 50 --head-dim 64 --mode fwd --causal both --seqlen 512 1024 2048 4096 8192 16384 \
      --peers flashtile sdpa-cudnn
    bench_old_new_args bwd 60 --head-dim 128 --mode bwd --causal both --seqlen 512 1024 2048 4096 8192 16384 \
      --peers flashtile sdpa-cudnn
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s33e)
    # (Thirty-third session, after the slots released thread by thread landed: forward D = 64 with two
    # consumers, backward "keys" D = 128.) The paper grid's cells that changed: D = 128 backward and
    # forward + backward, D = 64 forward, every peer in the same run.
    begin
    step bench_bwd 280 python3 -m flashtile bench --paper --mode bwd fwd_bwd --head-dim 128 --no-plot \
      --out-dir "$work/bench"
    step bench_fwd 170 python3 -m flashtile bench --paper --mode fwd --head-dim 64 --no-plot \
      --out-dir "$work/bench"
    cp "$work"/bench/bench.csv "$OUT"/bench_d128_bwd_d64_fwd.csv
    finish
    ;;
  s33f)
    # (Thirty-third session.) compute-sanitizer memcheck after the slots released thread by thread (forward
    # D = 64 with two consumers, backward "keys" D = 128): the hopper, persistent and option groups, each
    # case twice (the second relaunches directly).
    begin
    memcheck_group hopper,hopper_persistent,hopper_options 320 110 --repeat 2
    finish
    ;;
  s33g)
    # (Thirty-third session; branch exp/alibi-one-sided, carrying build/old_src = main's src/flashtile.)
    # ALiBi's forward with the tiles on one side of the diagonal biased by one FMA a score (the distance's
    # column part; the row part shifts m): the forward's ALiBi GPU tests, then bench --options alibi
    # against main's code, alternating twice.
    begin
    gpu_tests_step 110 tests/test_gpu_hopper.py -k "alibi"
    bench_old_new_args alibi 45 --options alibi --mode fwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s34a)
    # (Prepared in the thirty-third session.) ALiBi's one-sided form (fwd._alibi_scores) reached the
    # decode kernel's code too (its absolute-value branch, a slope a row): the KV-cache and decode GPU
    # tests and the API's ALiBi cases, then bench --options alibi causal and not, every peer, for the
    # README's table (s33g timed only D = 128 non-causal against the code before).
    begin
    gpu_tests_step 200 tests/test_gpu_kvcache.py tests/test_decode_kernel.py tests/test_gpu_api.py \
      tests/test_gpu_hopper.py -k "alibi or decode or kvcache"
    step bench_alibi 200 python3 -m flashtile bench --options alibi --causal both --mode fwd bwd \
      --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s34b)
    # (Prepared in the thirty-third session; branch exp/philox7, carrying build/old_src = main's
    # src/flashtile.) Dropout's Philox calls at seven rounds (flash_attn's count) instead of ten: the
    # dropout GPU tests of every backend (the mask changed, the rule did not), then bench --options
    # dropout forward and backward against main's code, alternating twice.
    begin
    gpu_tests_step 240 tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_gpu_api.py \
      tests/test_kernel_options.py -k "dropout"
    bench_old_new_args dropout 60 --options dropout --causal both --mode fwd bwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s34c)
    # (Prepared in the thirty-third session; branch exp/alibi-bwd-one-sided, carrying build/old_src =
    # main's src/flashtile.) The causal backward with ALiBi alone: the distance's row part in the
    # exponent's FMA and its column part beside the LSE (bwd._alibi_probs), one operation a score fewer
    # and 17 local accesses a key loop against 8 (sm_90, D = 128). The backward's ALiBi GPU tests, then
    # bench --options alibi --causal true --mode bwd against main's code, alternating twice.
    begin
    gpu_tests_step 150 tests/test_gpu_hopper_bwd.py tests/test_gpu_api.py -k "alibi"
    bench_old_new_args alibi_bwd 60 --options alibi --causal true --mode bwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s34d)
    # (Thirty-fourth session; branch exp/s34 = main + exp/philox7 + exp/alibi-bwd-one-sided.) The GPU tests
    # of s34a, s34b and s34c in one step: ALiBi (forward one-sided, decode's absolute value, the causal
    # backward's row and column parts), dropout at seven Philox rounds, the KV-cache and decode kernels.
    begin
    gpu_tests_step 500 tests/test_gpu_kvcache.py tests/test_decode_kernel.py tests/test_gpu_api.py \
      tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_kernel_options.py \
      -k "alibi or decode or kvcache or dropout"
    finish
    ;;
  s34e)
    # (Thirty-fourth session; branch exp/s34, carrying build/old_src = main's src/flashtile.) ALiBi and
    # dropout forward and backward, causal and not, against main's code alternating twice, then every peer
    # on this commit's code for the README's options table.
    begin
    bench_old_new_args opts 80 --options alibi dropout --causal both --mode fwd bwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    step bench_peers 220 python3 -m flashtile bench --options alibi dropout --causal both --mode fwd bwd \
      --out-dir "$work/bench"
    mkdir -p "$OUT/peers" && cp "$work"/bench/*.csv "$OUT"/peers/ 2>/dev/null
    finish
    ;;
  s34f)
    # (Thirty-fourth session.) The whole paper grid, every peer (not run whole since the thirty-second).
    begin
    step bench_paper 540 python3 -m flashtile bench --paper --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s34g)
    # (Thirty-fourth session; branch exp/persistent-options.) Softcap, ALiBi and dropout on the forward's
    # persistent grid (fwd.runs_persistent): the persistent grid's tests with and without options, the
    # forward's option tests, then memcheck over the new group and the option groups, each case twice.
    begin
    gpu_tests_step 230 tests/test_gpu_hopper.py -k "persistent_grid or options or taking_turns or rows_outside \
      or three_stage or dropout or softcap or alibi"
    memcheck_group hopper_persistent_options,hopper_options,hopper_dropout 200 120 --repeat 2
    finish
    ;;
  s34h)
    # (Thirty-fourth session; branch exp/persistent-options, carrying build/old_src = main's src/flashtile.)
    # The options' forward at D = 64 and 128, N = 1k-4k, causal and not, against main's code (one program a
    # work tile with an option), alternating twice.
    begin
    bench_old_new_args popts 110 --options softcap alibi dropout --seqlen 1024 2048 4096 --head-dim 64 128 \
      --causal both --mode fwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s34i)
    # (Thirty-fourth session; branch exp/persistent-options after s34g/s34h, carrying build/old_src = main's
    # src/flashtile.) The rule as landed (an option at D = 64 takes the key bound; no dropout at D = 256 on
    # this grid): the persistent grid's GPU tests, memcheck over its option group, then the options' short
    # cells (N = 512, 1k) against main's code.
    begin
    gpu_tests_step 130 tests/test_gpu_hopper.py -k "persistent_grid"
    memcheck_group hopper_persistent_options 100 80 --repeat 2
    bench_old_new_args pshort 60 --options softcap alibi dropout --seqlen 512 1024 --head-dim 64 128 \
      --causal both --mode fwd --peers flashtile
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s35a)
    # (Prepared in the thirty-fourth session; branch exp/three-skip, carrying build/old_src = main's
    # src/flashtile.) Three consumers under causal: a lower warpgroup releases the key tiles past its rows'
    # last key without computing them (fwd._attn_fwd_tile's OWN_TILES). The three-consumer and persistent
    # GPU tests, memcheck over the paired and three-consumer groups, then the D = 64 causal forward with
    # three consumers forced against main's code, and two against three consumers on this code (the rule
    # takes three for causal from 8k only: THREE_CONSUMERS_MIN_ROWS_CAUSAL).
    begin
    gpu_tests_step 170 tests/test_gpu_hopper.py -k "three_consumer or persistent_grid"
    memcheck_group hopper_three,hopper_paired 150 100 --repeat 2
    FLASHTILE_HOPPER_FWD_CONSUMERS=3 bench_old_new_args skip3 50 --head-dim 64 --causal true --mode fwd \
      --seqlen 1024 2048 4096 8192 --peers flashtile sdpa-cudnn
    bench_knob_values FLASHTILE_HOPPER_FWD_CONSUMERS "2 3" consumers 50 --head-dim 64 --causal true \
      --mode fwd --seqlen 1024 2048 4096 8192 16384 --peers flashtile sdpa-cudnn
    cp "$work"/bench_old/*.csv "$OUT"/ 2>/dev/null
    mkdir -p "$OUT/new" && cp "$work"/bench_new/*.csv "$OUT"/new/ 2>/dev/null
    finish
    ;;
  s35b)
    # (Prepared in the thirty-fourth session, main.) What the persistent options and the prepared ALiBi and
    # dropout calls have not had on a GPU: memcheck over the option groups (s34g's stopped before them), the
    # prepared calls' GPU bits test (two new cases), then the whole bench --options with every peer for the
    # README's table (not run since the options took the persistent grid).
    begin
    memcheck_group hopper_options,hopper_dropout,hopper_persistent_options 160 100 --repeat 2
    gpu_tests_step 90 tests/test_prepared_calls.py
    step bench_options 300 python3 -m flashtile bench --options --causal both --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$work"/bench/*.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s35c)
    # (Thirty-fifth session; branch exp/hopper-sink, carrying build/old_src = main's src/flashtile.) A
    # learnable sink folded into the Gluon forward's epilogue (HAS_SINK): the sink tests on the Hopper
    # forward and the forward tests its new pointer touches, memcheck over the new hopper_sink group, the
    # sink's forward against main's code (the portable kernels) alternating twice, then every peer.
    begin
    gpu_tests_step 220 tests/test_sinks.py tests/test_prepared_calls.py tests/test_gpu_hopper.py -k \
      "sink or prepared or gluon_fwd_matches_oracle or fully_masked or persistent_grid or three_consumer or fast_path or varlen_fwd_matches"
    memcheck_group hopper_sink 120 100
    bench_old_new_args sink 50 --options sink --causal both --mode fwd --peers flashtile
    step bench_sink 120 python3 -m flashtile bench --options sink --causal both --no-plot --out-dir "$work/bench"
    options_csvs_out
    finish
    ;;
  s35d)
    # (Thirty-fifth session; branch exp/hopper-sink-bwd, carrying build/old_src = main's src/flashtile.)
    # The sink's gradient in the Gluon backward (HAS_SINK: Σ P·dP a key row, atomically added once a
    # head): the sink tests on the Hopper kernels, the backward GPU tests the new pointers touch, memcheck
    # over hopper_sink, then the sink's backward at D = 64 against main's code (the portable backward)
    # alternating twice, and every peer.
    begin
    gpu_tests_step 250 tests/test_sinks.py tests/test_prepared_calls.py tests/test_gpu_hopper_bwd.py -k \
      "sink or prepared or varlen or dropout or options_match or unsupported"
    memcheck_group hopper_sink 100 100
    bench_old_new_args sinkbwd 50 --options sink --head-dim 64 --causal both --mode bwd --peers flashtile
    step bench_sink 120 python3 -m flashtile bench --options sink --head-dim 64 --causal both --no-plot \
      --out-dir "$work/bench"
    options_csvs_out
    finish
    ;;
  s35e)
    # (Thirty-fifth session; branch exp/hopper-sink-bwd.) s35d's two failing packed cases: the sink's
    # weights past a sequence's last query (other rows' statistics or memory never written) now masked.
    begin
    gpu_tests_step 200 tests/test_sinks.py -k "hopper_kernels"
    finish
    ;;
  s36a)
    # (Prepared in the thirty-fifth session, main.) What the sink's Gluon kernels have not had on a GPU: a
    # block mask with a sink (the forward in Gluon; the backward portable until this passes, then drop the
    # decline in hopper/bwd.py's bwd_unsupported_reason and run it again), the sink through the API and
    # transformers; then the paper grid's D = 64 forward (three consumers from 4k causal since the
    # thirty-fifth session) with every peer.
    begin
    gpu_tests_step 200 tests/test_gpu_hopper_block_sparse.py tests/test_sinks.py tests/test_gpu_api.py \
      tests/test_gpu_transformers.py -k "sink or transformers"
    step bench_fwd_d64 200 python3 -m flashtile bench --paper --head-dim 64 --mode fwd --out-dir "$work/bench"
    cp "$work"/bench/bench.csv "$OUT"/bench_fwd_d64.csv 2>/dev/null
    finish
    ;;
  s36b)
    # (Thirty-sixth session; branch exp/sink-residual, carrying build/old_src = main's src/flashtile.) The
    # sink's gradient from the forward's rounding residual: the Gluon forward stores R = fp32 O − O, the
    # Gluon backward's preprocess forms Δ = dO·(O + R) and each row's −P_sink·Δ (every head dim, option,
    # deterministic); the fused kernel lost its sink terms and the prepared plain calls' pointer lists
    # changed. GPU tests and memcheck over hopper_sink (s36c: the speed).
    begin
    gpu_tests_step 300 tests/test_sinks.py tests/test_prepared_calls.py tests/test_gpu_hopper_block_sparse.py \
      tests/test_gpu_hopper_bwd.py tests/test_gpu_api.py tests/test_gpu_hopper.py -k \
      "sink or prepared or deterministic or unsupported or persistent_grid"
    memcheck_group hopper_sink 100 100
    finish
    ;;
  s36c)
    # (Thirty-sixth session; branch exp/sink-residual, carrying build/old_src = main's src/flashtile.) The
    # sink's forward (now storing O's rounding) and backward (Gluon at every head dim) at D = 64 and 128
    # causal against main's code alternating twice (each run times the plain kernel beside the sink).
    begin
    bench_old_new_args sink 60 --options sink --head-dim 64 128 --causal true --mode fwd bwd \
      --peers flashtile --no-plot
    options_csvs_out
    finish
    ;;
  s36d)
    # (Thirty-sixth session, main.) The two Gluon test files whole (last whole in the thirty-first and
    # thirty-second sessions; sessions 33-35 ran the parts their changes touched), and deterministic=True
    # with a learnable sink through the API.
    begin
    gpu_tests_step 530 tests/test_gpu_hopper.py tests/test_gpu_hopper_bwd.py tests/test_sinks.py -k \
      "not test_sinks or deterministic"
    finish
    ;;
  s36e)
    # (Thirty-sixth session, main.) The paper grid's backward, every head dim, every peer.
    begin
    paper_mode_step bench_bwd 330 bwd
    finish
    ;;
  s36f)
    # (Thirty-sixth session; branch exp/prepared-sink.) Calls with a learnable sink prepared like plain
    # calls (the forward at every head dim, the Gluon backward's sink launch at D = 64): their bits against
    # the general path's.
    begin
    gpu_tests_step 100 tests/test_prepared_calls.py
    finish
    ;;
  s37b)
    # (Thirty-seventh session; branch d256-causal-one, carrying build/old_src = main's src/flashtile.) The
    # causal "dim" split (D = 192, 256) as one 8-warp consumer partition, the non-causal one kept as two
    # (s37a: the joined partition 6-9 % faster causal, 1-4 % slower without a mask): the D = 256 and 192
    # backward GPU tests, the prepared calls (s36f), memcheck and racecheck over hopper_d256, then the
    # D = 256 backward against main's code, with cuDNN.
    begin
    gpu_tests_step 200 tests/test_gpu_hopper_bwd.py tests/test_head_dims.py tests/test_prepared_calls.py \
      -k "256 or 192 or prepared"
    memcheck_group hopper_d256 100 100
    step racecheck 100 compute-sanitizer --tool racecheck --error-exitcode 1 \
      python3 scripts/sanitize_kernels.py --only hopper_d256
    bench_old_new_args d256 80 --head-dim 256 --causal both --mode bwd --seqlen 512 1024 4096 16384 \
      --peers flashtile sdpa-cudnn --no-plot
    old_new_csvs_out
    finish
    ;;
  s37c)
    # (Thirty-seventh session, main.) The paper grid's backward, every head dim, every peer.
    begin
    paper_mode_step bench_bwd 540 bwd
    finish
    ;;
  s37e)
    # (Thirty-seventh session, main.) The paper grid's forward + backward, every head dim, every peer,
    # after the causal D = 256 backward's joined partition.
    begin
    paper_mode_step bench_fwd_bwd 300 fwd_bwd
    finish
    ;;
  s38a)
    # (Thirty-eighth session; main after the fold.) dPᵀ's and Sᵀ's accumulators started at −Δ and
    # −LSE / scale in the keys backward: the Gluon backward's GPU tests (options, varlen, block masks,
    # sinks), memcheck over the hopper, hopper_options and hopper_sparse groups.
    begin
    gpu_tests_step 260 tests/test_gpu_hopper_bwd.py tests/test_gpu_hopper_block_sparse.py tests/test_sinks.py \
      -k "not 256 and not 192"
    memcheck_group hopper 60 110
    memcheck_group hopper_options 40 80
    memcheck_group hopper_sparse 30 60
    finish
    ;;
  s38b)
    # (Thirty-eighth session; carrying build/old_src = the code before the fold.) The D = 64 and 128
    # backward and softcap, ALiBi and varlen at D = 128 against the code before, alternating twice; then
    # the D = 64 causal backward's variants m64 and m128 (the fourteenth session found m128 4-8 % slower).
    begin
    bench_old_new_args bwd 70 --head-dim 64 128 --causal both --mode bwd --seqlen 1024 4096 16384 \
      --peers flashtile sdpa-cudnn --no-plot
    bench_old_new_args opts 60 --options softcap alibi varlen --head-dim 128 --causal both --mode bwd \
      --peers flashtile --no-plot
    old_new_csvs_out
    options_csvs_out
    bench_knob_values FLASHTILE_HOPPER_BWD_VARIANT "m64 m128" d64_variant 40 --head-dim 64 --causal true \
      --mode bwd --seqlen 1024 4096 16384 --peers flashtile
    finish
    ;;
  s38d)
    # (Thirty-eighth session; main with the fold, D = 64 causal calls on "m128".) The prepared calls' GPU
    # tests and the D = 64 backward's, memcheck over the hopper group (its D = 64 causal backward now
    # "m128"), then the paper grid's backward at D = 64 and 128, every peer.
    begin
    gpu_tests_step 110 tests/test_prepared_calls.py tests/test_gpu_hopper_bwd.py -k "prepared or (d64 and causal)"
    memcheck_group hopper 50 90
    paper_mode_step bench_bwd 300 bwd --head-dim 64 128
    cp "$work"/bench/bench_bwd_bf16.png "$OUT"/ 2>/dev/null
    finish
    ;;
  s38c)
    # (Thirty-eighth session, main.) The paper grid's forward + backward at D = 256, every peer: s37e's box
    # ran out before these cells.
    begin
    paper_mode_step bench_fwd_bwd_d256 420 fwd_bwd --head-dim 256
    finish
    ;;
  s38e)
    # (Thirty-eighth session, main after the fold.) The paper grid's forward + backward at D = 64 and 128,
    # every peer (s38c has D = 256).
    begin
    paper_mode_step bench_fwd_bwd 320 fwd_bwd --head-dim 64 128
    finish
    ;;
  s39a)
    # (Prepared in the thirty-eighth session; main.) A learnable sink in the Gluon backward at D = 96 and
    # 128 (FLASHTILE_HOPPER_BWD_SINK=1: its share from dS, the rest from the preprocess): the Hopper sink
    # GPU tests (the D = 128 ones set the knob themselves) and the prepared calls' (the preprocess took two
    # pointers more in that session, CPU-checked only), memcheck over hopper_sink under the knob, then
    # the sink backward at D = 128 with the knob against without (the portable backward), twice.
    begin
    gpu_tests_step 240 tests/test_sinks.py tests/test_prepared_calls.py -k "hopper or prepared"
    export FLASHTILE_HOPPER_BWD_SINK=1
    memcheck_group hopper_sink 60 120
    unset FLASHTILE_HOPPER_BWD_SINK
    bench_knob_values FLASHTILE_HOPPER_BWD_SINK "0 1" sink128 60 --options sink --head-dim 128 --causal both \
      --mode bwd --peers flashtile
    finish
    ;;
  s39b)
    # (Prepared in the thirty-eighth session; main.) The plain causal keys backward masking every query
    # block of a dense batch (not only those across the diagonal), with Δ and the LSE folded at D = 128
    # causal too: sm_90 key-loop spills m128 causal 16 -> 0, D = 128 causal 2 -> 0 (docs/design/
    # hopper_bwd.md, the lead at the end of "Δ and the LSE in the products' accumulators"). The experiment
    # is made here from this tree (build/exp_src, two lines of kernels/hopper/bwd.py), then its causal
    # backward GPU tests and the D = 64 / 128 causal backward against main, alternating twice.
    begin
    exp_bwd_step 2 \
      '0,/if IS_CAUSAL and m0 < n0 + BN - diag_offset:/s//if IS_CAUSAL and (not IS_VARLEN or m0 < n0 + BN - diag_offset):/' \
      's/PLAIN_CAUSAL: gl.constexpr = IS_CAUSAL and not (.*)$/PLAIN_CAUSAL: gl.constexpr = False/'
    gpu_tests_exp_step 200 tests/test_gpu_hopper_bwd.py -k "causal and (d64 or d128) and not options"
    bench_main_exp 60 --head-dim 64 128 --causal true --mode bwd --seqlen 1024 4096 16384 \
      --peers flashtile sdpa-cudnn --no-plot
    finish
    ;;
  s39c)
    # (Thirty-ninth session; main.) The D = 128 sink backward again after its two fixes (the key rows past
    # N_k out of the sink's share; the D = 96 test's forward from the portable kernel), memcheck over
    # hopper_sink under the knob, and its timing with the knob against without; the nan_in_other_batch
    # tests (one failed in s39b's experiment at m64-cols); then m128 against m64 at D = 64 for
    # deterministic=True (scripts/bwd_causal_gap.py kernel times) and for a packed batch (bench --options
    # varlen), alternating twice.
    begin
    gpu_tests_step 200 tests/test_sinks.py tests/test_gpu_hopper_bwd.py \
      -k "(sink and hopper) or nan_in_other_batch"
    export FLASHTILE_HOPPER_BWD_SINK=1
    memcheck_group hopper_sink 60 120
    unset FLASHTILE_HOPPER_BWD_SINK
    bench_knob_values FLASHTILE_HOPPER_BWD_SINK "0 1" sink128 60 --options sink --head-dim 128 --mode bwd \
      --peers flashtile
    for round in 1 2; do
      for variant in m64 m128; do
        step "det_${variant}_$round" 90 env FLASHTILE_HOPPER_BWD_VARIANT=$variant \
          python3 scripts/bwd_causal_gap.py --head-dims 64 --seqlens 1024 4096 16384 \
          --csv "$work/det_$variant.csv" --label "$variant"
      done
    done
    bench_knob_values FLASHTILE_HOPPER_BWD_VARIANT "m64 m128" varlen64 60 --options varlen --head-dim 64 \
      --mode bwd --peers flashtile
    finish
    ;;
  s39d)
    # (Thirty-ninth session; main.) The learnable sink at D = 96/128 in the Gluon backward by default and
    # deterministic=True on m128 at D = 64: the Hopper sink tests, the prepared calls' (sink-d128 now
    # prepared), the rewritten NaN-isolation tests and the 50-run bitwise tests; memcheck over hopper_sink;
    # scripts/bwd_error_margin.py (the NaN-isolation problem's error ratios, one head against all six);
    # then the D = 128 sink backward beside every peer.
    begin
    gpu_tests_step 240 tests/test_sinks.py tests/test_prepared_calls.py tests/test_gpu_hopper_bwd.py \
      -k "(sink and hopper) or prepared or nan_in_other_batch or bitwise_stable"
    memcheck_group hopper_sink 60 120
    step error_margin 90 python3 scripts/bwd_error_margin.py --seeds 20
    step sink128_peers 120 python3 -m flashtile bench --options sink --head-dim 128 --mode bwd --no-plot \
      --out-dir "$work/bench" --name sink128_peers
    cp "$work"/bench/sink128_peers.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s39e)
    # (Thirty-ninth session; main.) The D = 64 sink backward's share from dS too (SINK_SHARE_FROM_PDP_MAX_DIM
    # 64 -> 0 in build/exp_src: sm_90 key-loop spills m64 0 -> 0, m128 422 / 694 -> 34 / 33 without a mask /
    # causal), on m64 and under FLASHTILE_HOPPER_BWD_VARIANT=m128: the Hopper sink GPU tests on it both ways,
    # memcheck over hopper_sink on it, then bench --options sink --head-dim 64 --mode bwd on main, on it
    # and on it with m128, alternating twice.
    begin
    exp_bwd_step 1 's/^SINK_SHARE_FROM_PDP_MAX_DIM = gl.constexpr(64)$/SINK_SHARE_FROM_PDP_MAX_DIM = gl.constexpr(0)/'
    gpu_tests_exp_step 150 tests/test_sinks.py -k "hopper"
    step gpu_tests_exp_m128 120 env PYTHONPATH=build/exp_src FLASHTILE_HOPPER_BWD_VARIANT=m128 \
      "${pytest_gpu[@]}" --junitxml="$work/gpu_tests_exp_m128.xml" tests/test_sinks.py -k "hopper and d64"
    cp "$work/gpu_tests_exp_m128.xml" "$OUT"/ 2>/dev/null
    PYTHONPATH=build/exp_src memcheck_group hopper_sink 60 120
    sink64_args=(--options sink --head-dim 64 --mode bwd --peers flashtile --no-plot --out-dir "$work/bench")
    for round in 1 2; do
      step "sink64_main_$round" 60 python3 -m flashtile bench "${sink64_args[@]}" --name sink64_main
      step "sink64_exp_$round" 60 env PYTHONPATH=build/exp_src python3 -m flashtile bench "${sink64_args[@]}" \
        --name sink64_exp
      step "sink64_exp_m128_$round" 60 env PYTHONPATH=build/exp_src FLASHTILE_HOPPER_BWD_VARIANT=m128 \
        python3 -m flashtile bench "${sink64_args[@]}" --name sink64_exp_m128
    done
    cp "$work"/bench/sink64_*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s39f)
    # (Thirty-ninth session; main.) s39e's experiment landed (every sink's share from dS; a D = 64 sink
    # call on m128 when otherwise plain): the D = 64 Hopper sink tests and the prepared sink calls', then
    # memcheck over hopper_sink.
    begin
    gpu_tests_step 80 tests/test_sinks.py tests/test_prepared_calls.py -k "(hopper and d64) or (prepared and sink)"
    memcheck_group hopper_sink 50 60
    finish
    ;;
  s40a)
    # (Fortieth session; main.) What s39f was to run (the landed D = 64 sink share from dS on m128),
    # inside every GPU sink test and the whole Hopper backward file, under the tests' new gradient
    # yardstick (the stored-output floor); then memcheck over hopper_sink, its D = 64 cases on m128.
    begin
    gpu_tests_step 420 tests/test_sinks.py tests/test_prepared_calls.py tests/test_gpu_hopper_bwd.py
    memcheck_group hopper_sink 50 60
    finish
    ;;
  s40b)
    # (Fortieth session; main.) The Hopper forward's, the API's and the options' GPU files, which have
    # not run whole since the thirty-second session.
    begin
    gpu_tests_step 540 tests/test_gpu_hopper.py tests/test_gpu_api.py tests/test_kernel_options.py \
      tests/test_interface.py
    finish
    ;;
  s41a)
    # (Forty-first session; main.) The portable kernels', block masks', hardening, launch cache's and FP8's
    # GPU files, none run whole since the nineteenth to thirty-second sessions, and the two
    # test_kernel_options cases s40b's time box did not reach.
    begin
    gpu_tests_step 520 tests/test_kernels.py tests/test_block_sparse.py tests/test_gpu_hardening.py \
      tests/test_launch_cache.py tests/test_fp8.py \
      "tests/test_kernel_options.py::test_varlen_of_equal_lengths_equals_the_dense_batch_bitwise_with_dropout" \
      "tests/test_kernel_options.py::test_bad_cu_seqlens_stay_inside_the_packed_tensors"
    finish
    ;;
  s41b)
    # (Forty-first session; kind nvidia-h200-x2.) The hardening test that needs two GPUs (s41a skipped it)
    # and ring / Ulysses context parallelism against one GPU at 8k (last run in the thirty-second session).
    begin
    gpu_tests_step 100 "tests/test_gpu_hardening.py::test_tensors_on_a_gpu_other_than_the_current_one"
    step context_parallel 150 python3 -m torch.distributed.run --nproc-per-node 2 \
      scripts/context_parallel_check.py --seqlens 8192 --csv "$OUT/context_parallel.csv"
    finish
    ;;
  s41c)
    # (Prepared in the forty-first session.) How close the GPU suite's accuracy checks come to failing:
    # scripts/accuracy_margins.py over two base seeds of the Hopper backward's file (its NaN-isolation
    # test failed at 3.3-3.5x in s39b/s39c, before the stored-output floor), then one of the sinks' file.
    begin
    # pytest_gpu's options without its "python3 -m pytest": the script runs pytest itself.
    step margins_hopper_bwd 400 python3 scripts/accuracy_margins.py --seeds 11 22 --top 40 -- \
      "${pytest_gpu[@]:3}" tests/test_gpu_hopper_bwd.py
    step margins_sinks 140 python3 scripts/accuracy_margins.py --seeds 33 --top 40 -- \
      "${pytest_gpu[@]:3}" tests/test_sinks.py
    cp "$work"/margins_*.log "$OUT"/ 2>/dev/null
    finish
    ;;
  s41d)
    # (Prepared in the forty-first session.) The GPU files not run whole on main's current kernels: head
    # dims, transformers, block masks in the Gluon kernels, the KV cache and decode kernels, and the
    # benchmark smoke tests (last run in the tenth to thirty-sixth sessions, most with -k filters).
    begin
    gpu_tests_step 540 tests/test_head_dims.py tests/test_gpu_transformers.py \
      tests/test_gpu_hopper_block_sparse.py tests/test_gpu_kvcache.py tests/test_decode_kernel.py \
      tests/test_cli_bench.py tests/test_bench_masks.py
    finish
    ;;
  s41e | s42b)
    # (Prepared in the forty-first session.) Where the host time of the paper grid's host-bound cells goes
    # on current main: the bench recorded 509 us of host time a call for flashtile's D = 64 causal backward
    # at 512 (cuDNN 257) and 560 us for the D = 256 causal forward + backward (cuDNN 469; 5158a52, 1730143),
    # where the CPU machine's host_path.py reads 59 / 101 us. scripts/host_profile_dense.py, bwd profiled.
    # s42b (forty-second session) ran it at 5d0471e, whose script profiled a prepared graph's backward and
    # timed the first call's graph beside it: s41e's kept graph had been its signature's first call, whose
    # backward then took the general path (a first call takes its prepared launches since the same session).
    begin
    host_profile_512_step 32 64
    host_profile_512_step 8 256
    cp "$work"/host_*.log "$OUT"/ 2>/dev/null
    finish
    ;;
  s42a)
    # (Forty-second session.) The options preset's GPU smoke test with its count mended (nine cells a mode
    # and the forward-only fp8 cell: 19 rows of flashtile's; s41d's run found 19 against the 18 it expected).
    begin
    gpu_tests_step 200 tests/test_cli_bench.py -k options_preset_on_the_gpu
    finish
    ;;
  s42c)
    # (Forty-second session.) The paper grid's backward at 512 and 1k after the bench's fix: a bwd-only run's
    # copy-0 graph had been its signature's first call, whose backward takes the general path (half the timed
    # calls). Flex is left out: at these cells its backward is 1.4x cuDNN's time, never the best peer.
    begin
    step bench_bwd_short 300 python3 -m flashtile bench --paper --mode bwd --seqlen 512 1k --head-dim 64 128 256 \
      --causal both --peers flashtile sdpa-cudnn sdpa-flash --no-plot --out-dir "$work/bench" --name bwd_short
    cp "$work"/bench/bwd_short.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s42d)
    # (Forty-second session.) The paper grid's forward + backward at D = 256, whole (s38c had it at 0.87 /
    # 0.88x in the causal 512 / 1k cells, host-bound; host_profile_dense's s42b read 0.570 against cuDNN's
    # 0.584 ms at 512). Flex is left out (2.3x cuDNN's time at 512 in s38c) to fit the session's budget.
    begin
    step bench_fwd_bwd_d256 150 python3 -m flashtile bench --paper --mode fwd_bwd --head-dim 256 --causal both \
      --peers flashtile sdpa-cudnn sdpa-flash --time-budget 120 --no-plot --out-dir "$work/bench" \
      --name fwd_bwd_d256
    cp "$work"/bench/fwd_bwd_d256.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s42e)
    # (Forty-second session.) A signature's first call takes its prepared launches: the prepared calls' GPU
    # test (the general path forced as the yardstick, the first call prepared), and s42b's host profile,
    # whose "flashtile bwd" rows now time a first call's graph.
    begin
    gpu_tests_step 200 tests/test_prepared_calls.py
    host_profile_512_step 32 64
    cp "$work"/host_*.log "$OUT"/ 2>/dev/null
    finish
    ;;
  s43a)
    # (Forty-third session; branch exp/d256-two-stage, carrying build/old_src = main's src/flashtile.) The
    # causal "dim" split at D = 256 with two Q/dO stages, dQ staged in the block's own slots: the D = 256
    # causal backward against main's code, with cuDNN, then the D = 256 and 192 backward GPU tests.
    begin
    bench_d256_causal_old_new
    gpu_tests_step 240 tests/test_gpu_hopper_bwd.py tests/test_head_dims.py tests/test_prepared_calls.py \
      -k "256 or 192 or prepared"
    finish
    ;;
  s43b)
    # (Forty-third session; branch exp/d256-two-stage, build/old_src = main's src/flashtile.) s43a's two
    # stages read 4-7 % slower; here a block's slot goes back to the producer in the next block after its
    # dV, dK and dQ products are issued (s43a: after its Sᵀ and dPᵀ, where the reduce's read may not be done).
    begin
    bench_d256_causal_old_new
    finish
    ;;
  s43c)
    # (Forty-third session, main.) The paper grid's backward and forward, whole, with cuDNN and SDPA flash:
    # every backward cell from 2k on was last timed before the bench's first-call fix (fa9fdd5). Flex is
    # left out: it was never the best peer of a paper cell on the H200 (benchmarks/results/bench.csv).
    begin
    step bench_bwd 300 python3 -m flashtile bench --paper --mode bwd --peers flashtile sdpa-cudnn sdpa-flash \
      --no-plot --out-dir "$work/bench" --name bwd
    step bench_fwd 240 python3 -m flashtile bench --paper --mode fwd --peers flashtile sdpa-cudnn sdpa-flash \
      --no-plot --out-dir "$work/bench" --name fwd
    cp "$work"/bench/bwd.csv "$work"/bench/fwd.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s43d)
    # (Forty-third session, main.) The D = 64 causal forward below cuDNN at 512-4k (0.91-0.98x, kernel
    # time): the tiling knobs again on today's kernel (three consumers, a 3-deep ring, 64-key tiles), each
    # beside cuDNN in CUDA graphs; s26b / s25a measured them before tile 0's unmasking, the one-compare mask
    # and the division-free work tiles.
    begin
    step d64_causal_knobs 300 python3 scripts/hopper_persistent_check.py --head-dims 64 --seqlens 512 1024 \
      2048 4096 --causal-only --only-grid --block-n 64 --consumers --stages 3 --csv "$OUT/d64_causal_knobs.csv"
    finish
    ;;
  s43e)
    # (Forty-third session, main.) s43d: at D = 64 causal a 3-deep K/V ring with two consumers read 1.7-4 %
    # faster than the default from 1k to 4k (and 5 % faster than the three consumers the 4k cell takes):
    # the same knobs over the whole D = 64 grid, both masks, 512-16k.
    begin
    step d64_knobs 420 python3 scripts/hopper_persistent_check.py --head-dims 64 --seqlens 512 1024 2048 \
      4096 8192 16384 --only-grid --consumers --stages 3 --csv "$OUT/d64_knobs.csv"
    finish
    ;;
  s43f)
    # (Forty-third session, main, carrying build/old_src = 11b6ef0's src/flashtile.) Plain D = 64 forward
    # calls take a 3-deep K/V ring, and three consumers from 8k causal (4k before): the forward's GPU tests
    # at D = 64 and the prepared calls, then the D = 64 forward against the code before, with cuDNN.
    begin
    gpu_tests_step 240 tests/test_gpu_hopper.py tests/test_prepared_calls.py -k "64 or prepared"
    bench_old_new_args d64fwd 70 --head-dim 64 --causal both --mode fwd --peers flashtile sdpa-cudnn --no-plot
    old_new_csvs_out
    finish
    ;;
  s43g)
    # (Forty-third session, main.) After the 3-deep ring of plain D = 64 forwards: memcheck over the
    # persistent, three-consumer and paired-causal groups, then the paper grid's D = 64 forward and forward +
    # backward rows, whole, with cuDNN and SDPA flash (Flex left out: never the best peer of a paper cell).
    begin
    memcheck_group hopper_persistent,hopper_three,hopper_paired 120 180
    paper_mode_step fwd_d64 60 fwd --head-dim 64 --peers flashtile sdpa-cudnn sdpa-flash --no-plot
    paper_mode_step fwd_bwd_d64 100 fwd_bwd --head-dim 64 --peers flashtile sdpa-cudnn sdpa-flash --no-plot
    finish
    ;;
  s43h)
    # (Forty-third session, main.) A 3-deep K/V ring at D = 128 (one program a work tile: with the
    # persistent grid's output buffer it does not fit; sm_90 compile: 229,728 B), 2k-16k, both masks, in CUDA
    # graphs beside the default and cuDNN.
    begin
    step d128_stages 300 python3 scripts/hopper_persistent_check.py --head-dims 128 --seqlens 2048 4096 8192 \
      16384 --only-grid --stages 3 --csv "$OUT/d128_stages.csv"
    finish
    ;;
  s43i)
    # (Forty-third session, main.) The backward's GPU file whole and the API's D = 64 cases after the 3-deep
    # ring of plain D = 64 forwards (the backward tests run that forward first).
    begin
    gpu_tests_step 330 tests/test_gpu_hopper_bwd.py tests/test_gpu_api.py -k "not test_gpu_api or 64"
    finish
    ;;
  s44a)
    # (Prepared in the forty-third session; main.) The Hopper forward's GPU file whole after the 3-deep K/V
    # ring of plain D = 64 calls (s43f ran its D = 64 cases only).
    begin
    gpu_tests_step 540 tests/test_gpu_hopper.py
    finish
    ;;
  s44b)
    # (Prepared in the forty-third session; main.) The API's, the options' and the interface's GPU files
    # whole (s40b's other three; s43i ran test_gpu_api's D = 64 cases only).
    begin
    gpu_tests_step 540 tests/test_gpu_api.py tests/test_kernel_options.py tests/test_interface.py
    finish
    ;;
  s44c)
    # (Forty-fourth session; main.) s44a's three failures were the spies missing the prepared first call
    # (the tests now force the general path): those tests again. Then whether autograd's device thread runs
    # the backward's Python slower because it wakes on another core: s42e's host profile (D = 64 causal,
    # N = 512) unpinned, on one CPU and on two. Then bench --options, every option and peer (issue 8's
    # table; last run whole at 670a792, s35b).
    begin
    gpu_tests_step 120 tests/test_gpu_hopper.py -k "auto_dispatch_on_the_gpu or options_through_the_api"
    host_profile_512_step 32 64
    step host_d64_causal_512_cpu1 150 python3 scripts/host_profile_dense.py --batch 32 --seqlen 512 \
      --heads 32 --head-dim 64 --causal --cpus 3
    step host_d64_causal_512_cpu2 150 python3 scripts/host_profile_dense.py --batch 32 --seqlen 512 \
      --heads 32 --head-dim 64 --causal --cpus 3 4
    cp "$work"/host_*.log "$OUT"/ 2>/dev/null
    step bench_options 300 python3 -m flashtile bench --options --causal both --out-dir "$work/bench"
    cp "$work"/bench/*.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s44d)
    # (Forty-fourth session; main.) Whether the dropout forward waits on its consumers' own instruction
    # streams or on the SM's issue slots: Nsight Compute on the dropout forward (D = 128, N = 4k, bench
    # --options' cell) and the plain one of the same cell (s29d's: issue slots 36 % busy), scheduler and
    # warp-state statistics and the stalls by opcode. Idle slots would leave room to draw the mask in the
    # producer warpgroup.
    begin
    ncu_fwd_options 120 dropout plain
    finish
    ;;
  s45b)
    # (Prepared in the forty-fourth session; main.) The options preset's packed batch with its new yardstick
    # (each document alone, a dense batch of one), twice; then the paper grid's N = 512 cells, all three
    # modes, twice (host-bound: they moved by up to 15 % between whole-grid runs).
    begin
    for round in 1 2; do
      step "bench_varlen_$round" 150 python3 -m flashtile bench --options varlen --no-plot \
        --out-dir "$work/bench_varlen"
    done
    cp "$work"/bench_varlen/bench_options.csv "$OUT"/varlen_options.csv 2>/dev/null
    for round in 1 2; do
      step "paper_512_$round" 150 python3 -m flashtile bench --paper --seqlen 512 --head-dim 64 128 256 \
        --causal both --peers flashtile sdpa-cudnn sdpa-flash --no-plot --out-dir "$work/bench" --name paper_512
    done
    cp "$work"/bench/paper_512.csv "$OUT"/ 2>/dev/null
    finish
    ;;
  s45d)
    # (Forty-fifth session.) The GPU files whose plain calls changed path since they last ran whole (the
    # prepared first call, forty-second session; the 3-deep ring at D = 64, forty-third): head dims,
    # transformers, the direct launches, sinks.
    begin
    gpu_tests_step 560 tests/test_head_dims.py tests/test_gpu_transformers.py tests/test_launch_cache.py \
      tests/test_sinks.py
    finish
    ;;
  s45e)
    # (Forty-fifth session.) Racecheck over the plain D = 64 calls since the 3-deep K/V ring (forty-third
    # session; memcheck ran then, racecheck did not): the persistent and paired groups, whose D = 64 plain
    # cases take the ring. The known report is the warp-specialize hand-off (docs/design/hopper.md).
    begin
    for group in hopper_persistent hopper_paired; do
      step "racecheck_$group" 270 compute-sanitizer --tool racecheck --error-exitcode 1 \
        python3 scripts/sanitize_kernels.py --only "$group"
    done
    finish
    ;;
  s45f)
    # (Forty-fifth session.) The rest of the GPU files a plain call reaches, not run whole since the first
    # call was prepared and the 3-deep ring landed: the hardening edges, the bench's smoke tests, float8.
    begin
    gpu_tests_step 500 tests/test_gpu_hardening.py tests/test_cli_bench.py tests/test_fp8.py
    finish
    ;;
  s45g)
    # (Forty-fifth session.) s45f's failure mended: the options preset's GPU test, whose dense rows now
    # include the packed batch's documents alone (7b2f228).
    begin
    gpu_tests_step 250 tests/test_cli_bench.py -k options_preset_on_the_gpu
    finish
    ;;
  s46a)
    # (Forty-sixth session, branch exp/bwd-persistent.) The plain non-causal backward of the "keys" split on
    # a persistent grid (FLASHTILE_HOPPER_BWD_PERSISTENT=1): its GPU tests and two non-causal cases beside
    # them, then bench --mode bwd at D = 64 and 128, knob 0 and 1 alternating twice, with cuDNN.
    begin
    gpu_tests_step 150 tests/test_gpu_hopper_bwd.py -k "persistent or mqa-1025x1023 or gqa-77-d64"
    bench_knob_values FLASHTILE_HOPPER_BWD_PERSISTENT "0 1" bwd_persistent 120 --head-dim 64 128 \
      --causal false --mode bwd --seqlen 1024 2048 4096 8192 16384 --peers flashtile sdpa-cudnn
    finish
    ;;
  s46b)
    # (Forty-sixth session, branch exp/bwd-persistent.) s46a's A/B again after the block loop's ring entry
    # and phase became functions of its index (D = 128's query-block loops: 12 -> 7 local accesses).
    begin
    bench_knob_values FLASHTILE_HOPPER_BWD_PERSISTENT "0 1" bwd_persistent 120 --head-dim 64 128 \
      --causal false --mode bwd --seqlen 1024 2048 4096 8192 16384 --peers flashtile sdpa-cudnn
    finish
    ;;
  s46c)
    # (Forty-sixth session.) Plain non-causal D = 64 backwards on the persistent grid by default: the
    # backward's GPU file whole, the prepared calls' and the API's D = 64 cases, then memcheck over the
    # persistent group (its D = 64 backward cases now run the persistent grid, one with more key blocks
    # than SMs).
    begin
    gpu_tests_step 380 tests/test_gpu_hopper_bwd.py tests/test_prepared_calls.py tests/test_gpu_api.py \
      -k "not test_gpu_api or 64"
    memcheck_group hopper_persistent 100 120
    finish
    ;;
  s46d)
    # (Forty-sixth session.) The paper grid's non-causal D = 64 backward and forward + backward rows with the
    # persistent backward (cuDNN and SDPA flash), twice.
    begin
    for round in 1 2; do
      paper_mode_step "bwd_d64_$round" 100 bwd --head-dim 64 --causal false \
        --peers flashtile sdpa-cudnn sdpa-flash --no-plot
      paper_mode_step "fwd_bwd_d64_$round" 120 fwd_bwd --head-dim 64 --causal false \
        --peers flashtile sdpa-cudnn sdpa-flash --no-plot
    done
    finish
    ;;
  s46e)
    # (Forty-sixth session.) The GPU files last run whole in the forty-first session (s41d), which no
    # change since has touched: block masks in the Gluon kernels, the KV cache, the decode kernels, the
    # masks bench.
    begin
    gpu_tests_step 500 tests/test_gpu_hopper_block_sparse.py tests/test_gpu_kvcache.py \
      tests/test_decode_kernel.py tests/test_bench_masks.py
    finish
    ;;
  s46f)
    # (Forty-sixth session, main.) After plain non-causal D = 64 backwards moved to the persistent grid:
    # racecheck over the persistent group (memcheck ran in s46c), then the GPU files beside s46c's that
    # reach such a backward (head dims, transformers).
    begin
    step racecheck_hopper_persistent 200 compute-sanitizer --tool racecheck --error-exitcode 1 \
      python3 scripts/sanitize_kernels.py --only hopper_persistent
    gpu_tests_step 250 tests/test_head_dims.py tests/test_gpu_transformers.py
    finish
    ;;
  s46g)
    # (Forty-sixth session, main.) The rest of the GPU files that run the Hopper backward of plain calls,
    # after plain non-causal D = 64 backwards moved to the persistent grid: sinks (their plain yardsticks),
    # the hardening edges, the bench's smoke tests.
    begin
    gpu_tests_step 400 tests/test_sinks.py tests/test_gpu_hardening.py tests/test_cli_bench.py
    finish
    ;;
  s47a)
    # (Forty-seventh session, main.) The D = 64 plain forward with one exponential in 8 of its unmasked
    # tiles on the FMA pipes (FLASHTILE_HOPPER_FWD_EXP2_POLY=8) against none (its default), alternating
    # twice, with cuDNN: its MUFU and tensor cycles a tile are about equal (1056 / 1024), and one in 8 was
    # compiled (928 / 950 / 1024) but never timed.
    begin
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 8" fwd_poly 120 --head-dim 64 --causal both \
      --mode fwd --seqlen 512 1024 2048 4096 16384 --peers flashtile sdpa-cudnn
    finish
    ;;
  s47b)
    # (Forty-seventh session, main.) s47a found one exponential in 8 on the FMA pipes 1.5-3 % faster where
    # the D = 64 forward runs two consumers (causal 2k / 4k, full 1k) and 5-7 % slower with three. Shares
    # 0, 4 and 8 alternating twice on the two-consumer cells (causal below 8k, full below 2k), then 0 and 8
    # on a sliding window (256, 0) at 8k (two consumers too).
    begin
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 4 8" poly_causal 120 --head-dim 64 --causal true \
      --mode fwd --seqlen 512 1024 2048 4096 --peers flashtile sdpa-cudnn
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 4 8" poly_full 120 --head-dim 64 --causal false \
      --mode fwd --seqlen 512 1024 --peers flashtile sdpa-cudnn
    bench_knob_values FLASHTILE_HOPPER_FWD_EXP2_POLY "0 8" poly_window 150 --options window --head-dim 64 \
      --mode fwd --peers flashtile
    finish
    ;;
  s47c)
    # (Forty-seventh session, main.) Plain D = 64 forwards with two consumers take one exponential in 8 on
    # the FMA pipes by default: the forward's GPU file whole, then the paper grid's D = 64 forward rows
    # twice (cuDNN and SDPA flash).
    begin
    gpu_tests_step 340 tests/test_gpu_hopper.py
    for round in 1 2; do
      paper_mode_step "fwd_d64_$round" 90 fwd --head-dim 64 --peers flashtile sdpa-cudnn sdpa-flash --no-plot
    done
    finish
    ;;
  s47d | s47e)
    # (Forty-seventh session, main.) The paper grid whole, every mode, with cuDNN and SDPA flash (Flex was
    # never the best peer of a paper cell on the H200), at one commit: its cells were last timed at
    # several (README, "The paper grid today"). s47d adds test_gpu_api.py whole (its head dims other than
    # 64 last ran before the forty-sixth session's persistent backward); s47e is the grid's second run.
    begin
    paper_grid_whole 200
    if [ "$part" = s47d ]; then
      gpu_tests_step 220 tests/test_gpu_api.py
    fi
    finish
    ;;
  s47f)
    # (Forty-seventh session, branch exp/dq-by-producer at ffd3c72.) The "keys" split's dQ reduces issued
    # by the producer warp (FLASHTILE_EXP_DQ_BY_PRODUCER=1 there, FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER since:
    # the consumers stage dQ and arrive on a barrier, the producer reduce-adds it one query block behind
    # its loads): bench --mode bwd at D = 64 and 128, knob 0 and 1 alternating twice, with cuDNN; then the
    # backward's GPU file (the "keys" split's cases) under it.
    begin
    bench_knob_values FLASHTILE_EXP_DQ_BY_PRODUCER "0 1" dq_producer 100 --head-dim 64 128 --causal both \
      --mode bwd --seqlen 1024 4096 16384 --peers flashtile sdpa-cudnn
    FLASHTILE_EXP_DQ_BY_PRODUCER=1 gpu_tests_step 200 tests/test_gpu_hopper_bwd.py -k "not 256 and not 192"
    finish
    ;;
  s47g)
    # (Forty-seventh session, main.) Plain calls' dQ reduces issued by the producer warp by default: the
    # prepared calls (the launches prepared.py makes, against the general path's bits) and the backward's
    # persistent-grid and GQA/MQA oracle cases, without the knob.
    begin
    gpu_tests_step 130 tests/test_prepared_calls.py tests/test_gpu_hopper_bwd.py \
      -k "prepared or persistent or mqa-1025x1023 or gqa-77-d64"
    finish
    ;;
  s48a)
    # (Forty-eighth session, main.) Plain calls' dQ reduces issued by the producer warp by default (the
    # forty-seventh session's s47g, refused then for lack of time): the prepared calls and the backward's
    # persistent-grid and GQA/MQA cases, then memcheck over the persistent group (plain D = 64/128 backwards,
    # which take the dq_staged / dq_free barriers).
    begin
    gpu_tests_step 130 tests/test_prepared_calls.py tests/test_gpu_hopper_bwd.py \
      -k "prepared or persistent or mqa-1025x1023 or gqa-77-d64"
    memcheck_group hopper_persistent 120 220
    finish
    ;;
  s48b)
    # (Forty-eighth session, main.) Racecheck over the persistent group (the producer's dQ reduces; the
    # known report is the warp-specialize hand-off), then the causal D = 256 joined partition with the
    # producer's dQ reduces (FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1; compiled in the forty-seventh session,
    # never run): the backward's D = 256 GPU cases under it, and bench --mode bwd knob 0 / 1 alternating.
    begin
    step racecheck_hopper_persistent 200 compute-sanitizer --tool racecheck --error-exitcode 1 \
      python3 scripts/sanitize_kernels.py --only hopper_persistent
    FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1 gpu_tests_step 150 tests/test_gpu_hopper_bwd.py -k 256
    bench_knob_values FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER "0 1" d256_producer 45 --head-dim 256 \
      --causal true --mode bwd --seqlen 2048 4096 8192 --peers flashtile sdpa-cudnn
    finish
    ;;
  s48c)
    # (Forty-eighth session, main.) The producer's dQ reduces by default in plain calls, now the causal
    # D = 256 joined partition's too: the backward's D = 192 / 256 GPU cases and the head dims' file, the
    # paper grid's backward and forward+backward (cuDNN, SDPA flash), then the options' backwards (window,
    # softcap, ALiBi, packed batch) with the producer's dQ reduces (knob 1) against without (0), alternating.
    begin
    gpu_tests_step 170 tests/test_gpu_hopper_bwd.py tests/test_head_dims.py -k "256 or 192"
    for mode in bwd fwd_bwd; do
      step "bench_$mode" 200 python3 -m flashtile bench --paper --mode "$mode" \
        --peers flashtile sdpa-cudnn sdpa-flash --no-plot --out-dir "$work/bench" --name "$mode"
      cp "$work/bench/$mode.csv" "$OUT"/ 2>/dev/null
    done
    bench_knob_values FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER "0 1" options_producer 60 \
      --options window softcap alibi varlen --mode bwd --peers flashtile
    finish
    ;;
  s48d)
    # (Forty-eighth session, main.) s48c found the producer's dQ reduces 1-5 % faster in windows, softcap,
    # ALiBi and packed batches; never run with dropout, block masks or sinks: their backwards' bench knob
    # 0 / 1 alternating (dropout and a sink at 4k / 16k), then the GPU files of the options, sinks and block
    # masks under FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1.
    begin
    bench_knob_values FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER "0 1" options_producer 50 \
      --options dropout sink --mode bwd --peers flashtile
    FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1 gpu_tests_step 300 tests/test_kernel_options.py tests/test_sinks.py \
      tests/test_block_sparse.py
    finish
    ;;
  s48e)
    # (Forty-eighth session, main.) Memcheck and racecheck over the option groups' backwards (windows,
    # softcap, ALiBi, packed batches, dropout, block masks, sinks) with the producer's dQ reduces
    # (FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1).
    export FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1
    begin
    memcheck_group hopper_options,hopper_dropout,hopper_sparse,hopper_sink 200 200
    step racecheck_options 120 compute-sanitizer --tool racecheck --error-exitcode 1 \
      python3 scripts/sanitize_kernels.py --only hopper_options,hopper_sink
    finish
    ;;
  s48f)
    # (Forty-eighth session, main.) The producer's dQ reduces by default in every call without dropout or
    # a block mask. The persistent grid at D = 128 (FLASHTILE_HOPPER_BWD_PERSISTENT=1) was 1-3 % slower
    # in the forty-sixth session, its consumers' loop 10 % longer in R2UR moves; with the producer's
    # reduces their loop is shorter: knob 0 / 1 alternating on non-causal D = 128 with cuDNN. Then the
    # options' backwards beside FlexAttention and SDPA flash with the new default.
    begin
    bench_knob_values FLASHTILE_HOPPER_BWD_PERSISTENT "0 1" d128_persistent 50 --head-dim 128 \
      --causal false --mode bwd --seqlen 1024 2048 4096 16384 --peers flashtile sdpa-cudnn
    step bench_options 200 python3 -m flashtile bench --options window softcap alibi sink varlen \
      --mode bwd --no-plot --out-dir "$work/bench" --name options_bwd
    cp "$work/bench/options_bwd.csv" "$OUT"/ 2>/dev/null
    finish
    ;;
  s48g)
    # (Forty-eighth session, main.) Plain D = 64 calls with a learnable sink take the "m128" variant, whose
    # key loop holds 40 / 53 local accesses with the producer's dQ reduces against 34 / 33 without (sm_90):
    # their backward, knob 0 / 1 alternating (s48d timed sinks at D = 128 only).
    begin
    bench_knob_values FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER "0 1" sink_d64 40 --options sink --head-dim 64 \
      --mode bwd --peers flashtile
    finish
    ;;
  s49c)
    # (For the forty-ninth session, main.) dK's wgmma after dQ's in plain non-causal D = 128 calls and the
    # D = 256 joined partition without a mask, landed from s49a / s49b: the backward's GPU file at D = 128,
    # 192 and 256, then the paper grid's backward and forward + backward without a mask at D = 128 / 256.
    begin
    gpu_tests_step 170 tests/test_gpu_hopper_bwd.py -k "d128 or d256 or d192"
    paper_mode_step bwd_full 170 bwd --head-dim 128 256 --causal false --no-plot
    paper_mode_step fwd_bwd_full 170 fwd_bwd --head-dim 128 256 --causal false --no-plot
    finish
    ;;
  s50a)
    # (For the fiftieth session, main.) dK's wgmmas after dQ's where only FLASHTILE_HOPPER_BWD_DK_LAST=1
    # takes them (the default: plain non-causal D = 128 since the forty-ninth session): D = 192 / 256's
    # joined partition (sm_90: no spills either way, never run) and D = 128 with options (window, softcap,
    # ALiBi; the forty-ninth session's patch passed the options' GPU cases). The backward's D = 192 / 256
    # GPU cases and its option cases under the knob, then bench --mode bwd knob 0 / 1 alternating twice.
    begin
    FLASHTILE_HOPPER_BWD_DK_LAST=1 gpu_tests_step 200 tests/test_gpu_hopper_bwd.py \
      -k "d256 or d192 or options"
    bench_knob_values FLASHTILE_HOPPER_BWD_DK_LAST "0 1" d256_dk_last 60 --head-dim 256 --causal both \
      --mode bwd --seqlen 1024 4096 8192 16384 --peers flashtile sdpa-cudnn
    bench_knob_values FLASHTILE_HOPPER_BWD_DK_LAST "0 1" options_dk_last 60 \
      --options window softcap alibi --mode bwd --peers flashtile
    finish
    ;;
  s50b | s50c)
    # (Fiftieth session, main.) The paper grid whole, every mode, at one commit (cuDNN and SDPA flash;
    # Flex was never the best peer of a paper cell on the H200): its rows were last timed at 3d89547
    # (forward), 34917ca and 1fd6fad. s50b adds the GPU files not run since 1fd6fad (the backward's
    # D = 64 cases, the block masks, the sinks); s50c is the grid's second run and memcheck over the Gluon
    # kernels (part a's memcheck box ran out while compiling).
    begin
    paper_grid_whole 200
    if [ "$part" = s50b ]; then
      gpu_tests_step 360 tests/test_gpu_hopper_bwd.py tests/test_gpu_hopper_block_sparse.py tests/test_sinks.py
    else
      memcheck_group hopper 150 250
    fi
    finish
    ;;
  s51a)
    # (For the fifty-first session, main.) The D = 64 causal forward at N = 512-4k, the paper grid's
    # oldest gap (0.91x cuDNN at 512 and 0.98-0.99x at 1k-4k in both of s50b / s50c's runs): kernel time
    # (CUDA graphs) of the default against 64-key tiles, a 2-deep ring and three consumers, with cuDNN;
    # then 64-key tiles again under scripts/experiments/own_tiles_d64.patch, where each of the two
    # consumers steps through its own key tiles only (the lower one skips the diagonal's last 64 keys,
    # wholly masked for its rows; sm_90: no spill; the default 128-key kernel's PTX unchanged).
    begin
    check=(python3 scripts/hopper_persistent_check.py --head-dims 64 --seqlens 512 1024 2048 4096
      --causal-only --only-grid)
    step fwd_d64_causal 240 "${check[@]}" --block-n 64 --stages 2 --consumers --csv "$OUT/fwd_d64_causal.csv"
    exp_patch_step scripts/experiments/own_tiles_d64.patch
    step fwd_d64_causal_own 150 env PYTHONPATH=build/exp_src "${check[@]}" --block-n 64 \
      --csv "$OUT/fwd_d64_causal_own.csv"
    finish
    ;;
  *)
    echo "usage: FLASHTILE_COMMIT=<commit> bash scripts/gpu_session.sh a|b|c|d|e|f|g|h|i|j|k|l|m|n|o|p|q|r|s|t|u|v|w|x|y|z|za|zb|zc|ze|zf|zg|zh|zi|zj|zk|zl|zn|zo|zp|zq|zr|zs|zt|zu|zv|zw|s13a|s13b|s13c|s13d|s13e|s13f|s14a|s14b|s14c|s14d|s14e|s14f|s14g|s14h|s14i|s15a|s15b|s15c|s15d|s15e|s15f|s15g|s15h|s15i|s15j|s15k|s15l|s16a|s16b|s16c|s16d|s16e|s16f|s16g|s16h|s16i|s16j|s16k|s16l|s17a|s17b|s17c|s17d|s17e|s17f|s17g|s17h|s17i|s18a|s18b|s18c|s18d|s18e|s18f|s18g|s18h|s18i|s18j|s18k|s18l|s18m|s18n|s19a|s19b|s19c|s19d|s19e|s19f|s19g|s19h|s19i|s19j|s20a|s20b|s20c|s20d|s20e|s20f|s20g|s20h|s21a|s21b|s21c|s21d|s21e|s21f|s21g|s21h|s21i|s22a|s22b|s22c|s22d|s22e|s22f|s22h|s23a|s23b|s23c|s23d|s23e|s23f|s23g|s24a|s24b|s24c|s24d|s24e|s25a|s26a|s26b|s26c|s26d|s26e|s27a|s27b|s27c|s27d|s27e|s27f|s27g|s27h|s28a|s28b|s28c|s28d|s29a|s29b|s29c|s29d|s29e|s29f|s29g|s29h|s29i|s30a|s30b|s30c|s30d|s30e|s31a|s31b|s31c|s31d|s31e|s31f|s31g|s32a|s32b|s32c|s32d|s33a|s33b|s33c|s33d|s33e|s33f|s33g|s34a|s34b|s34c|s34d|s34e|s34f|s34g|s34h|s34i|s35a|s35b|s35c|s35d|s35e|s36a|s36b|s36c|s36d|s36e|s36f|s37b|s37c|s37e|s38a|s38b|s38c|s38d|s38e|s39a|s39b|s39c|s39d|s39e|s39f|s40a|s40b|s41a|s41b|s41c|s41d|s41e|s42a|s42b|s42c|s42d|s42e|s43a|s43b|s43c|s43d|s43e|s43f|s43g|s43h|s43i|s44a|s44b|s44c|s44d|s45b|s45d|s45e|s45f|s45g|s46a|s46b|s46c|s46d|s46e|s46f|s46g|s47a|s47b|s47c|s47d|s47e|s47f|s47g|s48a|s48b|s48c|s48d|s48e|s48f|s48g|s49c|s50a|s50b|s50c|s51a [test files for a, c, e, f, h, i and k]" >&2
    exit 2
    ;;
esac
