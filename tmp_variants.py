import time, torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel
from flashtile import flash_attn_func
from flashtile.kernels import fwd as F, bwd as Bw
class ViaOps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = torch.ops.flashtile.attn_fwd(q, k, v, 0.125, False, "triton")
        ctx.save_for_backward(q, k, v, o, lse); return o
    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return torch.ops.flashtile.attn_bwd(do, q, k, v, o, lse, 0.125, False, "triton")
class ViaLaunch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = F.attn_fwd(q, k, v, 0.125, False)
        ctx.save_for_backward(q, k, v, o, lse); return o
    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return Bw.attn_bwd(do, q, k, v, o, lse, 0.125, False)
q, k, v, dout = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
for t in (q, k, v): t.requires_grad_(True)
qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)); dt = dout.transpose(1, 2).contiguous()
def t(fn, n=200):
    for _ in range(30): fn()
    torch.cuda.synchronize(); best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        best = min(best, (time.perf_counter() - t0) / n); torch.cuda.synchronize()
    return best * 1e6
variants = {"current": lambda q, k, v: flash_attn_func(q, k, v), "Function+ops": ViaOps.apply, "Function+launch": ViaLaunch.apply}
for name, f in variants.items():
    out = f(q, k, v)
    print(f"{name:16s} fwd {t(lambda: f(q, k, v)):6.0f} us   bwd {t(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)):6.0f} us")
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    out = Fn.scaled_dot_product_attention(qt, kt, vt)
    print(f"{'sdpa cudnn':16s} fwd {t(lambda: Fn.scaled_dot_product_attention(qt, kt, vt)):6.0f} us   bwd {t(lambda: torch.autograd.grad(out, (qt, kt, vt), dt, retain_graph=True)):6.0f} us")
o2, lse = F.attn_fwd(q.detach(), k.detach(), v.detach(), 0.125, False)
print("launcher fwd", round(t(lambda: F.attn_fwd(q.detach(), k.detach(), v.detach(), 0.125, False))), "bwd", round(t(lambda: Bw.attn_bwd(dout, q.detach(), k.detach(), v.detach(), o2, lse, 0.125, False))))
import cProfile, pstats
out = flash_attn_func(q, k, v)
pr = cProfile.Profile(); pr.enable()
for _ in range(200): torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
pr.disable(); pstats.Stats(pr).sort_stats("cumtime").print_stats(25)
