"""The Hopper (Gluon) backward on an sm_90 GPU, in every variant of ``VARIANTS`` and at head dims 64, 96,
128, 192 and 256: gradients against the float64 oracle under the 3× rule, odd lengths, GQA/MQA, causal with
N_q ≠ N_k, fully masked rows, NaN-poisoned outputs, no NaN from another batch or head, and
``deterministic=True`` bitwise stable over 50 runs."""

from __future__ import annotations

import pytest
import torch

from flashtile.kernels import fwd as portable_fwd
from flashtile.kernels.hopper import bwd as hopper_bwd
from flashtile.reference import naive
from tests.helpers import assert_matches_oracle, packed_batch, stored_output_floor

pytestmark = pytest.mark.gpu

CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal)
    pytest.param(2, 113, 203, 4, 2, 64, True, id="gqa-causal-113x203-d64"),
    # N_q > N_k: the first 90 rows see no key (fully masked, LSE = −inf).
    pytest.param(2, 203, 113, 4, 2, 64, True, id="gqa-causal-203x113-d64"),
    pytest.param(2, 203, 113, 4, 2, 128, True, id="gqa-causal-203x113-d128"),
    pytest.param(1, 1025, 1023, 4, 1, 128, False, id="mqa-1025x1023-d128"),
    pytest.param(3, 77, 77, 6, 3, 64, False, id="gqa-77-d64"),
    pytest.param(1, 1, 1, 2, 2, 128, True, id="mha-1x1-d128"),
    pytest.param(1, 300, 1000, 8, 2, 128, True, id="gqa-causal-300x1000-d128"),
    pytest.param(1, 300, 1000, 8, 2, 64, True, id="gqa-causal-300x1000-d64"),
    pytest.param(2, 113, 203, 4, 2, 256, True, id="gqa-causal-113x203-d256"),
    pytest.param(2, 203, 113, 2, 1, 256, True, id="mqa-causal-203x113-d256"),
    pytest.param(1, 257, 255, 2, 2, 256, False, id="mha-257x255-d256"),
    # Causal D = 256 pairs key blocks (n, last − n) in a program: odd block counts leave the middle one
    # alone (3 and 5 blocks), with a query head group of 3 and N_q < N_k.
    pytest.param(2, 129, 129, 6, 2, 256, True, id="gqa-causal-129x129-d256"),
    pytest.param(1, 200, 300, 2, 2, 256, True, id="mha-causal-200x300-d256"),
    pytest.param(2, 97, 75, 4, 2, 96, True, id="gqa-causal-97x75-d96"),
    pytest.param(1, 130, 129, 2, 2, 192, False, id="mha-130x129-d192"),
]


def _kernel_dim(head_dim: int) -> int:
    return hopper_bwd.PADDED_HEAD_DIM.get(head_dim, head_dim)


def _with_variants(cases):
    """Each case once per variant of its head dim's kernel, the variant's name added to the id."""
    return [
        pytest.param(*case.values, name, id=f"{case.id}-{name}")
        for case in cases
        for name in hopper_bwd.VARIANTS[_kernel_dim(case.values[5])]
    ]


# (head dim, variant) pairs: every variant, and the padded head dims with their kernel's default.
TARGETS = [
    pytest.param(d, name, id=f"d{d}-{name}")
    for d in hopper_bwd.SUPPORTED_HEAD_DIMS
    for name in hopper_bwd.VARIANTS[_kernel_dim(d)]
    if d == _kernel_dim(d) or name == hopper_bwd.DEFAULT_VARIANT[_kernel_dim(d)]
]


@pytest.fixture
def hopper(monkeypatch):
    """The Hopper backward module, with the variant env cleared (a test sets the one it runs)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon backward runs on compute capability 9.x")
    monkeypatch.delenv(hopper_bwd.VARIANT_ENV, raising=False)
    return hopper_bwd


def _problem(batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, dtype):
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    scale = head_dim**-0.5
    out, lse = portable_fwd.attn_fwd(q, k, v, scale, causal, window_size=(-1, 0) if causal else (-1, -1))
    return q, k, v, dout, out, lse, scale


def _reference_grads(q, k, v, dout, causal, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, _ = naive.attention(*leaves, causal=causal)
    out.backward(dout.to(dtype))
    return [t.grad for t in leaves]


@pytest.mark.parametrize("deterministic", [False, True], ids=["reduce", "deterministic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "head_dim", "causal", "variant"),
    _with_variants(CASES),
)
def test_hopper_bwd_matches_oracle(
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, variant, dtype, deterministic, seed,
    hopper, monkeypatch, nan_poisoned_allocations,
):  # fmt: skip
    q, k, v, dout, out, lse, scale = _problem(
        batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, dtype
    )
    monkeypatch.setenv(hopper.VARIANT_ENV, variant)
    grads = hopper.attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
    oracle = _reference_grads(q, k, v, dout, causal, torch.float64)
    baseline = _reference_grads(q, k, v, dout, causal, dtype)
    floors = stored_output_floor(dout, q, k, v, out, lse, scale, causal)
    for name, ours, ref, base, floor in zip(("dq", "dk", "dv"), grads, oracle, baseline, floors, strict=True):
        assert ours.shape == ref.shape and ours.dtype == dtype and ours.is_contiguous()
        assert_matches_oracle(name, ours, ref, base, grad=True, seed=seed, floor=floor)


@pytest.mark.parametrize("deterministic", [False, True], ids=["reduce", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("head_dim", "variant"), TARGETS)
def test_hopper_bwd_nan_in_other_batch_or_head_does_not_leak(
    head_dim, variant, causal, deterministic, seed, hopper, monkeypatch
):
    q, k, v, dout, out, lse, scale = _problem(3, 97, 75, 2, 2, head_dim, causal, torch.bfloat16)
    monkeypatch.setenv(hopper.VARIANT_ENV, variant)
    expected = hopper.attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
    # The clean call against the oracle over all six (batch, head) slices: one 97 × 75 head alone made
    # the baseline's largest error too noisy a yardstick (3.3-3.5× at two seeds of forty, the portable
    # backward's error the same; scripts/bwd_error_margin.py).
    oracle = _reference_grads(q, k, v, dout, causal, torch.float64)
    baseline = _reference_grads(q, k, v, dout, causal, torch.bfloat16)
    floors = stored_output_floor(dout, q, k, v, out, lse, scale, causal)
    for name, ours, ref, base, floor in zip(
        ("dq", "dk", "dv"), expected, oracle, baseline, floors, strict=True
    ):
        assert_matches_oracle(name, ours, ref, base, grad=True, seed=seed, floor=floor)
    # Then the other batches and head 1 of batch 0 NaN: batch 0, head 0 must come out as before.
    for t in (q, k, v, dout, out, lse):
        t[1:] = float("nan")
    for t in (q, k, v, dout, out):
        t[0, :, 1] = float("nan")
    lse[0, 1] = float("nan")
    grads = hopper.attn_bwd(dout, q, k, v, out, lse, scale, causal, deterministic=deterministic)
    for name, ours, clean_result in zip(("dq", "dk", "dv"), grads, expected, strict=True):
        # Batch 0, head 0 as without the NaN: bitwise, but dQ's reduce-adds may land in another order.
        exact = deterministic or name != "dq"
        tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 2**-7, "atol": 1e-6}
        torch.testing.assert_close(ours[:1, :, :1], clean_result[:1, :, :1], **tolerance, msg=name)


@pytest.mark.parametrize(("head_dim", "variant"), TARGETS)
def test_hopper_bwd_deterministic_is_bitwise_stable_over_50_runs(head_dim, variant, hopper, monkeypatch):
    q, k, v, dout, out, lse, scale = _problem(2, 1000, 1100, 8, 2, head_dim, True, torch.bfloat16)
    monkeypatch.setenv(hopper.VARIANT_ENV, variant)
    first = hopper.attn_bwd(dout, q, k, v, out, lse, scale, True, deterministic=True)
    for _ in range(49):
        again = hopper.attn_bwd(dout, q, k, v, out, lse, scale, True, deterministic=True)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


# Plain non-causal calls on the persistent grid (FLASHTILE_HOPPER_BWD_PERSISTENT=1: D = 64's default, and
# D = 128 and deterministic calls forced): more key blocks than SMs, so that programs take several in turn
# (GQA, odd lengths, N_q ≠ N_k both ways, both "keys" head dims).
PERSISTENT_CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim)
    pytest.param(4, 1000, 1000, 16, 16, 128, id="mha-1000-d128"),
    pytest.param(3, 777, 2049, 12, 6, 128, id="gqa-777x2049-d128"),
    pytest.param(4, 1029, 517, 16, 8, 128, id="gqa-1029x517-d128"),
    pytest.param(8, 513, 513, 8, 8, 64, id="mha-513-d64"),
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["reduce", "deterministic"])
@pytest.mark.parametrize(("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "head_dim"), PERSISTENT_CASES)
def test_hopper_bwd_persistent_grid_matches_oracle_and_the_one_program_a_block_grid(
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, deterministic, seed, hopper, monkeypatch,
    nan_poisoned_allocations,
):  # fmt: skip
    q, k, v, dout, out, lse, scale = _problem(
        batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, False, torch.bfloat16
    )
    _, cfg = hopper.select_variant(head_dim, plain=True)
    fused = hopper._bwd_launches(
        q.device, tuple(q.shape), (seqlen_k, heads_kv), scale, False, deterministic, cfg,
        tuple(out.stride()[:3]), tuple(dout.stride()[:3]), persistent=True,
    )[1]  # fmt: skip
    blocks = -(-seqlen_k // cfg.block_n) * batch * heads_kv
    assert (
        fused.grid == (torch.cuda.get_device_properties(0).multi_processor_count,) and blocks > fused.grid[0]
    )
    monkeypatch.setenv(hopper.PERSISTENT_ENV, "1")
    assert hopper.persistent_grid(head_dim, cfg, False, True, deterministic, False)
    grads = hopper.attn_bwd(dout, q, k, v, out, lse, scale, False, deterministic=deterministic)
    oracle = _reference_grads(q, k, v, dout, False, torch.float64)
    baseline = _reference_grads(q, k, v, dout, False, torch.bfloat16)
    floors = stored_output_floor(dout, q, k, v, out, lse, scale, False)
    for name, ours, ref, base, floor in zip(("dq", "dk", "dv"), grads, oracle, baseline, floors, strict=True):
        assert_matches_oracle(name, ours, ref, base, grad=True, seed=seed, floor=floor)
    # Each key block's dK and dV are summed in the same order on either grid: bitwise equal; dQ too when
    # deterministic (its own kernel), within the reduce-adds' order otherwise.
    monkeypatch.setenv(hopper.PERSISTENT_ENV, "0")
    one_a_block = hopper.attn_bwd(dout, q, k, v, out, lse, scale, False, deterministic=deterministic)
    for name, ours, theirs in zip(("dq", "dk", "dv"), grads, one_a_block, strict=True):
        exact = deterministic or name != "dq"
        tolerance = {"rtol": 0, "atol": 0} if exact else {"rtol": 2**-7, "atol": 1e-6}
        torch.testing.assert_close(ours, theirs, **tolerance, msg=name)


def test_hopper_bwd_unsupported_reasons(hopper):
    q = torch.randn(1, 8, 2, 128, device="cuda", dtype=torch.bfloat16)
    assert hopper.bwd_unsupported_reason(q, q, q, q, {}) is None
    assert hopper.bwd_unsupported_reason(q, q, q, q, {"window_size": (-1, 0)}) is None
    assert hopper.bwd_unsupported_reason(q, q, q, q, {"window_size": (4, 0)}) is None
    assert "deterministic" in hopper.bwd_unsupported_reason(
        q, q, q, q, {"window_size": (4, 0), "deterministic": True}
    )
    assert hopper.bwd_unsupported_reason(q, q, q, q, {"dropout_p": 0.1}) is None
    assert "dropout" in hopper.bwd_unsupported_reason(q, q, q, q, {"dropout_p": 0.1, "deterministic": True})
    wide = q.new_zeros(1, 8, 2, 256)
    assert "dropout" in hopper.bwd_unsupported_reason(wide, wide, wide, wide, {"dropout_p": 0.1})
    assert hopper.bwd_unsupported_reason(q[..., :96], q[..., :96], q[..., :96], q[..., :96], {}) is None
    assert "head dim" in hopper.bwd_unsupported_reason(q[..., :80], q[..., :80], q[..., :80], q[..., :80], {})
    assert "dtype" in hopper.bwd_unsupported_reason(q.float(), q.float(), q.float(), q.float(), {})
    with pytest.raises(ValueError, match="window"):
        hopper.attn_bwd(
            q,
            q,
            q,
            q,
            q,
            torch.zeros(1, 2, 8, device="cuda"),
            0.1,
            False,
            window_size=(4, 0),
            deterministic=True,
        )


@pytest.mark.parametrize("head_dim", [64, 128])
def test_backend_backward_keeps_a_causal_sliding_window(head_dim, seed, hopper):
    """The backend's backward with causal=True and a left window keeps its window (once, the Gluon backward
    took it for plain causal attention, and a Mistral model's gradients were wrong)."""
    from flashtile.kernels import hopper as backend

    q, k, v, dout, _, _, scale = _problem(2, 300, 300, 8, 2, head_dim, True, torch.bfloat16)
    window = (127, 0)
    out, lse = portable_fwd.attn_fwd(q, k, v, scale, True, window_size=window)
    grads = backend.attn_bwd(dout, q, k, v, out, lse, scale, True, window_size=window)

    def reference(dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        naive.attention(*leaves, causal=True, window_size=window)[0].backward(dout.to(dtype))
        return [t.grad for t in leaves]

    for name, ours, ref, base in zip(
        ("dq", "dk", "dv"), grads, reference(torch.float64), reference(torch.bfloat16), strict=True
    ):
        assert_matches_oracle(name, ours, ref, base, grad=True, seed=seed)


def _assert_grads_match(grads, reference, dtype, seed):
    """dq, dk, dv against ``reference(torch.float64)`` under the 3× rule, ``reference(dtype)`` the
    low-precision baseline; shapes and dtypes as the inputs', no NaN."""
    for name, ours, ref, base in zip(
        ("dq", "dk", "dv"), grads, reference(torch.float64), reference(dtype), strict=True
    ):
        assert ours.shape == ref.shape and ours.dtype == dtype
        assert not ours.isnan().any(), name
        assert_matches_oracle(name, ours, ref, base, grad=True, seed=seed)


OPTION_CASES = [
    # (batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window, softcap, alibi slopes' shape)
    pytest.param(2, 300, 300, 4, 2, 128, True, (64, 0), 0.0, None, id="causal-window64-d128"),
    pytest.param(1, 257, 513, 4, 2, 64, False, (100, 50), 0.0, None, id="window100-50-257x513-d64"),
    # N_q > N_k with a left bound only: the first rows see no key (out 0, LSE −inf, zero gradients).
    pytest.param(2, 203, 113, 4, 2, 128, False, (17, -1), 0.0, None, id="window17-left-203x113-d128"),
    pytest.param(1, 129, 300, 2, 2, 128, False, (-1, 37), 0.0, None, id="window-right37-129x300-d128"),
    pytest.param(1, 200, 200, 2, 1, 64, False, (0, 0), 0.0, None, id="window0-mqa-d64"),
    pytest.param(1, 100, 100, 2, 2, 128, False, (1000, 1000), 0.0, None, id="window-wider-than-seq-d128"),
    pytest.param(2, 300, 300, 4, 2, 128, False, (-1, -1), 30.0, None, id="softcap30-d128"),
    pytest.param(2, 300, 300, 4, 2, 64, True, (-1, -1), 5.0, None, id="causal-softcap5-d64"),
    pytest.param(2, 300, 300, 4, 2, 128, False, (-1, -1), 0.0, (4,), id="alibi-h-d128"),
    pytest.param(2, 300, 200, 4, 2, 128, True, (-1, -1), 0.0, (2, 4), id="causal-alibi-bh-300x200-d128"),
    pytest.param(2, 333, 333, 8, 2, 128, True, (100, 0), 20.0, (2, 8), id="causal-window-softcap-alibi-d128"),
    pytest.param(1, 500, 480, 4, 4, 64, False, (64, 64), 10.0, (4,), id="window-softcap-alibi-d64"),
    pytest.param(1, 96, 96, 2, 2, 96, False, (20, 20), 15.0, (2,), id="window-softcap-alibi-d96"),
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    ("batch", "seqlen_q", "seqlen_k", "heads", "heads_kv", "head_dim", "causal", "window", "softcap",
     "alibi", "variant"),
    _with_variants(OPTION_CASES),
)  # fmt: skip
def test_hopper_bwd_options_match_oracle(
    batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim, causal, window, softcap, alibi, variant, dtype,
    seed, hopper, monkeypatch, nan_poisoned_allocations,
):  # fmt: skip
    """Windows, softcap and ALiBi, alone and together, in the fused kernel (forced by its knob), against
    the float64 oracle under the 3× rule; rows that see no key get zero gradients, never NaN."""
    monkeypatch.setenv(hopper.OPTIONS_ENV, "1")
    monkeypatch.setenv(hopper.VARIANT_ENV, variant)
    q = torch.randn(batch, seqlen_q, heads, head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    slopes = None if alibi is None else torch.rand(*alibi, device="cuda", dtype=torch.float32)
    scale = head_dim**-0.5
    options = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    fwd_window = (window[0], 0) if causal else window
    out, lse = portable_fwd.attn_fwd(
        q, k, v, scale, causal, window_size=fwd_window, softcap=softcap, alibi_slopes=slopes
    )
    assert hopper.bwd_unsupported_reason(q, k, v, dout, {**options, "window_size": fwd_window}) is None
    grads = hopper.attn_bwd(dout, q, k, v, out, lse, scale, causal, **options)

    def reference(dtype_ref):
        leaves = [t.detach().to(dtype_ref).requires_grad_() for t in (q, k, v)]
        ref_out, _ = naive.attention(*leaves, softmax_scale=scale, causal=causal, **options)
        ref_out.backward(dout.to(dtype_ref))
        return [t.grad for t in leaves]

    _assert_grads_match(grads, reference, dtype, seed)


def test_hopper_bwd_options_stay_off_without_the_knob(hopper, monkeypatch):
    monkeypatch.delenv(hopper.OPTIONS_ENV, raising=False)
    q = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    reason = hopper.bwd_unsupported_reason(q, q, q, q, {"softcap": 30.0})
    assert (reason is None) == hopper.GPU_CHECKED_OPTIONS


# Packed (varlen) batches in the fused kernel ("keys" split, D = 64/96/128): (N_q, N_k) per sequence with
# empty ones, one-token ones, N_q ≠ N_k both ways and sequences longer than a K/V block and a query block.
VARLEN_LENGTHS = [(5, 7), (0, 3), (1, 1), (130, 77), (3, 0), (257, 300), (64, 64), (1, 200), (77, 1)]
VARLEN_CASES = [
    # (head_dim, heads, heads_kv, dtype, causal, window, softcap, alibi slopes: None, "h" or "bh")
    pytest.param(64, 4, 2, torch.bfloat16, True, (-1, 0), 0.0, None, id="d64-gqa-causal-bf16"),
    pytest.param(64, 4, 4, torch.float16, False, (-1, -1), 0.0, None, id="d64-mha-full-fp16"),
    pytest.param(128, 4, 1, torch.bfloat16, False, (-1, -1), 0.0, None, id="d128-mqa-full-bf16"),
    pytest.param(128, 8, 2, torch.float16, True, (-1, 0), 0.0, None, id="d128-gqa-causal-fp16"),
    pytest.param(96, 4, 2, torch.bfloat16, True, (-1, 0), 0.0, None, id="d96-gqa-causal-bf16"),
    pytest.param(64, 4, 2, torch.float16, False, (40, 9), 5.0, "bh", id="d64-window-softcap-alibi-fp16"),
    pytest.param(128, 4, 2, torch.bfloat16, True, (100, 0), 30.0, "h", id="d128-causal-window-cap-alibi"),
    pytest.param(128, 4, 2, torch.bfloat16, False, (-1, 5), 0.0, None, id="d128-window-right5-bf16"),
]


def _varlen_grads(hopper, q, k, v, dout, varlen, causal, options):
    """The portable forward's (out, lse) of the packed batch, then the fused kernel's gradients."""
    scale = q.shape[-1] ** -0.5
    fwd_window = (options["window_size"][0], 0) if causal else options["window_size"]
    fwd_options = {**options, "window_size": fwd_window}
    out, lse = portable_fwd.attn_fwd(q, k, v, scale, causal, **fwd_options, **varlen)
    assert hopper.bwd_unsupported_reason(q, k, v, dout, {**fwd_options, **varlen}) is None
    return hopper.attn_bwd(dout, q, k, v, out, lse, scale, causal, **options, **varlen)


@pytest.fixture(params=[False, True], ids=["row-stores", "tma-stores"])
def gluon_varlen_bwd(hopper, monkeypatch, request):
    """The Gluon varlen backward, with dK/dV by TMA boxes inside each sequence (the default) and by row-masked
    stores for every block (FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=0)."""
    monkeypatch.setenv(hopper.VARLEN_ENV, "1")
    monkeypatch.setenv(hopper.VARLEN_TMA_STORE_ENV, "1" if request.param else "0")
    return hopper


@pytest.mark.parametrize(
    ("head_dim", "heads", "heads_kv", "dtype", "causal", "window", "softcap", "alibi"), VARLEN_CASES
)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_hopper_bwd_varlen_matches_oracle(
    head_dim, heads, heads_kv, dtype, causal, window, softcap, alibi, seed, gluon_varlen_bwd
):
    """dQ, dK, dV of a packed batch against the float64 oracle (sequence by sequence, 3× rule); sequences
    without keys get dq = 0, without queries dk = dv = 0, never NaN."""
    q, k, v, varlen = packed_batch(VARLEN_LENGTHS, heads, heads_kv, head_dim, dtype)
    dout = torch.randn_like(q)
    batch = len(VARLEN_LENGTHS)
    shape = {"h": (heads,), "bh": (batch, heads)}
    slopes = None if alibi is None else torch.rand(shape[alibi], device="cuda") * 0.5 + 0.05
    options = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    grads = _varlen_grads(gluon_varlen_bwd, q, k, v, dout, varlen, causal, options)

    def reference(dtype_ref):
        leaves = [t.detach().to(dtype_ref).requires_grad_() for t in (q, k, v)]
        ref_out, _ = naive.attention_varlen(*leaves, **varlen, causal=causal, **options)
        ref_out.backward(dout.to(dtype_ref))
        return [t.grad for t in leaves]

    _assert_grads_match(grads, reference, dtype, seed)
    cu_q, cu_k = varlen["cu_seqlens_q"].tolist(), varlen["cu_seqlens_k"].tolist()
    for b, (sq, sk) in enumerate(VARLEN_LENGTHS):
        if sk == 0:
            assert (grads[0][cu_q[b] : cu_q[b + 1]] == 0).all()
        if sq == 0:
            keys = slice(cu_k[b], cu_k[b + 1])
            assert (grads[1][keys] == 0).all() and (grads[2][keys] == 0).all()


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hopper_bwd_varlen_neighbours_do_not_leak(head_dim, causal, seed, gluon_varlen_bwd):
    """The rows past a sequence's ends are its neighbours' (read, then masked): scaling every other
    sequence's q, k, v and dout by 64 leaves this sequence's dK, dV bitwise and its dQ (added up by
    atomic reduces, in any order) within fp32 rounding."""
    lengths = [(300, 200), (130, 257), (77, 64)]
    q, k, v, varlen = packed_batch(lengths, 4, 2, head_dim, torch.bfloat16)
    dout = torch.randn_like(q)
    options = dict(window_size=(-1, -1), softcap=0.0, alibi_slopes=None)
    grads = _varlen_grads(gluon_varlen_bwd, q, k, v, dout, varlen, causal, options)
    cu_q, cu_k = varlen["cu_seqlens_q"].tolist(), varlen["cu_seqlens_k"].tolist()
    rq, rk = slice(cu_q[1], cu_q[2]), slice(cu_k[1], cu_k[2])
    louder = []
    for t, rows in ((q, rq), (k, rk), (v, rk), (dout, rq)):
        loud = t * 64
        loud[rows] = t[rows]
        louder.append(loud)
    loud_grads = _varlen_grads(gluon_varlen_bwd, *louder, varlen, causal, options)
    assert torch.equal(grads[1][rk], loud_grads[1][rk]) and torch.equal(grads[2][rk], loud_grads[2][rk])
    torch.testing.assert_close(grads[0][rq].float(), loud_grads[0][rq].float(), rtol=2**-7, atol=1e-4)


def test_hopper_bwd_varlen_stays_off_without_the_knob(hopper, monkeypatch):
    monkeypatch.delenv(hopper.VARLEN_ENV, raising=False)
    q = torch.randn(10, 2, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="cuda")
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6, max_seqlen_k=6)
    reason = hopper.bwd_unsupported_reason(q, q, q, q, varlen)
    assert (reason is None) == hopper.GPU_CHECKED_VARLEN
    monkeypatch.setenv(hopper.VARLEN_ENV, "1")
    assert hopper.bwd_unsupported_reason(q, q, q, q, varlen) is None
    assert "deterministic" in hopper.bwd_unsupported_reason(q, q, q, q, {**varlen, "deterministic": True})
    wide = torch.randn(10, 2, 256, device="cuda", dtype=torch.bfloat16)
    assert "256" in hopper.bwd_unsupported_reason(wide, wide, wide, wide, varlen)
