"""The kernel options (sliding window, softcap, ALiBi, dropout, variable length) alone and combined, forward
and backward, against the float64 oracle under flash-attention's 2×/3× rule; dropout's mask against the
reference Philox bit for bit; varlen against per-sequence runs bit for bit.

On the CPU they run in Triton's interpreter (fp16, small shapes); ``pytest -m gpu`` runs the GPU cases in
fp16 and bf16 up to N = 4096 and head dims 64/128/256.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
import torch

from flashtile.kernels._dropout import dropout_mask
from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd
from flashtile.reference import naive
from flashtile.reference.dropout import dropout_keep
from flashtile.validation import normalize_window
from tests.helpers import HEAD_LAYOUTS, RESULT_NAMES, OptionCase, assert_matches_oracle


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    kwargs: dict
    oracle_kwargs: dict


def _make(case: OptionCase) -> Problem:
    heads, heads_kv = HEAD_LAYOUTS[case.layout]
    dev, dt, d = case.device, case.dtype, case.head_dim
    batch = len(case.seqlens)
    if case.varlen:
        lengths_q = torch.tensor([0] + [q for q, _ in case.seqlens])
        lengths_k = torch.tensor([0] + [k for _, k in case.seqlens])
        cu_q = lengths_q.cumsum(0).to(torch.int32).to(dev)
        cu_k = lengths_k.cumsum(0).to(torch.int32).to(dev)
        max_q, max_k = int(lengths_q.max()), int(lengths_k.max())
        q = torch.randn(int(cu_q[-1]), heads, d, dtype=dt, device=dev)
        k, v = (torch.randn(int(cu_k[-1]), heads_kv, d, dtype=dt, device=dev) for _ in range(2))
        varlen_kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    else:
        max_q, max_k = case.seqlens[0]
        q = torch.randn(batch, max_q, heads, d, dtype=dt, device=dev)
        k, v = (torch.randn(batch, max_k, heads_kv, d, dtype=dt, device=dev) for _ in range(2))
        varlen_kwargs = {}
    window = normalize_window(case.window, case.causal, max_k)
    slopes = None
    if case.alibi is not None:
        slopes = torch.rand((heads,) if case.alibi == "h" else (batch, heads), device=dev) * 0.5 + 0.05
    rng_state, mask = None, None
    if case.dropout_p > 0:
        rng_state = torch.randint(-(2**62), 2**62, (2,), device=dev)
        mask = naive.dropout_mask(rng_state, case.dropout_p, batch, heads, max_q, max_k)
    options = dict(window_size=window, softcap=case.softcap, alibi_slopes=slopes, dropout_p=case.dropout_p)
    return Problem(
        q,
        k,
        v,
        torch.randn_like(q),
        dict(options, rng_state=rng_state, **varlen_kwargs),
        dict(options, causal=case.causal, dropout_mask=mask, **varlen_kwargs),
    )


def _kernels(p: Problem, case: OptionCase, scale: float):
    out, lse = attn_fwd(p.q, p.k, p.v, scale, case.causal, **p.kwargs)
    return (out, lse, *attn_bwd(p.dout, p.q, p.k, p.v, out, lse, scale, case.causal, **p.kwargs))


def _naive(p: Problem, case: OptionCase, scale: float, dtype: torch.dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (p.q, p.k, p.v)]
    kw = dict(p.oracle_kwargs, softmax_scale=scale)
    if case.varlen:
        cu_q, cu_k = kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k")
        max_q, max_k = kw.pop("max_seqlen_q"), kw.pop("max_seqlen_k")
        out, lse = naive.attention_varlen(*leaves, cu_q, cu_k, max_q, max_k, **kw)
    else:
        out, lse = naive.attention(*leaves, **kw)
    out.backward(p.dout.to(dtype))
    return out, lse, *(t.grad for t in leaves)


def _check_against_oracle(case: OptionCase, seed: int) -> None:
    problem = _make(case)
    scale = case.head_dim**-0.5
    ours = _kernels(problem, case, scale)
    oracle = _naive(problem, case, scale, torch.float64)
    baseline = _naive(problem, case, scale, case.dtype)
    for name, mine, ref, base in zip(RESULT_NAMES, ours, oracle, baseline, strict=True):
        assert not torch.isnan(mine).any(), f"{name}: NaN ({case.id}, seed {seed})"
        assert_matches_oracle(name, mine, ref, base, grad=name.startswith("d"), seed=seed)


ALONE = [
    OptionCase(((37, 53),) * 2, window=(3, 2)),
    OptionCase(((53, 37),) * 2, window=(5, -1), layout="mqa"),
    OptionCase(((53, 37),) * 2, window=(-1, 4), layout="mha"),
    OptionCase(((41, 41),) * 2, window=(0, 0)),
    OptionCase(((70, 20),) * 2, window=(0, 0), layout="mqa"),
    OptionCase(((37, 53),) * 2, window=(100, 100)),
    OptionCase(((37, 100),) * 2, window=(7, 0), head_dim=59),
    OptionCase(((37, 53),) * 2, causal=True, window=(9, -1)),
    OptionCase(((37, 53),) * 2, softcap=0.6),
    OptionCase(((53, 37),) * 2, softcap=5.0, layout="mqa"),
    OptionCase(((37, 53),) * 2, alibi="h"),
    OptionCase(((53, 37),) * 2, alibi="bh", layout="mha"),
    OptionCase(((37, 53),) * 2, dropout_p=0.3),
    OptionCase(((53, 37),) * 2, dropout_p=0.8, layout="mqa", head_dim=59),
    OptionCase(((17, 29), (0, 5), (40, 33), (9, 0), (1, 1)), varlen=True),
    OptionCase(((40, 17), (65, 65), (3, 70)), varlen=True, causal=True, layout="mqa"),
]


def _combinations(count: int, rng: random.Random) -> list[OptionCase]:
    """A reproducible random sample of every option combined (drawn once, at collection)."""
    cases = []
    for _ in range(count):
        varlen = rng.random() < 0.5
        dropout_p = rng.choice([0.0, 0.0, 0.17, 0.6])
        # The kernels form Δ = rowsum(dO∘O) from O rounded to the input dtype, as flash_attn does, where
        # autograd forms it from P·dP. Under dropout (O scaled by 1/(1 − p)) that rounding can dominate dS
        # in rows seeing one or two keys: with a single key the baseline's dS is exactly 0, and a problem
        # of a single query row takes its max error over a handful of such entries. So dropout is drawn
        # with sequences of several rows and keys (docs/design/kernels.md, "Options in the kernels").
        queries = [13, 37, 64, 97] if dropout_p else [1, 13, 37, 64, 97]
        keys = [19, 53, 64, 101] if dropout_p else [1, 19, 53, 64, 101]
        pairs = [(rng.choice(queries), rng.choice(keys)) for _ in range(3)]
        if varlen:
            pairs[rng.randrange(3)] = rng.choice([(0, 7), (7, 0), (0, 0)])
        else:
            pairs = [pairs[0]] * 2
        window = tuple(rng.choice([-1, -1, 0, 1, 6, 33, 200]) for _ in range(2))
        cases.append(
            OptionCase(
                tuple(pairs),
                layout=rng.choice(list(HEAD_LAYOUTS)),
                head_dim=rng.choice([32, 40]),
                causal=rng.random() < 0.4,
                window=window,
                softcap=rng.choice([0.0, 0.0, 0.5, 3.0]),
                alibi=rng.choice([None, "h", "bh"]),
                dropout_p=dropout_p,
                varlen=varlen,
            )
        )
    return cases


COMBINED = _combinations(14, random.Random(8))


@pytest.mark.parametrize("case", ALONE + COMBINED, ids=lambda c: c.id)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_options_match_oracle(case, seed):
    _check_against_oracle(case, seed)


@pytest.fixture
def one_dkdv_program_per_query_head(monkeypatch):
    """The dK/dV kernel in its per-query-head mode (chosen for small GQA grids) for every call."""
    from flashtile.kernels import bwd

    monkeypatch.setattr(bwd, "MIN_DKDV_PROGRAMS_PER_SM", 10**9)
    bwd._bwd_launches.cache_clear()
    yield
    bwd._bwd_launches.cache_clear()


@pytest.mark.parametrize("case", [c for c in COMBINED if c.layout != "mha"], ids=lambda c: c.id)
@pytest.mark.usefixtures("nan_poisoned_allocations", "one_dkdv_program_per_query_head")
def test_options_match_oracle_with_one_dkdv_program_per_query_head(case, seed):
    _check_against_oracle(case, seed)


def _gpu_cases() -> list:
    cases = []
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128, 256):
            gpu = dict(dtype=dtype, head_dim=d, device="cuda")
            cases += [
                OptionCase(((1023, 1025),) * 2, window=(256, 0), **gpu),
                OptionCase(((4096, 4096),), window=(256, 0), layout="mqa", **gpu),
                OptionCase(((1025, 777),) * 2, window=(100, 31), softcap=30.0, alibi="bh", **gpu),
                OptionCase(((777, 1025),) * 2, causal=True, alibi="h", dropout_p=0.1, **gpu),
                OptionCase(((4096, 4096),), softcap=50.0, dropout_p=0.2, layout="mha", **gpu),
                OptionCase(
                    ((1000, 1200), (0, 9), (2048, 2048), (1, 1), (300, 0)), varlen=True, causal=True, **gpu
                ),
                OptionCase(((513, 2000), (2000, 513)), varlen=True, window=(64, 64), dropout_p=0.1, **gpu),
            ]
    return [pytest.param(c, id=c.id, marks=pytest.mark.gpu) for c in cases]


@pytest.mark.parametrize("case", _gpu_cases())
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_options_match_oracle_gpu(case, seed):
    _check_against_oracle(case, seed)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_window_fully_masked_rows_and_unseen_keys(device, seed):
    # N_q > N_k with window (2, 0): the first 50 query rows see no key. N_q < N_k with window (3, 0):
    # keys before 47 are seen by no query, so their dK and dV are 0.
    for (sq, sk), window, dead_rows, dead_keys in (((70, 20), (2, 0), 50, 0), ((20, 70), (3, 0), 0, 47)):
        q, dout = (torch.randn(1, sq, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
        k, v = (torch.randn(1, sk, 1, 32, dtype=torch.float16, device=device) for _ in range(2))
        kw = dict(window_size=window, softcap=2.0, alibi_slopes=torch.full((2,), 0.3, device=device))
        out, lse = attn_fwd(q, k, v, 0.2, False, **kw)
        dq, dk, dv = attn_bwd(dout, q, k, v, out, lse, 0.2, False, **kw)
        assert torch.equal(out[:, :dead_rows], torch.zeros_like(out[:, :dead_rows]))
        assert torch.isneginf(lse[:, :, :dead_rows]).all() and torch.isfinite(lse[:, :, dead_rows:]).all()
        assert all(torch.isfinite(g).all() for g in (dq, dk, dv))
        assert not dq[:, :dead_rows].any() and not dk[:, :dead_keys].any() and not dv[:, :dead_keys].any()


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_dropout_mask_equals_reference_philox(device, seed):
    for p in (0.1, 0.5, 0.97):
        state = torch.randint(-(2**62), 2**62, (2,), device=device)
        # An offset past 2³²: both sides take its low 32 bits.
        state[1] = state[1].abs() | (1 << 40)
        ours = dropout_mask(state, p, 2, 3, 45, 70)
        b = torch.arange(2, device=device)[:, None, None, None]
        h = torch.arange(3, device=device)[:, None, None]
        rows, cols = torch.arange(45, device=device)[:, None], torch.arange(70, device=device)
        assert torch.equal(ours, dropout_keep(state, p, b, h, 3, rows, cols)), (p, seed)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropped_fraction_is_within_a_hundredth_of_p(p, seed):
    keep = dropout_mask(torch.randint(-(2**62), 2**62, (2,)), p, 1, 4, 256, 256)
    assert abs((1 - keep.float().mean().item()) - p) < 0.01, seed


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_same_rng_state_gives_bitwise_equal_results(device, seed):
    case = OptionCase(((37, 53),) * 2, dropout_p=0.4, window=(20, 3), softcap=1.5, device=device)
    problem = _make(case)
    first = _kernels(problem, case, 0.2)
    again = _kernels(problem, case, 0.2)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    problem.kwargs["rng_state"] = problem.kwargs["rng_state"] + 1
    assert not torch.equal(_kernels(problem, case, 0.2)[0], first[0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_varlen_forward_equals_per_sequence_runs_bitwise(device, seed):
    case = OptionCase(
        ((17, 29), (0, 5), (40, 33), (9, 0), (1, 1), (64, 64)),
        varlen=True, window=(6, 9), softcap=0.8, alibi="bh", layout="mqa", device=device,
    )  # fmt: skip
    problem = _make(case)
    kw = problem.kwargs
    out, lse = attn_fwd(problem.q, problem.k, problem.v, 0.3, False, **kw)
    cu_q, cu_k = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_k"].tolist()
    for b in range(len(case.seqlens)):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        window = normalize_window(case.window, False, keys.stop - keys.start)
        one_out, one_lse = attn_fwd(
            problem.q[None, rows], problem.k[None, keys], problem.v[None, keys], 0.3, False,
            window_size=window, softcap=case.softcap, alibi_slopes=kw["alibi_slopes"][b],
        )  # fmt: skip
        assert torch.equal(one_out[0], out[rows]), (b, seed)
        assert torch.equal(one_lse[0], lse[:, rows]), (b, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_varlen_of_equal_lengths_equals_the_dense_batch_bitwise_with_dropout(device, seed):
    dense = OptionCase(((37, 45),) * 3, dropout_p=0.3, causal=True, alibi="bh", device=device)
    problem = _make(dense)
    ours = _kernels(problem, dense, 0.25)
    packed = replace(dense, varlen=True)
    cu_q = torch.arange(0, 4 * 37, 37, dtype=torch.int32, device=device)
    cu_k = torch.arange(0, 4 * 45, 45, dtype=torch.int32, device=device)
    flat = Problem(
        *(t.flatten(0, 1) for t in (problem.q, problem.k, problem.v, problem.dout)),
        dict(problem.kwargs, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=37, max_seqlen_k=45),
        {},
    )
    theirs = _kernels(flat, packed, 0.25)
    # lse: (B, H, N) dense, (H, B·N) packed.
    dense_as_packed = (
        ours[0].flatten(0, 1),
        ours[1].transpose(0, 1).flatten(1),
        *(g.flatten(0, 1) for g in ours[2:]),
    )
    for name, a, b in zip(RESULT_NAMES, dense_as_packed, theirs, strict=True):
        assert torch.equal(a, b), (name, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_cu_seqlens_stay_inside_the_packed_tensors(device, seed):
    # The API cannot check cu_seqlens without a host sync: decreasing bounds and bounds past the total are
    # clamped in the kernels (tokens no sequence covers are left unwritten), never followed out of bounds.
    q = torch.randn(60, 2, 32, dtype=torch.float16, device=device)
    k, v = (torch.randn(40, 1, 32, dtype=torch.float16, device=device) for _ in range(2))
    cu_q = torch.tensor([0, 30, 30, 1000], dtype=torch.int32, device=device)
    cu_k = torch.tensor([-5, 20, 10, 99], dtype=torch.int32, device=device)
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=64, max_seqlen_k=64, window_size=(3, -1))
    out, lse = attn_fwd(q, k, v, 0.2, True, **kw)
    grads = attn_bwd(torch.randn_like(q), q, k, v, out, lse, 0.2, True, **kw)
    # Sequence 0 (queries 0–29, keys 0–19) is well formed and no other sequence writes its rows.
    dense_out, _ = attn_fwd(q[None, :30], k[None, :20], v[None, :20], 0.2, True, window_size=(3, -1))
    assert torch.equal(out[:30], dense_out[0])
    assert all(g.shape == t.shape for g, t in zip(grads, (q, k, v), strict=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_strided_alibi_slopes_and_rng_state(device, seed):
    # Views with non-unit strides: the kernels address slopes[b, h] and rng_state[0:2] with unit strides.
    q = torch.randn(2, 29, 3, 32, dtype=torch.float16, device=device)
    k, v = (torch.randn(2, 41, 3, 32, dtype=torch.float16, device=device) for _ in range(2))
    state = torch.randint(-(2**62), 2**62, (2, 2), device=device)[:, 1]
    mask = naive.dropout_mask(state.contiguous(), 0.25, 2, 3, 29, 41)
    for slopes in (torch.rand(3, 2, device=device).t(), torch.rand(3, 2, device=device)[:, 0]):
        out, lse = attn_fwd(q, k, v, 0.3, False, alibi_slopes=slopes, dropout_p=0.25, rng_state=state)
        kw = dict(softmax_scale=0.3, alibi_slopes=slopes, dropout_p=0.25, dropout_mask=mask)
        ref = naive.attention(*(t.double() for t in (q, k, v)), **kw)
        base = naive.attention(q, k, v, **kw)
        for name, ours, r, b in zip(("out", "lse"), (out, lse), ref, base, strict=True):
            assert_matches_oracle(name, ours, r, b, seed=seed)
