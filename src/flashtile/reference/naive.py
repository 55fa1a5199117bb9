"""Attention by definition: materialise the scores S and the probabilities P, then P·V.

This is the executable specification of every option of flash_attn 2.8's ``flash_attn_func`` and the
oracle of the test suite (call it on float64 tensors). Called on fp16/bf16 tensors it is "plain PyTorch
in low precision", the baseline of the accuracy rule: matmuls in the input dtype, the softmax in float32,
P cast back to the input dtype before P·V (flash-attn's ``attention_ref(upcast=False)``).

For query ``i`` and key ``j`` of one head, with ``off = N_k − N_q`` (bottom-right alignment):

    s_ij = scale · q_i·k_j                                  scale = softmax_scale or 1/√D
    s_ij ← softcap · tanh(s_ij / softcap)                   when softcap > 0
    s_ij ← s_ij − slope · |i + off − j|                     when alibi_slopes is given
    s_ij ← score_mod(s_ij, b, h, i, j[, aux])               when mods.score_mod is given
    s_ij ← −∞ unless the block mask shows (i, j)            when mods.block_mask is given (mask_mod
                                                            in its partial tiles)
    s_ij ← −∞ unless key j is visible from query i          causal / window_size
    lse_i = log(Σ_j exp(s_ij) + exp(sink_h))                 sink_h = learnable_sink[h], else −∞
    P_ij = exp(s_ij − lse_i)
    out_i = Σ_j P_ij · keep_ij / (1 − dropout_p) · v_j      keep = dropout_mask (all True without dropout)

The sink is GPT-OSS's: a logit in the scaled-score domain (neither scaled, capped nor biased) that joins
the softmax as one more column and is then dropped, so it takes probability mass but no value. A row
with no visible key gives ``out_i = 0`` and ``lse_i = −∞`` (``lse_i = sink_h`` with a sink).
``window_size`` is taken literally: flash_attn's normalisation (a bound ≥ ``N_k`` becomes −1, which
differs from the literal window when ``N_q > N_k``) is the caller's (``flashtile.validation``).
:func:`dropout_mask` draws the keep mask the kernels draw from an ``rng_state``; :func:`attention_varlen`
runs a packed batch sequence by sequence.
"""

from __future__ import annotations

import math

import torch

from flashtile.mods import Mods
from flashtile.reference.dropout import dropout_keep


def keep_mask(
    seqlen_q: int,
    seqlen_k: int,
    *,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Which keys each query may attend to: a ``(seqlen_q, seqlen_k)`` bool tensor, True = keep.

    Bottom-right aligned, as in flash_attn: query ``i`` sees key ``j`` iff
    ``i + off − left ≤ j ≤ i + off + right`` with ``off = seqlen_k − seqlen_q``; a negative bound is
    unlimited, and ``causal`` sets ``right = 0``.

    >>> keep_mask(2, 5, causal=True).int()
    tensor([[1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1]], dtype=torch.int32)
    """
    left, right = window_size
    if causal:
        right = 0
    # Offset of key j from query i's aligned diagonal: j − (i + N_k − N_q).
    diagonal = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    distance = torch.arange(seqlen_k, device=device)[None, :] - diagonal
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= distance >= -left
    if right >= 0:
        keep &= distance <= right
    return keep


def alibi_bias(
    alibi_slopes: torch.Tensor, seqlen_q: int, seqlen_k: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The ALiBi bias ``−slope · |i + N_k − N_q − j|``, shape ``(B or 1, H, seqlen_q, seqlen_k)``.

    ``alibi_slopes`` is float32 of shape ``(H,)`` or ``(B, H)``; the bias is in ``dtype`` (default the
    slopes' dtype).

    >>> alibi_bias(torch.tensor([0.5]), 2, 3)
    tensor([[[[-0.5000, -0.0000, -0.5000],
              [-1.0000, -0.5000, -0.0000]]]])
    """
    slopes = alibi_slopes.to(dtype or alibi_slopes.dtype)
    if slopes.dim() == 1:
        slopes = slopes[None]
    diagonal = torch.arange(seqlen_q, device=slopes.device)[:, None] + (seqlen_k - seqlen_q)
    distance = (torch.arange(seqlen_k, device=slopes.device)[None, :] - diagonal).abs()
    return -slopes[:, :, None, None] * distance.to(slopes.dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The softmax runs in float32, or in float64 when the inputs are float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scores(
    q: torch.Tensor,
    k: torch.Tensor,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    mods: Mods | None = None,
    batch_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The masked logits ``s``, shape ``(B, H, N_q, N_k)`` in the compute dtype (−∞ where masked)."""
    _, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    # Query head h reads KV head h // (H // H_KV): repeat each KV head over its query group.
    k = k.repeat_interleave(nheads // nheads_kv, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k).to(_compute_dtype(q.dtype)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes.to(q.device), seqlen_q, seqlen_k, s.dtype)
    if mods is not None:
        batch = torch.arange(q.shape[0], device=q.device) if batch_ids is None else batch_ids.to(q.device)
        index = (
            batch[:, None, None, None],
            torch.arange(nheads, device=q.device)[None, :, None, None],
            torch.arange(seqlen_q, device=q.device)[:, None],
            torch.arange(seqlen_k, device=q.device)[None, :],
        )
        if mods.score_mod is not None:
            s = mods.call(mods.score_mod, s, *index)
        if mods.block_mask is not None:
            s = s.masked_fill(~mods.block_mask.visible(*index, mods), float("-inf"))
    if causal or window_size[0] >= 0 or window_size[1] >= 0:
        keep = keep_mask(seqlen_q, seqlen_k, causal=causal, window_size=window_size, device=q.device)
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _softmax_with_lse(
    s: torch.Tensor, learnable_sink: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row softmax and log-sum-exp of ``s`` ``(B, H, N_q, N_k)`` that give ``P = 0`` and ``lse = −∞`` on
    all-masked rows. A ``learnable_sink`` ``(H,)`` is one more column of every row of head h, dropped
    from P after the softmax (GPT-OSS's definition); autograd reaches it through that column.

    Written out rather than ``torch.softmax`` so that autograd through a fully masked row stays finite.
    """
    if learnable_sink is not None:
        column = learnable_sink.to(s.dtype).view(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p, lse = _softmax_with_lse(torch.cat([s, column], dim=-1))
        return p[..., :-1], lse
    # Shifting by the row max changes neither P nor lse, so it needs no gradient.
    row_max = s.amax(dim=-1, keepdim=True).detach() if s.shape[-1] else s.new_zeros(*s.shape[:-1], 1)
    row_max = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(s - row_max)
    total = e.sum(dim=-1, keepdim=True)
    empty = total == 0
    total = torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(total, float("-inf")), row_max + torch.log(total))
    return e / total, lse.squeeze(-1)


def _probs_and_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    batch_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    s = _scores(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, mods, batch_ids)
    return _softmax_with_lse(s, learnable_sink)


def _check_dropout(dropout_p: float, dropout_mask: torch.Tensor | None) -> None:
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if dropout_p > 0.0 and dropout_mask is None:
        raise ValueError(
            f"dropout_p={dropout_p} needs an explicit boolean dropout_mask of shape (B, H, N_q, N_k): "
            "the reference draws no random numbers"
        )


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    batch_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with every option of flash_attn's ``flash_attn_func``, computed by definition.

    Args:
        q: ``(B, N_q, H, D)``; k: ``(B, N_k, H_KV, D)``, v: ``(B, N_k, H_KV, D_v)`` with
            ``H % H_KV == 0``; one float dtype.
        softmax_scale: multiplies ``q·kᵀ``; None → ``1/√D``.
        causal: bottom-right aligned: query ``i`` sees key ``j`` iff ``j ≤ i + N_k − N_q``.
        window_size: ``(left, right)``; query ``i`` sees keys in
            ``[i + N_k − N_q − left, i + N_k − N_q + right]``; −1 is unlimited; causal forces right = 0.
            Taken literally: flash_attn's normalisation of bounds ≥ ``N_k`` to −1 is the caller's.
        softcap: > 0 replaces the scaled score s by ``softcap · tanh(s / softcap)`` before ALiBi and masking.
        alibi_slopes: float32 ``(H,)`` or ``(B, H)``; adds ``−slope · |i + N_k − N_q − j|`` to the score.
        dropout_p: probability of dropping an entry of P; needs ``dropout_mask`` when > 0.
        dropout_mask: bool ``(B, H, N_q, N_k)``, True = keep; kept entries of P are scaled by
            ``1/(1 − dropout_p)``. The lse is that of the softmax before dropout. :func:`dropout_mask`
            gives the mask the kernels draw for an ``rng_state``.
        learnable_sink: ``(H,)`` logits, one per query head, that join each row's softmax denominator
            and take no value (GPT-OSS's sinks); differentiable. Dropout acts on P after the sink
            joined, as in transformers' GPT-OSS.
        mods: block mask, mask_mod, score_mod and aux_tensors (:class:`flashtile.mods.Mods`); the mods'
            ``.fn`` run on index tensors (autograd differentiates score_mod itself).
        batch_ids: the batch index ``b`` the mods see for each batch element (default ``0 … B − 1``).

    Returns:
        ``out`` ``(B, N_q, H, D_v)`` in the input dtype; ``lse`` ``(B, H, N_q)`` natural log, float32
        (float64 for float64 inputs). Rows with no visible key give ``out = 0``, ``lse = −∞``
        (``lse = sink`` with a learnable sink).

    >>> q = k = v = torch.ones(1, 2, 1, 4, dtype=torch.float64)
    >>> out, lse = attention(q, k, v, causal=True)
    >>> out[0, :, 0, 0].tolist(), lse[0, 0].tolist()
    ([1.0, 1.0], [2.0, 2.6931471805599454])
    """
    _check_dropout(dropout_p, dropout_mask)
    p, lse = _probs_and_lse(
        q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, learnable_sink, mods, batch_ids
    )
    if dropout_mask is not None:
        p = p * dropout_mask.to(p.dtype) / (1.0 - dropout_p)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    out = torch.einsum("bhij,bjhd->bihd", p.to(v.dtype), v)
    return out, lse


def attention_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """The softmax probabilities P, ``(B, H, N_q, N_k)`` in the input dtype, for ``return_attn_probs``.

    Same arguments as :func:`attention`. P is the softmax before dropout (masked entries and fully
    masked rows are 0; with a learnable sink the rows sum to 1 − the sink's share). As in flash_attn's
    ``S_dmask``, a ``dropout_mask`` is encoded in the sign: dropped entries are negated, so ``P.abs()``
    is the softmax and ``P >= 0`` recovers the keep mask wherever ``P ≠ 0``. ``v`` is accepted for
    symmetry with :func:`attention` and not read.

    >>> q = k = v = torch.ones(1, 2, 1, 4, dtype=torch.float64)
    >>> attention_probs(q, k, v, causal=True)[0, 0].tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """
    _check_dropout(dropout_p, dropout_mask)
    p, _ = _probs_and_lse(q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, learnable_sink)
    if dropout_mask is not None:
        p = torch.where(dropout_mask, p, -p)
    return p.to(q.dtype)


def _padded(x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed ``x`` ``(total, ...)`` as ``(B, max_seqlen, ...)``, zeros beyond each sequence, and the lengths
    ``(B,)``: tensor ops only, so a compiled graph traces it without copying ``cu_seqlens`` to the host."""
    starts, lengths = cu_seqlens[:-1].long(), cu_seqlens.diff().long()
    positions = torch.arange(max_seqlen, device=x.device)
    # Rows beyond a sequence read one appended zero row, which also lets an empty x be indexed.
    rows = torch.where(positions < lengths[:, None], starts[:, None] + positions, x.shape[0])
    return torch.cat([x, x.new_zeros(1, *x.shape[1:])])[rows], lengths


def attention_probs_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_mask: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`attention_probs` of every sequence of a packed batch at once, ``(B, H, max_seqlen_q,
    max_seqlen_k)`` with sequence ``b`` in ``[b, :, :N_q, :N_k]`` and +0 beyond (flash_attn's varlen
    ``S_dmask`` layout); ``dropout_mask`` has that shape.

    The batch is padded to ``(max_seqlen_q, max_seqlen_k)``, padding keys masked like out-of-window ones and
    windows, causal and ALiBi aligned bottom-right per sequence with the lengths kept as tensors, so
    torch.compile traces it whole (fullgraph) and nothing waits on the host. Signs and zeros are those of
    one call per sequence; the values may differ from it by rounding (the matmul and the row sums run on the
    padded shapes).
    """
    q, lengths_q = _padded(q, cu_seqlens_q, max_seqlen_q)
    k, lengths_k = _padded(k, cu_seqlens_k, max_seqlen_k)
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k).to(_compute_dtype(q.dtype)) * softmax_scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    rows = torch.arange(max_seqlen_q, device=q.device)[None, :, None]
    cols = torch.arange(max_seqlen_k, device=q.device)[None, None, :]
    # j − (i + N_k − N_q) with each sequence's own lengths: bottom-right alignment per sequence.
    distance = cols - (rows + (lengths_k - lengths_q)[:, None, None])
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(q.device).to(s.dtype)
        slopes = slopes[None] if slopes.dim() == 1 else slopes
        s = s + -slopes[:, :, None, None] * distance.abs()[:, None].to(s.dtype)
    inside = (rows < lengths_q[:, None, None]) & (cols < lengths_k[:, None, None])
    visible = inside
    left, right = window_size
    right = 0 if causal else right
    if left >= 0:
        visible = visible & (distance >= -left)
    if right >= 0:
        visible = visible & (distance <= right)
    p, _ = _softmax_with_lse(s.masked_fill(~visible[:, None], float("-inf")), learnable_sink)
    if dropout_mask is not None:
        p = torch.where(dropout_mask, p, -p)
    # +0 beyond each sequence, as the zeros S_dmask starts from (a dropped 0 inside would read −0).
    return p.to(q.dtype).masked_fill(~inside[:, None], 0.0)


def dropout_mask(
    rng_state: torch.Tensor, dropout_p: float, batch: int, nheads: int, seqlen_q: int, seqlen_k: int
) -> torch.Tensor:
    """The keep mask the kernels draw for ``rng_state``: bool ``(batch, nheads, seqlen_q, seqlen_k)``.

    Entry ``[b, h, i, j]`` is :func:`flashtile.reference.dropout.dropout_keep` of batch ``b`` (the
    sequence index under varlen), head ``h``, query ``i``, key ``j``; pass it as ``dropout_mask`` to
    :func:`attention` or :func:`attention_varlen`. On ``rng_state``'s device.

    >>> dropout_mask(torch.tensor([0, 0]), 0.0, 2, 3, 4, 5).all().item()
    True
    """
    device = rng_state.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.arange(nheads, device=device)[None, :, None, None]
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    keep = dropout_keep(rng_state, dropout_p, b, h, nheads, rows, cols)
    return keep.expand(batch, nheads, seqlen_q, seqlen_k)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_mask: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention` of a packed batch (flash_attn's ``flash_attn_varlen_func``), sequence by sequence.

    Sequence ``b`` is queries ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` against keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``, attended as a batch of one with its own lengths (either may
    be 0; causal and windows bottom-right aligned per sequence). Differentiable by autograd.

    Args:
        q: ``(total_q, H, D)``; k: ``(total_k, H_KV, D)``; v: ``(total_k, H_KV, D_v)``.
        cu_seqlens_q, cu_seqlens_k: int ``(B + 1,)`` cumulative lengths, starting at 0.
        max_seqlen_q, max_seqlen_k: the longest sequence; they size ``dropout_mask``.
        alibi_slopes: float32 ``(H,)`` or ``(B, H)`` (row ``b`` for sequence ``b``).
        dropout_mask: bool ``(B, H, max_seqlen_q, max_seqlen_k)``, as flash_attn's varlen ``S_dmask``;
            sequence ``b`` uses ``[b, :, :N_q, :N_k]``.
        mods: as in :func:`attention`; sequence ``b`` is batch index ``b`` and positions are its own.
        The rest: as in :func:`attention`.

    Returns:
        ``out`` ``(total_q, H, D)`` and ``lse`` ``(H, total_q)`` (flash_attn's varlen layout).

    >>> q = k = v = torch.ones(3, 1, 4, dtype=torch.float64)
    >>> cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    >>> attention_varlen(q, k, v, cu, cu, 2, 2, causal=True)[1].tolist()
    [[2.0, 2.0, 2.6931471805599454]]
    """
    _check_dropout(dropout_p, dropout_mask)
    q_bounds, k_bounds = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    # Empty leading pieces give the right shapes and dtypes when there are no sequences.
    outs = [q.new_zeros(0, q.shape[1], v.shape[2])]
    lses = [q.new_zeros(q.shape[1], 0, dtype=_compute_dtype(q.dtype))]
    for b in range(len(q_bounds) - 1):
        (q_start, q_stop), (k_start, k_stop) = q_bounds[b : b + 2], k_bounds[b : b + 2]
        slopes = alibi_slopes
        if slopes is not None and slopes.dim() == 2:
            slopes = slopes[b]
        mask = None
        if dropout_mask is not None:
            mask = dropout_mask[b : b + 1, :, : q_stop - q_start, : k_stop - k_start]
        out, lse = attention(
            q[None, q_start:q_stop],
            k[None, k_start:k_stop],
            v[None, k_start:k_stop],
            softmax_scale=softmax_scale,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            alibi_slopes=slopes,
            dropout_p=dropout_p,
            dropout_mask=mask,
            learnable_sink=learnable_sink,
            mods=mods,
            batch_ids=torch.tensor([b]),
        )
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs), torch.cat(lses, dim=1)
