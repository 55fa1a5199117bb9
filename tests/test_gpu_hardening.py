"""The launchers at the edges a training job reaches: a second GPU, B·H ≥ 65,536, more than 2³¹ elements
in one tensor, a ``dout`` with a huge row stride. The launch-grid check runs on the CPU without executing
a kernel; the rest need the GPU (``pytest -m gpu``)."""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd


def _fwd_bwd(q, k, v, dout, scale, causal):
    out, lse = attn_fwd(q, k, v, scale, causal)
    return (out, lse, *attn_bwd(dout, q, k, v, out, lse, scale, causal))


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
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), on_0, on_1, strict=True):
        assert b.device == torch.device("cuda:1"), name
        assert torch.equal(a.cpu(), b.cpu()), f"{name} on cuda:1 differs from cuda:0 (seed {seed})"
