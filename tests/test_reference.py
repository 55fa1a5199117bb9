"""The reference: naive semantics against hand-written masks and direct formulas, tiled against naive."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtile.reference import naive, tiled
from flashtile.reference.compare import compare
from flashtile.reference.dropout import DROPOUT_ROUNDS, philox4x32
from tests.helpers import assert_matches_oracle

NEG_INF = float("-inf")
SEQLENS = [(1, 1), (17, 17), (113, 203), (203, 113), (128, 128), (129, 129)]
HEAD_DIMS = [32, 59, 64, 128]
HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (3, 1)}


def _ids(pairs: list[tuple[int, int]]) -> list[str]:
    return [f"{a}x{b}" for a, b in pairs]


def _inputs(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    nheads: int,
    nheads_kv: int,
    head_dim: int,
    dtype: torch.dtype = torch.float64,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v and an upstream gradient dout, in flash_attn's layout."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=torch.float64, generator=generator).to(dtype)

    q = randn(batch, seqlen_q, nheads, head_dim)
    k = randn(batch, seqlen_k, nheads_kv, head_dim)
    v = randn(batch, seqlen_k, nheads_kv, head_dim)
    dout = randn(batch, seqlen_q, nheads, head_dim)
    return q, k, v, dout


def _naive_with_grads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor, **options: object
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """out, lse and (dq, dk, dv) of the naive reference, the gradients by autograd."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = naive.attention(q, k, v, **options)
    grads = torch.autograd.grad(out, (q, k, v), dout, allow_unused=True, materialize_grads=True)
    return out.detach(), lse.detach(), grads


def _assert_float64_close(
    name: str, ours: torch.Tensor, oracle: torch.Tensor, seed: int | None, atol: float = 1e-10
) -> None:
    """float64 agreement to ``atol`` (equal infinities match), reported like the accuracy rule."""
    assert ours.dtype == oracle.dtype, f"{name}: dtype {ours.dtype}, oracle {oracle.dtype}"
    result = compare(name, ours, oracle, oracle, factor=0.0, atol=atol)
    assert result.passed, f"{result} (seed {seed})"


def _naive_options(q: torch.Tensor, k: torch.Tensor, options: dict) -> dict:
    """The naive reference's keywords for the tiled reference's ``options``: dropout as an explicit mask."""
    options = dict(options)
    rng_state = options.pop("rng_state", None)
    if options.get("dropout_p", 0.0) > 0:
        options["dropout_mask"] = naive.dropout_mask(
            rng_state, options["dropout_p"], q.shape[0], q.shape[2], q.shape[1], k.shape[1]
        )
    return options


def _check_tiled_against_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool,
    block_m: int,
    block_n: int,
    seed: int | None,
    **options: object,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Tiled against naive in float64 to 1e-10 for out, lse, dq, dk, dv; returns the tiled results."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    naive_options = _naive_options(q, k, options)
    out_ref, lse_ref, grads_ref = _naive_with_grads(
        q, k, v, dout, softmax_scale=scale, causal=causal, **naive_options
    )
    out, lse = tiled.attention_fwd(q, k, v, scale, causal, block_m=block_m, block_n=block_n, **options)
    grads = tiled.attention_bwd(
        dout, q, k, v, out, lse, scale, causal, block_m=block_m, block_n=block_n, **options
    )
    _assert_float64_close("out", out, out_ref, seed)
    _assert_float64_close("lse", lse, lse_ref, seed)
    for name, grad, grad_ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        _assert_float64_close(name, grad, grad_ref, seed)
    return out, lse, grads


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("head_dim", HEAD_DIMS, ids=[f"d{d}" for d in HEAD_DIMS])
@pytest.mark.parametrize("seqlens", SEQLENS, ids=_ids(SEQLENS))
def test_tiled_matches_naive_float64(
    seqlens: tuple[int, int], head_dim: int, heads: tuple[int, int], causal: bool, seed: int
) -> None:
    q, k, v, dout = _inputs(2, *seqlens, *heads, head_dim)
    _check_tiled_against_naive(q, k, v, dout, causal, 64, 64, seed)


BLOCKS = [(16, 16), (32, 64), (64, 32), (128, 128), (7, 13)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("blocks", BLOCKS, ids=[f"bm{m}-bn{n}" for m, n in BLOCKS])
@pytest.mark.parametrize(
    "seqlens", [(113, 203), (203, 113), (129, 129)], ids=_ids([(113, 203), (203, 113), (129, 129)])
)
def test_tiled_block_sizes(
    seqlens: tuple[int, int], blocks: tuple[int, int], causal: bool, seed: int
) -> None:
    q, k, v, dout = _inputs(1, *seqlens, 4, 2, 32)
    _check_tiled_against_naive(q, k, v, dout, causal, *blocks, seed)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 2),
    seqlen_q=st.integers(1, 40),
    seqlen_k=st.integers(0, 40),
    nheads_kv=st.integers(1, 2),
    group=st.integers(1, 3),
    head_dim=st.integers(1, 16),
    causal=st.booleans(),
    block_m=st.integers(1, 24),
    block_n=st.integers(1, 24),
    draw_seed=st.integers(0, 2**31 - 1),
)
def test_tiled_equals_naive_property(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    nheads_kv: int,
    group: int,
    head_dim: int,
    causal: bool,
    block_m: int,
    block_n: int,
    draw_seed: int,
) -> None:
    generator = torch.Generator().manual_seed(draw_seed)
    q, k, v, dout = _inputs(
        batch, seqlen_q, seqlen_k, nheads_kv * group, nheads_kv, head_dim, generator=generator
    )
    _check_tiled_against_naive(q, k, v, dout, causal, block_m, block_n, draw_seed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_tiled_low_precision_meets_accuracy_rule(dtype: torch.dtype, causal: bool, seed: int) -> None:
    q, k, v, dout = _inputs(2, 113, 203, 4, 2, 64, dtype=dtype)
    scale = 1.0 / math.sqrt(64)
    oracle = _naive_with_grads(*(t.double() for t in (q, k, v, dout)), causal=causal)
    baseline = _naive_with_grads(q, k, v, dout, causal=causal)
    out, lse = tiled.attention_fwd(q, k, v, scale, causal, block_m=32, block_n=48)
    grads = tiled.attention_bwd(dout, q, k, v, out, lse, scale, causal, block_m=48, block_n=32)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert all(g.dtype == dtype for g in grads)
    assert_matches_oracle("out", out, oracle[0], baseline[0], seed=seed)
    assert_matches_oracle("lse", lse, oracle[1], baseline[1], seed=seed)
    for name, grad, grad_oracle, grad_baseline in zip(
        ("dq", "dk", "dv"), grads, oracle[2], baseline[2], strict=True
    ):
        assert_matches_oracle(name, grad, grad_oracle, grad_baseline, grad=True, seed=seed)


def test_tiled_accepts_non_contiguous_inputs(seed: int) -> None:
    q, k, v, dout = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(2, 37, 45, 4, 2, 24))
    assert not q.is_contiguous()
    _check_tiled_against_naive(q, k, v, dout, True, 16, 16, seed)


# The diagrams of flash_attn_func's docstring (1 = keep, 0 = masked out), bottom-right aligned.
CAUSAL_DIAGRAMS = {
    (2, 5): [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]],
    (5, 2): [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]],
    (3, 3): [[1, 0, 0], [1, 1, 0], [1, 1, 1]],
}


@pytest.mark.parametrize("seqlens", CAUSAL_DIAGRAMS, ids=_ids(list(CAUSAL_DIAGRAMS)))
def test_causal_mask_is_bottom_right(seqlens: tuple[int, int]) -> None:
    mask = naive.keep_mask(*seqlens, causal=True)
    assert mask.int().tolist() == CAUSAL_DIAGRAMS[seqlens]


WINDOW_DIAGRAMS = {
    "4x4-left1-right0": (4, 4, (1, 0), False, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]),
    "3x6-left1-right1": (3, 6, (1, 1), False, [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]),
    "4x2-left0-right0": (4, 2, (0, 0), False, [[0, 0], [0, 0], [1, 0], [0, 1]]),
    "3x3-left-unlimited": (3, 3, (-1, 1), False, [[1, 1, 0], [1, 1, 1], [1, 1, 1]]),
    "3x3-right-unlimited": (3, 3, (1, -1), False, [[1, 1, 1], [1, 1, 1], [0, 1, 1]]),
    "3x3-causal-forces-right0": (3, 3, (1, 5), True, [[1, 0, 0], [1, 1, 0], [0, 1, 1]]),
    "3x3-wider-than-sequence": (3, 3, (10, 10), False, [[1, 1, 1], [1, 1, 1], [1, 1, 1]]),
    "2x3-unlimited": (2, 3, (-1, -1), False, [[1, 1, 1], [1, 1, 1]]),
}


@pytest.mark.parametrize("case", WINDOW_DIAGRAMS.values(), ids=WINDOW_DIAGRAMS.keys())
def test_window_mask(case: tuple[int, int, tuple[int, int], bool, list[list[int]]]) -> None:
    seqlen_q, seqlen_k, window_size, causal, expected = case
    mask = naive.keep_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size)
    assert mask.int().tolist() == expected


def _direct_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    slopes: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """flash_attn's documented semantics written element by element, independently of naive.py."""
    batch, seqlen_q, nheads, _ = q.shape
    seqlen_k, group = k.shape[1], nheads // k.shape[2]
    left, right = window_size[0], 0 if causal else window_size[1]
    out = torch.zeros_like(q)
    lse = torch.full((batch, nheads, seqlen_q), NEG_INF, dtype=torch.float64)
    for b in range(batch):
        for h in range(nheads):
            slope = 0.0 if slopes is None else float(slopes[b, h] if slopes.dim() == 2 else slopes[h])
            for i in range(seqlen_q):
                diagonal = i + seqlen_k - seqlen_q
                visible = [
                    j
                    for j in range(seqlen_k)
                    if (left < 0 or j >= diagonal - left) and (right < 0 or j <= diagonal + right)
                ]
                if not visible:
                    continue
                scores = []
                for j in visible:
                    s = scale * float(q[b, i, h] @ k[b, j, h // group])
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    scores.append(s - slope * abs(diagonal - j))
                row_lse = math.log(sum(math.exp(s) for s in scores))
                lse[b, h, i] = row_lse
                for j, s in zip(visible, scores, strict=True):
                    out[b, i, h] += math.exp(s - row_lse) * v[b, j, h // group]
    return out, lse


DIRECT_CASES = {
    "plain": dict(),
    "causal-5x7": dict(causal=True),
    "causal-7x5": dict(causal=True, seqlens=(7, 5)),
    "window": dict(window_size=(2, 1)),
    "window-left-only": dict(window_size=(1, -1), seqlens=(7, 5)),
    "softcap": dict(softcap=0.7),
    "alibi-h": dict(alibi="h"),
    "alibi-bh": dict(alibi="bh"),
    "alibi-causal": dict(alibi="h", causal=True, seqlens=(4, 6)),
    "everything": dict(causal=True, window_size=(3, -1), softcap=1.5, alibi="bh", scale=0.9),
}


@pytest.mark.parametrize("case", DIRECT_CASES.values(), ids=DIRECT_CASES.keys())
def test_naive_matches_direct_formula(case: dict, seed: int) -> None:
    seqlen_q, seqlen_k = case.get("seqlens", (5, 7))
    batch, nheads = 2, 4
    q, k, v, _ = _inputs(batch, seqlen_q, seqlen_k, nheads, 2, 8)
    q = q * 2  # larger logits so that softcap and ALiBi visibly change the result
    slopes = {"h": torch.rand(nheads), "bh": torch.rand(batch, nheads)}.get(case.get("alibi"))
    scale = case.get("scale", 1.0 / math.sqrt(8))
    causal, window_size, softcap = (
        case.get("causal", False),
        case.get("window_size", (-1, -1)),
        case.get("softcap", 0.0),
    )
    out, lse = naive.attention(
        q,
        k,
        v,
        softmax_scale=case.get("scale"),
        causal=causal,
        window_size=window_size,
        softcap=softcap,
        alibi_slopes=slopes,
    )
    out_ref, lse_ref = _direct_attention(q, k, v, scale, causal, window_size, softcap, slopes)
    _assert_float64_close("out", out, out_ref, seed)
    _assert_float64_close("lse", lse, lse_ref, seed)


def test_softmax_scale_none_is_inverse_sqrt_head_dim(seed: int) -> None:
    q, k, v, _ = _inputs(1, 9, 11, 2, 1, 40)
    default = naive.attention(q, k, v)
    explicit = naive.attention(q, k, v, softmax_scale=1.0 / math.sqrt(40))
    for name, ours, ref in zip(("out", "lse"), default, explicit, strict=True):
        _assert_float64_close(name, ours, ref, seed, atol=0.0)


def test_softcap_is_applied_before_masking(seed: int) -> None:
    # Masking after the cap would turn −∞ into −softcap and leak weight to masked keys.
    q, k, v, _ = _inputs(1, 6, 6, 2, 2, 8)
    probs = naive.attention_probs(q, k, v, causal=True, softcap=0.5)
    mask = naive.keep_mask(6, 6, causal=True)
    assert (probs[..., ~mask] == 0).all()
    _, lse = naive.attention(q * 100, k, v, causal=True, softcap=0.5)
    # Capped scores lie in [−softcap, softcap], so lse_i ≤ softcap + log(number of visible keys).
    assert (lse <= 0.5 + torch.log(mask.sum(-1).double()) + 1e-12).all()


def test_softcap_zero_disables(seed: int) -> None:
    q, k, v, _ = _inputs(1, 5, 5, 1, 1, 8)
    for name, ours, ref in zip(
        ("out", "lse"), naive.attention(q, k, v, softcap=0.0), naive.attention(q, k, v), strict=True
    ):
        _assert_float64_close(name, ours, ref, seed, atol=0.0)


def test_alibi_per_head_slopes_broadcast_over_batch(seed: int) -> None:
    q, k, v, _ = _inputs(3, 4, 6, 2, 2, 8)
    slopes = torch.rand(2)
    per_head = naive.attention(q, k, v, alibi_slopes=slopes)
    per_batch = naive.attention(q, k, v, alibi_slopes=slopes.expand(3, 2))
    for name, ours, ref in zip(("out", "lse"), per_head, per_batch, strict=True):
        _assert_float64_close(name, ours, ref, seed, atol=0.0)


def test_alibi_bias_formula() -> None:
    bias = naive.alibi_bias(torch.tensor([[0.5, 2.0]]), 2, 4)
    expected = [[-0.5 * abs(i + 2 - j) for j in range(4)] for i in range(2)]
    assert bias.shape == (1, 2, 2, 4)
    assert bias[0, 0].tolist() == expected
    assert bias[0, 1].tolist() == [[4 * x for x in row] for row in expected]


def test_dropout_scales_kept_probabilities(seed: int) -> None:
    q, k, v, dout = _inputs(2, 7, 9, 4, 2, 16)
    keep = torch.rand(2, 4, 7, 9) > 0.3
    out, lse = naive.attention(q, k, v, causal=True, dropout_p=0.3, dropout_mask=keep)
    probs = naive.attention_probs(q, k, v, causal=True)
    dropped = probs * keep / 0.7
    out_ref = torch.einsum("bhij,bjhd->bihd", dropped, v.repeat_interleave(2, dim=2))
    _assert_float64_close("out", out, out_ref, seed)
    _assert_float64_close("lse", lse, naive.attention(q, k, v, causal=True)[1], seed, atol=0.0)
    grads = _naive_with_grads(q, k, v, dout, causal=True, dropout_p=0.3, dropout_mask=keep)[2]
    assert all(torch.isfinite(g).all() for g in grads)


def test_attention_probs_encode_dropout_in_sign(seed: int) -> None:
    q, k, v, _ = _inputs(1, 5, 6, 2, 1, 8)
    keep = torch.rand(1, 2, 5, 6) > 0.5
    probs = naive.attention_probs(q, k, v, dropout_p=0.5, dropout_mask=keep)
    plain = naive.attention_probs(q, k, v)
    _assert_float64_close("|P|", probs.abs(), plain, seed, atol=0.0)
    assert torch.equal(probs >= 0, keep)
    _assert_float64_close(
        "rowsum P", plain.sum(-1), torch.ones(1, 2, 5, dtype=torch.float64), seed, atol=1e-12
    )


@pytest.mark.parametrize("dropout_p", [-0.1, 1.0, 1.5])
def test_dropout_p_out_of_range_is_rejected(dropout_p: float) -> None:
    q, k, v, _ = _inputs(1, 2, 2, 1, 1, 4)
    keep = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="dropout_p"):
        naive.attention(q, k, v, dropout_p=dropout_p, dropout_mask=keep)


def test_dropout_without_mask_is_rejected() -> None:
    q, k, v, _ = _inputs(1, 2, 2, 1, 1, 4)
    with pytest.raises(ValueError, match="dropout_mask"):
        naive.attention(q, k, v, dropout_p=0.1)


def test_fully_masked_rows_give_zero_and_neg_inf(seed: int) -> None:
    # Causal 5×2: queries 0, 1, 2 see no key (the docstring diagram's empty rows).
    q, k, v, dout = _inputs(2, 5, 2, 4, 2, 8)
    scale = 1.0 / math.sqrt(8)
    out_ref, lse_ref, grads_ref = _naive_with_grads(q, k, v, dout, causal=True)
    out, lse = tiled.attention_fwd(q, k, v, scale, True, block_m=2, block_n=2)
    grads = tiled.attention_bwd(dout, q, k, v, out, lse, scale, True, block_m=2, block_n=2)
    for result_out, result_lse in ((out_ref, lse_ref), (out, lse)):
        assert (result_out[:, :3] == 0).all()
        assert torch.isneginf(result_lse[:, :, :3]).all()
        assert torch.isfinite(result_lse[:, :, 3:]).all()
    for g in (*grads_ref, *grads):
        assert torch.isfinite(g).all()
    assert (grads[0][:, :3] == 0).all() and (grads_ref[0][:, :3] == 0).all()
    _check_tiled_against_naive(q, k, v, dout, True, 2, 2, seed)


def test_fully_masked_window_rows_have_finite_grads(seed: int) -> None:
    q, k, v, dout = _inputs(1, 4, 2, 2, 2, 8)
    out, lse, grads = _naive_with_grads(q, k, v, dout, window_size=(0, 0))
    assert (out[:, :2] == 0).all() and torch.isneginf(lse[:, :, :2]).all()
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_keys_give_zero_and_neg_inf(causal: bool, seed: int) -> None:
    q, k, v, dout = _inputs(2, 3, 0, 4, 2, 8)
    out_ref, lse_ref = naive.attention(q, k, v, causal=causal)
    out, lse = tiled.attention_fwd(q, k, v, 0.5, causal)
    dq, dk, dv = tiled.attention_bwd(dout, q, k, v, out, lse, 0.5, causal)
    for result_out, result_lse in ((out_ref, lse_ref), (out, lse)):
        assert result_out.shape == (2, 3, 4, 8) and (result_out == 0).all()
        assert result_lse.shape == (2, 4, 3) and torch.isneginf(result_lse).all()
    assert (dq == 0).all() and dk.shape == dv.shape == (2, 0, 2, 8)


@pytest.mark.parametrize("shape", [(0, 5, 7), (2, 0, 7)], ids=["batch0", "seqlen_q0"])
def test_empty_batch_and_queries(shape: tuple[int, int, int]) -> None:
    batch, seqlen_q, seqlen_k = shape
    q, k, v, dout = _inputs(batch, seqlen_q, seqlen_k, 4, 2, 8)
    out, lse = tiled.attention_fwd(q, k, v, 0.5, True)
    dq, dk, dv = tiled.attention_bwd(dout, q, k, v, out, lse, 0.5, True)
    out_ref, lse_ref = naive.attention(q, k, v, causal=True)
    assert out.shape == out_ref.shape == (batch, seqlen_q, 4, 8)
    assert lse.shape == lse_ref.shape == (batch, 4, seqlen_q)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_output_dtypes(dtype: torch.dtype) -> None:
    q, k, v, dout = _inputs(1, 3, 4, 2, 1, 8, dtype=dtype)
    lse_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    out, lse = naive.attention(q, k, v)
    assert out.dtype == dtype and lse.dtype == lse_dtype
    assert naive.attention_probs(q, k, v).dtype == dtype
    out, lse = tiled.attention_fwd(q, k, v, 0.3, False)
    assert out.dtype == dtype and lse.dtype == lse_dtype
    assert all(g.dtype == dtype for g in tiled.attention_bwd(dout, q, k, v, out, lse, 0.3, False))


_INF, _NAN = math.inf, math.nan


@pytest.mark.parametrize(
    ("ours", "oracle", "baseline"),
    [
        ([1.0, 5.0], [1.0, 2.0], [1.0, _NAN]),
        ([1.0, 5.0], [1.0, 2.0], [1.0, _INF]),
        ([1.0, 2.0], [1.0, 2.0], [1.0, -_INF]),
        ([-_INF, 2.0], [-_INF, 2.0], [_INF, 2.0]),
        ([1.0, _NAN], [1.0, 2.0], [1.0, 2.1]),
        ([1.0, _INF], [1.0, 2.0], [1.0, 2.1]),
        ([1.0, _INF], [1.0, -_INF], [1.0, -_INF]),
        ([1.0, 2.5], [1.0, 2.0], [1.0, 2.1]),
    ],
    ids=[
        "wrong-output-nan-baseline",
        "wrong-output-inf-baseline",
        "exact-output-baseline-overflowed",
        "baseline-opposite-infinity",
        "nan-output",
        "inf-output",
        "output-opposite-infinity",
        "beyond-twice-the-baseline-error",
    ],
)
def test_accuracy_rule_fails(ours: list[float], oracle: list[float], baseline: list[float]) -> None:
    # Regression: one non-finite baseline element made the allowed error infinite, so anything passed.
    result = compare("x", *(torch.tensor(t, dtype=torch.float64) for t in (ours, oracle, baseline)), 2.0)
    assert not result.passed, str(result)
    assert math.isfinite(result.allowed), str(result)


@pytest.mark.parametrize(
    ("ours", "oracle", "baseline"),
    [
        ([1.0, 2.15], [1.0, 2.0], [1.0, 2.1]),
        ([-_INF, 2.0], [-_INF, 2.0], [-_INF, 2.05]),
        ([_NAN, 2.0], [_NAN, 2.0], [_NAN, 2.0]),
        ([_INF, 2.0], [_INF, 2.0], [_INF, 2.0]),
        ([], [], []),
    ],
    ids=["within-twice-the-baseline-error", "masked-row-lse", "nan-everywhere", "inf-everywhere", "empty"],
)
def test_accuracy_rule_passes(ours: list[float], oracle: list[float], baseline: list[float]) -> None:
    result = compare("x", *(torch.tensor(t, dtype=torch.float64) for t in (ours, oracle, baseline)), 2.0)
    assert result.passed, str(result)


def _rng_state(generator: torch.Generator | None = None) -> torch.Tensor:
    return torch.randint(-(2**62), 2**62, (2,), generator=generator)


def _slopes(kind: str | None, batch: int, nheads: int, generator: torch.Generator | None = None):
    """float32 ALiBi slopes of shape (H,) for ``"h"``, (B, H) for ``"bh"``, or None."""
    shape = {"h": (nheads,), "bh": (batch, nheads)}.get(kind)
    return None if shape is None else torch.rand(*shape, generator=generator) + 0.1


# Each option alone; windows include 0 and ones wider than either sequence (never normalised here).
OPTIONS_ALONE = {
    "window-3-2": dict(window_size=(3, 2)),
    "window-left-only": dict(window_size=(5, -1)),
    "window-right-only": dict(window_size=(-1, 4)),
    "window-0-0": dict(window_size=(0, 0)),
    "window-wider-than-sequence": dict(window_size=(100, 100)),
    "softcap": dict(softcap=0.6),
    "alibi-h": dict(alibi="h"),
    "alibi-bh": dict(alibi="bh"),
    "dropout": dict(dropout_p=0.3),
}
SEQLENS_ALONE = [(37, 53), (53, 37), (29, 29)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", SEQLENS_ALONE, ids=_ids(SEQLENS_ALONE))
@pytest.mark.parametrize("case", OPTIONS_ALONE.values(), ids=OPTIONS_ALONE.keys())
def test_tiled_matches_naive_each_option(
    case: dict, seqlens: tuple[int, int], causal: bool, seed: int
) -> None:
    q, k, v, dout = _inputs(2, *seqlens, 4, 2, 16)
    options = dict(case)
    options["alibi_slopes"] = _slopes(options.pop("alibi", None), 2, 4)
    if options.get("dropout_p", 0.0) > 0:
        options["rng_state"] = _rng_state()
    _check_tiled_against_naive(2 * q, k, v, dout, causal, 16, 8, seed, **options)


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 2),
    seqlen_q=st.integers(1, 40),
    seqlen_k=st.integers(0, 40),
    nheads_kv=st.integers(1, 2),
    group=st.integers(1, 3),
    head_dim=st.integers(1, 16),
    causal=st.booleans(),
    left=st.integers(-1, 45),
    right=st.integers(-1, 45),
    softcap=st.sampled_from([0.0, 0.5, 2.0]),
    alibi=st.sampled_from([None, "h", "bh"]),
    dropout_p=st.sampled_from([0.0, 0.17, 0.5]),
    block_m=st.integers(1, 24),
    block_n=st.integers(1, 24),
    draw_seed=st.integers(0, 2**31 - 1),
)
def test_tiled_equals_naive_option_combinations(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    nheads_kv: int,
    group: int,
    head_dim: int,
    causal: bool,
    left: int,
    right: int,
    softcap: float,
    alibi: str | None,
    dropout_p: float,
    block_m: int,
    block_n: int,
    draw_seed: int,
) -> None:
    """Window × causal × ALiBi × softcap × dropout × GQA/MQA, odd and unequal lengths, any tile sizes."""
    generator = torch.Generator().manual_seed(draw_seed)
    nheads = nheads_kv * group
    q, k, v, dout = _inputs(batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, generator=generator)
    _check_tiled_against_naive(
        2 * q, k, v, dout, causal, block_m, block_n, draw_seed,
        window_size=(left, right), softcap=softcap,
        alibi_slopes=_slopes(alibi, batch, nheads, generator),
        dropout_p=dropout_p, rng_state=_rng_state(generator),
    )  # fmt: skip


FULLY_MASKED = {
    "window-0-0": dict(window_size=(0, 0)),
    "window-causal": dict(window_size=(1, -1), causal=True),
    "everything": dict(window_size=(0, 0), softcap=0.5, alibi="bh", dropout_p=0.4),
}


@pytest.mark.parametrize("case", FULLY_MASKED.values(), ids=FULLY_MASKED.keys())
def test_window_fully_masked_rows(case: dict, seed: int) -> None:
    # 7 queries on 3 keys, bottom-right aligned: queries 0..3 meet no key of a window of right ≤ 0.
    q, k, v, dout = _inputs(2, 7, 3, 4, 2, 8)
    options = dict(case)
    causal = options.pop("causal", False)
    options["alibi_slopes"] = _slopes(options.pop("alibi", None), 2, 4)
    options["rng_state"] = _rng_state()
    out, lse, grads = _check_tiled_against_naive(q, k, v, dout, causal, 2, 2, seed, **options)
    assert (out[:, :4] == 0).all() and torch.isneginf(lse[:, :, :4]).all()
    assert torch.isfinite(lse[:, :, 4:]).all()
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][:, :4] == 0).all()


WINDOW_TILES = {
    "local-16-0": ((64, 64), (16, 0), False),
    "local-5-9-unequal": ((45, 70), (5, 9), False),
    "causal-unequal": ((70, 45), (-1, -1), True),
    "right-only": ((40, 40), (-1, 3), False),
}


@pytest.mark.parametrize("case", WINDOW_TILES.values(), ids=WINDOW_TILES.keys())
def test_tiles_outside_the_window_are_skipped(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop bounds shrink: exactly the tiles holding a visible (query, key) pair are scored."""
    (seqlen_q, seqlen_k), window_size, causal = case
    block_m, block_n = 8, 4
    visited = []
    scores = tiled._Problem.scores

    def spy(self, q_tile, k_tile, row_start, col_start):
        visited.append((row_start, col_start))
        return scores(self, q_tile, k_tile, row_start, col_start)

    monkeypatch.setattr(tiled._Problem, "scores", spy)
    visible = naive.keep_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size)
    expected = {
        (r, c)
        for r in range(0, seqlen_q, block_m)
        for c in range(0, seqlen_k, block_n)
        if visible[r : r + block_m, c : c + block_n].any()
    }
    assert len(expected) < -(-seqlen_q // block_m) * -(-seqlen_k // block_n)
    q, k, v, dout = _inputs(1, seqlen_q, seqlen_k, 2, 1, 8)
    out, lse = tiled.attention_fwd(
        q, k, v, 0.3, causal, window_size=window_size, block_m=block_m, block_n=block_n
    )
    assert sorted(visited) == sorted(expected), "forward"
    visited.clear()
    tiled.attention_bwd(
        dout, q, k, v, out, lse, 0.3, causal, window_size=window_size, block_m=block_m, block_n=block_n
    )
    assert sorted(visited) == sorted(expected), "backward"


def test_dropout_mask_is_the_kernels_rule() -> None:
    rng_state = torch.tensor([2024, 11])
    mask = naive.dropout_mask(rng_state, 0.4, 2, 3, 5, 7)
    assert mask.shape == (2, 3, 5, 7)
    # Entry [b, h, i, j] is philox counter (quad(j), quad(i), b·H + h, offset), quad(x) = (x // 16)·4 +
    # (x % 8) // 2: word 2·(i % 2) + j % 2, its byte 2·((i // 8) % 2) + (j // 8) % 2, kept iff ≥ floor(p·2⁸).
    word = philox4x32((2024, 0), (3, 2, 1 * 3 + 2, 11), DROPOUT_ROUNDS)[0]
    assert bool(mask[1, 2, 4, 6]) == ((int(word) & 0xFF) >= math.floor(0.4 * 2**8))
    word = philox4x32((2024, 0), (2, 1, 1 * 3 + 2, 11), DROPOUT_ROUNDS)[3]
    assert bool(mask[1, 2, 3, 5]) == ((int(word) & 0xFF) >= math.floor(0.4 * 2**8))


def test_dropout_lse_is_before_dropout_and_same_state_repeats(seed: int) -> None:
    q, k, v, _ = _inputs(1, 9, 11, 2, 1, 8)
    rng_state = _rng_state()
    plain = tiled.attention_fwd(q, k, v, 0.4, True)
    first = tiled.attention_fwd(q, k, v, 0.4, True, dropout_p=0.5, rng_state=rng_state)
    second = tiled.attention_fwd(q, k, v, 0.4, True, dropout_p=0.5, rng_state=rng_state.clone())
    assert torch.equal(first[1], plain[1])
    assert torch.equal(first[0], second[0]) and not torch.equal(first[0], plain[0])


def test_dropout_without_rng_state_is_rejected() -> None:
    q, k, v, _ = _inputs(1, 2, 2, 1, 1, 4)
    with pytest.raises(ValueError, match="rng_state"):
        tiled.attention_fwd(q, k, v, 1.0, False, dropout_p=0.1)


# Per-sequence (N_q, N_k): zero-length sequences on either side, N_q ≠ N_k both ways, odd lengths.
VARLEN_SEQLENS = [(5, 9), (0, 4), (13, 6), (3, 0), (1, 1), (17, 17)]


def _varlen_inputs(
    seqlens: list[tuple[int, int]], nheads: int, nheads_kv: int, head_dim: int
) -> tuple[torch.Tensor, ...]:
    lens_q, lens_k = zip(*seqlens, strict=True)
    cu_q = torch.tensor([0, *itertools.accumulate(lens_q)], dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(lens_k)], dtype=torch.int32)
    q, k, v, dout = (t[0] for t in _inputs(1, sum(lens_q), sum(lens_k), nheads, nheads_kv, head_dim))
    q, k, v = 2 * q, k.contiguous(), v.contiguous()
    return q, k, v, dout, cu_q, cu_k


VARLEN_OPTIONS = {
    "plain": dict(),
    "causal": dict(causal=True),
    "window-causal-alibi-bh": dict(causal=True, window_size=(3, -1), alibi="bh"),
    "window-softcap-dropout": dict(window_size=(2, 4), softcap=0.8, dropout_p=0.25),
    "everything": dict(causal=True, window_size=(4, -1), softcap=1.5, alibi="h", dropout_p=0.5),
}


@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
@pytest.mark.parametrize("case", VARLEN_OPTIONS.values(), ids=VARLEN_OPTIONS.keys())
def test_varlen_tiled_matches_naive(case: dict, heads: tuple[int, int], seed: int) -> None:
    nheads, nheads_kv = heads
    q, k, v, dout, cu_q, cu_k = _varlen_inputs(VARLEN_SEQLENS, nheads, nheads_kv, 8)
    batch, max_q, max_k = len(VARLEN_SEQLENS), 17, 17
    options = dict(case)
    causal = options.pop("causal", False)
    options["alibi_slopes"] = _slopes(options.pop("alibi", None), batch, nheads)
    naive_options = dict(options)
    if options.get("dropout_p", 0.0) > 0:
        options["rng_state"] = _rng_state()
        # The sequence index is dropout's batch index; i, j are positions inside the sequence.
        naive_options["dropout_mask"] = naive.dropout_mask(
            options["rng_state"], options["dropout_p"], batch, nheads, max_q, max_k
        )
    scale = 0.3
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out_ref, lse_ref = naive.attention_varlen(
        *leaves, cu_q, cu_k, max_q, max_k, softmax_scale=scale, causal=causal, **naive_options
    )
    grads_ref = torch.autograd.grad(out_ref, leaves, dout)
    args = (cu_q, cu_k, max_q, max_k, scale, causal)
    out, lse = tiled.attention_varlen_fwd(q, k, v, *args, block_m=4, block_n=8, **options)
    grads = tiled.attention_varlen_bwd(dout, q, k, v, out, lse, *args, block_m=8, block_n=4, **options)
    assert out.shape == q.shape and lse.shape == (nheads, q.shape[0])
    _assert_float64_close("out", out, out_ref.detach(), seed)
    _assert_float64_close("lse", lse, lse_ref, seed)
    for name, grad, grad_ref in zip(("dq", "dk", "dv"), grads, grads_ref, strict=True):
        _assert_float64_close(name, grad, grad_ref, seed)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_varlen_tiled_equals_per_sequence_runs(dtype: torch.dtype) -> None:
    """A packed batch is bitwise the dense reference run on each sequence alone."""
    q, k, v, dout, cu_q, cu_k = _varlen_inputs(VARLEN_SEQLENS, 4, 2, 8)
    q, k, v, dout = (t.to(dtype) for t in (q, k, v, dout))
    slopes = _slopes("bh", len(VARLEN_SEQLENS), 4)
    options = dict(window_size=(5, 1), softcap=1.0, block_m=4, block_n=8)
    out, lse = tiled.attention_fwd(
        q, k, v, 0.3, True, alibi_slopes=slopes, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=17, max_seqlen_k=17, **options,
    )  # fmt: skip
    grads = tiled.attention_bwd(
        dout, q, k, v, out, lse, 0.3, True, alibi_slopes=slopes, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=17, max_seqlen_k=17, **options,
    )  # fmt: skip
    bounds = zip(itertools.pairwise(cu_q.tolist()), itertools.pairwise(cu_k.tolist()), strict=True)
    for b, ((q0, q1), (k0, k1)) in enumerate(bounds):
        seq = q[None, q0:q1], k[None, k0:k1], v[None, k0:k1]
        out_b, lse_b = tiled.attention_fwd(*seq, 0.3, True, alibi_slopes=slopes[b], **options)
        dq_b, dk_b, dv_b = tiled.attention_bwd(
            dout[None, q0:q1], *seq, out_b, lse_b, 0.3, True, alibi_slopes=slopes[b], **options
        )
        assert torch.equal(out[q0:q1], out_b[0]) and torch.equal(lse[:, q0:q1], lse_b[0])
        assert torch.equal(grads[0][q0:q1], dq_b[0])
        assert torch.equal(grads[1][k0:k1], dk_b[0]) and torch.equal(grads[2][k0:k1], dv_b[0])


def test_varlen_empty_batch() -> None:
    q, k, v = torch.zeros(0, 2, 8), torch.zeros(0, 1, 8), torch.zeros(0, 1, 8)
    cu = torch.zeros(1, dtype=torch.int32)
    out, lse = tiled.attention_varlen_fwd(q, k, v, cu, cu, 0, 0, 0.5, True)
    dq, dk, dv = tiled.attention_varlen_bwd(out, q, k, v, out, lse, cu, cu, 0, 0, 0.5, True)
    out_ref, lse_ref = naive.attention_varlen(q, k, v, cu, cu, 0, 0, causal=True)
    assert out.shape == out_ref.shape == (0, 2, 8) and lse.shape == lse_ref.shape == (2, 0)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
