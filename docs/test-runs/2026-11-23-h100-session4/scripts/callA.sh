export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/train
t0=$SECONDS
timeout 120 python dbg/train_diag.py --timing-only > $OUT/train_time.log 2>&1
for i in 1 2; do for a in flashtile sdpa; do
  timeout 80 python examples/train_llama.py --attn $a --context 8192 --steps 150 --out-dir $OUT/train >> $OUT/train_ab.log 2>&1
done; done
grep -h "step median\|tokens/s" $OUT/train_time.log $OUT/train_ab.log
echo "train part $((SECONDS-t0)) s"
left=$((560 - SECONDS))
timeout -s INT $left python -m pytest -m gpu -n 4 -q -p no:cacheprovider tests/test_launch_cache.py tests/test_kernel_options.py tests/test_gpu_api.py tests/test_kernels.py --junitxml=$OUT/tests.xml > $OUT/tests.log 2>&1
tail -25 $OUT/tests.log
