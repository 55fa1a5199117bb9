"""Config sweep for the Triton kernels on one GPU: checks each config, then times it beside cuDNN.

Each config runs in its own process (a compiler abort only loses that config). Prints one line per
(config, cell) and appends rows to the CSV given by --csv. Usage on the GPU machine:
    PYTHONPATH=src python benchmarks/kernel_sweep.py --csv $OUT/sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import subprocess
import sys

FWD_CONFIGS = [
    (128, 128, 8, 3, False),
    (128, 128, 8, 4, False),
    (128, 64, 4, 3, False),
    (128, 128, 4, 3, True),
    (128, 64, 4, 3, True),
    (128, 64, 8, 3, False),
]
BWD_CONFIGS = [
    (64, 128, 128, 64, 8, 3),
    (64, 128, 128, 64, 8, 2),
    (32, 128, 128, 32, 8, 3),
    (64, 64, 64, 64, 4, 3),
    (64, 128, 128, 128, 8, 2),
]
CELLS = [(1, 16384, 128), (4, 4096, 128)]


def _flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, mode: str) -> float:
    f = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def run_one(spec: dict) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from flashtile.kernels import configs
    from flashtile.kernels.bwd import attn_bwd
    from flashtile.kernels.fwd import attn_fwd

    rows = []
    dev = torch.device("cuda")
    mode = spec["mode"]
    cfg = configs.FwdConfig(*spec["cfg"]) if mode == "fwd" else configs.BwdConfig(*spec["cfg"])
    fcfg = configs.fwd_config(spec.get("d", 128), False, dev)
    for causal in (False, True):
        # Check on an odd shape first: a wrong config gets no timing.
        q, k, v, do = (torch.randn(2, 1000, 4, 128, device=dev, dtype=torch.bfloat16) for _ in range(4))
        ref = [t.float().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            ro = torch.nn.functional.scaled_dot_product_attention(
                *(t.transpose(1, 2) for t in ref), is_causal=causal
            ).transpose(1, 2)
        ro.backward(do.float())
        if mode == "fwd":
            o, _ = attn_fwd(q, k, v, 128**-0.5, causal, config=cfg)
            err = (o.float() - ro).abs().max().item()
        else:
            o, lse = attn_fwd(q, k, v, 128**-0.5, causal, config=fcfg)
            grads = attn_bwd(do, q, k, v, o, lse, 128**-0.5, causal, config=cfg)
            err = max((g.float() - r.grad).abs().max().item() for g, r in zip(grads, ref, strict=True))
        ok = err < 0.05
        for batch, seqlen, head_dim in CELLS:
            heads = 2048 // head_dim
            shape = (batch, seqlen, heads, head_dim)
            q, k, v, do = (torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(4))
            scale = head_dim**-0.5
            if mode == "fwd":
                fn = functools.partial(attn_fwd, q, k, v, scale, causal, config=cfg)
            else:
                o, lse = attn_fwd(q, k, v, scale, causal, config=fcfg)
                fn = functools.partial(attn_bwd, do, q, k, v, o, lse, scale, causal, config=cfg)
            ms = do_bench(fn, warmup=50, rep=300, return_mode="median") if ok else float("nan")
            tflops = _flops(batch, heads, seqlen, head_dim, causal, mode) / ms / 1e9
            rows.append(
                dict(
                    mode=mode,
                    cfg=str(spec["cfg"]),
                    causal=causal,
                    batch=batch,
                    seqlen=seqlen,
                    head_dim=head_dim,
                    ms=ms,
                    tflops=tflops,
                    max_err=err,
                )
            )
    return rows


def run_cudnn() -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    rows = []
    for causal in (False, True):
        for batch, seqlen, head_dim in CELLS:
            heads = 2048 // head_dim
            shape = (batch, heads, seqlen, head_dim)
            q, k, v, do = (
                torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4)
            )
            sdpa = torch.nn.functional.scaled_dot_product_attention
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fwd = functools.partial(sdpa, q, k, v, is_causal=causal)
                ms_f = do_bench(fwd, warmup=50, rep=300, return_mode="median")
                bwd = functools.partial(fwd().backward, do, retain_graph=True)
                ms_b = do_bench(bwd, warmup=50, rep=300, return_mode="median")
            for mode, ms in (("fwd", ms_f), ("bwd", ms_b)):
                tflops = _flops(batch, heads, seqlen, head_dim, causal, mode) / ms / 1e9
                rows.append(
                    dict(
                        mode=mode,
                        cfg="cudnn",
                        causal=causal,
                        batch=batch,
                        seqlen=seqlen,
                        head_dim=head_dim,
                        ms=ms,
                        tflops=tflops,
                        max_err=0.0,
                    )
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one", help="internal: one config as JSON")
    parser.add_argument("--csv", default="sweep.csv")
    parser.add_argument("--only", choices=["fwd", "bwd"], default=None)
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        rows = run_cudnn() if spec["mode"] == "cudnn" else run_one(spec)
        print("ROWS " + json.dumps(rows), flush=True)
        return
    specs = [{"mode": "cudnn"}]
    if args.only in (None, "fwd"):
        specs += [{"mode": "fwd", "cfg": list(c)} for c in FWD_CONFIGS]
    if args.only in (None, "bwd"):
        specs += [{"mode": "bwd", "cfg": list(c)} for c in BWD_CONFIGS]
    all_rows = []
    for spec in specs:
        cmd = [sys.executable, __file__, "--one", json.dumps(spec)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS ")]
        if proc.returncode != 0 or not lines:
            print(f"{spec}: FAILED rc={proc.returncode}\n{proc.stderr[-1500:]}", flush=True)
            continue
        rows = json.loads(lines[-1][5:])
        all_rows += rows
        for r in rows:
            cell = f"causal={r['causal']!s:5} N={r['seqlen']:6} D={r['head_dim']:3}"
            print(
                f"{r['mode']:4} {r['cfg']:28} {cell} {r['tflops']:7.1f} TFLOP/s  err={r['max_err']:.2e}",
                flush=True,
            )
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows)


if __name__ == "__main__":
    main()
