"""Small grids of odd shapes for compute-sanitizer: every kernel, boundary tiles included, forward and
backward, each case printed before it runs so that a sanitizer report names it.

Groups (``--only`` takes a comma-separated subset):

- ``hopper``: the Gluon forward (D 64/128/256) and backward (D 64/128, reduce and deterministic) called
  directly, causal or not, GQA/MQA, odd lengths; skipped unless the GPU has compute capability 9.x;
- ``decode``: ``flash_attn_with_kvcache`` (KV append, rotary, split-KV decode and combine with num_splits 1
  and 3, contiguous and paged caches, leftpad, batch index, an empty sequence, the long-query paged path)
  and ``apply_rotary_emb`` (offsets, varlen, in place, its backward);
- ``mods``: block-sparse masks (from a ``mask_mod``, and from random tiles with an empty query block) with a
  ``score_mod`` and its ``score_mod_bwd``, ``learnable_sink`` (with a window, varlen, a block mask), V head
  dims other than Q/K's (192/128, 576/512, 64/24);
- ``portable``: the portable Triton forward and backward at 7 odd shapes (seqlens 1 to 300, head dims 32 to
  256, GQA/MQA), dense and with four option mixes (windows, softcap, ALiBi, dropout), three varlen batches
  with empty sequences, a batch with bad ``cu_seqlens`` (clamped), and the dropout-mask kernel;
- ``hopper_options``: the Gluon forward and backward (D 64/128) on packed batches (an empty sequence, N_q >
  N_k and N_q < N_k, a neighbour read past each end) and with windows, softcap and ALiBi, dense and packed,
  and packed batches with bad ``cu_seqlens`` (clamped; last, added in the nineteenth session); skipped
  unless the GPU has compute capability 9.x;
- ``hopper_sparse``: block masks in the Gluon forward and backward (D 64/128): random tile states with an
  empty query block, 128- and 256-row blocks, causal, and the causal and document ``mask_mod`` in the
  partial blocks, at odd lengths; skipped unless the GPU has compute capability 9.x;
- ``hopper_dropout``: dropout in the Gluon forward and backward (D 64/128), alone, packed, and with a window,
  softcap and ALiBi; skipped unless the GPU has compute capability 9.x;
- ``hopper_persistent``: the Gluon forward's persistent grid (plain attention, D 64/128) at shapes with more
  work tiles than the GPU has SMs, so that programs loop over several (odd lengths, N_q ≠ N_k, GQA), then
  its backward (at D = 64 on the backward's persistent grid); skipped unless the GPU has compute
  capability 9.x;
- ``hopper_three``: the Gluon forward's three consumer warpgroups at D = 64 (192-row work tiles: long rows
  by the length rule, plain on the persistent grid and causal one program a tile, and short odd lengths
  with ``FLASHTILE_HOPPER_FWD_CONSUMERS=3``), and sliding windows on the persistent grid (D 64/128, more
  work tiles than SMs, rows that see no key), each with its backward; skipped unless the GPU has compute
  capability 9.x;
- ``hopper_paired``: the Gluon forward's causal persistent grid (row blocks dealt out in pairs, longest
  with shortest) and a window bounded on the right only, at shapes with at least as many pairs as the GPU
  has SMs: odd and even row-block and head counts, rows that see no key, three consumers; each with its
  backward; skipped unless the GPU has compute capability 9.x;
- ``hopper_d256``: the Gluon backward at D = 256 (the "dim" split, reduce and deterministic) at the
  ``hopper`` group's shapes; skipped unless the GPU has compute capability 9.x;
- ``hopper_persistent_options``: softcap, ALiBi and dropout on the Gluon forward's persistent grid (D 64,
  128, 256; causal in pairs, rows that see no key), each with its backward; skipped unless the GPU has
  compute capability 9.x;
- ``hopper_sink``: a learnable sink folded into the Gluon forward's epilogue (D 64, 128, 256; the persistent
  grid, causal pairs, three consumers, a packed batch, rows that see no key), each with its backward (the
  Gluon one, which sums the sink's gradient, at D = 64 without softcap; the portable one else);
  skipped unless the GPU has compute capability 9.x;
- ``fp8``: the float8 forward (``flash_attn_fp8_func``, the portable kernel reading Vᵀ) at D 64/128/256,
  odd lengths, GQA/MQA, causal, windows and softcap, with descales.

The groups added later come last in the list, so the earlier groups' case numbers stay those of earlier logs.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \\
        python scripts/sanitize_kernels.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python scripts/sanitize_kernels.py --only hopper
    python scripts/sanitize_kernels.py --dry-run      # no GPU needed
    ... sanitize_kernels.py --only hopper_options --repeat 2   # each case twice: the direct relaunch too

``FLASHTILE_SANITIZE_SHARD=i/n`` runs every n-th case from the i-th: n processes fill Triton's disk cache
in parallel before the sanitized run, which would otherwise spend its time compiling the grid's kernels.
``--dry-run`` builds every case's inputs on the CPU and runs it on the reference backend
(``FLASHTILE_BACKEND=reference``), the direct kernel calls replaced by the reference entry points after
their arguments are bound to the kernel's signature: the grid and its arguments checked without CUDA.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

# The newest kernels first, so that a memcheck run cut short by its time box has checked them; groups added
# later go last (`--only` picks them) so that earlier logs' case numbers, which `--start` takes, still hold.
GROUPS = (
    "hopper", "decode", "mods", "portable", "hopper_options", "hopper_sparse", "hopper_dropout",
    "hopper_persistent", "hopper_three", "hopper_paired", "hopper_d256", "fp8", "hopper_d256_persistent",
    "hopper_persistent_options", "hopper_sink",
)  # fmt: skip

SHAPES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal)
    (1, 1, 1, 1, 1, 32, False),
    (2, 17, 17, 4, 2, 59, True),
    (1, 113, 203, 4, 1, 64, True),
    (1, 203, 113, 2, 2, 96, True),
    (2, 129, 255, 2, 1, 128, False),
    (1, 97, 63, 2, 2, 256, True),
    (1, 300, 300, 3, 3, 160, False),
]
# Normalised windows (−1 = unlimited), softcap, ALiBi slopes per (batch, head) or not, dropout p.
OPTIONS = [
    dict(window_size=(0, 0)),
    dict(window_size=(37, 5), softcap=20.0, alibi=True),
    dict(window_size=(-1, 3), dropout_p=0.2),
    dict(window_size=(9, -1), softcap=5.0, alibi=True, dropout_p=0.5),
]
# Varlen batches: (seqlen_q, seqlen_k) per sequence, empty ones included.
VARLEN = [[(1, 1)], [(17, 0), (0, 33), (129, 255), (255, 129)], [(300, 300), (1, 77), (64, 64)]]
# cu_seqlens the kernels must clamp: decreasing, negative, past the total.
BAD_CU_SEQLENS = ([0, 50, 30, 1000], [-5, 20, 10, 99])
# Hopper: (batch, seqlen_q, seqlen_k, heads, heads_kv, causal); N_q > N_k causal gives fully masked rows.
HOPPER_SHAPES = [
    (1, 1, 1, 2, 2, False),
    (2, 17, 17, 4, 2, True),
    (1, 113, 203, 4, 1, True),
    (1, 203, 113, 2, 2, True),
    (2, 129, 255, 4, 2, False),
]
HOPPER_FWD_DIMS = (64, 128, 256)
HOPPER_BWD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def relative_bias(score, b, h, q_idx, kv_idx, aux):
    return score + tl.load(aux[1] + (q_idx - kv_idx + 4096))


@triton.jit
def relative_bias_bwd(score, b, h, q_idx, kv_idx, aux):
    return score * 0.0 + 1.0


@triton.jit
def tanh_softcap(score, b, h, q_idx, kv_idx):
    return 8.0 * (1.0 - 2.0 / (tl.exp(score * 0.25) + 1.0))


@triton.jit
def tanh_softcap_bwd(score, b, h, q_idx, kv_idx):
    t = 1.0 - 2.0 / (tl.exp(score * 0.25) + 1.0)
    return 1.0 - t * t


@triton.jit
def odd_heads_window(b, h, q_idx, kv_idx):
    return ((kv_idx <= q_idx) & (kv_idx >= q_idx - 40)) | (h % 2 == 1)


@dataclass(frozen=True)
class Case:
    group: str
    label: str
    run: Callable[[], None]


@dataclass
class Target:
    """Where the cases run: the device, and the kernel entry points (or their stand-ins under --dry-run)."""

    device: str
    dry: bool
    kernels: SimpleNamespace
    hopper_skip: str | None = None


T: Target


def _checked(real: Callable, stand_in: Callable | None) -> Callable:
    """``real``'s arguments bound to its signature (a misspelt keyword fails here), then ``stand_in`` run."""

    def call(*args, **kwargs):
        inspect.signature(real).bind(*args, **kwargs)
        return stand_in(*args, **kwargs) if stand_in is not None else None

    return call


def make_target(dry: bool) -> Target:
    from flashtile.kernels._dropout import dropout_mask
    from flashtile.kernels.bwd import attn_bwd
    from flashtile.kernels.fwd import attn_fwd
    from flashtile.kernels.hopper import bwd as hopper_bwd
    from flashtile.kernels.hopper import fwd as hopper_fwd

    real = SimpleNamespace(
        fwd=attn_fwd,
        bwd=attn_bwd,
        hopper_fwd=hopper_fwd.attn_fwd,
        hopper_bwd=hopper_bwd.attn_bwd,
        dropout_mask=dropout_mask,
    )
    if not dry:
        major, minor = torch.cuda.get_device_capability()
        skip = None if major == 9 else f"compute capability {major}.{minor}, not 9.x"
        return Target("cuda", False, real, skip)
    from flashtile import reference

    os.environ["FLASHTILE_BACKEND"] = "reference"
    stand_ins = dict(
        fwd=reference.attn_fwd,
        bwd=reference.attn_bwd,
        hopper_fwd=reference.attn_fwd,
        hopper_bwd=reference.attn_bwd,
        dropout_mask=None,
    )
    kernels = SimpleNamespace(**{name: _checked(getattr(real, name), fn) for name, fn in stand_ins.items()})
    return Target("cpu", True, kernels)


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=T.device)


def int32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=T.device)


def finite(label: str, *tensors: torch.Tensor | None) -> None:
    if T.device == "cuda":
        torch.cuda.synchronize()
    bad = [i for i, t in enumerate(tensors) if t is not None and not torch.isfinite(t).all()]
    assert not bad, f"{label}: non-finite results {bad}"


def fwd_bwd(label: str, fwd: Callable, bwd: Callable, q, k, v, causal: bool, **kw) -> None:
    """Forward then backward; out and every gradient finite (lse is −inf on rows that see no key)."""
    scale = q.shape[-1] ** -0.5
    result = fwd(q, k, v, scale, causal, **kw)
    out, lse = result if result is not None else (None, None)
    dout = torch.randn_like(out) if out is not None else None
    grads = bwd(dout, q, k, v, out, lse, scale, causal, **kw) or ()
    finite(label, out, *grads)


def option_kwargs(options: dict, batch: int, heads: int) -> dict:
    kw = {key: value for key, value in options.items() if key != "alibi"}
    if options.get("alibi"):
        kw["alibi_slopes"] = torch.rand(batch, heads, device=T.device)
    if options.get("dropout_p"):
        kw["rng_state"] = torch.randint(-(2**62), 2**62, (2,), device=T.device)
    return kw


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def varlen_inputs(lengths, heads: int, heads_kv: int, d: int, dv: int, dtype):
    cu_q, cu_k = (int32([0, *torch.tensor(side).cumsum(0).tolist()]) for side in zip(*lengths, strict=True))
    q = randn(int(cu_q[-1]), heads, d, dtype=dtype)
    k = randn(int(cu_k[-1]), heads_kv, d, dtype=dtype)
    v = randn(int(cu_k[-1]), heads_kv, dv, dtype=dtype)
    varlen = dict(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(n for n, _ in lengths),
        max_seqlen_k=max(n for _, n in lengths),
    )
    return q, k, v, varlen


def portable_cases() -> Iterator[Case]:
    K = T.kernels
    for dtype in DTYPES:
        for batch, sq, sk, h, hkv, d, causal in SHAPES:
            for i, options in enumerate([{}, *OPTIONS]):
                label = (
                    f"portable {_name(dtype)} ({batch},{sq},{sk},{h},{hkv},{d}) causal={causal} options#{i}"
                )

                def run(label=label, dtype=dtype, shape=(batch, sq, sk, h, hkv, d, causal), options=options):
                    batch, sq, sk, h, hkv, d, causal = shape
                    q = randn(batch, sq, h, d, dtype=dtype)
                    k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
                    fwd_bwd(label, K.fwd, K.bwd, q, k, v, causal, **option_kwargs(options, batch, h))

                yield Case("portable", label, run)
        for lengths in VARLEN:
            for i, options in enumerate([{}, *OPTIONS]):
                for causal in (False, True):
                    label = f"portable {_name(dtype)} varlen {lengths} causal={causal} options#{i}"

                    def run(label=label, dtype=dtype, lengths=lengths, options=options, causal=causal):
                        q, k, v, varlen = varlen_inputs(lengths, 4, 2, 64, 64, dtype)
                        kw = option_kwargs(options, len(lengths), 4)
                        fwd_bwd(label, K.fwd, K.bwd, q, k, v, causal, **varlen, **kw)

                    yield Case("portable", label, run)

    def bad_cu_seqlens():
        bad_q, bad_k = (int32(cu) for cu in BAD_CU_SEQLENS)
        q = randn(60, 2, 64, dtype=torch.float16)
        k, v = (randn(40, 1, 64, dtype=torch.float16) for _ in range(2))
        bad = dict(cu_seqlens_q=bad_q, cu_seqlens_k=bad_k, max_seqlen_q=128, max_seqlen_k=128)
        # Clamped, not validated: the results are not meaningful, only the memory accesses are checked.
        if T.dry:
            return  # the reference validates instead of clamping; the kernels' signatures are checked above
        out, lse = K.fwd(q, k, v, 0.125, True, **bad)
        K.bwd(torch.randn_like(q), q, k, v, out, lse, 0.125, True, **bad)
        torch.cuda.synchronize()

    yield Case("portable", f"portable bad cu_seqlens {BAD_CU_SEQLENS}", bad_cu_seqlens)

    def dropout():
        K.dropout_mask(torch.randint(0, 2**62, (2,), device=T.device), 0.3, 2, 3, 97, 203)

    yield Case("portable", "portable dropout mask (2, 3, 97, 203) p=0.3", dropout)


def mods_cases() -> Iterator[Case]:
    from flashtile import BlockMask, create_block_mask, masks
    from flashtile.mods import Mods

    K = T.kernels

    def document_bias():
        # Document mask (3 documents) built from a mask_mod, a relative-position score_mod with its
        # derivative, GQA, N_q ≠ N_k, bf16.
        q, k, v = (
            randn(2, 113, 4, 64, dtype=torch.bfloat16),
            *(randn(2, 203, 2, 64, dtype=torch.bfloat16) for _ in range(2)),
        )
        aux = (masks.document_ids(int32([0, 50, 120, 203])), randn(8192) * 0.5)
        bm = create_block_mask(masks.document(), None, None, 113, 203, 64, T.device, aux)
        mods = Mods(bm, None, relative_bias, relative_bias_bwd, aux)
        fwd_bwd("mods document + relative bias", K.fwd, K.bwd, q, k, v, False, mods=mods)

    def random_tiles_sink():
        # Random tiles per head with an empty first query block, causal, MQA, a learnable sink, fp16.
        tiles = torch.rand(1, 2, 3, 4, device=T.device) < 0.5
        tiles[:, :, 0] = False
        bm = BlockMask.from_tiles(tiles, 129, 255, 64)
        q, k, v = (
            randn(1, 129, 2, 128, dtype=torch.float16),
            *(randn(1, 255, 1, 128, dtype=torch.float16) for _ in range(2)),
        )
        kw = dict(window_size=(-1, 0), mods=Mods(bm), learnable_sink=randn(2))
        fwd_bwd("mods random tiles + sink", K.fwd, K.bwd, q, k, v, True, **kw)

    def per_head_softcap_varlen_sink():
        # A per-head mask_mod with a softcap score_mod, varlen with an empty sequence, a sink, bf16.
        q, k, v, varlen = varlen_inputs([(70, 20), (33, 97), (0, 5)], 4, 2, 64, 64, torch.bfloat16)
        bm = create_block_mask(odd_heads_window, 3, 4, 70, 97, 32, T.device)
        mods = Mods(bm, None, tanh_softcap, tanh_softcap_bwd)
        kw = dict(mods=mods, learnable_sink=randn(4), **varlen)
        fwd_bwd("mods per-head window + softcap, varlen, sink", K.fwd, K.bwd, q, k, v, False, **kw)

    def sink_window():
        # learnable_sink alone, with a sliding window and GQA, D = 96, fp16.
        q, k, v = (
            randn(2, 97, 6, 96, dtype=torch.float16),
            *(randn(2, 131, 2, 96, dtype=torch.float16) for _ in range(2)),
        )
        kw = dict(window_size=(17, 3), learnable_sink=randn(6))
        fwd_bwd("sink + window (17, 3)", K.fwd, K.bwd, q, k, v, False, **kw)

    cases = [
        ("mods document mask + relative-bias score_mod, GQA 113x203 D64 bf16", document_bias),
        ("mods random tiles (empty query block) + sink, causal MQA 129x255 D128 fp16", random_tiles_sink),
        ("mods per-head mask_mod + softcap score_mod, varlen + sink D64 bf16", per_head_softcap_varlen_sink),
        ("mods learnable_sink + window (17, 3), GQA 97x131 D96 fp16", sink_window),
    ]
    # V head dims other than Q/K's: (batch, seqlen_q, seqlen_k, heads, heads_kv, D, D_v, causal, dtype).
    for batch, sq, sk, h, hkv, d, dv, causal, dtype in [
        (2, 113, 203, 4, 2, 192, 128, True, torch.bfloat16),
        (1, 129, 65, 2, 1, 192, 128, False, torch.float16),
        (1, 97, 63, 2, 1, 576, 512, True, torch.bfloat16),
        (2, 65, 100, 2, 2, 64, 24, False, torch.float16),
    ]:
        label = f"mods V head dim {d}/{dv} ({batch},{sq},{sk},{h},{hkv}) causal={causal} {_name(dtype)}"

        def run(label=label, shape=(batch, sq, sk, h, hkv, d, dv, causal, dtype)):
            batch, sq, sk, h, hkv, d, dv, causal, dtype = shape
            q, k, v = (
                randn(batch, sq, h, d, dtype=dtype),
                randn(batch, sk, hkv, d, dtype=dtype),
                randn(batch, sk, hkv, dv, dtype=dtype),
            )
            window = (-1, 0) if causal else (-1, -1)
            fwd_bwd(label, K.fwd, K.bwd, q, k, v, causal, window_size=window)

        cases.append((label, run))

    def dv_varlen_sink():
        q, k, v, varlen = varlen_inputs([(17, 0), (129, 255), (64, 33)], 4, 1, 192, 128, torch.bfloat16)
        fwd_bwd(
            "V head dim 192/128 varlen + sink", K.fwd, K.bwd, q, k, v, True, learnable_sink=randn(4), **varlen
        )

    cases.append(
        ("mods V head dim 192/128, varlen (an empty sequence) + sink, causal MQA bf16", dv_varlen_sink)
    )
    for label, run in cases:
        yield Case("mods", label, run)


def hopper_cases() -> Iterator[Case]:
    return _hopper_cases("hopper", HOPPER_FWD_DIMS, HOPPER_BWD_DIMS)


def hopper_d256_cases() -> Iterator[Case]:
    """The Gluon backward at D = 256 (the "dim" split), added after the ``hopper`` group's numbering."""
    return _hopper_cases("hopper_d256", (), (256,))


def _hopper_cases(group: str, fwd_dims: tuple[int, ...], bwd_dims: tuple[int, ...]) -> Iterator[Case]:
    """HOPPER_SHAPES through the Gluon forward at ``fwd_dims`` and its backward, reduce and deterministic,
    at ``bwd_dims`` (each backward case runs its forward first)."""
    K = T.kernels
    for i, (batch, sq, sk, h, hkv, causal) in enumerate(HOPPER_SHAPES):
        for d in sorted({*fwd_dims, *bwd_dims}):
            dtype = DTYPES[i % 2]
            shape = (batch, sq, sk, h, hkv, d, causal)
            fwd_label = f"hopper fwd {_name(dtype)} {shape}"

            def forward(label=fwd_label, shape=shape, dtype=dtype):
                batch, sq, sk, h, hkv, d, causal = shape
                q = randn(batch, sq, h, d, dtype=dtype)
                k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
                window = (-1, 0) if causal else (-1, -1)
                out, lse = K.hopper_fwd(q, k, v, d**-0.5, causal, window_size=window) or (None, None)
                finite(label, out)
                return q, k, v, out, lse

            if d in fwd_dims:
                yield Case(group, fwd_label, forward)
            if d not in bwd_dims:
                continue
            for deterministic in (False, True):
                label = f"hopper bwd {_name(dtype)} {shape} deterministic={deterministic}"

                def backward(label=label, forward=forward, shape=shape, deterministic=deterministic):
                    q, k, v, out, lse = forward()
                    causal, d = shape[-1], shape[-2]
                    window = (-1, 0) if causal else (-1, -1)
                    dout = torch.randn_like(q)
                    grads = K.hopper_bwd(
                        dout,
                        q,
                        k,
                        v,
                        out,
                        lse,
                        d**-0.5,
                        causal,
                        window_size=window,
                        deterministic=deterministic,
                    )
                    finite(label, *(grads or ()))

                yield Case(group, label, backward)


def _paged(k_cache: torch.Tensor, v_cache: torch.Tensor, page_size: int):
    """The contiguous caches cut into pages, shuffled, with the block table that reads them back."""
    batch, capacity = k_cache.shape[:2]
    pages = capacity // page_size
    perm = torch.randperm(batch * pages, device=T.device)
    paged = []
    for cache in (k_cache, v_cache):
        pool = torch.empty(batch * pages, page_size, *cache.shape[2:], dtype=cache.dtype, device=T.device)
        pool[perm] = cache.reshape(batch * pages, page_size, *cache.shape[2:])
        paged.append(pool)
    return (*paged, perm.view(batch, pages).to(torch.int32))


@dataclass(frozen=True)
class DecodeCase:
    seqlens: tuple[int, ...]
    capacity: int
    seqlen_q: int = 1
    seqlen_new: int = 1
    heads: tuple[int, int] = (8, 2)
    head_dim: int = 64
    page_size: int | None = None
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    rotary: str | None = None  # "gptj" (interleaved) or "neox", over half the head dim
    leftpad: tuple[int, ...] | None = None
    batch_idx: bool = False
    dtype: torch.dtype = torch.bfloat16


DECODE = [
    DecodeCase((0, 17, 250), 300),
    DecodeCase((5, 100, 303), 320, 4, 4, page_size=16, causal=True, rotary="gptj", leftpad=(0, 5, 100)),
    DecodeCase((0, 64, 511), 512, 2, 0, (4, 1), 128, 64, window=(100, 0), softcap=30.0, alibi=True),
    DecodeCase((3, 40, 200), 256, 5, 2, (6, 6), 256, rotary="neox", leftpad=(3, 0, 150), batch_idx=True),
    DecodeCase((0, 33, 90), 160, 33, 33, page_size=16, causal=True, rotary="neox", dtype=torch.float16),
    # The Hopper TMA decode kernel's paged boxes: pages of a whole tile and more at D = 128, row slices of
    # a tile (pages of 16) at D = 64 and, a column block at a time, at D = 128; last pages partly filled.
    DecodeCase((0, 255, 700), 768, 1, 1, (32, 8), 128, 256),
    DecodeCase((1, 47, 130), 144, 4, 1, (16, 4), 64, 16, causal=True),
    DecodeCase((2, 80, 161), 176, 2, 1, (8, 2), 128, 16, window=(50, 0)),
]


def describe(c: DecodeCase) -> str:
    """The fields of ``c`` that differ from the defaults."""
    default = DecodeCase(c.seqlens, c.capacity)
    changed = [
        f"{f}={getattr(c, f)}"
        for f in DecodeCase.__dataclass_fields__
        if getattr(c, f) != getattr(default, f)
    ]
    return " ".join([f"seqlens={c.seqlens} capacity={c.capacity}", *changed]).replace("torch.", "")


def decode_cases() -> Iterator[Case]:
    from flashtile import apply_rotary_emb, flash_attn_with_kvcache

    for c in DECODE:
        # Past 16 queries the call gathers the pages for the varlen kernel: no split-KV, num_splits unused.
        for num_splits in (1, 3) if c.seqlen_q <= 16 else (0,):
            label = f"decode {describe(c)} num_splits={num_splits}"

            def run(label=label, c=c, num_splits=num_splits):
                batch, (h, hkv), d = len(c.seqlens), c.heads, c.head_dim
                rows = batch + 1 if c.batch_idx else batch
                k_cache, v_cache = (randn(rows, c.capacity, hkv, d, dtype=c.dtype) for _ in range(2))
                kw = dict(cache_seqlens=int32(c.seqlens), causal=c.causal, window_size=c.window)
                kw.update(softcap=c.softcap, num_splits=num_splits, return_softmax_lse=True)
                if c.page_size:
                    k_cache, v_cache, kw["block_table"] = _paged(k_cache, v_cache, c.page_size)
                if c.seqlen_new:
                    kw["k"], kw["v"] = (randn(batch, c.seqlen_new, hkv, d, dtype=c.dtype) for _ in range(2))
                if c.rotary:
                    angle = torch.rand(c.capacity, d // 4, device=T.device) * 6.3
                    kw.update(
                        rotary_cos=angle.cos(), rotary_sin=angle.sin(), rotary_interleaved=c.rotary == "gptj"
                    )
                if c.leftpad:
                    kw["cache_leftpad"] = int32(c.leftpad)
                if c.batch_idx:
                    kw["cache_batch_idx"] = int32(list(range(batch))[::-1])
                if c.alibi:
                    kw["alibi_slopes"] = torch.rand(batch, h, device=T.device)
                q = randn(batch, c.seqlen_q, h, d, dtype=c.dtype)
                out, _ = flash_attn_with_kvcache(q, k_cache, v_cache, **kw)
                finite(label, out)

            yield Case("decode", label, run)

    def rotary_dense():
        x = randn(3, 37, 4, 96, dtype=torch.bfloat16)
        angle = torch.rand(64, 24, device=T.device) * 6.3
        offsets = int32([0, 5, 27])
        out = apply_rotary_emb(
            x, angle.cos(), angle.sin(), interleaved=True, inplace=True, seqlen_offsets=offsets
        )
        finite("rotary dense", out)

    def rotary_varlen_backward():
        x = randn(90, 3, 64, dtype=torch.float16).requires_grad_()
        angle = torch.rand(128, 16, device=T.device) * 6.3
        cu = int32([0, 0, 17, 90])
        out = apply_rotary_emb(x, angle.cos(), angle.sin(), seqlen_offsets=3, cu_seqlens=cu, max_seqlen=73)
        out.backward(torch.randn_like(out))
        finite("rotary varlen backward", out, x.grad)

    yield Case(
        "decode",
        "decode apply_rotary_emb (3, 37, 4, 96) bf16 GPT-J, offsets per sequence, in place",
        rotary_dense,
    )
    yield Case(
        "decode",
        "decode apply_rotary_emb varlen (0, 17, 73 tokens) fp16 GPT-NeoX, rotary_dim 32, backward",
        rotary_varlen_backward,
    )


# (options, packed?) of the Gluon option cases: causal throughout (windows bottom-right aligned).
HOPPER_OPTIONS = [
    ({}, True),
    (dict(window_size=(37, 0), softcap=20.0, alibi=True), True),
    (dict(window_size=(5, 0), softcap=5.0), False),
    (dict(window_size=(-1, 0), alibi=True), False),
]
HOPPER_PACKED = [(17, 17), (0, 5), (129, 255), (64, 33)]


def _gluon_option_cases(group: str, option_list: list[tuple[dict, bool]]) -> Iterator[Case]:
    """The Gluon forward and backward (causal, GQA 4/2) at each head dim the backward takes, for each
    (options, packed?) of ``option_list``: dense (2, 77, 129) or the packed batch HOPPER_PACKED."""
    K = T.kernels
    for i, (options, packed) in enumerate(option_list):
        for d in HOPPER_BWD_DIMS:
            dtype = DTYPES[i % 2]
            form = f"packed {HOPPER_PACKED}" if packed else "(2, 77, 129, 4, 2)"
            label = f"{group} fwd+bwd {_name(dtype)} D={d} {form} {options}"

            def run(label=label, options=options, packed=packed, d=d, dtype=dtype):
                if packed:
                    q, k, v, varlen = varlen_inputs(HOPPER_PACKED, 4, 2, d, d, dtype)
                    batch = len(HOPPER_PACKED)
                else:
                    q = randn(2, 77, 4, d, dtype=dtype)
                    k, v = (randn(2, 129, 2, d, dtype=dtype) for _ in range(2))
                    varlen, batch = {}, 2
                kw = option_kwargs(options, batch, 4)
                kw.setdefault("window_size", (-1, 0))
                fwd_bwd(label, K.hopper_fwd, K.hopper_bwd, q, k, v, True, **kw, **varlen)

            yield Case(group, label, run)


def hopper_option_cases() -> Iterator[Case]:
    yield from _gluon_option_cases("hopper_options", HOPPER_OPTIONS)
    K = T.kernels
    for d in HOPPER_BWD_DIMS:

        def bad_cu_seqlens(d=d):
            # The packed kernels clamp, not validate: decreasing, negative and past-the-total boundaries
            # (the backward's statistics offsets of overlapping sequences overlap too); only the memory
            # accesses are checked.
            bad_q, bad_k = (int32(cu) for cu in BAD_CU_SEQLENS)
            q = randn(60, 4, d, dtype=torch.bfloat16)
            k, v = (randn(40, 2, d, dtype=torch.bfloat16) for _ in range(2))
            bad = dict(cu_seqlens_q=bad_q, cu_seqlens_k=bad_k, max_seqlen_q=128, max_seqlen_k=128)
            if T.dry:
                return  # the reference validates instead of clamping
            out, lse = K.hopper_fwd(q, k, v, 0.125, True, window_size=(-1, 0), **bad)
            K.hopper_bwd(torch.randn_like(q), q, k, v, out, lse, 0.125, True, window_size=(-1, 0), **bad)
            torch.cuda.synchronize()

        yield Case("hopper_options", f"hopper_options D={d} bad cu_seqlens {BAD_CU_SEQLENS}", bad_cu_seqlens)


# Dropout in the Gluon kernels (the mask drawn in the accumulator's layout), with the options and packed.
HOPPER_DROPOUT = [
    (dict(dropout_p=0.2), False),
    (dict(dropout_p=0.1), True),
    (dict(window_size=(37, 0), softcap=20.0, alibi=True, dropout_p=0.3), False),
]


def hopper_dropout_cases() -> Iterator[Case]:
    yield from _gluon_option_cases("hopper_dropout", HOPPER_DROPOUT)


# Block masks in the Gluon kernels: (batch, N_q, N_k, heads, heads_kv, block size, mask, causal); "tiles" are
# random tile states (empty, partial, full; query block 0 empty), the others create_block_mask of a mask_mod.
HOPPER_SPARSE = [
    (2, 300, 257, 4, 2, (128, 128), "tiles", False),
    (1, 129, 700, 2, 2, (256, 128), "tiles", True),
    (1, 515, 515, 4, 4, (128, 256), "causal", False),
    (2, 333, 333, 4, 1, (128, 128), "document", True),
]


def hopper_sparse_cases() -> Iterator[Case]:
    from flashtile import BlockMask, create_block_mask, masks
    from flashtile.mods import Mods

    K = T.kernels
    for i, (batch, sq, sk, h, hkv, block, mask, causal) in enumerate(HOPPER_SPARSE):
        for d in HOPPER_BWD_DIMS:
            dtype = DTYPES[i % 2]
            shape = (batch, sq, sk, h, hkv)
            label = f"hopper_sparse fwd+bwd {_name(dtype)} D={d} {shape} {block} {mask} causal={causal}"

            def run(label=label, shape=shape, block=block, mask=mask, causal=causal, d=d, dtype=dtype):
                batch, sq, sk, h, hkv = shape
                aux = None
                if mask == "tiles":
                    nq, nk = -(-sq // block[0]), -(-sk // block[1])
                    states = torch.randint(0, 3, (batch, 1, nq, nk), device=T.device)
                    states[:, :, 0] = 0
                    bm = BlockMask.from_states(states, sq, sk, block)
                else:
                    if mask == "document":
                        aux = (masks.document_ids(int32([0, 100, 101, sq])),)
                    mask_mod = masks.document() if mask == "document" else masks.causal
                    bm = create_block_mask(mask_mod, None, None, sq, sk, block, T.device, aux)
                q = randn(batch, sq, h, d, dtype=dtype)
                k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
                window = (-1, 0) if causal else (-1, -1)
                mods = Mods(bm, None, None, None, aux)
                fwd_bwd(label, K.hopper_fwd, K.hopper_bwd, q, k, v, causal, window_size=window, mods=mods)

            yield Case("hopper_sparse", label, run)


# (batch, seqlen_q, seqlen_k, heads, heads_kv): at least 210 work tiles of 128 rows, above an H100's or
# H200's 132 SMs, N_k ≤ 2048 (the persistent grid's reach at D = 128).
PERSISTENT_SHAPES = [(5, 777, 901, 6, 3), (9, 300, 129, 12, 4), (2, 2047, 2000, 8, 8)]


def hopper_persistent_cases() -> Iterator[Case]:
    K = T.kernels
    for i, shape in enumerate(PERSISTENT_SHAPES):
        for d in (64, 128):
            dtype = DTYPES[i % 2]
            label = f"hopper_persistent fwd+bwd {_name(dtype)} {(*shape, d)}"

            def run(label=label, shape=shape, d=d, dtype=dtype):
                batch, sq, sk, h, hkv = shape
                q = randn(batch, sq, h, d, dtype=dtype)
                k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
                fwd_bwd(label, K.hopper_fwd, K.hopper_bwd, q, k, v, False, window_size=(-1, -1))

            yield Case("hopper_persistent", label, run)


# (batch, seqlen_q, seqlen_k, heads, heads_kv, head dim, causal, window, forced consumers or None).
THREE_AND_WINDOW_CASES = [
    (2, 2100, 2047, 8, 2, 64, False, (-1, -1), None),
    (1, 4100, 4099, 4, 1, 64, True, (-1, 0), None),
    (2, 203, 113, 4, 2, 64, True, (-1, 0), "3"),
    (3, 113, 203, 4, 4, 64, False, (-1, -1), "3"),
    (4, 2000, 1999, 8, 2, 128, True, (256, 0), None),
    (3, 1500, 777, 8, 1, 64, False, (100, 50), None),
    (3, 1000, 300, 8, 2, 128, False, (0, 0), None),
]


# Causal and right-bounded windows on the persistent grid: pairs of row blocks (≥ 132, an H100's or H200's
# SMs), even and odd row-block and (batch · heads) counts, N_q > N_k, three consumers (N_q ≥ 4096).
PAIRED_CASES = [
    (12, 1023, 1025, 4, 2, 64, True, (-1, 0), None),
    (13, 1100, 1100, 3, 3, 128, True, (-1, 0), None),
    (13, 1500, 777, 3, 1, 128, True, (-1, 0), None),
    (16, 777, 900, 3, 1, 64, False, (-1, 100), None),
    (5, 4100, 4099, 3, 1, 64, True, (-1, 0), None),
    # Three consumers forced, causal in pairs: the lower warpgroups release the tiles past their rows unread.
    (12, 2100, 2100, 4, 2, 64, True, (-1, 0), "3"),
    (13, 2500, 1500, 4, 1, 64, True, (-1, 0), "3"),
]


# D = 256 on the persistent forward grid (the output staged in the one Q buffer, K/V loaded ahead of Q):
# several work tiles a program, dense and causal in pairs, N_q > N_k (tiles whose rows see no key).
D256_PERSISTENT_CASES = [
    (8, 1023, 1025, 4, 2, 256, False, (-1, -1), None),
    (12, 1100, 1100, 4, 2, 256, True, (-1, 0), None),
    (13, 1500, 777, 3, 1, 256, True, (-1, 0), None),
]


# Softcap, ALiBi and dropout on the persistent forward grid (kernels/hopper/fwd.py, runs_persistent): (batch,
# seqlen_q, seqlen_k, heads, heads_kv, head dim, causal, options), more work tiles (or causal pairs) than
# SMs, N_q > N_k causal (tiles whose rows see no key), D = 256 through the one Q buffer (forward only: the
# Hopper backward takes neither softcap nor ALiBi there).
PERSISTENT_OPTION_CASES = [
    (8, 1023, 1025, 4, 2, 64, False, dict(softcap=30.0, dropout_p=0.1)),
    (12, 1100, 1100, 4, 4, 128, True, dict(alibi=True)),
    (13, 1500, 777, 3, 1, 128, True, dict(softcap=20.0, alibi=True, dropout_p=0.2)),
    (8, 777, 1500, 4, 4, 128, False, dict(dropout_p=0.15)),
    (12, 1100, 1100, 4, 2, 256, True, dict(softcap=10.0, alibi=True)),
]


def hopper_persistent_option_cases() -> Iterator[Case]:
    K = T.kernels
    for i, (batch, sq, sk, h, hkv, d, causal, options) in enumerate(PERSISTENT_OPTION_CASES):
        dtype = DTYPES[i % 2]
        shape = (batch, sq, sk, h, hkv, d)
        passes = "fwd+bwd" if d <= 128 else "fwd"
        label = f"hopper_persistent_options {passes} {_name(dtype)} {shape} causal={causal} {options}"

        def run(label=label, shape=shape, causal=causal, options=options, dtype=dtype):
            batch, sq, sk, h, hkv, d = shape
            q = randn(batch, sq, h, d, dtype=dtype)
            k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
            kw = option_kwargs(options, batch, h)
            window = (-1, 0) if causal else (-1, -1)
            bwd = K.hopper_bwd if d <= 128 else lambda *args, **kwargs: None
            fwd_bwd(label, K.hopper_fwd, bwd, q, k, v, causal, window_size=window, **kw)

        yield Case("hopper_persistent_options", label, run)


# A learnable sink in the Gluon forward (kernels/hopper/fwd.py, HAS_SINK): (batch, seqlen_q, seqlen_k, heads,
# heads_kv, head dim, causal, options); the last case packed, with sequences that see no key.
SINK_CASES = [
    (8, 1023, 1025, 4, 2, 64, False, {}),
    (2, 4100, 4099, 4, 2, 64, True, {}),
    (13, 1500, 777, 3, 1, 128, True, dict(alibi=True, dropout_p=0.2)),
    (13, 777, 1500, 3, 1, 64, True, dict(alibi=True, dropout_p=0.2)),
    (12, 1100, 1100, 4, 2, 256, True, dict(softcap=10.0)),
    (1, [(300, 200), (0, 5), (129, 255), (64, 0)], None, 4, 2, 128, True, {}),
    (1, [(300, 200), (0, 5), (129, 255), (64, 0)], None, 4, 2, 64, False, dict(window_size=(50, 7))),
]


def hopper_sink_cases() -> Iterator[Case]:
    K = T.kernels
    for i, (batch, sq, sk, h, hkv, d, causal, options) in enumerate(SINK_CASES):
        dtype = DTYPES[i % 2]
        shape = ("packed", sq) if sk is None else (batch, sq, sk, h, hkv, d)
        label = f"hopper_sink fwd+bwd {_name(dtype)} D={d} {shape} causal={causal} {options}"

        def run(
            label=label,
            batch=batch,
            sq=sq,
            sk=sk,
            h=h,
            hkv=hkv,
            d=d,
            causal=causal,
            options=options,
            dtype=dtype,
        ):
            if sk is None:
                q, k, v, varlen = varlen_inputs(sq, h, hkv, d, d, dtype)
            else:
                q = randn(batch, sq, h, d, dtype=dtype)
                k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
                varlen = {}
            kw = dict(option_kwargs(options, batch, h), learnable_sink=torch.randn(h, device=T.device))
            window = kw.pop("window_size", (-1, 0) if causal else (-1, -1))
            # The Gluon backward sums the sink's gradient at D = 64 and 128 without softcap; the portable
            # one else.
            bwd = K.hopper_bwd if d in (64, 128) and not options.get("softcap") else K.bwd
            fwd_bwd(label, K.hopper_fwd, bwd, q, k, v, causal, window_size=window, **kw, **varlen)

        yield Case("hopper_sink", label, run)


def hopper_three_cases() -> Iterator[Case]:
    return _consumer_cases("hopper_three", THREE_AND_WINDOW_CASES)


def hopper_paired_cases() -> Iterator[Case]:
    return _consumer_cases("hopper_paired", PAIRED_CASES)


def hopper_d256_persistent_cases() -> Iterator[Case]:
    return _consumer_cases("hopper_d256_persistent", D256_PERSISTENT_CASES)


def _consumer_cases(group: str, cases: list[tuple]) -> Iterator[Case]:
    """The Gluon forward and backward at each case's (batch, seqlen_q, seqlen_k, heads, heads_kv, head
    dim, causal, window, forced consumers or None)."""
    from flashtile.kernels.hopper.fwd import CONSUMERS_ENV

    K = T.kernels
    for i, (batch, sq, sk, h, hkv, d, causal, window, forced) in enumerate(cases):
        dtype = DTYPES[i % 2]
        shape = (batch, sq, sk, h, hkv, d)
        label = f"{group} fwd+bwd {_name(dtype)} {shape} {window} consumers={forced}"

        def run(label=label, shape=shape, causal=causal, window=window, forced=forced, dtype=dtype):
            batch, sq, sk, h, hkv, d = shape
            q = randn(batch, sq, h, d, dtype=dtype)
            k, v = (randn(batch, sk, hkv, d, dtype=dtype) for _ in range(2))
            before = os.environ.pop(CONSUMERS_ENV, None)
            if forced is not None:
                os.environ[CONSUMERS_ENV] = forced
            try:
                fwd_bwd(label, K.hopper_fwd, K.hopper_bwd, q, k, v, causal, window_size=window)
            finally:
                os.environ.pop(CONSUMERS_ENV, None)
                if before is not None:
                    os.environ[CONSUMERS_ENV] = before

        yield Case(group, label, run)


# The float8 forward: (batch, seqlen_q, seqlen_k, heads, heads_kv, options).
FP8_CASES = [
    (1, 1, 1, 2, 2, {}),
    (2, 17, 33, 4, 2, {"causal": True}),
    (1, 203, 113, 4, 1, {"window_size": (40, 7)}),
    (2, 129, 255, 4, 2, {"causal": True, "softcap": 20.0}),
    (1, 300, 77, 2, 2, {"window_size": (0, 0)}),
]


def fp8_cases() -> Iterator[Case]:
    from flashtile import flash_attn_fp8_func, quantize_fp8

    for batch, sq, sk, h, hkv, options in FP8_CASES:
        for d in HOPPER_FWD_DIMS:
            label = f"fp8 fwd D={d} {(batch, sq, sk, h, hkv)} {options}"

            def run(label=label, shape=(batch, sq, sk, h, hkv), d=d, options=options):
                batch, sq, sk, h, hkv = shape
                q8, qd = quantize_fp8(randn(batch, sq, h, d), group=h // hkv)
                (k8, kd), (v8, vd) = (quantize_fp8(randn(batch, sk, hkv, d)) for _ in range(2))
                out, _ = flash_attn_fp8_func(q8, k8, v8, qd, kd, vd, return_softmax_lse=True, **options)
                finite(label, out)

            yield Case("fp8", label, run)


BUILDERS = {
    "hopper": hopper_cases,
    "decode": decode_cases,
    "mods": mods_cases,
    "portable": portable_cases,
    "hopper_options": hopper_option_cases,
    "hopper_sparse": hopper_sparse_cases,
    "hopper_dropout": hopper_dropout_cases,
    "hopper_persistent": hopper_persistent_cases,
    "hopper_three": hopper_three_cases,
    "hopper_paired": hopper_paired_cases,
    "hopper_d256": hopper_d256_cases,
    "hopper_d256_persistent": hopper_d256_persistent_cases,
    "fp8": fp8_cases,
    "hopper_persistent_options": hopper_persistent_option_cases,
    "hopper_sink": hopper_sink_cases,
}


def parse_groups(text: str | None) -> list[str]:
    if not text:
        return list(GROUPS)
    chosen = [g.strip() for g in text.split(",") if g.strip()]
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown or not chosen:
        raise SystemExit(f"--only {text!r}: groups are {', '.join(GROUPS)} (comma-separated)")
    return chosen


def parse_shard(text: str) -> tuple[int, int]:
    try:
        shard, shards = (int(x) for x in text.split("/"))
    except ValueError:
        shard, shards = -1, 0
    if not 0 <= shard < shards:
        raise SystemExit(f"FLASHTILE_SANITIZE_SHARD={text!r}: expected i/n with 0 ≤ i < n, e.g. 3/8")
    return shard, shards


def main() -> int:
    global T
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", help=f"comma-separated groups to run, of {', '.join(GROUPS)} (default: all)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="build and run every case on the CPU reference"
    )
    parser.add_argument("--list", action="store_true", help="print the grid without running it")
    parser.add_argument(
        "--start", type=int, default=1, help="skip the cases numbered below this (to finish a cut-off run)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each case this many times: from the second, launches relaunch directly (the compiled "
        "kernel's launcher, the Gluon kernels' cached TMA tensor maps) instead of through Triton",
    )
    args = parser.parse_args()
    if args.repeat < 1:
        raise SystemExit(f"--repeat must be at least 1, got {args.repeat}")
    groups = parse_groups(args.only)
    shard, shards = parse_shard(os.environ.get("FLASHTILE_SANITIZE_SHARD", "0/1"))
    if not args.dry_run and not args.list and not torch.cuda.is_available():
        print(
            "sanitize_kernels: torch sees no CUDA device (use --dry-run or --list on the CPU)",
            file=sys.stderr,
        )
        return 2
    T = make_target(args.dry_run or args.list)
    torch.manual_seed(0)
    ran = dict.fromkeys(groups, 0)
    skipped = dict.fromkeys(groups, 0)
    index = 0
    for group in groups:
        gluon = group.startswith("hopper")
        if gluon and T.hopper_skip:
            print(f"{group}: skipped ({T.hopper_skip})", flush=True)
        for case in BUILDERS[group]():
            index += 1
            skip = index < args.start or (index - 1) % shards != shard
            if skip or (gluon and T.hopper_skip):
                skipped[group] += 1
                continue
            print(f"[{index}] {case.label}", flush=True)
            if not args.list:
                for _ in range(args.repeat):
                    case.run()
            ran[group] += 1
    verb = "listed" if args.list else "dry-run on the CPU reference" if args.dry_run else "finished"
    counts = ", ".join(
        f"{group} {ran[group]}" + (f" (+{skipped[group]} skipped)" if skipped[group] else "")
        for group in groups
    )
    print(f"sanitizer grid: {sum(ran.values())} cases {verb}: {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
