"""Compile the Gluon kernels for sm_90 on any machine, GPU or not, and report what the compiler made.

Gluon does not run in Triton's interpreter, so CPU CI proves instead that every configuration the
dispatcher can pick compiles, uses wgmma and TMA and does not spill (flashtile.kernels.sm90_compile has
the report). Run a compile in a subprocess: a compiler abort ends the whole process.

    python -m flashtile.kernels.hopper.sm90_compile fwd 128 causal bf16
    python -m flashtile.kernels.hopper.sm90_compile fwd 128 window+softcap+alibi bf16
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import asdict

from flashtile.kernels.sm90_compile import CompileReport, report

# The dtypes of the fast path, by the names Triton's signatures use.
DTYPES = ("fp16", "bf16")


# The sequence length the variants are configured for (window bounds are clamped by it; the grid's choice
# reads it).
SEQLEN = 1024
# Launcher options of each variant word; a variant joins words with "+" ("causal+softcap+alibi"). Window
# bounds and slopes are runtime values: "window" and "left", "alibi" and "alibi2d" compile the same kernel,
# named apart to show that each launch reaches a compiled configuration.
FWD_OPTION_WORDS = {
    "full": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(256, 128)),
    "left": dict(window_size=(17, -1)),
    "softcap": dict(softcap=30.0),
    "alibi": dict(alibi="H"),
    "alibi2d": dict(alibi="BH"),
    # Dropout: the Philox draws of kernels/_dropout.py in the accumulator's layout (hopper/dropout.py).
    "dropout": dict(dropout_p=0.1),
    # Packed batches (cu_seqlens): rank-3 descriptors, pointer stores of the output.
    "varlen": dict(varlen=True),
    # A block mask of 128-row blocks: the listed key blocks of each query block.
    "sparse": dict(sparse=True),
    # With a mask_mod in its partial blocks (flashtile.masks.causal: no aux tensors).
    "mod": dict(sparse=True, mask_mod=True),
    # With its mask bits in place of the mask_mod (create_block_mask's masks: kernels/_mask_bits.py).
    "bits": dict(sparse=True, mask_mod="bits"),
    # Three consumer warpgroups (D = 64 at long rows: fwd.consumer_count).
    "three": dict(consumers=3),
    # The short causal rows' 64-key tiles at D = 64 (configs.short_causal), each consumer on its own tiles.
    "short": {},
    # A learnable sink, folded into each row's softmax after its last key tile.
    "sink": dict(sink=True),
}
# Option variants compiled for every head dim in bf16, and the combination in fp16 too (the two dtypes
# differ in their conversions only, and dense and causal compile in both).
FWD_OPTION_VARIANTS = (
    "window", "causal+window", "left", "softcap", "alibi", "alibi2d", "causal+softcap+alibi",
    "window+softcap+alibi", "dropout", "causal+dropout", "window+softcap+alibi+dropout",
)  # fmt: skip
# Varlen variants, compiled for every head dim in both dtypes (docs/design/hopper.md, "Variable length").
FWD_VARLEN_VARIANTS = ("varlen", "varlen+causal", "varlen+window+softcap+alibi", "varlen+causal+dropout")
# Learnable-sink variants, compiled for every head dim in bf16.
FWD_SINK_VARIANTS = ("causal+sink", "window+softcap+alibi+dropout+sink", "varlen+causal+sink")
# Block-sparse variants, compiled for every head dim in bf16 (and the plain one in fp16).
FWD_SPARSE_VARIANTS = ("sparse", "sparse+causal", "mod", "bits")


def fwd_configurations() -> list[tuple[int, str, str]]:
    """Every (head dim, variant, dtype) the dispatcher can send to the Gluon forward: dense and causal in
    both dtypes, and the option variants (:data:`FWD_OPTION_VARIANTS`)."""
    from flashtile.kernels.configs import HOPPER_FWD_HEAD_DIMS

    cases = [(d, v, t) for d in HOPPER_FWD_HEAD_DIMS for v in ("full", "causal") for t in DTYPES]
    cases += [(d, v, "bf16") for d in HOPPER_FWD_HEAD_DIMS for v in FWD_OPTION_VARIANTS]
    cases += [(d, "window+softcap+alibi", "fp16") for d in HOPPER_FWD_HEAD_DIMS]
    cases += [(d, v, t) for d in HOPPER_FWD_HEAD_DIMS for v in FWD_VARLEN_VARIANTS for t in DTYPES]
    cases += [(d, "sparse", "fp16") for d in HOPPER_FWD_HEAD_DIMS]
    cases += [(d, v, "bf16") for d in HOPPER_FWD_HEAD_DIMS for v in FWD_SPARSE_VARIANTS]
    # Three consumer warpgroups, and the short causal rows' tiles: D = 64 only, both dtypes.
    cases += [(64, v, t) for v in ("full+three", "causal+three", "causal+short") for t in DTYPES]
    # A learnable sink (the epilogue only): every head dim, with the options and packed batches it meets.
    cases += [(d, v, "bf16") for d in HOPPER_FWD_HEAD_DIMS for v in FWD_SINK_VARIANTS]
    cases += [(64, "causal+three+sink", "bf16")]
    # The float8 forward (flashtile.fp8): dense and causal at every head dim, windows and softcap at 128.
    cases += [(d, v, "fp8e4nv") for d in HOPPER_FWD_HEAD_DIMS for v in ("full", "causal")]
    cases += [(128, "window+softcap", "fp8e4nv")]
    return cases


def fwd_options(variant: str, block_n: int, seqlen: int = SEQLEN) -> dict[str, object]:
    """The kernel's option arguments (:func:`flashtile.kernels.hopper.fwd.option_arguments`, and the block
    mask's of ``sparse_arguments``) for a variant at N_q = N_k = ``seqlen`` and key tiles of ``block_n``,
    as the launcher computes them."""
    import torch

    from flashtile.kernels.fwd import alibi_stride_b
    from flashtile.kernels.hopper import fwd

    words = variant.split("+")
    unknown = set(words) - set(FWD_OPTION_WORDS)
    if unknown:
        raise ValueError(f"unknown variant words {sorted(unknown)}; accepted: {sorted(FWD_OPTION_WORDS)}")
    opts: dict[str, object] = {}
    for word in words:
        opts.update(FWD_OPTION_WORDS[word])
    causal = bool(opts.get("causal"))
    left, right = opts.get("window_size", (-1, -1))
    window = (left, 0 if causal else right)
    slopes = {None: None, "H": torch.ones(4), "BH": torch.ones(2, 4)}[opts.get("alibi")]
    softcap = opts.get("softcap", 0.0)
    args = fwd.option_arguments(
        0.125, causal, window, softcap, alibi_stride_b(slopes), seqlen, seqlen, opts.get("dropout_p", 0.0)
    )
    sparse = None
    if opts.get("sparse"):
        from flashtile import masks

        bits = opts.get("mask_mod") == "bits"
        mask_mod = masks.causal if opts.get("mask_mod") is True else None
        sparse = (128, 128, (0, 0, seqlen // 128), mask_mod, False, bits)
    return {
        **args, "IS_VARLEN": bool(opts.get("varlen")), "CONSUMERS": opts.get("consumers", 2),
        **fwd.sparse_arguments(sparse, block_n), "HAS_SINK": bool(opts.get("sink")),
    }  # fmt: skip


def _descriptor_type(
    dtype: str, rows: int, head_dim: int, varlen: bool = False, transposed: bool = False
) -> str:
    from triton.experimental.gluon import language as gl

    block = [rows, 1, head_dim] if varlen else [1, rows, 1, head_dim]
    gl_dtype = {"fp16": gl.float16, "bf16": gl.bfloat16, "fp8e4nv": gl.float8e4nv}[dtype]
    if transposed:
        # Vᵀ (B, H_KV, D, N) of the float8 forward, in [D, rows] boxes.
        block = [1, 1, head_dim, rows]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def compile_fwd(head_dim: int, variant: str, dtype: str) -> CompileReport:
    """Compile the Gluon forward in this process, as the launcher configures it for these arguments;
    ``variant``: words of :data:`FWD_OPTION_WORDS` joined with "+"; ``dtype`` "fp8e4nv": the float8
    forward (Vᵀ's descriptor, a bf16 output, one program a work tile)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from flashtile.kernels import configs
    from flashtile.kernels.hopper import fwd

    fp8 = dtype == "fp8e4nv"
    # The launcher's tiling: plain calls (dense or causal, with two or three consumers) have their own
    # (fwd.plain_call).
    plain = not fp8 and set(variant.split("+")) <= {"full", "causal", "three", "short"}
    cfg = configs.hopper_fwd_config(head_dim, plain, "short" in variant.split("+"))
    rows = fwd.WG_ROWS.value
    options = fwd_options(variant, cfg.BLOCK_N, SEQLEN)
    varlen = options["IS_VARLEN"]
    signature = dict(
        q_desc=_descriptor_type(dtype, rows, head_dim, varlen),
        k_desc=_descriptor_type(dtype, cfg.BLOCK_N, head_dim, varlen),
        v_desc=_descriptor_type(dtype, cfg.BLOCK_N, head_dim, varlen, transposed=fp8),
        o_desc=_descriptor_type("bf16" if fp8 else dtype, rows, head_dim, varlen),
        lse_ptr="*fp32",
        alibi_ptr="*fp32",
        # Dense launches pass the LSE for the pointers they do not use.
        o_ptr=f"*{dtype}" if varlen else "*fp32",
        cu_seqlens_q_ptr="*i32" if varlen else "*fp32",
        cu_seqlens_k_ptr="*i32" if varlen else "*fp32",
        seqlen_q="i32",
        seqlen_k="i32",
        num_m_blocks="i32",
        total_work="i32",
        H="i32",
        GROUP="i32",
        **dict.fromkeys(fwd.DIVIDER_ARGS, "i32"),
        qk_scale="fp32",
        window_left="i32",
        window_right="i32",
        softcap_qk="fp32",
        softcap_out="fp32",
        stride_alibi_b="i32",
        # The launcher passes rng_state (int64) with dropout, the LSE without.
        rng_state_ptr="*i64" if options["HAS_DROPOUT"] else "*fp32",
        # The float8 forward's descales (fp32); the LSE without.
        descale_ptr="*fp32",
        # The learnable sink (fp32), or the LSE without.
        sink_ptr="*fp32",
        dropout_threshold="i32",
        dropout_keep_frac="fp32",
        list_stride_b="i32",
        list_stride_h="i32",
        list_row_len="i32",
        # The launcher passes a block mask's int32 lists, or the LSE for them without one.
        **dict.fromkeys(
            ("kv_count_ptr", "kv_index_ptr", "full_kv_count_ptr", "full_kv_index_ptr"),
            "*i32" if options["SPARSE_TILES"] else "*fp32",
        ),
    )
    switches = {name: value for name, value in options.items() if name.isupper()}
    # The launcher's share of the exponentials on the FMA pipes (EXP2_POLY_ENV).
    switches["EXP2_SHARE"] = fwd.exp2_share(
        {**switches, "HEAD_DIM": head_dim}, os.environ.get(fwd.EXP2_POLY_ENV, "")
    )
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=cfg.BLOCK_N, STAGES=cfg.STAGES, **switches)
    # The grid the launcher picks: persistent for equal-cost work tiles (plain, sliding windows) that fit.
    persistent = not fp8 and fwd.runs_persistent({**options, **constexprs, "seqlen_k": SEQLEN})
    constexprs["PERSISTENT"] = fwd.persistent_mode(constexprs, persistent)
    constexprs["Q_BUFS"] = fwd.q_buffers({**constexprs, "seqlen_k": SEQLEN})
    constexprs["PINGPONG"] = fwd.pingpong(constexprs, os.environ.get(fwd.PINGPONG_ENV, ""))
    if options["MASK_BITS"]:
        # The mask bits' tensors: tile ids, words and their layout (int32).
        signature["aux"] = ("*i32", "*i32", "*i32")
    else:
        # No aux tensors: Triton takes a None argument as a constexpr.
        constexprs["aux"] = None
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    assert set(signature) == set(fwd.attn_fwd_kernel.arg_names), "the signature names every kernel argument"
    compiled = triton.compile(
        GluonASTSource(fwd.attn_fwd_kernel, signature, constexprs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": fwd.NUM_WARPS},
    )
    return report(fwd.attn_fwd_kernel.__name__, compiled)


# Words of a decode variant ("paged16+window+alibi"): the cache ("contiguous" unless a page size), options and
# the packed rows a program owns ("m16" by default: one token of a GQA group of up to 16).
DECODE_WORDS = (
    "contiguous", "paged16", "paged64", "paged256", "window", "left", "softcap", "alibi", "leftpad",
    "batchidx", "combine", "m16", "m32", "m64", "deep",
)  # fmt: skip
DECODE_VARIANTS = (
    "contiguous+combine", "paged64", "paged256+combine", "contiguous+m64",
    "contiguous+window+left+softcap+alibi+m32", "contiguous+leftpad+batchidx", "paged64+window+m64",
)  # fmt: skip


def decode_configurations() -> list[tuple[int, str, str]]:
    """The TMA decode kernel's configurations CI compiles: every variant at D = 128 in bf16, the plain
    ones at D = 64 and 256 and in fp16, pages of 16 rows at every head dim."""
    from flashtile.kernels.hopper.decode import HEAD_DIMS

    cases = [(128, v, "bf16") for v in DECODE_VARIANTS]
    cases += [(d, v, t) for d in HEAD_DIMS for v in ("contiguous+combine", "paged64") for t in DTYPES]
    # Pages smaller than a key tile, in row slices of it (a column block at a time where a row passes the
    # swizzle).
    cases += [(d, "paged16+combine", "bf16") for d in HEAD_DIMS]
    # The deeper ring of one program an SM (hopper.decode.ring_stages: D = 128).
    deep = ("contiguous+deep+combine", "paged64+deep", "paged16+deep")
    cases += [(128, v, t) for v in deep for t in DTYPES]
    return sorted(set(cases))


def compile_decode(head_dim: int, variant: str, dtype: str) -> CompileReport:
    """Compile the TMA decode kernel in this process as ``hopper.decode.launch`` configures it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from flashtile.kernels import configs
    from flashtile.kernels.hopper import decode

    words = set(variant.split("+"))
    if words - set(DECODE_WORDS):
        raise ValueError(
            f"unknown decode words {sorted(words - set(DECODE_WORDS))}; accepted: {DECODE_WORDS}"
        )
    cfg = configs.decode_tma_config(head_dim)
    page = next((int(w[5:]) for w in words if w.startswith("paged")), 0)
    block_m = next((int(w[1:]) for w in words if w in ("m16", "m32", "m64")), 16)
    sub_rows = min(page, cfg.BLOCK_N) if page else cfg.BLOCK_N
    kernel = decode.attn_decode_tma_kernel
    constexprs = dict(
        GROUP=max(1, block_m // 4), HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=cfg.BLOCK_N,
        STAGES=decode.ONE_A_SM_STAGES if "deep" in words else cfg.num_stages, SUB_ROWS=sub_rows,
        PAGE_SIZE=max(page, 1), WARPS_M=decode._warps_m(block_m),
        IS_PAGED=bool(page), HAS_BATCH_IDX="batchidx" in words, HAS_LEFTPAD="leftpad" in words,
        IS_LOCAL="window" in words or "left" in words, HAS_WINDOW_LEFT="left" in words,
        HAS_SOFTCAP="softcap" in words, HAS_ALIBI="alibi" in words, EARLY_COMBINE="combine" in words,
    )  # fmt: skip
    columns = decode.box_columns(head_dim, sub_rows, cfg.BLOCK_N, 2)
    desc = _descriptor_type(dtype, sub_rows, columns)
    floats = ("qk_scale", "softcap_qk", "softcap_out")
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ("k_desc", "v_desc"):
            signature[name] = desc
        elif name in ("o_ptr", "lse_ptr", "alibi_ptr"):
            signature[name] = "*fp32"
        elif name == "q_ptr":
            signature[name] = f"*{dtype}"
        elif name.endswith("_ptr"):
            signature[name] = "*i32"
        else:
            signature[name] = "fp32" if name in floats else "i32"
    compiled = triton.compile(
        GluonASTSource(kernel, signature, constexprs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": decode.NUM_WARPS},
    )
    return report(kernel.__name__, compiled)


def _clean_python(*args: str, timeout: float) -> str:
    """Run ``python -m flashtile.kernels.hopper.sm90_compile *args`` without TRITON_INTERPRET (under the
    interpreter Triton's own jit helpers, which Gluon calls, are not compilable); return its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "flashtile.kernels.hopper.sm90_compile", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sm_90 compile {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def compile_in_subprocess(
    kind: str, head_dim: int, variant: str, dtype: str, timeout: float = 300
) -> CompileReport:
    """Compile one configuration in a fresh interpreter; return the report or raise its stderr."""
    out = _clean_python(kind, str(head_dim), variant, dtype, timeout=timeout)
    return CompileReport(**json.loads(out))


def compile_all_in_subprocess(kind: str, timeout: float = 600) -> dict[tuple, CompileReport | Exception]:
    """Compile every configuration of ``kind`` in one fresh interpreter that forks a child per compile
    (:func:`compile_forked`): the imports are paid once, and an abort still fails only its own case."""
    results = {}
    for case, ok, payload in json.loads(_clean_python(kind, "all", timeout=timeout)):
        results[tuple(case)] = CompileReport(**payload) if ok else RuntimeError(payload)
    return results


_COMPILERS = {"fwd": compile_fwd, "decode": compile_decode}


def _compile_into(pipe, kind: str, case: tuple) -> None:
    try:
        pipe.send((True, asdict(_COMPILERS[kind](*case))))
    except Exception:  # the parent reports the compiler's error for this case
        pipe.send((False, traceback.format_exc()[-3000:]))


def compile_forked(kind: str, cases: list[tuple], workers: int = 2) -> dict[tuple, CompileReport | Exception]:
    """Compile each case in a forked child of this process, ``workers`` at a time: each compile is
    isolated as in :func:`compile_in_subprocess`, without paying for the imports again in every child.
    This process must not run under TRITON_INTERPRET (see :func:`_clean_python`).

    Returns each case's report, or the exception that says how its child failed (a compiler abort too).
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    results: dict[tuple, CompileReport | Exception] = {}
    pending = list(cases)
    running: list[tuple[tuple, multiprocessing.Process, object]] = []
    while pending or running:
        while pending and len(running) < workers:
            case = pending.pop(0)
            receiver, sender = context.Pipe(duplex=False)
            child = context.Process(target=_compile_into, args=(sender, kind, case))
            child.start()
            sender.close()
            running.append((case, child, receiver))
        case, child, receiver = running.pop(0)
        try:
            ok, payload = receiver.recv()
        except EOFError:
            ok, payload = False, "the compiler aborted the process"
        child.join()
        what = f"sm_90 compile of Gluon {kind} {case}"
        results[case] = CompileReport(**payload) if ok else RuntimeError(f"{what} failed:\n{payload}")
    return results


_CONFIGURATIONS = {"fwd": fwd_configurations, "decode": decode_configurations}

if __name__ == "__main__":
    kind_arg = sys.argv[1]
    if sys.argv[2] == "all":
        found = compile_forked(kind_arg, _CONFIGURATIONS[kind_arg]())
        rows = [
            (case, True, asdict(r)) if isinstance(r, CompileReport) else (case, False, str(r))
            for case, r in found.items()
        ]
        print(json.dumps(rows))
    else:
        dim_arg, variant_arg, dtype_arg = sys.argv[2:5]
        result = _COMPILERS[kind_arg](int(dim_arg), variant_arg, dtype_arg)
        print(json.dumps(asdict(result)))
