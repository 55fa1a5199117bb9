"""The learnable attention sink (GPT-OSS's ``learnable_sink``) in the kernels, the tiled reference and the
API: forward, LSE and every gradient, the sink's own included, against the float64 naive reference under
the 2×/3× rule, alone and with windows, causal, GQA/MQA, varlen, softcap, ALiBi and dropout; rows that see
no key give out = 0, lse = sink and no NaN.

On the CPU the kernels run in Triton's interpreter (fp16, small shapes); ``pytest -m gpu`` runs bf16/fp16
cases at N ≈ 1k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from flashtile import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
from flashtile.kernels.bwd import attn_bwd
from flashtile.kernels.fwd import attn_fwd
from flashtile.reference import naive, tiled
from flashtile.validation import normalize_window
from tests.helpers import HEAD_LAYOUTS, assert_matches_oracle, stored_output_floor

NAMES = ("out", "lse", "dq", "dk", "dv", "dsink")


@dataclass(frozen=True)
class SinkCase:
    """One problem; ``seqlens`` holds one (N_q, N_k) pair per sequence (dense cases use the first for a
    batch of ``len(seqlens)``); ``sink`` is None (no sink), a scale for random logits, or a constant."""

    seqlens: tuple[tuple[int, int], ...]
    layout: str = "gqa"
    head_dim: int = 32
    head_dim_v: int | None = None
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout_p: float = 0.0
    varlen: bool = False
    sink: float | None = 1.0
    sink_const: bool = False
    dtype: torch.dtype = torch.float16
    device: str = "cpu"

    @property
    def id(self) -> str:
        lengths = "_".join(f"{q}x{k}" for q, k in self.seqlens)
        dims = f"d{self.head_dim}" + (f"-{self.head_dim_v}" if self.head_dim_v else "")
        parts = [self.device, "varlen" if self.varlen else "dense", lengths, dims, self.layout]
        parts += ["causal"] if self.causal else []
        parts += [f"w{self.window[0]},{self.window[1]}"] if self.window != (-1, -1) else []
        parts += [f"cap{self.softcap}"] if self.softcap else []
        parts += ["alibi"] if self.alibi else []
        parts += [f"drop{self.dropout_p}"] if self.dropout_p else []
        if self.sink is not None:
            parts += [f"sink={self.sink}" if self.sink_const else f"sink~{self.sink}"]
        return "-".join([*parts, str(self.dtype).removeprefix("torch.")])


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor
    sink: torch.Tensor | None
    kwargs: dict
    oracle_kwargs: dict


def make_problem(case: SinkCase) -> Problem:
    heads, heads_kv = HEAD_LAYOUTS[case.layout]
    dev, dt, d = case.device, case.dtype, case.head_dim
    dv = case.head_dim_v or d
    batch = len(case.seqlens)
    if case.varlen:
        lengths_q = torch.tensor([0] + [q for q, _ in case.seqlens])
        lengths_k = torch.tensor([0] + [k for _, k in case.seqlens])
        cu_q = lengths_q.cumsum(0).to(torch.int32).to(dev)
        cu_k = lengths_k.cumsum(0).to(torch.int32).to(dev)
        max_q, max_k = int(lengths_q.max()), int(lengths_k.max())
        q = torch.randn(int(cu_q[-1]), heads, d, dtype=dt, device=dev)
        k = torch.randn(int(cu_k[-1]), heads_kv, d, dtype=dt, device=dev)
        v = torch.randn(int(cu_k[-1]), heads_kv, dv, dtype=dt, device=dev)
        varlen_kwargs = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k)
    else:
        max_q, max_k = case.seqlens[0]
        q = torch.randn(batch, max_q, heads, d, dtype=dt, device=dev)
        k = torch.randn(batch, max_k, heads_kv, d, dtype=dt, device=dev)
        v = torch.randn(batch, max_k, heads_kv, dv, dtype=dt, device=dev)
        varlen_kwargs = {}
    sink = None
    if case.sink is not None:
        if case.sink_const:
            sink = torch.full((heads,), case.sink, device=dev)
        else:
            sink = torch.randn(heads, device=dev) * case.sink
    window = normalize_window(case.window, case.causal, max_k)
    slopes = torch.rand(heads, device=dev) * 0.5 + 0.05 if case.alibi else None
    rng_state, mask = None, None
    if case.dropout_p > 0:
        rng_state = torch.randint(-(2**62), 2**62, (2,), device=dev)
        mask = naive.dropout_mask(rng_state, case.dropout_p, batch, heads, max_q, max_k)
    options = dict(window_size=window, softcap=case.softcap, alibi_slopes=slopes, dropout_p=case.dropout_p)
    dout = torch.randn(*q.shape[:-1], dv, dtype=dt, device=dev)
    return Problem(
        q,
        k,
        v,
        dout,
        sink,
        dict(options, rng_state=rng_state, learnable_sink=sink, **varlen_kwargs),
        dict(options, causal=case.causal, dropout_mask=mask, **varlen_kwargs),
    )


def kernel_results(p: Problem, case: SinkCase, scale: float, launch=(attn_fwd, attn_bwd)) -> tuple:
    """out, lse, dq, dk, dv (and dsink with a sink) from the launchers (kernels or tiled reference)."""
    fwd, bwd = launch
    out, lse = fwd(p.q, p.k, p.v, scale, case.causal, **p.kwargs)
    return (out, lse, *bwd(p.dout, p.q, p.k, p.v, out, lse, scale, case.causal, **p.kwargs))


def naive_results(p: Problem, case: SinkCase, scale: float, dtype: torch.dtype) -> tuple:
    """The same from the naive reference by autograd, q/k/v in ``dtype`` (the sink in float64 for the
    float64 oracle, float32 for the low-precision baseline)."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (p.q, p.k, p.v)]
    sink = None
    if p.sink is not None:
        sink = p.sink.detach().to(torch.float64 if dtype == torch.float64 else torch.float32)
        leaves.append(sink.requires_grad_())
    kw = dict(p.oracle_kwargs, softmax_scale=scale, learnable_sink=sink)
    if case.varlen:
        cu_q, cu_k = kw.pop("cu_seqlens_q"), kw.pop("cu_seqlens_k")
        max_q, max_k = kw.pop("max_seqlen_q"), kw.pop("max_seqlen_k")
        out, lse = naive.attention_varlen(*leaves[:3], cu_q, cu_k, max_q, max_k, **kw)
    else:
        out, lse = naive.attention(*leaves[:3], **kw)
    out.backward(p.dout.to(dtype))
    return out, lse, *(t.grad for t in leaves)


def check_against_oracle(case: SinkCase, seed: int, launch=(attn_fwd, attn_bwd)) -> None:
    problem = make_problem(case)
    scale = case.head_dim**-0.5
    ours = kernel_results(problem, case, scale, launch)
    oracle = naive_results(problem, case, scale, torch.float64)
    baseline = naive_results(problem, case, scale, case.dtype)
    assert len(ours) == len(oracle), (len(ours), len(oracle))
    p = problem
    exact = stored_output_floor(p.dout, p.q, p.k, p.v, ours[0], oracle[1], scale, case.causal, **p.kwargs)
    floors = (None, None, *exact)  # out and lse have none
    for name, mine, ref, base, floor in zip(NAMES, ours, oracle, baseline, floors, strict=False):
        assert not torch.isnan(mine).any(), f"{name}: NaN ({case.id}, seed {seed})"
        assert_matches_oracle(name, mine, ref, base, grad=name.startswith("d"), seed=seed, floor=floor)


CPU_CASES = [
    SinkCase(((37, 53),) * 2),
    SinkCase(((53, 37),) * 2, layout="mqa", sink=4.0),
    SinkCase(((37, 53),) * 2, layout="mha", causal=True),
    SinkCase(((53, 37),) * 2, causal=True),
    SinkCase(((37, 53),) * 2, window=(5, 3)),
    SinkCase(((41, 41),) * 2, window=(0, 0), layout="mqa"),
    SinkCase(((37, 100),) * 2, window=(7, 0), head_dim=59),
    SinkCase(((37, 53),) * 2, softcap=0.8, alibi=True),
    SinkCase(((37, 53),) * 2, dropout_p=0.3),
    # A sink far above every score takes nearly all the mass; far below, nearly none.
    SinkCase(((37, 53),) * 2, sink=30.0, sink_const=True),
    SinkCase(((37, 53),) * 2, sink=-30.0, sink_const=True, causal=True),
    SinkCase(((17, 29), (0, 5), (40, 33), (9, 0), (1, 1)), varlen=True),
    SinkCase(((40, 17), (65, 65), (3, 70)), varlen=True, causal=True, layout="mqa"),
    SinkCase(((33, 40), (20, 9)), varlen=True, window=(4, 4), dropout_p=0.2, head_dim=40, head_dim_v=24),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: c.id)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_sink_kernels_match_oracle(case, seed):
    check_against_oracle(case, seed)


@pytest.mark.parametrize("case", CPU_CASES[::3], ids=lambda c: c.id)
def test_sink_tiled_reference_matches_oracle(case, seed):
    launch = (
        lambda *a, **kw: tiled.attention_fwd(*a, **kw, block_m=16, block_n=16),
        lambda *a, **kw: tiled.attention_bwd(*a, **kw, block_m=16, block_n=16),
    )
    check_against_oracle(case, seed, launch)


def _on_gpu(cases_for) -> list:
    """``cases_for(gpu)``'s cases for fp16 and bf16 on CUDA (``gpu``: the dtype and device keywords), as
    GPU-marked parameters."""
    cases = [
        c for dtype in (torch.float16, torch.bfloat16) for c in cases_for(dict(dtype=dtype, device="cuda"))
    ]
    return [pytest.param(c, id=c.id, marks=pytest.mark.gpu) for c in cases]


def _gpu_cases(gpu: dict) -> list:
    return [
        SinkCase(((1023, 1025),) * 2, head_dim=128, **gpu),
        SinkCase(((1025, 777),) * 2, head_dim=64, causal=True, layout="mqa", **gpu),
        SinkCase(((2048, 2048),), head_dim=128, window=(128, 0), sink=8.0, **gpu),
        SinkCase(((777, 1025),) * 2, head_dim=256, softcap=30.0, alibi=True, dropout_p=0.1, **gpu),
        SinkCase(((1000, 1200), (0, 9), (2048, 2048), (1, 1), (300, 0)), varlen=True, causal=True, **gpu),
        SinkCase(((513, 700),) * 2, head_dim=192, head_dim_v=128, causal=True, **gpu),
        SinkCase(((513, 700),) * 2, head_dim=512, window=(64, 64), **gpu),
    ]


@pytest.mark.parametrize("case", _on_gpu(_gpu_cases))
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_sink_kernels_match_oracle_gpu(case, seed):
    check_against_oracle(case, seed)


def _hopper_cases(gpu: dict) -> list:
    return [
        SinkCase(((1023, 1025),) * 2, head_dim=128, **gpu),
        # N_q > N_k causal: the first 248 rows see no key (out 0, lse = sink).
        SinkCase(((1025, 777),) * 2, head_dim=64, causal=True, layout="mqa", **gpu),
        # Three consumer warpgroups on the persistent grid (D = 64, causal from 4k rows).
        SinkCase(((4100, 4099),), head_dim=64, causal=True, **gpu),
        SinkCase(((2048, 2048),), head_dim=128, window=(128, 0), sink=8.0, **gpu),
        SinkCase(((777, 1025),) * 2, head_dim=256, softcap=30.0, alibi=True, dropout_p=0.1, **gpu),
        SinkCase(((700, 513),) * 2, head_dim=256, causal=True, sink=30.0, sink_const=True, **gpu),
        SinkCase(((1000, 1200), (0, 9), (2048, 2048), (1, 1), (300, 0)), varlen=True, causal=True,
                 head_dim=128, **gpu),
        SinkCase(((513, 700), (64, 0), (1, 300)), varlen=True, window=(100, 0), dropout_p=0.2,
                 head_dim=64, layout="mqa", **gpu),
        SinkCase(((1100, 1100),) * 3, head_dim=64, alibi=True, dropout_p=0.1, causal=True, **gpu),
        SinkCase(((1023, 1025),) * 2, head_dim=64, window=(300, 40), layout="mha", **gpu),
    ]  # fmt: skip


def _hopper_problem(case: SinkCase) -> tuple[Problem, dict, str | None]:
    """The case's problem (skipping off a Hopper GPU), its launcher keywords with the backward's window,
    and why the Gluon backward declines it (None where it takes it)."""
    from flashtile.kernels import hopper
    from flashtile.kernels.hopper import bwd as gluon_bwd

    problem = make_problem(case)
    if hopper.device_unsupported_reason(problem.q.device) is not None:
        pytest.skip("the Gluon kernels need a Hopper GPU")
    window = hopper.bwd_window(case.causal, problem.kwargs["window_size"])
    checked = {**problem.kwargs, "window_size": window}
    reason = gluon_bwd.bwd_unsupported_reason(problem.q, problem.k, problem.v, problem.dout, checked)
    return problem, checked, reason


@pytest.mark.parametrize("case", _on_gpu(_hopper_cases))
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_sink_in_the_hopper_kernels_matches_oracle(case, seed):
    # The Gluon forward folds the sink in its epilogue; the Gluon backward sums the sink's gradient at head
    # dims 64 and 128 without softcap (the Hopper backend's entry point sends the rest to the portable one).
    from flashtile.kernels import hopper

    problem, _, reason = _hopper_problem(case)
    assert hopper.fwd_unsupported_reason(problem.q, problem.k, problem.v, problem.kwargs) is None, case.id
    assert (reason is None) == (case.head_dim in (64, 128) and not case.softcap), (case.id, reason)
    check_against_oracle(case, seed, (hopper.attn_fwd, hopper.attn_bwd))


def _hopper_d128_cases(gpu: dict) -> list:
    return [
        SinkCase(((1023, 1025),) * 2, head_dim=128, **gpu),
        # N_q > N_k causal: the first 248 rows see no key (their P_sink is 1, their Δ 0).
        SinkCase(((1025, 777),) * 2, head_dim=128, causal=True, layout="mqa", **gpu),
        SinkCase(((777, 1025),) * 2, head_dim=96, causal=True, sink=8.0, **gpu),
        SinkCase(((2048, 2048),), head_dim=128, window=(128, 0), alibi=True, dropout_p=0.1, **gpu),
        SinkCase(((1000, 1200), (0, 9), (2048, 2048), (1, 1), (300, 0)), varlen=True, causal=True,
                 head_dim=128, **gpu),
        SinkCase(((1100, 1100),) * 3, head_dim=128, dropout_p=0.1, causal=True, layout="mha", **gpu),
    ]  # fmt: skip


@pytest.mark.parametrize("case", _on_gpu(_hopper_d128_cases))
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_sink_in_the_hopper_backward_at_head_dim_128_matches_oracle(case, seed):
    # The Gluon backward takes the sink at kernel head dim 128 (96 padded), its share from dS and the rest
    # from the preprocess (docs/design/sinks.md, "The share from dS").
    from flashtile.kernels import hopper

    problem, checked, reason = _hopper_problem(case)
    assert reason is None, (case.id, reason)
    # The Gluon forward takes no D = 96: the portable one makes its LSE, as the backend would.
    fwd_reason = hopper.unsupported_reason("attn_fwd", problem.q, problem.k, problem.v, checked)
    check_against_oracle(case, seed, (hopper.attn_fwd if fwd_reason is None else attn_fwd, hopper.attn_bwd))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_rows_without_keys_give_zero_and_the_sink_lse(device, seed):
    # Window (2, 0) with N_q = 70 > N_k = 20: the first 50 rows see no key; the empty key sequence of the
    # varlen batch has no key at all. Those rows: out = 0, lse = sink, no NaN anywhere, their dq = 0.
    dtype = torch.float16
    q = torch.randn(1, 70, 2, 32, dtype=dtype, device=device, requires_grad=True)
    k, v = (torch.randn(1, 20, 2, 32, dtype=dtype, device=device, requires_grad=True) for _ in range(2))
    sink = torch.randn(2, device=device, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, window_size=(2, 0), learnable_sink=sink, return_attn_probs=True)
    out.backward(torch.randn_like(out))
    assert (out[0, :50] == 0).all()
    # The sink itself, to fp32 rounding (the GPU kernels take it through base 2 and back: 1 ulp off).
    torch.testing.assert_close(lse[0, :, :50], sink.detach()[:, None].expand(2, 50), rtol=2**-22, atol=0)
    for t in (out, lse, q.grad, k.grad, v.grad, sink.grad):
        assert torch.isfinite(t).all()
    assert (q.grad[0, :50] == 0).all()

    qv = torch.randn(5, 2, 32, dtype=dtype, device=device)
    kv = torch.randn(3, 2, 32, dtype=dtype, device=device)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 0, 3], dtype=torch.int32, device=device)
    out, lse, _ = flash_attn_varlen_func(
        qv, kv, kv, cu_q, cu_k, 3, 3, learnable_sink=sink.detach(), return_attn_probs=True
    )
    assert (out[:2] == 0).all() and torch.isfinite(out).all()
    # To fp32 rounding, as above (exact equality failed on an H100 for one seed: 2.4e-7 off a sink of 3.08).
    torch.testing.assert_close(lse[:, :2], sink.detach()[:, None].expand(2, 2), rtol=2**-22, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_sink_with_deterministic_gradients_is_bitwise_stable_gpu(head_dim, seed):
    # deterministic=True with a sink (on Hopper the portable backward takes it: the Gluon one adds the sink's
    # gradient by atomics): dq, dk, dv and dsink bitwise the same over 50 runs, and on the oracle.
    case = SinkCase(((1023, 1025),) * 2, head_dim=head_dim, causal=True, dtype=torch.bfloat16, device="cuda")
    problem = make_problem(case)
    leaves = [t.detach().requires_grad_() for t in (problem.q, problem.k, problem.v, problem.sink)]

    def grads() -> list[torch.Tensor]:
        out = flash_attn_func(*leaves[:3], causal=True, learnable_sink=leaves[3], deterministic=True)
        return list(torch.autograd.grad(out, leaves, problem.dout))

    first = grads()
    for _ in range(49):
        assert all(torch.equal(a, b) for a, b in zip(first, grads(), strict=True))
    scale = head_dim**-0.5
    oracle = naive_results(problem, case, scale, torch.float64)[2:]
    baseline = naive_results(problem, case, scale, case.dtype)[2:]
    for name, mine, ref, base in zip(NAMES[2:], first, oracle, baseline, strict=True):
        assert not torch.isnan(mine).any(), name
        assert_matches_oracle(name, mine, ref, base, grad=True, seed=seed)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_sink_gradient_through_the_api(backend, seed, monkeypatch):
    # d sink = −Σ_rows P_sink · rowsum(dO ∘ O), summed over batch and rows per head; float32 on the
    # interpreter, float64 on the reference (its gradcheck runs on the whole chain).
    monkeypatch.setenv("FLASHTILE_BACKEND", backend)
    dtype = torch.float64 if backend == "reference" else torch.float32
    q = torch.randn(2, 19, 4, 16, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 23, 2, 16, dtype=dtype, requires_grad=True)
    v = torch.randn(2, 23, 2, 24, dtype=dtype, requires_grad=True)
    sink = torch.randn(4, dtype=dtype, requires_grad=True)
    out = flash_attn_func(q, k, v, causal=True, learnable_sink=sink)
    dout = torch.randn_like(out)
    (dsink,) = torch.autograd.grad(out, sink, dout)
    assert dsink.dtype == sink.dtype and dsink.shape == (4,)
    sink64 = sink.detach().double().requires_grad_()
    ref, lse = naive.attention(*(t.detach().double() for t in (q, k, v)), causal=True, learnable_sink=sink64)
    (expected,) = torch.autograd.grad(ref, sink64, dout.double())
    p_sink = torch.exp(sink64.detach()[None, :, None] - lse)
    closed_form = -(p_sink * (dout.double() * ref.detach()).sum(-1).transpose(1, 2)).sum(dim=(0, 2))
    torch.testing.assert_close(expected, closed_form)
    torch.testing.assert_close(dsink.double(), expected, rtol=1e-4, atol=1e-5)
    if backend == "reference":
        assert torch.autograd.gradcheck(
            lambda *t: flash_attn_func(*t[:3], causal=True, learnable_sink=t[3]),
            # Few elements: gradcheck perturbs each one.
            (q[:1, :4, :, :4], k[:1, :5, :, :4], v[:1, :5, :, :3], sink),
        )


def test_sink_matches_transformers_definition(seed):
    # GPT-OSS's eager attention: softmax over [scale·QKᵀ + mask, sink] with the sink column dropped; the
    # sink is not scaled. Written out here independently of the reference.
    q, k, v = (torch.randn(1, 9, 2, 8, dtype=torch.float64) for _ in range(3))
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64)
    scale = 0.3
    logits = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    logits = logits.masked_fill(~naive.keep_mask(9, 9, causal=True), -math.inf)
    combined = torch.cat([logits, sink.view(1, 2, 1, 1).expand(1, 2, 9, 1)], dim=-1)
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    expected = torch.einsum("bhij,bjhd->bihd", probs, v)
    out = flash_attn_func(q, k, v, softmax_scale=scale, causal=True, learnable_sink=sink)
    torch.testing.assert_close(out, expected)


def test_sink_with_every_function_and_probs(seed):
    qkv = torch.randn(1, 7, 3, 2, 16, dtype=torch.float64)
    sink = torch.tensor([1.0, -2.0], dtype=torch.float64)
    _, lse, s_dmask = flash_attn_qkvpacked_func(
        qkv, dropout_p=0.3, learnable_sink=sink, return_attn_probs=True
    )
    # The probabilities of a row and its sink sum to 1.
    p_sink = torch.exp(sink[None, :, None] - lse)
    torch.testing.assert_close(s_dmask.abs().sum(-1) + p_sink, torch.ones_like(lse))


@pytest.mark.parametrize(
    ("sink", "error", "words"),
    [
        (torch.zeros(3), ValueError, ["learnable_sink", "(4,)", "shape (3,)"]),
        (torch.zeros(4, dtype=torch.int64), TypeError, ["learnable_sink", "dtype torch.int64"]),
        ([0.0] * 4, TypeError, ["learnable_sink", "(4,)", "[0.0, 0.0, 0.0, 0.0]"]),
        (torch.zeros(1, 4), ValueError, ["learnable_sink", "shape (1, 4)"]),
    ],
    ids=["wrong-heads", "int", "list", "2d"],
)
def test_bad_sink_raises_before_launch(sink, error, words):
    q, k, v = torch.randn(1, 5, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    with pytest.raises(error) as info:
        flash_attn_func(q, k, v, learnable_sink=sink)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_a_sink_alone_requiring_grad_gets_its_gradient_and_no_grad_calls_match(monkeypatch, seed):
    # Eager calls skip the autograd.Function when nothing needs a gradient: the sink alone must count.
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    q, k, v = (torch.randn(1, 5, 2, 8, dtype=torch.float64) for _ in range(3))
    sink = torch.randn(2, dtype=torch.float64, requires_grad=True)
    out = flash_attn_func(q, k, v, learnable_sink=sink)
    out.sum().backward()
    assert sink.grad is not None and torch.isfinite(sink.grad).all()
    with torch.no_grad():
        again = flash_attn_func(q, k, v, learnable_sink=sink)
    torch.testing.assert_close(again, out.detach(), rtol=0, atol=0)
