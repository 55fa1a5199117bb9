"""A small grid of odd shapes for `compute-sanitizer --tool memcheck`: every kernel, boundary tiles included.

compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize_kernels.py
"""

from __future__ import annotations

import torch

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

for batch, sq, sk, h, hkv, d, causal in SHAPES:
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(batch, sq, h, d, dtype=dtype, device="cuda")
        k, v = (torch.randn(batch, sk, hkv, d, dtype=dtype, device="cuda") for _ in range(2))
        out, lse = attn_fwd(q, k, v, d**-0.5, causal)
        grads = attn_bwd(torch.randn_like(q), q, k, v, out, lse, d**-0.5, causal)
        torch.cuda.synchronize()
        assert all(torch.isfinite(t).all() for t in (out, *grads)), (batch, sq, sk, h, hkv, d, causal, dtype)
print(f"sanitizer grid: {len(SHAPES) * 2} fwd+bwd launches finished")
