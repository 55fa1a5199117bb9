"""The remembered verdicts of plain calls (flashtile.plain_calls): a repeated call skips validation and gives
the same result; anything that validation would reject, or that is not plain, still takes the full path."""

from __future__ import annotations

import contextlib

import pytest
import torch

from flashtile import flash_attn_func, plain_calls
from flashtile.errors import FlashtileTypeError, FlashtileValueError


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    monkeypatch.setattr(plain_calls, "_verdicts", {})


def qkv(seed: int, dtype: torch.dtype = torch.float32, heads_kv: int = 2) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 17, 4, 16, generator=gen, dtype=dtype)
    k, v = (torch.randn(2, 23, heads_kv, 16, generator=gen, dtype=dtype) for _ in range(2))
    return q, k, v


def test_a_repeated_plain_call_reuses_the_verdict_and_gives_the_same_result():
    q, k, v = qkv(0)
    first = flash_attn_func(q, k, v, causal=True, window_size=(5, 0))
    assert len(plain_calls._verdicts) == 1
    # Fresh inputs of the same metadata: the remembered verdict, the same arithmetic.
    q2, k2, v2 = qkv(1)
    again = flash_attn_func(q2, k2, v2, causal=True, window_size=(5, 0))
    assert len(plain_calls._verdicts) == 1
    reference = flash_attn_func(q2, k2, v2, causal=True, window_size=(5, 0), return_attn_probs=True)[0]
    assert torch.equal(again, reference)
    assert not torch.equal(first, again)


def test_rejected_calls_are_never_remembered_and_still_raise():
    q, k, v = qkv(0)
    flash_attn_func(q, k, v)
    # Same shapes, other dtypes or option types: other keys, so validation runs and raises.
    with pytest.raises(FlashtileTypeError, match="dtype"):
        flash_attn_func(q.to(torch.int32), k.to(torch.int32), v.to(torch.int32))
    with pytest.raises(FlashtileTypeError, match="window_size"):
        flash_attn_func(q, k, v, window_size=(-1.5, -1))
    with pytest.raises(FlashtileValueError, match="heads"):
        flash_attn_func(*qkv(0, heads_kv=3))
    assert len(plain_calls._verdicts) == 1


def test_alibi_and_dropout_calls_are_remembered_and_give_the_full_paths_results():
    q, k, v = qkv(0)
    slopes = torch.rand(2, 4)
    options = dict(causal=True, alibi_slopes=slopes, dropout_p=0.3)
    flash_attn_func(q, k, v, **options)
    assert len(plain_calls._verdicts) == 1
    # Fresh inputs and slopes of the same metadata: the remembered verdict. Dropout draws its random state
    # at each call from PyTorch's generator, as the full path (return_attn_probs) does.
    q2, k2, v2 = qkv(1)
    options["alibi_slopes"] = torch.rand(2, 4)
    torch.manual_seed(5)
    again = flash_attn_func(q2, k2, v2, **options)
    assert len(plain_calls._verdicts) == 1
    torch.manual_seed(5)
    reference = flash_attn_func(q2, k2, v2, **options, return_attn_probs=True)[0]
    assert torch.equal(again, reference)
    # Another dropout probability or slopes' shape: another key.
    flash_attn_func(q2, k2, v2, causal=True, alibi_slopes=slopes, dropout_p=0.2)
    flash_attn_func(q2, k2, v2, causal=True, alibi_slopes=slopes[0], dropout_p=0.3)
    assert len(plain_calls._verdicts) == 3


def test_sink_calls_are_remembered_and_give_the_full_paths_results_and_gradients():
    # A bfloat16 sink, as transformers hands a bfloat16 model's: converted to float32 at each call.
    q, k, v = qkv(0)
    flash_attn_func(q, k, v, causal=True, learnable_sink=torch.randn(4, dtype=torch.bfloat16))
    assert len(plain_calls._verdicts) == 1
    leaves = (*qkv(1), torch.randn(4, dtype=torch.bfloat16))
    for t in leaves:
        t.requires_grad_()
    q2, k2, v2, sink = leaves
    again = flash_attn_func(q2, k2, v2, causal=True, learnable_sink=sink)
    assert len(plain_calls._verdicts) == 1
    again.sum().backward()
    grads = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    reference = flash_attn_func(q2, k2, v2, causal=True, learnable_sink=sink, return_attn_probs=True)[0]
    reference.sum().backward()
    assert torch.equal(again, reference)
    for mine, full in zip(grads, (t.grad for t in leaves), strict=True):
        assert torch.equal(mine, full)
    assert sink.grad.dtype == torch.bfloat16
    # Another sink dtype: another key; a sink of the wrong shape is rejected and not remembered.
    flash_attn_func(q2, k2, v2, causal=True, learnable_sink=torch.randn(4))
    with pytest.raises(FlashtileValueError, match="learnable_sink"):
        flash_attn_func(q2, k2, v2, causal=True, learnable_sink=torch.randn(3))
    assert len(plain_calls._verdicts) == 2


@pytest.mark.parametrize(
    "options",
    [
        dict(alibi_slopes=torch.ones(4, 2).t()[0]),
        dict(alibi_slopes=torch.ones(4, dtype=torch.float64)),
        dict(alibi_slopes=torch.ones(4).to_sparse()),
        dict(alibi_slopes=torch.ones(5)),
        dict(dropout_p=True),
        dict(dropout_p=1.5),
        dict(return_attn_probs=True),
        dict(window_size=[2, 2]),
        dict(causal=1),
        dict(softcap=torch.tensor(1.0)),
        dict(learnable_sink=[0.0, 0.0, 0.0, 0.0]),
        dict(learnable_sink=torch.zeros(4).to_sparse()),
    ],
    ids=[
        "alibi-strided",
        "alibi-float64",
        "alibi-sparse",
        "alibi-wrong-shape",
        "dropout-bool",
        "dropout-too-large",
        "probs",
        "window-list",
        "causal-int",
        "softcap-tensor",
        "sink-list",
        "sink-sparse",
    ],
)
def test_calls_that_are_not_plain_take_the_full_path(options):
    q, k, v = qkv(0)
    with contextlib.suppress(FlashtileTypeError, FlashtileValueError):
        flash_attn_func(q, k, v, **options)
    assert plain_calls._verdicts == {}


def test_strided_last_dimension_and_backend_variable_change_the_key(monkeypatch):
    q, k, v = qkv(0)
    flash_attn_func(q, k, v)
    strided = torch.randn(2, 17, 4, 32)[..., ::2]
    out = flash_attn_func(strided, k, v)
    assert len(plain_calls._verdicts) == 1
    assert torch.equal(out, flash_attn_func(strided.contiguous(), k, v))
    monkeypatch.setenv("FLASHTILE_BACKEND", "auto")
    flash_attn_func(q, k, v)
    assert len(plain_calls._verdicts) == 2
