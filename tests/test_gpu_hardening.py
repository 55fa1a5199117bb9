"""The launchers at the edges a training job reaches: a second GPU, B·H ≥ 65,536, more than 2³¹ elements
in one tensor, a ``dout`` with a huge row stride. The launch-grid check runs on the CPU without executing
a kernel; the rest need the GPU (``pytest -m gpu``)."""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels import bwd, fwd
from flashtile.reference import naive
from tests.helpers import assert_matches_oracle

NAMES = ("out", "lse", "dq", "dk", "dv")


def _fwd_bwd(q, k, v, dout, scale, causal):
    out, lse = fwd.attn_fwd(q, k, v, scale, causal)
    return (out, lse, *bwd.attn_bwd(dout, q, k, v, out, lse, scale, causal))


def _assert_matches_oracle(ours, q, k, v, dout, scale, causal, seed, where=""):
    """``ours`` = (out, lse, dq, dk, dv) against naive attention in float64, baseline in q's dtype."""

    def run_naive(dt: torch.dtype):
        leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, lse = naive.attention(*leaves, softmax_scale=scale, causal=causal)
        o.backward(dout.to(dt))
        return o, lse, *(t.grad for t in leaves)

    for name, got, ref, base in zip(NAMES, ours, run_naive(torch.float64), run_naive(q.dtype), strict=True):
        assert_matches_oracle(name + where, got, ref, base, grad=name.startswith("d"), seed=seed)


@pytest.mark.gpu
def test_tensors_on_a_gpu_other_than_the_current_one(seed):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {torch.cuda.device_count()}")
    q, dout = (torch.randn(2, 300, 4, 64, dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(2, 257, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    with torch.cuda.device(0):
        on_0 = _fwd_bwd(*(t.to("cuda:0") for t in (q, k, v, dout)), 0.125, True)
        on_1 = _fwd_bwd(*(t.to("cuda:1") for t in (q, k, v, dout)), 0.125, True)
        torch.cuda.synchronize(1)
        assert torch.cuda.current_device() == 0
    for name, a, b in zip(NAMES, on_0, on_1, strict=True):
        assert b.device == torch.device("cuda:1"), name
        assert torch.equal(a.cpu(), b.cpu()), f"{name} on cuda:1 differs from cuda:0 (seed {seed})"


CUDA_GRID_LIMITS = (2**31 - 1, 65_535, 65_535)


def test_every_launch_grid_is_within_cuda_limits_at_65536_batch_heads(monkeypatch):
    # Record the grid of every launch instead of running it: 65,536 interpreted programs would take hours.
    grids = []

    def record(kernel, grid):
        grids.append((kernel.fn.__name__, grid))
        return lambda *args, **kwargs: None

    kernels = (fwd.attn_fwd_kernel, bwd.attn_bwd_preprocess_kernel, bwd.attn_bwd_dkdv_kernel)
    for cls in {type(k) for k in kernels}:
        monkeypatch.setattr(cls, "__getitem__", record)
    q, k, v = (torch.zeros(4096, 2, 16, 8, dtype=torch.float16) for _ in range(3))
    out, lse = fwd.attn_fwd(q, k, v, 0.5, False)
    bwd.attn_bwd(torch.zeros_like(q), q, k, v, out, lse, 0.5, False)
    names = [name for name, _ in grids]
    assert names == [
        "attn_fwd_kernel",
        "attn_bwd_preprocess_kernel",
        "attn_bwd_dkdv_kernel",
        "attn_bwd_dq_kernel",
    ]
    for name, grid in grids:
        assert len(grid) <= 3 and all(
            0 < g <= limit for g, limit in zip(grid, CUDA_GRID_LIMITS, strict=False)
        ), f"{name}: grid {grid} exceeds CUDA's limits {CUDA_GRID_LIMITS}"


@pytest.mark.gpu
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_65536_batch_heads_forward_and_backward(seed):
    batch, heads = 4096, 16
    q, k, v, dout = (torch.randn(batch, 33, heads, 64, dtype=torch.float16, device="cuda") for _ in range(4))
    results = _fwd_bwd(q, k, v, dout, 0.125, True)
    for b, h in ((0, 0), (1234, 7), (batch - 1, heads - 1)):
        head = [t[b : b + 1, :, h : h + 1] for t in (q, k, v, dout)]
        ours = [t[b : b + 1, h : h + 1] if name == "lse" else t[b : b + 1, :, h : h + 1]
                for name, t in zip(NAMES, results, strict=True)]  # fmt: skip
        _assert_matches_oracle(ours, *head, 0.125, True, seed, where=f"[b={b}, h={h}]")
