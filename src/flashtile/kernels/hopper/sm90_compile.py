"""Compile the Gluon kernels for sm_90 on any machine, GPU or not, and report what the compiler made.

Gluon does not run in Triton's interpreter, so CPU CI proves instead that every configuration the
dispatcher can pick compiles, uses wgmma and TMA and does not spill (flashtile.kernels.sm90_compile has
the report). Run a compile in a subprocess: a compiler abort ends the whole process.

    python -m flashtile.kernels.hopper.sm90_compile fwd 128 causal bf16
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


def fwd_configurations() -> list[tuple[int, bool, str]]:
    """Every (head dim, causal, dtype) the dispatcher can send to the Gluon forward."""
    from flashtile.kernels.configs import HOPPER_FWD_HEAD_DIMS

    return [(d, causal, dtype) for d in HOPPER_FWD_HEAD_DIMS for causal in (False, True) for dtype in DTYPES]


def _descriptor_type(dtype: str, rows: int, head_dim: int) -> str:
    from triton.experimental.gluon import language as gl

    block = [1, rows, 1, head_dim]
    layout = gl.NVMMASharedLayout.get_default_for(block, {"fp16": gl.float16, "bf16": gl.bfloat16}[dtype])
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def compile_fwd(head_dim: int, causal: bool, dtype: str) -> CompileReport:
    """Compile the Gluon forward in this process, as the launcher configures it for these arguments."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from flashtile.kernels import configs
    from flashtile.kernels.hopper import fwd

    cfg = configs.hopper_fwd_config(head_dim)
    rows = fwd.WG_ROWS.value
    signature = dict(
        q_desc=_descriptor_type(dtype, rows, head_dim),
        k_desc=_descriptor_type(dtype, cfg.BLOCK_N, head_dim),
        v_desc=_descriptor_type(dtype, cfg.BLOCK_N, head_dim),
        o_desc=_descriptor_type(dtype, rows, head_dim),
        lse_ptr="*fp32",
        seqlen_q="i32",
        seqlen_k="i32",
        num_m_blocks="i32",
        H="i32",
        GROUP="i32",
        qk_scale="fp32",
    )
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_N=cfg.BLOCK_N, IS_CAUSAL=causal, STAGES=cfg.STAGES)
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    compiled = triton.compile(
        GluonASTSource(fwd.attn_fwd_kernel, signature, constexprs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": fwd.NUM_WARPS},
    )
    return report(fwd.attn_fwd_kernel.__name__, compiled)


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
    kind: str, head_dim: int, causal: bool, dtype: str, timeout: float = 300
) -> CompileReport:
    """Compile one configuration in a fresh interpreter; return the report or raise its stderr."""
    out = _clean_python(kind, str(head_dim), "causal" if causal else "full", dtype, timeout=timeout)
    return CompileReport(**json.loads(out))


def compile_all_in_subprocess(kind: str, timeout: float = 600) -> dict[tuple, CompileReport | Exception]:
    """Compile every configuration of ``kind`` in one fresh interpreter that forks a child per compile
    (:func:`compile_forked`): the imports are paid once, and an abort still fails only its own case."""
    results = {}
    for case, ok, payload in json.loads(_clean_python(kind, "all", timeout=timeout)):
        results[tuple(case)] = CompileReport(**payload) if ok else RuntimeError(payload)
    return results


_COMPILERS = {"fwd": compile_fwd}


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


_CONFIGURATIONS = {"fwd": fwd_configurations}

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
        result = _COMPILERS[kind_arg](int(dim_arg), variant_arg == "causal", dtype_arg)
        print(json.dumps(asdict(result)))
