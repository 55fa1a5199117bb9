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


def _skip_unless_free_gpu_memory(needed_bytes: int) -> None:
    free, _ = torch.cuda.mem_get_info()
    if free < needed_bytes:
        pytest.skip(f"needs {needed_bytes / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")


@pytest.mark.gpu
def test_tensors_of_more_than_2_31_elements(seed):
    # 262,336 · 64 · 128 = 2³¹ + 1.6 M elements (4 GiB in bf16): every offset past 2³¹ needs int64.
    shape = (1, 262_336, 64, 128)
    numel = shape[0] * shape[1] * shape[2] * shape[3]
    assert numel > 2**31
    # q, k, v, dout, out, dq, dk, dv, and one more for the copies of single heads and the allocator.
    _skip_unless_free_gpu_memory(9 * numel * 2)
    q, k, v, dout = (torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    scale = 128**-0.5
    results = _fwd_bwd(q, k, v, dout, scale, True)
    torch.cuda.synchronize()
    # One head alone is a small contiguous problem with the same config: the same arithmetic, bit for bit.
    for h in (0, shape[2] - 1):
        alone = _fwd_bwd(*(t[:, :, h : h + 1].contiguous() for t in (q, k, v, dout)), scale, True)
        for name, full, single in zip(NAMES, results, alone, strict=True):
            head = full[:, h : h + 1] if name == "lse" else full[:, :, h : h + 1]
            assert torch.equal(head, single), f"{name}, head {h}: differs from the head run alone"


@pytest.mark.gpu
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_dout_with_a_row_stride_past_2_31(seed):
    # dout is a slice of a wider tensor with rows 2²³ elements apart: row 256 starts past 2³¹ elements.
    seqlen, heads, head_dim, width = 300, 2, 64, 2**22
    _skip_unless_free_gpu_memory(seqlen * heads * width * 2 + 2**30)
    q, k, v = (torch.randn(1, seqlen, heads, head_dim, dtype=torch.float16, device="cuda") for _ in range(3))
    dout = torch.zeros(1, seqlen, heads, width, dtype=torch.float16, device="cuda")[..., :head_dim]
    dout.copy_(torch.randn_like(q))
    assert dout.stride(1) * (seqlen - 1) > 2**31
    ours = _fwd_bwd(q, k, v, dout, 0.125, False)
    _assert_matches_oracle(ours, q, k, v, dout, 0.125, False, seed)
