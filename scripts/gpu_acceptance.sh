#!/usr/bin/env bash
# The GPU acceptance run, in one call on the GPU machine: environment, GPU test suite, compute-sanitizer.
# Logs go to $OUT (the device tool's output folder) or ./gpu_out.
#     PYTHONPATH=src bash scripts/gpu_acceptance.sh
set -uo pipefail
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cudnn", torch.backends.cudnn.version())'
  git rev-parse --short HEAD 2>/dev/null || true
} | tee "$OUT/environment.txt"
python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 2>&1 | tail -n 40 | tee "$OUT/gpu_tests.log"
# Without the caching allocator every tensor is its own cudaMalloc, so memcheck sees an overrun past any of them.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_kernels.py 2>&1 | tail -n 20 | tee "$OUT/sanitizer.log"
