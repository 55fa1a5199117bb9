"""Every flash_attn option through the public functions (flash_attn_func, flash_attn_varlen_func and the
packed forms), alone and in a random sample of combinations, on the CPU reference backend and in Triton's
interpreter: out, LSE and every gradient against the float64 oracle under the 2×/3× rule; dropout's
S_dmask, reproducibility and dropped fraction; fully masked rows.

Under dropout the oracle takes its keep mask from the S_dmask the call returned (negative = dropped), and a
separate test checks that mask against ``naive.dropout_mask`` of the state drawn from PyTorch's generator.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch

from flashtile import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashtile.ops import RNG_BOUND
from flashtile.reference import naive
from flashtile.validation import normalize_window
from tests.helpers import HEAD_LAYOUTS, RESULT_NAMES, OptionCase, assert_matches_oracle


@dataclass
class Call:
    """The tensors and keywords of one public call, and the boundaries of a packed batch."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    options: dict
    varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None


def make_call(case: OptionCase) -> Call:
    heads, heads_kv = HEAD_LAYOUTS[case.layout]
    dev, dt, d = case.device, case.dtype, case.head_dim
    batch = len(case.seqlens)
    varlen = None
    if case.varlen:
        lengths_q = torch.tensor([0] + [q for q, _ in case.seqlens])
        lengths_k = torch.tensor([0] + [k for _, k in case.seqlens])
        cu_q = lengths_q.cumsum(0).to(torch.int32).to(dev)
        cu_k = lengths_k.cumsum(0).to(torch.int32).to(dev)
        varlen = (cu_q, cu_k, int(lengths_q.max()), int(lengths_k.max()))
        q = torch.randn(int(cu_q[-1]), heads, d, dtype=dt, device=dev)
        k, v = (torch.randn(int(cu_k[-1]), heads_kv, d, dtype=dt, device=dev) for _ in range(2))
    else:
        seqlen_q, seqlen_k = case.seqlens[0]
        q = torch.randn(batch, seqlen_q, heads, d, dtype=dt, device=dev)
        k, v = (torch.randn(batch, seqlen_k, heads_kv, d, dtype=dt, device=dev) for _ in range(2))
    slopes = None
    if case.alibi is not None:
        slopes = torch.rand((heads,) if case.alibi == "h" else (batch, heads), device=dev) * 0.5 + 0.05
    options = dict(
        dropout_p=case.dropout_p,
        causal=case.causal,
        window_size=case.window,
        softcap=case.softcap,
        alibi_slopes=slopes,
    )
    return Call(q, k, v, torch.randn_like(q), options, varlen)


def run_flashtile(call: Call, **extra) -> dict:
    """out, lse, S_dmask and the gradients of ``(out · dout).sum()`` through the public function."""
    leaves = [t.detach().clone().requires_grad_() for t in (call.q, call.k, call.v)]
    kwargs = dict(call.options, return_attn_probs=True, **extra)
    if call.varlen is None:
        out, lse, s_dmask = flash_attn_func(*leaves, **kwargs)
    else:
        out, lse, s_dmask = flash_attn_varlen_func(*leaves, *call.varlen, **kwargs)
    grads = torch.autograd.grad(out, leaves, call.dout)
    return dict(zip(RESULT_NAMES, (out, lse, *grads), strict=True), s_dmask=s_dmask)


def kept(s_dmask: torch.Tensor) -> torch.Tensor:
    """The keep mask S_dmask encodes: a dropped entry is negated (−0.0 included)."""
    return ~torch.signbit(s_dmask)


def run_naive(call: Call, case: OptionCase, dtype: torch.dtype, s_dmask: torch.Tensor) -> dict:
    """The same call by definition in ``dtype``, the window normalised as flash_attn does."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (call.q, call.k, call.v)]
    seqlen_k = call.k.shape[1] if call.varlen is None else call.varlen[3]
    kwargs = dict(call.options, window_size=normalize_window(case.window, case.causal, seqlen_k))
    if case.dropout_p > 0:
        kwargs["dropout_mask"] = kept(s_dmask)
    if call.varlen is None:
        out, lse = naive.attention(*leaves, **kwargs)
    else:
        out, lse = naive.attention_varlen(*leaves, *call.varlen, **kwargs)
    grads = torch.autograd.grad(out, leaves, call.dout.to(dtype))
    return dict(zip(RESULT_NAMES, (out, lse, *grads), strict=True))


def check_against_oracle(case: OptionCase, seed: int) -> dict:
    call = make_call(case)
    ours = run_flashtile(call)
    oracle = run_naive(call, case, torch.float64, ours["s_dmask"])
    baseline = run_naive(call, case, case.dtype, ours["s_dmask"])
    for name in RESULT_NAMES:
        assert not torch.isnan(ours[name]).any(), f"{name}: NaN ({case.id}, seed {seed})"
        assert_matches_oracle(name, ours[name], oracle[name], baseline[name], grad=name[0] == "d", seed=seed)
    q_shape = call.q.shape
    lse_shape = (q_shape[1], q_shape[0]) if case.varlen else (q_shape[0], q_shape[2], q_shape[1])
    assert ours["lse"].shape == lse_shape and ours["lse"].dtype == torch.float32
    return ours


@pytest.fixture
def triton_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton backend on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")


@pytest.fixture
def reference_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")


ALONE = [
    OptionCase(((37, 53),) * 2, window=(3, 2)),
    OptionCase(((53, 37),) * 2, window=(5, -1), layout="mqa"),
    OptionCase(((41, 41),) * 2, window=(0, 0)),
    OptionCase(((70, 20),) * 2, window=(0, 0), layout="mqa"),
    OptionCase(((37, 53),) * 2, window=(100, 100)),
    OptionCase(((37, 53),) * 2, causal=True, window=(9, -1)),
    OptionCase(((37, 53),) * 2, softcap=0.6),
    OptionCase(((37, 53),) * 2, alibi="h"),
    OptionCase(((53, 37),) * 2, alibi="bh", layout="mha"),
    OptionCase(((37, 53),) * 2, dropout_p=0.3),
    OptionCase(((53, 37),) * 2, dropout_p=0.8, layout="mqa"),
    OptionCase(((17, 29), (0, 5), (40, 33), (9, 0), (1, 1)), varlen=True),
    OptionCase(((40, 17), (65, 65), (3, 70)), varlen=True, causal=True, layout="mqa"),
    OptionCase(((40, 17), (33, 33), (13, 70)), varlen=True, window=(4, 1), alibi="bh", softcap=2.0),
    OptionCase(((20, 31), (0, 9), (33, 33)), varlen=True, dropout_p=0.25),
]


def combinations(count: int, rng: random.Random) -> list[OptionCase]:
    """A reproducible random sample of every option combined (drawn once, at collection)."""
    cases = []
    for _ in range(count):
        varlen = rng.random() < 0.5
        dropout_p = rng.choice([0.0, 0.0, 0.17, 0.6])
        # Under dropout, rows that see one or two keys make the low-precision baseline's dS exactly 0 while
        # the kernels' Δ = rowsum(dO∘O) carries O's rounding: draw sequences and windows of several keys.
        queries = [13, 37, 64, 97] if dropout_p else [1, 13, 37, 64, 97]
        keys = [19, 53, 64, 101] if dropout_p else [1, 19, 53, 64, 101]
        bounds = [-1, -1, 6, 33, 200] if dropout_p else [-1, -1, 0, 1, 6, 33, 200]
        pairs = [(rng.choice(queries), rng.choice(keys)) for _ in range(3)]
        if varlen:
            pairs[rng.randrange(3)] = rng.choice([(0, 7), (7, 0), (0, 0)])
        else:
            pairs = [pairs[0]] * 2
        cases.append(
            OptionCase(
                tuple(pairs),
                layout=rng.choice(list(HEAD_LAYOUTS)),
                head_dim=rng.choice([32, 40]),
                causal=rng.random() < 0.4,
                window=tuple(rng.choice(bounds) for _ in range(2)),
                softcap=rng.choice([0.0, 0.0, 0.5, 3.0]),
                alibi=rng.choice([None, "h", "bh"]),
                dropout_p=dropout_p,
                varlen=varlen,
                dtype=rng.choice([torch.float16, torch.bfloat16]),
            )
        )
    return cases


@pytest.mark.parametrize("case", ALONE + combinations(16, random.Random(88)), ids=lambda c: c.id)
@pytest.mark.usefixtures("nan_poisoned_allocations", "reference_backend")
def test_reference_backend_matches_oracle(case: OptionCase, seed: int) -> None:
    check_against_oracle(case, seed)


INTERPRETER_CASES = [
    OptionCase(((37, 53),) * 2, window=(5, 2), softcap=2.0, alibi="bh"),
    OptionCase(((53, 37),) * 2, causal=True, dropout_p=0.3, layout="mqa"),
    OptionCase(((17, 29), (0, 5), (40, 33), (9, 0)), varlen=True, causal=True, window=(6, -1), alibi="h"),
    OptionCase(((20, 31), (33, 33)), varlen=True, dropout_p=0.2, softcap=3.0, layout="mha"),
]


@pytest.mark.parametrize("case", INTERPRETER_CASES, ids=lambda c: c.id)
@pytest.mark.usefixtures("nan_poisoned_allocations", "triton_backend")
def test_triton_interpreter_matches_oracle(case: OptionCase, seed: int) -> None:
    check_against_oracle(case, seed)


@pytest.mark.parametrize(
    "case",
    [
        OptionCase(((9, 4),), causal=True, dtype=torch.float32),
        OptionCase(((12, 9),), window=(0, 0), dtype=torch.float32, layout="mqa"),
        OptionCase(((6, 3), (0, 4), (5, 0)), varlen=True, causal=True, dropout_p=0.5, dtype=torch.float32),
    ],
    ids=lambda c: c.id,
)
def test_fully_masked_rows(case: OptionCase, seed: int) -> None:
    # With N_q > N_k, causal and the window (0, 0) leave the first rows with no key; so does N_k = 0.
    call = make_call(case)
    ours = run_flashtile(call)
    lse = ours["lse"]
    masked = torch.isneginf(lse)
    assert masked.any(), "the case has no fully masked row"
    rows = masked.transpose(-1, -2) if case.varlen else masked.transpose(1, 2)
    assert torch.all(ours["out"][rows] == 0)
    for name in ("dq", "dk", "dv"):
        assert torch.isfinite(ours[name]).all(), name
    assert torch.all(ours["dq"][rows] == 0)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_same_seed_is_bitwise_reproducible(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    case = OptionCase(
        ((23, 31),) * 2, dropout_p=0.4, window=(9, 3), softcap=2.0, alibi="h", dtype=torch.float32
    )
    call = make_call(case)
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        runs.append(run_flashtile(call, deterministic=True))
    for name in (*RESULT_NAMES, "s_dmask"):
        assert torch.equal(runs[0][name], runs[1][name]), name
    # A new draw gives a new mask.
    assert not torch.equal(kept(run_flashtile(call)["s_dmask"]), kept(runs[0]["s_dmask"]))


def test_mask_comes_from_the_torch_generator_and_matches_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One int64 (seed, offset) drawn with torch.randint below 2⁶² from the generator of q's device.
    case = OptionCase(((13, 21),) * 2, dropout_p=0.5, layout="mqa", dtype=torch.float32)
    call = make_call(case)
    torch.manual_seed(77)
    rng_state = torch.randint(0, RNG_BOUND, (2,), dtype=torch.int64)
    expected = naive.dropout_mask(rng_state, 0.5, 2, 3, 13, 21)
    for backend in ("reference", "triton"):
        if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            continue
        monkeypatch.setenv("FLASHTILE_BACKEND", backend)
        torch.manual_seed(77)
        s_dmask = run_flashtile(call)["s_dmask"]
        assert s_dmask.shape == (2, 3, 13, 21)
        assert torch.equal(kept(s_dmask), expected), backend


@pytest.mark.usefixtures("reference_backend")
@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_dropped_fraction_is_p(dropout_p: float, seed: int) -> None:
    q = torch.randn(2, 256, 4, 8) * 0.1
    _, _, s_dmask = flash_attn_func(q, q, q, dropout_p=dropout_p, return_attn_probs=True)
    dropped = torch.signbit(s_dmask).double().mean().item()
    assert abs(dropped - dropout_p) < 0.01, (dropped, dropout_p)


@pytest.mark.usefixtures("reference_backend")
def test_s_dmask_holds_the_probabilities(seed: int) -> None:
    q, k, v = (torch.randn(1, 11, 2, 16, dtype=torch.float64) for _ in range(3))
    _, _, s_dmask = flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True)
    torch.testing.assert_close(s_dmask.abs(), naive.attention_probs(q, k, v, causal=True))


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_varlen_equals_per_sequence_bitwise_forward(
    backend: str, dropout_p: float, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    case = OptionCase(
        ((17, 29), (0, 5), (40, 33), (9, 0)), varlen=True, window=(7, 2), alibi="bh", softcap=3.0,
        dropout_p=dropout_p,
    )  # fmt: skip
    call = make_call(case)
    cu_q, cu_k, _, _ = call.varlen
    out, lse, s_dmask = flash_attn_varlen_func(
        call.q, call.k, call.v, *call.varlen, return_attn_probs=True, **call.options
    )
    for b in range(len(case.seqlens)):
        (q0, q1), (k0, k1) = cu_q.tolist()[b : b + 2], cu_k.tolist()[b : b + 2]
        options = dict(call.options, alibi_slopes=call.options["alibi_slopes"][b : b + 1])
        if dropout_p:
            # A batch of one draws the mask of sequence 0: compare against the reference with this mask.
            mask = kept(s_dmask)[b : b + 1, :, : q1 - q0, : k1 - k0]
            options.pop("dropout_p")
            window = normalize_window(case.window, case.causal, call.varlen[3])
            expected, expected_lse = naive.attention(
                call.q[None, q0:q1].double(), call.k[None, k0:k1].double(), call.v[None, k0:k1].double(),
                **dict(options, window_size=window), dropout_p=dropout_p, dropout_mask=mask,
            )  # fmt: skip
            torch.testing.assert_close(out[q0:q1], expected[0].to(out.dtype), atol=2e-3, rtol=2e-3)
            continue
        expected, expected_lse, _ = flash_attn_func(
            call.q[None, q0:q1], call.k[None, k0:k1], call.v[None, k0:k1], return_attn_probs=True, **options
        )
        assert torch.equal(out[q0:q1], expected[0]), b
        assert torch.equal(lse[:, q0:q1], expected_lse[0]), b


def test_varlen_packed_forms_match_unpacked(seed: int) -> None:
    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    qkv = torch.randn(17, 3, 2, 16, dtype=torch.float64)
    q, k, v = qkv.unbind(1)
    expected = flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True, softcap=1.5)
    torch.testing.assert_close(
        flash_attn_varlen_qkvpacked_func(qkv, cu, 12, causal=True, softcap=1.5), expected
    )
    kv = qkv[:, 1:]
    torch.testing.assert_close(
        flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 12, 12, causal=True, softcap=1.5), expected
    )


def test_dense_packed_forms_take_every_option(seed: int) -> None:
    qkv = torch.randn(2, 13, 3, 2, 16, dtype=torch.float64)
    q, k, v = qkv.unbind(2)
    slopes = torch.rand(2, 2)
    options = dict(window_size=(3, 1), softcap=2.0, alibi_slopes=slopes)
    expected = flash_attn_func(q, k, v, **options)
    torch.testing.assert_close(flash_attn_qkvpacked_func(qkv, **options), expected)
    torch.testing.assert_close(flash_attn_kvpacked_func(q, qkv[:, :, 1:], **options), expected)


def test_varlen_all_empty_sequences() -> None:
    q = torch.randn(0, 2, 16)
    cu = torch.zeros(3, dtype=torch.int32)
    out, lse, _ = flash_attn_varlen_func(q, q, q, cu, cu, 0, 0, causal=True, return_attn_probs=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)


def test_deterministic_gradients_bitwise_over_runs(seed: int) -> None:
    case = OptionCase(((29, 41),) * 2, dropout_p=0.2, window=(5, 5), alibi="bh", dtype=torch.float32)
    call = make_call(case)
    runs = []
    for _ in range(5):
        torch.manual_seed(seed)
        runs.append(run_flashtile(call, deterministic=True))
    for run in runs[1:]:
        for name in ("dq", "dk", "dv"):
            assert torch.equal(run[name], runs[0][name]), name
