"""flash_attn's public functions: flash_attn_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func.

Signatures, defaults and return conventions are flash_attn 2.8's; where flashtile still differs is listed in
``DIVERGENCES`` (part of each function's docstring). Each function validates its arguments
(:mod:`flashtile.validation`), picks the backend (:mod:`flashtile.backend`) and runs attention through
:mod:`flashtile.autograd` (the custom ops ``torch.ops.flashtile.attn_fwd``/``attn_bwd`` under
torch.compile); nothing launches before every check has passed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from flashtile import autograd as _autograd
from flashtile import backend as _backend
from flashtile import validation

AttentionResult = torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# The arguments after the tensors, the same in the three functions.
OPTIONS = """\
dropout_p: float, default 0.0. Dropout probability, in [0, 1). Only 0.0 is implemented yet; other
    values in range raise NotImplementedError. Set it to 0.0 during evaluation.
softmax_scale: float or None, default None. The scaling of QKᵀ before the softmax; None means
    1 / sqrt(headdim). Must be finite; 0 and negative values are allowed.
causal: bool, default False. Apply the bottom-right aligned causal mask (auto-regressive modelling).
window_size: (left, right), default (-1, -1). Sliding-window attention: query i sees the keys in
    [i + seqlen_k − seqlen_q − left, i + seqlen_k − seqlen_q + right]. Any pair of integers (tuple,
    list, NumPy integers or array, integer tensors); a negative bound or one ≥ seqlen_k is unlimited,
    and causal=True sets right = 0, as in flash_attn, so (-1, 0) is causal attention. Any other
    window after that raises NotImplementedError (not implemented yet).
softcap: float, default 0.0. Softcapping ``softcap · tanh(scores / softcap)``; ≤ 0 disables it.
    Non-finite values raise ValueError; softcap > 0 is not implemented yet (NotImplementedError).
alibi_slopes: default None. ALiBi is not implemented yet: anything but None raises
    NotImplementedError.
deterministic: bool, default False. Accepted for compatibility: the backward uses no atomics, so its
    gradients are bitwise reproducible either way.
return_attn_probs: bool, default False. Also return softmax_lse and S_dmask. As in flash_attn, S_dmask
    holds the probabilities only under dropout (dropout_p > 0: batch · nheads · seqlen_q · seqlen_k
    elements of q's dtype, 32 GiB per sequence in bf16 at seqlen 32k with 16 heads; for testing); with
    dropout_p = 0 it is an empty tensor and costs nothing, so the flag is the way to get softmax_lse.
causal, deterministic and return_attn_probs take Python or NumPy bools and 0-d bool tensors."""

# Every way flashtile still differs from flash_attn 2.8.
DIVERGENCES = """\
Where flashtile differs from flash_attn 2.8:

- A fully masked row (every row when seqlen_k = 0) has softmax_lse = −inf; flash_attn gives +inf.
  out is 0 in both.
- Not implemented yet, raising NotImplementedError: dropout_p > 0, a window_size other than (-1, -1)
  and (-1, 0) once normalised, softcap > 0, alibi_slopes. The varlen and KV-cache functions do not exist yet.
- Beyond flash_attn (CUDA, float16/bfloat16 only): CPU tensors run on the PyTorch reference, which also
  takes float32 and float64 (with float64 inputs softmax_lse is float64); Triton's CPU interpreter also
  takes float32.
- softmax_lse is marked non-differentiable (requires_grad=False); flash_attn returns it requiring grad
  and silently drops any gradient sent to it.
- Stricter checks, before any launch: non-finite softmax_scale or softcap, dropout_p < 0 and flags
  that are not bools (e.g. the int 1) raise; flash_attn passes them on. Errors are ValueError or
  TypeError that are also RuntimeError (flash_attn raises RuntimeError)."""


def _document(fn: Callable[..., AttentionResult]) -> Callable[..., AttentionResult]:
    """Fill the ``{options}`` and ``{divergences}`` markers of ``fn``'s docstring."""
    for marker, text, indent in (("{options}", OPTIONS, " " * 8), ("{divergences}", DIVERGENCES, " " * 4)):
        filled = text.replace("\n", "\n" + indent).replace("\n" + indent + "\n", "\n\n")
        fn.__doc__ = fn.__doc__.replace(marker, filled)
    return fn


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself, or a contiguous copy when its last dimension is strided (the kernels load rows of D)."""
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def _s_dmask(q: torch.Tensor) -> torch.Tensor:
    """flash_attn's S_dmask for dropout_p = 0: an empty tensor on q's device in q's dtype.

    flash_attn builds the probabilities only under dropout, where their sign encodes the dropout mask
    (``reference.naive.attention_probs(..., dropout_mask=keep)`` computes that matrix).
    """
    return q.new_empty((0,))


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
) -> AttentionResult:
    """Validate, resolve the backend and run the op; shared by the three public functions.

    ``tensors`` are the user's tensor arguments by name (``q, k, v``, ``qkv`` or ``q, kv``), so that errors
    name what the user passed.
    """
    q, k, v = validation.unpack_qkv(**tensors)
    validation.check_same_device(**tensors)
    backend = _backend.resolve(q.device)
    validation.check_dtypes(backend, **tensors)
    options = validation.check_options(
        dropout_p, window_size, softcap, alibi_slopes, causal, deterministic, return_attn_probs, k.shape[1]
    )
    scale = validation.check_softmax_scale(softmax_scale, q.shape[-1])
    q, k, v = (_unit_last_stride(t) for t in (q, k, v))
    out, lse = _autograd.attention(q, k, v, scale, options.causal, backend)
    if not options.return_attn_probs:
        return out
    return out, lse, _s_dmask(q)


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
        v: (batch_size, seqlen_k, nheads_k, headdim).
            q, k and v share one device and one dtype: float16 or bfloat16 for the Triton kernels on CUDA
            (float32 too under Triton's CPU interpreter); float16, bfloat16, float32 or float64 for the
            reference. headdim is 1 to 256 and nheads % nheads_k == 0. Any strides are accepted; a tensor
            whose last dimension is not contiguous (stride(-1) ≠ 1) is copied first.
        {options}

    Returns:
        out: (batch_size, seqlen_q, nheads, headdim), q's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (batch_size, nheads, seqlen_q), float32 (float64 for
            float64 inputs). The natural-log logsumexp of each row of QKᵀ · softmax_scale after masking; −inf
            for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: an empty tensor (0 elements) of q's dtype on q's device,
            as flash_attn returns without dropout.

    {divergences}

    Example::

        >>> q = torch.randn(2, 128, 8, 64, dtype=torch.float16, device="cuda", requires_grad=True)
        >>> k = torch.randn(2, 256, 2, 64, dtype=torch.float16, device="cuda", requires_grad=True)
        >>> v = torch.randn_like(k, requires_grad=True)
        >>> out = flash_attn_func(q, k, v, causal=True)  # GQA: 8 query heads share 2 key/value heads
        >>> out.shape
        torch.Size([2, 128, 8, 64])
        >>> out.sum().backward()
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
            reference. headdim is 1 to 256. Any strides; a non-contiguous last dimension is copied first.
        {options}

    Returns:
        out: (batch_size, seqlen, nheads, headdim), qkv's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (batch_size, nheads, seqlen), float32 (float64 for
            float64 inputs), natural log; −inf for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: an empty tensor (0 elements) of qkv's dtype on its
            device, as flash_attn returns without dropout.

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
            reference. headdim is 1 to 256. Any strides; a non-contiguous last dimension is copied first.
        {options}

    Returns:
        out: (batch_size, seqlen_q, nheads, headdim), q's dtype, contiguous.
        softmax_lse [only if return_attn_probs=True]: (batch_size, nheads, seqlen_q), float32 (float64 for
            float64 inputs), natural log; −inf for fully masked rows. Not differentiable.
        S_dmask [only if return_attn_probs=True]: an empty tensor (0 elements) of q's dtype on q's device,
            as flash_attn returns without dropout.

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
    )
