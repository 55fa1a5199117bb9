"""A small grid of odd shapes for `compute-sanitizer --tool memcheck`: every kernel, boundary tiles included,
dense and with each option (window, softcap, ALiBi, dropout, varlen with empty sequences).

compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize_kernels.py
"""

from __future__ import annotations

import os

import torch

from flashtile.kernels._dropout import dropout_mask
from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd

SHAPES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal)
    (1, 1, 1, 1, 1, 32, False),
    (2, 17, 17, 4, 2, 59, True),
    (1, 113, 203, 4, 1, 64, True),
    (1, 203, 113, 2, 2, 96, True),
    (2, 129, 255, 2, 1, 128, False),
    (1, 97, 63, 2, 2, 256, True),
    (1, 300, 300, 3, 3, 160, False),
]
# Normalised windows (−1 = unlimited), softcap, ALiBi slopes per (batch, head) or not, dropout p.
OPTIONS = [
    dict(window_size=(0, 0)),
    dict(window_size=(37, 5), softcap=20.0, alibi=True),
    dict(window_size=(-1, 3), dropout_p=0.2),
    dict(window_size=(9, -1), softcap=5.0, alibi=True, dropout_p=0.5),
]
# Varlen batches: (seqlen_q, seqlen_k) per sequence, empty ones included.
VARLEN = [[(1, 1)], [(17, 0), (0, 33), (129, 255), (255, 129)], [(300, 300), (1, 77), (64, 64)]]
# cu_seqlens the kernels must clamp: decreasing, negative, past the total.
BAD_CU_SEQLENS = ([0, 50, 30, 1000], [-5, 20, 10, 99])


# FLASHTILE_SANITIZE_SHARD="i/n" runs every n-th case from the i-th: n processes fill Triton's disk cache in
# parallel before the sanitized run, which would otherwise spend its time compiling ~500 kernel variants.
SHARD, SHARDS = (int(x) for x in os.environ.get("FLASHTILE_SANITIZE_SHARD", "0/1").split("/"))
cases = 0


def check(q, k, v, causal, **kw) -> None:
    global cases
    cases += 1
    if (cases - 1) % SHARDS != SHARD:
        return
    out, lse = attn_fwd(q, k, v, q.shape[-1] ** -0.5, causal, **kw)
    grads = attn_bwd(torch.randn_like(q), q, k, v, out, lse, q.shape[-1] ** -0.5, causal, **kw)
    torch.cuda.synchronize()
    assert all(torch.isfinite(t).all() for t in (out, *grads)), (q.shape, k.shape, causal, kw)


def option_kwargs(options: dict, batch: int, heads: int) -> dict:
    kw = {key: value for key, value in options.items() if key != "alibi"}
    if options.get("alibi"):
        kw["alibi_slopes"] = torch.rand(batch, heads, device="cuda")
    if options.get("dropout_p"):
        kw["rng_state"] = torch.randint(-(2**62), 2**62, (2,), device="cuda")
    return kw


launches = 0
for dtype in (torch.bfloat16, torch.float16):
    for batch, sq, sk, h, hkv, d, causal in SHAPES:
        q = torch.randn(batch, sq, h, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(batch, sk, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
        for options in [{}, *OPTIONS]:
            check(q, k, v, causal, **option_kwargs(options, batch, h))
            launches += 1
    for lengths in VARLEN:
        cu_q, cu_k = (
            torch.tensor([0, *torch.tensor(side).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
            for side in zip(*lengths, strict=True)
        )
        q = torch.randn(int(cu_q[-1]), 4, 64, dtype=dtype, device="cuda")
        k, v = (torch.randn(int(cu_k[-1]), 2, 64, dtype=dtype, device="cuda") for _ in range(2))
        varlen = dict(
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            max_seqlen_q=max(n for n, _ in lengths),
            max_seqlen_k=max(n for _, n in lengths),
        )
        for options in [{}, *OPTIONS]:
            for causal in (False, True):
                check(q, k, v, causal, **varlen, **option_kwargs(options, len(lengths), 4))
                launches += 1
bad_q, bad_k = (torch.tensor(cu, dtype=torch.int32, device="cuda") for cu in BAD_CU_SEQLENS)
q = torch.randn(60, 2, 64, dtype=torch.float16, device="cuda")
k, v = (torch.randn(40, 1, 64, dtype=torch.float16, device="cuda") for _ in range(2))
bad = dict(cu_seqlens_q=bad_q, cu_seqlens_k=bad_k, max_seqlen_q=128, max_seqlen_k=128)
out, lse = attn_fwd(q, k, v, 0.125, True, **bad)
attn_bwd(torch.randn_like(q), q, k, v, out, lse, 0.125, True, **bad)
mask = dropout_mask(torch.randint(0, 2**62, (2,), device="cuda"), 0.3, 2, 3, 97, 203)
torch.cuda.synchronize()
print(f"sanitizer grid: {launches} fwd+bwd launches and one dropout mask finished")
