"""GPU suite of flash_attn_with_kvcache and paged varlen: the Triton path (append kernel, split-KV decode
kernel for ≤ 16 queries, paged gather + varlen kernel beyond) against the float64 oracle of
tests/test_kvcache.py, in fp16 and bf16, over page sizes, head layouts and every option."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from flashtile import flash_attn_with_kvcache
from flashtile.errors import FlashtileValueError
from tests.test_kvcache import Case, _check, _inputs

pytestmark = pytest.mark.gpu

BASE = [
    Case(seqlen_q=1, seqlen_new=1, capacity=512),
    Case(seqlen_q=1, seqlen_new=1, capacity=1024, page_size=16, layout="mqa", rotary_fraction=1.0),
    Case(
        seqlen_q=4,
        seqlen_new=4,
        capacity=1024,
        page_size=64,
        causal=True,
        rotary_fraction=0.5,
        interleaved=False,
    ),
    Case(seqlen_q=16, seqlen_new=16, capacity=2048, page_size=256, causal=True, leftpad=True, alibi=True),
    Case(seqlen_q=3, seqlen_new=1, capacity=777, window=(100, 0), softcap=30.0, layout="mha"),
    Case(seqlen_q=5, seqlen_new=2, capacity=640, batch_idx=True, leftpad=True, rotary_fraction=1.0),
    Case(seqlen_q=2, seqlen_new=0, capacity=4096, page_size=256, window=(300, 7), alibi=True),
    Case(
        seqlen_q=1, seqlen_new=1, capacity=1024, head_dim=128, page_size=64, causal=True, rotary_fraction=1.0
    ),
    Case(seqlen_q=8, seqlen_new=8, capacity=512, head_dim=80, causal=True, layout="mqa"),
    Case(seqlen_q=33, seqlen_new=33, capacity=512, page_size=16, causal=True, rotary_fraction=1.0),
]
CASES = [replace(c, device="cuda", dtype=dt) for c in BASE for dt in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_triton_matches_oracle(case: Case, num_splits: int, seed: int, nan_poisoned_allocations) -> None:
    _check(case, seed, num_splits)


@pytest.mark.parametrize("page_size", [None, 16])
def test_overflow_on_cuda_is_an_error_that_writes_nothing(page_size: int | None) -> None:
    args = _inputs(Case(seqlen_new=2, capacity=64, page_size=page_size, device="cuda"))
    args["cache_seqlens"] = args["cache_seqlens"].clone()
    args["cache_seqlens"][2] = 63
    before = args["k_cache"].clone(), args["v_cache"].clone()
    with pytest.raises(FlashtileValueError, match="too short"):
        flash_attn_with_kvcache(**args)
    torch.testing.assert_close(args["k_cache"], before[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(args["v_cache"], before[1], rtol=0, atol=0, equal_nan=True)
