"""flash_attn_varlen_func with block_table (a paged KV cache): the same result as the packed keys it
pages, on the reference and the Triton interpreter; NaN in unused pages never reaches the output; bad
tables are errors before any launch; gradients flow into the pages."""

from __future__ import annotations

import pytest
import torch

from flashtile import flash_attn_varlen_func
from flashtile.errors import FlashtileValueError
from flashtile.reference.naive import attention_varlen
from tests.helpers import assert_matches_oracle


def _paged(page_size: int, lengths: list[int], nheads_k: int, d: int, dtype: torch.dtype):
    """Packed keys and values, the same keys spread over shuffled pages (unused pages and rows NaN)."""
    pages_per_seq = max(-(-n // page_size) for n in lengths) + 1
    num_pages = len(lengths) * pages_per_seq + 1
    k_cache = torch.full((num_pages, page_size, nheads_k, d), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    table = torch.full((len(lengths), pages_per_seq), -1, dtype=torch.int32)
    free = torch.randperm(num_pages).tolist()
    ks, vs = [], []
    for b, n in enumerate(lengths):
        k = torch.randn(n, nheads_k, d, dtype=dtype)
        v = torch.randn(n, nheads_k, d, dtype=dtype)
        ks.append(k)
        vs.append(v)
        for j in range(-(-n // page_size)):
            page = free.pop()
            table[b, j] = page
            rows = slice(j * page_size, min((j + 1) * page_size, n))
            k_cache[page, : rows.stop - rows.start] = k[rows]
            v_cache[page, : rows.stop - rows.start] = v[rows]
    return torch.cat(ks), torch.cat(vs), k_cache, v_cache, table


CASES = [
    pytest.param(16, [5, 0, 33], dict(causal=True), torch.float16, id="page16-causal"),
    pytest.param(
        64, [70, 9], dict(window_size=(6, 2), softcap=3.0), torch.float16, id="page64-window-softcap"
    ),
    pytest.param(256, [17, 40], dict(alibi=True), torch.float32, id="page256-alibi"),
]


@pytest.mark.parametrize(("page_size", "lengths", "options", "dtype"), CASES)
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_matches_packed_keys(
    page_size: int, lengths: list[int], options: dict, dtype, backend: str, seed: int, monkeypatch
) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    nheads, nheads_k, d = 4, 2, 16
    k, v, k_cache, v_cache, table = _paged(page_size, lengths, nheads_k, d, dtype)
    q_lengths = [3, 1, 4][: len(lengths)]
    q = torch.randn(sum(q_lengths), nheads, d, dtype=dtype)
    cu_q = torch.tensor([0, *torch.tensor(q_lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    options = dict(options)
    if options.pop("alibi", False):
        options["alibi_slopes"] = torch.rand(len(lengths), nheads) * 0.3
    args = (cu_q, cu_k, max(q_lengths), max(lengths))
    out, lse, _ = flash_attn_varlen_func(
        q, k_cache, v_cache, *args, block_table=table, return_attn_probs=True, **options
    )
    window = options.pop("window_size", (-1, -1))
    causal = options.pop("causal", False)
    ref = dict(causal=causal, window_size=window, **options)
    oracle_out, oracle_lse = attention_varlen(q.double(), k.double(), v.double(), *args, **ref)
    base_out, base_lse = attention_varlen(q, k, v, *args, **ref)
    assert_matches_oracle("out", out, oracle_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, oracle_lse, base_lse, seed=seed)


def test_gradients_reach_the_pages(monkeypatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    _, _, k_cache, v_cache, table = _paged(16, [20, 7], 1, 8, torch.float64)
    k_cache, v_cache = k_cache.nan_to_num().requires_grad_(), v_cache.nan_to_num().requires_grad_()
    q = torch.randn(2, 2, 8, dtype=torch.float64)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 27], dtype=torch.int32)
    out = flash_attn_varlen_func(q, k_cache, v_cache, cu_q, cu_k, 1, 20, block_table=table)
    out.sum().backward()
    used = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for b, n in enumerate((20, 7)):
        for t in range(n):
            used[table[b, t // 16], t % 16] = True
    assert (v_cache.grad.abs().sum((-1, -2)) > 0).eq(used).all()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda t, kc: (t.where(t != t[0, 0], kc.shape[0]), kc), "block_table entries"),
        (lambda t, kc: (t[:, :1], kc), "does not fit"),
        (lambda t, kc: (t, kc[:, :8]), "multiple of 16"),
        (lambda t, kc: (t[:1], kc), "batch_size = 2"),
    ],
    ids=["page-out-of-range", "table-too-short", "page-size", "table-rows"],
)
def test_bad_block_tables(change, match: str, monkeypatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    _, _, k_cache, _, table = _paged(16, [20, 7], 1, 8, torch.float32)
    table, k_cache = change(table, k_cache)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 27], dtype=torch.int32)
    with pytest.raises(FlashtileValueError, match=match):
        flash_attn_varlen_func(torch.randn(2, 2, 8), k_cache, k_cache, cu_q, cu_k, 1, 20, block_table=table)
