"""Head dims past 256 and V head dims different from Q/K's (192/128, 576/512, 256/256, 512/512, and odd
pairs) in the kernels, forward and backward, against the float64 naive reference under the 2×/3× rule;
through the API with every backend; and clear errors past the limits.

On the CPU the kernels run in Triton's interpreter (fp16, small shapes); ``pytest -m gpu`` runs bf16 at
N ≈ 1k.
"""

from __future__ import annotations

import pytest
import torch

from flashtile import flash_attn_func, flash_attn_varlen_func
from flashtile.reference import naive
from tests.test_sinks import SinkCase, check_against_oracle

# (Q/K head dim, V head dim): DeepSeek's MLA prefill, its absorbed decode shape, the wide equal dims,
# and odd pairs that pad each side differently.
PAIRS = [(192, 128), (576, 512), (256, 256), (512, 512), (40, 24), (24, 72)]


def _cpu_cases() -> list[SinkCase]:
    cases = []
    for i, (d, dv) in enumerate(PAIRS):
        # Rotate the options so that each pair meets a different one, at tiny sizes for the interpreter.
        extra = [
            dict(causal=True),
            dict(sink=None),
            dict(window=(4, 3), layout="mqa"),
            dict(sink=None, causal=True, layout="mha"),
            dict(varlen=True, seqlens=((9, 20), (0, 3), (21, 8))),
            dict(dropout_p=0.2, softcap=1.0),
        ][i]
        seqlens = extra.pop("seqlens", ((19, 23),))
        cases.append(SinkCase(seqlens, head_dim=d, head_dim_v=dv, **extra))
    return cases


@pytest.mark.parametrize("case", _cpu_cases(), ids=lambda c: c.id)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_head_dim_pairs_match_oracle(case, seed):
    check_against_oracle(case, seed)


def _gpu_cases() -> list:
    cases = []
    for d, dv in PAIRS:
        gpu = dict(dtype=torch.bfloat16, device="cuda", head_dim=d, head_dim_v=dv)
        cases += [
            SinkCase(((1023, 1025),) * 2, sink=None, **gpu),
            SinkCase(((777, 1025),) * 2, causal=True, layout="mqa", **gpu),
            SinkCase(((700, 513), (0, 9), (1025, 1025)), varlen=True, window=(128, 0), sink=None, **gpu),
        ]
    return [pytest.param(c, id=c.id, marks=pytest.mark.gpu) for c in cases]


@pytest.mark.parametrize("case", _gpu_cases())
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_head_dim_pairs_match_oracle_gpu(case, seed):
    check_against_oracle(case, seed)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_v_head_dim_through_the_api(backend, seed, monkeypatch):
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    q = torch.randn(2, 9, 4, 48, requires_grad=True)
    k = torch.randn(2, 11, 2, 48, requires_grad=True)
    v = torch.randn(2, 11, 2, 16, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (2, 9, 4, 16)
    out.backward(torch.ones_like(out))
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    ref, ref_lse = naive.attention(*(t.detach().double() for t in (q, k, v)), causal=True)
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-4, atol=1e-4)

    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    packed = flash_attn_varlen_func(q[0].detach(), k[0, :9].detach(), v[0, :9].detach(), cu, cu, 5, 5)
    assert packed.shape == (9, 4, 16)


def test_no_keys_gives_zeros_in_v_head_dim():
    q, k, v = torch.randn(1, 3, 2, 32), torch.randn(1, 0, 2, 32), torch.randn(1, 0, 2, 8)
    out = flash_attn_func(q, k, v)
    assert out.shape == (1, 3, 2, 8) and (out == 0).all()
