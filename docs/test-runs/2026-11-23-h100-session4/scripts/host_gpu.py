"""Host time per call of the example's attention on the GPU host: flashtile varlen vs sdpa with a 4-D mask."""
import cProfile, pstats, sys, time, torch
import torch.nn.functional as F
from flashtile import flash_attn_varlen_func
T, H, Hk, D = 8192, 8, 2, 64
dev = "cuda"
def leaf(*s): return torch.randn(*s, device=dev, dtype=torch.bfloat16, requires_grad=True)
q, k, v = leaf(T, H, D), leaf(T, Hk, D), leaf(T, Hk, D)
dout = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
cu = torch.tensor([0, 7000, 8192], dtype=torch.int32, device=dev)
qs, ks, vs = leaf(1, H, T, D), leaf(1, Hk, T, D), leaf(1, Hk, T, D)
doc = torch.zeros(T, dtype=torch.long, device=dev); doc[7000:] = 1
i = torch.arange(T, device=dev)
mask = ((doc[:, None] == doc[None, :]) & (i[:, None] >= i[None, :]))[None, None]
douts = torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16)
def ft_fwd(): return flash_attn_varlen_func(q, k, v, cu, cu, 7000, 7000, causal=True)
def sd_fwd(): return F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)
def host(fn, n=50):
    """Median host µs of fn, GPU drained before each call so the host never waits on a full queue."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e6
for name, f, x, g in (("flashtile", ft_fwd, (q, k, v), dout), ("sdpa", sd_fwd, (qs, ks, vs), douts)):
    for _ in range(3): torch.autograd.grad(f(), x, g)
    torch.cuda.synchronize()
    with torch.no_grad():
        nog = host(f)
    fw = host(f)
    outs = []
    def bw():
        torch.autograd.grad(outs.pop(), x, g)
    def fb(): torch.autograd.grad(f(), x, g)
    ts = []
    for _ in range(50):
        o = f(); torch.cuda.synchronize(); t = time.perf_counter(); torch.autograd.grad(o, x, g); ts.append(time.perf_counter() - t)
    ts.sort()
    print(f"{name:10s} host us: fwd no-grad {nog:7.1f}  fwd grad {fw:7.1f}  bwd {ts[25]*1e6:7.1f}  fwd+bwd {host(fb):7.1f}")
    if name == "flashtile":
        pr = cProfile.Profile(); pr.enable()
        for _ in range(100): fb()
        pr.disable(); torch.cuda.synchronize()
        pstats.Stats(pr).sort_stats("tottime").print_stats(22)
