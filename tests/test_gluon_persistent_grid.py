"""Which Gluon forward (and, at the end, backward) launches take the persistent grid (kernels/hopper/fwd.py,
docs/design/hopper.md, "Persistent forward"): work tiles of equal cost — plain attention, softcap, ALiBi or
dropout, or a sliding window at most half of N_k wide — or causal row blocks paired longest with shortest,
at D = 64 without an option or with ≤ 2048 keys a tile, as many programs as SMs; everything else one
program a work tile. The launches are prepared on the CPU (no kernel runs), where the SM count is 4; the
pairing's slot map is integer arithmetic, run here in Python."""

from __future__ import annotations

import pytest
import torch

from flashtile.errors import FlashtileValueError
from flashtile.kernels import configs
from flashtile.kernels.hopper import bwd, fwd

CPU = torch.device("cpu")
SMS = configs.multiprocessor_count(CPU)


def grid(head_dim: int, seqlen: int, *, causal=False, window=(-1, -1), softcap=0.0, alibi=None, varlen=None,
         dropout_p=0.0, persistent=True) -> tuple[int, ...]:  # fmt: skip
    cfg = configs.hopper_fwd_config(head_dim)
    window = (window[0], 0) if causal else window
    launch = fwd._fwd_launch(
        CPU, 2, seqlen, seqlen, 8, 2, head_dim, head_dim**-0.5, causal, window, softcap, alibi, cfg.BLOCK_N,
        cfg.STAGES, varlen, None, dropout_p, persistent,
    )  # fmt: skip
    return launch.grid


def work_tiles(seqlen: int) -> int:
    return -(-seqlen // 128) * 2 * 8


@pytest.mark.parametrize(
    ("head_dim", "seqlen"), [(64, 512), (64, 16384), (128, 1024), (128, 2048), (128, 777), (256, 1024)]
)
def test_plain_attention_at_short_keys_or_d64_runs_one_program_an_sm(head_dim, seqlen):
    assert grid(head_dim, seqlen) == (SMS,)


@pytest.mark.parametrize(("head_dim", "expected"), [(64, 1), (128, 1), (256, fwd.OUTPUT_IN_Q.value)])
def test_only_d256_stages_its_output_in_its_one_q_buffer(head_dim, expected):
    # At D = 256 a second row buffer does not fit beside the K/V ring: the output goes through Q's.
    cfg = configs.hopper_fwd_config(head_dim)
    launch = fwd._fwd_launch(
        CPU, 2, 1024, 1024, 8, 2, head_dim, 0.125, False, (-1, -1), 0.0, None, cfg.BLOCK_N, cfg.STAGES
    )  # fmt: skip
    values = dict(
        zip(fwd.attn_fwd_kernel.arg_names, launch.arguments((None,) * len(fwd.FWD_POINTERS)), strict=True)
    )
    assert values["PERSISTENT"] == expected


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "window", "causal"),
    [(128, 8192, (256, 0), False), (128, 16384, (255, -1), True), (64, 1024, (64, 64), False),
     (128, 16384, (1000, 900), False), (64, 16384, (4000, 3000), False)],
    ids=["256-0", "causal-255", "64-64", "1000-900", "d64-wide"],
)  # fmt: skip
def test_sliding_windows_run_one_program_an_sm(head_dim, seqlen, window, causal):
    # Every row block visits about the same keys (the window's span), however long the sequence.
    assert grid(head_dim, seqlen, window=window, causal=causal) == (SMS,)


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "options"),
    [
        (128, 2049, {}),
        (128, 16384, {}),
        # Causal at D = 128: half of N_k a tile on average, past the key bound.
        (128, 4200, {"causal": True}),
        (256, 4096, {}),
        (64, 1024, {"window": (17, -1)}),
        (64, 1024, {"window": (300, 200)}),
        (128, 16384, {"window": (1100, 900)}),
        # An option at D = 64 takes the key bound too; dropout at D = 256 spilled on the persistent grid.
        (64, 4096, {"softcap": 30.0}),
        (256, 1024, {"dropout_p": 0.1}),
        (128, 1024, {"persistent": False}),
    ],
    ids=[
        "long-keys",
        "16k",
        "causal-past-the-bound",
        "d256-long-keys",
        "left-only",
        "wide-window",
        "long-window",
        "d64-softcap-long-keys",
        "d256-dropout",
        "turned-off",
    ],
)
def test_every_other_launch_runs_one_program_a_work_tile(head_dim, seqlen, options):
    assert grid(head_dim, seqlen, **options) == (work_tiles(seqlen),)


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "options"),
    [
        (64, 1024, {"softcap": 30.0}),
        (64, 2048, {"alibi": 0, "dropout_p": 0.1}),
        (128, 1024, {"alibi": 8}),
        (128, 2048, {"dropout_p": 0.1}),
        # Causal in pairs: half of N_k a tile on average.
        (128, 4096, {"causal": True, "softcap": 30.0, "alibi": 0}),
        (256, 1024, {"softcap": 30.0, "alibi": 0}),
    ],
    ids=["d64-softcap", "d64-alibi-dropout", "alibi-2d", "dropout", "causal-softcap-alibi", "d256-options"],
)
def test_softcap_alibi_and_dropout_at_short_keys_run_one_program_an_sm(head_dim, seqlen, options):
    # Each work tile sets up its own slope and dropout counters: the options take the grid plain attention
    # takes, within the key bound at every head dim.
    assert grid(head_dim, seqlen, **options) == (SMS,)


def test_packed_batches_run_one_program_a_work_tile():
    varlen = (3000, 3000, 1024, 1024)
    assert grid(64, 0, varlen=varlen) == (work_tiles(1024),)


def test_a_grid_never_exceeds_its_work_tiles():
    # One work tile in all (a single 64-row block of one head): one program, however many SMs.
    launch = fwd._fwd_launch(CPU, 1, 64, 64, 1, 1, 64, 0.125, False, (-1, -1), 0.0, None, 128, 2)
    assert launch.grid == (1,)


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "window", "options", "expected"),
    [
        (64, 2048, (-1, -1), {}, 3),
        (64, 2047, (-1, -1), {}, 2),
        (64, 8192, (-1, 0), {}, 3),
        (64, 8191, (-1, 0), {}, 2),
        (64, 4096, (-1, 0), {}, 2),
        (64, 2048, (-1, 0), {}, 2),
        (64, 16384, (256, 0), {}, 2),
        (64, 16384, (-1, 100), {}, 2),
        (128, 16384, (-1, -1), {}, 2),
        (256, 16384, (-1, 0), {}, 2),
        (64, 16384, (-1, -1), {"softcap": 30.0}, 2),
        (64, 16384, (-1, -1), {"alibi": True}, 2),
        (64, 16384, (-1, -1), {"dropout_p": 0.1}, 2),
        (64, 16384, (-1, -1), {"varlen": True}, 2),
        (64, 16384, (-1, -1), {"sparse": True}, 2),
    ],
)
def test_three_consumer_warpgroups_at_d64_for_long_plain_or_causal_rows(
    head_dim, seqlen, window, options, expected, monkeypatch
):
    monkeypatch.delenv(fwd.CONSUMERS_ENV, raising=False)
    full = {**dict(softcap=0.0, alibi=False, dropout_p=0.0, varlen=False, sparse=False), **options}
    assert fwd.consumer_count(head_dim, seqlen, window, *full.values()) == expected


def test_the_consumers_knob_overrides_the_length_rule_where_d64_allows(monkeypatch):
    plain = (0.0, False, 0.0, False, False)
    monkeypatch.setenv(fwd.CONSUMERS_ENV, "3")
    assert fwd.consumer_count(64, 17, (5, 5), *plain) == 3
    assert fwd.consumer_count(128, 16384, (-1, -1), *plain) == 2
    assert fwd.consumer_count(64, 16384, (-1, -1), 30.0, False, 0.0, False, False) == 2
    monkeypatch.setenv(fwd.CONSUMERS_ENV, "2")
    assert fwd.consumer_count(64, 16384, (-1, -1), *plain) == 2


@pytest.mark.parametrize(
    ("head_dim", "plain", "window", "seqlen_q", "seqlen_k", "block_n"),
    [
        (64, True, (-1, 0), 512, 512, 64),
        (64, True, (-1, 0), 17, 300, 64),
        (64, True, (-1, 0), 512, 513, 128),
        (64, True, (-1, 0), 1024, 1024, 128),
        (64, True, (-1, -1), 512, 512, 128),
        (64, False, (-1, 0), 512, 512, 128),
        (128, True, (-1, 0), 512, 512, 128),
        (256, True, (-1, 0), 512, 512, 64),
    ],
)
def test_short_causal_rows_at_d64_take_64_key_tiles(head_dim, plain, window, seqlen_q, seqlen_k, block_n,
                                                     monkeypatch):  # fmt: skip
    monkeypatch.delenv(fwd.CONSUMERS_ENV, raising=False)
    assert block_n == fwd.plain_tiling(head_dim, plain, window, seqlen_q, seqlen_k).BLOCK_N


def test_three_forced_consumers_keep_128_key_tiles_at_short_causal_rows(monkeypatch):
    monkeypatch.setenv(fwd.CONSUMERS_ENV, "3")
    assert fwd.plain_tiling(64, True, (-1, 0), 512, 512).BLOCK_N == 128


def test_three_consumers_tile_192_rows():
    # N = 2100: 11 row blocks of 192 per head (2 · 8 heads: 176 work tiles), persistent over the SMs.
    cfg = configs.hopper_fwd_config(64)
    launch = fwd._fwd_launch(
        CPU, 2, 2100, 2100, 8, 2, 64, 0.125, False, (-1, -1), 0.0, None, cfg.BLOCK_N, cfg.STAGES, consumers=3
    )  # fmt: skip
    assert launch.grid == (SMS,)
    arguments = launch.arguments((None,) * len(fwd.FWD_POINTERS))
    values = dict(zip(fwd.attn_fwd_kernel.arg_names, arguments, strict=True))
    assert values["num_m_blocks"] == 11 and values["total_work"] == 11 * 2 * 8


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "options"),
    [(128, 1024, {"causal": True}), (64, 16384, {"causal": True}), (64, 1024, {"window": (-1, 17)}),
     (128, 777, {"causal": True}), (128, 4096, {"causal": True})],
    ids=["causal", "causal-16k", "right-only", "odd", "causal-4k"],
)  # fmt: skip
def test_causal_and_right_bounded_windows_run_paired_row_blocks_one_program_an_sm(head_dim, seqlen, options):
    assert grid(head_dim, seqlen, **options) == (SMS,)


def test_too_few_paired_units_to_fill_the_sms_run_one_program_a_tile():
    # One head of 4 row blocks: 2 units for 4 SMs; one program a tile runs 4 at once.
    launch = fwd._fwd_launch(CPU, 1, 512, 512, 1, 1, 64, 0.125, True, (-1, 0), 0.0, None, 128, 2)
    assert launch.grid == (4,)
    arguments = launch.arguments((None,) * len(fwd.FWD_POINTERS))
    assert not dict(zip(fwd.attn_fwd_kernel.arg_names, arguments, strict=True))["PERSISTENT"]


@pytest.mark.parametrize("programs", [1, 3, 4, 132])
@pytest.mark.parametrize("m_blocks", [1, 2, 7, 8, 86])
@pytest.mark.parametrize("batch_heads", [1, 5, 64])
def test_paired_slots_deal_every_row_block_once_in_balanced_units(programs, m_blocks, batch_heads):
    # The kernel's own slot map (fwd._paired_tile, fwd._work_slots), each program stepping through its
    # slots pid, pid + P, … as the producer and consumers do.
    sched = (m_blocks, *(None,) * 9, programs, m_blocks * batch_heads)
    slots = fwd._work_slots.fn(sched, True)
    seen = []
    costs = []
    for pid in range(programs):
        units = [(r, r // 2 * programs + pid) for r in range(-(-(slots - pid) // programs))]
        mine = [fwd._paired_tile.fn(r, u, *divmod(u, m_blocks), m_blocks, batch_heads) for r, u in units]
        live = [(bh, m) for bh, m, alive in mine if alive]
        seen += live
        # A causal row block m visits about m + 1 key tiles.
        costs.append(sum(m + 1 for _, m in live))
        for (bh_first, first, _), (bh_second, second, alive_second) in zip(
            mine[0::2], mine[1::2], strict=True
        ):
            # Rounds 2i and 2i + 1: one head's blocks k and M − 1 − k, the longer first, or (M odd) the
            # middle blocks of two heads.
            pair = (bh_first == bh_second and first + second == m_blocks - 1 and first >= second) or (
                bh_second == bh_first + 1 and first == second == (m_blocks - 1) // 2 and m_blocks % 2
            )
            assert pair or not alive_second, (bh_first, first, bh_second, second)
    assert sorted(seen) == [(bh, m) for bh in range(batch_heads) for m in range(m_blocks)]
    units = batch_heads // 2 * m_blocks + batch_heads % 2 * -(-m_blocks // 2)
    # Every unit costs M + 1 but a lone middle block, (M + 1) / 2: programs differ by at most a unit and a
    # half.
    assert max(costs) - min(costs) <= (m_blocks + 1) * 3 // 2
    assert slots == 2 * programs * -(-units // programs)


def magic_quotient(n: int, divisor: int) -> int:
    """fwd._divmod's quotient in Python from the launcher's arguments, 32-bit unsigned as the kernel
    computes it."""
    values = fwd.divider_arguments("m", divisor)
    magic, shift = values["m_magic"] % 2**32, values["m_shift"]
    assert -(2**31) <= values["m_magic"] < 2**31 and 0 <= shift < 32
    high = n * magic >> 32
    assert high + n < 2**32
    return (high + n) >> shift


@pytest.mark.parametrize("divisor", [1, 2, 3, 5, 7, 8, 31, 86, 127, 128, 129, 1000, 2**20 + 1, 2**30 - 1])
def test_work_tiles_divide_by_multiply_high_exactly(divisor):
    # The work tiles split a slot into (head, row block) and a head into (batch, head) by a multiply-high,
    # an add and a shift (fwd.divider_arguments, fwd._divmod): exact for every n < 2³¹, checked at the
    # edges of each quotient and over a random sample.
    numerators = {0, 1, 2**31 - 1, 2**31 - 2}
    for q in (0, 1, 2, 1000, (2**31 - 1) // divisor):
        numerators |= {n for n in (q * divisor - 1, q * divisor, q * divisor + 1) if 0 <= n < 2**31}
    numerators |= set(torch.randint(0, 2**31 - 1, (2000,)).tolist())
    for n in sorted(numerators):
        assert magic_quotient(n, divisor) == n // divisor, n


@pytest.mark.parametrize(
    ("seqlen", "options", "varlen"),
    [(2100, {}, None), (777, {"causal": True}, None), (300, {"window": (17, 5)}, None),
     (0, {"causal": True}, (3000, 2000, 1024, 1024)), (1000, {"softcap": 30.0}, None)],
    ids=["plain", "causal-paired", "window", "varlen", "one-program-a-tile"],
)  # fmt: skip
def test_each_launch_passes_magic_numbers_for_its_own_divisors(seqlen, options, varlen):
    # The kernel divides by the row blocks M, the heads H and the programs P with the launcher's magic
    # numbers (fwd._divmod): each pair must be the one for that launch's divisor.
    window = (-1, 0) if options.get("causal") else options.get("window", (-1, -1))
    cfg = configs.hopper_fwd_config(64)
    launch = fwd._fwd_launch(
        CPU, 3, seqlen, seqlen, 6, 2, 64, 0.125, bool(options.get("causal")), window,
        options.get("softcap", 0.0), None, cfg.BLOCK_N, cfg.STAGES, varlen,
    )  # fmt: skip
    arguments = launch.arguments((None,) * len(fwd.FWD_POINTERS))
    values = dict(zip(fwd.attn_fwd_kernel.arg_names, arguments, strict=True))
    programs = launch.grid[0] if values["PERSISTENT"] else 1
    for name, divisor in (("m", values["num_m_blocks"]), ("h", values["H"]), ("p", programs)):
        assert {key: values[key] for key in (f"{name}_magic", f"{name}_shift")} == fwd.divider_arguments(
            name, divisor
        )
        for n in (0, divisor - 1, divisor, 7 * divisor + 3, values["total_work"] * 2):
            assert magic_quotient(n, divisor) == n // divisor


def test_divisors_past_the_magic_numbers_range_are_refused():
    with pytest.raises(FlashtileValueError, match="accepted: 1 to 2"):
        fwd.divider_arguments("h", 2**30)


@pytest.mark.parametrize(
    ("head_dim", "seqlen", "causal", "expected"),
    [(64, 16384, False, 2), (64, 16384, True, 2), (128, 1024, False, 2), (128, 1024, True, 2),
     (128, 1025, False, 1), (128, 2048, False, 1), (128, 4096, True, 1), (128, 16384, False, 1),
     (256, 512, False, 1)],
)  # fmt: skip
def test_two_q_buffers_on_the_persistent_grid_at_d64_and_up_to_1k_keys_at_d128(
    head_dim, seqlen, causal, expected
):
    # One buffer wherever a program takes one work tile (D = 128 from 16k, D = 256).
    cfg = configs.hopper_fwd_config(head_dim)
    window = (-1, 0) if causal else (-1, -1)
    launch = fwd._fwd_launch(
        CPU, 2, seqlen, seqlen, 8, 2, head_dim, 0.125, causal, window, 0.0, None, cfg.BLOCK_N, cfg.STAGES
    )  # fmt: skip
    values = dict(
        zip(fwd.attn_fwd_kernel.arg_names, launch.arguments((None,) * len(fwd.FWD_POINTERS)), strict=True)
    )
    assert values["Q_BUFS"] == expected
    assert values["PERSISTENT"] or expected == 1


def _launch_values(head_dim: int, seqlen: int, *, softcap=0.0, alibi=None, dropout_p=0.0, forced="") -> dict:
    cfg = configs.hopper_fwd_config(head_dim)
    consumers = fwd.consumer_count(
        head_dim, seqlen, (-1, -1), softcap, alibi is not None, dropout_p, False, False
    )
    launch = fwd._fwd_launch(
        CPU, 2, seqlen, seqlen, 8, 2, head_dim, 0.125, False, (-1, -1), softcap, alibi, cfg.BLOCK_N,
        cfg.STAGES, None, None, dropout_p, True, consumers, forced,
    )  # fmt: skip
    return dict(
        zip(fwd.attn_fwd_kernel.arg_names, launch.arguments((None,) * len(fwd.FWD_POINTERS)), strict=True)
    )


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize(
    ("option", "expected"),
    [({}, False), ({"softcap": 30.0}, True), ({"alibi": 0}, True), ({"dropout_p": 0.1}, True)],
    ids=["plain", "softcap", "alibi", "dropout"],
)
def test_consumers_take_turns_with_softcap_alibi_or_dropout(head_dim, option, expected):
    # docs/design/hopper.md, "Ping-pong": 2-5 % faster with those options at D = 128, 1-4 % slower plain.
    # (1k rows: two consumer warpgroups at every head dim.)
    assert _launch_values(head_dim, 1024, **option)["PINGPONG"] is expected
    assert _launch_values(head_dim, 1024, **option, forced="1")["PINGPONG"] is True
    assert _launch_values(head_dim, 1024, **option, forced=" 0")["PINGPONG"] is False


def test_three_consumers_never_take_turns():
    # At D = 64 from 2k rows, plain attention has three consumer warpgroups: the knob cannot force turns.
    values = _launch_values(64, 4096, forced="1")
    assert values["CONSUMERS"] == 3 and values["PINGPONG"] is False


@pytest.mark.parametrize(
    ("head_dim", "window", "options", "stages"),
    [
        (64, (-1, -1), {}, 3),
        (64, (-1, 0), {}, 3),
        (128, (-1, 0), {}, 2),
        (256, (-1, -1), {}, 2),
        (64, (256, 0), {}, 2),
        (64, (-1, -1), {"softcap": 30.0}, 2),
        (64, (-1, -1), {"alibi": True}, 2),
        (64, (-1, 0), {"dropout_p": 0.1}, 2),
        (64, (-1, -1), {"varlen": True}, 2),
        (64, (-1, -1), {"mods": True}, 2),
        (64, (-1, -1), {"fp8": True}, 2),
        (64, (-1, 0), {"sink": True}, 2),
    ],
)
def test_plain_calls_at_d64_take_a_three_deep_ring(head_dim, window, options, stages):
    # Only plain dense or causal D = 64 calls were timed with the 3-deep K/V ring (s43d, s43e).
    args = dict(softcap=0.0, alibi=False, dropout_p=0.0, varlen=False, mods=False, fp8=False, sink=False)
    plain = fwd.plain_call(window, **{**args, **options})
    assert stages == configs.hopper_fwd_config(head_dim, plain).STAGES


@pytest.mark.parametrize(("causal", "window", "softcap"), [(True, (-1, 0), 0.0), (False, (-1, -1), 30.0)])
def test_prepared_calls_take_the_launchers_tiling(causal, window, softcap):
    # kernels.hopper.prepare's forward and attn_fwd pick the ring's depth by the same rule (fwd.plain_call):
    # one prepared launch, the launcher's, which the other depth is not.
    from flashtile.kernels.hopper.prepared import PlainAttention

    q, k, v = (torch.randn(2, 1024, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    prepared = PlainAttention(q, k, v, 0.125, causal, window, softcap, False)
    plain = fwd.plain_call(window, softcap, False, 0.0, False, False, False, False)
    args = (q, k, 2, 1024, 1024, 0.125, causal, window, softcap, None, 0.0, None, None)
    ring = configs.hopper_fwd_config(64, plain)
    assert prepared._fwd is fwd.launch_for(*args, ring)
    other = configs.HopperFwdConfig(BLOCK_N=ring.BLOCK_N, STAGES=5 - ring.STAGES)
    assert prepared._fwd is not fwd.launch_for(*args, other)


# The backward (kernels/hopper/bwd.py, docs/design/hopper_bwd.md, "A persistent grid"): plain non-causal
# calls at D = 64, not deterministic and without a sink, by default; FLASHTILE_HOPPER_BWD_PERSISTENT=1 adds
# D = 128 and deterministic calls, =0 none.
def bwd_grid(head_dim: int, seqlen: int, *, causal=False, deterministic=False, sink=False, softcap=0.0):
    window = (-1, 0) if causal else (-1, -1)
    plain = bwd.is_plain_call(window, softcap, None, 0.0)
    _, cfg = bwd.select_variant(head_dim, plain)
    persistent = bwd.persistent_grid(head_dim, cfg, causal, plain, deterministic, sink)
    strides = (seqlen * 8 * head_dim, 8 * head_dim, head_dim)
    fused = bwd._bwd_launches(
        CPU, (2, seqlen, 8, head_dim), (seqlen, 2), head_dim**-0.5, causal, deterministic, cfg, strides,
        strides, window, softcap, None, None, False, None, 0.0, sink, persistent,
    )[1]  # fmt: skip
    return fused.grid


def key_blocks(head_dim: int, seqlen: int) -> int:
    return -(-seqlen // bwd.VARIANTS[head_dim][bwd.DEFAULT_VARIANT[head_dim]].block_n) * 2 * 2


@pytest.fixture
def bwd_knob(monkeypatch):
    monkeypatch.delenv(bwd.PERSISTENT_ENV, raising=False)
    monkeypatch.delenv(bwd.VARIANT_ENV, raising=False)
    return lambda value: monkeypatch.setenv(bwd.PERSISTENT_ENV, value)


@pytest.mark.parametrize("seqlen", [512, 1000, 16384])
def test_plain_non_causal_d64_backward_runs_one_program_an_sm(seqlen, bwd_knob):
    assert key_blocks(64, seqlen) > SMS
    assert bwd_grid(64, seqlen) == (SMS,)


@pytest.mark.parametrize(
    "call", [dict(causal=True), dict(deterministic=True), dict(sink=True), dict(softcap=30.0)],
    ids=["causal", "deterministic", "sink", "softcap"],
)  # fmt: skip
def test_other_d64_backwards_run_one_program_a_key_block(call, bwd_knob):
    assert bwd_grid(64, 1000, **call) == (key_blocks(64, 1000),)


def test_the_knob_adds_d128_and_deterministic_calls_or_takes_every_call_off(bwd_knob):
    assert bwd_grid(128, 1000) == (key_blocks(128, 1000),)
    bwd_knob("1")
    assert bwd_grid(128, 1000) == (SMS,)
    assert bwd_grid(64, 1000, deterministic=True) == (SMS,)
    assert bwd_grid(128, 1000, causal=True) == (key_blocks(128, 1000),)
    assert bwd_grid(256, 1000) == (key_blocks(256, 1000),)
    bwd_knob("0")
    assert bwd_grid(64, 1000) == (key_blocks(64, 1000),)
