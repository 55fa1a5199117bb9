"""FlashAttention in plain PyTorch: the readable specification of the kernels, and the CPU backend.

Work is done on tiles of ``block_m`` query rows × ``block_n`` keys, vectorised over batch and heads; no
``N_q × N_k`` tensor is ever formed, so the extra memory is O(N). Accumulation runs in
max(float32, input dtype). The derivations are in ``docs/design/online_softmax.md`` and
``docs/design/backward.md``; how each option reaches this code is ``docs/design/options.md``.

GQA/MQA without copying K/V per query head: the ``G = H // H_KV`` query heads that share a KV head are
stacked along the row axis, so one tile holds ``G · block_m`` rows that all meet the same K/V tile, and
``Pᵀ·dO`` / ``dSᵀ·Q`` sum over the group by the matmul itself.

Every flash_attn option enters through the score of one tile (:meth:`_Problem.scores`), the loop bounds
(:meth:`_Problem.key_tiles`, :meth:`_Problem.query_tiles`) and dropout's keep mask
(:meth:`_Problem.dropout_keep`), in this order, as in the kernels:

    s = scale · Q·Kᵀ                        the scaled score
    s ← softcap · tanh(s / softcap)         softcap > 0
    s ← s − slope · |i + N_k − N_q − j|     ALiBi
    s ← −∞ outside the window               causal / window_size (only on tiles the window cuts)
    P = softmax([s, sink])[:, :-1]          learnable_sink: one more logit per row, no value (fold_sink)
    out = (P ∘ Z / (1 − p)) · V             dropout keep mask Z (lse is that of P, before dropout)

``window_size`` arrives normalised by the caller (``flashtile.validation``): each bound is −1
(unlimited) or the raw flash_attn value, and ``causal`` forces ``right = 0`` here as in flash_attn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtile.mods import Mods
from flashtile.reference.dropout import dropout_keep


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """max(float32, dtype): low precision accumulates in float32, float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _grouped(x: torch.Tensor, nheads_kv: int, dtype: torch.dtype) -> torch.Tensor:
    """``(B, N, H, D)`` → ``(B, H_KV, G, N, D)`` in ``dtype``: the query heads of one KV head side by side."""
    return x.to(dtype).transpose(1, 2).unflatten(1, (nheads_kv, -1))


def _rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a grouped ``(B, H_KV, G, N, …)`` tensor as one ``(B, H_KV, G·rows, …)`` tile."""
    return x[:, :, :, start:stop].flatten(2, 3)


def _aligned_range(first: int, stop: int, block: int) -> range:
    """Starts of the ``block``-aligned tiles that cover ``[first, stop)`` (empty when ``stop ≤ first``)."""
    return range(first - first % block, stop, block)


@dataclass(frozen=True)
class _Problem:
    """What turns ``Q·Kᵀ`` of one tile into its masked score, shared by the forward and the backward.

    Row ``i`` and column ``j`` are positions inside one sequence; ``batch_ids`` are the batch indices that
    dropout's counter uses (the sequence index under varlen).
    """

    seqlen_q: int
    seqlen_k: int
    nheads: int
    group: int
    softmax_scale: float
    left: int
    right: int
    softcap: float
    # (B, H_KV, G, 1) in the accumulation dtype, or None.
    slopes: torch.Tensor | None
    dropout_p: float
    rng_state: torch.Tensor | None
    # (B,) int64.
    batch_ids: torch.Tensor
    # (H_KV, G, 1) in the accumulation dtype, or None.
    sink: torch.Tensor | None = None
    mods: Mods | None = None

    @property
    def offset(self) -> int:
        """``N_k − N_q``: query ``i`` is aligned with key ``i + offset`` (bottom-right)."""
        return self.seqlen_k - self.seqlen_q

    def key_tiles(self, row_start: int, row_stop: int, block_n: int) -> range:
        """Starts of the K/V tiles that some row in ``[row_start, row_stop)`` sees; the others are skipped."""
        first = 0 if self.left < 0 else max(0, row_start + self.offset - self.left)
        stop = self.seqlen_k if self.right < 0 else min(self.seqlen_k, row_stop + self.offset + self.right)
        return _aligned_range(first, stop, block_n)

    def query_tiles(self, col_start: int, col_stop: int, block_m: int) -> range:
        """Starts of the query tiles with some row that sees a key in ``[col_start, col_stop)``."""
        first = 0 if self.right < 0 else max(0, col_start - self.offset - self.right)
        stop = self.seqlen_q if self.left < 0 else min(self.seqlen_q, col_stop - self.offset + self.left)
        return _aligned_range(first, stop, block_m)

    def _cut_by_window(self, row_start: int, row_stop: int, col_start: int, col_stop: int) -> bool:
        """Whether some (row, key) pair of the tile lies outside the window, so the tile needs the mask."""
        left_cut = self.left >= 0 and col_start < row_stop - 1 + self.offset - self.left
        right_cut = self.right >= 0 and col_stop - 1 > row_start + self.offset + self.right
        return left_cut or right_cut

    def _positions(
        self, row_start: int, row_stop: int, col_start: int, col_stop: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Query positions ``(G·bm, 1)`` (repeated for each head of a group) and key positions ``(1, bn)``."""
        rows = torch.arange(row_start, row_stop, device=device).repeat(self.group)[:, None]
        cols = torch.arange(col_start, col_stop, device=device)[None, :]
        return rows, cols

    def _heads(self, rows: int, device: torch.device) -> torch.Tensor:
        """The query head of each stacked row, ``(1, H_KV, G·rows, 1)``: KV head κ holds query heads
        κ·G … κ·G + G − 1."""
        heads = torch.arange(self.nheads, device=device).view(-1, self.group, 1)
        return heads.expand(-1, -1, rows).flatten(1)[None, :, :, None]

    def _apply_mods(
        self, s: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """score_mod and the block mask (with mask_mod) on a tile's score; also d score_mod / d score."""
        mods = self.mods
        batch = self.batch_ids[:, None, None, None]
        heads = self._heads(rows.shape[0] // self.group, s.device)
        mod_grad = None
        if mods.score_mod is not None:
            s_in = s
            s = mods.call(mods.score_mod, s_in, batch, heads, rows, cols)
            if mods.score_mod_bwd is not None:
                mod_grad = mods.call(mods.score_mod_bwd, s_in, batch, heads, rows, cols)
        if mods.block_mask is not None:
            s = s.masked_fill(~mods.block_mask.visible(batch, heads, rows, cols, mods), float("-inf"))
        return s, mod_grad

    def scores(
        self, q_tile: torch.Tensor, k_tile: torch.Tensor, row_start: int, col_start: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The masked score of one tile ``[B, H_KV, G·bm, bn]`` and ``ds/ds̃``, the derivative of the
        final score by the scaled one (``1 − tanh²`` under softcap, times score_mod's), None if 1."""
        row_stop = row_start + q_tile.shape[-2] // self.group
        col_stop = col_start + k_tile.shape[-2]
        rows, cols = self._positions(row_start, row_stop, col_start, col_stop, q_tile.device)
        distance = cols - (rows + self.offset)  # [G·bm, bn]
        s = q_tile @ k_tile.transpose(-1, -2) * self.softmax_scale
        score_grad = None
        if self.softcap > 0:
            capped = torch.tanh(s / self.softcap)
            s = self.softcap * capped
            score_grad = 1.0 - capped * capped
        if self.slopes is not None:
            slopes = self.slopes.repeat_interleave(row_stop - row_start, dim=2)  # [B, H_KV, G·bm, 1]
            s = s - slopes * distance.abs().to(s.dtype)
        if self.mods is not None:
            s, mod_grad = self._apply_mods(s, rows, cols)
            if mod_grad is not None:
                score_grad = mod_grad if score_grad is None else score_grad * mod_grad
        if self._cut_by_window(row_start, row_stop, col_start, col_stop):
            hidden = torch.zeros_like(distance, dtype=torch.bool)
            if self.left >= 0:
                hidden |= distance < -self.left
            if self.right >= 0:
                hidden |= distance > self.right
            s = s.masked_fill(hidden, float("-inf"))
        return s, score_grad

    def fold_sink(
        self, m: torch.Tensor, ell: torch.Tensor, acc: torch.Tensor, rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Fold the sink logit into a tile's finished ``(m, ℓ, O)`` as one more key with no value:
        ``m ← max(m, sink)``, ``ℓ ← e^{m_old − m}·ℓ + e^{sink − m}``, ``O ← e^{m_old − m}·O``."""
        sink = self.sink.repeat_interleave(rows, dim=1).squeeze(-1)  # [H_KV, G·bm]
        m_new = torch.maximum(m, sink)
        shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - shift)
        return m_new, alpha * ell + torch.exp(sink - shift), alpha[..., None] * acc

    def sink_grad(self, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """``d sink_h = −Σ_{b,i} P_sink · Δ`` with ``P_sink = e^{sink_h − lse}`` and ``Δ = Σ_j P∘dP``;
        ``lse``, ``delta`` grouped ``[B, H_KV, G, N_q]``; returns ``(H,)``."""
        p_sink = torch.exp(self.sink - lse)
        # Rows with lse = −∞ (a sink of −∞ and no visible key) have Δ = 0 and no sink probability.
        p_sink = torch.where(torch.isneginf(lse), torch.zeros_like(p_sink), p_sink)
        return -(p_sink * delta).sum(dim=(0, 3)).flatten()

    def dropout_keep(self, row_start: int, row_stop: int, col_start: int, col_stop: int) -> torch.Tensor:
        """Dropout's keep mask ``Z`` of one tile, bool ``[B, H_KV, G·bm, bn]`` (``reference.dropout``)."""
        device = self.batch_ids.device
        rows, cols = self._positions(row_start, row_stop, col_start, col_stop, device)
        heads = self._heads(row_stop - row_start, device)
        batch = self.batch_ids[:, None, None, None]
        return dropout_keep(self.rng_state, self.dropout_p, batch, heads, self.nheads, rows, cols)


def _problem(
    q: torch.Tensor,
    k: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    dropout_p: float,
    rng_state: torch.Tensor | None,
    batch_ids: torch.Tensor,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
) -> _Problem:
    """The per-call constants of a dense problem; ``alibi_slopes`` already has one row per batch element."""
    if dropout_p > 0 and rng_state is None:
        raise ValueError(f"dropout_p={dropout_p} needs rng_state, an int64 tensor (2,) = (seed, offset)")
    nheads, nheads_kv = q.shape[2], k.shape[2]
    group = nheads // nheads_kv
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=q.device, dtype=_accumulate_dtype(q.dtype))
        slopes = slopes.expand(q.shape[0], nheads).reshape(q.shape[0], nheads_kv, group, 1)
    left, right = window_size
    return _Problem(
        seqlen_q=q.shape[1],
        seqlen_k=k.shape[1],
        nheads=nheads,
        group=group,
        softmax_scale=softmax_scale,
        left=left,
        right=0 if causal else right,
        softcap=softcap,
        slopes=slopes,
        dropout_p=dropout_p,
        rng_state=rng_state,
        batch_ids=batch_ids,
        sink=None
        if learnable_sink is None
        else learnable_sink.to(device=q.device, dtype=_accumulate_dtype(q.dtype)).view(nheads_kv, group, 1),
        mods=mods,
    )


def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, problem: _Problem, block_m: int, block_n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen_q = q.shape[:2]
    nheads_kv, group, head_dim_v = k.shape[2], problem.group, v.shape[-1]
    acc_dtype = _accumulate_dtype(q.dtype)
    q_g = _grouped(q, nheads_kv, acc_dtype)
    k_t = k.to(acc_dtype).transpose(1, 2)
    v_t = v.to(acc_dtype).transpose(1, 2)
    # NaN-poisoned so that a row the loop forgot to write cannot pass for a result.
    out = torch.full(
        (batch, seqlen_q, nheads_kv, group, head_dim_v), float("nan"), dtype=q.dtype, device=q.device
    )
    lse = torch.full((batch, nheads_kv, group, seqlen_q), float("nan"), dtype=acc_dtype, device=q.device)

    for row_start in range(0, seqlen_q, block_m):
        row_stop = min(row_start + block_m, seqlen_q)
        q_tile = _rows(q_g, row_start, row_stop)  # [B, H_KV, G·block_m, D]
        m = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        ell = torch.zeros_like(m)
        acc = q_tile.new_zeros(*q_tile.shape[:-1], head_dim_v)
        for col_start in problem.key_tiles(row_start, row_stop, block_n):
            col_stop = min(col_start + block_n, problem.seqlen_k)
            s, _ = problem.scores(q_tile, k_t[:, :, col_start:col_stop], row_start, col_start)
            m_new = torch.maximum(m, s.amax(dim=-1))
            # Rows that have seen no key yet keep m_new = −∞; shift them by 0 to avoid −∞ − (−∞).
            shift = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - shift[..., None])
            alpha = torch.exp(m - shift)
            # ℓ sums P before dropout: the lse and the normaliser are those of the softmax itself.
            ell = alpha * ell + p.sum(dim=-1)
            if problem.dropout_p > 0:
                keep = problem.dropout_keep(row_start, row_stop, col_start, col_stop)
                p = p * keep.to(acc_dtype) / (1.0 - problem.dropout_p)
            acc = alpha[..., None] * acc + p @ v_t[:, :, col_start:col_stop]
            m = m_new
        if problem.sink is not None:
            m, ell, acc = problem.fold_sink(m, ell, acc, row_stop - row_start)

        seen = ell > 0
        safe_ell = torch.where(seen, ell, torch.ones_like(ell))
        out_tile = torch.where(seen[..., None], acc / safe_ell[..., None], torch.zeros_like(acc))
        lse_tile = torch.where(seen, m + torch.log(safe_ell), torch.full_like(m, float("-inf")))
        rows = row_stop - row_start
        out[:, row_start:row_stop] = out_tile.unflatten(2, (group, rows)).permute(0, 3, 1, 2, 4).to(q.dtype)
        lse[:, :, :, row_start:row_stop] = lse_tile.unflatten(2, (group, rows))

    return out.flatten(2, 3), lse.flatten(1, 2)


def _backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    problem: _Problem,
    block_m: int,
    block_n: int,
) -> tuple[torch.Tensor, ...]:
    """``(dq, dk, dv)``, and the sink's gradient ``(H,)`` when the problem has one."""
    seqlen_q, seqlen_k, nheads_kv = q.shape[1], k.shape[1], k.shape[2]
    group, scale = problem.group, problem.softmax_scale
    acc_dtype = _accumulate_dtype(q.dtype)
    q_g = _grouped(q, nheads_kv, acc_dtype)
    do_g = _grouped(dout, nheads_kv, acc_dtype)
    k_t = k.to(acc_dtype).transpose(1, 2)
    v_t = v.to(acc_dtype).transpose(1, 2)
    # D = rowsum(dO ∘ O) = rowsum(P ∘ dP), with or without dropout (docs/design/backward.md).
    delta = (do_g * _grouped(out, nheads_kv, acc_dtype)).sum(dim=-1)  # [B, H_KV, G, N_q]
    lse_g = lse.to(acc_dtype).unflatten(1, (nheads_kv, group))
    lse_with_sink = lse_g
    # The sink's gradient takes Δ as Σ_j P∘dP accumulated over the tiles: the D above comes from O rounded
    # to the input dtype, and the sink's gradient sums that rounding over every row of a head.
    pdp = torch.zeros_like(delta) if problem.sink is not None else None
    # A fully masked row has lse = −∞ and only −∞ scores: shifting by 0 makes its P exactly 0.
    lse_g = torch.where(torch.isneginf(lse_g), torch.zeros_like(lse_g), lse_g)

    # dQ sums over K/V tiles, so it is an accumulator; dK and dV are written once per tile (NaN-poisoned).
    dq = torch.zeros_like(q_g)
    dk = torch.full(k.shape, float("nan"), dtype=k.dtype, device=k.device)
    dv = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)

    for col_start in range(0, seqlen_k, block_n):
        col_stop = min(col_start + block_n, seqlen_k)
        k_tile = k_t[:, :, col_start:col_stop]  # [B, H_KV, bn, D]
        v_tile = v_t[:, :, col_start:col_stop]
        dk_tile = torch.zeros_like(k_tile)
        dv_tile = torch.zeros_like(v_tile)
        for row_start in problem.query_tiles(col_start, col_stop, block_m):
            row_stop = min(row_start + block_m, seqlen_q)
            q_tile = _rows(q_g, row_start, row_stop)  # [B, H_KV, G·bm, D]
            do_tile = _rows(do_g, row_start, row_stop)
            s, score_grad = problem.scores(q_tile, k_tile, row_start, col_start)
            p = torch.exp(s - _rows(lse_g[..., None], row_start, row_stop))
            dp = do_tile @ v_tile.transpose(-1, -2)
            if problem.dropout_p > 0:
                # O = (P ∘ Z/(1−p))·V: dV sees the dropped P, and dP = ∂L/∂P carries the same factor.
                keep = problem.dropout_keep(row_start, row_stop, col_start, col_stop)
                dropout_scale = keep.to(acc_dtype) / (1.0 - problem.dropout_p)
                dv_tile += (p * dropout_scale).transpose(-1, -2) @ do_tile
                dp = dp * dropout_scale
            else:
                dv_tile += p.transpose(-1, -2) @ do_tile
            if pdp is not None:
                pdp[:, :, :, row_start:row_stop] += (p * dp).sum(dim=-1).unflatten(2, (group, -1))
            ds = p * (dp - _rows(delta[..., None], row_start, row_stop))
            if score_grad is not None:
                ds = ds * score_grad
            dk_tile += ds.transpose(-1, -2) @ q_tile * scale
            dq[:, :, :, row_start:row_stop] += (ds @ k_tile * scale).unflatten(2, (group, -1))
        dk[:, col_start:col_stop] = dk_tile.transpose(1, 2).to(k.dtype)
        dv[:, col_start:col_stop] = dv_tile.transpose(1, 2).to(v.dtype)

    grads = (dq.flatten(1, 2).transpose(1, 2).to(q.dtype), dk, dv)
    return grads if pdp is None else (*grads, problem.sink_grad(lse_with_sink, pdp))


Window = tuple[int, int]


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    *,
    window_size: Window = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward pass by the online softmax, one ``block_m × block_n`` tile at a time.

    For each tile of query rows, keep a running row max ``m``, row sum ``ℓ`` and unnormalised output
    ``O`` (initially ``−∞``, 0, 0) and visit the K/V tiles the rows can see, left to right. For tile
    ``j`` form the score, each option entering in this order:

        S = scale · Q·Kⱼᵀ
        S ← softcap · tanh(S / softcap)            softcap > 0
        S ← S − slope_h · |i + N_k − N_q − j|      alibi_slopes
        S ← −∞ where key j is outside the window   causal / window_size, only on tiles the window cuts

    then, with ``m̃ = rowmax(S)``, ``P̃ = exp(S − m_new)``:

        m_new = max(m, m̃)
        ℓ_new = e^{m − m_new} · ℓ + rowsum(P̃)                         (P before dropout)
        O_new = e^{m − m_new} · O + (P̃ ∘ Z / (1 − dropout_p)) · Vⱼ    (Z: dropout's keep mask, 1 without)

    After the last tile a ``learnable_sink`` (logit ``σ_h`` of the row's head, in the scaled-score domain)
    joins as one more key that has no value row:

        m_new = max(m, σ_h),   ℓ_new = e^{m − m_new} · ℓ + e^{σ_h − m_new},   O_new = e^{m − m_new} · O

    At the end ``out = O / ℓ`` and ``lse = m + log ℓ``: the lse and the normaliser are those of the
    softmax before dropout (sink included), and dropout only thins the weighted sum. The window is
    ``[i + N_k − N_q − left, i + N_k − N_q + right]`` (bottom-right aligned; −1 is unlimited; ``causal``
    forces right = 0): K/V tiles wholly outside it are never visited, tiles wholly inside are not
    masked. Where
    ``m_new = −∞`` (nothing visible yet) the exponents use 0 in its place, so no ``−∞ − (−∞)`` arises; a
    row that sees no key ends with ``ℓ = 0`` and gives ``out = 0``, ``lse = −∞`` (with a sink ``ℓ = 1``
    at ``m = σ_h``: ``out = 0``, ``lse = σ_h``).

    Args:
        q: ``(B, N_q, H, D)``; k: ``(B, N_k, H_KV, D)``; v: ``(B, N_k, H_KV, D_v)``; ``H % H_KV == 0``;
            fp16, bf16, fp32 or fp64, any strides. With ``cu_seqlens_q`` given, the varlen layout of
            :func:`attention_varlen_fwd` instead.
        softmax_scale: multiplies ``q·kᵀ``.
        causal: bottom-right aligned causal mask.
        window_size: ``(left, right)``, normalised by the caller (``flashtile.validation``): −1 unlimited.
        softcap: > 0 caps the scaled score; 0 is off.
        alibi_slopes: float32 ``(H,)`` or ``(B, H)``, or None.
        dropout_p: in [0, 1); > 0 needs ``rng_state``.
        rng_state: int64 ``(2,)`` = ``(seed, offset)`` for :func:`flashtile.reference.dropout.dropout_keep`.
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k: varlen, see :func:`attention_varlen_fwd`.
        learnable_sink: ``(H,)`` sink logits (GPT-OSS), or None.
        mods: block mask, mask_mod, score_mod/score_mod_bwd and aux_tensors (:class:`flashtile.mods.Mods`):
            score_mod after ALiBi, then the block mask (mask_mod in its partial tiles) with the window.
        block_m, block_n: tile sizes (any positive integers).

    Returns:
        ``out`` ``(B, N_q, H, D_v)`` in the input dtype and ``lse`` ``(B, H, N_q)`` natural log, float32
        (float64 for float64 inputs); varlen: ``(total_q, H, D)`` and ``(H, total_q)``.

    >>> q = k = v = torch.ones(1, 3, 1, 2)
    >>> out, lse = attention_fwd(q, k, v, softmax_scale=1.0, causal=True, block_m=2, block_n=2)
    >>> out[0, :, 0, 0].tolist(), [round(x, 4) for x in lse[0, 0].tolist()]
    ([1.0, 1.0, 1.0], [2.0, 2.6931, 3.0986])
    >>> _, lse = attention_fwd(q, k, v, 1.0, False, window_size=(0, 0), alibi_slopes=torch.tensor([1.0]))
    >>> lse[0, 0].tolist()
    [2.0, 2.0, 2.0]
    """
    if cu_seqlens_q is not None:
        return attention_varlen_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
            rng_state=rng_state, learnable_sink=learnable_sink, mods=mods, block_m=block_m, block_n=block_n,
        )  # fmt: skip
    batch_ids = torch.arange(q.shape[0], device=q.device)
    problem = _problem(
        q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout_p, rng_state, batch_ids,
        learnable_sink, mods,
    )  # fmt: skip
    return _forward(q, k, v, problem, block_m, block_n)


def attention_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    *,
    window_size: Window = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[torch.Tensor, ...]:
    """Backward pass that recomputes P tile by tile from Q, K and the forward's LSE.

    First ``Dᵢ = rowsum(dO ∘ O)`` (equal to ``rowsum(P ∘ dP)``, dropout included). Then for each K/V tile
    ``j``, with ``dKⱼ``, ``dVⱼ`` accumulated over the query tiles ``i`` that can see it (the others are
    skipped), each option entering as marked:

        S   = the masked score of the forward (scale, softcap, ALiBi, window)
        P   = exp(S − lse)                            (0 outside the window)
        dVⱼ += (P ∘ Z/(1 − p))ᵀ · dOᵢ                 dropout: V met the dropped P
        dP  = (dOᵢ · Vⱼᵀ) ∘ Z/(1 − p)                 dropout: ∂L/∂P carries the same factor
        dS  = P ∘ (dP − D)
        dS ← dS ∘ (1 − tanh²(S̃ / softcap))           softcap: S̃ = scale · Qᵢ·Kⱼᵀ, the uncapped score
        dQᵢ += scale · dS · Kⱼ
        dKⱼ += scale · dSᵀ · Qᵢ

    A ``learnable_sink`` enters only through the lse (P is exact without it), and its own gradient is

        dσ_h = −Σ_{b,i} e^{σ_h − lseᵢ} · Dᵢ       (the sink's probability times D; docs/design/sinks.md)

    ALiBi adds a constant to S, so it enters only through the recomputed P. With GQA the ``G`` query
    heads of a KV head are stacked along the rows of ``P`` and ``dS``, so ``Pᵀ·dO`` and ``dSᵀ·Q`` sum
    the group into ``dk``, ``dv`` of the KV head. A row with ``lse = −∞`` (no visible key) gets ``P = 0``
    by shifting with 0 instead of ``−∞``, hence zero gradients.

    Args:
        dout: ``(B, N_q, H, D)`` gradient of ``out``, any strides.
        q, k, v, out, lse: as given to and returned by :func:`attention_fwd`.
        softmax_scale, causal and the keywords: as given to :func:`attention_fwd`.
        block_m, block_n: tile sizes (any positive integers).

    Returns:
        ``dq`` ``(B, N_q, H, D)``, ``dk`` ``(B, N_k, H_KV, D)`` and ``dv`` ``(B, N_k, H_KV, D_v)``, in the
        input dtype (varlen: ``(total_q, H, D)`` and ``(total_k, H_KV, D / D_v)``); with a
        ``learnable_sink`` a fourth, its gradient ``(H,)`` in the accumulation dtype.

    >>> q = k = v = torch.ones(1, 2, 1, 2)
    >>> out, lse = attention_fwd(q, k, v, 1.0, causal=True)
    >>> dq, dk, dv = attention_bwd(torch.ones_like(out), q, k, v, out, lse, 1.0, causal=True)
    >>> dv[0, :, 0, 0].tolist()
    [1.5, 0.5]
    """
    if cu_seqlens_q is not None:
        return attention_varlen_bwd(
            dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
            dropout_p=dropout_p, rng_state=rng_state, learnable_sink=learnable_sink, mods=mods,
            block_m=block_m, block_n=block_n,
        )  # fmt: skip
    batch_ids = torch.arange(q.shape[0], device=q.device)
    problem = _problem(
        q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout_p, rng_state, batch_ids,
        learnable_sink, mods,
    )  # fmt: skip
    return _backward(dout, q, k, v, out, lse, problem, block_m, block_n)


def _sequences(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """``(q_start, q_stop, k_start, k_stop)`` of each sequence of a packed batch (read on the host)."""
    q_bounds, k_bounds = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return list(zip(q_bounds[:-1], q_bounds[1:], k_bounds[:-1], k_bounds[1:], strict=True))


def _sequence_problem(
    q: torch.Tensor,
    k: torch.Tensor,
    index: int,
    softmax_scale: float,
    causal: bool,
    window_size: Window,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    dropout_p: float,
    rng_state: torch.Tensor | None,
    learnable_sink: torch.Tensor | None,
    mods: Mods | None,
) -> _Problem:
    """Sequence ``index`` (``q``, ``k`` a batch of 1): its ALiBi slopes, and ``b = index`` for dropout."""
    if alibi_slopes is not None and alibi_slopes.dim() == 2:
        alibi_slopes = alibi_slopes[index]
    batch_ids = torch.tensor([index], device=q.device)
    return _problem(
        q, k, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout_p, rng_state, batch_ids,
        learnable_sink, mods,
    )  # fmt: skip


def attention_varlen_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    causal: bool,
    *,
    window_size: Window = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attention_fwd` on a packed batch, one sequence at a time (a loop on the host).

    Sequence ``b`` holds queries ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``; it is attended exactly as a dense batch of one, with its own
    ``N_q``, ``N_k`` (either may be 0; causal and windows are bottom-right aligned per sequence), its row
    ``b`` of ``(B, H)`` ALiBi slopes, and ``b`` as dropout's batch index (``i``, ``j`` are positions
    inside the sequence).

    Args:
        q: ``(total_q, H, D)``; k, v: ``(total_k, H_KV, D)``.
        cu_seqlens_q, cu_seqlens_k: int32 ``(B + 1,)``, validated by the caller (start at 0,
            non-decreasing, end at ``total_q`` / ``total_k``).
        max_seqlen_q, max_seqlen_k: part of the launcher contract; the loop does not need them.
        The rest: as in :func:`attention_fwd`.

    Returns:
        ``out`` ``(total_q, H, D)`` in the input dtype and ``lse`` ``(H, total_q)`` (flash_attn's varlen
        layout), float32 (float64 for float64 inputs).

    >>> q = k = v = torch.ones(3, 1, 2)
    >>> cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    >>> out, lse = attention_varlen_fwd(q, k, v, cu, cu, 2, 2, 1.0, True)
    >>> [round(x, 4) for x in lse[0].tolist()]
    [2.0, 2.0, 2.6931]
    """
    acc_dtype = _accumulate_dtype(q.dtype)
    out = torch.full((*q.shape[:-1], v.shape[-1]), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=acc_dtype, device=q.device)
    for index, (q_start, q_stop, k_start, k_stop) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k)):
        q_seq, k_seq, v_seq = q[None, q_start:q_stop], k[None, k_start:k_stop], v[None, k_start:k_stop]
        problem = _sequence_problem(
            q_seq, k_seq, index, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout_p,
            rng_state, learnable_sink, mods,
        )  # fmt: skip
        out_seq, lse_seq = _forward(q_seq, k_seq, v_seq, problem, block_m, block_n)
        out[q_start:q_stop] = out_seq[0]
        lse[:, q_start:q_stop] = lse_seq[0]
    return out, lse


def attention_varlen_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float,
    causal: bool,
    *,
    window_size: Window = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    rng_state: torch.Tensor | None = None,
    learnable_sink: torch.Tensor | None = None,
    mods: Mods | None = None,
    block_m: int = 64,
    block_n: int = 64,
) -> tuple[torch.Tensor, ...]:
    """:func:`attention_bwd` on a packed batch, one sequence at a time, as :func:`attention_varlen_fwd`.

    Args:
        dout, out: ``(total_q, H, D)``; lse: ``(H, total_q)``; the rest as in :func:`attention_varlen_fwd`.

    Returns:
        ``dq`` ``(total_q, H, D)``, ``dk`` ``(total_k, H_KV, D)`` and ``dv`` ``(total_k, H_KV, D_v)``, in
        the input dtype; with a ``learnable_sink`` also its gradient ``(H,)``, summed over the sequences.

    >>> q = k = v = torch.ones(3, 1, 2)
    >>> cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    >>> out, lse = attention_varlen_fwd(q, k, v, cu, cu, 2, 2, 1.0, True)
    >>> _, _, dv = attention_varlen_bwd(torch.ones_like(out), q, k, v, out, lse, cu, cu, 2, 2, 1.0, True)
    >>> dv[:, 0, 0].tolist()
    [1.0, 1.5, 0.5]
    """
    dq = torch.full(q.shape, float("nan"), dtype=q.dtype, device=q.device)
    dk = torch.full(k.shape, float("nan"), dtype=k.dtype, device=k.device)
    dv = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    dsink = None
    if learnable_sink is not None:
        dsink = torch.zeros(q.shape[1], dtype=_accumulate_dtype(q.dtype), device=q.device)
    for index, (q_start, q_stop, k_start, k_stop) in enumerate(_sequences(cu_seqlens_q, cu_seqlens_k)):
        q_seq, k_seq, v_seq = q[None, q_start:q_stop], k[None, k_start:k_stop], v[None, k_start:k_stop]
        problem = _sequence_problem(
            q_seq, k_seq, index, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout_p,
            rng_state, learnable_sink, mods,
        )  # fmt: skip
        grads = _backward(
            dout[None, q_start:q_stop], q_seq, k_seq, v_seq, out[None, q_start:q_stop],
            lse[None, :, q_start:q_stop], problem, block_m, block_n,
        )  # fmt: skip
        dq[q_start:q_stop], dk[k_start:k_stop], dv[k_start:k_stop] = (g[0] for g in grads[:3])
        if dsink is not None:
            dsink += grads[3]
    return (dq, dk, dv) if dsink is None else (dq, dk, dv, dsink)
