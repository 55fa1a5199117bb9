export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/train
S=$SECONDS
left() { echo $((545 - (SECONDS - S))); }
timeout 90 python dbg/train_diag.py --timing-only > $OUT/train_time.log 2>&1
for i in 1 2; do for a in flashtile sdpa; do
  timeout 60 python examples/train_llama.py --attn $a --context 8192 --steps 120 --out-dir $OUT/train >> $OUT/train_ab.log 2>&1
done; done
grep -h "step median\|tokens/s" $OUT/train_time.log $OUT/train_ab.log
echo "train done at $((SECONDS-S)) s"
for i in 0 1 2 3 4 5 6 7; do
  FLASHTILE_SANITIZE_SHARD=$i/8 timeout 150 python scripts/sanitize_kernels.py > $OUT/shard$i.log 2>&1 &
done
timeout -s INT 120 python -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/test_launch_cache.py tests/test_kernel_options.py -k "varlen or packed or per_query_head or direct" > $OUT/tests.log 2>&1
tail -4 $OUT/tests.log
wait
tail -qn 1 $OUT/shard*.log
echo "memcheck starts at $((SECONDS-S)) s, box $(( $(left) - 10 ))"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -s INT -k 15 $(( $(left) - 10 )) compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize_kernels.py > $OUT/memcheck.log 2>&1
echo "memcheck exit $?"
grep -c "^\[" $OUT/memcheck.log; tail -5 $OUT/memcheck.log
