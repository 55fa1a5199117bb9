"""One GPU run to profile: the forward of one flash_attn option (or none) at D = 128, N = 4k, called a few
times, for Nsight Compute to take one launch of the Gluon forward and report where its warps stall.

    PYTHONPATH=src ncu --kernel-name regex:attn_fwd --launch-skip 3 --launch-count 1 \\
        --section WarpStateStats python scripts/option_loop_profile.py --option softcap

The options' cells are `flashtile bench --options`'s (B = 4, H = 16, bf16, non-causal): the softcap and
dropout forwards stay at 0.71-0.86 of the plain one there, and three rewrites by reasoning did not move
ALiBi's (docs/design/hopper.md, "Options"); the stall reasons of the key loop say where the time goes.
"""

from __future__ import annotations

import argparse

import torch

from flashtile import flash_attn_func

OPTIONS = {
    "plain": {},
    "softcap": {"softcap": 30.0},
    "alibi": {"alibi_slopes": "slopes"},
    "dropout": {"dropout_p": 0.1},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--option", choices=sorted(OPTIONS), default="plain")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--seqlen", type=int, default=4096)
    args = parser.parse_args()
    batch, heads, head_dim = 4, 16, 128
    shape = (batch, args.seqlen, heads, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    options = dict(OPTIONS[args.option])
    if options.get("alibi_slopes") == "slopes":
        options["alibi_slopes"] = torch.rand(heads, device="cuda", dtype=torch.float32)
    for _ in range(args.calls):
        flash_attn_func(q, k, v, **options)
    torch.cuda.synchronize()
    print(f"{args.option}: {args.calls} forwards at (B, N, H, D) = {shape}")


if __name__ == "__main__":
    main()
