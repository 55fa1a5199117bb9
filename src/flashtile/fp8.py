"""Attention on float8 inputs (inference): FlashAttention-3's FP8 forward, with its descale arguments.

q, k and v arrive in float8 e4m3 with one fp32 *descale* per (batch, key/value head) each: the
real tensor is ``q.float() · q_descale[b, h_kv]`` (query head h reading key/value head h_kv). The kernel
multiplies the float8 tiles as they are (fp32 accumulation), folds q's and k's descales into the softmax
scale and v's into the output, and feeds P to the second product in V's float8 dtype, as FlashAttention-3
does; the output is bfloat16. :func:`quantize_fp8` makes such tensors and descales from higher precision.
Derivation and error budget: docs/design/fp8.md.
"""

from __future__ import annotations

import torch

from flashtile import backend as _backend
from flashtile import validation
from flashtile._environ import Knob
from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.kernels.fwd import FP8_DTYPES
from flashtile.reference import naive

# float8 e4m3's largest finite value: quantize_fp8 maps a group's largest magnitude to it.
FP8_MAX = 448.0
# What quantize_fp8 scales: floating tensors of 16 bits or more (float8 is already quantised).
QUANTIZABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Head dims the float8 forward takes: multiples of 16 (each row a whole number of 16-byte TMA units).
FP8_MAX_HEAD_DIM = 256
# Float8 matrix products need compute capability 8.9 (Ada) or 9.x (Hopper) and later.
FP8_MIN_CAPABILITY = (8, 9)
# "gluon": the Gluon (Hopper) forward where it takes the call, else the portable Triton one, which is the
# default: on an H200 the Gluon one read 0.94-0.99 of its speed (docs/design/fp8.md). Read at each call.
FP8_KERNEL_ENV = "FLASHTILE_FP8_KERNEL"
_FP8_KERNEL = Knob(FP8_KERNEL_ENV)


def quantize_fp8(x: torch.Tensor, group: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_fp8, descale)`` for ``x`` (B, N, H, D): each batch element's heads in groups of ``group`` (the
    query heads that share a key/value head: ``nheads // nheads_k`` for q, 1 for k and v) scaled so that the
    group's largest magnitude is float8 e4m3's largest finite value, 448; ``descale`` (B, H // group)
    float32 is the factor back (``x ≈ x_fp8 · descale``), the layout :func:`flash_attn_fp8_func` takes. An
    all-zero group gets descale 1."""
    validation.check_rank("x", x, "(batch_size, seqlen, nheads, headdim)")
    if x.dtype not in QUANTIZABLE_DTYPES:
        raise FlashtileTypeError(
            f"x.dtype is {x.dtype}; quantize_fp8 takes {', '.join(map(str, QUANTIZABLE_DTYPES))}"
        )
    batch, seqlen, heads, head_dim = x.shape
    if not isinstance(group, int) or group < 1 or heads % group:
        raise FlashtileValueError(f"group must be a positive divisor of nheads = {heads}; got {group!r}")
    grouped = x.detach().reshape(batch, seqlen, heads // group, group * head_dim)
    amax = grouped.abs().amax(dim=(1, 3)).to(torch.float32)
    descale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    # (Not differentiable: the float8 forward is inference only.)
    scaled = x.detach().to(torch.float32) / descale.repeat_interleave(group, dim=1)[:, None, :, None]
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), descale


def _check_descale(
    name: str, descale: object, batch: int, heads_kv: int, device: torch.device
) -> torch.Tensor:
    """``descale`` (B, H_KV) float32 on ``device``, or ones for None."""
    if descale is None:
        return torch.ones(batch, heads_kv, dtype=torch.float32, device=device)
    if not isinstance(descale, torch.Tensor):
        raise FlashtileTypeError(f"{name} must be a torch.Tensor or None; got {type(descale).__name__}")
    if descale.dtype != torch.float32:
        raise FlashtileTypeError(f"{name}.dtype must be torch.float32; got {descale.dtype}")
    if tuple(descale.shape) != (batch, heads_kv):
        raise FlashtileValueError(
            f"{name} must have shape (batch_size, nheads_k) = ({batch}, {heads_kv}); got "
            f"{tuple(descale.shape)}"
        )
    if descale.device != device:
        raise FlashtileValueError(f"{name} must be on q's device {device}; got {descale.device}")
    return descale


def _check_fp8_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    validation.check_tensors(q=q, k=k, v=v)
    validation.check_same_device(q=q, k=k, v=v)
    validation.check_same_dtype(q=q, k=k, v=v)
    if q.dtype not in FP8_DTYPES:
        raise FlashtileTypeError(
            f"q.dtype is {q.dtype}; flash_attn_fp8_func takes {', '.join(map(str, FP8_DTYPES))} "
            "(quantize_fp8 makes it; flash_attn_func takes float16 and bfloat16)"
        )
    validation.check_qkv_shapes(q, k, v)
    for name, t in (("q", q), ("v", v)):
        d = t.shape[-1]
        if d % 16 or d > FP8_MAX_HEAD_DIM:
            raise FlashtileValueError(
                f"{name}'s head dim is {d}; the float8 forward takes multiples of 16 up to {FP8_MAX_HEAD_DIM}"
            )
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise FlashtileValueError(
            "flash_attn_fp8_func is a forward (inference) only: q, k or v requires grad; run it under "
            "torch.no_grad() or detach the inputs"
        )


def _fp8_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """``hopper``, ``triton`` or ``reference`` for these float8 inputs: the portable Triton forward on CUDA
    devices of compute capability ≥ 8.9, or on Hopper with FP8_KERNEL_ENV ``gluon`` (or a forced
    ``hopper`` backend) the Gluon forward where it takes the call
    (:func:`flashtile.kernels.hopper.support.fp8_unsupported_reason`), PyTorch on the reference backend. A
    forced ``hopper`` raises where it cannot run."""
    device = q.device
    choice = _backend.resolve(device)
    if choice == "reference":
        return "reference"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < FP8_MIN_CAPABILITY:
        major, minor = torch.cuda.get_device_capability(device)
        raise FlashtileValueError(
            f"float8 matrix products need compute capability ≥ 8.9; {device} has {major}.{minor} "
            "(FLASHTILE_BACKEND=reference runs the float8 forward in PyTorch)"
        )
    if choice == "hopper":
        from flashtile.kernels.hopper.support import fp8_unsupported_reason

        reason = fp8_unsupported_reason(q, k, v)
        forced = _backend.requested() == "hopper"
        if reason is None and (forced or _FP8_KERNEL.get("portable").strip() == "gluon"):
            return "hopper"
        if forced:
            raise FlashtileValueError(f"{_backend.ENV_VAR}=hopper was asked for, but {reason}")
    return "triton"


def _dequantized(t: torch.Tensor, descale: torch.Tensor, group: int) -> torch.Tensor:
    """``t`` in float32 times its (B, H_KV) descales, repeated over a query group of ``group`` heads."""
    return t.to(torch.float32) * descale.repeat_interleave(group, dim=1)[:, None, :, None]


def rounded_like_the_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options: object
) -> torch.Tensor:
    """The float8 kernel's roundings, computed by PyTorch: attention of the dequantised ``q, k, v`` (float32
    or wider; ``options`` as :func:`flashtile.reference.naive.attention` takes them) with P rounded to e4m3
    against its row's largest entry (the kernel rounds each tile's P against the running max, before its
    product with V) and the output rounded to bfloat16. The low-precision baseline of the 2× accuracy rule
    for the float8 forward (tests/test_fp8.py, ``flashtile bench``'s fp8 cells)."""
    p = naive.attention_probs(q, k, v, **options).to(torch.float32)
    row_max = p.amax(dim=-1, keepdim=True)
    p8 = (p / torch.where(row_max > 0, row_max, 1.0)).to(torch.float8_e4m3fn).to(torch.float32)
    v_heads = v.to(torch.float32).repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    out = torch.einsum("bhij,bjhd->bihd", p8, v_heads) * row_max.permute(0, 2, 1, 3)
    return out.to(torch.bfloat16)


def flash_attn_fp8_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_softmax_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention ``softmax(q̃ k̃ᵀ · softmax_scale) ṽ`` of float8 inputs, ``q̃ = q · q_descale`` (and so on),
    forward only, with FlashAttention-3's FP8 arguments.

    Arguments:
        q: (batch_size, seqlen_q, nheads, headdim); k: (batch_size, seqlen_k, nheads_k, headdim);
            v: (batch_size, seqlen_k, nheads_k, headdim_v). torch.float8_e4m3fn, one device; head dims
            multiples of 16 up to 256; nheads % nheads_k == 0 (query head h reads key/value head
            h // (nheads // nheads_k)). None may require grad.
        q_descale, k_descale, v_descale: float32 (batch_size, nheads_k), or None for 1: the factors that
            turn the float8 values back into the real ones (:func:`quantize_fp8` returns them), per batch
            element and key/value head, as FlashAttention-3 takes them.
        softmax_scale, causal, window_size, softcap: as in :func:`flashtile.flash_attn_func`.
        return_softmax_lse: also return the (batch_size, nheads, seqlen_q) float32 log-sum-exp.

    Returns ``out`` (batch_size, seqlen_q, nheads, headdim_v) bfloat16 [and the LSE]. On CUDA (compute
    capability ≥ 8.9) the portable Triton forward runs it, P entering the second product in V's float8
    dtype; ``FLASHTILE_FP8_KERNEL=gluon`` (or ``FLASHTILE_BACKEND=hopper``) runs the Gluon forward instead on
    Hopper, at head dims 64, 128 and 256; with ``FLASHTILE_BACKEND=reference`` (and on the CPU) PyTorch
    computes it in float32 from the dequantised inputs. A custom op (``flashtile::fp8_fwd``): torch.compile
    traces it, ``fullgraph=True`` included.
    """
    _check_fp8_tensors(q, k, v)
    batch, heads, heads_kv = q.shape[0], q.shape[2], k.shape[2]
    descales = [
        _check_descale(name, d, batch, heads_kv, q.device)
        for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    ]
    options = validation.check_options(
        0.0, window_size, softcap, None, causal, False, False, k.shape[1], batch, heads, q.device
    )
    return_lse = validation.check_flag("return_softmax_lse", return_softmax_lse)
    scale = validation.check_softmax_scale(softmax_scale, q.shape[-1])
    left, right = options.window_size
    out, lse = fp8_fwd(
        q, k, v, torch.stack(descales, dim=-1), scale, options.causal, left, right, options.softcap
    )
    return (out, lse) if return_lse else out


def _run_fp8_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    descale: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float8 forward on checked arguments (:func:`flash_attn_fp8_func`): ``descale`` (B, H_KV, 3),
    the window normalised. ``(out, lse)``: bf16 (B, N_q, H, D_v) and fp32 (B, H, N_q)."""
    window = (window_left, window_right)
    backend = _fp8_backend(q, k, v)
    if backend == "reference":
        group = q.shape[2] // k.shape[2]
        descales = descale.unbind(-1)
        groups = (group, 1, 1)
        q32, k32, v32 = (_dequantized(t, d, g) for t, d, g in zip((q, k, v), descales, groups, strict=True))
        out, lse = naive.attention(
            q32, k32, v32, softmax_scale=softmax_scale, causal=causal, window_size=window, softcap=softcap
        )
        return out.to(torch.bfloat16, memory_format=torch.contiguous_format), lse.contiguous()
    if backend == "hopper":
        from flashtile.kernels.hopper.fwd import attn_fwd
    else:
        from flashtile.kernels.fwd import attn_fwd

        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    return attn_fwd(
        q, k, v, softmax_scale, causal, window_size=window, softcap=softcap, descale=descale.contiguous()
    )


# A custom op, so that torch.compile traces flash_attn_fp8_func whole (fullgraph=True included): the
# checks above run at trace time on the tensors' metadata, the kernels inside the op.
fp8_fwd = torch.library.custom_op("flashtile::fp8_fwd", _run_fp8_fwd, mutates_args=())


@fp8_fwd.register_fake
def _fp8_fwd_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    descale: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, seqlen_q, heads, _ = q.shape
    out = q.new_empty((batch, seqlen_q, heads, v.shape[-1]), dtype=torch.bfloat16)
    return out, q.new_empty((batch, heads, seqlen_q), dtype=torch.float32)
