"""Context parallelism: attention over a sequence sharded across the ranks of a torch.distributed group.

Each rank holds a shard of q, k and v along the sequence. ``ring_flash_attn_func`` keeps the queries where
they are and passes the K/V shards around the ring (rank r sends to r + 1, receives from r − 1; each step's
exchange is posted before the step's attention so that they overlap), attends its queries to each shard in
turn and merges the partial results in fp32 by their log-sum-exps. The backward passes K/V around again,
with dK/dV accumulators that travel with them and are back at their owner after one more step; dQ stays
home. Only the kernels' ``(out, lse)`` forward and their backward, which takes the merged out and LSE, are
used: every backend serves (CPU, portable Triton, Hopper). ``ulysses_flash_attn_func`` (DeepSpeed-Ulysses)
swaps the sharding instead: one all-to-all gives each rank the whole sequence of H / W heads, where
``flash_attn_func`` runs with every option (the positions are global again), and a second one gives each
rank its rows of every head back; W must divide the heads.

Layouts of the global sequence (length N, W ranks):

- ``"contiguous"``: rank r holds positions [r·N/W, (r + 1)·N/W). Causal ring work is unbalanced: rank W − 1
  attends to every shard, rank 0 to its own.
- ``"zigzag"``: the sequence cut into 2W chunks, rank r holding chunks r and 2W − 1 − r (in that order),
  so every rank has the same causal work (:func:`zigzag_shard` and :func:`zigzag_unshard` convert).

Causal ring steps, with j the owner of the K/V shard a rank holds (docs/design/context_parallel.md has the
derivation): contiguous, j < r all keys visible, j = r causal, j > r none (skipped); zigzag, j = r causal
on the whole shards, j < r every query sees the first half of the keys, j > r the second half of the
queries sees every key.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from flashtile import backend as _backend
from flashtile import ops as _ops
from flashtile import validation
from flashtile.errors import FlashtileValueError
from flashtile.interface import flash_attn_func
from flashtile.modules import FlashAttention

__all__ = [
    "LAYOUTS",
    "ContextParallelAttention",
    "ring_flash_attn_func",
    "ulysses_flash_attn_func",
    "zigzag_shard",
    "zigzag_unshard",
]

LAYOUTS = ("contiguous", "zigzag")


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) without an initialised process group."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise FlashtileValueError("group was given but torch.distributed is not initialised")
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _peer(group: dist.ProcessGroup | None, rank_in_group: int) -> int:
    """The global rank P2P calls take for ``rank_in_group``."""
    return rank_in_group if group is None else dist.get_global_rank(group, rank_in_group)


def _exchange(
    sends: list[torch.Tensor], group: dist.ProcessGroup | None, rank: int, world: int
) -> tuple[list[torch.Tensor], list[dist.Work]]:
    """Post the ring step: ``sends`` to rank + 1, as many tensors like them from rank − 1. Returns the
    receive buffers and the requests to wait on."""
    received = [torch.empty_like(t) for t in sends]
    to, source = _peer(group, (rank + 1) % world), _peer(group, (rank - 1) % world)
    ops = [dist.P2POp(dist.isend, t, to, group) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, source, group) for t in received]
    return received, dist.batch_isend_irecv(ops)


def _wait(requests: list[dist.Work]) -> None:
    for request in requests:
        request.wait()


def _check_layout(layout: object, seqlen: int) -> None:
    """``layout`` is one of LAYOUTS, and a zigzag shard splits into two chunks."""
    if layout not in LAYOUTS:
        raise FlashtileValueError(f"layout must be one of {', '.join(LAYOUTS)}; got {layout!r}")
    if layout == "zigzag" and seqlen % 2:
        raise FlashtileValueError(f"layout 'zigzag' needs an even shard length; got {seqlen}")


def _step_slices(layout: str, causal: bool, rank: int, owner: int, seqlen: int) -> tuple[slice, slice, bool]:
    """(query rows, key rows, causal) of rank ``rank`` attending to the K/V shard of ``owner``: the rows of
    the local shards that see each other, and whether the block is causal; an empty query slice when none
    do (module docstring)."""
    every = slice(0, seqlen)
    if not causal:
        return every, every, False
    if owner == rank:
        return every, every, True
    if layout == "contiguous":
        return (every, every, False) if owner < rank else (slice(0, 0), every, False)
    half = seqlen // 2
    if owner < rank:
        return every, slice(0, half), False
    return slice(half, seqlen), every, False


def _merge(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor, rows: slice
) -> None:
    """Fold a block's (out, lse) for query ``rows`` into the running fp32 ``out`` (B, N, H, D) and ``lse``
    (B, H, N), in place, in the numerically stable form out −= σ(lse_b − lse)·(out − out_b), lse =
    log(e^lse + e^lse_b); a running lse of −inf (nothing seen yet) takes the block's as they are."""
    running_out, running_lse = out[:, rows], lse[:, :, rows]
    block_lse = block_lse.to(lse.dtype)
    weight = torch.sigmoid(block_lse - running_lse).transpose(1, 2).unsqueeze(-1)
    running_out.sub_(weight * (running_out - block_out.to(out.dtype)))
    running_lse.copy_(torch.logaddexp(running_lse, block_lse))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, softcap, deterministic, layout, group, backend):
        rank, world = _world(group)
        seqlen = q.shape[1]
        acc_dtype = _ops.lse_dtype(q.dtype)
        out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=acc_dtype, device=q.device)
        lse = torch.full((q.shape[0], q.shape[2], seqlen), -float("inf"), dtype=acc_dtype, device=q.device)
        kv = [k.contiguous(), v.contiguous()]
        for step in range(world):
            requests: list[dist.Work] = []
            if step + 1 < world:
                incoming, requests = _exchange(kv, group, rank, world)
            rows, keys, block_causal = _step_slices(layout, causal, rank, (rank - step) % world, seqlen)
            if rows.stop > rows.start:
                block_q, block_k, block_v = (
                    t.contiguous() for t in (q[:, rows], kv[0][:, keys], kv[1][:, keys])
                )
                block_out, block_lse = _ops.run_attn_fwd(
                    block_q, block_k, block_v, scale, block_causal, backend, softcap=softcap
                )
                _merge(out, lse, block_out, block_lse, rows)
            _wait(requests)
            if step + 1 < world:
                kv = incoming
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (scale, causal, softcap, deterministic, layout, group, backend)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, softcap, deterministic, layout, group, backend = ctx.options
        rank, world = _world(group)
        seqlen = q.shape[1]
        acc_dtype = _ops.lse_dtype(q.dtype)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
        # The K/V shard held now, and the dK/dV of its owner summed over the ranks it has visited: a rank's
        # own start at zero; the others arrive from rank − 1 while this step's kernel runs.
        kv = [k.contiguous(), v.contiguous()]
        dkv = [torch.zeros(k.shape, dtype=acc_dtype, device=k.device), torch.zeros_like(v, dtype=acc_dtype)]
        dkv_requests: list[dist.Work] = []
        for step in range(world):
            requests: list[dist.Work] = []
            if step + 1 < world:
                incoming, requests = _exchange(kv, group, rank, world)
            rows, keys, block_causal = _step_slices(layout, causal, rank, (rank - step) % world, seqlen)
            grads = None
            if rows.stop > rows.start:
                block = (
                    t.contiguous()
                    for t in (
                        dout[:, rows],
                        q[:, rows],
                        kv[0][:, keys],
                        kv[1][:, keys],
                        out[:, rows],
                        lse[:, :, rows],
                    )
                )
                grads = _ops.run_attn_bwd(
                    *block, scale, block_causal, backend, softcap=softcap, deterministic=deterministic
                )
                dq[:, rows] += grads[0]
            _wait(dkv_requests)
            if grads is not None:
                dkv[0][:, keys] += grads[1]
                dkv[1][:, keys] += grads[2]
            _wait(requests)
            if step + 1 < world:
                kv = incoming
            # The accumulators follow their K/V to rank + 1; after the last step that is their owner.
            if world > 1:
                # Held until the sends complete (the next step's wait).
                sent = dkv
                dkv, dkv_requests = _exchange(sent, group, rank, world)
        _wait(dkv_requests)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), *([None] * 7)


def ring_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, None]:
    """Attention over a sequence sharded across ``group`` (default: the world), flash_attn_func's
    arguments on each rank's shards: q (B, N_local, H, D), k and v (B, N_local, H_kv, D), the same N_local
    on every rank, positions laid out by ``layout`` ("contiguous" or "zigzag", module docstring; zigzag
    needs an even N_local). Returns this rank's rows of the output, or with ``return_attn_probs`` ``(out,
    softmax_lse, None)``, lse (B, H, N_local) fp32. Differentiable in q, k and v. Every rank must call it
    with the same shapes and options, checked by flash_attn_func's rules over the whole sequence (so a
    window with negative bounds, or wider than the sequence, is none, and (-1, 0) is causal). Dropout,
    other sliding windows and ALiBi, whose masks or biases need global positions, raise
    NotImplementedError.
    """
    q, k, v = validation.unpack_qkv(q=q, k=k, v=v)
    _check_layout(layout, q.shape[1])
    validation.check_same_device(q=q, k=k, v=v)
    backend = _backend.resolve(q.device)
    validation.check_dtypes(backend, q=q, k=k, v=v)
    if k.shape[1] != q.shape[1]:
        raise FlashtileValueError(
            f"q and k must hold shards of the same length; got {q.shape[1]} and {k.shape[1]} rows"
        )
    scale = validation.check_softmax_scale(softmax_scale, q.shape[-1])
    # flash_attn_func's rules over the whole sequence: a window wider than it, or negative, is none, and
    # (-1, 0) is causal.
    _, world = _world(group)
    options = validation.check_options(
        dropout_p, window_size, softcap, alibi_slopes, causal, deterministic, return_attn_probs,
        seqlen_k=q.shape[1] * world, batch=q.shape[0], nheads=q.shape[2], device=q.device,
    )  # fmt: skip
    unsupported = {
        "dropout_p": (dropout_p, options.dropout_p != 0),
        "window_size": (window_size, options.window_size not in ((-1, -1), (-1, 0))),
        "alibi_slopes": ("a tensor", options.alibi_slopes is not None),
    }
    for name, (value, given) in unsupported.items():
        if given:
            raise NotImplementedError(
                f"ring_flash_attn_func does not support {name} yet (got {value!r}): its mask or bias needs "
                "global positions; call it without"
            )
    out, lse = _RingAttention.apply(
        q, k, v, scale, options.causal, options.softcap, options.deterministic, layout, group, backend
    )
    return (out, lse, None) if options.return_attn_probs else out


def zigzag_shard(x: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's zigzag shard of the global ``x`` along ``dim``: chunks r and 2W − 1 − r of 2W (the
    length must divide by 2W), concatenated."""
    rank, world = _world(group)
    if x.shape[dim] % (2 * world):
        raise FlashtileValueError(
            f"zigzag_shard: x's length along dim {dim} must divide by 2 × world size = {2 * world}; "
            f"got {x.shape[dim]}"
        )
    chunks = x.chunk(2 * world, dim)
    return torch.cat((chunks[rank], chunks[2 * world - 1 - rank]), dim)


def _from_zigzag(x: torch.Tensor, world: int, dim: int) -> torch.Tensor:
    """The sequence in order from the ranks' zigzag shards concatenated in rank order along ``dim``: every
    shard's first half (chunks 0 … W − 1), then the second halves in reverse rank order (W … 2W − 1)."""
    chunks = x.chunk(2 * world, dim)
    return torch.cat((*chunks[0::2], *reversed(chunks[1::2])), dim)


def _to_zigzag(x: torch.Tensor, world: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`_from_zigzag`: rank r's chunks r and 2W − 1 − r, for every rank in order."""
    chunks = x.chunk(2 * world, dim)
    return torch.cat([part for r in range(world) for part in (chunks[r], chunks[2 * world - 1 - r])], dim)


def zigzag_unshard(local: torch.Tensor, dim: int = 1, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The global tensor from every rank's zigzag shard (an all-gather; the inverse of
    :func:`zigzag_shard`)."""
    _, world = _world(group)
    if world == 1:
        return local
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local.contiguous(), group=group)
    return _from_zigzag(torch.cat(gathered, dim), world, dim)


class _AllToAll(torch.autograd.Function):
    """Block i of the first dim to rank i, block j of the result from rank j. With equal blocks the
    gradient goes back the same way: the backward is the same exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        received = torch.empty_like(x)
        dist.all_to_all_single(received, x, group=group)
        return received

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        received = torch.empty_like(grad)
        dist.all_to_all_single(received, grad, group=ctx.group)
        return received, None


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return _AllToAll.apply(x, group)


def _heads_to_ranks(x: torch.Tensor, world: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """(B, n, H, D) rows of every head → (B, W·n, H / W, D) every rank's rows, in rank order, of this rank's
    H / W heads."""
    batch, rows, heads, dim = x.shape
    blocks = x.reshape(batch, rows, world, heads // world, dim).permute(2, 0, 1, 3, 4)
    received = _all_to_all(blocks, group)
    return received.permute(1, 0, 2, 3, 4).reshape(batch, world * rows, heads // world, dim)


def _ranks_to_heads(x: torch.Tensor, world: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The inverse of :func:`_heads_to_ranks`."""
    batch, total, heads, dim = x.shape
    blocks = x.reshape(batch, world, total // world, heads, dim).permute(1, 0, 2, 3, 4)
    received = _all_to_all(blocks, group)
    return received.permute(1, 2, 0, 3, 4).reshape(batch, total // world, world * heads, dim)


def ulysses_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
) -> torch.Tensor:
    """Attention over a sequence sharded across ``group`` by head redistribution (DeepSpeed-Ulysses): an
    all-to-all gives each rank the whole sequence of H / W heads, :func:`flashtile.flash_attn_func` runs
    there with every option it takes (the positions are global again, so windows and ALiBi hold), and a
    second all-to-all returns each rank's rows of every head. q (B, N_local, H, D), k and v (B, N_local,
    H_kv, D) as for :func:`ring_flash_attn_func`, in ``layout``; W must divide H. With H_kv not divisible by
    W, K and V are repeated to H heads first (more traffic). Differentiable in q, k and v; dropout draws
    each rank's mask from its own generator.
    """
    rank, world = _world(group)
    q, k, v = validation.unpack_qkv(q=q, k=k, v=v)
    _check_layout(layout, q.shape[1])
    heads, heads_kv = q.shape[2], k.shape[2]
    if heads % world:
        raise FlashtileValueError(
            f"ulysses_flash_attn_func needs the world size to divide q's heads; got {heads} heads on {world} "
            "ranks (ring_flash_attn_func has no such bound)"
        )
    if world == 1:
        return flash_attn_func(
            q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
        )
    if heads_kv % world:
        k, v = (t.repeat_interleave(heads // heads_kv, dim=2) for t in (k, v))
    if alibi_slopes is not None:
        per_rank = heads // world
        alibi_slopes = alibi_slopes[..., rank * per_rank : (rank + 1) * per_rank]
    q, k, v = (_heads_to_ranks(t, world, group) for t in (q, k, v))
    if layout == "zigzag":
        q, k, v = (_from_zigzag(t, world, 1) for t in (q, k, v))
    out = flash_attn_func(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic
    )
    if layout == "zigzag":
        out = _to_zigzag(out, world, 1)
    return _ranks_to_heads(out, world, group)


class ContextParallelAttention(FlashAttention):
    """:class:`flashtile.FlashAttention` on a sequence sharded across ``group``: the same parameters and
    options, ``forward`` taking this rank's (batch_size, seqlen / W, embed_dim) rows in ``layout`` and giving
    their outputs. The projections are per token; the attention is :func:`ring_flash_attn_func` (``scheme=
    "ring"``, causal, softcap, GQA) or :func:`ulysses_flash_attn_func` (``"ulysses"``, every option, W
    dividing num_heads). Parameter gradients are this rank's share: sum them over the group (DDP or
    FSDP over the same ranks does). Block masks and the other programmable options raise
    NotImplementedError."""

    def __init__(
        self,
        *args: object,
        group: dist.ProcessGroup | None = None,
        scheme: str = "ring",
        layout: str = "contiguous",
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)
        if scheme not in ("ring", "ulysses"):
            raise FlashtileValueError(f"scheme must be 'ring' or 'ulysses'; got {scheme!r}")
        _check_layout(layout, 0)
        self.group, self.scheme, self.layout = group, scheme, layout

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mods: dict[str, object]
    ) -> torch.Tensor:
        if any(value is not None for value in mods.values()):
            raise NotImplementedError(
                "ContextParallelAttention takes no block mask, mask_mod or score_mod yet"
            )
        attention = ring_flash_attn_func if self.scheme == "ring" else ulysses_flash_attn_func
        return attention(q, k, v, **self.attention_options(), group=self.group, layout=self.layout)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scheme={self.scheme!r}, layout={self.layout!r}"
