"""One case of the Gluon varlen backward per subprocess (a CUDA fault is sticky): which ones fault."""

from __future__ import annotations

import os
import subprocess
import sys

CASE = """
import torch
from flashtile.kernels import fwd as portable_fwd
from flashtile.kernels.hopper import bwd
kind, d, lengths = {kind!r}, {d}, {lengths!r}
torch.manual_seed(0)
dt = torch.bfloat16
if kind == "dense":
    q = torch.randn(1, 300, 4, d, device="cuda", dtype=dt)
    k, v = (torch.randn(1, 300, 2, d, device="cuda", dtype=dt) for _ in range(2))
    out, lse = portable_fwd.attn_fwd(q, k, v, d**-0.5, True, window_size=(-1, 0))
    g = bwd.attn_bwd(torch.randn_like(q), q, k, v, out, lse, d**-0.5, True)
else:
    import itertools
    cu_q = torch.tensor([0, *itertools.accumulate(n[0] for n in lengths)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(n[1] for n in lengths)], dtype=torch.int32, device="cuda")
    q = torch.randn(int(cu_q[-1]), 4, d, device="cuda", dtype=dt)
    k, v = (torch.randn(int(cu_k[-1]), 2, d, device="cuda", dtype=dt) for _ in range(2))
    vl = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(n[0] for n in lengths),
              max_seqlen_k=max(n[1] for n in lengths))
    out, lse = portable_fwd.attn_fwd(q, k, v, d**-0.5, True, window_size=(-1, 0), **vl)
    g = bwd.attn_bwd(torch.randn_like(q), q, k, v, out, lse, d**-0.5, True, **vl)
torch.cuda.synchronize()
print("ok", [float(t.float().abs().max()) for t in g])
"""

CASES = [
    ("dense", 64, None),
    ("dense", 128, None),
    ("varlen", 64, [(128, 128)]),
    ("varlen", 64, [(64, 64), (64, 64)]),
    ("varlen", 64, [(100, 90), (30, 77)]),
    ("varlen", 128, [(128, 128)]),
]
env = {**os.environ, "FLASHTILE_HOPPER_BWD_VARLEN": "1"}
for kind, d, lengths in CASES:
    r = subprocess.run([sys.executable, "-c", CASE.format(kind=kind, d=d, lengths=lengths)], env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    lines = (r.stdout if r.returncode == 0 else r.stderr).strip().splitlines()
    tail = lines[-1:] if r.returncode == 0 else lines[-2:]
    print(kind, d, lengths, "rc", r.returncode, tail, flush=True)
if len(sys.argv) > 1:
    kind, d, lengths = CASES[int(sys.argv[1])]
    r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--show-backtrace", "device",
                        sys.executable, "-c", CASE.format(kind=kind, d=d, lengths=lengths)], env=env,
                       capture_output=True, text=True, timeout=200)  # fmt: skip
    print("\n".join((r.stdout + r.stderr).splitlines()[:60]))
