"""How accurate each way of forming a learnable sink's gradient is, emulated on the CPU at long causal rows.

dσ_h = −Σ_i P_sink,i · Δ_i with Δ_i = Σ_j P_ij·dP_ij. The script compares, against the float64 oracle
and under the tests' 3× rule (PyTorch's own error in the low precision, by autograd through the naive
reference), four ways a kernel could form it:

- ``fused``: Σ_j P·dP in fp32 over the backward's tiles (what the kernels do today);
- ``stored-O``: Δ_i = dO_i · O_i from the stored output (docs/design/sinks.md, "Which Δ": fails);
- ``ds-rowsum``: Δ_i = Σ_j dS_ij + D_i·(1 − P_sink,i), where D_i = dO_i · O_i is the preprocess's Δ, dS
  is rounded to the input dtype as the dK product takes it, and Σ_i P_sink,i · Σ_j dS_ij is what one more
  product of the dK step with a column of P_sink (rounded to the input dtype) would give: the error of
  D_i cancels between the two terms, since Σ_j P_ij = 1 − P_sink,i;
- ``ds-rowsum-hilo``: the same with dS and P_sink each split into two input-dtype parts (hi = round(x),
  lo = round(x − hi)) and the three larger cross products summed, as two such products (A = dS's hi and
  lo parts, B = P_sink's hi and lo columns) would;
- ``ds-rowsum-fp32``: the same with dS and P_sink in fp32 (the rounding's share of the error).

Rows are taken in chunks of query rows with all the keys they see (bottom-right causal alignment keeps
each chunk's mask), so N = 16k fits in memory. The forward's output is emulated as the kernels form it:
P rounded to the input dtype before P·V, fp32 accumulation, O rounded at the end.

    python scripts/sink_grad_precision.py --seqlen 4096 16384 --head-dim 64 128
"""

from __future__ import annotations

import argparse
import math

import torch

from flashtile.reference import naive

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autograd_sink_grad(q, k, v, dout, sink, dtype, chunk):
    """dσ by autograd through the naive reference in ``dtype`` (float64: the oracle), chunk by chunk."""
    sink = sink.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
    n = q.shape[1]
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        out, _ = naive.attention(
            q[:, r0:r1].to(dtype), k[:, :r1].to(dtype), v[:, :r1].to(dtype), causal=True,
            learnable_sink=sink, softmax_scale=q.shape[-1] ** -0.5,
        )  # fmt: skip
        out.backward(dout[:, r0:r1].to(dtype))
    return sink.grad.double()


WAYS = ("fused", "stored-O", "ds-rowsum", "ds-rowsum-hilo", "ds-rowsum-fp32")


def hilo_weighted_sums(ds, p_sink, dtype):
    """Each row's P_sink · Σ_j dS from input-dtype hi/lo parts: hi·hi + hi·lo + lo·hi, in fp32 products."""
    ds_hi = ds.to(dtype).float()
    ds_lo = (ds - ds_hi).to(dtype).float()
    w_hi = p_sink.to(dtype).float()
    w_lo = (p_sink - w_hi).to(dtype).float()
    hi, lo = ds_hi.double().sum(-1), ds_lo.double().sum(-1)
    return w_hi.double() * (hi + lo) + w_lo.double() * hi


def emulated_sink_grads(q, k, v, dout, sink, dtype, chunk):
    """dσ by each of the ways above, the kernels' arithmetic emulated in fp32 (sums over rows in fp64)."""
    scale = q.shape[-1] ** -0.5
    n, heads = q.shape[1], q.shape[2]
    totals = {name: torch.zeros(heads, dtype=torch.float64) for name in WAYS}
    for r0 in range(0, n, chunk):
        r1 = min(n, r0 + chunk)
        qc, kc, vc = (t.float().transpose(1, 2)[0] for t in (q[:, r0:r1], k[:, :r1], v[:, :r1]))
        doc = dout[:, r0:r1].float().transpose(1, 2)[0]
        scores = qc @ kc.transpose(-1, -2) * scale
        rows = torch.arange(r0, r1)[:, None]
        scores = scores.masked_fill(torch.arange(r1)[None, :] > rows, -math.inf)
        sig = sink.float()[:, None, None]
        m = torch.maximum(scores.amax(-1, keepdim=True), sig)
        unnorm = torch.exp(scores - m)
        denom = unnorm.sum(-1, keepdim=True) + torch.exp(sig - m)
        lse = m + torch.log(denom)
        out = ((unnorm.to(dtype).float() @ vc) / denom).to(dtype).float()
        p = torch.exp(scores - lse)
        p_sink = torch.exp(sig - lse)[..., 0]
        dp = doc @ vc.transpose(-1, -2)
        delta = (doc * out).sum(-1)
        ds = p * (dp - delta[..., None])
        fused = (p * dp).sum(-1)
        sums = {
            "fused": p_sink.double() * fused.double(),
            "stored-O": p_sink.double() * delta.double(),
            "ds-rowsum": (
                p_sink.to(dtype).double() * ds.to(dtype).double().sum(-1)
                + (p_sink * delta * (1 - p_sink)).double()
            ),
            "ds-rowsum-hilo": hilo_weighted_sums(ds, p_sink, dtype)
            + (p_sink * delta * (1 - p_sink)).double(),
            "ds-rowsum-fp32": (
                p_sink.double() * ds.double().sum(-1) + (p_sink * delta * (1 - p_sink)).double()
            ),
        }
        for name, per_row in sums.items():
            totals[name] -= per_row.sum(-1)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seqlen", type=int, nargs="+", default=[4096])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = DTYPES[args.dtype]
    print("N, D, way: max |error| over the heads, and its ratio to PyTorch's (the rule allows 3)")
    for n in args.seqlen:
        for d in args.head_dim:
            torch.manual_seed(args.seed)
            q, k, v, dout = (torch.randn(1, n, args.heads, d).to(dtype) for _ in range(4))
            sink = torch.randn(args.heads, dtype=torch.float64)
            oracle = autograd_sink_grad(q, k, v, dout, sink, torch.float64, args.chunk)
            baseline = (autograd_sink_grad(q, k, v, dout, sink, dtype, args.chunk) - oracle).abs().max()
            print(f"{n}, {d}: oracle {oracle.abs().max():.3e}, PyTorch {args.dtype} error {baseline:.3e}")
            for name, got in emulated_sink_grads(q, k, v, dout, sink, dtype, args.chunk).items():
                err = (got - oracle).abs().max()
                print(f"  {name:15s} {err:.3e}  {err / baseline:6.2f}×")


if __name__ == "__main__":
    main()
