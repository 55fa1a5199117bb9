"""Block-sparse attention masks: which (query block, key block) tiles are empty, partial or full.

A :class:`BlockMask` is built once (on the mask's device, the GPU for CUDA work) and reused by every layer
and by the backward. Per query block it lists the non-empty key blocks, split into partial blocks (the
kernels apply ``mask_mod`` there) and full blocks (no mask); per key block it lists the query blocks, for
the dK/dV kernel. The kernels iterate those lists, so empty tiles cost nothing. The layout and names
follow FlexAttention's ``BlockMask`` (``kv_num_blocks``/``kv_indices``, ``full_kv_*``, ``q_*``); the
design is docs/design/block_sparse.md.

Query ``i`` sees key ``j`` (of batch element ``b`` and query head ``h``) iff their tile is full, or it is
partial and ``mask_mod(b, h, i, j)`` holds (no ``mask_mod``: the whole tile is seen). Causal masking and
windows given to the attention call apply on top.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.mods import Mods, check_is_jit, takes_aux

# Block sizes the kernels take: each kernel tile is min(its own size, the mask's block), a power of two.
BLOCK_SIZES = (32, 64, 128, 256)
EMPTY, PARTIAL, FULL = 0, 1, 2
# Elements of mask_mod evaluated at once by create_block_mask (bool: 64 MiB).
_CHUNK_ELEMENTS = 1 << 26


def _block_size(block_size: object) -> tuple[int, int]:
    sizes = block_size if isinstance(block_size, tuple | list) else (block_size, block_size)
    if len(sizes) != 2 or any(isinstance(s, bool) or s not in BLOCK_SIZES for s in sizes):
        raise FlashtileValueError(
            f"block_size must be one of {BLOCK_SIZES} or a (query, key) pair of them; got {block_size!r}"
        )
    return int(sizes[0]), int(sizes[1])


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _lists(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts (…, R) int32, indices (…, R, C) int32) of the True entries of bool ``tiles`` (…, R, C),
    ascending, the rest of each row padding."""
    counts = tiles.sum(-1, dtype=torch.int32)
    # A stable sort of "not listed" puts the listed columns first, in order.
    indices = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return counts.contiguous(), indices.contiguous()


@dataclass(frozen=True, eq=False)
class MaskBits:
    """The ``mask_mod`` of a block mask's partial tiles, evaluated once: ``ids`` int32 ``(B, H, NQ, NK)``
    (the tile's row of ``words``, −1 off the partial tiles), ``words`` int32 ``(tiles, block_q, block_k /
    32)`` (bit ``j % 32`` of word ``j // 32``: key ``j`` of the block seen), ``meta`` int32 [batch stride,
    head stride, NK, block_q, block_k] of ``ids`` (0 where broadcast); ``aux`` the tensors the function read
    and their versions then (the bits stand for the function only while those are unchanged)."""

    ids: torch.Tensor
    words: torch.Tensor
    meta: torch.Tensor
    aux: tuple[torch.Tensor, ...] | None
    aux_versions: tuple[int, ...]

    def matches(self, aux: tuple[torch.Tensor, ...] | None) -> bool:
        """Whether a call's ``aux_tensors`` are the very tensors the bits were computed from, unmodified."""
        if aux is None or self.aux is None:
            return aux is None and self.aux is None
        return len(aux) == len(self.aux) and all(
            a is b and a._version == v for a, b, v in zip(aux, self.aux, self.aux_versions, strict=True)
        )

    def to(self, device: torch.device | str) -> MaskBits:
        return MaskBits(
            self.ids.to(device), self.words.to(device), self.meta.to(device), self.aux, self.aux_versions
        )


@dataclass(frozen=True, eq=False)
class BlockMask:
    """A block-sparse mask over ``seqlen_q × seqlen_k``, broadcast over batch and heads where its
    first dimensions are 1. Build it with :func:`create_block_mask` or :meth:`from_tiles`.

    Attributes (``B``, ``H`` are 1 or the batch size and the number of query heads; ``NQ``, ``NK`` the
    numbers of query and key blocks; int32 tensors on the mask's device):
        seqlen_q, seqlen_k: the lengths it covers (under varlen: at least each sequence's).
        block_size: ``(query block, key block)``, each in :data:`BLOCK_SIZES`.
        tile_states: int8 ``(B, H, NQ, NK)``: 0 empty, 1 partial, 2 full.
        kv_num_blocks, kv_indices: ``(B, H, NQ)``, ``(B, H, NQ, NK)``: partial key blocks per query block.
        full_kv_num_blocks, full_kv_indices: the same for full key blocks.
        q_num_blocks, q_indices, full_q_num_blocks, full_q_indices: ``(B, H, NK)``, ``(B, H, NK, NQ)``:
            partial and full query blocks per key block (the backward's dK/dV lists).
        mask_mod: the ``@triton.jit`` function applied in partial tiles, or None.
        bits: :class:`MaskBits`, the mask_mod on the partial tiles as create_block_mask evaluated it, or None.
    """

    seqlen_q: int
    seqlen_k: int
    block_size: tuple[int, int]
    tile_states: torch.Tensor
    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    mask_mod: object | None = None
    bits: MaskBits | None = None

    @classmethod
    def from_states(
        cls,
        tile_states: torch.Tensor,
        seqlen_q: int,
        seqlen_k: int,
        block_size: object,
        mask_mod=None,
        bits: MaskBits | None = None,
    ) -> BlockMask:
        """The lists of ``tile_states`` (int ``(B, H, NQ, NK)``: 0 empty, 1 partial, 2 full)."""
        partial, full = tile_states == PARTIAL, tile_states == FULL
        kv, full_kv = _lists(partial), _lists(full)
        q, full_q = _lists(partial.transpose(-1, -2)), _lists(full.transpose(-1, -2))
        return cls(
            seqlen_q, seqlen_k, _block_size(block_size), tile_states.to(torch.int8).contiguous(),
            *kv, *full_kv, *q, *full_q, mask_mod, bits,
        )  # fmt: skip

    @classmethod
    def from_tiles(
        cls, tiles: torch.Tensor, seqlen_q: int, seqlen_k: int, block_size: object = 128
    ) -> BlockMask:
        """A block mask from bool ``tiles`` over (query block, key block): shape ``(NQ, NK)`` (every batch
        element and head), ``(H, NQ, NK)`` or ``(B, H, NQ, NK)`` with ``B``, ``H`` 1 to broadcast.
        True tiles are seen whole (full), False ones skipped.

        >>> tiles = torch.tensor([[True, False], [True, True]])
        >>> BlockMask.from_tiles(tiles, 256, 256, 128).full_kv_num_blocks.tolist()
        [[[1, 2]]]
        """
        if not isinstance(tiles, torch.Tensor) or tiles.dtype != torch.bool or tiles.dim() not in (2, 3, 4):
            got = (
                f"{tiles.dtype} of shape {tuple(tiles.shape)}"
                if isinstance(tiles, torch.Tensor)
                else repr(tiles)
            )
            raise FlashtileTypeError(
                f"tiles must be a bool tensor of shape (NQ, NK), (H, NQ, NK) or (B, H, NQ, NK); got {got}"
            )
        bq, bk = _block_size(block_size)
        expected = (_cdiv(seqlen_q, bq), _cdiv(seqlen_k, bk))
        if tuple(tiles.shape[-2:]) != expected:
            raise FlashtileValueError(
                f"tiles must have (NQ, NK) = (ceil({seqlen_q}/{bq}), ceil({seqlen_k}/{bk})) = {expected} "
                f"as its last two dimensions; got shape {tuple(tiles.shape)}"
            )
        while tiles.dim() < 4:
            tiles = tiles[None]
        states = torch.where(tiles, FULL, EMPTY).to(torch.int8)
        return cls.from_states(states, seqlen_q, seqlen_k, (bq, bk))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(B, H, seqlen_q, seqlen_k)`` with 1 for broadcast dimensions."""
        return (*self.tile_states.shape[:2], self.seqlen_q, self.seqlen_k)

    def sparsity(self) -> float:
        """The fraction of empty tiles."""
        return float((self.tile_states == EMPTY).float().mean())

    def to(self, device: torch.device | str) -> BlockMask:
        """This mask with its tensors on ``device``."""
        bits = None if self.bits is None else self.bits.to(device)
        return BlockMask.from_states(
            self.tile_states.to(device), self.seqlen_q, self.seqlen_k, self.block_size, self.mask_mod, bits
        )

    def visible(
        self,
        batch: torch.Tensor,
        heads: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        mods: Mods | None = None,
    ) -> torch.Tensor:
        """Bool: query ``rows`` sees key ``cols`` of batch element ``batch``, query head ``heads``
        (broadcasting int64 index tensors); ``mods.mask_mod`` overrides the mask's own in partial tiles."""
        bq, bk = self.block_size
        b = batch if self.tile_states.shape[0] > 1 else torch.zeros_like(batch)
        h = heads if self.tile_states.shape[1] > 1 else torch.zeros_like(heads)
        state = self.tile_states.to(rows.device)[b, h, rows // bq, cols // bk]
        mask_mod = (mods.mask_mod if mods is not None else None) or self.mask_mod
        keep = state == FULL
        if mask_mod is None:
            return keep | (state == PARTIAL)
        return keep | ((state == PARTIAL) & (mods or Mods()).call(mask_mod, batch, heads, rows, cols))


def create_block_mask(
    mask_mod,
    B: int | None,
    H: int | None,
    seqlen_q: int,
    seqlen_k: int,
    block_size: int | tuple[int, int] = 128,
    device: torch.device | str | None = None,
    aux_tensors: tuple[torch.Tensor, ...] | list[torch.Tensor] | None = None,
) -> BlockMask:
    """The block mask of ``mask_mod`` (a ``@triton.jit`` ``mask_mod(b, h, q_idx, kv_idx[, aux]) -> bool``),
    evaluated on PyTorch index tensors on ``device`` (default: aux_tensors' device, else the CPU).

    ``B``/``H`` None (or 1) broadcast the mask over batch elements/heads; give them when the mask depends
    on ``b``/``h``. Tiles where ``mask_mod`` is True everywhere are full (no mask in the kernels), where it
    is False everywhere empty (skipped), the others partial (``mask_mod`` runs on them). ``aux_tensors``
    are what the function reads (e.g. document ids); pass the same to the attention call.

    >>> from flashtile import masks
    >>> bm = create_block_mask(masks.causal, None, None, 256, 256, block_size=128)
    >>> bm.tile_states[0, 0].tolist()
    [[1, 0], [2, 1]]
    """
    check_is_jit("mask_mod", mask_mod)
    if mask_mod is None:
        raise FlashtileTypeError("mask_mod must be a @triton.jit function; got None")
    bq, bk = _block_size(block_size)
    for name, value in (("B", B), ("H", H), ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise FlashtileValueError(
                f"{name} must be a positive int{' or None' * (name in 'BH')}; got {value!r}"
            )
    aux = None if aux_tensors is None else tuple(aux_tensors)
    if takes_aux(mask_mod, "mask_mod", 4) and aux is None:
        raise FlashtileValueError(f"mask_mod {mask_mod.fn.__name__} reads aux; pass aux_tensors")
    if device is None:
        device = aux[0].device if aux else "cpu"
    mods = Mods(mask_mod=mask_mod, aux_tensors=aux)
    batch, heads = B or 1, H or 1
    nq, nk = _cdiv(seqlen_q, bq), _cdiv(seqlen_k, bk)
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.arange(heads, device=device)[None, :, None, None]
    cols = torch.arange(nk * bk, device=device)[None, None, None, :]
    # Padding keys and queries do not exist: they neither make a tile partial nor keep it from being full.
    col_exists = cols < seqlen_k
    rows_per_chunk = max(bq, _CHUNK_ELEMENTS // (batch * heads * nk * bk) // bq * bq)
    states, ids, words, n_words = [], [], [], 0
    for r0 in range(0, nq * bq, rows_per_chunk):
        rows = torch.arange(r0, min(r0 + rows_per_chunk, nq * bq), device=device)[None, None, :, None]
        exists = (rows < seqlen_q) & col_exists
        keep = mods.call(mask_mod, b, h, rows.clamp(max=seqlen_q - 1), cols.clamp(max=seqlen_k - 1))
        keep = (
            torch.as_tensor(keep, device=device)
            .to(torch.bool)
            .expand(batch, heads, rows.shape[2], cols.shape[3])
        )
        tiles = (keep & exists).unflatten(3, (nk, bk)).unflatten(2, (-1, bq))
        tiles_all = (keep | ~exists).unflatten(3, (nk, bk)).unflatten(2, (-1, bq))
        any_seen = tiles.any(dim=5).any(dim=3)
        all_seen = tiles_all.all(dim=5).all(dim=3)
        chunk_states = torch.where(all_seen, FULL, torch.where(any_seen, PARTIAL, EMPTY))
        states.append(chunk_states)
        # The partial tiles' bits, in (b, h, query block, key block) order within the chunk.
        partial = chunk_states == PARTIAL
        chunk_ids = torch.full(partial.shape, -1, dtype=torch.int32, device=device)
        count = int(partial.sum())
        chunk_ids[partial] = torch.arange(n_words, n_words + count, dtype=torch.int32, device=device)
        ids.append(chunk_ids)
        words.append(_pack_bits(tiles.permute(0, 1, 2, 4, 3, 5)[partial]))
        n_words += count
    tile_states = torch.cat(states, dim=2).to(torch.int8)
    bits = None
    if n_words * bq * (bk // 32) < 2**31:
        bits = _mask_bits(torch.cat(ids, dim=2), torch.cat(words), (bq, bk), aux, device)
    return BlockMask.from_states(tile_states, seqlen_q, seqlen_k, (bq, bk), mask_mod, bits)


def _pack_bits(tiles: torch.Tensor) -> torch.Tensor:
    """int32 ``(n, bq, bk / 32)`` of bool ``tiles`` ``(n, bq, bk)``: bit ``j % 32`` of word ``j // 32``."""
    n, bq, bk = tiles.shape
    weights = torch.ones(32, dtype=torch.int64, device=tiles.device) << torch.arange(32, device=tiles.device)
    packed = (tiles.reshape(n, bq, bk // 32, 32).to(torch.int64) * weights).sum(-1)
    # Bit 31 makes a value past int32's range: keep its low 32 bits, as the kernels' shifts read them.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def _mask_bits(ids: torch.Tensor, words: torch.Tensor, block: tuple[int, int], aux, device) -> MaskBits:
    batch, heads, nq, nk = ids.shape
    if words.shape[0] == 0:
        # The kernels may read tile 0 off the partial tiles (and discard it): one tile of zeros.
        words = torch.zeros((1, block[0], block[1] // 32), dtype=torch.int32, device=device)
    meta = torch.tensor(
        [0 if batch == 1 else heads * nq * nk, 0 if heads == 1 else nq * nk, nk, *block],
        dtype=torch.int32,
        device=device,
    )
    versions = () if aux is None else tuple(t._version for t in aux)
    return MaskBits(ids.contiguous(), words.contiguous(), meta, aux, versions)
