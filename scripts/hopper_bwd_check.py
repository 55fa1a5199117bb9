"""Correctness and speed of the Hopper (Gluon) backward, every variant, on one H100/H200.

Each (head dim, variant) runs its correctness checks in a child process with a time limit, several at a
time, so that a wrong result, an exception, a crash or a hang (a Gluon deadlock) is reported for that
variant alone: gradients against the float64 oracle under the 3× rule (odd lengths, GQA/MQA, causal with
N_q ≠ N_k, fully masked rows), no NaN crossing from another batch or head, and ``deterministic=True``
bitwise stable over 50 runs. Then, per head dim 64/128/256, one child times the variants that passed
against the portable Triton backward and SDPA's cuDNN backward in the same process: TFLOP/s (backward
FLOPs = 2.5 · 4·B·H·N²·D, halved when causal), bf16, B·N = 16k, H·D = 2048.

    PYTHONPATH=src python scripts/hopper_bwd_check.py [--only 64:m128,256] [--skip-correctness]
        [--skip-timing] [--timeout 120] [--jobs 4]

``--only`` takes head dims (``64``) or head dim and variant (``64:m128``), comma-separated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch
import triton

from flashtile.kernels.hopper import bwd as hopper_bwd

# (batch, seqlen_q, seqlen_k, heads, heads_kv, causal, dtype); each at the target's head dim.
SHAPES = [
    (2, 113, 203, 4, 2, True, torch.bfloat16),
    # N_q > N_k: the first 90 rows see no key (fully masked, LSE = −inf).
    (2, 203, 113, 4, 2, True, torch.float16),
    (1, 1025, 1023, 4, 1, False, torch.bfloat16),
    (3, 77, 77, 6, 3, False, torch.float16),
    (1, 1, 1, 2, 2, True, torch.bfloat16),
    (1, 300, 1000, 8, 2, True, torch.bfloat16),
]
TIMING_SEQLENS = (1024, 4096, 16384)


def _kernel_dim(head_dim: int) -> int:
    return hopper_bwd.PADDED_HEAD_DIM.get(head_dim, head_dim)


def all_targets() -> list[tuple[int, str]]:
    """Every variant at its head dim, and the padded head dims with their kernel's default variant."""
    return [
        (d, name)
        for d in hopper_bwd.SUPPORTED_HEAD_DIMS
        for name in hopper_bwd.VARIANTS[_kernel_dim(d)]
        if d == _kernel_dim(d) or name == hopper_bwd.DEFAULT_VARIANT[_kernel_dim(d)]
    ]


def select_targets(only: str | None) -> list[tuple[int, str]]:
    if not only:
        return all_targets()
    tokens = [t.strip() for t in only.split(",") if t.strip()]
    chosen = [
        (d, name) for d, name in all_targets() if any(tok == str(d) or tok == f"{d}:{name}" for tok in tokens)
    ]
    if not chosen:
        raise SystemExit(f"--only {only!r} matches none of {[f'{d}:{n}' for d, n in all_targets()]}")
    return chosen


def _inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    dout = torch.randn_like(q)
    return q, k, v, dout


def _forward(q, k, v, causal):
    from flashtile.kernels import fwd as portable_fwd

    scale = q.shape[-1] ** -0.5
    window = (-1, 0) if causal else (-1, -1)
    out, lse = portable_fwd.attn_fwd(q, k, v, scale, causal, window_size=window)
    return out, lse, scale


def _oracle_grads(q, k, v, dout, causal, dtype):
    from flashtile.reference import naive

    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = naive.attention(*leaves, causal=causal)
    out.backward(dout.to(dtype))
    return [t.grad for t in leaves]


def _compare_all(label, grads, q, k, v, dout, causal, dtype) -> bool:
    from flashtile.reference.compare import GRAD_FACTOR, compare

    oracle = _oracle_grads(q, k, v, dout, causal, torch.float64)
    baseline = _oracle_grads(q, k, v, dout, causal, dtype)
    ok = True
    for name, ours, ref, base in zip(("dq", "dk", "dv"), grads, oracle, baseline, strict=True):
        result = compare(name, ours, ref, base, GRAD_FACTOR)
        ok &= result.passed
        print(f"  {label} {result}", flush=True)
    return ok


def check_cases(head_dim: int) -> bool:
    ok = True
    for batch, seqlen_q, seqlen_k, heads, heads_kv, causal, dtype in SHAPES:
        for deterministic in (False, True):
            q, k, v, dout = _inputs(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, dtype)
            out, lse, scale = _forward(q, k, v, causal)
            grads = hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
            shape = (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, str(dtype)[6:])
            ok &= _compare_all(f"{shape} det={deterministic}", grads, q, k, v, dout, causal, dtype)
    return ok


def check_no_leak(head_dim: int) -> bool:
    """NaN in another batch and in another head of the same batch must not reach batch 0, head 0."""
    ok = True
    for causal in (False, True):
        for deterministic in (False, True):
            q, k, v, dout = _inputs(3, 97, 75, 2, 2, head_dim, torch.bfloat16)
            out, lse, scale = _forward(q, k, v, causal)
            for t in (q, k, v, dout, out):
                t[1:] = float("nan")
                t[0, :, 1] = float("nan")
            lse[1:] = float("nan")
            lse[0, 1] = float("nan")
            grads = hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
            clean = [t[:1, :, :1] for t in (q, k, v, dout)]
            label = f"leak causal={causal} det={deterministic}"
            ok &= _compare_all(label, [g[:1, :, :1] for g in grads], *clean, causal, torch.bfloat16)
    return ok


def check_deterministic(head_dim: int, runs: int = 50) -> bool:
    q, k, v, dout = _inputs(2, 1000, 1100, 8, 2, head_dim, torch.bfloat16)
    out, lse, scale = _forward(q, k, v, True)
    first = hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, True, deterministic=True)
    same = all(
        all(torch.equal(a, b) for a, b in zip(first, hopper_bwd.attn_bwd(
            dout, q, k, v, out, lse, scale, True, deterministic=True), strict=True))
        for _ in range(runs - 1)
    )  # fmt: skip
    print(f"  deterministic=True bitwise equal over {runs} runs: {same}", flush=True)
    return same


def correctness_worker(head_dim: int, variant: str) -> None:
    """One target in this process (the variant is set in the environment); prints a RESULT line."""
    os.environ[hopper_bwd.VARIANT_ENV] = variant
    torch.manual_seed(0)
    results = {}
    for name, fn in (
        ("cases", check_cases),
        ("no_leak", check_no_leak),
        ("deterministic", check_deterministic),
    ):
        try:
            results[name] = fn(head_dim)
            torch.cuda.synchronize()
        except Exception:
            traceback.print_exc()
            results[name] = False
    print("RESULT " + json.dumps(results), flush=True)


def _tflops(batch, seqlen, heads, head_dim, causal, ms):
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
    return flops / ms * 1e-9


def _bench(fn) -> float:
    try:
        return triton.testing.do_bench(fn, warmup=10, rep=40)
    except Exception:
        traceback.print_exc()
        return float("nan")


def time_cell(head_dim: int, variants: list[str], seqlen: int, causal: bool) -> dict[str, float]:
    """TFLOP/s of each variant, the portable backward and cuDNN's at one cell of the grid."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashtile.kernels import bwd as portable_bwd

    batch, heads = 16384 // seqlen, 2048 // head_dim
    q, k, v, dout = _inputs(batch, seqlen, seqlen, heads, heads, head_dim, torch.bfloat16)
    out, lse, scale = _forward(q, k, v, causal)
    window = (-1, 0) if causal else (-1, -1)
    times = {}
    for name in variants:
        os.environ[hopper_bwd.VARIANT_ENV] = name
        times[name] = _bench(lambda: hopper_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal))
    times["portable"] = _bench(
        lambda: portable_bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal, window_size=window)
    )
    try:
        qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            dt = dout.transpose(1, 2).contiguous()
            times["cudnn"] = _bench(lambda: torch.autograd.grad(o, (qt, kt, vt), dt, retain_graph=True))
    except Exception:
        traceback.print_exc()
        times["cudnn"] = float("nan")
    return {name: _tflops(batch, seqlen, heads, head_dim, causal, ms) for name, ms in times.items()}


def timing_worker(head_dim: int, variants: list[str]) -> None:
    print("D,N,causal,impl,tflops,vs_cudnn,vs_portable", flush=True)
    for seqlen in TIMING_SEQLENS:
        for causal in (False, True):
            row = time_cell(head_dim, variants, seqlen, causal)
            for name, tflops in row.items():
                impl = name if name in ("portable", "cudnn") else f"hopper:{name}"
                ratios = f"{tflops / row['cudnn']:.3f},{tflops / row['portable']:.3f}"
                print(f"{head_dim},{seqlen},{causal},{impl},{tflops:.1f},{ratios}", flush=True)


def _child(args: list[str]) -> tuple[subprocess.Popen, str]:
    """A worker process writing into a file (a pipe that nobody reads while another child is awaited
    could fill and stall it)."""
    fd, path = tempfile.mkstemp(prefix="hopper_bwd_check_", suffix=".log")
    with os.fdopen(fd, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args], stdout=log, stderr=subprocess.STDOUT
        )
    return proc, path


def _collect(child: tuple[subprocess.Popen, str], deadline: float) -> tuple[str, str]:
    """(status, output) of a child: ok/FAIL by its RESULT line, TIMEOUT (killed: a hang?) or CRASH."""
    proc, path = child
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
        status = None
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        status = "TIMEOUT (killed; a deadlock?)"
    with open(path) as log:
        output = log.read()
    os.unlink(path)
    if status is None and proc.returncode != 0:
        status = f"CRASH (exit {proc.returncode})"
    results = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if status is None and results:
        verdict = json.loads(results[-1][len("RESULT ") :])
        status = "ok" if all(verdict.values()) else f"FAIL {verdict}"
    return status or "ok", output


def run_correctness(targets, timeout: float, jobs: int) -> dict[tuple[int, str], str]:
    statuses = {}
    queue = list(targets)
    running = []
    while queue or running:
        while queue and len(running) < jobs:
            d, name = queue.pop(0)
            child = _child(["--worker", "correctness", "--only", f"{d}:{name}"])
            running.append(((d, name), child, time.monotonic() + timeout))
        target, child, deadline = running.pop(0)
        status, output = _collect(child, deadline)
        statuses[target] = status
        print(f"== correctness D={target[0]} variant={target[1]}: {status}\n{output}", flush=True)
    return statuses


def run_timing(targets, timeout: float) -> None:
    for d in sorted({_kernel_dim(d) for d, _ in targets}):
        names = [name for td, name in targets if td == d]
        if not names:
            continue
        only = ",".join(f"{d}:{name}" for name in names)
        status, output = _collect(_child(["--worker", "timing", "--only", only]), time.monotonic() + timeout)
        print(f"== timing D={d} variants={names}: {status}\n{output}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="head dims or head_dim:variant, comma-separated (default: all)")
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per child process")
    parser.add_argument("--jobs", type=int, default=4, help="correctness children at a time")
    parser.add_argument("--worker", choices=("correctness", "timing"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    targets = select_targets(args.only)
    if args.worker == "correctness":
        correctness_worker(*targets[0])
        return
    if args.worker == "timing":
        timing_worker(targets[0][0], [name for _, name in targets])
        return
    start = time.monotonic()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    if not args.skip_correctness:
        statuses = run_correctness(targets, args.timeout, args.jobs)
        print("CORRECTNESS", {f"{d}:{name}": status for (d, name), status in statuses.items()}, flush=True)
        targets = [t for t in targets if statuses[t] == "ok"]
    if not args.skip_timing:
        # The grid's head dims are 64, 128 and 256; 96 and 192 only check the padding.
        run_timing([t for t in targets if t[0] == _kernel_dim(t[0])], args.timeout)
    print(f"total {time.monotonic() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
