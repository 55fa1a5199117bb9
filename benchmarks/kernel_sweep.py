"""Config sweep for the Triton kernels on one GPU: checks each variant, then times it beside cuDNN.

Each variant runs in its own process (a compiler abort only loses that variant); inputs rotate among
three sets so no variant is timed on a warm L2. Prints one line per (variant, cell) and writes a CSV:
    PYTHONPATH=src python benchmarks/kernel_sweep.py --csv $OUT/sweep.csv [--only fwd|bwd] [--head-dim 256]
Cells follow the benchmark grid of benchmarks/README.md (B·N = 16k tokens, H·D = 2048) at N = 16k, 4k and 1k.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys

# Candidates per head dim. Forward: (BLOCK_M, BLOCK_N, num_warps, num_stages).
FWD_CONFIGS = {
    64: [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (128, 64, 4, 4)],
    128: [(128, 128, 8, 3), (128, 64, 8, 3)],
    256: [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 128, 8, 2)],
}
# Backward: (BLOCK_M1, BLOCK_N1, warps1, stages1, BLOCK_M2, BLOCK_N2, warps2, stages2): dK/dV, then dQ.
BWD_CONFIGS = {
    64: [
        (64, 128, 8, 3, 128, 64, 8, 3),
        (64, 128, 4, 3, 128, 64, 4, 3),
        (128, 128, 8, 3, 128, 128, 8, 3),
        (64, 128, 8, 4, 128, 64, 8, 4),
        (128, 64, 8, 3, 128, 64, 8, 3),
        (32, 128, 4, 3, 128, 32, 4, 3),
    ],
    128: [
        (64, 128, 8, 3, 128, 64, 8, 3),
        (64, 128, 8, 2, 128, 64, 8, 3),
        (64, 64, 4, 3, 128, 64, 8, 3),
        (64, 128, 8, 3, 128, 128, 8, 2),
        (64, 128, 8, 3, 64, 64, 4, 3),
        (64, 128, 8, 3, 64, 128, 4, 3),
        (64, 128, 8, 3, 128, 64, 8, 4),
        (64, 128, 8, 3, 128, 32, 4, 3),
    ],
    256: [
        (32, 64, 8, 2, 64, 32, 8, 2),
        (32, 64, 8, 1, 64, 32, 8, 2),
        (16, 64, 4, 2, 64, 32, 8, 2),
        (32, 64, 4, 2, 64, 32, 4, 2),
        (64, 64, 8, 2, 64, 32, 8, 2),
        (32, 64, 8, 3, 64, 32, 8, 2),
        (32, 64, 8, 2, 64, 64, 8, 2),
        (32, 64, 8, 2, 128, 32, 8, 2),
        (32, 64, 8, 2, 64, 32, 4, 3),
        (32, 64, 8, 2, 128, 64, 8, 1),
        (64, 64, 8, 2, 64, 32, 4, 3),
        (64, 64, 8, 2, 128, 32, 8, 2),
        (64, 64, 8, 2, 64, 32, 4, 2),
        (64, 64, 8, 3, 64, 32, 4, 3),
    ],
}
SEQLENS = (16384, 4096, 1024)
ROTATION = 3


def _flops(batch: int, heads: int, seqlen: int, head_dim: int, causal: bool, mode: str) -> float:
    f = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return f * (2.5 if mode == "bwd" else 1.0)


def _rotating(fn, sets):
    cycle = itertools.cycle(sets)
    return lambda: fn(*next(cycle))


def run_one(spec: dict) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from flashtile.kernels import bwd, configs, fwd

    rows = []
    dev = torch.device("cuda")
    mode = spec["mode"]
    cfg = configs.FwdConfig(*spec["cfg"]) if mode == "fwd" else configs.BwdConfig(*spec["cfg"])
    head_dim = spec["head_dim"]
    fcfg = configs.fwd_config(head_dim, dev)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (False, True):
        # Check on an odd shape first: a wrong variant gets no timing.
        q, k, v, do = (torch.randn(2, 1000, 4, head_dim, device=dev, dtype=torch.bfloat16) for _ in range(4))
        ref = [t.float().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            ro = sdpa(*(t.transpose(1, 2) for t in ref), is_causal=causal).transpose(1, 2)
        ro.backward(do.float())
        if mode == "fwd":
            o, _ = fwd.attn_fwd(q, k, v, head_dim**-0.5, causal, config=cfg)
            err = (o.float() - ro).abs().max().item()
        else:
            o, lse = fwd.attn_fwd(q, k, v, head_dim**-0.5, causal, config=fcfg)
            grads = bwd.attn_bwd(do, q, k, v, o, lse, head_dim**-0.5, causal, config=cfg)
            err = max((g.float() - r.grad).abs().max().item() for g, r in zip(grads, ref, strict=True))
        ok = err < 0.05
        for seqlen in spec["seqlens"]:
            batch, heads = 16384 // seqlen, 2048 // head_dim
            scale = head_dim**-0.5
            shape = (batch, seqlen, heads, head_dim)
            sets = []
            for _ in range(ROTATION):
                q, k, v, do = (torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(4))
                if mode == "fwd":
                    sets.append((q, k, v, scale, causal))
                else:
                    o, lse = fwd.attn_fwd(q, k, v, scale, causal, config=fcfg)
                    sets.append((do, q, k, v, o, lse, scale, causal))
            launch = fwd.attn_fwd if mode == "fwd" else bwd.attn_bwd
            fn = _rotating(lambda *a, launch=launch: launch(*a, config=cfg), sets)
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


def run_cudnn(head_dim: int, seqlens: list[int]) -> list[dict]:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    rows = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (False, True):
        for seqlen in seqlens:
            batch, heads = 16384 // seqlen, 2048 // head_dim
            shape = (batch, heads, seqlen, head_dim)
            sets = [
                [
                    torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(4)
                ]
                for _ in range(ROTATION)
            ]
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fwd_fn = _rotating(lambda q, k, v, do, causal=causal: sdpa(q, k, v, is_causal=causal), sets)
                ms_f = do_bench(fwd_fn, warmup=50, rep=300, return_mode="median")
                outs = [(sdpa(q, k, v, is_causal=causal), do) for q, k, v, do in sets]
                bwd_fn = _rotating(lambda o, do: o.backward(do, retain_graph=True), outs)
                ms_b = do_bench(bwd_fn, warmup=50, rep=300, return_mode="median")
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
    parser.add_argument("--one", help="internal: one variant as JSON")
    parser.add_argument("--csv", default="sweep.csv")
    parser.add_argument("--only", choices=["fwd", "bwd"], default=None)
    parser.add_argument("--head-dim", type=int, choices=sorted(FWD_CONFIGS), default=128)
    parser.add_argument("--bwd-configs", type=json.loads, help="JSON list of backward configs to try instead")
    parser.add_argument("--fwd-configs", type=json.loads, help="JSON list of forward configs to try instead")
    parser.add_argument("--seqlens", type=json.loads, help="JSON list of sequence lengths (16k, 4k, 1k)")
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        rows = run_cudnn(spec["head_dim"], spec["seqlens"]) if spec["mode"] == "cudnn" else run_one(spec)
        print("ROWS " + json.dumps(rows), flush=True)
        return
    d = args.head_dim
    seqlens = args.seqlens or list(SEQLENS)
    specs = [] if args.bwd_configs or args.fwd_configs else [{"mode": "cudnn", "head_dim": d}]
    if args.only in (None, "fwd"):
        fwd_configs = args.fwd_configs or FWD_CONFIGS[d]
        specs += [{"mode": "fwd", "cfg": list(c), "head_dim": d} for c in fwd_configs]
    if args.only in (None, "bwd"):
        bwd_configs = args.bwd_configs or BWD_CONFIGS[d]
        specs += [{"mode": "bwd", "cfg": list(c), "head_dim": d} for c in bwd_configs]
    specs = [{**spec, "seqlens": seqlens} for spec in specs]
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
                f"{r['mode']:4} {r['cfg']:40} {cell} {r['tflops']:7.1f} TFLOP/s  err={r['max_err']:.2e}",
                flush=True,
            )
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(all_rows[0]))
        writer.writeheader()
        writer.writerows(all_rows)


if __name__ == "__main__":
    main()
