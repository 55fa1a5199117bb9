"""The Gluon backward's preprocess and dQ postprocess (plain Triton kernels, so the interpreter runs them on
the CPU): Δ, the base-2 LSE with +inf for padding rows and rows without a key, and the fp32 dQ accumulator
zeroed for the fused kernel's reduce-add, over dense (B, N, H, D) and packed (total, H, D) inputs seen as
one batch, and over packed sequences with each sequence's statistics at its aligned offset; NaN-poisoned."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashtile.kernels._layout import cdiv
from flashtile.kernels.hopper import bwd

LOG2_E = 1 / math.log(2)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("zero_dq", [True, False], ids=["zero-dq", "deterministic"])
@pytest.mark.parametrize("seed", [0, 1])
def test_preprocess_rows_and_zeroed_dq(packed: bool, zero_dq: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    batch, seqlen, heads, head_dim, block = (1, 77, 3, 64, 64) if packed else (2, 37, 3, 64, 64)
    shape = (seqlen, heads, head_dim) if packed else (batch, seqlen, heads, head_dim)
    out, dout = (torch.randn(shape, generator=gen, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(batch * heads * seqlen, generator=gen)
    lse[5] = -math.inf  # a row without a visible key
    seqlen_pad = cdiv(seqlen, block) * block
    lse2, delta = torch.full((2, batch * heads * seqlen_pad), math.nan)
    dq_accum = torch.full(shape, math.nan)
    (_, _, _, _), strides = bwd._dims4(out)
    grid = (seqlen_pad // block * batch * heads,)
    bwd.attn_bwd_preprocess_kernel[grid](
        out, dout, lse, lse2, delta, dq_accum if zero_dq else lse2, lse2, lse2, lse2, *strides[:3],
        *strides[:3], seqlen, seqlen_pad, seqlen_pad // block, heads, HEAD_DIM=head_dim, BLOCK=block,
        ZERO_DQ=zero_dq, IS_VARLEN=False, SINK_TERM=False,
    )  # fmt: skip
    o4, do4 = (t.reshape(batch, seqlen, heads, head_dim).float() for t in (out, dout))
    want_delta = (o4 * do4).sum(-1).permute(0, 2, 1).reshape(batch * heads, seqlen)
    want_lse2 = torch.where(lse.isneginf(), math.inf, lse * LOG2_E).reshape(batch * heads, seqlen)
    got_delta, got_lse2 = (t.reshape(batch * heads, seqlen_pad) for t in (delta, lse2))
    torch.testing.assert_close(got_delta[:, :seqlen], want_delta, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got_lse2[:, :seqlen], want_lse2, rtol=1e-6, atol=0)
    # Padding rows: P = 0 (LSE +inf) and Δ = 0, never NaN.
    assert (got_lse2[:, seqlen:] == math.inf).all()
    assert (got_delta[:, seqlen:] == 0).all()
    if zero_dq:
        assert (dq_accum == 0).all()
    else:
        assert dq_accum.isnan().all(), "the deterministic path leaves the accumulator alone"


def test_packed_tensors_are_seen_as_one_batch_without_views() -> None:
    """A packed (total, H, D) tensor is (1, total, H, D) to the descriptors and the preprocess: its strides
    are the tensor's own behind a batch stride of its size; a layout TMA cannot read becomes a copy."""
    packed = torch.empty(37, 3, 64, dtype=torch.float16)
    shape, strides = bwd._dims4(packed)
    assert shape == (1, 37, 3, 64)
    assert strides == (37 * 3 * 64, 3 * 64, 64, 1)
    dense = torch.empty(2, 37, 3, 64, dtype=torch.float16)
    assert bwd._dims4(dense) == (tuple(dense.shape), dense.stride())
    assert bwd._tma_ready(packed) is packed
    # Heads not packed next to each other (a slice of a wider tensor): copied to a contiguous tensor.
    sliced = torch.randn(37, 6, 64).half()[:, ::2]
    ready = bwd._tma_ready(sliced)
    assert ready is not sliced and ready.is_contiguous() and torch.equal(ready, sliced)


# Packed sequences: lengths with starts at every residue mod 4, an empty one, a last one ending before the
# packed tensor does (rows no sequence holds).
PACKED_LENGTHS = (5, 0, 66, 3, 130, 1)
PACKED_TOTAL = sum(PACKED_LENGTHS) + 7


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_sequences_statistics_at_aligned_offsets(seed: int) -> None:
    """Each sequence's Δ and base-2 LSE land at varlen_stats_offset (16-byte aligned, after the previous
    sequence's last value) of each head's row; nothing else of the NaN-poisoned buffer is written; the dQ
    accumulator is zeroed on the sequences' rows only."""
    gen = torch.Generator().manual_seed(seed)
    heads, head_dim, block = 3, 64, 64
    total, sequences = PACKED_TOTAL, len(PACKED_LENGTHS)
    out, dout = (torch.randn((total, heads, head_dim), generator=gen, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(heads, total, generator=gen)
    lse[1, 9] = -math.inf  # a row without a visible key
    cu = torch.tensor([0, *itertools.accumulate(PACKED_LENGTHS)], dtype=torch.int32)
    seqlen_pad = bwd.varlen_stats_rows(total, sequences, block)
    lse2, delta = torch.full((2, heads * seqlen_pad), math.nan)
    dq_accum = torch.full((total, heads, head_dim), math.nan)
    (_, _, _, _), strides = bwd._dims4(out)
    num_m_blocks = cdiv(max(PACKED_LENGTHS), block)
    bwd.attn_bwd_preprocess_kernel[(num_m_blocks * sequences * heads,)](
        out, dout, lse, lse2, delta, dq_accum, cu, lse2, lse2, *strides[:3], *strides[:3],
        total, seqlen_pad, num_m_blocks, heads, HEAD_DIM=head_dim, BLOCK=block, ZERO_DQ=True, IS_VARLEN=True,
        SINK_TERM=False,
    )  # fmt: skip
    want_delta = (out.float() * dout.float()).sum(-1).T
    want_lse2 = torch.where(lse.isneginf(), math.inf, lse * LOG2_E)
    got_delta, got_lse2 = (t.reshape(heads, seqlen_pad) for t in (delta, lse2))
    written = torch.zeros(seqlen_pad, dtype=torch.bool)
    previous_end = 0
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        offset = (start + 3) // 4 * 4 + 4 * b
        assert offset % 4 == 0 and offset >= previous_end
        previous_end = offset + end - start
        stats = slice(offset, offset + end - start)
        torch.testing.assert_close(got_delta[:, stats], want_delta[:, start:end], rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(got_lse2[:, stats], want_lse2[:, start:end], rtol=1e-6, atol=0)
        written[stats] = True
    assert previous_end <= seqlen_pad
    assert got_lse2[:, ~written].isnan().all() and got_delta[:, ~written].isnan().all()
    assert (dq_accum[: cu[-1]] == 0).all() and dq_accum[cu[-1] :].isnan().all()


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_preprocess_adds_the_sink_term(packed: bool) -> None:
    """SINK_TERM: −Σ_i P_sink,i·Δ_i·(1 − P_sink,i) over each head's rows is added to its sink gradient
    (the rest of it comes from the fused kernel's dS); rows without a key, padding rows and rows no packed
    sequence holds add nothing."""
    gen = torch.Generator().manual_seed(3)
    heads, head_dim, block = 3, 64, 64
    if packed:
        total, sequences = PACKED_TOTAL, len(PACKED_LENGTHS)
        shape, batch = (total, heads, head_dim), 1
        cu = torch.tensor([0, *itertools.accumulate(PACKED_LENGTHS)], dtype=torch.int32)
        seqlen_pad = bwd.varlen_stats_rows(total, sequences, block)
        num_m_blocks, grid_rows = cdiv(max(PACKED_LENGTHS), block), sequences
        held = torch.zeros(total, dtype=torch.bool)
        held[: int(cu[-1])] = True
    else:
        batch, total = 2, 37
        shape = (batch, total, heads, head_dim)
        seqlen_pad = cdiv(total, block) * block
        num_m_blocks, grid_rows = seqlen_pad // block, batch
        held = torch.ones(total, dtype=torch.bool)
    out, dout = (torch.randn(shape, generator=gen, dtype=torch.float16) for _ in range(2))
    lse = torch.randn(batch * heads * total, generator=gen).abs()
    lse[4] = -math.inf  # a row without a visible key
    sink = torch.randn(heads, generator=gen)
    dsink = torch.full((heads,), 0.5)
    lse2, delta = torch.full((2, batch * heads * seqlen_pad), math.nan)
    (_, _, _, _), strides = bwd._dims4(out)
    bwd.attn_bwd_preprocess_kernel[(num_m_blocks * grid_rows * heads,)](
        out, dout, lse, lse2, delta, lse2, cu if packed else lse2, sink, dsink, *strides[:3], *strides[:3],
        total, seqlen_pad, num_m_blocks, heads, HEAD_DIM=head_dim, BLOCK=block, ZERO_DQ=False,
        IS_VARLEN=packed, SINK_TERM=True,
    )  # fmt: skip
    rows = out.reshape(batch, total, heads, head_dim).double()
    d = (rows * dout.reshape(batch, total, heads, head_dim).double()).sum(-1).permute(0, 2, 1)  # (B, H, N)
    stats = lse.double().reshape(batch, heads, total)  # (B, H, N), or packed (H, total) as one batch
    # A row without a key (LSE −inf) has no sink share: the kernel reads its LSE as +inf.
    p_sink = torch.where(stats.isneginf(), 0.0, torch.exp(sink.double()[None, :, None] - stats)) * held
    want = 0.5 - (p_sink * d * (1 - p_sink)).sum((0, 2))
    torch.testing.assert_close(dsink.double(), want, rtol=1e-4, atol=1e-4)
    assert not (p_sink * held == 0).all(), "the case must hold rows with a sink share"


def test_packed_postprocess_zeroes_the_rows_no_sequence_holds() -> None:
    """dQ = scale · the fp32 sum on the sequences' rows; 0 on the rows before the first and after the last
    (the preprocess did not zero their NaN-poisoned accumulator rows)."""
    heads, head_dim = 2, 16
    total = 23
    accum = torch.randn(total, heads, head_dim)
    accum[:3] = math.nan
    accum[17:] = math.nan
    cu = torch.tensor([3, 10, 10, 17], dtype=torch.int32)
    dq = torch.full((total, heads, head_dim), math.nan, dtype=torch.float16)
    numel = accum.numel()
    bwd.attn_bwd_dq_postprocess_kernel[(cdiv(numel, 256),)](
        accum, dq, cu, numel, 0.5, heads * head_dim, cu.numel() - 1, BLOCK=256, IS_VARLEN=True
    )
    assert (dq[:3] == 0).all() and (dq[17:] == 0).all()
    torch.testing.assert_close(dq[3:17], (accum[3:17] * 0.5).half())


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    leading=st.integers(0, 5),
    trailing=st.integers(0, 5),
)
def test_packed_statistics_never_overlap_and_fit_their_row(lengths, leading, trailing) -> None:
    """For any packed batch (empty sequences, rows before the first and after the last), each sequence's
    statistics land 16-byte aligned, after the previous sequence's, and inside the row varlen_stats_rows
    sizes, with room for the fused kernel's last box (a block past the sequence's last block start)."""
    heads, head_dim, block = 1, 16, 16
    total = leading + sum(lengths) + trailing
    cu = torch.tensor([leading, *(leading + s for s in itertools.accumulate(lengths))], dtype=torch.int32)
    sequences = len(lengths)
    seqlen_pad = bwd.varlen_stats_rows(total, sequences, block)
    out = torch.ones((max(total, 1), heads, head_dim), dtype=torch.float16)
    lse = torch.arange(max(total, 1), dtype=torch.float32).reshape(heads, -1)
    lse2, delta = torch.full((2, heads * seqlen_pad), math.nan)
    (_, _, _, _), strides = bwd._dims4(out)
    num_m_blocks = max(cdiv(max(lengths), block), 1)
    bwd.attn_bwd_preprocess_kernel[(num_m_blocks * sequences * heads,)](
        out, out, lse, lse2, delta, lse2, cu, lse2, lse2, *strides[:3], *strides[:3],
        total, seqlen_pad, num_m_blocks, heads, HEAD_DIM=head_dim, BLOCK=block, ZERO_DQ=False, IS_VARLEN=True,
        SINK_TERM=False,
    )  # fmt: skip
    previous_end = 0
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)):
        offset = (start + 3) // 4 * 4 + 4 * b
        assert offset % 4 == 0 and offset >= previous_end
        previous_end = offset + end - start
        # Every row's base-2 LSE (its packed row number, in the input) at its place.
        want = torch.arange(start, end, dtype=torch.float32) * LOG2_E
        torch.testing.assert_close(lse2[offset : offset + end - start], want, rtol=1e-6, atol=0)
        last_box_start = offset + max(end - start - 1, 0) // block * block
        assert last_box_start + block <= seqlen_pad + block  # the launcher allocates one spare block
    assert previous_end <= seqlen_pad
    assert int((~lse2.isnan()).sum()) == sum(lengths)
