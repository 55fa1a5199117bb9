"""The portable varlen backward at the training example's shape: one dK/dV program per K/V head vs per query head."""
import torch, triton
from flashtile.kernels import fwd, bwd
torch.manual_seed(0)
for lengths in ([7000, 1192], [8192], [2048] * 4):
    total = sum(lengths)
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(total, 8, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(total, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
    o, l = fwd.attn_fwd(q, k, v, 0.125, True, window_size=(-1, 0), **kw)
    res = {}
    for per in (0, 10**9):
        bwd.MIN_DKDV_PROGRAMS_PER_SM = per
        bwd._bwd_launches.cache_clear()
        f = lambda: bwd.attn_bwd(do, q, k, v, o, l, 0.125, True, window_size=(-1, 0), **kw)
        res[per] = f()
        ms = triton.testing.do_bench(f, warmup=20, rep=200)
        print(lengths, "per-query-head" if per else "per-kv-head", f"{ms:.3f} ms")
    print("  max diff", [float((a.float() - b.float()).abs().max()) for a, b in zip(*res.values())])
bwd.MIN_DKDV_PROGRAMS_PER_SM = 2
