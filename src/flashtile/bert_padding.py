"""Padding helpers for the variable-length functions, with flash_attn 2.8's ``bert_padding`` API.

A padded batch ``(batch, seqlen, ...)`` with an ``attention_mask`` becomes the packed ``(total, ...)``
layout of ``flash_attn_varlen_func`` and back:

>>> x = torch.arange(6.0).reshape(2, 3, 1)
>>> mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
>>> packed, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
>>> packed[:, 0].tolist(), indices.tolist(), cu_seqlens.tolist(), max_seqlen, seqused.tolist()
([0.0, 1.0, 3.0], [0, 1, 3], [0, 2, 3], 2, [2, 1])
>>> pad_input(packed, indices, 2, 3)[..., 0].tolist()
[[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]]

Gathers and scatters index the first axis with integer indices through custom autograd Functions, so
no boolean mask is broadcast over the feature dimensions. ``max_seqlen`` is a Python int read with one
host synchronisation, as in flash_attn (the varlen kernels take it as an int).
"""

from __future__ import annotations

import operator

import torch

from flashtile.errors import FlashtileTypeError, FlashtileValueError


def _check_tensor(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise FlashtileTypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}")


def _check_first_axis(name: str, t: torch.Tensor) -> None:
    _check_tensor(name, t)
    if t.dim() < 1:
        raise FlashtileValueError(f"{name} must have at least one dimension to index; got a 0-d tensor")


def _check_size(name: str, value: object) -> int:
    """``value`` as an int ≥ 0 (a Python or NumPy integer, or a 0-d integer tensor)."""
    try:
        size = operator.index(value)
    except TypeError:
        size = -1
    if isinstance(value, bool) or size < 0:
        raise FlashtileValueError(f"{name} must be an integer ≥ 0; got {value!r}")
    return size


def _check_indices(indices: object, rows: int, rows_name: str) -> None:
    _check_tensor("indices", indices)
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise FlashtileTypeError(
            f"indices must be a 1-d int64 (or int32) tensor; got shape {tuple(indices.shape)}, "
            f"dtype {indices.dtype}"
        )
    # Bounds are read only where that costs no device synchronisation; torch.compile cannot trace the read.
    if indices.device.type == "cpu" and indices.numel() and not torch.compiler.is_compiling():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= rows:
            raise FlashtileValueError(
                f"indices must lie in [0, {rows}) ({rows_name}); got values from {low} to {high}"
            )


class IndexFirstAxis(torch.autograd.Function):
    """``input[indices]`` along the first axis; the backward scatters the gradient back (summing repeats)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, input: torch.Tensor, indices: torch.Tensor):
        _check_first_axis("input", input)
        _check_indices(indices, input.shape[0], "the rows of input")
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros(ctx.first_axis_dim, *grad_output.shape[1:])
        return grad_input.index_add_(0, indices, grad_output), None


class IndexPutFirstAxis(torch.autograd.Function):
    """Zeros of ``first_axis_dim`` rows with ``values`` written at ``indices``; the backward gathers."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        values: torch.Tensor,
        indices: torch.Tensor,
        first_axis_dim: int,
        rows_name: str = "first_axis_dim",
    ):
        _check_first_axis("values", values)
        first_axis_dim = _check_size("first_axis_dim", first_axis_dim)
        _check_indices(indices, first_axis_dim, rows_name)
        if indices.shape[0] != values.shape[0]:
            raise FlashtileValueError(
                f"indices must have one entry per row of values; got {indices.shape[0]} indices for "
                f"values of shape {tuple(values.shape)}"
            )
        ctx.save_for_backward(indices)
        output = values.new_zeros(first_axis_dim, *values.shape[1:])
        # index_copy_ takes int64 indices only; flash_attn's ``output[indices] = values`` takes int32 too.
        return output.index_copy_(0, indices.long(), values)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_output: torch.Tensor):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None, None


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``input[indices]`` for a 1-d integer ``indices``, differentiable in ``input``.

    >>> index_first_axis(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([2, 0])).tolist()
    [[3.0], [1.0]]
    """
    return IndexFirstAxis.apply(input, indices)


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """``(first_axis_dim, ...)`` zeros, row ``indices[r]`` set to ``values[r]``; differentiable in ``values``.

    >>> index_put_first_axis(torch.tensor([[5.0], [6.0]]), torch.tensor([2, 0]), 3).tolist()
    [[6.0], [0.0], [5.0]]
    """
    return IndexPutFirstAxis.apply(values, indices, first_axis_dim)


def _cu_seqlens(seqlens: torch.Tensor) -> torch.Tensor:
    """int32 ``(n + 1,)`` cumulative lengths starting at 0."""
    return torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def _max_seqlen(seqlens: torch.Tensor) -> int:
    """The longest length as a Python int (0 for no sequences); one host synchronisation."""
    return int(seqlens.max().item()) if seqlens.numel() else 0


def _check_mask(hidden_states: object, mask: object, mask_name: str) -> None:
    """``mask`` is ``(batch, seqlen)`` on ``hidden_states``' device; ``hidden_states`` matches it."""
    _check_tensor("hidden_states", hidden_states)
    _check_tensor(mask_name, mask)
    if mask.dim() != 2:
        raise FlashtileValueError(f"{mask_name} must be 2-D (batch, seqlen); got shape {tuple(mask.shape)}")
    if hidden_states.dim() < 2 or tuple(hidden_states.shape[:2]) != tuple(mask.shape):
        raise FlashtileValueError(
            f"hidden_states must be (batch, seqlen, ...) with (batch, seqlen) = {mask_name}.shape; got "
            f"hidden_states {tuple(hidden_states.shape)}, {mask_name} {tuple(mask.shape)}"
        )
    if mask.device != hidden_states.device:
        raise FlashtileValueError(
            f"{mask_name} must be on hidden_states' device, {hidden_states.device}; got {mask.device}"
        )


def unpad_input(
    hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Pack the tokens a mask selects into the varlen layout.

    Args:
        hidden_states: ``(batch, seqlen, ...)``.
        attention_mask: ``(batch, seqlen)`` bool or int, nonzero = a real token.
        unused_mask: optional ``(batch, seqlen)`` bool or int, nonzero = a slot that is allocated but
            unused (kept in the packed tensor, not counted in ``seqused``).

    Returns:
        ``hidden_states`` ``(total, ...)``: the tokens selected by ``attention_mask`` or ``unused_mask``,
        batch-major; ``indices`` int64 ``(total,)``: their positions in the flattened ``batch · seqlen``
        axis; ``cu_seqlens`` int32 ``(batch + 1,)``; ``max_seqlen_in_batch`` int; ``seqused`` int32
        ``(batch,)``: the tokens of each row selected by ``attention_mask`` alone.

    >>> mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    >>> unused = torch.tensor([[0, 1, 0], [0, 0, 0]])
    >>> _, indices, cu_seqlens, max_seqlen, seqused = unpad_input(torch.zeros(2, 3, 4), mask, unused)
    >>> indices.tolist(), cu_seqlens.tolist(), max_seqlen, seqused.tolist()
    ([0, 1, 3, 4], [0, 2, 4], 2, [1, 2])
    """
    _check_mask(hidden_states, attention_mask, "attention_mask")
    if unused_mask is not None:
        _check_tensor("unused_mask", unused_mask)
        # Checked, not broadcast: a mismatched unused_mask would otherwise fail late in torch's words.
        if unused_mask.shape != attention_mask.shape or unused_mask.device != attention_mask.device:
            raise FlashtileValueError(
                f"unused_mask must match attention_mask: shape {tuple(attention_mask.shape)} on "
                f"{attention_mask.device}; got shape {tuple(unused_mask.shape)} on {unused_mask.device}"
            )
    selected = attention_mask.bool() if unused_mask is None else attention_mask.bool() | unused_mask.bool()
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten()).flatten()
    packed = index_first_axis(hidden_states.flatten(0, 1), indices)
    return packed, indices, _cu_seqlens(seqlens), _max_seqlen(seqlens), seqused


def unpad_input_for_concatenated_sequences(
    hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Pack rows that each hold several short sequences back to back, one varlen sequence per sample.

    ``attention_mask_in_length[b]`` lists the lengths of the samples concatenated at the start of row
    ``b`` followed by zeros: ``[2, 3, 0, 0, 0, 0]`` is a sample of 2 tokens, then one of 3, then a pad
    token. Each sample becomes its own sequence, so causal attention never crosses samples.

    Args:
        hidden_states: ``(batch, seqlen, ...)``.
        attention_mask_in_length: ``(batch, seqlen)`` int, sample lengths then zeros.

    Returns:
        ``hidden_states`` ``(total, ...)``, ``indices`` int64 ``(total,)``, ``cu_seqlens`` int32
        ``(n_samples + 1,)``, ``max_seqlen_in_batch`` int (the longest sample).

    >>> lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    >>> _, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(
    ...     torch.zeros(2, 6, 1), lengths
    ... )
    >>> indices.tolist(), cu_seqlens.tolist(), max_seqlen
    ([0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11], [0, 2, 5, 11], 6)
    """
    lengths = attention_mask_in_length
    _check_mask(hidden_states, lengths, "attention_mask_in_length")
    if lengths.dtype == torch.bool or lengths.is_floating_point() or lengths.is_complex():
        # A 0/1 mask here would silently make every token its own sequence.
        raise FlashtileTypeError(
            "attention_mask_in_length must be an integer tensor of sample lengths (a 0/1 mask goes to "
            f"unpad_input); got dtype {lengths.dtype}"
        )
    seqlen = lengths.shape[1]
    row_tokens = lengths.sum(dim=-1)
    # One host read for the checks and the maximum (flash_attn reads the maximum there too).
    stats = torch.stack([lengths.min(), row_tokens.max(), lengths.max()]) if lengths.numel() else None
    lowest, fullest, longest = (0, 0, 0) if stats is None else stats.tolist()
    # Lengths that do not add up to the packed tokens would give cu_seqlens past the end of the output.
    if lowest < 0:
        raise FlashtileValueError(f"attention_mask_in_length must hold lengths ≥ 0; got {lowest}")
    if fullest > seqlen:
        raise FlashtileValueError(
            f"attention_mask_in_length's rows must sum to at most seqlen = {seqlen}; got a row summing to "
            f"{fullest}"
        )
    selected = torch.arange(seqlen, device=row_tokens.device) < row_tokens[:, None]
    flat_lengths = lengths.flatten()
    seqlens = flat_lengths[torch.nonzero(flat_lengths).flatten()]
    indices = torch.nonzero(selected.flatten()).flatten()
    packed = index_first_axis(hidden_states.flatten(0, 1), indices)
    return packed, indices, _cu_seqlens(seqlens), longest


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Undo :func:`unpad_input`: ``(total, ...)`` → ``(batch, seqlen, ...)`` with zeros at the padding.

    Args:
        hidden_states: ``(total, ...)``, row ``r`` going to flattened position ``indices[r]``.
        indices: int64 ``(total,)`` from :func:`unpad_input` (int32 is taken too).
        batch, seqlen: the padded shape.

    >>> pad_input(torch.tensor([[1.0], [2.0]]), torch.tensor([0, 3]), 2, 2)[..., 0].tolist()
    [[1.0, 0.0], [0.0, 2.0]]
    """
    batch, seqlen = _check_size("batch", batch), _check_size("seqlen", seqlen)
    output = IndexPutFirstAxis.apply(
        hidden_states, indices, batch * seqlen, f"batch · seqlen = {batch} · {seqlen}"
    )
    return output.unflatten(0, (batch, seqlen))
