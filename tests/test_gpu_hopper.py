"""The Hopper (Gluon) forward on a GPU of compute capability 9.x against the float64 oracle (2× rule), dense,
causal and with its options (sliding windows, softcap, ALiBi), and the backend rule choosing it. Skipped
elsewhere: Gluon does not run in Triton's interpreter (CPU CI compiles it instead,
tests/test_kernels_hopper_sm90.py, and checks its tile ranges, tests/test_gluon_tile_ranges.py).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from flashtile import BlockMask, backend, flash_attn_func, masks
from flashtile.errors import FlashtileValueError
from flashtile.kernels import configs
from flashtile.mods import Mods
from flashtile.reference import naive
from tests.helpers import HEAD_LAYOUTS, assert_matches_oracle, packed_batch

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    # The varlen knob is the gluon_varlen fixture's to set (the declined-calls check expects it unset).
    monkeypatch.delenv("FLASHTILE_HOPPER_FWD_VARLEN", raising=False)
    reason = backend.hopper_unavailable_reason(torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls through the API take the general path (validated, routed, launched by ``attn_fwd``): a plain
    call is otherwise prepared on its first call and never reaches ``attn_fwd``, which the spies below
    watch. tests/test_prepared_calls.py checks that the prepared calls give the general path's bits."""
    from flashtile import plain_calls

    monkeypatch.setattr(backend, "prepare", lambda *args, **kwargs: None)
    monkeypatch.setattr(plain_calls, "_verdicts", {})


def _fwd(*args, **kwargs):
    from flashtile.kernels.hopper.fwd import attn_fwd

    return attn_fwd(*args, **kwargs)


SEQLENS = [(1, 1), (17, 17), (63, 64), (113, 203), (203, 113), (128, 128), (129, 255), (1023, 1025)]


def _cases():
    layouts = itertools.cycle(HEAD_LAYOUTS)
    for (sq, sk), d, causal, dtype in itertools.product(
        SEQLENS, configs.HOPPER_FWD_HEAD_DIMS, (False, True), (torch.float16, torch.bfloat16)
    ):
        layout = next(layouts)
        name = f"{sq}x{sk}-d{d}-{layout}-{'causal' if causal else 'full'}-{str(dtype).removeprefix('torch.')}"
        yield pytest.param(sq, sk, d, layout, causal, dtype, id=name)


def _check_against_oracle(q, k, v, scale, causal, seed, **kwargs):
    out, lse = _fwd(q, k, v, scale, causal, **kwargs)
    assert out.dtype == q.dtype and lse.dtype == torch.float32
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    ref_out, ref_lse = naive.attention(*(t.double() for t in (q, k, v)), softmax_scale=scale, causal=causal)
    base_out, base_lse = naive.attention(q, k, v, softmax_scale=scale, causal=causal)
    assert_matches_oracle("out", out, ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, ref_lse, base_lse, seed=seed)


@pytest.mark.parametrize(("seqlen_q", "seqlen_k", "head_dim", "layout", "causal", "dtype"), list(_cases()))
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_gluon_fwd_matches_oracle(seed, seqlen_q, seqlen_k, head_dim, layout, causal, dtype):
    heads, heads_kv = HEAD_LAYOUTS[layout]
    q = torch.randn(2, seqlen_q, heads, head_dim, dtype=dtype, device="cuda")
    k, v = (torch.randn(2, seqlen_k, heads_kv, head_dim, dtype=dtype, device="cuda") for _ in range(2))
    _check_against_oracle(q, k, v, head_dim**-0.5, causal, seed)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_three_stage_ring_matches_oracle(seed, head_dim, causal):
    # A deeper K/V ring (the benchmarked alternative of docs/design/hopper.md) keeps the barrier phases right.
    q = torch.randn(2, 700, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 901, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    config = configs.HopperFwdConfig(BLOCK_N=128, STAGES=3)
    _check_against_oracle(q, k, v, head_dim**-0.5, causal, seed, config=config)


@pytest.mark.parametrize("head_dim", configs.HOPPER_FWD_HEAD_DIMS)
def test_fully_masked_rows_give_zero_output_and_minus_inf_lse(seed, head_dim, nan_poisoned_allocations):
    # Causal with N_q > N_k (bottom-right): the first N_q − N_k = 200 rows see no key.
    q = torch.randn(2, 300, 2, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 100, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out, lse = _fwd(q, k, v, 0.1, True)
    assert torch.equal(out[:, :200], torch.zeros_like(out[:, :200]))
    assert torch.isneginf(lse[:, :, :200]).all()
    assert torch.isfinite(lse[:, :, 200:]).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("head_dim", configs.HOPPER_FWD_HEAD_DIMS)
def test_nan_in_another_batch_or_head_does_not_leak(seed, head_dim, nan_poisoned_allocations):
    # 77 keys: the last K/V tile runs past the sequence, into batch 1's rows in memory.
    q = torch.randn(2, 100, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 77, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    k[1], v[1] = float("nan"), float("nan")
    # KV head 1 serves query heads 2 and 3 only.
    k[0, :, 1], v[0, :, 1] = float("nan"), float("nan")
    out, lse = _fwd(q, k, v, head_dim**-0.5, False)
    clean = (q[:1, :, :2], k[:1, :, :1], v[:1, :, :1])
    ref_out, ref_lse = naive.attention(*(t.double() for t in clean))
    base_out, base_lse = naive.attention(*clean)
    assert_matches_oracle("out", out[:1, :, :2], ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse[:1, :2], ref_lse, base_lse, seed=seed)


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_strided_views_and_scales(seed):
    # A packed qkv view and a transposed (B, H, N, D) layout are read in place through the 4-D descriptors.
    qkv = torch.randn(2, 150, 3, 4, 64, dtype=torch.float16, device="cuda")
    q, k, v = qkv.unbind(2)
    k = k.transpose(1, 2).contiguous().transpose(1, 2)
    for scale in (0.125, -0.3, 0.0):
        _check_against_oracle(q, k, v, scale, True, seed)


def test_forward_is_race_free_at_large_batch(seed):
    q, k, v = (torch.randn(64, 257, 4, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    first, _ = _fwd(q, k, v, 0.125, True)
    for _ in range(100):
        again, _ = _fwd(q, k, v, 0.125, True)
        assert torch.equal(first, again)


@pytest.mark.usefixtures("general_path")
def test_auto_dispatch_on_the_gpu(seed, monkeypatch):
    from flashtile.kernels.hopper import fwd as hopper_fwd

    calls = []
    real = hopper_fwd.attn_fwd

    def spy(*args, **kwargs):
        calls.append(args[4])
        return real(*args, **kwargs)

    monkeypatch.setattr(hopper_fwd, "attn_fwd", spy)
    assert backend.resolve(torch.device("cuda")) == "hopper"
    q = torch.randn(2, 333, 8, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (torch.randn(2, 444, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    for t in (k, v):
        t.requires_grad_()
    out = flash_attn_func(q, k, v, causal=True)
    assert calls == [True]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    def run_naive(dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = naive.attention(*leaves, causal=True)
        return (o, *torch.autograd.grad(o, leaves, dout.to(dtype)))

    oracle, baseline = run_naive(torch.float64), run_naive(torch.bfloat16)
    for name, ours, ref, base in zip(("out", "dq", "dk", "dv"), (out, *grads), oracle, baseline, strict=True):
        assert_matches_oracle(name, ours, ref, base, grad=name != "out", seed=seed)

    # Softcap and dropout are in the fast path; head dim 80 is not: auto runs it in the portable kernels,
    # a forced hopper backend refuses.
    flash_attn_func(q, k, v, softcap=10.0)
    flash_attn_func(q, k, v, dropout_p=0.1)
    assert calls == [True, False, False]
    q80, k80, v80 = (t[..., :80].detach().contiguous() for t in (q, k, v))
    flash_attn_func(q80, k80, v80)
    assert calls == [True, False, False]
    monkeypatch.setenv(backend.ENV_VAR, "hopper")
    with pytest.raises(FlashtileValueError, match=r"FLASHTILE_BACKEND=hopper was asked for but .*head dims"):
        flash_attn_func(q80, k80, v80)


# Options: (N_q, N_k, head dim, layout, dtype, causal, window as the launcher takes it, softcap, ALiBi slopes
# "h" (H,) / "bh" (B, H) / None). Odd lengths both ways round; windows with both bounds, one, none, narrower
# than a tile and wider than both sequences (the API would have made that one (−1, −1): the launcher's clamp).
OPTION_CASES = [
    (1025, 777, 128, "gqa", torch.bfloat16, True, (256, 0), 0.0, None),
    (333, 1200, 64, "mha", torch.float16, True, (256, 0), 0.0, None),
    (1025, 777, 64, "gqa", torch.float16, False, (100, 50), 0.0, None),
    (333, 1200, 128, "mqa", torch.bfloat16, False, (100, 50), 0.0, None),
    (777, 1025, 128, "gqa", torch.bfloat16, False, (0, 0), 0.0, None),
    (1025, 777, 64, "mha", torch.bfloat16, False, (0, 0), 0.0, None),
    (333, 1200, 128, "gqa", torch.float16, False, (-1, 37), 0.0, None),
    (1025, 777, 64, "gqa", torch.bfloat16, False, (-1, 37), 0.0, None),
    (333, 1200, 64, "gqa", torch.bfloat16, False, (17, -1), 0.0, None),
    (1025, 777, 128, "mha", torch.float16, False, (17, -1), 0.0, None),
    (200, 300, 128, "gqa", torch.bfloat16, False, (5000, 4000), 0.0, None),
    (300, 200, 64, "gqa", torch.float16, True, (1000, 0), 0.0, None),
    (1025, 777, 128, "gqa", torch.bfloat16, False, (-1, -1), 30.0, None),
    (333, 1200, 64, "mha", torch.float16, True, (-1, 0), 5.0, None),
    (513, 513, 128, "mqa", torch.bfloat16, True, (-1, 0), 5.0, None),
    (1025, 777, 128, "gqa", torch.bfloat16, True, (-1, 0), 0.0, "h"),
    (333, 1200, 64, "mha", torch.float16, False, (-1, -1), 0.0, "h"),
    (777, 1025, 128, "mha", torch.float16, False, (-1, -1), 0.0, "bh"),
    (1025, 777, 64, "gqa", torch.bfloat16, True, (-1, 0), 0.0, "bh"),
    (1025, 777, 128, "gqa", torch.bfloat16, True, (256, 0), 30.0, "h"),
    (333, 1200, 64, "mha", torch.float16, False, (100, 50), 5.0, "bh"),
    (777, 1025, 128, "gqa", torch.float16, False, (17, -1), 30.0, "bh"),
    (1025, 777, 64, "gqa", torch.bfloat16, False, (0, 0), 5.0, "h"),
    (333, 1200, 256, "gqa", torch.bfloat16, False, (100, 50), 30.0, "h"),
    (1025, 777, 256, "mha", torch.float16, True, (256, 0), 0.0, None),
    # ALiBi non-causal and causal at 2k, D = 128 and 256: tiles left of, across and right of the diagonal.
    (2049, 1800, 128, "gqa", torch.bfloat16, False, (-1, -1), 0.0, "bh"),
    (777, 1025, 256, "mha", torch.bfloat16, False, (-1, -1), 0.0, "h"),
    (1800, 2049, 256, "gqa", torch.float16, True, (-1, 0), 0.0, "h"),
    # ALiBi at D = 128 over longer rows, N_q < N_k in fp16, and under a right bound alone, whose unmasked
    # tiles reach past the diagonal.
    (3000, 4100, 128, "mha", torch.float16, False, (-1, -1), 0.0, "h"),
    (1500, 1300, 128, "gqa", torch.bfloat16, False, (-1, 300), 0.0, "bh"),
    # Windows on the persistent grid at D = 128 past 1k keys (a work tile still visits a few hundred).
    (2100, 2300, 128, "gqa", torch.bfloat16, False, (300, 40), 0.0, None),
    (3000, 3000, 128, "mha", torch.float16, True, (256, 0), 0.0, None),
    # ALiBi alone, N_q > N_k (the first rows' diagonal lies before key 0), at D = 64 and under a window.
    (1300, 700, 64, "gqa", torch.bfloat16, False, (-1, -1), 0.0, "h"),
    (1300, 700, 64, "mha", torch.float16, True, (-1, 0), 0.0, "bh"),
    (900, 2500, 128, "mqa", torch.bfloat16, False, (300, 200), 0.0, "h"),
]


def _option_id(case) -> str:
    sq, sk, d, layout, dtype, causal, window, softcap, alibi = case
    parts = [f"{sq}x{sk}", f"d{d}", layout, "causal" if causal else "full", f"w{window[0]},{window[1]}"]
    parts += [f"cap{softcap:g}"] if softcap else []
    parts += [f"alibi-{alibi}"] if alibi else []
    return "-".join([*parts, str(dtype).removeprefix("torch.")])


def _slopes(kind: str | None, batch: int, heads: int) -> torch.Tensor | None:
    if kind is None:
        return None
    return torch.rand((heads,) if kind == "h" else (batch, heads), device="cuda") * 0.5 + 0.05


def _check_options(q, k, v, scale, causal, seed, window, softcap, slopes, **kwargs):
    options = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    out, lse = _fwd(q, k, v, scale, causal, **options, **kwargs)
    options.update(softmax_scale=scale, causal=causal)
    ref_out, ref_lse = naive.attention(*(t.double() for t in (q, k, v)), **options)
    base_out, base_lse = naive.attention(q, k, v, **options)
    assert_matches_oracle("out", out, ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, ref_lse, base_lse, seed=seed)
    return out, lse


@pytest.mark.parametrize("case", OPTION_CASES, ids=[_option_id(c) for c in OPTION_CASES])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_gluon_fwd_options_match_oracle(seed, case):
    sq, sk, d, layout, dtype, causal, window, softcap, alibi = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    q = torch.randn(2, sq, heads, d, dtype=dtype, device="cuda")
    k, v = (torch.randn(2, sk, heads_kv, d, dtype=dtype, device="cuda") for _ in range(2))
    _check_options(q, k, v, d**-0.5, causal, seed, window, softcap, _slopes(alibi, 2, heads))


@pytest.mark.parametrize("option", ["softcap", "alibi", "dropout", "plain"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_consumers_taking_turns_change_no_bit(seed, monkeypatch, head_dim, option):
    # Ping-pong (FLASHTILE_HOPPER_FWD_PINGPONG) changes when each consumer issues its wgmmas, not what it
    # computes: out and LSE bitwise equal with and without, causal (masked tiles) and odd lengths.
    from flashtile.kernels.hopper import fwd

    q = torch.randn(2, 1000, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 1300, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    extra = {
        "softcap": {"softcap": 20.0},
        "alibi": {"alibi_slopes": _slopes("bh", 2, 4)},
        "dropout": {
            "dropout_p": 0.2,
            "rng_state": torch.tensor([seed, 64], dtype=torch.int64, device="cuda"),
        },
        "plain": {},
    }[option]
    results = []
    for forced in ("0", "1"):
        monkeypatch.setenv(fwd.PINGPONG_ENV, forced)
        results.append(_fwd(q, k, v, head_dim**-0.5, True, window_size=(-1, 0), **extra))
    (out_off, lse_off), (out_on, lse_on) = results
    assert torch.equal(out_off, out_on) and torch.equal(lse_off, lse_on)
    assert torch.isfinite(out_on).all()
    if option != "dropout":
        _check_options(q, k, v, head_dim**-0.5, True, seed, (-1, 0), extra.get("softcap", 0.0),
                       extra.get("alibi_slopes"))  # fmt: skip


@pytest.mark.parametrize("share", ["0", "2", "4", "8"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_exponentials_on_the_fma_pipes_match_oracle(seed, monkeypatch, dtype, head_dim, causal, share):
    # FLASHTILE_HOPPER_FWD_EXP2_POLY: one exponential in 2, 4 or 8 of the unmasked tiles by a polynomial
    # (hopper.fwd._exp2_shared), 0 every one on the MUFU. Plain attention, a typical softcap, and one
    # whose capped scores span ±100 (base-2 exponents down to −288: past the polynomial's clamp at −125);
    # odd lengths, N_q ≠ N_k, GQA.
    from flashtile.kernels.hopper import fwd

    monkeypatch.setenv(fwd.EXP2_POLY_ENV, share)
    q = torch.randn(2, 1000, 4, head_dim, dtype=dtype, device="cuda") * 3
    k, v = (torch.randn(2, 1300, 2, head_dim, dtype=dtype, device="cuda") for _ in range(2))
    window = (-1, 0) if causal else (-1, -1)
    for softcap, scale in ((0.0, head_dim**-0.5), (30.0, head_dim**-0.5), (100.0, 1.0)):
        _check_options(q, k, v, scale, causal, seed, window, softcap, None)


@pytest.mark.parametrize("softcap", [5.0, 0.0])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rows_outside_the_window_give_zero_output_and_minus_inf_lse(
    seed, head_dim, softcap, nan_poisoned_allocations
):
    # Window (0, 0) with N_q − N_k = 200: query i sees key i − 200 alone, the first 200 rows see nothing
    # (the first 128-row block wholly: its program loads no tile). Softcap and ALiBi change neither.
    q = torch.randn(2, 300, 4, head_dim, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 100, 2, head_dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out, lse = _check_options(q, k, v, 0.1, False, seed, (0, 0), softcap, _slopes("h", 2, 4))
    assert torch.equal(out[:, :200], torch.zeros_like(out[:, :200]))
    assert torch.isneginf(lse[:, :, :200]).all()
    assert torch.isfinite(lse[:, :, 200:]).all() and torch.isfinite(out).all()


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_window_with_a_three_stage_ring_matches_oracle(seed):
    # The tile range starts past tile 0: the ring's slots and phases count from the program's first tile.
    q = torch.randn(2, 700, 4, 128, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, 901, 2, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    config = configs.HopperFwdConfig(BLOCK_N=128, STAGES=3)
    _check_options(q, k, v, 128**-0.5, False, seed, (300, 40), 30.0, _slopes("bh", 2, 4), config=config)


# Launches the persistent grid takes (kernels/hopper/fwd.py, runs_persistent): plain attention, sliding
# windows and causal (paired row blocks), more work tiles than SMs (so programs loop over several), odd
# lengths both ways round, and a window that leaves whole tiles of rows without a key (their turn on Q's
# barrier without a load).
PERSISTENT_CASES = [
    (8, 1023, 1025, 64, "gqa", torch.bfloat16, False, (-1, -1)),
    (8, 777, 1500, 128, "mha", torch.float16, False, (-1, -1)),
    (8, 2000, 1999, 128, "gqa", torch.bfloat16, True, (256, 0)),
    (8, 1500, 777, 64, "mqa", torch.float16, False, (100, 50)),
    (8, 1000, 300, 128, "gqa", torch.bfloat16, False, (0, 0)),
    # Three consumer warpgroups (D = 64 from N_q = 2048): 192-row tiles.
    (4, 2100, 2047, 64, "gqa", torch.bfloat16, False, (-1, -1)),
    # Causal and right-bounded windows: row blocks dealt out in pairs (fwd._paired_tile), with an even and
    # an odd number of row blocks and of heads, rows that see no key (N_q > N_k), three consumers.
    (12, 1023, 1025, 64, "gqa", torch.bfloat16, True, (-1, 0)),
    (12, 1100, 1100, 128, "mha", torch.float16, True, (-1, 0)),
    (13, 1500, 777, 128, "mqa", torch.bfloat16, True, (-1, 0)),
    (16, 777, 900, 64, "mqa", torch.float16, False, (-1, 100)),
    (5, 4100, 4099, 64, "mqa", torch.bfloat16, True, (-1, 0)),
    # D = 256: the output staged in the one Q buffer (fwd.output_in_q), K/V loaded ahead of Q; causal with
    # rows that see no key (N_q > N_k: tiles without key tiles, whose zeros go out through Q's buffer too).
    (8, 1023, 1025, 256, "gqa", torch.bfloat16, False, (-1, -1)),
    (12, 1100, 1100, 256, "mha", torch.float16, True, (-1, 0)),
    (13, 1500, 777, 256, "mqa", torch.bfloat16, True, (-1, 0)),
]


# Softcap, ALiBi and dropout on the persistent grid (fwd.runs_persistent): each work tile takes its own
# slope (1-D and 2-D slopes), dropout counters (its batch, head and rows) and softcap factors; causal in
# pairs with rows that see no key (N_q > N_k), D = 256 through Q's one buffer (dropout keeps one program
# a tile there), combinations, more work tiles than SMs.
PERSISTENT_OPTION_CASES = [
    # (batch, N_q, N_k, D, layout, causal, softcap, alibi, dropout_p)
    (8, 1023, 1025, 64, "gqa", False, 30.0, None, 0.0),
    (12, 1100, 1100, 128, "mha", True, 0.0, "bh", 0.0),
    (13, 1500, 777, 128, "mqa", True, 20.0, "h", 0.1),
    (8, 777, 1500, 128, "mha", False, 0.0, "h", 0.2),
    (12, 1023, 1025, 64, "gqa", True, 0.0, None, 0.15),
    (12, 1100, 1100, 256, "mha", True, 10.0, "bh", 0.0),
    (8, 1023, 1025, 256, "gqa", False, 0.0, "h", 0.0),
    (13, 1500, 777, 64, "mqa", True, 0.0, "bh", 0.0),
]


@pytest.mark.parametrize(
    "case",
    PERSISTENT_OPTION_CASES,
    ids=[
        f"{c[1]}x{c[2]}-d{c[3]}-{'causal' if c[5] else 'full'}-cap{c[6]:g}-alibi{c[7]}-p{c[8]:g}"
        for c in PERSISTENT_OPTION_CASES
    ],
)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_persistent_grid_with_options_matches_oracle_and_one_program_a_tile(seed, case, monkeypatch):
    from flashtile.kernels.fwd import alibi_stride_b
    from flashtile.kernels.hopper import fwd

    batch, sq, sk, d, layout, causal, softcap, alibi, dropout_p = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    q = torch.randn(batch, sq, heads, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(batch, sk, heads_kv, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    window = (-1, 0) if causal else (-1, -1)
    slopes = _slopes(alibi, batch, heads)
    cfg = configs.hopper_fwd_config(d)
    args = (torch.device("cuda"), batch, sq, sk, heads, heads_kv, d, d**-0.5, causal, window, softcap)
    launch = fwd._fwd_launch(
        *args, alibi_stride_b(slopes), cfg.BLOCK_N, cfg.STAGES, dropout_p=dropout_p, consumers=2
    )
    sms = configs.multiprocessor_count(torch.device("cuda"))
    assert launch.grid == (sms,), "the case must take the persistent grid, with tiles to loop over"
    rng_state = torch.tensor([seed, 4096], dtype=torch.int64, device="cuda") if dropout_p else None
    options = dict(window_size=window, softcap=softcap, alibi_slopes=slopes, dropout_p=dropout_p)
    out, lse = _fwd(q, k, v, d**-0.5, causal, rng_state=rng_state, **options)
    mask = naive.dropout_mask(rng_state, dropout_p, batch, heads, sq, sk) if dropout_p else None
    reference = dict(options, softmax_scale=d**-0.5, causal=causal, dropout_mask=mask)
    ref_out, ref_lse = naive.attention(*(t.double() for t in (q, k, v)), **reference)
    base_out, base_lse = naive.attention(q, k, v, **reference)
    assert_matches_oracle("out", out, ref_out, base_out, seed=seed)
    assert_matches_oracle("lse", lse, ref_lse, base_lse, seed=seed)
    monkeypatch.setenv(fwd.PERSISTENT_ENV, "0")
    out_tiles, lse_tiles = _fwd(q, k, v, d**-0.5, causal, rng_state=rng_state, **options)
    # The same tiles in the same order of key tiles: bitwise the same results.
    assert torch.equal(out, out_tiles) and torch.equal(lse, lse_tiles)


# Three consumer warpgroups at D = 64 (fwd.consumer_count), forced at every length: odd lengths both ways
# round, causal (one program a tile) and not (persistent), and the lengths where the rule picks them itself.
THREE_CONSUMER_CASES = [
    (2, 1, 1, False, "3"),
    (2, 203, 113, True, "3"),
    (2, 113, 203, False, "3"),
    (3, 1023, 1025, True, "3"),
    (1, 8200, 8199, True, None),
    (2, 2048, 3000, False, None),
    # Causal on the persistent grid in pairs (more pairs than SMs): the lower warpgroups release the key
    # tiles past their rows' last key unread (fwd._attn_fwd_tile's OWN_TILES), N_q > N_k too.
    (12, 2100, 2100, True, "3"),
    (13, 2500, 1500, True, "3"),
]


@pytest.mark.parametrize(
    "case",
    THREE_CONSUMER_CASES,
    ids=[f"{c[1]}x{c[2]}-{'causal' if c[3] else 'full'}" for c in THREE_CONSUMER_CASES],
)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_three_consumer_warpgroups_match_oracle(seed, case, monkeypatch):
    from flashtile.kernels.hopper import fwd

    batch, sq, sk, causal, forced = case
    if forced is not None:
        monkeypatch.setenv(fwd.CONSUMERS_ENV, forced)
    else:
        monkeypatch.delenv(fwd.CONSUMERS_ENV, raising=False)
    window = (-1, 0) if causal else (-1, -1)
    if forced is None:
        assert fwd.consumer_count(64, sq, window, 0.0, False, 0.0, False, False) == 3
    q = torch.randn(batch, sq, 4, 64, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(batch, sk, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out, lse = _check_options(q, k, v, 0.125, causal, seed, window, 0.0, None)
    monkeypatch.setenv(fwd.CONSUMERS_ENV, "2")
    # Three consumers' tiling, 128 keys (two take 64 by default at short causal rows, configs.short_causal).
    tiling = configs.hopper_fwd_config(64, plain=True)
    out_two, lse_two = _fwd(q, k, v, 0.125, causal, window_size=window, config=tiling)
    # Each row sees the same key tiles in the same order whichever warpgroup holds it: the same bits.
    assert torch.equal(out, out_two) and torch.equal(lse, lse_two)


@pytest.mark.parametrize(
    "case",
    PERSISTENT_CASES,
    ids=[f"{c[1]}x{c[2]}-d{c[3]}-{c[4]}-w{c[7][0]},{c[7][1]}" for c in PERSISTENT_CASES],
)
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_persistent_grid_matches_oracle_and_one_program_a_tile(seed, case, monkeypatch):
    from flashtile.kernels.hopper import fwd

    batch, sq, sk, d, layout, dtype, causal, window = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    q = torch.randn(batch, sq, heads, d, dtype=dtype, device="cuda")
    k, v = (torch.randn(batch, sk, heads_kv, d, dtype=dtype, device="cuda") for _ in range(2))
    cfg = configs.hopper_fwd_config(d)
    consumers = fwd.consumer_count(d, sq, window, 0.0, False, 0.0, False, False)
    args = (torch.device("cuda"), batch, sq, sk, heads, heads_kv, d, d**-0.5, causal, window, 0.0, None)
    launch = fwd._fwd_launch(*args, cfg.BLOCK_N, cfg.STAGES, consumers=consumers)
    assert launch.kernel is fwd.attn_fwd_kernel
    sms = configs.multiprocessor_count(torch.device("cuda"))
    assert launch.grid == (sms,), "the case must take the persistent grid, with tiles to loop over"
    m_blocks = -(-sq // (64 * consumers))
    if window[0] < 0 and window[1] >= 0:
        # Pairs of row blocks (fwd.persistent_programs): at least as many as SMs.
        assert (batch * heads // 2 * m_blocks + batch * heads % 2 * -(-m_blocks // 2)) >= sms
    else:
        assert m_blocks * batch * heads > sms
    out, lse = _check_options(q, k, v, d**-0.5, causal, seed, window, 0.0, None)
    monkeypatch.setenv(fwd.PERSISTENT_ENV, "0")
    out_tiles, lse_tiles = _fwd(q, k, v, d**-0.5, causal, window_size=window)
    # The same tiles in the same order of key tiles: bitwise the same results.
    assert torch.equal(out, out_tiles) and torch.equal(lse, lse_tiles)
    if window == (0, 0):
        # Query i sees key i − 700 alone: rows before 700 see nothing.
        assert torch.equal(out[:, :700], torch.zeros_like(out[:, :700]))
        assert torch.isneginf(lse[:, :, :700]).all() and torch.isfinite(lse[:, :, 700:]).all()


@pytest.mark.parametrize(
    ("window", "softcap", "alibi"),
    [((128, 0), 0.0, "h"), ((64, 64), 20.0, None)],
    ids=["causal-window-alibi", "window-softcap"],
)
@pytest.mark.usefixtures("general_path")
def test_options_through_the_api_run_the_gluon_forward(seed, monkeypatch, window, softcap, alibi):
    # flash_attn_func under auto: the Gluon forward runs these options, the portable backward takes its
    # (out, lse); gradients within 3× of the bf16 baseline's error.
    from flashtile.kernels.hopper import fwd as hopper_fwd

    calls = []
    real = hopper_fwd.attn_fwd

    def spy(*args, **kwargs):
        calls.append(kwargs["window_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(hopper_fwd, "attn_fwd", spy)
    causal = window[1] == 0
    q = torch.randn(2, 517, 4, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k, v = (
        torch.randn(2, 600, 2, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(2)
    )
    slopes = _slopes(alibi, 2, 4)
    options = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    out = flash_attn_func(q, k, v, **options)
    assert calls == [(window[0], window[1])]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)

    def run_naive(dtype):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = naive.attention(*leaves, **options)
        return (o, *torch.autograd.grad(o, leaves, dout.to(dtype)))

    oracle, baseline = run_naive(torch.float64), run_naive(torch.bfloat16)
    for name, ours, ref, base in zip(("out", "dq", "dk", "dv"), (out, *grads), oracle, baseline, strict=True):
        assert_matches_oracle(name, ours, ref, base, grad=name != "out", seed=seed)


def test_fast_path_takes_the_options_and_declines_the_rest():
    from flashtile.kernels.hopper import support

    q = torch.randn(2, 100, 4, 128, dtype=torch.bfloat16, device="cuda")
    k = v = torch.randn(2, 90, 2, 128, dtype=torch.bfloat16, device="cuda")
    taken = [
        dict(window_size=(8, 0)), dict(window_size=(-1, 4)), dict(window_size=(16, 16)),
        dict(window_size=(3, -1)), dict(softcap=5.0), dict(alibi_slopes=torch.ones(4, device="cuda")),
        dict(window_size=(8, 8), softcap=5.0, alibi_slopes=torch.ones(2, 4, device="cuda")),
        # Packed batches too: the Gluon varlen forward passed its GPU cases (support.GPU_CHECKED_VARLEN).
        dict(cu_seqlens_q=torch.zeros(3, dtype=torch.int32, device="cuda")),
        # A block mask alone, of 128-row blocks (tests/test_gpu_hopper_block_sparse.py runs them).
        dict(mods=Mods(BlockMask.from_tiles(torch.ones(1, 1, dtype=torch.bool), 100, 90, 128))),
        # Dropout, alone and with the options (its mask drawn in the accumulator's layout).
        dict(dropout_p=0.1), dict(window_size=(8, 0), softcap=5.0, dropout_p=0.3),
        # A learnable sink, folded into each row's softmax in the epilogue.
        dict(learnable_sink=torch.zeros(4, device="cuda")),
        dict(window_size=(8, 0), learnable_sink=torch.zeros(4, device="cuda"), dropout_p=0.1),
    ]  # fmt: skip
    for options in taken:
        assert support.fwd_unsupported_reason(q, k, v, options) is None, options
    declined = {
        "dropout with a block mask": dict(
            dropout_p=0.1, mods=Mods(BlockMask.from_tiles(torch.ones(1, 1, dtype=torch.bool), 100, 90, 128))
        ),
        "without a block mask": dict(mods=Mods(mask_mod=masks.causal)),
    }
    for reason, options in declined.items():
        assert reason in support.fwd_unsupported_reason(q, k, v, options)
    assert "V head dim" in support.fwd_unsupported_reason(q, k, v[..., :64].contiguous(), {})


# Varlen (packed) batches in the Gluon forward: (N_q, N_k) per sequence (0, 1, odd, N_q ≠ N_k both ways,
# longer than a program's 128 rows and a key tile), head dim, layout, dtype, causal, window, softcap, ALiBi.
VARLEN_LENGTHS = [(5, 7), (0, 3), (1, 1), (130, 77), (3, 0), (257, 300), (64, 64), (1, 200), (77, 1)]
VARLEN_CASES = [
    (64, "mha", torch.float16, False, (-1, -1), 0.0, None),
    (64, "gqa", torch.bfloat16, True, (-1, 0), 0.0, None),
    (128, "gqa", torch.bfloat16, False, (-1, -1), 0.0, None),
    (128, "mqa", torch.float16, True, (-1, 0), 0.0, None),
    (256, "gqa", torch.bfloat16, True, (-1, 0), 0.0, None),
    (256, "mha", torch.float16, False, (-1, -1), 0.0, None),
    (64, "gqa", torch.bfloat16, True, (33, 0), 0.0, None),
    (128, "gqa", torch.float16, False, (40, 9), 0.0, None),
    (128, "mha", torch.bfloat16, False, (-1, 5), 0.0, None),
    (64, "mha", torch.float16, False, (17, -1), 0.0, None),
    (128, "gqa", torch.bfloat16, False, (-1, -1), 30.0, None),
    (64, "gqa", torch.float16, True, (-1, 0), 0.0, "h"),
    (128, "mqa", torch.bfloat16, False, (-1, -1), 0.0, "bh"),
    (64, "gqa", torch.bfloat16, False, (40, 9), 5.0, "bh"),
    (128, "gqa", torch.float16, True, (100, 0), 30.0, "h"),
    (256, "gqa", torch.bfloat16, False, (40, 9), 30.0, "h"),
    (256, "mha", torch.float16, True, (-1, 0), 5.0, "bh"),
]


def _varlen_id(case) -> str:
    d, layout, dtype, causal, window, softcap, alibi = case
    parts = [f"d{d}", layout, "causal" if causal else "full", f"w{window[0]},{window[1]}"]
    parts += [f"cap{softcap:g}"] if softcap else []
    parts += [f"alibi-{alibi}"] if alibi else []
    return "-".join(["varlen", *parts, str(dtype).removeprefix("torch.")])


@pytest.fixture
def gluon_varlen(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashtile.kernels.hopper import support

    monkeypatch.setenv(support.VARLEN_ENV, "1")


@pytest.mark.parametrize("case", VARLEN_CASES, ids=[_varlen_id(c) for c in VARLEN_CASES])
@pytest.mark.usefixtures("nan_poisoned_allocations", "gluon_varlen")
def test_gluon_varlen_fwd_matches_oracle(seed, case):
    d, layout, dtype, causal, window, softcap, alibi = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    lengths = VARLEN_LENGTHS
    q, k, v, varlen = packed_batch(lengths, heads, heads_kv, d, dtype)
    slopes = _slopes(alibi, len(lengths), heads)
    options = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    out, lse = _fwd(q, k, v, d**-0.5, causal, **options, **varlen)
    assert out.shape == q.shape and lse.shape == (heads, q.shape[0]) and lse.dtype == torch.float32
    options.update(softmax_scale=d**-0.5, causal=causal)
    ref_out, ref_lse = naive.attention_varlen(*(t.double() for t in (q, k, v)), **varlen, **options)
    base_out, base_lse = naive.attention_varlen(q, k, v, **varlen, **options)
    # Rows of a sequence without keys (or outside their window) see nothing: out 0, LSE −inf, as the
    # portable forward; the others within 2× of the baseline's error.
    empty = torch.isinf(ref_lse) & (ref_lse < 0)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty)
    assert (out.permute(1, 0, 2)[empty] == 0).all()
    seen = ~empty
    assert_matches_oracle("lse", lse[seen], ref_lse[seen], base_lse[seen], seed=seed)
    rows = seen.permute(1, 0)
    assert_matches_oracle("out", out[rows], ref_out[rows], base_out[rows], seed=seed)


@pytest.mark.parametrize("head_dim", configs.HOPPER_FWD_HEAD_DIMS)
@pytest.mark.parametrize(
    ("causal", "window", "softcap", "alibi"),
    [(False, (-1, -1), 0.0, None), (True, (-1, 0), 0.0, None), (False, (40, 9), 30.0, "h")],
    ids=["full", "causal", "window-softcap-alibi"],
)
@pytest.mark.usefixtures("nan_poisoned_allocations", "gluon_varlen")
def test_gluon_varlen_fwd_packed_equals_each_sequence_alone(seed, head_dim, causal, window, softcap, alibi):
    # Bitwise: a sequence's rows do not depend on its neighbours (their keys are masked, their rows never
    # written), so the packed batch gives what each sequence gives run alone through the same kernel.
    lengths = VARLEN_LENGTHS
    q, k, v, varlen = packed_batch(lengths, 4, 2, head_dim, torch.bfloat16)
    slopes = _slopes(alibi, 1, 4)
    options = dict(window_size=window, softcap=softcap, alibi_slopes=slopes)
    out, lse = _fwd(q, k, v, head_dim**-0.5, causal, **options, **varlen)
    cu_q, cu_k = varlen["cu_seqlens_q"].tolist(), varlen["cu_seqlens_k"].tolist()
    for b, (sq, sk) in enumerate(lengths):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        one = dict(
            cu_seqlens_q=torch.tensor([0, sq], dtype=torch.int32, device="cuda"),
            cu_seqlens_k=torch.tensor([0, sk], dtype=torch.int32, device="cuda"),
            max_seqlen_q=sq, max_seqlen_k=sk,
        )  # fmt: skip
        one_out, one_lse = _fwd(q[rq], k[rk], v[rk], head_dim**-0.5, causal, **options, **one)
        assert torch.equal(one_out, out[rq]), (b, sq, sk)
        assert torch.equal(one_lse, lse[:, rq]), (b, sq, sk)


@pytest.mark.usefixtures("gluon_varlen")
def test_gluon_varlen_fwd_agrees_with_the_dense_gluon_fwd(seed):
    # Each sequence of a packed batch against the dense Gluon forward on it alone (the same tiles: keys past
    # the sequence masked in varlen, zeros in dense), and its LSE in the (H, total_q) layout.
    lengths = [(1, 5), (200, 130), (0, 4), (65, 65), (129, 300)]
    q, k, v, varlen = packed_batch(lengths, 4, 2, 128, torch.float16)
    out, lse = _fwd(q, k, v, 0.125, True, window_size=(-1, 0), **varlen)
    bounds_q = list(itertools.pairwise(varlen["cu_seqlens_q"].tolist()))
    bounds_k = list(itertools.pairwise(varlen["cu_seqlens_k"].tolist()))
    for (a, b), (c, e) in zip(bounds_q, bounds_k, strict=True):
        if b == a:
            continue
        one_out, one_lse = _fwd(q[None, a:b], k[None, c:e], v[None, c:e], 0.125, True, window_size=(-1, 0))
        torch.testing.assert_close(out[a:b], one_out[0], atol=2e-3, rtol=0)
        torch.testing.assert_close(lse[:, a:b], one_lse[0], atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("gluon_varlen")
def test_gluon_varlen_through_the_api_and_its_backward(seed, monkeypatch):
    # flash_attn_varlen_func under auto: the Gluon forward runs the packed batch, the backward (Gluon too
    # since its varlen cases passed) takes its (out, lse); gradients within 3× of the bf16 baseline's error.
    from flashtile import flash_attn_varlen_func
    from flashtile.kernels.hopper import fwd as hopper_fwd

    calls = []
    real = hopper_fwd.attn_fwd

    def spy(*args, **kwargs):
        calls.append(kwargs.get("cu_seqlens_q") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(hopper_fwd, "attn_fwd", spy)
    q, k, v, varlen = packed_batch([(100, 120), (1, 1), (300, 257)], 4, 2, 128, torch.bfloat16)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    cu = (varlen["cu_seqlens_q"], varlen["cu_seqlens_k"], varlen["max_seqlen_q"], varlen["max_seqlen_k"])
    out = flash_attn_varlen_func(*leaves, *cu, causal=True)
    assert calls == [True]
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)

    def run_naive(dtype):
        ls = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = naive.attention_varlen(*ls, *cu, causal=True)
        return (o, *torch.autograd.grad(o, ls, dout.to(dtype)))

    oracle, baseline = run_naive(torch.float64), run_naive(torch.bfloat16)
    for name, ours, ref, base in zip(("out", "dq", "dk", "dv"), (out, *grads), oracle, baseline, strict=True):
        assert_matches_oracle(name, ours, ref, base, grad=name != "out", seed=seed)
