"""The Hopper (Gluon) forward on a GPU of compute capability 9.x against the float64 oracle (2× rule), and the
backend rule choosing it. Skipped elsewhere: Gluon does not run in Triton's interpreter (CPU CI
compiles it instead, tests/test_kernels_hopper_sm90.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from flashtile import backend, flash_attn_func
from flashtile.errors import FlashtileValueError
from flashtile.kernels import configs
from flashtile.reference import naive
from tests.helpers import HEAD_LAYOUTS, assert_matches_oracle

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    reason = backend.hopper_unavailable_reason(torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)


def _fwd(*args, **kwargs):
    from flashtile.kernels.hopper.fwd import attn_fwd

    return attn_fwd(*args, **kwargs)


SEQLENS = [(1, 1), (17, 17), (63, 64), (113, 203), (203, 113), (128, 128), (129, 255), (1023, 1025)]


def _cases():
    layouts = itertools.cycle(HEAD_LAYOUTS)
    for (sq, sk), d, causal, dtype in itertools.product(
        SEQLENS, configs.HOPPER_FWD_HEAD_DIMS, (False, True), (torch.float16, torch.bfloat16)
    ):
        layout = next(layouts)
        name = f"{sq}x{sk}-d{d}-{layout}-{'causal' if causal else 'full'}-{str(dtype).removeprefix('torch.')}"
        yield pytest.param(sq, sk, d, layout, causal, dtype, id=name)


def _check_against_oracle(q, k, v, scale, causal, seed, **kwargs):
    out, lse = _fwd(q, k, v, scale, causal, **kwargs)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    ref_out, ref_lse = naive.attention(*(t.double() for t in (q, k, v)), softmax_scale=scale, causal=causal)
    base_out, base_lse = naive.attention(q, k, v, softmax_scale=scale, causal=causal)
    assert_matches_oracle("out", out, ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, ref_lse, base_lse, seed=seed)


@pytest.mark.parametrize(("seqlen_q", "seqlen_k", "head_dim", "layout", "causal", "dtype"), list(_cases()))
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_gluon_fwd_matches_oracle(seed, seqlen_q, seqlen_k, head_dim, layout, causal, dtype):
    heads, heads_kv = HEAD_LAYOUTS[layout]
    q = torch.randn(2, seqlen_q, heads, head_dim, dtype=dtype, device="cuda")
    k, v = (torch.randn(2, seqlen_k, heads_kv, head_dim, dtype=dtype, device="cuda") for _ in range(2))
    _check_against_oracle(q, k, v, head_dim**-0.5, causal, seed)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_three_stage_ring_matches_oracle(seed, head_dim, causal):
    # A deeper K/V ring (the benchmarked alternative of docs/design/hopper.md) keeps the barrier phases right.
    q = torch.randn(2, 700, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 901, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    config = configs.HopperFwdConfig(BLOCK_N=128, STAGES=3)
    _check_against_oracle(q, k, v, head_dim**-0.5, causal, seed, config=config)


@pytest.mark.parametrize("head_dim", configs.HOPPER_FWD_HEAD_DIMS)
def test_fully_masked_rows_give_zero_output_and_minus_inf_lse(seed, head_dim, nan_poisoned_allocations):
    # Causal with N_q > N_k (bottom-right): the first N_q − N_k = 200 rows see no key.
    q = torch.randn(2, 300, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 100, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out, lse = _fwd(q, k, v, 0.1, True)
    assert torch.equal(out[:, :200], torch.zeros_like(out[:, :200]))
    assert torch.isneginf(lse[:, :, :200]).all()
    assert torch.isfinite(lse[:, :, 200:]).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("head_dim", configs.HOPPER_FWD_HEAD_DIMS)
def test_nan_in_another_batch_or_head_does_not_leak(seed, head_dim, nan_poisoned_allocations):
    # 77 keys: the last K/V tile runs past the sequence, into batch 1's rows in memory.
    q = torch.randn(2, 100, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 77, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    k[1], v[1] = float("nan"), float("nan")
    # KV head 1 serves query heads 2 and 3 only.
    k[0, :, 1], v[0, :, 1] = float("nan"), float("nan")
    out, lse = _fwd(q, k, v, head_dim**-0.5, False)
    clean = (q[:1, :, :2], k[:1, :, :1], v[:1, :, :1])
    ref_out, ref_lse = naive.attention(*(t.double() for t in clean))
    base_out, base_lse = naive.attention(*clean)
    assert_matches_oracle("out", out[:1, :, :2], ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse[:1, :2], ref_lse, base_lse, seed=seed)


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_strided_views_and_scales(seed):
    # A packed qkv view and a transposed (B, H, N, D) layout are read in place through the 4-D descriptors.
    qkv = torch.randn(2, 150, 3, 4, 64, dtype=torch.float16, device="cuda")
    q, k, v = qkv.unbind(2)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)
    for scale in (0.125, -0.3, 0.0):
        _check_against_oracle(q, k, v, scale, True, seed)


def test_forward_is_race_free_at_large_batch(seed):
    q, k, v = (torch.randn(64, 257, 4, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    first, _ = _fwd(q, k, v, 0.125, True)
    for _ in range(100):
        again, _ = _fwd(q, k, v, 0.125, True)
        assert torch.equal(first, again)


def test_auto_dispatch_on_the_gpu(seed, monkeypatch):
    from flashtile.kernels.hopper import fwd as hopper_fwd

    calls = []
    real = hopper_fwd.attn_fwd

    def spy(*args, **kwargs):
        calls.append(args[4])
        return real(*args, **kwargs)

    monkeypatch.setattr(hopper_fwd, "attn_fwd", spy)
    assert backend.resolve(torch.device("cuda")) == "hopper"
    q = torch.randn(2, 333, 8, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(2, 444, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    for t in (k, v):
        t.requires_grad_()
    out = flash_attn_func(q, k, v, causal=True)
    assert calls == [True]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    def run_naive(dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = naive.attention(*leaves, causal=True)
        return (o, *torch.autograd.grad(o, leaves, dout.to(dtype)))

    oracle, baseline = run_naive(torch.float64), run_naive(torch.bfloat16)
    for name, ours, ref, base in zip(("out", "dq", "dk", "dv"), (out, *grads), oracle, baseline, strict=True):
        assert_matches_oracle(name, ours, ref, base, grad=name != "out", seed=seed)

    # Softcap is not in the fast path: auto runs it in the portable kernels, a forced hopper backend refuses.
    flash_attn_func(q, k, v, softcap=10.0)
    assert calls == [True]
    monkeypatch.setenv(backend.ENV_VAR, "hopper")
    with pytest.raises(FlashtileValueError, match="FLASHTILE_BACKEND=hopper was asked for but softcap"):
        flash_attn_func(q, k, v, softcap=10.0)
