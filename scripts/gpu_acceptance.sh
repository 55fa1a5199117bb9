#!/usr/bin/env bash
# The GPU acceptance run, in one call on the GPU machine: environment, GPU test suite, compute-sanitizer.
# Full logs go to $OUT (the device tool's output folder) or ./gpu_out.
#     FLASHTILE_COMMIT=$(git rev-parse --short=12 HEAD) PYTHONPATH=src bash scripts/gpu_acceptance.sh
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cudnn", torch.backends.cudnn.version())'
  compute-sanitizer --version | tail -n 1
  echo "commit ${FLASHTILE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}"
} | tee "$OUT/environment.txt"
# pytest-xdist spreads the cases (mostly compilation) over 4 processes sharing the one GPU (8 ran out of memory on an H100 with the float64 oracles of the N = 4096 option cases).
python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 --durations=10 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 30
tests=${PIPESTATUS[0]}
# Compile the sanitizer grid first, in 8 processes that fill Triton's disk cache: compiling its ~500 kernel
# variants inside compute-sanitizer takes longer than a device call may run.
for i in 0 1 2 3 4 5 6 7; do FLASHTILE_SANITIZE_SHARD=$i/8 python3 scripts/sanitize_kernels.py > /dev/null 2>&1 & done; wait
# Without the caching allocator every tensor is its own cudaMalloc, so memcheck sees an overrun past any of them.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \
  python3 scripts/sanitize_kernels.py 2>&1 | tee "$OUT/sanitizer.log" | tail -n 20
sanitizer=${PIPESTATUS[0]}
echo "gpu tests exit $tests, sanitizer exit $sanitizer" | tee -a "$OUT/environment.txt"
[ "$tests" -eq 0 ] && [ "$sanitizer" -eq 0 ]
