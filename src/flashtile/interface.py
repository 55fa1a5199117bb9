"""flash_attn's public functions: flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func and
their variable-length forms flash_attn_varlen_func, flash_attn_varlen_qkvpacked_func,
flash_attn_varlen_kvpacked_func.

Signatures, defaults and return conventions are flash_attn 2.8's; where flashtile still differs is listed in
``DIVERGENCES`` (part of each function's docstring). Each function validates its arguments
(:mod:`flashtile.validation`), picks the backend (:mod:`flashtile.backend`) and runs attention through
:mod:`flashtile.autograd` (the custom ops ``torch.ops.flashtile.attn_fwd``/``attn_bwd`` under
torch.compile); nothing launches before every check has passed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch

from flashtile import autograd as _autograd
from flashtile import backend as _backend
from flashtile import kvcache_validation, paged, plain_calls, validation
from flashtile import ops as _ops
from flashtile.reference.naive import attention_probs, attention_probs_varlen
from flashtile.validation_mods import check_mods

AttentionResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# The arguments after the tensors, the same in every function.
OPTIONS = """\
dropout_p: float, default 0.0. Dropout probability on the attention probabilities, in [0, 1); set it
    to 0.0 during evaluation. The mask comes from a counter-based RNG (Philox) seeded by one draw from
    PyTorch's generator for q's device per call, so torch.manual_seed reproduces a run, and the backward
    regenerates the mask instead of storing it. Draws are 8-bit, so floor(p·256)/256 of the entries are
    dropped, as in flash_attn; kept ones are scaled by 1 / (1 − p).
softmax_scale: float or None, default None. The scaling of QKᵀ before the softmax; None means
    1 / sqrt(headdim). Must be finite; 0 and negative values are allowed.
causal: bool, default False. Apply the bottom-right aligned causal mask (auto-regressive modelling).
window_size: (left, right), default (-1, -1). Sliding-window attention: query i sees the keys in
    [i + seqlen_k − seqlen_q − left, i + seqlen_k − seqlen_q + right] (lengths per sequence under
    varlen). Any pair of integers (tuple, list, NumPy integers or array, integer tensors); a negative
    bound or one ≥ seqlen_k (max_seqlen_k under varlen) is unlimited, and causal=True sets right = 0,
    as in flash_attn, so (-1, 0) is causal attention. Tiles wholly outside the window are skipped.
softcap: float, default 0.0. Softcapping: the scaled score s becomes ``softcap · tanh(s / softcap)``
    (before ALiBi and masking); ≤ 0 disables it. Non-finite values raise ValueError.
alibi_slopes: float32 tensor (nheads,) or (batch_size, nheads) on q's device, or None (default). Adds
    ``−slope · |i + seqlen_k − seqlen_q − j|`` to the score of query i and key j. Not differentiated.
deterministic: bool, default False. With True the gradients are bitwise reproducible run after run. The
    portable Triton and reference backwards are so either way (no atomics); the Hopper backward adds dQ
    with reduce-adds from its programs unless deterministic=True, which makes dQ in a kernel of its own.
return_attn_probs: bool, default False. Also return softmax_lse and S_dmask. S_dmask holds the
    probabilities only under dropout (dropout_p > 0): the softmax before dropout, negated where
    dropout dropped the entry, batch · nheads · seqlen_q · seqlen_k elements of q's dtype (32 GiB per
    sequence in bf16 at seqlen 32k with 16 heads; for testing), computed by the PyTorch reference from
    q and k with the forward's dropout mask. With dropout_p = 0 it is an empty tensor and costs
    nothing, so the flag is the way to get softmax_lse.
learnable_sink: tensor (nheads,) on q's device, or None (default). Beyond flash_attn 2.8 (named as in
    FlashAttention-4): GPT-OSS's attention sinks, one logit per query head that joins each row's
    softmax denominator and takes no value: lse_i = log(Σ_j exp(s_ij) + exp(sink_h)), with the sink in
    the domain of the scaled score (not multiplied by softmax_scale, not softcapped, no ALiBi). Any
    floating dtype (computed in float32); differentiable. A row that sees no key gives out = 0 and
    softmax_lse = sink. Dropout acts on the probabilities after the sink joined (transformers' GPT-OSS).
causal, deterministic and return_attn_probs take Python or NumPy bools and 0-d bool tensors."""

# The programmable options, after flash_attn's (flash_attn_func and flash_attn_varlen_func).
MODS = """\
block_mask: flashtile.BlockMask or None (default). Block-sparse attention: tiles the mask marks empty
    are skipped (they cost nothing), full ones are seen whole, partial ones through mask_mod. Build it
    once with flashtile.create_block_mask(mask_mod, B, H, seqlen_q, seqlen_k, block_size) or
    flashtile.BlockMask.from_tiles and reuse it across layers; it must cover (seqlen_q, seqlen_k)
    ((max_seqlen_q, max_seqlen_k) or more under varlen, positions within each sequence) with B and H 1
    or the batch size and nheads, on q's device.
mask_mod: a @triton.jit function mask_mod(b, h, q_idx, kv_idx[, aux]) -> bool (flashtile.masks has
    causal, sliding_window, document, prefix_lm, strided, block_diagonal), or None. Applied in the
    partial tiles of block_mask (default: block_mask.mask_mod); without block_mask every tile is partial.
    Indices are positions within the sequence, top-left aligned. One Triton compile per function.
score_mod: a @triton.jit function score_mod(score, b, h, q_idx, kv_idx[, aux]) -> score applied to the
    scaled score (natural log units, after softcap and ALiBi, before masking), or None.
score_mod_bwd: d score_mod / d score, same arguments; required with score_mod when a gradient is needed.
aux_tensors: tuple of tensors on q's device (int32/int64/float16/bfloat16/float32/float64) that the
    functions read (``tl.load(aux[0] + q_idx)``), or None. They get no gradient.
Under torch.compile a call with any of these runs eagerly behind a graph break (fullgraph=True refuses it)."""

# Every way flashtile still differs from flash_attn 2.8.
DIVERGENCES = """\
Where flashtile differs from flash_attn 2.8:

- A fully masked row (every row when seqlen_k = 0) has softmax_lse = −inf; flash_attn gives +inf.
  out is 0 in both.
- Dropout draws its own Philox stream: the same seed does not give flash_attn's mask.
- S_dmask is (batch_size, nheads, seqlen_q, seqlen_k) (max_seqlen_q, max_seqlen_k under varlen),
  unpadded; flash_attn pads both lengths to multiples of 128. It is recomputed by the reference from q
  and k, so its values may differ from the kernel's probabilities by rounding.
- block_table takes any page size that is a multiple of 16 (flash_attn: 256) and its keys are
  gathered into a packed copy before the kernel runs.
- Beyond flash_attn: softcap combines with dropout and ALiBi; CPU tensors run on the PyTorch reference,
  which also takes float32 and float64 (with float64 inputs softmax_lse is float64); Triton's CPU
  interpreter also takes float32. flash_attn runs on CUDA in float16/bfloat16 only.
- softmax_lse is marked non-differentiable (requires_grad=False); flash_attn returns it requiring grad
  and silently drops any gradient sent to it.
- Stricter checks, before any launch: non-finite softmax_scale or softcap, dropout_p < 0, flags that
  are not bools (e.g. the int 1) and, under varlen, cu_seqlens values (start at 0, non-decreasing, last
  = token count, no sequence longer than max_seqlen; checked on CPU tensors, on CUDA tensors only with
  FLASHTILE_DEBUG=1, as the check costs a host synchronisation) raise; flash_attn passes them on.
  Errors are ValueError or TypeError that are also RuntimeError (flash_attn raises RuntimeError)."""


def _document(fn: Callable[..., AttentionResult]) -> Callable[..., AttentionResult]:
    """Fill the ``{options}`` and ``{divergences}`` markers of ``fn``'s docstring."""
    markers = (
        ("{options}", OPTIONS, " " * 8),
        ("{mods}", MODS, " " * 8),
        ("{divergences}", DIVERGENCES, " " * 4),
    )
    for marker, text, indent in markers:
        filled = text.replace("\n", "\n" + indent).replace("\n" + indent + "\n", "\n\n")
        fn.__doc__ = fn.__doc__.replace(marker, filled)
    return fn


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a contiguous copy when its last dimension is strided (the kernels load rows of D)."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


class _Varlen(NamedTuple):
    """A packed batch's boundaries as the user passed them, with the names of the arguments."""

    cu_seqlens_q: object
    cu_seqlens_k: object
    max_seqlen_q: object
    max_seqlen_k: object
    names: tuple[str, str, str, str] = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")


def _gather_pages(
    k: torch.Tensor, v: torch.Tensor, block_table: object, cu_seqlens_k: object, max_seqlen_k: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v themselves, or with a block_table the keys of every sequence gathered from the pages into
    packed varlen K/V (one copy: :mod:`flashtile.paged`)."""
    if block_table is None:
        return k, v
    rows = kvcache_validation.check_paged_varlen(k, v, block_table, cu_seqlens_k, max_seqlen_k)
    return paged.gather_varlen(k, v, block_table.contiguous(), cu_seqlens_k, rows)


def _keep_mask(
    rng_state: torch.Tensor, dropout_p: float, shape: tuple[int, ...], backend: str
) -> torch.Tensor:
    run = _ops.dropout_keep_mask if torch.compiler.is_compiling() else _ops.run_dropout_keep_mask
    return run(rng_state, dropout_p, *shape, backend)


def _s_dmask(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    options: validation.Options,
    rng_state: torch.Tensor | None,
    backend: str,
    varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None,
    learnable_sink: torch.Tensor | None,
) -> torch.Tensor:
    """flash_attn's S_dmask: empty without dropout; under dropout the probabilities, negated where dropped.

    ``(B, H, N_q, N_k)``, or ``(B, H, max_seqlen_q, max_seqlen_k)`` for varlen with sequence ``b`` in
    ``[b, :, :N_q, :N_k]`` and zeros beyond, computed by the reference from q and k with the keep mask
    the kernels drew (the same bits on both backends).
    """
    if options.dropout_p == 0.0:
        return q.new_empty((0,))
    probs = functools.partial(
        attention_probs,
        softmax_scale=scale,
        causal=options.causal,
        window_size=options.window_size,
        softcap=options.softcap,
        dropout_p=options.dropout_p,
        learnable_sink=learnable_sink,
    )
    with torch.no_grad():
        if varlen is None:
            shape = (q.shape[0], q.shape[2], q.shape[1], k.shape[1])
            keep = _keep_mask(rng_state, options.dropout_p, shape, backend)
            return probs(q, k, v, alibi_slopes=options.alibi_slopes, dropout_mask=keep)
        shape = (varlen[0].shape[0] - 1, q.shape[1], varlen[2], varlen[3])
        keep = _keep_mask(rng_state, options.dropout_p, shape, backend)
        return attention_probs_varlen(
            q, k, *varlen, softmax_scale=scale, causal=options.causal, window_size=options.window_size,
            softcap=options.softcap, alibi_slopes=options.alibi_slopes, dropout_mask=keep,
            learnable_sink=learnable_sink,
        )  # fmt: skip


def _attention(
    tensors: dict[str, torch.Tensor],
    dropout_p: float,
    softmax_scale: float | None,
    causal: bool,
    window_size: tuple[int, int],
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    return_attn_probs: bool,
    varlen: _Varlen | None = None,
    mods: dict[str, object] | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """Validate, resolve the backend and run attention; shared by the public functions.

    ``tensors`` are the user's tensor arguments by name (``q, k, v``, ``qkv`` or ``q, kv``), so that errors
    name what the user passed; ``varlen`` holds a packed batch's boundaries.
    """
    if mods and torch.compiler.is_compiling() and any(value is not None for value in mods.values()):
        return _attention_outside_the_graph(
            tensors, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, varlen, mods, learnable_sink,
        )  # fmt: skip
    call_key = plain_calls.key(
        tensors, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
        return_attn_probs, varlen, mods, learnable_sink,
    )  # fmt: skip
    seen = None if call_key is None else plain_calls.verdict(call_key)
    if seen is not None:
        # A plain call whose metadata passed validation before: the same verdict.
        scale, options, backend, checked_mods, plan = seen
        q, k, v = tensors["q"], tensors["k"], tensors["v"]
        # The slopes' metadata is in the key (validation would hand them on as they are); dropout draws its
        # random state at every call.
        rng_state = _ops.draw_rng_state(q.device) if options.dropout_p > 0 else None
        sink = None
        if learnable_sink is not None:
            sink = validation.sink_in_lse_dtype(learnable_sink, _ops.lse_dtype(q.dtype))
        return _autograd.attention(
            q, k, v, scale, options.causal, backend, window_size=options.window_size, softcap=options.softcap,
            alibi_slopes=alibi_slopes, dropout_p=options.dropout_p, rng_state=rng_state,
            deterministic=options.deterministic, mods=checked_mods, learnable_sink=sink, plan=plan,
        )[0]  # fmt: skip
    q, k, v = validation.unpack_qkv(varlen is not None, **tensors)
    validation.check_same_device(**tensors)
    backend = _backend.resolve(q.device)
    validation.check_dtypes(backend, **tensors)
    if varlen is None:
        batch, seqlen_k = q.shape[0], k.shape[1]
        boundaries = None
    else:
        max_q, max_k = validation.check_cu_seqlens(
            varlen.cu_seqlens_q, varlen.cu_seqlens_k, varlen.max_seqlen_q, varlen.max_seqlen_k,
            q.shape[0], k.shape[0], q.device, varlen.names,
        )  # fmt: skip
        batch, seqlen_k = varlen.cu_seqlens_q.shape[0] - 1, max_k
        boundaries = (varlen.cu_seqlens_q, varlen.cu_seqlens_k, max_q, max_k)
    seqlen_q = q.shape[1] if varlen is None else max_q
    sink = validation.check_learnable_sink(learnable_sink, q.shape[-2], q.device, _ops.lse_dtype(q.dtype))
    # The sink's gradient runs the backward too: score_mod then needs score_mod_bwd.
    leaves = (q, k, v) if sink is None else (q, k, v, sink)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in leaves)
    checked_mods = check_mods(
        **(mods or {}), batch=batch, nheads=q.shape[-2], seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        varlen=varlen is not None, device=q.device, needs_grad=needs_grad,
    )  # fmt: skip
    options = validation.check_options(
        dropout_p, window_size, softcap, alibi_slopes, causal, deterministic, return_attn_probs,
        seqlen_k, batch, q.shape[-2], q.device,
    )  # fmt: skip
    scale = validation.check_softmax_scale(softmax_scale, q.shape[-1])
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    plan = None
    if call_key is not None:
        plan = _backend.prepare(
            backend, q, k, v, scale, options.causal, options.window_size, options.softcap,
            options.deterministic, options.alibi_slopes, options.dropout_p, sink,
        )  # fmt: skip
        plain_calls.remember(call_key, (scale, options, backend, checked_mods, plan))
    rng_state = _ops.draw_rng_state(q.device) if options.dropout_p > 0 else None
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k = boundaries or (None, None, 0, 0)
    out, lse = _autograd.attention(
        q, k, v, scale, options.causal, backend,
        window_size=options.window_size, softcap=options.softcap, alibi_slopes=options.alibi_slopes,
        dropout_p=options.dropout_p, rng_state=rng_state, cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        deterministic=options.deterministic, mods=checked_mods, learnable_sink=sink, plan=plan,
    )  # fmt: skip
    if not options.return_attn_probs:
        return out
    return out, lse, _s_dmask(q, k, v, scale, options, rng_state, backend, boundaries, sink)


@torch.compiler.disable
def _attention_outside_the_graph(*args: object) -> AttentionResult:
    """``_attention`` run eagerly behind a graph break: a block mask's lists and the mods' jit functions
    cannot enter the custom ops a compiled graph calls (tensors and scalars only). fullgraph=True refuses
    the break."""
    return _attention(*args)


@_document
def flash_attn_func(
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
    *,
    block_mask: object = None,
    mask_mod: object = None,
    score_mod: object = None,
    score_mod_bwd: object = None,
    aux_tensors: tuple[torch.Tensor, ...] | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """Exact attention ``softmax(q kᵀ · softmax_scale) v``, computed tile by tile without materialising it.

    Supports multi-query and grouped-query attention (MQA/GQA) by passing k and v with fewer heads than q;
    the number of heads of q must be a multiple of that of k and v. Query head ``h`` reads key/value head
    ``h // (nheads // nheads_k)``: with 6 query heads and 2 key/value heads, heads 0, 1, 2 of q attend to
    head 0 of k and v, and heads 3, 4, 5 to head 1.

    If causal=True, the causal mask is aligned to the bottom right corner of the attention matrix: query ``i``
    sees key ``j`` iff ``j ≤ i + seqlen_k − seqlen_q``. With seqlen_q = 2 and seqlen_k = 5 the mask
    (1 = keep, 0 = masked out) is::

        1 1 1 1 0
        1 1 1 1 1

    With seqlen_q = 5 and seqlen_k = 2 it is::

        0 0
        0 0
        0 0
        1 0
        1 1

    A fully masked row (and every row when seqlen_k = 0) gives out = 0 and softmax_lse = −inf, and no gradient
    flows through it.

    Which implementation runs is chosen by ``FLASHTILE_BACKEND`` (see :mod:`flashtile.backend`): the Triton
    kernels on CUDA, the tiled PyTorch reference on the CPU. Autocast does not cast q, k and v: as in
    flash_attn, attention runs in the dtype it receives (under autocast, the dtype the projections produced).

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim).
        k: (batch_size, seqlen_k, nheads_k, headdim).
        v: (batch_size, seqlen_k, nheads_k, headdim_v).
            q, k and v share one device and one dtype: float16 or bfloat16 for the Triton kernels on CUDA
            (float32 too under Triton's CPU interpreter); float16, bfloat16, float32 or float64 for the
            reference. headdim is 1 to 576 and headdim_v 1 to 512 (V's head dim may differ from Q's and
            K's, e.g. 192/128 or 576/512), and nheads % nheads_k == 0. Any strides are accepted; a tensor
            whose last dimension is not contiguous (stride(-1) ≠ 1) is copied first.
        {options}
        {mods}

    Returns:
        out: (batch_size, seqlen_q, nheads, headdim_v), q's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (batch_size, nheads, seqlen_q), float32 (float64 for
            float64 inputs). The natural-log logsumexp of each row of QKᵀ · softmax_scale after masking
            (the sink included); −inf for fully masked rows (the sink with one). Not differentiable.
        S_dmask [only if return_attn_probs=True]: with dropout_p > 0, (batch_size, nheads, seqlen_q,
            seqlen_k) in q's dtype: the softmax probabilities, negated where dropout dropped the entry;
            without dropout an empty tensor (0 elements), as flash_attn returns.

    {divergences}

    Example::

        >>> q = torch.randn(2, 128, 8, 64, dtype=torch.float16, device="cuda", requires_grad=True)
        >>> k = torch.randn(2, 256, 2, 64, dtype=torch.float16, device="cuda", requires_grad=True)
        >>> v = torch.randn_like(k, requires_grad=True)
        >>> out = flash_attn_func(q, k, v, causal=True)  # GQA: 8 query heads share 2 key/value heads
        >>> out.shape
        torch.Size([2, 128, 8, 64])
        >>> out.sum().backward()
        >>> from flashtile import create_block_mask, masks  # a document mask, built once per batch
        >>> ids = masks.document_ids(torch.tensor([0, 100, 256], device="cuda"))
        >>> bm = create_block_mask(masks.document(), None, None, 256, 256, device="cuda", aux_tensors=(ids,))
        >>> q = torch.randn(1, 256, 8, 64, dtype=torch.float16, device="cuda")
        >>> flash_attn_func(q, q, q, block_mask=bm, aux_tensors=(ids,)).shape
        torch.Size([1, 256, 8, 64])
    """
    return _attention(
        {"q": q, "k": k, "v": v},
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        mods=dict(
            block_mask=block_mask,
            mask_mod=mask_mod,
            score_mod=score_mod,
            score_mod_bwd=score_mod_bwd,
            aux_tensors=aux_tensors,
        ),
        learnable_sink=learnable_sink,
    )


@_document
def flash_attn_qkvpacked_func(
    qkv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """:func:`flash_attn_func` on q, k and v stacked in one tensor, as a fused QKV projection produces them.

    q, k and v are read as views of ``qkv`` (``qkv[:, :, 0]``, ``[:, :, 1]``, ``[:, :, 2]``), never copied,
    and the gradient comes back as one tensor shaped like ``qkv``. For MQA/GQA use
    :func:`flash_attn_kvpacked_func` or :func:`flash_attn_func`. Here seqlen_q = seqlen_k = seqlen, so
    causal is the usual lower-triangular mask. Fully masked rows and the backends are as in
    :func:`flash_attn_func`.

    Arguments:
        qkv: (batch_size, seqlen, 3, nheads, headdim). float16 or bfloat16 for the Triton kernels on CUDA
            (float32 too under Triton's CPU interpreter); float16, bfloat16, float32 or float64 for the
            reference. headdim is 1 to 512. Any strides; a non-contiguous last dimension is copied first.
        {options}

    Returns:
        out: (batch_size, seqlen, nheads, headdim), qkv's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (batch_size, nheads, seqlen), float32 (float64 for
            float64 inputs), natural log; −inf for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: with dropout_p > 0, (batch_size, nheads, seqlen_q,
            seqlen_k) in q's dtype: the softmax probabilities, negated where dropout dropped the entry;
            without dropout an empty tensor (0 elements), as flash_attn returns.

    {divergences}

    Example::

        >>> x = torch.randn(2, 128, 512, dtype=torch.bfloat16, device="cuda")
        >>> wqkv = torch.nn.Linear(512, 3 * 512, dtype=torch.bfloat16, device="cuda")
        >>> qkv = wqkv(x).view(2, 128, 3, 8, 64)
        >>> out = flash_attn_qkvpacked_func(qkv, causal=True)
        >>> out.shape
        torch.Size([2, 128, 8, 64])
    """
    return _attention(
        {"qkv": qkv},
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        learnable_sink=learnable_sink,
    )


@_document
def flash_attn_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """:func:`flash_attn_func` with k and v stacked in one tensor, as a fused KV projection produces them.

    k and v are read as views of ``kv`` (``kv[:, :, 0]`` and ``kv[:, :, 1]``), never copied, and their
    gradient comes back as one tensor shaped like ``kv``. Supports MQA/GQA: q may have more heads than kv
    (``nheads % nheads_k == 0``; query head ``h`` reads key/value head ``h // (nheads // nheads_k)``).

    If causal=True, the mask is aligned to the bottom right corner: query ``i`` sees key ``j`` iff
    ``j ≤ i + seqlen_k − seqlen_q``. With seqlen_q = 2 and seqlen_k = 5 (1 = keep, 0 = masked out)::

        1 1 1 1 0
        1 1 1 1 1

    With seqlen_q = 5 and seqlen_k = 2::

        0 0
        0 0
        0 0
        1 0
        1 1

    A fully masked row gives out = 0 and softmax_lse = −inf, and no gradient flows through it.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim).
        kv: (batch_size, seqlen_k, 2, nheads_k, headdim).
            q and kv share one device and one dtype: float16 or bfloat16 for the Triton kernels on CUDA
            (float32 too under Triton's CPU interpreter); float16, bfloat16, float32 or float64 for the
            reference. headdim is 1 to 512. Any strides; a non-contiguous last dimension is copied first.
        {options}

    Returns:
        out: (batch_size, seqlen_q, nheads, headdim), q's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (batch_size, nheads, seqlen_q), float32 (float64 for
            float64 inputs), natural log; −inf for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: with dropout_p > 0, (batch_size, nheads, seqlen_q,
            seqlen_k) in q's dtype: the softmax probabilities, negated where dropout dropped the entry;
            without dropout an empty tensor (0 elements), as flash_attn returns.

    {divergences}

    Example::

        >>> q = torch.randn(1, 16, 8, 64, dtype=torch.float16, device="cuda")  # 16 new tokens
        >>> kv = torch.randn(1, 1024, 2, 1, 64, dtype=torch.float16, device="cuda")  # MQA: one KV head
        >>> out = flash_attn_kvpacked_func(q, kv, causal=True)  # the 16 queries are the last 16 positions
        >>> out.shape
        torch.Size([1, 16, 8, 64])
    """
    return _attention(
        {"q": q, "kv": kv},
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        learnable_sink=learnable_sink,
    )


@_document
def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    block_mask: object = None,
    mask_mod: object = None,
    score_mod: object = None,
    score_mod_bwd: object = None,
    aux_tensors: tuple[torch.Tensor, ...] | None = None,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """:func:`flash_attn_func` on a packed batch of sequences of different lengths, with no padding.

    Sequence ``b`` is the queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` attending to the keys and
    values ``k, v[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]``, exactly as a batch of one with its own seqlen_q
    and seqlen_k (either may be 0, and they may differ): causal masks and windows are bottom-right aligned
    per sequence, ``(batch_size, nheads)`` ALiBi slopes give row ``b`` to sequence ``b``. The whole batch
    runs in one kernel launch, and ``cu_seqlens`` are never read on the host (max_seqlen_q/k size the
    launch), except for the value checks on CPU tensors and under ``FLASHTILE_DEBUG=1``. MQA/GQA as in
    :func:`flash_attn_func`. :mod:`flashtile.bert_padding` converts padded batches to this layout and back.

    Arguments:
        q: (total_q, nheads, headdim), the query tokens of every sequence, one after the other.
        k: (total_k, nheads_k, headdim).
        v: (total_k, nheads_k, headdim_v).
            dtypes, devices, head dims and strides as in :func:`flash_attn_func`.
        cu_seqlens_q: (batch_size + 1,) torch.int32, contiguous, on q's device: cumulative query lengths,
            starting at 0, non-decreasing, ending at total_q.
        cu_seqlens_k: (batch_size + 1,) torch.int32, the same for the keys, ending at total_k.
        max_seqlen_q: int ≥ 0, at least the longest query sequence.
        max_seqlen_k: int ≥ 0, at least the longest key sequence.
        {options}
        block_table: (batch_size, pages_per_sequence) torch.int32, or None. With it k and v are a paged
            cache (num_pages, page_size, nheads_k, headdim), page_size a multiple of 16: key t of
            sequence b is row t % page_size of page block_table[b, t // page_size]. The keys are
            gathered into packed K/V first (one copy of them, differentiable), then attended as above;
            on CUDA without FLASHTILE_DEBUG=1 the copy has batch_size · max_seqlen_k rows (the
            total is not read on the host).
        {mods}

    Returns:
        out: (total_q, nheads, headdim_v), q's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (nheads, total_q), float32 (float64 for float64
            inputs), natural log; −inf for fully masked rows and empty key sequences (the sink with one).
            Not differentiable.
        S_dmask [only if return_attn_probs=True]: with dropout_p > 0, (batch_size, nheads, max_seqlen_q,
            max_seqlen_k) in q's dtype, sequence b in ``[b, :, :seqlen_q, :seqlen_k]`` (zeros beyond):
            the softmax probabilities, negated where dropped; without dropout an empty tensor.

    {divergences}

    Example::

        >>> from flashtile.bert_padding import unpad_input, pad_input
        >>> x = torch.randn(2, 6, 4, 64, dtype=torch.float16, device="cuda")  # padded (batch, seqlen, ...)
        >>> mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], device="cuda")
        >>> packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(x, mask)
        >>> out = flash_attn_varlen_func(packed, packed, packed, cu_seqlens, cu_seqlens, max_seqlen,
        ...                              max_seqlen, causal=True)
        >>> out.shape, pad_input(out, indices, 2, 6).shape
        (torch.Size([9, 4, 64]), torch.Size([2, 6, 4, 64]))
    """
    k, v = _gather_pages(k, v, block_table, cu_seqlens_k, max_seqlen_k)
    return _attention(
        {"q": q, "k": k, "v": v},
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        _Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
        dict(
            block_mask=block_mask,
            mask_mod=mask_mod,
            score_mod=score_mod,
            score_mod_bwd=score_mod_bwd,
            aux_tensors=aux_tensors,
        ),
        learnable_sink=learnable_sink,
    )


@_document
def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """:func:`flash_attn_varlen_func` on q, k and v stacked in one packed tensor (self-attention).

    q, k and v are views of ``qkv`` (``qkv[:, 0]``, ``[:, 1]``, ``[:, 2]``), never copied; the gradient
    comes back as one tensor shaped like ``qkv``. Queries and keys share ``cu_seqlens``.

    Arguments:
        qkv: (total, 3, nheads, headdim); dtypes and devices as in :func:`flash_attn_func`.
        cu_seqlens: (batch_size + 1,) torch.int32, contiguous, on qkv's device: cumulative sequence
            lengths, starting at 0, non-decreasing, ending at total.
        max_seqlen: int ≥ 0, at least the longest sequence.
        {options}

    Returns:
        out: (total, nheads, headdim), qkv's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (nheads, total), float32 (float64 for float64
            inputs), natural log; −inf for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: with dropout_p > 0, (batch_size, nheads, max_seqlen,
            max_seqlen), as in :func:`flash_attn_varlen_func`; without dropout an empty tensor.

    {divergences}

    Example::

        >>> qkv = torch.randn(10, 3, 4, 64, dtype=torch.bfloat16, device="cuda")  # sequences of 3 and 7
        >>> cu_seqlens = torch.tensor([0, 3, 10], dtype=torch.int32, device="cuda")
        >>> flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, 7, causal=True).shape
        torch.Size([10, 4, 64])
    """
    names = ("cu_seqlens", "cu_seqlens", "max_seqlen", "max_seqlen")
    return _attention(
        {"qkv": qkv},
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        _Varlen(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, names),
        learnable_sink=learnable_sink,
    )


@_document
def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    *,
    learnable_sink: torch.Tensor | None = None,
) -> AttentionResult:
    """:func:`flash_attn_varlen_func` with k and v stacked in one packed tensor.

    k and v are views of ``kv`` (``kv[:, 0]`` and ``kv[:, 1]``), never copied; their gradient comes back
    as one tensor shaped like ``kv``. MQA/GQA as in :func:`flash_attn_func`.

    Arguments:
        q: (total_q, nheads, headdim).
        kv: (total_k, 2, nheads_k, headdim); one dtype and device with q, as in :func:`flash_attn_func`.
        cu_seqlens_q, cu_seqlens_k: (batch_size + 1,) torch.int32, contiguous, on q's device; cumulative
            lengths starting at 0, non-decreasing, ending at total_q and total_k.
        max_seqlen_q, max_seqlen_k: ints ≥ 0, at least the longest query and key sequences.
        {options}

    Returns:
        out: (total_q, nheads, headdim), q's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (nheads, total_q), float32 (float64 for float64
            inputs), natural log; −inf for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: as in :func:`flash_attn_varlen_func`.

    {divergences}

    Example::

        >>> q = torch.randn(5, 8, 64, dtype=torch.float16, device="cuda")  # 2 + 3 new tokens
        >>> kv = torch.randn(300, 2, 2, 64, dtype=torch.float16, device="cuda")  # contexts of 100 and 200
        >>> cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device="cuda")
        >>> cu_k = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
        >>> flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 3, 200, causal=True).shape
        torch.Size([5, 8, 64])
    """
    return _attention(
        {"q": q, "kv": kv},
        dropout_p,
        softmax_scale,
        causal,
        window_size,
        softcap,
        alibi_slopes,
        deterministic,
        return_attn_probs,
        _Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
        learnable_sink=learnable_sink,
    )
