"""The Hopper (Gluon) backward compiles for sm_90 on this machine, GPU or not, in every variant its
launcher can pick, using wgmma, TMA loads and (unless deterministic) the TMA reduce-add, without spills,
within the 227 KB of shared memory a block may use."""

from __future__ import annotations

import pytest

from flashtile.kernels.hopper import bwd
from flashtile.kernels.hopper.bwd_compile import finish_compile, start_compile

MAX_SHARED_BYTES = 232448
# Every variant with and without the causal mask; the deterministic pair (fused kernel without dQ, and the
# dQ kernel) per head dim with its default variant. Two subprocesses share the jobs (one a core).
MASKS = (False, True)
JOBS = [(d, name, causal, False) for d, table in bwd.VARIANTS.items() for name in table for causal in MASKS]
JOBS += [(d, bwd.DEFAULT_VARIANT[d], causal, True) for d in bwd.VARIANTS for causal in MASKS]
# The persistent grid (FLASHTILE_HOPPER_BWD_PERSISTENT=1): plain non-causal calls of the "keys" split.
JOBS += [
    (d, bwd.PLAIN_VARIANT.get(d, bwd.DEFAULT_VARIANT[d]), "persistent", det)
    for d in (64, 128)
    for det in MASKS
]
# Local loads and stores (spilled registers) the fused kernel's key loops may hold
# (CompileReport.loop_spills), as ptxas lays them out today: none but where recorded (docs/design/
# hopper_bwd.md: the "dim" split without a mask, "Where the D = 256 kernel spills"; causal 128-query
# blocks and causal D = 128, "Key-loop spills of the keys split"). A configuration that spills more fails.
LOOP_SPILLS_ALLOWED = {
    (64, "m128", True, False): 16,
    (128, "m64", True, False): 2,
    (256, "n64", False, False): 37,
    (256, "n64", False, True): 8,
    # Scalars of the persistent grid's block loop reloaded in the query-block loops (sm_90 compile).
    (128, "m64", "persistent", False): 7,
}


def _compile_failures(jobs, loop_spills_allowed=None) -> tuple[dict, list[str]]:
    """Compile ``jobs`` in two subprocesses (one a core); the reports, and every failed check: wgmma and TMA
    in the PTX, no local memory (spills), shared memory within a block's limit, and the TMA reduce-add in
    the fused kernel exactly when it adds dQ (not deterministic). ptxas's stack frame is in each message."""
    # Without a table (the option jobs) the key loops' spills are reported by the compile tool only.
    check_loops = loop_spills_allowed is not None
    procs = [start_compile(jobs[i::2]) for i in range(2)]
    results = {}
    for proc in procs:
        results.update(finish_compile(proc))
    failures = []
    for (d, name, mask, deterministic), kernels in results.items():
        label = f"D={d} {name} mask={mask} deterministic={deterministic}"
        for report, has_reduce in kernels:
            fused = report.kernel == "attn_bwd_kernel"
            checks = {
                "no wgmma in the PTX": report.has_wgmma,
                "no TMA bulk tensor copies in the PTX": report.has_tma,
                f"{report.local_bytes} B of local memory (spills)": report.local_bytes == 0,
                f"{report.loop_spills} local accesses in a key loop": not (fused and check_loops)
                or report.loop_spills <= loop_spills_allowed.get((d, name, mask, deterministic), 0),
                f"{report.shared_bytes} B of shared memory": report.shared_bytes <= MAX_SHARED_BYTES,
                f"TMA reduce-add {has_reduce}": has_reduce == (fused and not deterministic),
                # The "keys" split at D = 128 releases Q/dO slots thread by thread; elsewhere the
                # one-thread arrive (hopper.fwd._release, the rule in attn_bwd_kernel).
                f"per-thread slot releases {report.thread_arrives}": report.thread_arrives
                == (fused and d == 128 and bwd.VARIANTS[d][name].split == "keys"),
            }
            failures += [
                f"{label} {report.kernel} (stack {report.stack_bytes} B): {what}"
                for what, ok in checks.items()
                if not ok
            ]
    return results, failures


def test_hopper_bwd_every_variant_compiles_for_sm90():
    results, failures = _compile_failures(JOBS, LOOP_SPILLS_ALLOWED)
    assert sorted(results, key=str) == sorted(JOBS, key=str)
    assert not failures, "\n".join(failures)


# Windows, softcap and ALiBi: in the "keys" split (head dims 64 and 128, every variant), not deterministic.
OPTION_JOBS = [
    (d, name, mask, False)
    for d in (64, 128)
    for name in bwd.VARIANTS[d]
    for mask in ("causal+softcap", "local+softcap+alibi", "alibi", "causal+alibi")
]
# Packed (varlen) batches: the "keys" split's default variants, plain, causal and with every option.
OPTION_JOBS += [
    (d, bwd.DEFAULT_VARIANT[d], mask, False)
    for d in (64, 128)
    for mask in ("varlen", "causal+varlen", "local+softcap+alibi+varlen")
]
# The packed jobs above store dK/dV by TMA boxes inside a sequence (the default: its shared staging tile
# within the block's limit); FLASHTILE_HOPPER_BWD_VARLEN_TMA_STORE=0's pointer stores for every block.
OPTION_JOBS += [(d, bwd.DEFAULT_VARIANT[d], "causal+varlen+rowstores", False) for d in (64, 128)]
# Block masks (the listed query blocks of each key block): the "keys" split's default variants.
OPTION_JOBS += [
    (d, bwd.DEFAULT_VARIANT[d], mask, False)
    for d in (64, 128)
    for mask in ("sparse", "causal+sparse", "mod", "bits")
]
# Dropout (the forward's mask regenerated in Sᵀ's layout): alone, causal, with the options and packed.
OPTION_JOBS += [
    (d, bwd.DEFAULT_VARIANT[d], mask, False)
    for d in (64, 128)
    for mask in ("dropout", "causal+dropout", "local+softcap+alibi+dropout", "causal+varlen+dropout")
]
# A learnable sink's gradient (its share from dS): alone, causal, beside a window, ALiBi and dropout,
# packed, and with a block mask at D = 64 (the "m64" variant of the option calls; the plain ones' "m128"
# alone and causal); at D = 128 the same but the block mask, which it declines.
SINK_MASKS = ("sink", "causal+sink", "local+alibi+dropout+sink", "causal+varlen+sink", "causal+sparse+sink")
OPTION_JOBS += [(64, "m64", mask, False) for mask in SINK_MASKS]
OPTION_JOBS += [(64, "m128", mask, False) for mask in ("sink", "causal+sink")]
OPTION_JOBS += [(128, "m64", mask, False) for mask in SINK_MASKS if "sparse" not in mask]


def test_hopper_bwd_options_compile_for_sm90_without_local_memory():
    """Each option variant (and packed batches) compiles with wgmma, TMA and the reduce-add, within shared
    memory, and without local memory; ptxas's stack frame (spilled registers) is reported in the failure
    message only."""
    results, failures = _compile_failures(OPTION_JOBS)
    assert len(results) == len(OPTION_JOBS)
    assert not failures, "\n".join(failures)


# FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER=1: the producer warp's dQ reduces where only the knob gives them
# (dropout, block masks; the other options take them by default, OPTION_JOBS), and the key-loop spills
# they hold at D = 128 (sm_90, forty-eighth session; docs/design/hopper_bwd.md, "dQ reduces issued by the
# producer warp").
PRODUCER_JOBS = [
    (64, "m64", "local+softcap+alibi+dropout", False),
    (128, "m64", "causal+varlen+dropout", False),
    (64, bwd.DEFAULT_VARIANT[64], "causal+sparse", False),
    (128, bwd.DEFAULT_VARIANT[128], "mod", False),
]
PRODUCER_LOOP_SPILLS_ALLOWED = {
    (128, "m64", "causal+varlen+dropout", False): 48,
    (128, bwd.DEFAULT_VARIANT[128], "mod", False): 1,
}


def test_the_producers_dq_reduces_under_the_knob_compile_for_sm90(monkeypatch):
    # The compiling subprocesses inherit the knob (bwd_compile picks DQ_BY_PRODUCER as the launcher does).
    monkeypatch.setenv(bwd.DQ_BY_PRODUCER_ENV, "1")
    for _, _, mask, _ in PRODUCER_JOBS:
        words = set(mask.split("+"))
        dropout, block_mask = "dropout" in words, bool(words & {"sparse", "mod"})
        assert bwd.dq_by_producer(False, dropout, block_mask)
        monkeypatch.setenv(bwd.DQ_BY_PRODUCER_ENV, "")
        assert not bwd.dq_by_producer(False, dropout, block_mask)
        monkeypatch.setenv(bwd.DQ_BY_PRODUCER_ENV, "1")
    results, failures = _compile_failures(PRODUCER_JOBS, PRODUCER_LOOP_SPILLS_ALLOWED)
    assert len(results) == len(PRODUCER_JOBS)
    assert not failures, "\n".join(failures)


# Where only FLASHTILE_HOPPER_BWD_DK_LAST=1 issues dK's wgmmas after dQ's: the D = 64 / causal D = 128
# "keys" split (neither spills with it).
DK_LAST_JOBS = [
    (64, bwd.DEFAULT_VARIANT[64], True, False),
    (128, bwd.DEFAULT_VARIANT[128], True, False),
]


def test_dk_after_dq_under_the_knob_compiles_for_sm90(monkeypatch):
    # The compiling subprocesses inherit the knob (bwd_compile picks DK_LAST as the launcher does).
    monkeypatch.setenv(bwd.DK_LAST_ENV, "1")
    results, failures = _compile_failures(DK_LAST_JOBS, {})
    assert len(results) == len(DK_LAST_JOBS)
    assert not failures, "\n".join(failures)


def test_every_head_dim_has_a_default_variant():
    assert set(bwd.DEFAULT_VARIANT) == set(bwd.VARIANTS)
    for d, name in bwd.DEFAULT_VARIANT.items():
        assert name in bwd.VARIANTS[d]
    assert set(bwd.PADDED_HEAD_DIM.values()) <= set(bwd.VARIANTS)


def test_variant_env_picks_a_variant_where_the_head_dim_has_it(monkeypatch):
    monkeypatch.delenv(bwd.VARIANT_ENV, raising=False)
    assert bwd.select_variant(64) == ("m64", bwd.VARIANTS[64]["m64"])
    monkeypatch.setenv(bwd.VARIANT_ENV, "m128")
    assert bwd.select_variant(64) == ("m128", bwd.VARIANTS[64]["m128"])
    assert bwd.select_variant(128)[0] == bwd.DEFAULT_VARIANT[128]
    assert bwd.select_variant(256)[0] == bwd.DEFAULT_VARIANT[256]


def test_plain_calls_take_their_own_variant_where_a_head_dim_has_one(monkeypatch):
    monkeypatch.delenv(bwd.VARIANT_ENV, raising=False)
    assert bwd.select_variant(64, plain=True)[0] == "m128"
    assert bwd.select_variant(128, plain=True)[0] == bwd.DEFAULT_VARIANT[128]
    assert bwd.select_variant(256, plain=True)[0] == bwd.DEFAULT_VARIANT[256]
    # The knob still decides.
    monkeypatch.setenv(bwd.VARIANT_ENV, "m64")
    assert bwd.select_variant(64, plain=True)[0] == "m64"


def test_which_calls_are_plain():
    plain = {"window_size": (-1, -1), "softcap": 0.0, "alibi_slopes": None, "dropout_p": 0.0}
    assert bwd.is_plain_call(**plain)
    # Causal is plain, and so (not arguments here) are deterministic=True and a learnable sink.
    assert bwd.is_plain_call(**{**plain, "window_size": (-1, 0)})
    for option in (
        {"window_size": (8, 0)}, {"window_size": (-1, 3)}, {"softcap": 30.0}, {"alibi_slopes": object()},
        {"dropout_p": 0.1}, {"packed": object()}, {"mods": object()},
    ):  # fmt: skip
        assert not bwd.is_plain_call(**{**plain, **option}), option


def test_variant_env_rejects_an_unknown_name(monkeypatch):
    monkeypatch.setenv(bwd.VARIANT_ENV, "m512")
    with pytest.raises(ValueError, match=r"FLASHTILE_HOPPER_BWD_VARIANT='m512'.*accepted: \['m128'"):
        bwd.select_variant(64)
