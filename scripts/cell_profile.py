"""One GPU run to profile: one cell of the paper grid (bf16, B·N = 16k tokens, H·D = 2048) called a few
times by flashtile or by SDPA's cuDNN backend, the last call inside an NVTX range ``profiled`` for Nsight
Compute to take every kernel of it:

    PYTHONPATH=src ncu --nvtx --nvtx-include "profiled/" --section LaunchStats --section Occupancy \\
        python scripts/cell_profile.py --impl cudnn --head-dim 64 --seqlen 512 --causal

Nsight Compute's launch statistics name a peer's tiling (grid, block, registers, shared memory a program)
where its source is closed; its warp-state sampling says where flashtile's kernel waits. ``--option``
gives flashtile's call one of flash_attn's options (softcap 30, ALiBi slopes, dropout 0.1): at the
defaults (D = 128, N = 4k) that is `flashtile bench --options`' forward cell.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from flashtile import flash_attn_func

TOKENS, WIDTH = 16384, 2048
# flash_attn's options for --option (ALiBi's slopes are drawn per head at the call).
OPTIONS = {
    "plain": {},
    "softcap": {"softcap": 30.0},
    "alibi": {"alibi_slopes": None},
    "dropout": {"dropout_p": 0.1},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=["flashtile", "cudnn"], default="flashtile")
    parser.add_argument("--mode", choices=["fwd", "bwd"], default="fwd")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--option", choices=sorted(OPTIONS), default="plain", help="flashtile only")
    args = parser.parse_args()
    if args.option != "plain" and args.impl != "flashtile":
        parser.error(
            f"--option {args.option} is for --impl flashtile (SDPA has none of flash_attn's options)"
        )
    batch, heads = TOKENS // args.seqlen, WIDTH // args.head_dim
    shape = (batch, args.seqlen, heads, args.head_dim)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=args.mode == "bwd")
        for _ in range(3)
    )
    options = dict(OPTIONS[args.option])
    if "alibi_slopes" in options:
        options["alibi_slopes"] = torch.rand(heads, device="cuda", dtype=torch.float32)

    def forward() -> torch.Tensor:
        if args.impl == "flashtile":
            return flash_attn_func(q, k, v, causal=args.causal, **options)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            # SDPA takes (B, H, N, D).
            out = scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=args.causal
            )
        return out.transpose(1, 2)

    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    # The backward on this thread: in autograd's device thread (PyTorch's default) the kernels fall
    # outside this thread's NVTX range, and ncu's --nvtx-include profiles none of them.
    torch.autograd.set_multithreading_enabled(False)
    for call in range(args.calls):
        last = call == args.calls - 1
        if args.mode == "fwd":
            with torch.cuda.nvtx.range("profiled" if last else "warm-up"):
                forward()
        else:
            out = forward()
            with torch.cuda.nvtx.range("profiled" if last else "warm-up"):
                out.backward(grad)
    torch.cuda.synchronize()
    print(
        f"{args.impl} {args.mode}: {args.calls} calls at (B, N, H, D) = {shape}, causal {args.causal}, "
        f"option {args.option}"
    )


if __name__ == "__main__":
    main()
