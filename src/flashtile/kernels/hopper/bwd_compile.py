"""Compile the Hopper (Gluon) backward for sm_90 on any machine, GPU or not, and report what the compiler
made: every configuration the launcher can pick, in a subprocess (a compiler abort ends the process).

    python -m flashtile.kernels.hopper.bwd_compile 128 causal deterministic
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

from flashtile.kernels.sm90_compile import CompileReport, report

_SCALARS = ("seqlen_q", "seqlen_k", "seqlen_pad", "num_n_blocks", "num_m_blocks", "H", "GROUP")


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
    head_dim: int, causal: bool, deterministic: bool, dtype: str = "bf16"
) -> list[CompileReport]:
    """The fused kernel as the launcher configures it, and the dQ kernel when ``deterministic``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from flashtile.kernels.hopper import bwd

    d = head_dim
    q_block, kv_block, out_block = [1, bwd.BLOCK_M, d], [1, bwd.BLOCK_N, d], [1, bwd.BLOCK_N // 2, d]
    dq_cols = bwd.dq_columns(d)
    fused = (
        bwd.attn_bwd_kernel,
        dict(
            q_desc=_desc(dtype, q_block), k_desc=_desc(dtype, kv_block), v_desc=_desc(dtype, kv_block),
            do_desc=_desc(dtype, q_block), lse_desc=_desc("fp32", [bwd.BLOCK_M]),
            delta_desc=_desc("fp32", [bwd.BLOCK_M]), dq_desc=_desc("fp32", [1, bwd.BLOCK_M, dq_cols]),
            dk_desc=_desc(dtype, out_block), dv_desc=_desc(dtype, out_block),
        ),
        dict(
            HEAD_DIM=d, BM=bwd.BLOCK_M, BN=bwd.BLOCK_N, NSTAGE=bwd.STAGES, DQ_COLS=dq_cols, IS_CAUSAL=causal,
            COMPUTE_DQ=not deterministic,
        ),
        {"num_warps": bwd.FUSED_WARPS, "maxnreg": bwd.FUSED_MAXNREG},
    )  # fmt: skip
    kernels = [fused]
    if deterministic:
        dq_kv_block = [1, bwd.DQ_BLOCK_N, d]
        kernels.append((
            bwd.attn_bwd_dq_kernel,
            dict(
                q_desc=_desc(dtype, q_block), k_desc=_desc(dtype, dq_kv_block),
                v_desc=_desc(dtype, dq_kv_block), do_desc=_desc(dtype, q_block),
                dq_desc=_desc(dtype, q_block),
            ),
            dict(HEAD_DIM=d, BM=bwd.BLOCK_M, BN=bwd.DQ_BLOCK_N, IS_CAUSAL=causal),
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


def compile_in_subprocess(
    head_dim: int, causal: bool, deterministic: bool, dtype: str = "bf16", timeout: float = 600
) -> list[tuple[CompileReport, bool]]:
    """Compile in a fresh interpreter without TRITON_INTERPRET; (report, has the TMA reduce) per kernel."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [
        str(head_dim),
        "causal" if causal else "full",
        "deterministic" if deterministic else "atomic",
        dtype,
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "flashtile.kernels.hopper.bwd_compile", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sm_90 compile of the Hopper backward {args} failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return [(CompileReport(**r["report"]), r["has_tma_reduce"]) for r in rows]


if __name__ == "__main__":
    dim_arg, mask_arg, mode_arg = sys.argv[1:4]
    dtype_arg = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    out = compile_here(int(dim_arg), mask_arg == "causal", mode_arg == "deterministic", dtype_arg)
    print(json.dumps([{"report": asdict(r), "has_tma_reduce": red} for r, red in out]))
