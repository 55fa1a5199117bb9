"""FlashAttention in plain PyTorch: the readable specification of the kernels, and the CPU backend.

Work is done on tiles of ``block_m`` query rows × ``block_n`` keys, vectorised over batch and heads; no
``N_q × N_k`` tensor is ever formed, so the extra memory is O(N). Accumulation runs in
max(float32, input dtype). The derivations are in ``docs/design/online_softmax.md`` and
``docs/design/backward.md``.

GQA/MQA without copying K/V per query head: the ``G = H // H_KV`` query heads that share a KV head are
stacked along the row axis, so one tile holds ``G · block_m`` rows that all meet the same K/V tile, and
``Pᵀ·dO`` / ``dSᵀ·Q`` sum over the group by the matmul itself.
"""

from __future__ import annotations

import torch


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """max(float32, dtype): low precision accumulates in float32, float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(x: torch.Tensor, nheads_kv: int, dtype: torch.dtype) -> torch.Tensor:
    """``(B, N, H, D)`` → ``(B, H_KV, G, N, D)`` in ``dtype``: the query heads of one KV head side by side."""
    return x.to(dtype).transpose(1, 2).unflatten(1, (nheads_kv, -1))


def _rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a grouped ``(B, H_KV, G, N, …)`` tensor as one ``(B, H_KV, G·rows, …)`` tile."""
    return x[:, :, :, start:stop].flatten(2, 3)


def _causal_keep(
    row_start: int,
    row_stop: int,
    col_start: int,
    col_stop: int,
    offset: int,
    group: int,
    device: torch.device,
) -> torch.Tensor:
    """Causal keep mask of one tile, ``(G·block_m, block_n)`` bool: key ``j`` seen iff ``j ≤ i + offset``."""
    rows = torch.arange(row_start, row_stop, device=device)[:, None]
    cols = torch.arange(col_start, col_stop, device=device)[None, :]
    return (cols <= rows + offset).repeat(group, 1)


def _last_visible_key(row_stop: int, offset: int, causal: bool, seqlen_k: int) -> int:
    """One past the last key that any row below ``row_stop`` may see: K/V tiles from there on are skipped."""
    return min(seqlen_k, row_stop + offset) if causal else seqlen_k


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward pass by the online softmax, one ``block_m × block_n`` tile at a time.

    For each tile of query rows, keep a running row max ``m``, row sum ``ℓ`` and unnormalised output
    ``O`` (initially ``−∞``, 0, 0) and visit the K/V tiles left to right. For tile ``j`` with scores
    ``S = scale · Q·Kⱼᵀ`` (−∞ where causally masked), its row max ``m̃ = rowmax(S)``,
    ``P̃ = exp(S − m̃)`` and ``ℓ̃ = rowsum(P̃)``:

        m_new = max(m, m̃)
        ℓ_new = e^{m − m_new} · ℓ + e^{m̃ − m_new} · ℓ̃
        O_new = e^{m − m_new} · O + e^{m̃ − m_new} · P̃·Vⱼ

    (the code forms ``exp(S − m_new)`` directly, which folds in the factor ``e^{m̃ − m_new}``). At the end
    ``out = O / ℓ`` and ``lse = m + log ℓ``. Under ``causal`` (bottom-right aligned, key ``j`` visible from
    query ``i`` iff ``j ≤ i + N_k − N_q``) the K/V tiles wholly above the diagonal are never visited, and
    only tiles that straddle it are masked. Where ``m_new = −∞`` (nothing visible yet) the exponents use 0
    in its place, so no ``−∞ − (−∞)`` arises; a row that sees no key ends with ``ℓ = 0`` and gives
    ``out = 0``, ``lse = −∞``.

    Args:
        q: ``(B, N_q, H, D)``; k, v: ``(B, N_k, H_KV, D)``, ``H % H_KV == 0``; fp16, bf16, fp32 or fp64,
            any strides.
        softmax_scale: multiplies ``q·kᵀ``.
        causal: bottom-right aligned causal mask.
        block_m, block_n: tile sizes (any positive integers).

    Returns:
        ``out`` ``(B, N_q, H, D)`` in the input dtype and ``lse`` ``(B, H, N_q)`` natural log, float32
        (float64 for float64 inputs).

    >>> q = k = v = torch.ones(1, 3, 1, 2)
    >>> out, lse = attention_fwd(q, k, v, softmax_scale=1.0, causal=True, block_m=2, block_n=2)
    >>> out[0, :, 0, 0].tolist(), [round(x, 4) for x in lse[0, 0].tolist()]
    ([1.0, 1.0, 1.0], [2.0, 2.6931, 3.0986])
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    group = nheads // nheads_kv
    acc_dtype = _accumulate_dtype(q.dtype)
    offset = seqlen_k - seqlen_q
    q_g = _grouped(q, nheads_kv, acc_dtype)
    k_t = k.to(acc_dtype).transpose(1, 2)
    v_t = v.to(acc_dtype).transpose(1, 2)
    # NaN-poisoned so that a row the loop forgot to write cannot pass for a result.
    out = torch.full(
        (batch, seqlen_q, nheads_kv, group, head_dim), float("nan"), dtype=q.dtype, device=q.device
    )
    lse = torch.full((batch, nheads_kv, group, seqlen_q), float("nan"), dtype=acc_dtype, device=q.device)

    for row_start in range(0, seqlen_q, block_m):
        row_stop = min(row_start + block_m, seqlen_q)
        q_tile = _rows(q_g, row_start, row_stop)  # [B, H_KV, G·block_m, D]
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        ell = torch.zeros_like(m)
        acc = torch.zeros_like(q_tile)
        for col_start in range(0, _last_visible_key(row_stop, offset, causal, seqlen_k), block_n):
            col_stop = min(col_start + block_n, seqlen_k)
            k_tile = k_t[:, :, col_start:col_stop]  # [B, H_KV, bn, D]
            s = q_tile @ k_tile.transpose(-1, -2) * softmax_scale  # [B, H_KV, G·bm, bn]
            # Only tiles that straddle the diagonal need a mask; those left of it are fully visible.
            if causal and col_stop - 1 > row_start + offset:
                keep = _causal_keep(row_start, row_stop, col_start, col_stop, offset, group, q.device)
                s = s.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            # Rows that have seen no key yet keep m_new = −∞; shift them by 0 to avoid −∞ − (−∞).
            shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - shift[..., None])
            alpha = torch.exp(m - shift)
            ell = alpha * ell + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ v_t[:, :, col_start:col_stop]
            m = m_new

        seen = ell > 0
        safe_ell = torch.where(seen, ell, torch.ones_like(ell))
        out_tile = torch.where(seen[..., None], acc / safe_ell[..., None], torch.zeros_like(acc))
        lse_tile = torch.where(seen, m + torch.log(safe_ell), torch.full_like(m, float("-inf")))
        rows = row_stop - row_start
        out[:, row_start:row_stop] = out_tile.unflatten(2, (group, rows)).permute(0, 3, 1, 2, 4).to(q.dtype)
        lse[:, :, :, row_start:row_stop] = lse_tile.unflatten(2, (group, rows))

    return out.flatten(2, 3), lse.flatten(1, 2)


def attention_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward pass that recomputes P tile by tile from Q, K and the forward's LSE.

    First ``Dᵢ = rowsum(dO ∘ O)`` (equal to ``rowsum(P ∘ dP)``). Then for each K/V tile ``j``, with
    ``dKⱼ``, ``dVⱼ`` accumulated over the query tiles ``i`` that can see it:

        P   = exp(scale · Qᵢ·Kⱼᵀ − lse)          (0 where causally masked)
        dVⱼ += Pᵀ · dOᵢ
        dP  = dOᵢ · Vⱼᵀ
        dS  = P ∘ (dP − D)
        dQᵢ += scale · dS · Kⱼ
        dKⱼ += scale · dSᵀ · Qᵢ

    With GQA the ``G`` query heads of a KV head are stacked along the rows of ``P`` and ``dS``, so
    ``Pᵀ·dO`` and ``dSᵀ·Q`` sum the group into ``dk``, ``dv`` of the KV head. A row with ``lse = −∞``
    (no visible key) gets ``P = 0`` by shifting with 0 instead of ``−∞``, hence zero gradients.

    Args:
        dout: ``(B, N_q, H, D)`` gradient of ``out``, any strides.
        q, k, v, out, lse, softmax_scale, causal: as given to and returned by :func:`attention_fwd`.
        block_m, block_n: tile sizes (any positive integers).

    Returns:
        ``dq`` ``(B, N_q, H, D)``, ``dk`` and ``dv`` ``(B, N_k, H_KV, D)``, in the input dtype.

    >>> q = k = v = torch.ones(1, 2, 1, 2)
    >>> out, lse = attention_fwd(q, k, v, 1.0, causal=True)
    >>> dq, dk, dv = attention_bwd(torch.ones_like(out), q, k, v, out, lse, 1.0, causal=True)
    >>> dv[0, :, 0, 0].tolist()
    [1.5, 0.5]
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_kv = k.shape[1], k.shape[2]
    group = nheads // nheads_kv
    acc_dtype = _accumulate_dtype(q.dtype)
    offset = seqlen_k - seqlen_q
    q_g = _grouped(q, nheads_kv, acc_dtype)
    do_g = _grouped(dout, nheads_kv, acc_dtype)
    k_t = k.to(acc_dtype).transpose(1, 2)
    v_t = v.to(acc_dtype).transpose(1, 2)
    delta = (do_g * _grouped(out, nheads_kv, acc_dtype)).sum(dim=-1)  # [B, H_KV, G, N_q]
    lse_g = lse.to(acc_dtype).unflatten(1, (nheads_kv, group))
    # A fully masked row has lse = −∞ and only −∞ scores: shifting by 0 makes its P exactly 0.
    lse_g = torch.where(torch.isneginf(lse_g), torch.zeros_like(lse_g), lse_g)

    # dQ sums over K/V tiles, so it is an accumulator; dK and dV are written once per tile (NaN-poisoned).
    dq = torch.zeros_like(q_g)
    dk = torch.full((batch, seqlen_k, nheads_kv, head_dim), float("nan"), dtype=k.dtype, device=k.device)
    dv = torch.full((batch, seqlen_k, nheads_kv, head_dim), float("nan"), dtype=v.dtype, device=v.device)

    for col_start in range(0, seqlen_k, block_n):
        col_stop = min(col_start + block_n, seqlen_k)
        k_tile = k_t[:, :, col_start:col_stop]  # [B, H_KV, bn, D]
        v_tile = v_t[:, :, col_start:col_stop]
        dk_tile = torch.zeros_like(k_tile)
        dv_tile = torch.zeros_like(v_tile)
        # Query rows above the diagonal (i < col_start − offset) see no key of this tile: skip their tiles.
        first_row = max(0, col_start - offset) if causal else 0
        for row_start in range(first_row - first_row % block_m, seqlen_q, block_m):
            row_stop = min(row_start + block_m, seqlen_q)
            q_tile = _rows(q_g, row_start, row_stop)  # [B, H_KV, G·bm, D]
            do_tile = _rows(do_g, row_start, row_stop)
            s = q_tile @ k_tile.transpose(-1, -2) * softmax_scale  # [B, H_KV, G·bm, bn]
            if causal and col_stop - 1 > row_start + offset:
                keep = _causal_keep(row_start, row_stop, col_start, col_stop, offset, group, q.device)
                s = s.masked_fill(~keep, float("-inf"))
            p = torch.exp(s - _rows(lse_g[..., None], row_start, row_stop))
            dv_tile += p.transpose(-1, -2) @ do_tile
            dp = do_tile @ v_tile.transpose(-1, -2)
            ds = p * (dp - _rows(delta[..., None], row_start, row_stop))
            dk_tile += ds.transpose(-1, -2) @ q_tile * softmax_scale
            dq[:, :, :, row_start:row_stop] += (ds @ k_tile * softmax_scale).unflatten(2, (group, -1))
        dk[:, col_start:col_stop] = dk_tile.transpose(1, 2).to(k.dtype)
        dv[:, col_start:col_stop] = dv_tile.transpose(1, 2).to(v.dtype)

    return dq.flatten(1, 2).transpose(1, 2).to(q.dtype), dk, dv
