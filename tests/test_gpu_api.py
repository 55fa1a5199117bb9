"""The public API on a CUDA device: the same checks as on the CPU, through the compiled Triton kernels."""

from __future__ import annotations

import pytest
import torch

from flashtile import FlashAttention, flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from flashtile.reference import naive
from tests.helpers import assert_matches_oracle

pytestmark = pytest.mark.gpu

API_CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal)
    pytest.param(2, 113, 203, 8, 2, 64, True, id="gqa-causal-113x203"),
    pytest.param(1, 1025, 1023, 4, 1, 128, False, id="mqa-1025x1023"),
    pytest.param(1, 4096, 4096, 4, 4, 256, True, id="mha-causal-4096-d256"),
    pytest.param(3, 77, 77, 6, 3, 80, False, id="gqa-77-d80"),
]


def _oracle_and_baseline(q, k, v, dout, causal):
    results = []
    for dtype in (torch.float64, q.dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, lse = naive.attention(*leaves, causal=causal)
        out.backward(dout.to(dtype))
        results.append((out, lse, *(t.grad for t in leaves)))
    return results


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "head_dim", "causal"), API_CASES
)
def test_flash_attn_func_matches_oracle(
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, dtype, seed
):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (
        torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype, requires_grad=True)
        for _ in range(2)
    )
    dout = torch.randn_like(q)
    out = flash_attn_func(q, k, v, causal=causal)
    _, lse = torch.ops.flashtile.attn_fwd(
        q.detach(), k.detach(), v.detach(), head_dim**-0.5, causal, "triton"
    )
    out.backward(dout)
    oracle, baseline = _oracle_and_baseline(q, k, v, dout, causal)
    assert_matches_oracle("out", out, oracle[0], baseline[0], seed=seed)
    assert_matches_oracle("lse", lse, oracle[1], baseline[1], seed=seed)
    for name, t, ref, base in zip(("dq", "dk", "dv"), (q, k, v), oracle[2:], baseline[2:], strict=True):
        assert_matches_oracle(name, t.grad, ref, base, grad=True, seed=seed)


def test_packed_variants_match_unpacked(seed):
    qkv = torch.randn(2, 129, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out_packed = flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = qkv.detach().unbind(2)
    assert torch.equal(out_packed, flash_attn_func(q, k, v, causal=True))
    kv = torch.stack((k[:, :, :2], v[:, :, :2]), dim=2).requires_grad_()
    out_kv = flash_attn_kvpacked_func(q, kv, causal=True)
    assert torch.equal(out_kv, flash_attn_func(q, k[:, :, :2], v[:, :, :2], causal=True))
    (out_packed.sum() + out_kv.sum()).backward()
    assert torch.isfinite(qkv.grad).all() and torch.isfinite(kv.grad).all()


def test_compile_fullgraph_matches_eager(seed):
    q, k, v = (
        torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3)
    )

    def attend(q, k, v):
        return flash_attn_func(q, k, v, causal=True) * 2.0

    torch.compiler.reset()
    compiled = torch.compile(attend, fullgraph=True)
    eager_out = attend(q, k, v)
    eager_grads = torch.autograd.grad(eager_out.sum(), (q, k, v))
    compiled_out = compiled(q, k, v)
    compiled_grads = torch.autograd.grad(compiled_out.sum(), (q, k, v))
    assert torch.equal(compiled_out, eager_out)
    assert all(torch.equal(a, b) for a, b in zip(compiled_grads, eager_grads, strict=True))


def test_opcheck_triton_backend(seed):
    q, k, v = (torch.randn(1, 70, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch.library.opcheck(torch.ops.flashtile.attn_fwd.default, (q, k, v, 0.125, True, "triton"))
    out, lse = torch.ops.flashtile.attn_fwd(q, k, v, 0.125, True, "triton")
    args = (torch.randn_like(out), q, k, v, out, lse, 0.125, True, "triton")
    torch.library.opcheck(torch.ops.flashtile.attn_bwd.default, args)


def test_module_runs_on_gpu(seed):
    layer = FlashAttention(256, num_heads=4, num_kv_heads=2, causal=True, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 100, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    y.float().square().mean().backward()
    assert y.shape == x.shape and torch.isfinite(x.grad).all()
