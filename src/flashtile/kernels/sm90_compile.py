"""Compile the kernels for Hopper (sm_90) on any machine, GPU or not, and report what the compiler made.

Triton compiles for a named target without a device (ptxas ships in its wheel), so CI can prove that
every configuration the dispatcher can pick compiles, uses wgmma and TMA, and does not spill.
Run a compile in a subprocess: a compiler abort ends the whole process.

    python -m flashtile.kernels.sm90_compile fwd 128 causal
    python -m flashtile.kernels.sm90_compile bwd 128 local+softcap+alibi+dropout+varlen
    python -m flashtile.kernels.sm90_compile fwd 192/128 causal+sink   # Q/K head dim 192, V's 128
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass

_FLOAT_ARGS = {"qk_scale", "softmax_scale", "softcap_qk", "softcap_out", "dropout_scale"}
_POINTER_TYPES = {
    "lse_ptr": "*fp32",
    "delta_ptr": "*fp32",
    "alibi_ptr": "*fp32",
    "rng_state_ptr": "*i64",
    "cu_seqlens_q_ptr": "*i32",
    "cu_seqlens_k_ptr": "*i32",
    "sink_ptr": "*fp32",
    "dsink_ptr": "*fp32",
    "descale_ptr": "*fp32",
    **{
        f"{full}{side}{kind}_ptr": "*i32"
        for full in ("", "full_")
        for side in ("", "kv_")
        for kind in ("count", "index")
    },
}
# The option each pointer belongs to: without the option the launcher passes None (a constexpr).
_OPTION_POINTERS = {
    "alibi_ptr": "HAS_ALIBI",
    "rng_state_ptr": "HAS_DROPOUT",
    "cu_seqlens_q_ptr": "IS_VARLEN",
    "cu_seqlens_k_ptr": "IS_VARLEN",
    "sink_ptr": "HAS_SINK",
    "dsink_ptr": "HAS_SINK",
    "descale_ptr": "IS_FP8",
    **{name: "HAS_BLOCK_MASK" for name in _POINTER_TYPES if "count" in name or "index" in name},
}
# Variant words: "full" or "causal" (the window (-1, 0)), plus any of these joined with "+".
# "fp8" (the forward only) takes float8 q, k, v (the dtype argument names which) and a bf16 output.
OPTION_WORDS = ("local", "softcap", "alibi", "dropout", "varlen", "blocksparse", "sink", "fp8")


@dataclass(frozen=True)
class CompileReport:
    kernel: str
    registers: int
    local_bytes: int
    shared_bytes: int
    # Spilled registers land on the stack frame (ptxas reports STACK, not LOCAL, for them).
    stack_bytes: int
    has_wgmma: bool
    has_tma: bool
    # Local loads and stores (LDL/STL: spill traffic) inside innermost loops of the SASS, the key loops: a
    # stack frame whose accesses all sit outside them costs a few loads a work tile, not a few a key tile.
    loop_spills: int = 0
    # wgmma on float8 e4m3 operands (the float8 forward's two products).
    has_fp8_wgmma: bool = False
    # Ring slots released by every consumer thread (hopper.fwd._release: cp.async.mbarrier.arrive.noinc).
    thread_arrives: bool = False


def _signature(fn, constexprs: dict, dtype: str) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "o_ptr" and dtype.startswith("fp8"):
            sig[name] = "*bf16"
        elif name.endswith("_ptr"):
            sig[name] = _POINTER_TYPES.get(name, f"*{dtype}")
        else:
            sig[name] = "fp32" if name in _FLOAT_ARGS else "i32"
    return sig


def _switches(variant: str) -> dict[str, bool]:
    words = set(variant.split("+"))
    unknown = words - {"full", "causal", *OPTION_WORDS}
    if unknown:
        raise ValueError(f"unknown variant words {sorted(unknown)}; accepted: full, causal, {OPTION_WORDS}")
    return dict(
        IS_LOCAL=bool(words & {"causal", "local"}),
        # "local" is a window with both bounds; causal has no left bound.
        HAS_WINDOW_LEFT="local" in words,
        HAS_SOFTCAP="softcap" in words,
        FAST_TANH=True,
        HAS_ALIBI="alibi" in words,
        HAS_DROPOUT="dropout" in words,
        IS_VARLEN="varlen" in words,
        HAS_SINK="sink" in words,
        IS_FP8="fp8" in words,
        **_block_sparse_switches("blocksparse" in words),
    )


def _block_sparse_switches(on: bool) -> dict[str, object]:
    """The mods' switches: off, or a 128 × 128 block mask with masks.causal in its partial tiles."""
    import torch

    from flashtile.block_mask import BlockMask
    from flashtile.kernels._block_sparse import kernel_mods
    from flashtile.masks import causal
    from flashtile.mods import Mods

    if not on:
        return kernel_mods(None).switches
    states = torch.ones(1, 1, 1, 1, dtype=torch.int8)
    return kernel_mods(Mods(BlockMask.from_states(states, 128, 128, 128), causal)).switches


def _with_absent_pointers(fn, constexprs: dict) -> dict:
    """The constexprs plus None for each pointer argument of an option that is off."""
    absent = {
        name: None
        for name, switch in _OPTION_POINTERS.items()
        if name in fn.arg_names and not constexprs[switch]
    }
    # The compile checks use no aux tensors; each kernel takes only its own switches.
    constexprs = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    return {**constexprs, **absent, "aux": None}


def parse_head_dims(text: str) -> tuple[int, int]:
    """``"128"`` → (128, 128); ``"192/128"`` → Q/K head dim 192, V head dim 128."""
    qk, _, v = text.partition("/")
    return int(qk), int(v or qk)


def _kernels_for(kind: str, head_dims: str, variant: str):
    import torch

    from flashtile.kernels import bwd, configs, fwd

    # Hopper configs are chosen for a CUDA device of capability 9.x; name it without needing one.
    configs._is_hopper = lambda device: True
    device = torch.device("cuda")
    head_dim, head_dim_v = parse_head_dims(head_dims)
    bd = configs.block_d(head_dim)
    switches = _switches(variant)
    causal = "causal" in variant.split("+")
    common = dict(
        HEAD_DIM=head_dim, BLOCK_D=bd, HEAD_DIM_V=head_dim_v, BLOCK_DV=configs.block_d(head_dim_v),
        DOT_FP32=False, **switches,
    )  # fmt: skip
    if kind == "fwd":
        cfg = configs.fwd_config(
            head_dim, device, head_dim_v, dropout=switches["HAS_DROPOUT"], fp8=switches["IS_FP8"]
        )
        ce = dict(common, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N)
        return [(fwd.attn_fwd_kernel, ce, cfg.num_warps, cfg.num_stages)]
    cfg = configs.bwd_config(head_dim, causal, device, head_dim_v)
    return [
        (
            bwd.attn_bwd_dkdv_kernel,
            dict(common, BLOCK_M=cfg.BLOCK_M1, BLOCK_N=cfg.BLOCK_N1),
            cfg.num_warps1,
            cfg.num_stages1,
        ),
        (
            bwd.attn_bwd_dq_kernel,
            dict(common, BLOCK_M=cfg.BLOCK_M2, BLOCK_N=cfg.BLOCK_N2),
            cfg.num_warps2,
            cfg.num_stages2,
        ),
    ]


def report(kernel: str, compiled) -> CompileReport:
    """What the compiler made of ``kernel``: registers, local memory and stack (spills) from the cubin,
    shared memory, and whether the PTX holds wgmma and TMA bulk tensor copies."""
    import triton

    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptx = compiled.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [os.path.join(bin_dir, "cuobjdump"), "-res-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        sass = subprocess.run(
            [os.path.join(bin_dir, "nvdisasm"), "-c", f.name], capture_output=True, text=True, check=True
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return CompileReport(
        kernel=kernel,
        registers=int(regs.group(1)) if regs else -1,
        local_bytes=int(local.group(1)) if local else -1,
        stack_bytes=int(stack.group(1)) if stack else -1,
        shared_bytes=int(compiled.metadata.shared),
        has_wgmma="wgmma" in ptx,
        has_fp8_wgmma=re.search(r"wgmma\.mma_async\S*\.e4m3\.e4m3", ptx) is not None,
        has_tma="cp.async.bulk.tensor" in ptx,
        loop_spills=loop_spills(sass),
        thread_arrives="cp.async.mbarrier.arrive.noinc" in ptx,
    )


def loop_spills(sass: str) -> int:
    """LDL/STL instructions inside innermost loops of ``nvdisasm -c`` output: the spans from a label to a
    later branch back to it that contain no other such span."""
    lines = sass.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        label = re.match(r"^\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = i
    spans = []
    for i, line in enumerate(lines):
        branch = re.search(r"BRA `\(\.(L_x_\d+)\)", line)
        if branch and labels.get(branch.group(1), i) < i:
            spans.append((labels[branch.group(1)], i))
    innermost = [
        (a, b) for a, b in spans if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in spans)
    ]
    return sum(
        1
        for a, b in innermost
        for line in lines[a : b + 1]
        if re.search(r"\b(LDL|STL)(\.[A-Z0-9]+)*\b", line)
    )


def compile_here(kind: str, head_dim: int | str, variant: str, dtype: str = "bf16"):
    """Compile in this process (use ``compile_in_subprocess`` from tests)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    reports = []
    for fn, constexprs, num_warps, num_stages in _kernels_for(kind, str(head_dim), variant):
        constexprs = _with_absent_pointers(fn, constexprs)
        src = ASTSource(fn=fn, signature=_signature(fn, constexprs, dtype), constexprs=constexprs)
        compiled = triton.compile(
            src,
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": num_warps, "num_stages": num_stages},
        )
        reports.append(report(fn.__name__, compiled))
    return reports


def compile_in_subprocess(
    kind: str,
    head_dim: int,
    causal: bool,
    dtype: str = "bf16",
    timeout: float = 600,
    options: tuple[str, ...] = (),
    head_dim_v: int | None = None,
):
    """Compile in a fresh interpreter without TRITON_INTERPRET; return the reports or raise its stderr.

    ``options`` are words of OPTION_WORDS (each switches its kernel option on); ``head_dim_v`` is V's
    head dim (default ``head_dim``)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    variant = "+".join(("causal" if causal else "full", *options))
    dims = f"{head_dim}/{head_dim if head_dim_v is None else head_dim_v}"
    proc = subprocess.run(
        [sys.executable, "-m", "flashtile.kernels.sm90_compile", kind, dims, variant, dtype],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sm_90 compile of {kind} D={dims} {variant} failed:\n{proc.stderr[-3000:]}")
    return [CompileReport(**r) for r in json.loads(proc.stdout.strip().splitlines()[-1])]


if __name__ == "__main__":
    kind_arg, dim_arg, mask_arg = sys.argv[1:4]
    dtype_arg = sys.argv[4] if len(sys.argv) > 4 else "bf16"
    out = compile_here(kind_arg, dim_arg, mask_arg, dtype_arg)
    print(json.dumps([asdict(r) for r in out]))
