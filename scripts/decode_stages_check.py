"""One GPU run: the split decode at 3 and 2 pipeline stages and at its default (2 stages for splits of 2
tiles or fewer), with and without the combine's programmatic dependent launch (FLASHTILE_DECODE_PDL=0),
against SDPA's cuDNN backend, at batch 1 and more.

    PYTHONPATH=src python scripts/decode_stages_check.py [--reps 100] [--rounds 3]

Timed as scripts/decode_check.py times (CUDA graphs over rotated cache copies, K and V read once); the
variants alternate within each round, so a slow phase of the machine falls on all of them. At b28c56a it
also timed the splits' merge done by each row block's last split program instead of a second kernel:
5-6 µs slower at batch 1 on an H200 (docs/design/decode.md, "Combine").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_check import HEAD_DIM, Problem

from flashtile.bench.decode import copy_bandwidth
from flashtile.kernels import configs
from flashtile.kernels.decode import PDL_ENV, decode_fwd


def variants(problem: Problem) -> dict[str, object]:
    default = configs.decode_config(HEAD_DIM, torch.device("cuda"))
    two = configs.DecodeConfig(default.MAX_BLOCK_M, default.BLOCK_N, default.num_warps, 2)

    def ours(config: configs.DecodeConfig | None):
        def call(i: int) -> torch.Tensor:
            k, v, table = problem.caches[i][:3]
            return decode_fwd(
                problem.q, k, v, problem.seqlens, softmax_scale=HEAD_DIM**-0.5, block_table=table,
                window_size=(-1, 0), config=config,
            )[0]  # fmt: skip

        return call

    def without_pdl(call):
        def call_without(i: int) -> torch.Tensor:
            os.environ[PDL_ENV] = "0"
            try:
                return call(i)
            finally:
                os.environ.pop(PDL_ENV)

        return call_without

    return {
        "default": ours(None),
        "default without PDL": without_pdl(ours(None)),
        "3 stages": ours(default),
        "2 stages": ours(two),
        "sdpa cudnn": lambda i: problem.sdpa(i, SDPBackend.CUDNN_ATTENTION),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    shapes = [(1, 4096), (1, 16384), (1, 32768), (1, 65536), (1, 131072), (4, 16384), (16, 16384)]
    print("shape,variant,round,p20_us,p50_us,p80_us", flush=True)
    for batch, seqlen in shapes:
        problem = Problem(batch, seqlen, 4)
        calls = variants(problem)
        ref = calls["3 stages"](0)
        for name, call in calls.items():
            if name.startswith("sdpa"):
                continue
            err, base = problem.check(call(0))
            diff = (call(0).float() - ref.float()).abs().max().item()
            verdict = "ok" if err <= 2 * base + 1e-5 else "FAIL"
            print(f"# {problem.label()} {name}: max|err| {err:.2e} (bf16 {base:.2e}) {verdict}; "
                  f"against 3 stages {diff:.2e}", flush=True)  # fmt: skip
        p50s = problem.time_rounds(calls, args.rounds, args.reps)
        cudnn = statistics.median(p50s["sdpa cudnn"])
        for name, times in p50s.items():
            ms = statistics.median(times)
            tbs = problem.kv_bytes / (ms * 1e-3) / 1e12
            print(f"## {problem.label()} {name:<18} {ms * 1e3:8.2f} µs  {tbs:5.2f} TB/s  "
                  f"{cudnn / ms:5.2f}x cuDNN", flush=True)  # fmt: skip
        del problem, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
