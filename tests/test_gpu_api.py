"""The public API on a CUDA device: the same checks as on the CPU, through the compiled Triton kernels."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from flashtile import (
    FlashAttention,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)
from flashtile.ops import RNG_BOUND
from flashtile.reference import naive
from tests.helpers import OptionCase, assert_matches_oracle
from tests.test_options_api import check_against_oracle, combinations, kept, make_call, run_flashtile

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

    # deterministic=True: the Hopper backward's default dQ (a TMA reduce-add) differs between two runs in
    # its last bits, so only the deterministic backward can be equal bit for bit.
    def attend(q, k, v):
        return flash_attn_func(q, k, v, causal=True, deterministic=True) * 2.0

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


def _option_cases() -> list:
    cases = []
    for dtype in (torch.float16, torch.bfloat16):
        gpu = dict(dtype=dtype, device="cuda")
        cases += [
            OptionCase(((1023, 1025),) * 2, window=(256, 0), head_dim=64, **gpu),
            OptionCase(((1025, 777),) * 2, window=(100, 31), softcap=30.0, alibi="bh", head_dim=128, **gpu),
            OptionCase(((777, 1025),) * 2, causal=True, alibi="h", dropout_p=0.1, head_dim=64, **gpu),
            OptionCase(((2048, 2048),), softcap=50.0, dropout_p=0.2, layout="mha", head_dim=128, **gpu),
            OptionCase(
                ((1000, 1200), (0, 9), (2048, 2048), (1, 1), (300, 0)), varlen=True, causal=True, **gpu
            ),
            OptionCase(
                ((513, 2000), (2000, 513)), varlen=True, window=(64, 64), dropout_p=0.1, alibi="bh", **gpu
            ),
            # Dropout where the Gluon kernels draw the mask (Hopper): forward and backward at D = 128, the
            # forward only at D = 256 (its backward is portable), the backward only at D = 96 (its forward is
            # portable), packed batches; either way both must draw the reference's mask.
            OptionCase(((1025, 777),) * 2, causal=True, dropout_p=0.15, head_dim=128, **gpu),
            OptionCase(((333, 1200),) * 2, window=(100, 7), dropout_p=0.3, head_dim=256, **gpu),
            OptionCase(((700, 513),) * 2, dropout_p=0.1, head_dim=96, layout="mqa", **gpu),
            OptionCase(
                ((1000, 1200), (0, 9), (517, 300), (1, 1)),
                varlen=True,
                causal=True,
                dropout_p=0.2,
                head_dim=128,
                **gpu,
            ),
        ]
    return [pytest.param(c, id=c.id) for c in cases + combinations(8, random.Random(8))]


def _on_cuda(case: OptionCase) -> OptionCase:
    return replace(case, device="cuda")


@pytest.mark.parametrize("case", _option_cases())
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_options_match_oracle(case, seed):
    check_against_oracle(_on_cuda(case), seed)


def test_dropout_same_seed_is_bitwise_and_mask_matches_reference(seed):
    case = OptionCase(((300, 400),) * 2, dropout_p=0.3, window=(64, 8), alibi="h", device="cuda")
    call = make_call(case)
    runs = []
    for _ in range(2):
        torch.manual_seed(seed)
        runs.append(run_flashtile(call))
    for name in ("out", "lse", "dq", "dk", "dv", "s_dmask"):
        assert torch.equal(runs[0][name], runs[1][name]), name
    torch.manual_seed(seed)
    rng_state = torch.randint(0, RNG_BOUND, (2,), dtype=torch.int64, device="cuda")
    assert torch.equal(kept(runs[0]["s_dmask"]), naive.dropout_mask(rng_state, 0.3, 2, 4, 300, 400))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropped_fraction_is_p(p, seed):
    q = torch.randn(2, 512, 4, 64, device="cuda", dtype=torch.float16) * 0.1
    _, _, s_dmask = flash_attn_func(q, q, q, dropout_p=p, return_attn_probs=True)
    assert abs(torch.signbit(s_dmask).double().mean().item() - p) < 0.01


def test_deterministic_gradients_bitwise_over_50_runs(seed):
    case = OptionCase(((1000, 1000),), dropout_p=0.1, window=(128, 0), alibi="bh", head_dim=64, device="cuda")
    call = make_call(case)
    first = None
    for _ in range(50):
        torch.manual_seed(seed)
        run = run_flashtile(call, deterministic=True)
        grads = [run[name] for name in ("dq", "dk", "dv")]
        first = first or grads
        assert all(torch.equal(a, b) for a, b in zip(first, grads, strict=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_varlen_equals_per_sequence_bitwise_forward(dtype, seed):
    case = OptionCase(
        ((1000, 1200), (0, 9), (513, 513), (1, 1), (300, 0)), varlen=True, window=(64, 3), alibi="bh",
        softcap=20.0, dtype=dtype, device="cuda",
    )  # fmt: skip
    call = make_call(case)
    cu_q, cu_k = (t.tolist() for t in call.varlen[:2])
    out, lse, _ = flash_attn_varlen_func(
        call.q, call.k, call.v, *call.varlen, return_attn_probs=True, **call.options
    )
    for b in range(len(case.seqlens)):
        (q0, q1), (k0, k1) = cu_q[b : b + 2], cu_k[b : b + 2]
        options = dict(call.options, alibi_slopes=call.options["alibi_slopes"][b : b + 1])
        expected, expected_lse, _ = flash_attn_func(
            call.q[None, q0:q1], call.k[None, k0:k1], call.v[None, k0:k1], return_attn_probs=True, **options
        )
        assert torch.equal(out[q0:q1], expected[0]), b
        assert torch.equal(lse[:, q0:q1], expected_lse[0]), b


def test_varlen_values_checked_on_cuda_only_in_debug(monkeypatch: pytest.MonkeyPatch):
    q = torch.randn(9, 2, 64, device="cuda", dtype=torch.float16)
    bad = torch.tensor([0, 5, 3], dtype=torch.int32, device="cuda")
    monkeypatch.setenv("FLASHTILE_DEBUG", "1")
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        flash_attn_varlen_func(q, q, q, bad, bad, 5, 5)
    monkeypatch.delenv("FLASHTILE_DEBUG")
    # No host synchronisation by default: the call runs (on clamped boundaries) and stays in bounds.
    flash_attn_varlen_func(q, q, q, bad, bad, 5, 5)
    torch.cuda.synchronize()


def test_compile_with_options_matches_eager(seed):
    q, k, v = (
        torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3)
    )
    slopes = torch.rand(4, device="cuda")

    def attend(q, k, v):
        return flash_attn_func(q, k, v, window_size=(64, 0), softcap=30.0, alibi_slopes=slopes)

    torch.compiler.reset()
    compiled = torch.compile(attend, fullgraph=True)
    assert torch.equal(compiled(q, k, v), attend(q, k, v))
