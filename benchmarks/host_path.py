"""The host cost of one flashtile call, layer by layer, measured on the CPU with the GPU launch made a no-op.

Triton's launch path runs for real — ``JITFunction.run`` binds and specialises every argument and looks the
kernel up — up to the compiled kernel's C launcher, which is replaced by a no-op (as is compilation: a
stand-in compiled kernel is cached on the first call). So the figures are everything the host does per call
except ``cuLaunchKernelEx`` and the CUDA caching allocator, on whatever CPU runs this; they compare versions
of the code on one machine, not machines. benchmarks/launch_overhead.py measures the same on a GPU.

    PYTHONPATH=src python benchmarks/host_path.py            # this checkout
    PYTHONPATH=/path/to/other/src python benchmarks/host_path.py   # another version, same machine
"""

from __future__ import annotations

import argparse
import os
import time

# The kernels must be compiled-kernel JITFunctions (Triton decides at import), but the backend must accept
# CPU tensors (it asks for TRITON_INTERPRET=1 at every call): import first, then set the variable.
os.environ["TRITON_INTERPRET"] = "0"
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

import flashtile
from flashtile import flash_attn_func, ops
from flashtile.kernels import bwd, fwd
from flashtile.kernels.hopper import bwd as hopper_bwd
from flashtile.kernels.hopper import fwd as hopper_fwd

os.environ["TRITON_INTERPRET"] = "1"
os.environ["FLASHTILE_BACKEND"] = "triton"


class _NoGpuDriver:
    """What JITFunction.run asks the driver for, on a machine without a GPU."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)


class _NoScratch:
    """A compiled kernel's metadata as the launches read it: no global or profiling scratch (the Gluon and
    the attention kernels have none; tests/test_launch_cache.py checks the Gluon ones on a GPU)."""

    global_scratch_size = 0
    profile_scratch_size = 0


class _NoLaunchKernel:
    """A compiled kernel whose launcher does nothing."""

    function = 1
    packed_metadata = ()
    metadata = _NoScratch()

    def launch_metadata(self, grid, stream, *args) -> None:
        return None

    def run(self, *args) -> None:
        return None


def _cache_stand_in(self, key, signature, device, constexprs, options, attrs, warmup):
    kernel = _NoLaunchKernel()
    self.device_caches[device][0][key] = kernel
    return kernel


def per_call_us(fn, reps: int, repeats: int = 7) -> float:
    """The best of ``repeats`` means of ``reps`` calls, in CPU time of this process (robust to a busy
    machine's other processes)."""
    for _ in range(20):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - start) / reps * 1e6)
    return best


def measure(causal: bool, reps: int) -> None:
    batch, seqlen, heads, head_dim = 2, 128, 4, 128
    q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch.float16) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    scale = head_dim**-0.5
    window = (-1, 0) if causal else (-1, -1)
    out, lse = ops.run_attn_fwd(q, k, v, scale, causal, "triton", *window)
    graph_out = flash_attn_func(qg, kg, vg, causal=causal)
    rows = {
        "flash_attn_func, inputs requiring grad": lambda: flash_attn_func(qg, kg, vg, causal=causal),
        "flash_attn_func, no grad": lambda: flash_attn_func(q, k, v, causal=causal),
        "  ops.run_attn_fwd": lambda: ops.run_attn_fwd(q, k, v, scale, causal, "triton", *window),
        "    kernels.fwd.attn_fwd": lambda: fwd.attn_fwd(q, k, v, scale, causal, window_size=window),
        "backward (torch.autograd.grad)": lambda: torch.autograd.grad(
            graph_out, (qg, kg, vg), dout, retain_graph=True
        ),
        "  ops.run_attn_bwd": lambda: ops.run_attn_bwd(
            dout, q, k, v, out, lse, scale, causal, "triton", *window
        ),
        "    kernels.bwd.attn_bwd": lambda: bwd.attn_bwd(
            dout, q, k, v, out, lse, scale, causal, window_size=window
        ),
        "forward + backward": lambda: torch.autograd.grad(
            flash_attn_func(qg, kg, vg, causal=causal), (qg, kg, vg), dout
        ),
    }
    print(f"\ncausal={causal} (B={batch} N={seqlen} H={heads} D={head_dim} fp16)")
    for name, fn in rows.items():
        print(f"  {name:40s} {per_call_us(fn, reps):7.1f}")


def measure_hopper(reps: int) -> None:
    """The Gluon launchers alone (the backend's routing needs a GPU of compute capability 9.x)."""
    batch, seqlen, heads, head_dim = 2, 128, 4, 128
    q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch.float16) for _ in range(4))
    scale = head_dim**-0.5
    out, lse = torch.randn_like(q), torch.randn(batch, heads, seqlen)
    rows = {
        "kernels.hopper.fwd.attn_fwd": lambda: hopper_fwd.attn_fwd(q, k, v, scale, False),
        "kernels.hopper.bwd (3 launches)": lambda: hopper_bwd._launch(
            dout, q, k, v, out, lse, scale, False, False
        ),
        "kernels.hopper.bwd, deterministic": lambda: hopper_bwd._launch(
            dout, q, k, v, out, lse, scale, False, True
        ),
    }
    print(f"\nGluon launchers (B={batch} N={seqlen} H={heads} D={head_dim} fp16; the backward's CPU tensors")
    print("are real: its dQ accumulator's memset is in the figure)")
    for name, fn in rows.items():
        print(f"  {name:40s} {per_call_us(fn, reps):7.1f}")


def measure_hopper_api(reps: int) -> None:
    """The API on the Hopper route (the backend's device checks answered as on a Hopper GPU): a repeated
    plain call takes its prepared launches (kernels/hopper/prepared.py), the first call the general path."""
    import flashtile.backend
    import flashtile.kernels.hopper
    from flashtile.kernels.hopper import support

    on_hopper = (
        (flashtile.backend, "hopper_unavailable_reason", lambda device: None),
        (support, "device_unsupported_reason", lambda device: None),
        (flashtile.kernels.hopper, "device_unsupported_reason", lambda device: None),
        (hopper_bwd, "bwd_unsupported_reason", lambda q, k, v, dout, options: None),
    )
    saved = [(module, name, getattr(module, name)) for module, name, _ in on_hopper]
    for module, name, stand_in in on_hopper:
        setattr(module, name, stand_in)
    os.environ["FLASHTILE_BACKEND"] = "auto"
    try:
        batch, seqlen, heads, head_dim = 2, 128, 4, 128
        q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch.float16) for _ in range(4))
        qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
        flash_attn_func(qg, kg, vg)
        graph_out = flash_attn_func(qg, kg, vg)
        slopes = torch.rand(heads)
        sink = torch.randn(heads, dtype=torch.bfloat16)
        sink_g = sink.clone().requires_grad_(True)
        rows = {
            "flash_attn_func, inputs requiring grad": lambda: flash_attn_func(qg, kg, vg),
            "flash_attn_func, no grad": lambda: flash_attn_func(q, k, v),
            "backward (torch.autograd.grad)": lambda: torch.autograd.grad(
                graph_out, (qg, kg, vg), dout, retain_graph=True
            ),
            # A fresh graph each call, freed by its backward (the bench's fwd_bwd cells).
            "forward + backward": lambda: torch.autograd.grad(
                flash_attn_func(qg, kg, vg), (qg, kg, vg), dout
            ),
            # ALiBi and dropout (since the thirty-fourth session remembered and prepared like plain calls).
            "flash_attn_func, ALiBi, no grad": lambda: flash_attn_func(q, k, v, alibi_slopes=slopes),
            "flash_attn_func, dropout 0.1, no grad": lambda: flash_attn_func(q, k, v, dropout_p=0.1),
            "ALiBi + dropout, forward + backward": lambda: torch.autograd.grad(
                flash_attn_func(qg, kg, vg, alibi_slopes=slopes, dropout_p=0.1), (qg, kg, vg), dout
            ),
            # A bfloat16 sink, as transformers hands GPT-OSS's (since the thirty-fifth session remembered,
            # since the thirty-sixth prepared).
            "flash_attn_func, sink, no grad": lambda: flash_attn_func(q, k, v, learnable_sink=sink),
            "sink, forward + backward": lambda: torch.autograd.grad(
                flash_attn_func(qg, kg, vg, learnable_sink=sink_g), (qg, kg, vg, sink_g), dout
            ),
        }
        shape = f"B={batch} N={seqlen} H={heads} D={head_dim}"
        print(f"\nthe API on the Hopper route, prepared calls ({shape} fp16;")
        print("the backward's CPU tensors are real: its allocations are in the figure)")
        for name, fn in rows.items():
            print(f"  {name:40s} {per_call_us(fn, reps):7.1f}")
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
        os.environ["FLASHTILE_BACKEND"] = "triton"


def measure_packed(reps: int) -> None:
    """The training example's attention: one packed row (4 documents, 1024 tokens here), GQA 8/2, D = 64,
    causal; the portable launchers through the API, and the Gluon varlen launchers."""
    total, heads, heads_kv, head_dim = 1024, 8, 2, 64
    cu = torch.tensor([0, 100, 356, 700, total], dtype=torch.int32)
    longest = 344
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    q, dout = (torch.randn(total, heads, head_dim, dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn(total, heads_kv, head_dim, dtype=torch.float16) for _ in range(2))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out, lse = torch.randn_like(q), torch.randn(heads, total)
    packed = (cu, cu, longest, longest)

    def api_fwd_bwd():
        o = flashtile.flash_attn_varlen_func(qg, kg, vg, cu, cu, longest, longest, causal=True)
        return torch.autograd.grad(o, (qg, kg, vg), dout)

    rows = {
        "flash_attn_varlen_func, fwd + bwd": api_fwd_bwd,
        "  kernels.bwd.attn_bwd (portable)": lambda: bwd.attn_bwd(
            dout, q, k, v, out, lse, head_dim**-0.5, True, window_size=(-1, 0), **varlen
        ),
        "  kernels.hopper.fwd.attn_fwd (Gluon)": lambda: hopper_fwd.attn_fwd(
            q, k, v, head_dim**-0.5, True, window_size=(-1, 0), **varlen
        ),
        "  kernels.hopper.bwd (Gluon, 3 launches)": lambda: hopper_bwd._launch(
            dout, q, k, v, out, lse, head_dim**-0.5, True, False, (-1, 0), 0.0, None, packed
        ),
    }
    print(f"\npacked row (total {total}, 4 documents, H={heads} H_kv={heads_kv} D={head_dim} fp16, causal)")
    for name, fn in rows.items():
        print(f"  {name:40s} {per_call_us(fn, reps):7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    args = parser.parse_args()
    triton.runtime.driver.set_active(_NoGpuDriver())
    JITFunction._do_compile = _cache_stand_in
    print(f"flashtile from {os.path.dirname(flashtile.__file__)}; host µs per call (CPU time, best of 7)")
    for causal in (False, True):
        measure(causal, args.reps)
    measure_hopper(args.reps)
    measure_hopper_api(args.reps)
    measure_packed(args.reps)


if __name__ == "__main__":
    main()
