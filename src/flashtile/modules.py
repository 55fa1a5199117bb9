"""``FlashAttention``: a self-attention layer (fused QKV projection, flash attention, output projection)."""

from __future__ import annotations

import torch
from torch import nn

from flashtile import validation
from flashtile.block_mask import BlockMask
from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.interface import flash_attn_func


class FlashAttention(nn.Module):
    """Multi-head self-attention on ``(batch_size, seqlen, embed_dim)`` inputs, with optional MQA/GQA.

    One linear layer projects the input to ``num_heads`` query heads and ``num_kv_heads`` key and value heads
    of size ``embed_dim // num_heads``; attention runs through :func:`flashtile.flash_attn_func` on views of
    that projection, and a second linear layer maps the heads back to ``embed_dim``. ``forward`` takes the
    programmable options per call (``block_mask``, ``mask_mod``, ``score_mod``, ``score_mod_bwd``,
    ``aux_tensors``).

    Args:
        embed_dim: model width; a multiple of ``num_heads``, with head size ``embed_dim // num_heads`` ≤ 256.
        num_heads: query heads.
        num_kv_heads: key/value heads, dividing ``num_heads``; None (the default) means ``num_heads``.
        causal: apply the causal mask, default False.
        softmax_scale: the scaling of QKᵀ; None (the default) means ``1 / sqrt(head_dim)``.
        dropout: attention dropout probability in [0, 1), applied in training mode only (``eval()``
            turns it off), default 0.0.
        window_size: ``(left, right)`` sliding window, −1 = unlimited, default (-1, -1).
        softcap: softcapping of the scores, ≤ 0 = off, default 0.0.
        bias: whether the two projections have biases, default True.
        device, dtype: for the parameters.

    Example::

        >>> layer = FlashAttention(512, num_heads=8, num_kv_heads=2, causal=True)
        >>> layer(torch.randn(2, 100, 512)).shape
        torch.Size([2, 100, 512])
        >>> from flashtile import create_block_mask, masks  # two documents of 60 and 40 tokens
        >>> ids = masks.document_ids(torch.tensor([0, 60, 100]))
        >>> bm = create_block_mask(masks.document(), None, None, 100, 100, aux_tensors=(ids,))
        >>> layer(torch.randn(2, 100, 512), block_mask=bm, aux_tensors=(ids,)).shape
        torch.Size([2, 100, 512])
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        causal: bool = False,
        softmax_scale: float | None = None,
        dropout: float = 0.0,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        # Sizes first: a float or 0 would otherwise fail inside nn.Linear or as a division by zero.
        sizes = dict(embed_dim=embed_dim, num_heads=num_heads, num_kv_heads=num_kv_heads)
        for name, size in sizes.items():
            if not validation._is_int(size):
                received = f"{size!r} ({type(size).__name__})"
                raise FlashtileTypeError(f"{name} must be an integer ≥ 1; got {received}")
            if size < 1:
                raise FlashtileValueError(f"{name} must be an integer ≥ 1; got {size!r}")
        embed_dim, num_heads, num_kv_heads = int(embed_dim), int(num_heads), int(num_kv_heads)
        if embed_dim % num_heads != 0:
            raise FlashtileValueError(
                "embed_dim must be a multiple of num_heads ≥ 1; "
                f"got embed_dim={embed_dim}, num_heads={num_heads}"
            )
        if num_heads % num_kv_heads != 0:
            raise FlashtileValueError(
                f"num_kv_heads must divide num_heads; got num_kv_heads={num_kv_heads}, num_heads={num_heads}"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = embed_dim // num_heads
        # The options as flash_attn_func will check them, so that a bad one is named here, not at a later
        # forward (dropout only ever reaches it in training mode).
        # Kept as the Python values the checks return: a NumPy or 0-d tensor option would otherwise reach
        # flash_attn_func at every call, where torch.compile cannot trace it.
        self.causal = validation.check_flag("causal", causal)
        validation.check_softmax_scale(softmax_scale, self.head_dim)
        self.softmax_scale = None if softmax_scale is None else float(softmax_scale)
        self.dropout = validation.check_dropout_p(dropout)
        # (The pair's form is what is checked here; the length only clamps the bounds at each call.)
        validation.normalize_window(window_size, False, seqlen_k=1)
        self.window_size = tuple(int(bound) for bound in window_size)
        self.softcap = validation.check_softcap(softcap)
        qkv_dim = (num_heads + 2 * num_kv_heads) * self.head_dim
        self.Wqkv = nn.Linear(embed_dim, qkv_dim, bias=bias, device=device, dtype=dtype)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)

    def forward(
        self,
        x: torch.Tensor,
        *,
        block_mask: BlockMask | None = None,
        mask_mod: object = None,
        score_mod: object = None,
        score_mod_bwd: object = None,
        aux_tensors: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """``x``: (batch_size, seqlen, embed_dim) → (batch_size, seqlen, embed_dim).

        The keywords are :func:`flashtile.flash_attn_func`'s programmable options, per call (a block mask
        depends on the batch's sequence length and documents; build it once per batch and pass it to every
        layer): ``block_mask`` a :class:`flashtile.BlockMask` covering ``(seqlen, seqlen)`` with batch and
        heads 1, ``batch_size`` or ``num_heads``, on ``x``'s device; ``mask_mod``, ``score_mod`` and
        ``score_mod_bwd`` ``@triton.jit`` functions (``flashtile.masks``); ``aux_tensors`` the tensors they
        read. All default to None; they apply on top of the layer's ``causal`` and ``window_size``.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
            received = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise FlashtileValueError(
                f"x must be a tensor of shape (batch_size, seqlen, embed_dim={self.embed_dim}); "
                f"got {received}"
            )
        batch, seqlen, _ = x.shape
        q_dim = self.num_heads * self.head_dim
        kv_dim = self.num_kv_heads * self.head_dim
        qkv = self.Wqkv(x)
        # Views of the one projection, as flash_attn_qkvpacked_func would take them: nothing is copied.
        q = qkv[..., :q_dim].view(batch, seqlen, self.num_heads, self.head_dim)
        k = qkv[..., q_dim : q_dim + kv_dim].view(batch, seqlen, self.num_kv_heads, self.head_dim)
        v = qkv[..., q_dim + kv_dim :].view(batch, seqlen, self.num_kv_heads, self.head_dim)
        mods = dict(
            block_mask=block_mask,
            mask_mod=mask_mod,
            score_mod=score_mod,
            score_mod_bwd=score_mod_bwd,
            aux_tensors=aux_tensors,
        )
        out = self.attend(q, k, v, mods)
        return self.out_proj(out.reshape(batch, seqlen, self.embed_dim))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mods: dict[str, object]
    ) -> torch.Tensor:
        """The attention between the projections: :func:`flashtile.flash_attn_func` with the layer's options
        and ``mods``, the programmable ones (a subclass may run it another way)."""
        return flash_attn_func(q, k, v, **self.attention_options(), **mods)

    def attention_options(self) -> dict[str, object]:
        """flash_attn_func's options as the layer sets them (dropout only in training mode)."""
        return dict(
            dropout_p=self.dropout if self.training else 0.0,
            softmax_scale=self.softmax_scale,
            causal=self.causal,
            window_size=self.window_size,
            softcap=self.softcap,
        )

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"causal={self.causal}, softmax_scale={self.softmax_scale}, dropout={self.dropout}, "
            f"window_size={self.window_size}, softcap={self.softcap}"
        )
