"""Host µs per layer of the varlen call at the training example's shape, on the GPU host."""
import os, time, torch, triton, triton.language as tl
from flashtile import flash_attn_varlen_func, ops
from flashtile.kernels import fwd, bwd
T, H, Hk, D = 8192, 8, 2, 64
dev = "cuda"
def leaf(*s): return torch.randn(*s, device=dev, dtype=torch.bfloat16, requires_grad=True)
q, k, v = leaf(T, H, D), leaf(T, Hk, D), leaf(T, Hk, D)
qd, kd, vd = (t.detach() for t in (q, k, v))
dout = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
cu = torch.tensor([0, 7000, 8192], dtype=torch.int32, device=dev)
sc = D ** -0.5
def host(fn, n=60):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    ts.sort(); return ts[len(ts) // 2] * 1e6
o, lse = fwd.attn_fwd(qd, kd, vd, sc, True, window_size=(-1, 0), cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7000, max_seqlen_k=7000)
kw = dict(window_size=(-1, 0), cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7000, max_seqlen_k=7000)
class Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c): ctx.save_for_backward(a, b, c); return a.view_as(a)
    @staticmethod
    def backward(ctx, g): return g, None, None
@triton.jit
def noop(p, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, N: tl.constexpr):
    pass
ints = list(range(3, 23))
x = torch.empty(T, H, D, device=dev, dtype=torch.float32)
rows = {
  "torch.empty (T,H,D) fp32": lambda: torch.empty(T, H, D, device=dev),
  "x.unflatten.sum + copy_": lambda: vd.new_empty(T, Hk, D).copy_(x.unflatten(-2, (Hk, -1)).sum(dim=-2)),
  "triton noop launch, 21 args": lambda: noop[(1,)](x, *ints, N=4),
  "empty autograd.Function fwd+bwd": lambda: torch.autograd.grad(Nothing.apply(q, k, v), q, dout),
  "fwd.attn_fwd": lambda: fwd.attn_fwd(qd, kd, vd, sc, True, **kw),
  "bwd.attn_bwd": lambda: bwd.attn_bwd(dout, qd, kd, vd, o, lse, sc, True, **kw),
  "ops.run_attn_fwd": lambda: ops.run_attn_fwd(qd, kd, vd, sc, True, "triton", -1, 0, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7000, max_seqlen_k=7000),
  "ops.run_attn_bwd": lambda: ops.run_attn_bwd(dout, qd, kd, vd, o, lse, sc, True, "triton", -1, 0, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=7000, max_seqlen_k=7000),
  "varlen_func no grad": lambda: flash_attn_varlen_func(qd, kd, vd, cu, cu, 7000, 7000, causal=True),
  "varlen_func grad": lambda: flash_attn_varlen_func(q, k, v, cu, cu, 7000, 7000, causal=True),
  "varlen_func fwd+bwd": lambda: torch.autograd.grad(flash_attn_varlen_func(q, k, v, cu, cu, 7000, 7000, causal=True), (q, k, v), dout),
}
for mode in ("0", "1"):
    os.environ["FLASHTILE_CACHED_LAUNCH"] = mode
    for name, fn in rows.items():
        for _ in range(3): fn()
        print(f"CACHED_LAUNCH={mode} {name:34s} {host(fn):8.1f}")
