"""Where the causal backward loses against the non-causal one, on one H100/H200: kernel times.

`bench --paper` reads the Gluon backward at D = 256 at 1.05–1.11× cuDNN without a mask and 0.83–0.89× causal
(H100, twentieth session): the causal call takes 0.62 of the non-causal call's time where half the work would
take about 0.5. This times, kernel by kernel (torch.profiler, no host time), the backward through
``ops.run_attn_bwd`` causal and not, with the dQ reduce-add in the fused kernel and with
``deterministic=True`` (dQ in a kernel of its own, so the fused kernel's own causal ratio shows without the
reduce), and SDPA's cuDNN backward on the same inputs. bf16, B·N = 16k tokens, H·D = 2048; TFLOP/s count
2.5 · 4 · B · H · N² · D FLOPs, halved when causal, as the bench does. Rows go to --csv.

    PYTHONPATH=src python scripts/bwd_causal_gap.py [--head-dims 256] [--seqlens 4096 16384] [--reps 10]
        [--csv bwd_causal_gap.csv] [--label new]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from launch_overhead import kernel_times_us

from flashtile import ops
from flashtile.bench.results import append_rows

TOKENS, HIDDEN = 16384, 2048


def _inputs(seqlen: int, head_dim: int):
    shape = (TOKENS // seqlen, seqlen, HIDDEN // head_dim, head_dim)
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4)]


def _flashtile(q, k, v, dout, causal: bool, deterministic: bool):
    scale = q.shape[-1] ** -0.5
    right = 0 if causal else -1
    out, lse = ops.run_attn_fwd(q, k, v, scale, causal, "hopper", -1, right)
    return lambda: ops.run_attn_bwd(
        dout, q, k, v, out, lse, scale, causal, "hopper", -1, right, deterministic=deterministic
    )


def _cudnn(q, k, v, dout, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    grad = dout.transpose(1, 2)
    return lambda: torch.autograd.grad(out, (qt, kt, vt), grad, retain_graph=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[256])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--csv", default="bwd_causal_gap.csv")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}; label {args.label!r}")
    rows = []
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            q, k, v, dout = _inputs(seqlen, head_dim)
            totals = {}
            for causal in (False, True):
                cases = {
                    "reduce": _flashtile(q, k, v, dout, causal, False),
                    "deterministic": _flashtile(q, k, v, dout, causal, True),
                    "cudnn": _cudnn(q, k, v, dout, causal),
                }
                flops = 2.5 * 4 * q.shape[0] * q.shape[2] * seqlen * seqlen * head_dim / (2 if causal else 1)
                for name, fn in cases.items():
                    times = kernel_times_us(fn, args.reps, warmup=3)
                    total = sum(times.values())
                    totals[(name, causal)] = total
                    print(
                        f"D={head_dim} N={seqlen} causal={causal!s:5} {name:13s} {total:9.1f} µs "
                        f"{flops / total / 1e6:6.1f} TFLOP/s"
                    )
                    for kernel, us in sorted(times.items(), key=lambda kv: -kv[1]):
                        print(f"    {us:9.1f} µs  {kernel}")
                        rows.append(
                            dict(label=args.label, gpu=gpu, head_dim=head_dim, seqlen=seqlen, causal=causal,
                                 case=name, kernel=kernel, us=round(us, 2))
                        )  # fmt: skip
                    torch.cuda.empty_cache()
            for name in ("reduce", "deterministic", "cudnn"):
                ratio = totals[(name, True)] / totals[(name, False)]
                print(f"D={head_dim} N={seqlen} {name:13s} causal / non-causal time {ratio:.3f}")
    if rows:
        append_rows(Path(args.csv), rows, list(rows[0]))


if __name__ == "__main__":
    main()
