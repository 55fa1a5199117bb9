"""bert_padding: flash_attn 2.8's unpad/pad helpers against a masked_select formulation, with gradients."""

from __future__ import annotations

import pytest
import torch

from flashtile.bert_padding import (
    index_first_axis,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)


def _random_mask(batch: int, seqlen: int) -> torch.Tensor:
    """A right-padded mask with lengths in [0, seqlen], including an empty row and a full one."""
    lengths = torch.randint(0, seqlen + 1, (batch,))
    lengths[0], lengths[-1] = 0, seqlen
    return torch.arange(seqlen)[None, :] < lengths[:, None]


MASK_DTYPES = {"bool": torch.bool, "int32": torch.int32, "int64": torch.int64}


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES.values(), ids=MASK_DTYPES.keys())
def test_unpad_matches_masked_select(mask_dtype: torch.dtype, seed: int) -> None:
    batch, seqlen, nheads, head_dim = 5, 11, 3, 4
    x = torch.randn(batch, seqlen, nheads, head_dim)
    mask = _random_mask(batch, seqlen)
    # Holes inside a row too: unpad_input selects whatever the mask selects.
    mask[2, 1] = False
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask.to(mask_dtype))
    expected = x.masked_select(mask[:, :, None, None]).reshape(-1, nheads, head_dim)
    lengths = mask.sum(-1)
    assert torch.equal(packed, expected)
    assert torch.equal(indices, torch.arange(batch * seqlen)[mask.flatten()])
    assert cu_seqlens.tolist() == [0, *torch.cumsum(lengths, 0).tolist()]
    assert max_seqlen == int(lengths.max()) and isinstance(max_seqlen, int)
    assert seqused.tolist() == lengths.tolist()
    assert indices.dtype == torch.int64
    assert cu_seqlens.dtype == torch.int32 and seqused.dtype == torch.int32


def test_unpad_with_unused_mask(seed: int) -> None:
    x = torch.randn(2, 5, 3)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 0, 0]])
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask, unused)
    selected = (mask + unused).bool()
    assert torch.equal(packed, x[selected])
    assert indices.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert cu_seqlens.tolist() == [0, 4, 7] and max_seqlen == 4
    # seqused counts the attention_mask tokens only: the unused slots are packed but not attended.
    assert seqused.tolist() == [2, 3]


@pytest.mark.parametrize("shape", [(4, 9), (4, 9, 6), (4, 9, 2, 3)], ids=["2d", "3d", "4d"])
def test_pad_inverts_unpad(shape: tuple[int, ...], seed: int) -> None:
    x = torch.randn(*shape)
    mask = _random_mask(*shape[:2])
    packed, indices, *_ = unpad_input(x, mask)
    padded = pad_input(packed, indices, *shape[:2])
    assert padded.shape == x.shape
    keep = mask.reshape(*shape[:2], *([1] * (len(shape) - 2)))
    assert torch.equal(padded, torch.where(keep, x, torch.zeros_like(x)))


def test_unpad_of_an_empty_batch() -> None:
    packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(
        torch.zeros(0, 4, 2), torch.zeros(0, 4, dtype=torch.bool)
    )
    assert packed.shape == (0, 2) and indices.shape == (0,) and seqused.shape == (0,)
    assert cu_seqlens.tolist() == [0] and max_seqlen == 0


def test_unpad_rejects_mismatched_mask() -> None:
    with pytest.raises(ValueError, match="attention_mask"):
        unpad_input(torch.zeros(2, 4, 3), torch.ones(2, 5, dtype=torch.bool))


def test_index_functions_reject_bad_indices() -> None:
    with pytest.raises(TypeError, match="indices"):
        index_first_axis(torch.zeros(3, 2), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match="indices"):
        index_put_first_axis(torch.zeros(3, 2), torch.tensor([0, 1]), 4)


def test_gradcheck_index_first_axis(seed: int) -> None:
    x = torch.randn(7, 3, 2, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([5, 0, 2, 6])
    assert torch.autograd.gradcheck(lambda t: index_first_axis(t, indices), (x,))


def test_index_first_axis_sums_gradients_of_repeated_indices() -> None:
    x = torch.zeros(3, 1, requires_grad=True)
    index_first_axis(x, torch.tensor([1, 1, 2])).sum().backward()
    assert x.grad[:, 0].tolist() == [0.0, 2.0, 1.0]


def test_gradcheck_index_put_first_axis(seed: int) -> None:
    values = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([5, 0, 2, 6])
    assert torch.autograd.gradcheck(lambda t: index_put_first_axis(t, indices, 8), (values,))


def test_gradcheck_unpad_and_pad(seed: int) -> None:
    x = torch.randn(3, 5, 2, dtype=torch.float64, requires_grad=True)
    mask = _random_mask(3, 5)
    indices = unpad_input(x, mask)[1]
    assert torch.autograd.gradcheck(lambda t: unpad_input(t, mask)[0], (x,))
    packed = unpad_input(x, mask)[0].detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices, 3, 5), (packed,))


def test_unpad_for_concatenated_sequences(seed: int) -> None:
    # flash_attn's docstring example: row 0 holds samples of 2 and 3 tokens, row 1 of 3 and 2, row 2 one of 6.
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    x = torch.randn(3, 6, 2, 4)
    packed, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    tokens = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(packed, x[tokens])
    assert torch.equal(indices, torch.arange(18)[tokens.flatten()])
    assert cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16] and cu_seqlens.dtype == torch.int32
    assert max_seqlen == 6 and isinstance(max_seqlen, int)
    assert torch.equal(pad_input(packed, indices, 3, 6), torch.where(tokens[..., None, None], x, 0.0))


def test_pad_input_takes_int32_indices(seed: int) -> None:
    # flash_attn's ``output[indices] = values`` takes int32 indices; index_copy_ alone would not.
    values = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    indices = torch.tensor([4, 0, 2])
    expected = pad_input(values, indices, 2, 3)
    assert torch.equal(pad_input(values, indices.int(), 2, 3), expected)
    assert torch.equal(index_put_first_axis(values, indices.int(), 6), expected.flatten(0, 1))
    assert torch.autograd.gradcheck(lambda t: pad_input(t, indices.int(), 2, 3), (values,))


@pytest.mark.parametrize(
    ("mask", "unused", "match"),
    [
        (
            torch.ones(4, dtype=torch.bool),
            None,
            r"attention_mask must be 2-D \(batch, seqlen\); got shape \(4,\)",
        ),
        (torch.ones(2, 4, 1, dtype=torch.bool), None, r"attention_mask must be 2-D .* got shape \(2, 4, 1\)"),
        (torch.ones(3, 4, dtype=torch.bool), None, r"attention_mask \(3, 4\)"),
        (
            torch.ones(2, 4),
            torch.zeros(4),
            r"unused_mask must match attention_mask: shape \(2, 4\) .* \(4,\)",
        ),
        (torch.ones(2, 4), torch.zeros(2, 5), r"unused_mask .* got shape \(2, 5\)"),
        (torch.ones(2, 4), torch.zeros(2, 4, 1), r"unused_mask .* got shape \(2, 4, 1\)"),
    ],
    ids=["mask-1d", "mask-3d", "mask-batch", "unused-broadcast", "unused-seqlen", "unused-3d"],
)
def test_unpad_rejects_bad_masks(mask: torch.Tensor, unused: torch.Tensor | None, match: str) -> None:
    # Raised before any work, as a RuntimeError too (flash_attn's torch errors are RuntimeErrors).
    with pytest.raises(ValueError, match=match) as caught:
        unpad_input(torch.zeros(2, 4, 3), mask, unused)
    assert isinstance(caught.value, RuntimeError)


def test_unpad_rejects_non_tensors_and_a_mask_on_another_device() -> None:
    with pytest.raises(TypeError, match=r"attention_mask must be a torch\.Tensor; got list"):
        unpad_input(torch.zeros(1, 2, 3), [[1, 0]])
    with pytest.raises(TypeError, match=r"indices must be a torch\.Tensor; got list"):
        index_first_axis(torch.zeros(3, 2), [0, 1])
    # The meta device stands in for a GPU: the mask must sit with hidden_states.
    hidden = torch.zeros(1, 2, 3, device="meta")
    with pytest.raises(ValueError, match="attention_mask must be on hidden_states' device, meta; got cpu"):
        unpad_input(hidden, torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask_in_length must be on hidden_states' device"):
        unpad_input_for_concatenated_sequences(hidden, torch.tensor([[2, 0]]))


@pytest.mark.parametrize("bad", [-1, 7], ids=["negative", "past-the-end"])
def test_index_functions_reject_out_of_range_indices(bad: int) -> None:
    indices = torch.tensor([0, bad])
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\) \(the rows of input\)") as caught:
        index_first_axis(torch.zeros(4, 2), indices)
    assert isinstance(caught.value, RuntimeError)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\) \(first_axis_dim\)"):
        index_put_first_axis(torch.zeros(2, 2), indices, 4)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\) \(batch · seqlen = 2 · 2\)"):
        pad_input(torch.zeros(2, 2), indices, 2, 2)


def test_index_put_and_pad_reject_bad_sizes() -> None:
    values, indices = torch.zeros(2, 3), torch.tensor([0, 1])
    for bad in (-1, 4.0, True):
        with pytest.raises(ValueError, match=f"first_axis_dim must be an integer ≥ 0; got {bad!r}"):
            index_put_first_axis(values, indices, bad)
    with pytest.raises(ValueError, match="seqlen must be an integer ≥ 0; got -2"):
        pad_input(values, indices, 1, -2)
    # A 0-d integer tensor is an integer, as torch.zeros takes it.
    assert index_put_first_axis(values, indices, torch.tensor(4)).shape == (4, 3)


@pytest.mark.parametrize(
    ("lengths", "error", "match"),
    [
        (
            [[3, 3, 0, 0], [1, 0, 0, 0]],
            ValueError,
            "rows must sum to at most seqlen = 4; got a row summing to 6",
        ),
        ([[3, -1, 0, 0], [1, 0, 0, 0]], ValueError, "must hold lengths ≥ 0; got -1"),
        (
            [[True, True, False, False], [True] * 4],
            TypeError,
            "integer tensor of sample lengths .* torch.bool",
        ),
        ([[2.0, 1.0, 0.0, 0.0], [4.0, 0, 0, 0]], TypeError, "integer tensor .* torch.float32"),
    ],
    ids=["row-overflow", "negative", "bool-mask", "float"],
)
def test_unpad_for_concatenated_sequences_rejects_bad_lengths(lengths: list, error: type, match: str) -> None:
    # Lengths that overflow a row gave cu_seqlens ending past the packed tokens: out-of-bounds reads later.
    with pytest.raises(error, match=f"attention_mask_in_length.*{match}"):
        unpad_input_for_concatenated_sequences(torch.zeros(2, 4, 3), torch.tensor(lengths))


def test_unpad_for_concatenated_sequences_of_zero_lengths() -> None:
    packed, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(
        torch.zeros(2, 3, 1), torch.tensor([[0, 0, 0], [2, 0, 1]], dtype=torch.int32)
    )
    # A zero between lengths is skipped, as in flash_attn: samples of 2 and 1 in row 1.
    assert packed.shape == (3, 1) and indices.tolist() == [3, 4, 5]
    assert cu_seqlens.tolist() == [0, 2, 3] and max_seqlen == 2 and isinstance(max_seqlen, int)
