"""The implementations measured beside flashtile, each behind one calling convention.

Every peer is called as ``fn(q, k, v, causal, softmax_scale, **options) -> out`` on flash_attn's layout:
q ``(B, N_q, H, D)``, k ``(B, N_k, H_KV, D)``, v ``(B, N_k, H_KV, D_v)``, out ``(B, N_q, H, D_v)``,
differentiable. ``options`` is empty on a plain cell; on an option cell it holds flash_attn's keywords for the
options present (``window_size``, ``softcap``, ``alibi_slopes``, ``dropout_p``), FlashAttention-4's
``learnable_sink`` (float32 ``(H,)``, requiring grad) and, for a packed batch (q of shape
``(1, Σ n_i, H, D)``), ``cu_seqlens`` and ``max_seqlen``. A peer runs only the options it names in
``options``; ``supports(config)`` returns None when the peer can run a cell, else the reason the table shows.
A peer whose import fails is still listed, with ``unavailable`` set to the reason.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashtile.bench.grid import OPTIONS, Config

AttentionFn = Callable[..., torch.Tensor]
SupportsFn = Callable[[Config], "str | None"]

_HALF = ("fp16", "bf16")


@dataclass(frozen=True)
class Peer:
    """One implementation: its name, how to call it, which cells it runs, and why it is missing if it is."""

    name: str
    fn: AttentionFn | None
    supports: SupportsFn
    unavailable: str | None = None
    note: str = ""
    default: bool = True
    options: frozenset[str] = frozenset()
    # The note of one cell, where it differs from ``note`` (flashtile's float8 cells name their kernel).
    cell_note: Callable[[Config], str] | None = None

    def lacks(self, config: Config) -> str | None:
        """Why this peer cannot run ``config``'s options, or None."""
        missing = [name for name in config.options if name not in self.options]
        return f"{self.name} does not implement {', '.join(missing)}" if missing else None


def _anything(config: Config) -> str | None:
    return None


def _unavailable(name: str, exc: BaseException) -> Peer:
    return Peer(name, None, _anything, unavailable=f"{type(exc).__name__}: {exc}")


def _first(result: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Some flash_attn builds return ``(out, lse)``, others ``out``."""
    return result[0] if isinstance(result, tuple) else result


def _needs_cuda_half(config: Config, dtypes: tuple[str, ...] = _HALF) -> str | None:
    if config.device != "cuda":
        return "needs a CUDA device"
    if config.dtype not in dtypes:
        return f"{config.dtype} not supported (only {', '.join(dtypes)})"
    return None


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, **options: object) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on flash_attn's (B, N, H, D) layout, GQA/MQA included; ``options``
    go to SDPA (``is_causal``, ``attn_mask``)."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        scale=scale,
        enable_gqa=q.shape[2] != k.shape[2],
        **options,
    )
    return out.transpose(1, 2)


def flashtile_peer(device: str) -> Peer:
    try:
        import flashtile
        from flashtile.backend import resolve
    except ImportError as exc:
        return _unavailable("flashtile", exc)
    varlen_func = getattr(flashtile, "flash_attn_varlen_func", None)

    def fn(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int = 0,
        fp8: bool = False,
        **options: object,
    ) -> torch.Tensor:
        if fp8:
            # The float8 forward (descales of 1) is inference only: the bench's inputs require grad.
            with torch.no_grad():
                q, k, v = (t.detach() for t in (q, k, v))
                return flashtile.flash_attn_fp8_func(q, k, v, softmax_scale=scale, causal=causal, **options)
        if cu_seqlens is None:
            return flashtile.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, **options)
        out = varlen_func(
            q[0],
            k[0],
            v[0],
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            softmax_scale=scale,
            causal=causal,
            **options,
        )
        return out[None]

    def supports(config: Config) -> str | None:
        if config.layout == "varlen" and varlen_func is None:
            return "this flashtile has no flash_attn_varlen_func"
        return None

    try:
        backend = resolve(torch.device(device))
    except ValueError as exc:
        return _unavailable("flashtile", exc)

    def cell_note(config: Config) -> str:
        if not config.fp8:
            return f"backend {backend}"
        # flashtile.fp8's choice: the portable forward unless FLASHTILE_FP8_KERNEL=gluon on Hopper.
        gluon = backend == "hopper" and os.environ.get(flashtile.fp8.FP8_KERNEL_ENV, "").strip() == "gluon"
        kernel = "reference" if backend == "reference" else "hopper (Gluon)" if gluon else "triton"
        return f"float8 forward {kernel}"

    return Peer(
        "flashtile", fn, supports, note=f"backend {backend}", options=frozenset(OPTIONS), cell_note=cell_note
    )


def sdpa_peer(name: str, backend_name: str) -> Peer:
    """``F.scaled_dot_product_attention`` pinned to one backend through ``sdpa_kernel``."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
    except (ImportError, AttributeError) as exc:
        return _unavailable(name, exc)

    def fn(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, dropout_p: float = 0.0
    ) -> torch.Tensor:
        with sdpa_kernel(backend):
            return sdpa(q, k, v, scale, is_causal=causal, dropout_p=dropout_p)

    def supports(config: Config) -> str | None:
        if config.causal and config.seqlen_q != config.seqlen_k:
            return "SDPA's is_causal is top-left aligned; flash_attn's is bottom-right"
        if backend_name == "MATH":
            return None
        if backend_name == "EFFICIENT_ATTENTION":
            return _needs_cuda_half(config, ("fp16", "bf16", "fp32"))
        return _needs_cuda_half(config)

    return Peer(name, fn, supports, options=frozenset({"dropout"}))


def _mask_mod(offset: int, left: int, right: int) -> Callable[..., torch.Tensor]:
    """flash_attn's bottom-right window as a mask_mod: query i sees key j iff
    ``i + offset − left ≤ j ≤ i + offset + right``, a negative bound unlimited (causal: right = 0)."""

    def window(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        distance = kv_idx - (q_idx + offset)
        if left < 0:
            return distance <= right
        if right < 0:
            return distance >= -left
        return (distance >= -left) & (distance <= right)

    return window


def _score_mod(softcap: float, slopes: torch.Tensor | None, offset: int) -> Callable[..., torch.Tensor]:
    """flash_attn's softcap then ALiBi on FlexAttention's (already scaled) score, as the naive reference
    orders them: ``softcap · tanh(s / softcap)``, then ``− slope_h · |i + offset − j|``."""

    def score_mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        if softcap > 0:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            score = score - slopes[h] * (q_idx + offset - kv_idx).abs()
        return score

    return score_mod


def _with_sink(out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
    """A learnable sink applied after the fact, as transformers' FlexAttention path for GPT-OSS does (a
    ``score_mod`` cannot add a column to the softmax): out ``(B, H, N, D_v)`` times
    ``exp(lse − log(exp(lse) + exp(sink_h))) = sigmoid(lse − sink_h)``, in fp32 at least; differentiable
    through out, lse and the sink."""
    dtype = torch.promote_types(out.dtype, torch.float32)
    factor = torch.sigmoid(lse.to(dtype) - sink.to(dtype).view(1, -1, 1))
    return (out.to(dtype) * factor[..., None]).to(out.dtype)


def _raise_recompile_limits() -> None:
    """Each benchmark shape is a new graph: lift Dynamo's limit (8) and fail loudly instead of falling back to
    eager execution, which would time uncompiled FlexAttention under the compiled peer's name."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 256)
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 1024)
    dynamo_config.fail_on_recompile_limit_hit = True
    # The benchmark times backward repeatedly on one graph (retain_graph=True); compiled backwards that
    # donate their buffers refuse that, and PyTorch's own error message prescribes this switch.
    import torch._functorch.config as functorch_config

    functorch_config.donated_buffer = False


def flex_peer(compile_mode: str = "static") -> Peer:
    """``torch.compile(flex_attention)``; the causal or window block mask is built once per (N_q, N_k,
    device, window), cached; softcap and ALiBi are a ``score_mod``, one per (softcap, slopes, offset); a
    learnable sink rescales the output by Flex's log-sum-exp (:func:`_with_sink`).

    ``compile_mode`` "static" compiles each shape; "dynamic" lets B and N vary, which costs about three
    graphs per (head dim, mask): the first shape, the dynamic one, and batch 1. FlexAttention specialises
    the head count either way.
    """
    try:
        from torch.nn.attention import flex_attention as flex_module
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as exc:
        return _unavailable("flex", exc)
    # torch ≥ 2.9 asks for the log-sum-exp with return_aux; older releases with return_lse.
    aux_request = getattr(flex_module, "AuxRequest", None)
    lse_keywords = {"return_aux": aux_request(lse=True)} if aux_request else {"return_lse": True}

    compiled: list[Callable[..., torch.Tensor]] = []
    # One mask_mod / score_mod per key: Dynamo guards on their identity, so a fresh closure would recompile.
    mask_mods: dict[tuple[int, int, int], Callable[..., torch.Tensor]] = {}
    score_mods: dict[tuple[float, tuple[float, ...] | None, int, str], Callable[..., torch.Tensor]] = {}
    block_masks: dict[tuple[int, int, str, int, int], object] = {}

    def block_mask(seqlen_q: int, seqlen_k: int, device: torch.device, left: int, right: int) -> object:
        key = (seqlen_q, seqlen_k, str(device), left, right)
        if key not in block_masks:
            bounds = (seqlen_k - seqlen_q, left, right)
            mask_mod = mask_mods.setdefault(bounds, _mask_mod(*bounds))
            block_masks[key] = create_block_mask(mask_mod, None, None, seqlen_q, seqlen_k, device=device)
        return block_masks[key]

    def score_mod(softcap: float, slopes: torch.Tensor | None, offset: int) -> Callable[..., torch.Tensor]:
        values = None if slopes is None else tuple(slopes.tolist())
        key = (softcap, values, offset, str(slopes.device) if slopes is not None else "")
        return score_mods.setdefault(key, _score_mod(softcap, slopes, offset))

    def fn(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        scale: float,
        window_size: tuple[int, int] = (-1, -1),
        softcap: float = 0.0,
        alibi_slopes: torch.Tensor | None = None,
        learnable_sink: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not compiled:
            _raise_recompile_limits()
            compiled.append(torch.compile(flex_attention, dynamic=compile_mode == "dynamic"))
        left, right = window_size
        right = 0 if causal else right
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        masked = left >= 0 or right >= 0
        mask = block_mask(seqlen_q, seqlen_k, q.device, left, right) if masked else None
        scores = softcap > 0 or alibi_slopes is not None
        out = compiled[0](
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            score_mod=score_mod(softcap, alibi_slopes, seqlen_k - seqlen_q) if scores else None,
            block_mask=mask,
            scale=scale,
            enable_gqa=q.shape[2] != k.shape[2],
            **(lse_keywords if learnable_sink is not None else {}),
        )
        if learnable_sink is not None:
            out, aux = out
            out = _with_sink(out, aux if isinstance(aux, torch.Tensor) else aux.lse, learnable_sink)
        return out.transpose(1, 2)

    def supports(config: Config) -> str | None:
        return _needs_cuda_half(config, ("fp16", "bf16", "fp32"))

    return Peer(
        "flex",
        fn,
        supports,
        note=f"torch.compile(flex_attention, dynamic={compile_mode == 'dynamic'})",
        options=frozenset({"window", "softcap", "alibi", "sink"}),
    )


def _flash_attn_peer(
    name: str,
    module: str,
    limit: Callable[[Config, tuple[int, int]], str | None],
    options: frozenset[str] = frozenset(),
) -> Peer:
    """A FlashAttention build's ``module.flash_attn_func``, on CUDA in fp16/bf16; ``limit(config, compute
    capability)`` is why it cannot run a cell, or None; ``options`` are the flash_attn keywords it takes."""
    try:
        flash_attn_func = importlib.import_module(module).flash_attn_func
    except Exception as exc:
        return _unavailable(name, exc)

    def fn(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, **options: object
    ) -> torch.Tensor:
        return _first(flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, **options))

    def supports(config: Config) -> str | None:
        return _needs_cuda_half(config) or limit(config, torch.cuda.get_device_capability())

    return Peer(name, fn, supports, options=options)


def _fa2_limit(config: Config, capability: tuple[int, int]) -> str | None:
    if capability < (8, 0):
        return "FlashAttention-2 needs sm_80 or newer"
    if config.head_dim > 256 or config.head_dim % 8:
        return f"head dim {config.head_dim} not supported (multiples of 8 up to 256)"
    if config.head_dim_v:
        return f"head dims {config.head_dim_label} not supported (V's head dim must equal Q/K's)"
    return None


def fa2_peer() -> Peer:
    return _flash_attn_peer(
        "fa2", "flash_attn", _fa2_limit, frozenset({"window", "softcap", "alibi", "dropout"})
    )


def fa3_peer() -> Peer:
    return _flash_attn_peer(
        "fa3",
        "flash_attn_interface",
        lambda config, capability: None if capability == (9, 0) else "FlashAttention-3 runs on sm_90 only",
        frozenset({"window", "softcap"}),
    )


def fa4_peer() -> Peer:
    return _flash_attn_peer(
        "fa4",
        "flash_attn.cute",
        lambda config, capability: (
            None if capability[0] in (9, 10) else "FlashAttention-4 runs on sm_90 and sm_100"
        ),
    )


def naive_peer(default: bool = True) -> Peer:
    """The reference that materialises S and P, in the inputs' dtype: plain PyTorch attention."""
    try:
        from flashtile.reference.naive import attention
    except ImportError as exc:
        return _unavailable("naive", exc)

    def fn(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, **options: object
    ) -> torch.Tensor:
        return attention(q, k, v, softmax_scale=scale, causal=causal, **options)[0]

    return Peer(
        "naive", fn, _anything, default=default, options=frozenset({"window", "softcap", "alibi", "sink"})
    )


def available_peers(device: str, *, flex_compile: str = "static") -> list[Peer]:
    """Every peer for a device kind ("cuda" or "cpu"), flashtile first; missing ones carry ``unavailable``.

    Peers with ``default`` False (naive attention on the GPU, out of memory beyond a few thousand tokens) run
    only when named with ``--peers``.
    """
    if device == "cpu":
        return [flashtile_peer(device), sdpa_peer("sdpa-math", "MATH"), naive_peer()]
    return [
        flashtile_peer(device),
        sdpa_peer("sdpa-cudnn", "CUDNN_ATTENTION"),
        sdpa_peer("sdpa-flash", "FLASH_ATTENTION"),
        sdpa_peer("sdpa-efficient", "EFFICIENT_ATTENTION"),
        sdpa_peer("sdpa-math", "MATH"),
        flex_peer(flex_compile),
        fa2_peer(),
        fa3_peer(),
        fa4_peer(),
        naive_peer(default=False),
    ]
