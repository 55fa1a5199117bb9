"""The Triton kernels against the float64 oracle under flash-attention's 2×/3× rule.

On the CPU they run in Triton's interpreter (fp16 and fp32, small shapes); with ``pytest -m gpu`` the
same checks run compiled on the GPU in fp16 and bf16 up to N = 4096 and D = 256.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd
from flashtile.reference import naive
from tests.helpers import HEAD_LAYOUTS, assert_matches_oracle

CPU_SEQLENS = [(1, 1), (17, 17), (113, 203), (203, 113), (128, 128), (129, 129)]
CPU_HEAD_DIMS = [32, 59, 64, 128]
GPU_SEQLENS = [(1, 1), (17, 17), (113, 203), (203, 113), (128, 128), (129, 129)]
GPU_HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 256]
# Long sequences on fewer head dims: each head dim is a separate compile.
GPU_LONG_SEQLENS = [(1023, 1025), (4096, 4096)]
GPU_LONG_HEAD_DIMS = [59, 128, 256]


def _cases(where, seqlens, head_dims, dtypes, marks=()):
    """Every (seqlen, head dim, causal, dtype) with the head layout rotating so each meets every size."""
    layouts = itertools.cycle(HEAD_LAYOUTS)
    for (sq, sk), d, causal, dtype in itertools.product(seqlens, head_dims, (False, True), dtypes):
        layout = next(layouts)
        mask = "causal" if causal else "full"
        name = f"{where}-{sq}x{sk}-d{d}-{layout}-{mask}-{str(dtype).removeprefix('torch.')}"
        yield pytest.param(sq, sk, d, layout, causal, dtype, id=name, marks=marks)


GPU_DTYPES = (torch.float16, torch.bfloat16)
CASES = [
    *_cases("cpu", CPU_SEQLENS, CPU_HEAD_DIMS, (torch.float16, torch.float32)),
    *_cases("gpu", GPU_SEQLENS, GPU_HEAD_DIMS, GPU_DTYPES, marks=(pytest.mark.gpu,)),
    *_cases("gpu", GPU_LONG_SEQLENS, GPU_LONG_HEAD_DIMS, GPU_DTYPES, marks=(pytest.mark.gpu,)),
]


def _device(marks_gpu: bool) -> torch.device:
    return torch.device("cuda" if marks_gpu else "cpu")


@pytest.mark.parametrize(("seqlen_q", "seqlen_k", "head_dim", "layout", "causal", "dtype"), CASES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_fwd_bwd_match_oracle(request, seed, seqlen_q, seqlen_k, head_dim, layout, causal, dtype):
    device = _device(request.node.get_closest_marker("gpu") is not None)
    heads, heads_kv = HEAD_LAYOUTS[layout]
    batch = 2 if seqlen_q * seqlen_k <= 128 * 256 or device.type == "cuda" else 1
    q = torch.randn(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, dtype=dtype, device=device)
    dout = torch.randn_like(q)
    scale = head_dim**-0.5

    out, lse = attn_fwd(q, k, v, scale, causal)
    dq, dk, dv = attn_bwd(dout, q, k, v, out, lse, scale, causal)

    def run_naive(dt: torch.dtype):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, lse_ref = naive.attention(*leaves, softmax_scale=scale, causal=causal)
        o.backward(dout.to(dt))
        return o, lse_ref, *(t.grad for t in leaves)

    oracle = run_naive(torch.float64)
    baseline = run_naive(dtype)
    names = ("out", "lse", "dq", "dk", "dv")
    for name, ours, ref, base in zip(names, (out, lse, dq, dk, dv), oracle, baseline, strict=True):
        assert ours.dtype == (torch.float32 if name == "lse" else dtype), name
        assert_matches_oracle(name, ours, ref, base, grad=name.startswith("d"), seed=seed)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fully_masked_rows_give_zero_output_and_minus_inf_lse(device, seed, nan_poisoned_allocations):
    # Causal with N_q > N_k: the first N_q − N_k query rows see no key at all.
    q = torch.randn(1, 70, 2, 32, dtype=torch.float16, device=device)
    k, v = (torch.randn(1, 20, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    out, lse = attn_fwd(q, k, v, 0.2, True)
    assert torch.equal(out[:, :50], torch.zeros_like(out[:, :50]))
    assert torch.isneginf(lse[:, :, :50]).all()
    assert torch.isfinite(lse[:, :, 50:]).all()
    grads = attn_bwd(torch.randn_like(q), q, k, v, out, lse, 0.2, True)
    assert all(torch.isfinite(g).all() for g in grads)
    assert torch.equal(grads[0][:, :50], torch.zeros_like(grads[0][:, :50]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_strided_and_unaligned_inputs(device, seed, nan_poisoned_allocations):
    # A packed qkv view with an odd head dim and a transposed layout: the launcher copies what TMA can't read.
    qkv = torch.randn(2, 45, 3, 2, 40, dtype=torch.float16, device=device)
    q, k, v = qkv.unbind(2)
    k_t = k.transpose(1, 2).contiguous().transpose(1, 2)
    out, lse = attn_fwd(q, k_t, v, 0.15, False)
    ref_out, ref_lse = naive.attention(*(t.double() for t in (q, k, v)), softmax_scale=0.15)
    base_out, base_lse = naive.attention(q, k, v, softmax_scale=0.15)
    assert_matches_oracle("out", out, ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, ref_lse, base_lse, seed=seed)


@pytest.mark.gpu
def test_backward_is_deterministic(seed):
    q, k, v, dout = (torch.randn(2, 1000, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    k, v = k[:, :, :2], v[:, :, :2]
    out, lse = attn_fwd(q, k, v, 128**-0.5, True)
    first = attn_bwd(dout, q, k, v, out, lse, 128**-0.5, True)
    for _ in range(50):
        again = attn_bwd(dout, q, k, v, out, lse, 128**-0.5, True)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


@pytest.mark.gpu
def test_forward_is_race_free_at_large_batch(seed):
    q, k, v = (torch.randn(64, 257, 4, 64, dtype=torch.float16, device="cuda") for _ in range(3))
    first, _ = attn_fwd(q, k, v, 0.125, True)
    for _ in range(200):
        assert torch.equal(attn_fwd(q, k, v, 0.125, True)[0], first)


@pytest.mark.parametrize("scale", [-0.3, 0.0, 2.5])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_any_finite_softmax_scale(device, scale, seed):
    q, dout = (torch.randn(1, 50, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    k, v = (torch.randn(1, 70, 1, 32, dtype=torch.float16, device=device) for _ in range(2))
    out, lse = attn_fwd(q, k, v, scale, True)
    grads = attn_bwd(dout, q, k, v, out, lse, scale, True)

    def run_naive(dt: torch.dtype):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, lse_ref = naive.attention(*leaves, softmax_scale=scale, causal=True)
        o.backward(dout.to(dt))
        return o, lse_ref, *(t.grad for t in leaves)

    for name, ours, ref, base in zip(
        ("out", "lse", "dq", "dk", "dv"),
        (out, lse, *grads),
        run_naive(torch.float64),
        run_naive(q.dtype),
        strict=True,
    ):
        assert_matches_oracle(name, ours, ref, base, grad=name.startswith("d"), seed=seed)


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_fp16_kernels_round_p_and_ds_to_fp16_before_their_dots(seed):
    # Regression: under the interpreter fp16 dot operands were upcast to fp32, so CPU runs never saw the
    # fp16 rounding of P and dS that the GPU does, and matched the fp32 kernels bit for bit.
    q, k, v, dout = (torch.randn(1, 64, 2, 32, dtype=torch.float16) for _ in range(4))
    out, lse = attn_fwd(q, k, v, 0.2, False)
    grads = attn_bwd(dout, q, k, v, out, lse, 0.2, False)
    wide = [t.float() for t in (q, k, v, dout, out)]
    out_fp32, _ = attn_fwd(*wide[:3], 0.2, False)
    # The same O and LSE in: only P and dS rounding can set the gradients apart.
    grads_fp32 = attn_bwd(wide[3], *wide[:3], wide[4], lse, 0.2, False)
    for name, ours, fp32 in zip(
        ("out", "dq", "dk", "dv"), (out, *grads), (out_fp32, *grads_fp32), strict=True
    ):
        assert not torch.equal(ours, fp32.half()), (
            f"{name}: fp16 kernel equals the fp32 one rounded (seed {seed})"
        )


def test_a_triton_allocator_installed_by_the_caller_survives_a_launch(seed):
    # Regression: every launch called triton.set_allocator, replacing the allocator another library set.
    import contextvars

    import triton
    from triton.runtime import _allocation  # Triton 3.6 has no public getter for the allocator

    def users_allocator(size: int, alignment: int, stream: int | None) -> torch.Tensor:
        return torch.empty(size, dtype=torch.int8)

    def call_flashtile() -> None:
        triton.set_allocator(users_allocator)
        q = torch.randn(1, 17, 2, 32, dtype=torch.float16)
        out, lse = attn_fwd(q, q, q, 0.2, True)
        attn_bwd(q, q, q, q, out, lse, 0.2, True)
        assert _allocation._allocator.get() is users_allocator

    # A copy of the context keeps this test's allocator from leaking into the rest of the session.
    contextvars.copy_context().run(call_flashtile)
