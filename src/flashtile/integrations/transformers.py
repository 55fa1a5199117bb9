"""flashtile as an attention implementation of Hugging Face transformers (5.x).

>>> from flashtile.integrations.transformers import register
>>> name = register()  # "tile_attention"
>>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)  # doctest: +SKIP
>>> model.set_attn_implementation(name)  # doctest: +SKIP

:func:`register` adds :func:`attention_forward` to ``transformers.AttentionInterface`` and
:func:`padding_mask` to ``transformers.masking_utils.AttentionMaskInterface`` under one name. The name
must not contain "flash": transformers routes every such name to its own flash-attention loader, which
looks for a kernel on the Hub. The mask function hands the attention a 2-D padding mask (or None), as
transformers does for its flash-attention paths, and the attention mirrors transformers'
``_flash_attention_forward``: padded batches are unpadded into :func:`flashtile.flash_attn_varlen_func`,
packed batches (``position_ids`` restarting inside one row, or ``cu_seq_lens_q/k`` passed by
``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``) run as varlen sequences, and everything
else runs :func:`flashtile.flash_attn_func`. Sliding windows, softcap, dropout (in training), attention
sinks (GPT-OSS's ``s_aux``, passed as ``learnable_sink`` and trained through it), value head dims that differ
from the query's, and KV-cache generation (causal masks are bottom-right aligned, so a query attends to the
whole cache) are supported. Chunked attention (Llama 4), custom 4-D masks and paged caches raise
NotImplementedError when the first layer runs.
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import torch

from flashtile import bert_padding
from flashtile.interface import flash_attn_func, flash_attn_varlen_func

DEFAULT_NAME = "tile_attention"
MIN_TRANSFORMERS = "5.0"


def _import_transformers() -> Any:
    try:
        transformers = importlib.import_module("transformers")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(
            "flashtile.integrations.transformers needs Hugging Face transformers>=5: "
            "pip install 'flashtile[transformers]'"
        ) from error
    # packaging comes with transformers, so it is imported only once transformers is known to be there.
    from packaging.version import Version

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        raise ImportError(
            f"flashtile.integrations.transformers needs transformers>={MIN_TRANSFORMERS}; "
            f"found {transformers.__version__}"
        )
    return transformers


def register(name: str = DEFAULT_NAME) -> str:
    """Register flashtile with transformers under ``name`` and return it.

    Afterwards ``AutoModel.from_pretrained(..., attn_implementation=name)`` and
    ``model.set_attn_implementation(name)`` select flashtile. Calling it again is harmless.

    Args:
        name: the implementation name, default ``"tile_attention"``. It must not contain "flash"
            (transformers sends those names to its own flash-attention loader) nor name one of
            transformers' built-in implementations.

    Raises:
        ValueError: for a name that transformers would not route to flashtile.
        ModuleNotFoundError / ImportError: transformers is missing or older than 5.0.
    """
    transformers = _import_transformers()
    masking_utils = importlib.import_module("transformers.masking_utils")
    if not isinstance(name, str) or not name or "flash" in name:
        raise ValueError(
            f"name must be a non-empty string without 'flash' (transformers routes those names to its own "
            f"flash-attention loader); got {name!r}, accepted e.g. {DEFAULT_NAME!r}"
        )
    built_in = {"eager", "sdpa", "flex_attention", "paged_attention"}
    if name in built_in or name.startswith("paged|"):
        raise ValueError(
            f"name must not be one of transformers' implementations {sorted(built_in)} or start with "
            f"'paged|'; got {name!r}, accepted e.g. {DEFAULT_NAME!r}"
        )
    transformers.AttentionInterface.register(name, attention_forward)
    masking_utils.AttentionMaskInterface.register(name, padding_mask)
    return name


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Any = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | None:
    """The mask transformers builds for flashtile: a 2-D ``(batch, kv)`` bool padding mask, or None.

    As transformers' ``flash_attention_mask`` (causality and windows are the attention's options), plus
    one case: under a causal mask, a static cache longer than the tokens written so far gets an all-ones
    mask of the filled length, since transformers drops an all-ones mask before generating with an
    implementation whose name lacks "flash" (its flash paths keep it to tell the filled slots apart).
    """
    if attention_mask is not None:
        attention_mask = attention_mask[:, -kv_length:]
        if attention_mask.shape[1] == kv_length and bool(attention_mask.all()):
            attention_mask = None
    filled = int(q_offset) + q_length
    # Bidirectional masks (encoders, cross-attention) see keys of another length, not a cache being filled.
    causal = "allow_is_bidirectional_skip" not in kwargs
    # Shorter than kv_length, so the attention reads only the filled slots, as for a padded static cache.
    if causal and attention_mask is None and kv_offset == 0 and kv_length > filled:
        attention_mask = torch.ones(batch_size, filled, dtype=torch.bool, device=kwargs.get("device", "cpu"))
    return attention_mask


def _unsupported(module: torch.nn.Module, what: str) -> NotImplementedError:
    model = getattr(getattr(module, "config", None), "model_type", type(module).__name__)
    return NotImplementedError(
        f"flashtile's transformers integration does not support {what} (model type {model!r}, "
        f"layer {type(module).__name__}) yet; load this model with attn_implementation='sdpa' or 'eager'"
    )


def _check_supported(
    module: torch.nn.Module, attention_mask: torch.Tensor | None, key_length: int, kwargs: dict
) -> None:
    chunk = getattr(getattr(module, "config", None), "attention_chunk_size", None)
    if chunk is not None and key_length > chunk:
        raise _unsupported(module, f"chunked attention (attention_chunk_size={chunk} < {key_length} keys)")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise _unsupported(
            module, f"a {attention_mask.dim()}-D attention mask (only 2-D padding masks or None)"
        )
    if kwargs.get("cache") is not None or kwargs.get("block_table") is not None:
        raise _unsupported(module, "paged KV caches (continuous batching)")


# (position_ids, its version, the boundaries found) of the last call: transformers hands every layer of a
# forward the same tensor, whose boundaries (a host synchronisation) are then found once, not per layer.
_last_packed: tuple[weakref.ref, int, tuple[torch.Tensor, int] | None] | None = None


def _packed_boundaries(position_ids: torch.Tensor | None, batch_size: int) -> tuple[torch.Tensor, int] | None:
    """``(cu_seqlens, max_seqlen)`` when one row packs several sequences, each restarting its positions."""
    global _last_packed
    if position_ids is None or batch_size != 1 or position_ids.shape[-1] == 1:
        return None
    if _last_packed is not None:
        tensor, version, found = _last_packed
        if tensor() is position_ids and version == position_ids._version:
            return found
    found = _find_packed_boundaries(position_ids)
    _last_packed = weakref.ref(position_ids), position_ids._version, found
    return found


def _find_packed_boundaries(position_ids: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """:func:`_packed_boundaries` without the cache: one copy of the positions to the host, one upload."""
    positions = position_ids.reshape(-1).cpu()
    if not bool((positions.diff() != 1).any()):
        return None
    starts = torch.nonzero(positions == positions.min()).flatten()
    cu_seqlens = torch.cat([starts, torch.tensor([positions.numel()])]).to(torch.int32)
    max_seqlen = int(cu_seqlens.diff().max())
    return cu_seqlens.to(position_ids.device), max_seqlen


def _varlen_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: Any,
    cu_k: Any,
    max_q: Any,
    max_k: Any,
    options: dict,
) -> torch.Tensor:
    """Attention over rows that each pack sequences back to back; returns ``q``'s shape."""
    out = flash_attn_varlen_func(
        q.reshape(-1, *q.shape[2:]),
        k.reshape(-1, *k.shape[2:]),
        v.reshape(-1, *v.shape[2:]),
        cu_q.to(torch.int32),
        cu_k.to(torch.int32),
        int(max_q),
        int(max_k),
        **options,
    )
    return out.view(q.shape)


def _varlen_padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attention_mask: torch.Tensor, options: dict
) -> torch.Tensor:
    """Attention over a padded batch: the padding is removed, attended as varlen and put back as zeros."""
    batch, seqlen_q = q.shape[:2]
    # A static cache is longer than the mask; its slots beyond the mask were never written.
    k, v = k[:, : attention_mask.shape[1]], v[:, : attention_mask.shape[1]]
    k_real, indices_k, cu_k, max_k, _ = bert_padding.unpad_input(k, attention_mask)
    v_real = bert_padding.index_first_axis(v.flatten(0, 1), indices_k)
    if options["causal"] or seqlen_q == attention_mask.shape[1]:
        # The queries are the last seqlen_q positions of the mask (generation pads on the left).
        q_mask = attention_mask[:, -seqlen_q:]
    else:
        # Cross-attention: the mask pads the other sequence's keys; every query is real.
        q_mask = torch.ones(batch, seqlen_q, dtype=torch.bool, device=q.device)
    q_real, indices_q, cu_q, max_q, _ = bert_padding.unpad_input(q, q_mask)
    out = flash_attn_varlen_func(q_real, k_real, v_real, cu_q, cu_k, max_q, max_k, **options)
    return bert_padding.pad_input(out, indices_q, batch, seqlen_q)


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """One attention layer for transformers, through flashtile.

    Args:
        module: the attention layer (its ``is_causal`` applies unless ``is_causal`` is given).
        query: ``(batch, nheads, seqlen_q, headdim)``; key: ``(batch, nheads_kv, seqlen_k, headdim)``;
            value: ``(batch, nheads_kv, seqlen_k, headdim_v)`` (V's head dim may differ).
        attention_mask: ``(batch, seqlen_k)`` bool padding mask from :func:`padding_mask`, or None.
        dropout, scaling, sliding_window, softcap: the layer's options; ``sliding_window = w`` lets a
            query see ``w`` keys including itself (``window_size = (w − 1, w − 1)``, as transformers).
        s_aux: GPT-OSS's attention sinks ``(nheads,)``, one logit per head joining the softmax
            denominator (flashtile's ``learnable_sink``), or None; gradients reach the parameter.
        kwargs: ``position_ids``, ``cu_seq_lens_q/k`` and ``max_length_q/k`` select packed sequences.

    Returns:
        ``(out, None)`` with ``out`` ``(batch, seqlen_q, nheads, headdim_v)`` in query's dtype.
    """
    _check_supported(module, attention_mask, key.shape[2], kwargs)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    # Under autocast, upcasting layers (RoPE) hand fp32 here; run in the autocast dtype, as transformers does.
    if q.dtype == torch.float32 and torch.is_autocast_enabled(q.device.type):
        dtype = torch.get_autocast_dtype(q.device.type)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    window = -1 if sliding_window is None else sliding_window - 1
    options = {
        "dropout_p": dropout,
        "softmax_scale": scaling,
        "causal": bool(module.is_causal if is_causal is None else is_causal),
        "window_size": (window, window),
        "softcap": 0.0 if softcap is None else softcap,
        "learnable_sink": s_aux,
    }
    varlen = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")]
    if attention_mask is not None:
        out = _varlen_padded(q, k, v, attention_mask, options)
    elif all(x is not None for x in varlen):
        out = _varlen_packed(q, k, v, *varlen, options)
    elif (packed := _packed_boundaries(kwargs.get("position_ids"), q.shape[0])) is not None:
        cu_seqlens, max_seqlen = packed
        out = _varlen_packed(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, options)
    else:
        out = flash_attn_func(q, k, v, **options)
    return out, None
