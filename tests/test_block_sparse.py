"""Block-sparse attention, mask_mod and score_mod: the kernels and the CPU reference against the float64
naive oracle (flash-attention's 2×/3× rule) for every mask in flashtile.masks, custom mods, random tile
densities with GQA, varlen and causal; ALiBi and softcap as score_mods equal to the built-in options; the
errors for bad inputs.

On the CPU the kernels run in Triton's interpreter (fp16, N ≤ 130); ``pytest -m gpu`` runs bf16/fp16 at
N up to 2048 with the Hopper tiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import triton
import triton.language as tl

import flashtile
from flashtile import BlockMask, create_block_mask, masks
from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd
from flashtile.mods import Mods
from flashtile.reference import naive
from tests.helpers import HEAD_LAYOUTS, RESULT_NAMES, assert_matches_oracle


@triton.jit
def relative_bias(score, b, h, q_idx, kv_idx, aux):
    return score + tl.load(aux[1] + (q_idx - kv_idx + 4096))


@triton.jit
def unit_grad(score, b, h, q_idx, kv_idx):
    return score * 0.0 + 1.0


@triton.jit
def alibi_mod(score, b, h, q_idx, kv_idx, aux):
    return score - tl.load(aux[0] + h) * tl.abs(q_idx - kv_idx).to(tl.float32)


@triton.jit
def softcap_mod(score, b, h, q_idx, kv_idx):
    return 2.0 * (1.0 - 2.0 / (tl.exp(score) + 1.0))


@triton.jit
def softcap_mod_bwd(score, b, h, q_idx, kv_idx):
    t = 1.0 - 2.0 / (tl.exp(score) + 1.0)
    return 1.0 - t * t


@triton.jit
def odd_heads_causal(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) | (h % 2 == 0)


def _custom_score_aux(n: int, device: str) -> tuple[torch.Tensor, ...]:
    ids = masks.document_ids(torch.tensor([0, n // 3, n], device=device))
    return ids, torch.randn(8192, device=device) * 0.5


@dataclass(frozen=True)
class MaskCase:
    name: str
    mask_mod: object = None
    score_mod: object = None
    score_mod_bwd: object = None
    aux: bool = False
    tiles_density: float | None = None
    block_size: int = 64
    per_head: bool = False


MASK_CASES = [
    MaskCase("causal", masks.causal),
    MaskCase("sliding_window", masks.sliding_window(20, 3), block_size=32),
    MaskCase("document", masks.document(), aux=True),
    MaskCase("prefix_lm", masks.prefix_lm(40)),
    MaskCase("strided", masks.strided(3), block_size=32),
    MaskCase("block_diagonal", masks.block_diagonal(32)),
    MaskCase("causal_document_bias", masks.and_masks(masks.causal, masks.document()), relative_bias,
    unit_grad, True),
    MaskCase("odd_heads_causal_softcap", odd_heads_causal, softcap_mod, softcap_mod_bwd, per_head=True),
    MaskCase("random_tiles", tiles_density=0.5, per_head=True),
]  # fmt: skip


def _block_mask(case: MaskCase, batch: int, heads: int, n_q: int, n_k: int, aux, device) -> BlockMask | None:
    if case.tiles_density is not None:
        tiles = torch.rand(
            batch, heads, -(-n_q // case.block_size), -(-n_k // case.block_size), device=device
        )
        tiles = tiles < case.tiles_density
        # One query block with no key block: its rows must give out = 0, lse = −inf and no NaN.
        tiles[:, :, 0] = False
        return BlockMask.from_tiles(tiles, n_q, n_k, case.block_size)
    return create_block_mask(
        case.mask_mod, batch, heads if case.per_head else None, n_q, n_k, case.block_size, device, aux
    )


def _nan_tail(t: torch.Tensor) -> torch.Tensor:
    """``t`` as the leading rows of a buffer one NaN row longer."""
    buffer = torch.full((t.shape[0] + 1, *t.shape[1:]), float("nan"), dtype=t.dtype, device=t.device)
    buffer[: t.shape[0]] = t
    return buffer[: t.shape[0]]


def _run_case(
    case: MaskCase, layout: str, seqlens, varlen: bool, causal: bool, dtype, device, seed, sink=False, dv=32
) -> None:
    """The case against the oracle; ``sink``: with a random learnable_sink (its gradient checked too);
    ``dv``: V's head dim (Q/K's is 32)."""
    heads, heads_kv = HEAD_LAYOUTS[layout]
    d = 32
    if varlen:
        lengths_q = torch.tensor([0] + [q for q, _ in seqlens])
        lengths_k = torch.tensor([0] + [k for _, k in seqlens])
        cu_q = lengths_q.cumsum(0).to(torch.int32).to(device)
        cu_k = lengths_k.cumsum(0).to(torch.int32).to(device)
        n_q, n_k = int(lengths_q.max()), int(lengths_k.max())
        # A NaN row past each packed tensor's end: a kernel that reads past the last sequence gets NaN.
        q = _nan_tail(torch.randn(int(cu_q[-1]), heads, d, dtype=dtype, device=device))
        k = _nan_tail(torch.randn(int(cu_k[-1]), heads_kv, d, dtype=dtype, device=device))
        v = _nan_tail(torch.randn(int(cu_k[-1]), heads_kv, dv, dtype=dtype, device=device))
        varlen_kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=n_q, max_seqlen_k=n_k)
        batch = len(seqlens)
    else:
        batch, (n_q, n_k) = len(seqlens), seqlens[0]
        q = torch.randn(batch, n_q, heads, d, dtype=dtype, device=device)
        k = torch.randn(batch, n_k, heads_kv, d, dtype=dtype, device=device)
        v = torch.randn(batch, n_k, heads_kv, dv, dtype=dtype, device=device)
        varlen_kw = {}
    dout = torch.randn(*q.shape[:-1], dv, dtype=dtype, device=device)
    learnable_sink = torch.randn(heads, device=device) if sink else None
    aux = _custom_score_aux(max(n_q, n_k), device) if case.aux else None
    bm = _block_mask(case, batch, heads, n_q, n_k, aux, device)
    mods = Mods(bm, None, case.score_mod, case.score_mod_bwd, aux)
    window = (-1, 0) if causal else (-1, -1)
    scale = d**-0.5
    kw = dict(window_size=window, mods=mods, learnable_sink=learnable_sink, **varlen_kw)
    out, lse = attn_fwd(q, k, v, scale, causal, **kw)
    grads = attn_bwd(dout, q, k, v, out, lse, scale, causal, **kw)
    ours = (out, lse, *grads)

    def reference(ref_dtype):
        leaves = [t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v)]
        if sink:
            # The float64 oracle's sink in float64, the baseline's in float32 (the kernels' precision).
            sink_dtype = torch.float64 if ref_dtype == torch.float64 else torch.float32
            leaves.append(learnable_sink.detach().to(sink_dtype).requires_grad_())
        kw = dict(softmax_scale=scale, causal=causal, mods=mods, learnable_sink=leaves[3] if sink else None)
        if varlen:
            o, l_ = naive.attention_varlen(*leaves[:3], cu_q, cu_k, n_q, n_k, **kw)
        else:
            o, l_ = naive.attention(*leaves[:3], **kw)
        o.backward(dout.to(ref_dtype))
        return o, l_, *(t.grad for t in leaves)

    oracle, baseline = reference(torch.float64), reference(dtype)
    names = (*RESULT_NAMES, "dsink") if sink else RESULT_NAMES
    for name, mine, ref, base in zip(names, ours, oracle, baseline, strict=True):
        assert not torch.isnan(mine).any(), f"{name}: NaN ({case.name}, seed {seed})"
        assert_matches_oracle(name, mine, ref, base, grad=name.startswith("d"), seed=seed)
    if case.tiles_density is not None and not varlen:
        # The first query block sees no key block: out = 0 and lse = −inf, or the sink's logit.
        rows = slice(0, case.block_size)
        empty_lse = torch.full_like(lse[:, :, rows], -math.inf)
        if sink:
            empty_lse = learnable_sink[:, None].expand_as(empty_lse)
        assert (out[:, rows] == 0).all()
        torch.testing.assert_close(lse[:, :, rows], empty_lse)


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c.name)
def test_masks_and_mods_match_oracle(case: MaskCase, seed: int, nan_poisoned_allocations: None) -> None:
    _run_case(case, "gqa", ((100, 130),) * 2, False, False, torch.float16, "cpu", seed)


@pytest.mark.parametrize(
    "case, layout, seqlens, varlen, causal",
    [
        (MASK_CASES[-1], "mqa", ((70, 20), (33, 97), (0, 5)), True, False),
        (MASK_CASES[3], "mha", ((97, 65), (64, 64)), True, True),
        (MASK_CASES[-1], "gqa", ((65, 100),), False, True),
        (MASK_CASES[0], "gqa", ((40, 70), (0, 33), (50, 0)), True, False),
    ],
    ids=["tiles-varlen-mqa", "prefix_lm-varlen-causal", "tiles-causal", "causal-varlen-empty-q-and-k"],
)
def test_block_mask_with_varlen_gqa_causal(case, layout, seqlens, varlen, causal, seed: int) -> None:
    _run_case(case, layout, seqlens, varlen, causal, torch.float16, "cpu", seed)


@pytest.mark.parametrize(
    "case, layout, seqlens, varlen, dv",
    [
        (MASK_CASES[6], "gqa", ((100, 130),), False, 24),
        (MASK_CASES[-1], "mqa", ((70, 20), (33, 97), (0, 5)), True, 32),
        (MASK_CASES[-1], "gqa", ((65, 100),), False, 48),
    ],
    ids=["causal_document_bias-dv24", "tiles-varlen-mqa", "tiles-dv48"],
)
def test_block_masks_with_learnable_sink_and_v_head_dim(case, layout, seqlens, varlen, dv, seed: int) -> None:
    _run_case(case, layout, seqlens, varlen, False, torch.float16, "cpu", seed, sink=True, dv=dv)


def test_reference_backend_runs_mods_with_learnable_sink(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    q, k = (torch.randn(2, 90, 2, 16, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 90, 2, 24, dtype=torch.float64, requires_grad=True)
    sink = torch.randn(2, dtype=torch.float64, requires_grad=True)
    ids, table = _custom_score_aux(90, "cpu")
    bm = create_block_mask(masks.document(), None, None, 90, 90, 32, aux_tensors=(ids, table))
    kw = dict(score_mod=relative_bias, score_mod_bwd=unit_grad, aux_tensors=(ids, table))
    out = flashtile.flash_attn_func(q, k, v, block_mask=bm, learnable_sink=sink, **kw)
    expected, _ = naive.attention(q, k, v, mods=Mods(bm, None, **kw), learnable_sink=sink)
    torch.testing.assert_close(out, expected)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sink), dout)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, (q, k, v, sink), dout))


def test_learnable_sink_gradient_with_score_mod_needs_score_mod_bwd() -> None:
    # Regression: only the sink requiring grad still runs the backward, which needs d score_mod / d score.
    q = k = v = torch.randn(1, 40, 2, 16)
    sink = torch.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"score_mod needs score_mod_bwd .* learnable_sink requires grad"):
        flashtile.flash_attn_func(q, k, v, score_mod=softcap_mod, learnable_sink=sink)


def test_score_mods_equal_builtin_alibi_and_softcap(seed: int) -> None:
    q, k, v = (torch.randn(1, 70, 2, 32, dtype=torch.float16) for _ in range(3))
    slopes = torch.tensor([0.3, 0.1])
    builtin = attn_fwd(q, k, v, 0.2, False, alibi_slopes=slopes)
    mods = Mods(score_mod=alibi_mod, aux_tensors=(slopes,))
    torch.testing.assert_close(attn_fwd(q, k, v, 0.2, False, mods=mods), builtin, atol=2e-3, rtol=1e-3)
    builtin = attn_fwd(q, k, v, 0.2, False, softcap=2.0)
    mods = Mods(score_mod=softcap_mod, score_mod_bwd=softcap_mod_bwd)
    torch.testing.assert_close(attn_fwd(q, k, v, 0.2, False, mods=mods), builtin, atol=2e-3, rtol=1e-3)
    dout = torch.randn_like(q)
    grads = attn_bwd(dout, q, k, v, *builtin, 0.2, False, softcap=2.0)
    torch.testing.assert_close(
        attn_bwd(dout, q, k, v, *builtin, 0.2, False, mods=mods), grads, atol=2e-3, rtol=1e-3
    )


def test_reference_backend_runs_the_mods(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    q, k, v = (torch.randn(2, 90, 2, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    ids, table = _custom_score_aux(90, "cpu")
    mask = masks.and_masks(masks.causal, masks.document())
    bm = create_block_mask(mask, None, None, 90, 90, 32, aux_tensors=(ids, table))
    kw = dict(score_mod=relative_bias, score_mod_bwd=unit_grad, aux_tensors=(ids, table))
    out = flashtile.flash_attn_func(q, k, v, block_mask=bm, **kw)
    expected, _ = naive.attention(q, k, v, mods=Mods(bm, None, **kw))
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    expected_grads = torch.autograd.grad(expected, (q, k, v), torch.ones_like(out))
    torch.testing.assert_close(grads, expected_grads)
    # A mask_mod without a block mask runs on every tile and gives the same result.
    out = flashtile.flash_attn_func(q, k, v, mask_mod=mask, **kw)
    torch.testing.assert_close(out, expected)


def test_create_block_mask_tiles_and_lists() -> None:
    bm = create_block_mask(masks.sliding_window(64, 0), None, None, 256, 200, block_size=64)
    assert bm.tile_states[0, 0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    assert bm.kv_num_blocks[0, 0].tolist() == [1, 2, 2, 2]
    assert bm.kv_indices[0, 0, 2, :2].tolist() == [1, 2]
    assert bm.q_num_blocks[0, 0].tolist() == [2, 2, 2, 1]
    assert bm.q_indices[0, 0, 1, :2].tolist() == [1, 2]
    assert bm.full_kv_num_blocks.sum() == 0


def _errors_case(**kwargs):
    q = torch.randn(1, 64, 4, 16)
    return flashtile.flash_attn_func(q, q, q, **kwargs)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(mask_mod=lambda b, h, i, j: i >= j), TypeError, "@triton.jit"),
        (dict(block_mask=torch.ones(1, 1, dtype=torch.bool)), TypeError, "flashtile.BlockMask"),
        (dict(block_mask=create_block_mask(masks.causal, 1, 3, 64, 64, 64)), ValueError, "(B, H) = (1, 3)"),
        (dict(block_mask=create_block_mask(masks.causal, 1, 1, 64, 65, 64)), ValueError, "(64, 65)"),
        (dict(mask_mod=masks.document()), ValueError, "aux_tensors is None"),
        (
            dict(mask_mod=masks.document(), aux_tensors=(torch.zeros(64, dtype=torch.bool),)),
            TypeError,
            "bool",
        ),
        (dict(mask_mod=masks.document(), aux_tensors=torch.zeros(64)), TypeError, "tuple or list"),
        (dict(score_mod_bwd=unit_grad), ValueError, "without score_mod"),
    ],
    ids=["not-jit", "tensor-mask", "heads", "seqlen", "no-aux", "aux-dtype", "aux-not-tuple", "bwd-alone"],
)
def test_bad_inputs_raise_before_launch(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=__import__("re").escape(words)):
        _errors_case(**kwargs)


def test_bad_block_sizes_and_missing_score_mod_bwd() -> None:
    with pytest.raises(ValueError, match="block_size must be one of"):
        create_block_mask(masks.causal, None, None, 64, 64, block_size=48)
    with pytest.raises(ValueError, match="tiles must have"):
        BlockMask.from_tiles(torch.ones(2, 2, dtype=torch.bool), 64, 64, 64)
    q = torch.randn(1, 64, 4, 16, requires_grad=True)
    with pytest.raises(ValueError, match="score_mod_bwd"):
        flashtile.flash_attn_func(q, q, q, score_mod=softcap_mod)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c.name)
def test_gpu_masks_and_mods(case: MaskCase, dtype: torch.dtype, seed: int) -> None:
    big = MaskCase(**{**case.__dict__, "block_size": 128})
    _run_case(big, "gqa", ((1000, 1500),) * 2, False, False, dtype, "cuda", seed)
    _run_case(big, "mqa", ((700, 300), (1025, 2048), (0, 5)), True, True, dtype, "cuda", seed)


@pytest.mark.gpu
def test_gpu_block_mask_from_kernels_default_tiles(seed: int) -> None:
    # The causal mask as a block mask gives causal attention. Not bitwise: on Hopper the block-sparse kernel
    # visits a query block's partial (diagonal) key block first, the causal kernel last.
    q, k, v = (torch.randn(2, 2048, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    bm = create_block_mask(masks.causal, None, None, 2048, 2048, 128, "cuda")
    oracle, _ = naive.attention(q.double(), k.double(), v.double(), causal=True)
    baseline, _ = naive.attention(q, k, v, causal=True)
    for out in (
        flashtile.flash_attn_func(q, k, v, block_mask=bm),
        flashtile.flash_attn_func(q, k, v, causal=True),
    ):
        assert_matches_oracle("out", out, oracle, baseline, seed=seed)


def test_which_block_masks_the_hopper_kernels_take(monkeypatch: pytest.MonkeyPatch) -> None:
    # A block mask of 128/256-row blocks (and its mask_mod), on dense batches; the rest names what sends it
    # elsewhere.
    from flashtile.kernels.hopper.support import MASK_MOD_ENV
    from flashtile.kernels.hopper.support import block_mask_unsupported_reason as reason

    monkeypatch.delenv(MASK_MOD_ENV, raising=False)

    tiles = torch.ones(2, 3, dtype=torch.bool)
    bm = BlockMask.from_tiles(tiles, 256, 300, 128)
    assert reason(None, False) is None
    assert reason(Mods(bm), False) is None
    assert reason(Mods(BlockMask.from_tiles(tiles, 512, 600, (256, 256))), False) is None
    assert "128, 256" in reason(Mods(BlockMask.from_tiles(tiles, 128, 150, 64)), False)
    assert "variable-length" in reason(Mods(bm), True)
    with_mod = Mods(create_block_mask(masks.causal, None, None, 256, 300, 128))
    assert reason(with_mod, False) is None
    assert reason(Mods(bm, masks.causal), False) is None
    assert "without a block mask" in reason(Mods(mask_mod=masks.causal), False)
    assert "score_mod" in reason(Mods(bm, None, softcap_mod, softcap_mod_bwd), False)
    monkeypatch.setenv(MASK_MOD_ENV, "0")
    assert MASK_MOD_ENV in reason(with_mod, False)
    assert reason(Mods(bm), False) is None


def test_mask_bits_hold_the_mask_mod_on_partial_tiles() -> None:
    # Odd lengths, per-head masks, blocks of 32 to 256 (bit 31 of each word included).
    from flashtile.block_mask import PARTIAL

    for block in (32, (64, 256), 128):
        bm = create_block_mask(odd_heads_causal, 2, 3, 300, 517, block)
        bq, bk = bm.block_size
        ids, words = bm.bits.ids, bm.bits.words
        assert ((ids >= 0) == (bm.tile_states == PARTIAL)).all()
        b, h, qb, kb = (bm.tile_states == PARTIAL).nonzero()[5].tolist()
        tile = words[ids[b, h, qb, kb]]
        seen = ((tile[:, :, None] >> torch.arange(32)) & 1).reshape(bq, bk).bool()
        rows = torch.arange(qb * bq, (qb + 1) * bq)[:, None]
        cols = torch.arange(kb * bk, (kb + 1) * bk)[None, :]
        expected = ((rows >= cols) | (h % 2 == 0)) & (rows < 300) & (cols < 517)
        assert torch.equal(seen, expected)


def test_hopper_kernels_read_mask_bits_only_for_the_masks_own_unchanged_aux(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flashtile.kernels._mask_bits import ENV_VAR, reads_bits

    monkeypatch.delenv(ENV_VAR, raising=False)
    ids = masks.document_ids(torch.tensor([0, 50, 130]))
    bm = create_block_mask(masks.document(), None, None, 130, 130, 64, "cpu", (ids,))
    assert reads_bits(Mods(bm, None, None, None, (ids,)))
    assert reads_bits(Mods(bm, masks.document(), None, None, (ids,))) is False  # another function object
    # Other tensors, no bits (from_tiles), or the switch: the kernels run the mask_mod itself.
    assert not reads_bits(Mods(bm, None, None, None, (ids.clone(),)))
    assert not reads_bits(Mods(BlockMask.from_tiles(torch.ones(3, 3, dtype=torch.bool), 130, 130, 64)))
    monkeypatch.setenv(ENV_VAR, "0")
    assert not reads_bits(Mods(bm, None, None, None, (ids,)))
    monkeypatch.delenv(ENV_VAR)
    ids.add_(0)  # modified in place: the bits may no longer hold
    assert not reads_bits(Mods(bm, None, None, None, (ids,)))
