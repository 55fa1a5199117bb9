"""Where the autograd backward of the varlen call spends host time on the GPU host."""
import os, time, threading, torch
import flashtile.autograd as fa
import flashtile.ops as fops
from flashtile.kernels import bwd as kbwd
from flashtile import flash_attn_varlen_func
os.environ["FLASHTILE_CACHED_LAUNCH"] = "1"
T, H, Hk, D = 8192, 8, 2, 64
dev = "cuda"
def leaf(*s): return torch.randn(*s, device=dev, dtype=torch.bfloat16, requires_grad=True)
q, k, v = leaf(T, H, D), leaf(T, Hk, D), leaf(T, Hk, D)
dout = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
cu = torch.tensor([0, 7000, 8192], dtype=torch.int32, device=dev)
marks = {}
def timed(name, fn):
    def wrapper(*a, **kw):
        t = time.perf_counter(); r = fn(*a, **kw); marks.setdefault(name, []).append(time.perf_counter() - t)
        marks.setdefault(name + " thread", []).append(threading.get_ident() == threading.main_thread().ident)
        return r
    return wrapper
fa.FlashAttnFunction.backward = staticmethod(timed("Function.backward", fa.FlashAttnFunction.backward))
fa._ops.run_attn_bwd = timed("ops.run_attn_bwd", fops.run_attn_bwd)
import flashtile.kernels.portable as portable
portable.bwd.attn_bwd = timed("bwd.attn_bwd", kbwd.attn_bwd)
for name in ("preprocess", "dkdv", "dq"):
    pass
def step():
    out = flash_attn_varlen_func(q, k, v, cu, cu, 7000, 7000, causal=True)
    torch.cuda.synchronize()
    t = time.perf_counter(); torch.autograd.grad(out, (q, k, v), dout); marks.setdefault("autograd.grad", []).append(time.perf_counter() - t)
for _ in range(5): step()
marks.clear()
for _ in range(60): step()
for name, ts in marks.items():
    if name.endswith("thread"): print(name, "main thread" if ts[0] else "other thread"); continue
    ts = sorted(ts); print(f"{name:24s} median {ts[len(ts)//2]*1e6:8.1f} us  n={len(ts)}")
# Same without the engine's device thread: call the backward of the graph by hand.
out = flash_attn_varlen_func(q, k, v, cu, cu, 7000, 7000, causal=True)
node = out.grad_fn
print("grad_fn", type(node).__name__, "next", [type(n[0]).__name__ if n[0] else None for n in node.next_functions][:4])
