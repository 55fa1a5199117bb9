"""Compile the Hopper (Gluon) backward for sm_90 on any machine, GPU or not, and report what the compiler
made: every variant the launcher can pick, in a subprocess (a compiler abort ends the process).

    python -m flashtile.kernels.hopper.bwd_compile bf16 128:m64:causal:deterministic 64:m128:full:reduce
    python -m flashtile.kernels.hopper.bwd_compile bf16 128:m64:local+softcap+alibi:reduce
    python -m flashtile.kernels.hopper.bwd_compile bf16 64:m64:causal+varlen:reduce
    python -m flashtile.kernels.hopper.bwd_compile bf16 128:m64:causal+sparse:reduce
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

from flashtile.kernels.sm90_compile import CompileReport, report

# (head dim, variant name, mask, deterministic), and (report, has the TMA reduce) per kernel. The mask is
# causal (True) or not (False), or option words joined by "+": "causal" or "local" (a window with both
# sides), "softcap", "alibi", "varlen" (packed batches: dK/dV by TMA boxes where a block lies inside its
# sequence, as by default), "rowstores" (with varlen: every block's dK/dV by row-masked pointer stores,
# FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=0), "sparse" (a block mask of
# 128-row blocks: the listed query blocks of each key block), "mod" (the same with a mask_mod), "bits" (with
# the mask bits create_block_mask's masks run), "dropout" (the forward's Philox mask regenerated), "sink" (a
# learnable sink's gradient summed by atomic adds), "persistent" (one program an SM over the key blocks).
Job = tuple[int, str, bool | str, bool]
Reports = list[tuple[CompileReport, bool]]
_SCALARS = (
    "seqlen_q", "seqlen_k", "seqlen_pad", "num_n_blocks", "num_m_blocks", "H", "GROUP", "window_left",
    "window_right", "stride_alibi_b", "list_stride_b", "list_stride_h", "list_row_len", "dropout_threshold",
    "num_tiles",
)  # fmt: skip


def _desc(dtype: str, block: list[int]) -> str:
    import triton.experimental.gluon.language as gl

    gl_dtype = {"bf16": gl.bfloat16, "fp16": gl.float16, "fp32": gl.float32}[dtype]
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def _signature(fn, descs: dict[str, str], constexprs: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in descs:
            sig[name] = descs[name]
        elif name.endswith("_ptr"):
            sig[name] = "*fp32"
        else:
            sig[name] = "i32" if name in _SCALARS else "fp32"
    return sig


def compile_here(
    head_dim: int, variant: str, mask: bool | str, deterministic: bool, dtype: str = "bf16"
) -> Reports:
    """The fused kernel as the launcher configures ``variant`` (a name of ``bwd.VARIANTS[head_dim]``) and
    ``mask`` (see ``Job``), and the dQ kernel when ``deterministic``; (report, has the TMA reduce) per
    kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from flashtile.kernels.hopper import bwd

    d = head_dim
    words = set(mask.split("+")) if isinstance(mask, str) else {"causal"} if mask else set()
    causal = "causal" in words and "local" not in words
    switches = dict(
        IS_LOCAL="local" in words,
        HAS_WINDOW_LEFT="local" in words,
        HAS_SOFTCAP="softcap" in words,
        HAS_ALIBI="alibi" in words,
        IS_VARLEN="varlen" in words,
        VARLEN_TMA_STORE="varlen" in words and "rowstores" not in words,
        HAS_DROPOUT="dropout" in words,
        HAS_SINK="sink" in words,
        PERSISTENT="persistent" in words,
    )
    cfg = bwd.VARIANTS[d][variant]
    # As the launcher picks them (bwd.dq_by_producer, bwd.dk_after_dq).
    dropout, block_mask = "dropout" in words, bool(words & {"sparse", "mod", "bits"})
    switches["DQ_BY_PRODUCER"] = bwd.dq_by_producer(deterministic, dropout, block_mask)
    plain = bwd.is_plain_call(
        (8, 0) if "local" in words else (-1, -1), 1.0 if "softcap" in words else 0.0,
        True if "alibi" in words else None, 0.1 if dropout else 0.0, True if "varlen" in words else None,
        True if block_mask else None,
    )  # fmt: skip
    switches["DK_LAST"] = bwd.dk_after_dq(d, cfg, causal, plain, "sink" in words, deterministic)
    bm, bn = cfg.block_m, cfg.block_n
    sparse = None
    if words & {"sparse", "mod", "bits"}:
        from flashtile import masks

        # "mod": flashtile.masks.causal in the partial blocks (no aux tensors); "bits": the mask bits.
        sparse = (128, 128, (0, 0, 64), masks.causal if "mod" in words else None, False, "bits" in words)
    # The launcher passes a block mask's int32 lists, or the row statistics for them without one.
    lists = dict.fromkeys(
        ("q_count_ptr", "q_index_ptr", "full_q_count_ptr", "full_q_index_ptr"), "*i32" if sparse else "*fp32"
    )
    sparse_args = {k: v for k, v in bwd.sparse_arguments(sparse, bm, "q").items() if k.isupper()}
    dq_rows, dq_cols = cfg.dq_box(d)
    out_rows, out_cols = cfg.out_box(d)
    q_block, kv_block, out_block = [1, bm, d], [1, bn, d], [1, out_rows, out_cols]
    fused = (
        bwd.attn_bwd_kernel,
        dict(
            q_desc=_desc(dtype, q_block), k_desc=_desc(dtype, kv_block), v_desc=_desc(dtype, kv_block),
            do_desc=_desc(dtype, q_block), lse_desc=_desc("fp32", [bm]), delta_desc=_desc("fp32", [bm]),
            dq_desc=_desc("fp32", [1, dq_rows, dq_cols]), dk_desc=_desc(dtype, out_block),
            dv_desc=_desc(dtype, out_block), dk_ptr=f"*{dtype}", dv_ptr=f"*{dtype}",
            # Dense launches pass the row statistics for the boundaries they do not read.
            cu_seqlens_q_ptr="*i32" if switches["IS_VARLEN"] else "*fp32",
            cu_seqlens_k_ptr="*i32" if switches["IS_VARLEN"] else "*fp32", **lists,
            # The launcher passes rng_state (int64) with dropout, the row statistics without.
            rng_state_ptr="*i64" if switches["HAS_DROPOUT"] else "*fp32",
            **({"aux": ("*i32", "*i32", "*i32")} if "bits" in words else {}),
        ),
        dict(
            HEAD_DIM=d, BM=bm, BN=bn, NSTAGE=cfg.stages, SPLIT=cfg.split, DQ_SPLIT=cfg.dq_split,
            DQ_ROWS=dq_rows, DQ_COLS=dq_cols, IS_CAUSAL=causal, COMPUTE_DQ=not deterministic, **switches,
            **sparse_args,
            **({} if switches["HAS_ALIBI"] else {"alibi_ptr": None}),
            **({} if "bits" in words else {"aux": None}),
        ),
        {"num_warps": bwd.fused_warps(cfg), "maxnreg": bwd.FUSED_MAXNREG},
    )  # fmt: skip
    kernels = [fused]
    if deterministic:
        dq_q_block, dq_kv_block = [1, bwd.DQ_BLOCK_M, d], [1, bwd.DQ_BLOCK_N, d]
        kernels.append((
            bwd.attn_bwd_dq_kernel,
            dict(
                q_desc=_desc(dtype, dq_q_block), k_desc=_desc(dtype, dq_kv_block),
                v_desc=_desc(dtype, dq_kv_block), do_desc=_desc(dtype, dq_q_block),
                dq_desc=_desc(dtype, dq_q_block),
            ),
            dict(HEAD_DIM=d, BM=bwd.DQ_BLOCK_M, BN=bwd.DQ_BLOCK_N, IS_CAUSAL=causal),
            {"num_warps": bwd.DQ_WARPS},
        ))  # fmt: skip
    reports = []
    for fn, descs, constexprs, options in kernels:
        src = GluonASTSource(fn, _signature(fn, descs, constexprs), constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
        kernel_report = report(fn.__name__, compiled)
        ptx = compiled.asm["ptx"]
        reports.append((kernel_report, "cp.reduce.async.bulk.tensor" in ptx))
    return reports


def _spec(job: Job) -> str:
    head_dim, variant, mask, deterministic = job
    if not isinstance(mask, str):
        mask = "causal" if mask else "full"
    mode = "deterministic" if deterministic else "reduce"
    return f"{head_dim}:{variant}:{mask}:{mode}"


def _parse(spec: str) -> Job:
    dim, variant, mask, mode = spec.split(":")
    plain = {"full": False, "causal": True}
    return int(dim), variant, plain.get(mask, mask), mode == "deterministic"


def start_compile(jobs: list[Job], dtype: str = "bf16") -> subprocess.Popen:
    """Start compiling ``jobs`` in one fresh interpreter without TRITON_INTERPRET (``finish_compile``
    collects)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.Popen(
        [sys.executable, "-m", "flashtile.kernels.hopper.bwd_compile", dtype, *map(_spec, jobs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish_compile(proc: subprocess.Popen, timeout: float = 600) -> dict[Job, Reports]:
    """(report, has the TMA reduce) per kernel of each job of a ``start_compile``; raises with the
    subprocess's stderr when it failed (a compile error or abort)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"sm_90 compile of the Hopper backward {proc.args[3:]} failed:\n{stderr[-3000:]}")
    rows = json.loads(stdout.strip().splitlines()[-1])
    return {
        _parse(spec): [(CompileReport(**r["report"]), r["has_tma_reduce"]) for r in kernels]
        for spec, kernels in rows.items()
    }


if __name__ == "__main__":
    dtype_arg, *specs = sys.argv[1:]
    out = {spec: compile_here(*_parse(spec), dtype_arg) for spec in specs}
    print(json.dumps({spec: [{"report": asdict(r), "has_tma_reduce": red} for r, red in kernels]
                      for spec, kernels in out.items()}))  # fmt: skip
