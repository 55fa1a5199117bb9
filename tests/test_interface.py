"""The public API against the float64 reference: flash_attn_func, packed variants, edge cases, autograd."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import triton
import triton.language as tl

import flashtile
from flashtile import (
    FlashAttention,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    validation,
)
from flashtile.autograd import DOUBLE_BACKWARD_MESSAGE
from flashtile.mods import Mods
from flashtile.reference import naive, tiled
from flashtile.validation import check_softmax_scale
from tests.helpers import assert_matches_oracle, stored_output_floor

_NAMES = ("out", "lse", "dq", "dk", "dv")


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    head_dim: int

    def __str__(self) -> str:
        return (
            f"B{self.batch}-N{self.seqlen_q}x{self.seqlen_k}-H{self.nheads}x{self.nheads_kv}-D{self.head_dim}"
        )


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _inputs(shape: Shape, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    q = torch.randn(shape.batch, shape.seqlen_q, shape.nheads, shape.head_dim, dtype=dtype)
    k = torch.randn(shape.batch, shape.seqlen_k, shape.nheads_kv, shape.head_dim, dtype=dtype)
    v = torch.randn(shape.batch, shape.seqlen_k, shape.nheads_kv, shape.head_dim, dtype=dtype)
    dout = torch.randn(shape.batch, shape.seqlen_q, shape.nheads, shape.head_dim, dtype=dtype)
    return q, k, v, dout


def _run(fn: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> dict:
    """``fn(q, k, v) -> (out, lse)`` on fresh leaves, and the gradients of ``(out · dout).sum()``."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _naive(softmax_scale: float | None, causal: bool) -> Callable:
    return lambda q, k, v: naive.attention(q, k, v, softmax_scale=softmax_scale, causal=causal)


def _flash(softmax_scale: float | None, causal: bool) -> Callable:
    def fn(q, k, v):
        out, lse, _ = flash_attn_func(
            q, k, v, softmax_scale=softmax_scale, causal=causal, return_attn_probs=True
        )
        return out, lse

    return fn


def _check_against_oracle(
    fn: Callable, q, k, v, dout, *, softmax_scale: float | None, causal: bool, seed: int
) -> dict:
    """Run ``fn`` and assert out, lse, dq, dk, dv follow the rule against the float64 reference."""
    ours = _run(fn, q, k, v, dout)
    oracle = _run(_naive(softmax_scale, causal), *(t.double() for t in (q, k, v, dout)))
    baseline = _run(_naive(softmax_scale, causal), q, k, v, dout)
    scale = check_softmax_scale(softmax_scale, q.shape[-1])
    exact = stored_output_floor(dout, q, k, v, ours["out"], oracle["lse"], scale, causal)
    floors = dict(zip(("dq", "dk", "dv"), exact, strict=True))
    for name in _NAMES:
        assert_matches_oracle(
            name,
            ours[name],
            oracle[name],
            baseline[name],
            grad=name[0] == "d",
            seed=seed,
            floor=floors.get(name),
        )
    assert ours["out"].dtype == q.dtype and ours["lse"].dtype == torch.float32
    assert ours["out"].is_contiguous()
    return ours


REFERENCE_SHAPES = [
    Shape(1, 1, 1, 1, 1, 32),
    Shape(2, 17, 17, 4, 4, 64),
    Shape(2, 113, 203, 4, 2, 40),
    Shape(1, 203, 113, 4, 1, 59),
    Shape(1, 65, 129, 2, 2, 128),
    Shape(1, 9, 7, 2, 1, 256),
]


@pytest.mark.usefixtures("nan_poisoned_allocations")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", REFERENCE_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=_dtype_id)
def test_flash_attn_func_reference_backend(shape: Shape, dtype: torch.dtype, causal: bool, seed: int) -> None:
    q, k, v, dout = _inputs(shape, dtype)
    _check_against_oracle(_flash(None, causal), q, k, v, dout, softmax_scale=None, causal=causal, seed=seed)


TRITON_SHAPES = [
    Shape(1, 1, 1, 1, 1, 16),
    Shape(2, 17, 17, 2, 2, 32),
    Shape(1, 33, 20, 4, 2, 40),
    Shape(1, 20, 45, 4, 1, 64),
]


@pytest.fixture
def triton_backend(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Select the Triton backend (run by the interpreter) and count the launcher calls."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton backend on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    launches: Counter = Counter()
    for module_name, launcher in (
        ("flashtile.kernels.fwd", "attn_fwd"),
        ("flashtile.kernels.bwd", "attn_bwd"),
    ):
        module = importlib.import_module(module_name)
        original = getattr(module, launcher)

        def counted(*args, _original=original, _name=launcher, **kwargs):
            launches[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, launcher, counted)
    return launches


@pytest.mark.usefixtures("nan_poisoned_allocations")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", TRITON_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=_dtype_id)
def test_flash_attn_func_triton_interpreter(
    shape: Shape, dtype: torch.dtype, causal: bool, seed: int, triton_backend: Counter
) -> None:
    q, k, v, dout = _inputs(shape, dtype)
    _check_against_oracle(_flash(None, causal), q, k, v, dout, softmax_scale=None, causal=causal, seed=seed)
    assert triton_backend == {"attn_fwd": 1, "attn_bwd": 1}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_qkvpacked_triton_interpreter(causal: bool, seed: int, triton_backend: Counter) -> None:
    q, k, v, dout = _inputs(Shape(2, 19, 19, 2, 2, 32), torch.float16)

    def fn(q, k, v):
        qkv = torch.stack((q, k, v), dim=2)
        out, lse, _ = flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True)
        return out, lse

    _check_against_oracle(fn, q, k, v, dout, softmax_scale=None, causal=causal, seed=seed)
    assert triton_backend == {"attn_fwd": 1, "attn_bwd": 1}


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_triton_interpreter_strided_layouts(seed: int, triton_backend: Counter) -> None:
    """Transposed q/k/v views, k and v from a packed kv, and a dout with a non-unit last stride."""
    q, k, v, _ = _inputs(Shape(2, 21, 30, 4, 2, 32), torch.float16)
    dout = torch.randn(2, 21, 32, 4, dtype=torch.float16).transpose(2, 3)

    def fn(q, k, v):
        q_view = q.transpose(1, 2).contiguous().transpose(1, 2)
        out, lse, _ = flash_attn_kvpacked_func(
            q_view, torch.stack((k, v), 2), causal=True, return_attn_probs=True
        )
        return out, lse

    _check_against_oracle(fn, q, k, v, dout, softmax_scale=None, causal=True, seed=seed)
    assert triton_backend == {"attn_fwd": 1, "attn_bwd": 1}


def test_triton_interpreter_no_keys(triton_backend: Counter) -> None:
    q, k, v, _ = _inputs(Shape(1, 4, 0, 2, 2, 16), torch.float16)
    q.requires_grad_()
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out)) and torch.all(torch.isneginf(lse))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q))
    assert not triton_backend


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=_dtype_id)
def test_qkvpacked_matches_oracle(dtype: torch.dtype, causal: bool, seed: int) -> None:
    q, k, v, dout = _inputs(Shape(2, 37, 37, 4, 4, 32), dtype)
    qkv = torch.stack((q, k, v), dim=2).requires_grad_()
    out, lse, _ = flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    assert dqkv.shape == qkv.shape
    ours = {"out": out, "lse": lse, "dq": dqkv[:, :, 0], "dk": dqkv[:, :, 1], "dv": dqkv[:, :, 2]}
    oracle = _run(_naive(None, causal), *(t.double() for t in (q, k, v, dout)))
    baseline = _run(_naive(None, causal), q, k, v, dout)
    for name in _NAMES:
        assert_matches_oracle(name, ours[name], oracle[name], baseline[name], grad=name[0] == "d", seed=seed)


@pytest.mark.parametrize("nheads_kv", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kvpacked_matches_oracle(nheads_kv: int, causal: bool, seed: int) -> None:
    q, k, v, dout = _inputs(Shape(2, 23, 41, 4, nheads_kv, 48), torch.float16)
    kv = torch.stack((k, v), dim=2).requires_grad_()
    qq = q.clone().requires_grad_()
    out, lse, _ = flash_attn_kvpacked_func(qq, kv, causal=causal, return_attn_probs=True)
    dq, dkv = torch.autograd.grad(out, (qq, kv), dout)
    assert dkv.shape == kv.shape
    ours = {"out": out, "lse": lse, "dq": dq, "dk": dkv[:, :, 0], "dv": dkv[:, :, 1]}
    oracle = _run(_naive(None, causal), *(t.double() for t in (q, k, v, dout)))
    baseline = _run(_naive(None, causal), q, k, v, dout)
    for name in _NAMES:
        assert_matches_oracle(name, ours[name], oracle[name], baseline[name], grad=name[0] == "d", seed=seed)


def test_packed_views_are_not_copied(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """The op receives strided views into qkv, not concatenated or contiguous copies."""
    qkv = torch.randn(2, 11, 3, 2, 16)
    seen = []
    original = tiled.attention_fwd

    def spy(q, k, v, *args, **kwargs):
        seen.extend((q, k, v))
        return original(q, k, v, *args, **kwargs)

    monkeypatch.setattr(tiled, "attention_fwd", spy)
    flash_attn_qkvpacked_func(qkv)
    assert all(t.data_ptr() == qkv[:, :, i].data_ptr() for i, t in enumerate(seen))
    assert not any(t.is_contiguous() for t in seen)


@pytest.mark.parametrize("func", ["flash_attn_func", "qkvpacked", "kvpacked"])
def test_return_attn_probs_without_dropout_gives_lse_and_empty_s_dmask(
    func: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: without dropout the N×N probabilities were built (32 GiB at N = 32k, H = 16); flash_attn
    # returns an empty S_dmask and callers use the flag to get the LSE.
    def no_probs(*args, **kwargs):
        raise AssertionError("the probability matrix was built without dropout")

    monkeypatch.setattr(naive, "attention_probs", no_probs)
    q, k, v, _ = _inputs(Shape(2, 13, 13, 4, 4, 32), torch.float16)
    q.requires_grad_()
    if func == "flash_attn_func":
        result = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    elif func == "qkvpacked":
        result = flash_attn_qkvpacked_func(torch.stack((q, k, v), 2), causal=True, return_attn_probs=True)
    else:
        result = flash_attn_kvpacked_func(q, torch.stack((k, v), 2), causal=True, return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 3
    out, lse, s_dmask = result
    assert out.shape == q.shape and lse.shape == (2, 4, 13) and lse.dtype == torch.float32
    assert not lse.requires_grad
    assert s_dmask.shape == (0,) and s_dmask.dtype == q.dtype and s_dmask.device == q.device
    _, oracle = naive.attention(q.double(), k.double(), v.double(), causal=True)
    _, baseline = naive.attention(q.detach(), k, v, causal=True)
    assert_matches_oracle("lse", lse, oracle, baseline, seed=seed)


def test_default_returns_only_out() -> None:
    q, k, v, _ = _inputs(Shape(1, 4, 4, 1, 1, 8), torch.float32)
    assert isinstance(flash_attn_func(q, k, v), torch.Tensor)
    assert isinstance(flash_attn_qkvpacked_func(torch.stack((q, k, v), 2)), torch.Tensor)
    assert isinstance(flash_attn_kvpacked_func(q, torch.stack((k, v), 2)), torch.Tensor)


@pytest.mark.parametrize("wanted", [("q",), ("k", "v"), ("v",), ("q", "k")], ids="+".join)
def test_gradients_for_only_some_inputs(wanted: tuple[str, ...], seed: int) -> None:
    q, k, v, dout = _inputs(Shape(2, 21, 30, 4, 2, 32), torch.float16)
    leaves = {"q": q, "k": k, "v": v}
    for name in wanted:
        leaves[name].requires_grad_()
    out = flash_attn_func(q, k, v, causal=True)
    out.backward(dout)
    oracle = _run(_naive(None, True), *(t.double() for t in (q, k, v, dout)))
    baseline = _run(_naive(None, True), q, k, v, dout)
    for name, leaf in leaves.items():
        if name in wanted:
            grad_name = f"d{name}"
            assert_matches_oracle(
                grad_name, leaf.grad, oracle[grad_name], baseline[grad_name], grad=True, seed=seed
            )
        else:
            assert leaf.grad is None


def test_backward_twice_with_retain_graph(seed: int) -> None:
    q, k, v, dout = (t.requires_grad_() for t in _inputs(Shape(1, 16, 16, 2, 2, 32), torch.float32))
    dout = dout.detach()
    out = flash_attn_func(q, k, v, causal=True)
    out.backward(dout, retain_graph=True)
    first = [t.grad.clone() for t in (q, k, v)]
    out.backward(dout)
    for t, once in zip((q, k, v), first, strict=True):
        torch.testing.assert_close(t.grad, 2 * once)


def test_double_backward_raises() -> None:
    q, k, v, _ = (t.requires_grad_() for t in _inputs(Shape(1, 8, 8, 2, 2, 16), torch.float32))
    out = flash_attn_func(q, k, v)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.sum().backward()
    assert "create_graph" in DOUBLE_BACKWARD_MESSAGE


def test_first_order_with_create_graph_is_unaffected(seed: int) -> None:
    q, k, v, _ = (t.requires_grad_() for t in _inputs(Shape(1, 8, 8, 2, 2, 16), torch.float32))
    out = flash_attn_func(q, k, v)
    (dq_graph,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    (dq_plain,) = torch.autograd.grad(flash_attn_func(q, k, v).sum(), q)
    torch.testing.assert_close(dq_graph.detach(), dq_plain, rtol=0, atol=0)


def test_torch_func_grad_matches_autograd(seed: int) -> None:
    # torch.func transforms need an autograd.Function with a separate setup_context.
    q, k, v, _ = _inputs(Shape(1, 7, 9, 4, 2, 16), torch.float32)
    sink = torch.randn(4)

    def loss(q: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
        return flash_attn_func(q, k, v, causal=True, softcap=2.0, learnable_sink=sink).square().sum()

    grads = torch.func.grad(loss, argnums=(0, 1))(q, sink)
    leaves = (q.clone().requires_grad_(), sink.clone().requires_grad_())
    for got, expected in zip(grads, torch.autograd.grad(loss(*leaves), leaves), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.func.grad(lambda q: torch.func.grad(loss)(q, sink).sum())(q)
    layer = FlashAttention(32, num_heads=4, num_kv_heads=2, causal=True)
    x = torch.randn(2, 5, 32)
    params = dict(layer.named_parameters())
    param_grads = torch.func.grad(lambda p: torch.func.functional_call(layer, p, (x,)).square().sum())(params)
    layer(x).square().sum().backward()
    for name, param in layer.named_parameters():
        torch.testing.assert_close(param_grads[name], param.grad, rtol=1e-6, atol=1e-6)


@pytest.fixture
def forbid_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty problems must be answered without reaching a backend."""

    def launch(*args, **kwargs):
        raise AssertionError("a backend was launched on an empty problem")

    monkeypatch.setattr(tiled, "attention_fwd", launch)
    monkeypatch.setattr(tiled, "attention_bwd", launch)


def test_empty_batch(forbid_launch: None) -> None:
    q, k, v, _ = (t.requires_grad_() for t in _inputs(Shape(0, 5, 7, 4, 2, 16), torch.float16))
    out, lse, probs = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == (0, 5, 4, 16) and lse.shape == (0, 4, 5) and probs.numel() == 0
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_no_queries(forbid_launch: None) -> None:
    q, k, v, _ = (t.requires_grad_() for t in _inputs(Shape(2, 0, 7, 4, 2, 16), torch.float16))
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 0, 4, 16) and lse.shape == (2, 4, 0)
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_no_keys_gives_zero_output_and_minus_inf_lse(forbid_launch: None, causal: bool) -> None:
    q, k, v, dout = _inputs(Shape(2, 5, 0, 4, 2, 16), torch.float32)
    q.requires_grad_()
    k.requires_grad_()
    v.requires_grad_()
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.all(torch.isneginf(lse)) and lse.shape == (2, 4, 5)
    assert probs.numel() == 0
    out.backward(dout)
    assert torch.equal(q.grad, torch.zeros_like(q))
    assert k.grad.shape == k.shape and v.grad.shape == v.shape


def test_fully_masked_rows(seed: int) -> None:
    """Causal with seqlen_q > seqlen_k: the first rows see no key (out 0, lse −inf, zero and finite grads)."""
    q, k, v, dout = _inputs(Shape(1, 12, 5, 2, 2, 16), torch.float32)
    ours = _check_against_oracle(
        _flash(None, True), q, k, v, dout, softmax_scale=None, causal=True, seed=seed
    )
    masked = 12 - 5
    assert torch.equal(ours["out"][:, :masked], torch.zeros_like(ours["out"][:, :masked]))
    assert torch.all(torch.isneginf(ours["lse"][:, :, :masked]))
    assert torch.all(torch.isfinite(ours["lse"][:, :, masked:]))
    assert torch.equal(ours["dq"][:, :masked], torch.zeros_like(ours["dq"][:, :masked]))
    for name in ("dq", "dk", "dv"):
        assert torch.all(torch.isfinite(ours[name]))


def test_transposed_views(seed: int) -> None:
    """(B, H, N, D) tensors transposed to (B, N, H, D): non-contiguous, unit last stride, read in place."""
    shape = Shape(2, 19, 26, 4, 2, 32)
    q, k, v, dout = _inputs(shape, torch.float16)

    def fn(q, k, v):
        views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
        assert not any(t.is_contiguous() for t in views)
        out, lse, _ = flash_attn_func(*views, causal=True, return_attn_probs=True)
        return out, lse

    dout_view = dout.transpose(1, 2).contiguous().transpose(1, 2)
    _check_against_oracle(fn, q, k, v, dout_view, softmax_scale=None, causal=True, seed=seed)


def test_strided_last_dim_is_copied(seed: int) -> None:
    q, k, v, dout = _inputs(Shape(1, 9, 9, 2, 2, 16), torch.float32)

    def fn(q, k, v):
        views = [torch.stack((t, t), dim=-1)[..., 0] for t in (q, k, v)]
        assert all(t.stride(-1) == 2 for t in views)
        out, lse, _ = flash_attn_func(*views, return_attn_probs=True)
        return out, lse

    _check_against_oracle(fn, q, k, v, dout, softmax_scale=None, causal=False, seed=seed)


def test_non_contiguous_dout(seed: int) -> None:
    q, k, v, _ = _inputs(Shape(2, 15, 15, 2, 2, 32), torch.float16)
    # A (B, N, D, H) buffer seen as (B, N, H, D): the gradient arrives with a non-unit last stride.
    dout = torch.randn(2, 15, 32, 2, dtype=torch.float16).transpose(2, 3)
    assert dout.stride(-1) != 1
    _check_against_oracle(_flash(None, False), q, k, v, dout, softmax_scale=None, causal=False, seed=seed)


# Every scale in fp16, where the rule compares against PyTorch in the same low precision; fp32 too but at
# scale 10. There the softmax is almost one-hot and PyTorch's fp32 error is a few ulps of the gradients:
# the reference backward (recomputed P, Δ from the rounded output) read above 3× it for about one seed in
# twenty (3 of 60: 3.1×, 3.6×, 5.4×; relative error under 1e-5 each time; 0 of 125 in fp16).
SCALE_CASES = [
    *(pytest.param(scale, torch.float16, id=f"{scale}-fp16") for scale in (None, 0.0, -0.3, 0.05, 10.0)),
    *(pytest.param(scale, torch.float32, id=f"{scale}-fp32") for scale in (None, 0.0, -0.3, 0.05)),
]


@pytest.mark.parametrize(("softmax_scale", "dtype"), SCALE_CASES)
def test_softmax_scale_variants(softmax_scale: float | None, dtype: torch.dtype, seed: int) -> None:
    q, k, v, dout = _inputs(Shape(2, 17, 29, 4, 2, 32), dtype)
    _check_against_oracle(
        _flash(softmax_scale, True), q, k, v, dout, softmax_scale=softmax_scale, causal=True, seed=seed
    )


def test_zero_scale_is_uniform_attention() -> None:
    q, k, v, _ = _inputs(Shape(1, 6, 10, 2, 2, 8), torch.float64)
    out = flash_attn_func(q, k, v, softmax_scale=0.0)
    torch.testing.assert_close(out, v.mean(dim=1, keepdim=True).expand_as(out))


def test_float64_reference_passes_gradcheck() -> None:
    """float64 inputs keep a float64 lse, so the reference backend is exact enough for gradcheck."""
    q, k, v, _ = (t.requires_grad_() for t in _inputs(Shape(1, 5, 6, 2, 1, 4), torch.float64))
    assert flash_attn_func(q, k, v, return_attn_probs=True)[1].dtype == torch.float64
    assert torch.autograd.gradcheck(lambda q, k, v: flash_attn_func(q, k, v, causal=True), (q, k, v))


def test_output_does_not_alias_inputs() -> None:
    q, k, v, _ = _inputs(Shape(1, 4, 4, 1, 1, 8), torch.float32)
    out = flash_attn_func(q, k, v)
    assert out.data_ptr() not in {t.data_ptr() for t in (q, k, v)}


def test_forced_reference_backend_matches_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v, _ = _inputs(Shape(1, 10, 10, 2, 2, 16), torch.float32)
    auto = flash_attn_func(q, k, v, causal=True)
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=True), auto, rtol=0, atol=0)


def test_signatures_match_flash_attn() -> None:
    options = [
        ("dropout_p", 0.0),
        ("softmax_scale", None),
        ("causal", False),
        ("window_size", (-1, -1)),
        ("softcap", 0.0),
        ("alibi_slopes", None),
        ("deterministic", False),
        ("return_attn_probs", False),
    ]
    varlen = ["cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"]
    # Beyond flash_attn 2.8, keyword-only and appended: the programmable options (FlashAttention-4's names).
    mods = [(name, None) for name in ("block_mask", "mask_mod", "score_mod", "score_mod_bwd", "aux_tensors")]
    expected = {
        flash_attn_func: (["q", "k", "v"], mods),
        flash_attn_qkvpacked_func: (["qkv"], []),
        flash_attn_kvpacked_func: (["q", "kv"], []),
        flash_attn_varlen_func: (["q", "k", "v", *varlen], [("block_table", None), *mods]),
        flash_attn_varlen_qkvpacked_func: (["qkv", "cu_seqlens", "max_seqlen"], []),
        flash_attn_varlen_kvpacked_func: (["q", "kv", *varlen], []),
    }
    # Keywords beyond flash_attn 2.8 come after all of its arguments.
    beyond = [("learnable_sink", None)]
    for func, (required, extra) in expected.items():
        params = list(inspect.signature(func).parameters.values())
        defaults = options + extra + beyond
        assert [p.name for p in params] == required + [name for name, _ in defaults]
        assert all(p.default is inspect.Parameter.empty for p in params[: len(required)])
        assert [p.default for p in params[len(required) :]] == [default for _, default in defaults]


def test_public_names() -> None:
    assert set(flashtile.__all__) == {
        "BlockMask",
        "FlashAttention",
        "__version__",
        "apply_rotary_emb",
        "create_block_mask",
        "distributed",
        "masks",
        "flash_attn_fp8_func",
        "flash_attn_func",
        "flash_attn_kvpacked_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func",
        "flash_attn_with_kvcache",
        "bert_padding",
        "quantize_fp8",
    }
    assert isinstance(flashtile.__version__, str)


def _module_reference(layer: FlashAttention, x: torch.Tensor, mods: Mods | None = None) -> torch.Tensor:
    """The same layer written out with float64 naive attention (with ``mods``, the programmable options)."""
    batch, seqlen, _ = x.shape
    heads, kv_heads, head_dim = layer.num_heads, layer.num_kv_heads, layer.head_dim
    weight = layer.Wqkv.weight.double()
    bias = None if layer.Wqkv.bias is None else layer.Wqkv.bias.double()
    qkv = torch.nn.functional.linear(x.double(), weight, bias)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(batch, seqlen, heads, head_dim)
    k = k.view(batch, seqlen, kv_heads, head_dim)
    v = v.view(batch, seqlen, kv_heads, head_dim)
    window = validation.normalize_window(layer.window_size, layer.causal, seqlen)
    options = dict(causal=layer.causal, window_size=window, softcap=layer.softcap)
    out, _ = naive.attention(q, k, v, softmax_scale=layer.softmax_scale, mods=mods, **options)
    out_weight = layer.out_proj.weight.double()
    out_bias = None if layer.out_proj.bias is None else layer.out_proj.bias.double()
    return torch.nn.functional.linear(out.reshape(batch, seqlen, -1), out_weight, out_bias)


@pytest.mark.parametrize(
    ("num_kv_heads", "causal", "bias"),
    [(None, False, True), (None, True, False), (2, True, True), (1, False, True)],
    ids=["MHA", "MHA-causal-nobias", "GQA-causal", "MQA"],
)
def test_flash_attention_module_matches_naive(
    num_kv_heads: int | None, causal: bool, bias: bool, seed: int
) -> None:
    layer = FlashAttention(64, num_heads=4, num_kv_heads=num_kv_heads, causal=causal, bias=bias)
    x = torch.randn(2, 19, 64, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape
    expected = _module_reference(layer, x)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert x.grad is not None and layer.Wqkv.weight.grad is not None
    assert torch.all(torch.isfinite(layer.Wqkv.weight.grad))
    layer.zero_grad()
    x_ref = x.detach().clone().requires_grad_()
    _module_reference(layer, x_ref).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-5)


def test_autocast_runs_in_the_projections_dtype(seed: int) -> None:
    """Autocast does not cast the attention inputs: attention runs in the bf16 that the projection gave."""
    layer = FlashAttention(32, num_heads=2, causal=True)
    x = torch.randn(2, 7, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and torch.all(torch.isfinite(x.grad))
    q, k, v = _inputs(Shape(1, 5, 5, 1, 1, 8), torch.float32)[:3]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert flash_attn_func(q, k, v).dtype == torch.float32


def test_flash_attention_module_rejects_bad_heads() -> None:
    with pytest.raises(ValueError, match="embed_dim must be a multiple of num_heads"):
        FlashAttention(60, num_heads=8)
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads"):
        FlashAttention(64, num_heads=4, num_kv_heads=3)


@pytest.mark.parametrize(
    ("sizes", "error", "match"),
    [
        ((32, 4.0), TypeError, r"num_heads must be an integer ≥ 1; got 4.0 \(float\)"),
        ((32.0, 4), TypeError, r"embed_dim must be an integer ≥ 1; got 32.0 \(float\)"),
        ((32, None), TypeError, r"num_heads must be an integer ≥ 1; got None \(NoneType\)"),
        ((32, 4, True), TypeError, r"num_kv_heads must be an integer ≥ 1; got True \(bool\)"),
        ((0, 4), ValueError, "embed_dim must be an integer ≥ 1; got 0"),
        ((32, 0), ValueError, "num_heads must be an integer ≥ 1; got 0"),
        ((32, 4, -2), ValueError, "num_kv_heads must be an integer ≥ 1; got -2"),
    ],
)
def test_flash_attention_module_names_a_bad_size(sizes: tuple, error: type, match: str) -> None:
    # Named here, not as nn.Linear's TypeError or a division by zero in the default scale.
    with pytest.raises(error, match=match):
        FlashAttention(*sizes)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        (dict(dropout=1.5), ValueError, r"dropout_p must be in \[0, 1\); got 1.5"),
        (dict(softcap=float("nan")), ValueError, r"softcap must be finite \(≤ 0 disables it\); got nan"),
        (dict(softmax_scale="big"), TypeError, "softmax_scale must be a float or None; got 'big'"),
        (dict(causal="yes"), TypeError, r"causal must be a bool .*; got 'yes' \(str\)"),
        (dict(window_size=(3,)), TypeError, "window_size must be a pair of integers"),
    ],
)
def test_flash_attention_module_names_a_bad_option_when_built(options: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        FlashAttention(16, num_heads=2, **options)


@pytest.mark.parametrize("shape", [(4, 16), (1, 4, 15), (1, 2, 4, 16)])
def test_flash_attention_module_names_an_input_of_the_wrong_shape(shape: tuple[int, ...]) -> None:
    layer = FlashAttention(16, num_heads=2)
    match = rf"x must be a tensor of shape \(batch_size, seqlen, embed_dim=16\); got {re.escape(str(shape))}"
    with pytest.raises(ValueError, match=match):
        layer(torch.randn(*shape))


def test_flash_attention_module_fp16_matches_oracle(seed: int) -> None:
    layer = FlashAttention(64, num_heads=4, num_kv_heads=2, causal=True, dtype=torch.float16)
    x = torch.randn(2, 11, 64, dtype=torch.float16)
    out = layer(x)
    assert out.dtype == torch.float16
    err = (out.double() - _module_reference(layer, x)).abs().max().item()
    assert math.isfinite(err) and err < 2e-2


def test_flash_attention_module_options(seed: int) -> None:
    layer = FlashAttention(32, num_heads=4, num_kv_heads=2, causal=True, window_size=(3, 0), softcap=2.0)
    x = torch.randn(2, 11, 32)
    err = (layer(x).double() - _module_reference(layer, x)).abs().max().item()
    assert err < 1e-5, err
    assert "window_size=(3, 0)" in repr(layer) and "softcap=2.0" in repr(layer)
    assert "softmax_scale=None" in repr(layer)
    assert "softmax_scale=0.5" in repr(FlashAttention(32, num_heads=4, softmax_scale=0.5))


@triton.jit
def _position_bias(score, b, h, q_idx, kv_idx, aux):
    return score + tl.load(aux[1] + h) * (q_idx - kv_idx).to(tl.float32)


@triton.jit
def _unit_derivative(score, b, h, q_idx, kv_idx, aux):
    return score * 0.0 + 1.0


def test_flash_attention_module_forwards_the_programmable_options(seed: int) -> None:
    layer = FlashAttention(32, num_heads=4, num_kv_heads=2)
    x = torch.randn(2, 40, 32, requires_grad=True)
    aux = (flashtile.masks.document_ids(torch.tensor([0, 15, 40])), torch.tensor([0.1, -0.2, 0.3, 0.0]))
    mask = flashtile.create_block_mask(flashtile.masks.document(), None, None, 40, 40, 32, aux_tensors=aux)
    mods = dict(block_mask=mask, score_mod=_position_bias, score_mod_bwd=_unit_derivative, aux_tensors=aux)
    out = layer(x, **mods)
    expected = _module_reference(layer, x.detach(), Mods(**mods))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert (out - layer(x)).abs().max() > 1e-2, "the mask and the bias change the output"
    out.sum().backward()
    assert x.grad is not None and torch.all(torch.isfinite(x.grad))
    # A mask_mod alone (every tile partial) equals the layer's own causal flag.
    with_mask_mod = layer(x, mask_mod=flashtile.masks.causal)
    layer.causal = True
    torch.testing.assert_close(with_mask_mod, layer(x), rtol=1e-6, atol=1e-6)


def test_flash_attention_module_dropout_only_in_training(seed: int) -> None:
    layer = FlashAttention(32, num_heads=4, dropout=0.5)
    x = torch.randn(2, 11, 32)
    torch.manual_seed(seed)
    first = layer(x)
    torch.manual_seed(seed)
    assert torch.equal(layer(x), first)
    layer.eval()
    err = (layer(x).double() - _module_reference(layer, x)).abs().max().item()
    assert err < 1e-5 and not torch.allclose(layer(x), first)
