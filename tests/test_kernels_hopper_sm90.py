"""Every configuration the dispatcher can send to the Gluon (Hopper) kernels compiles for sm_90 on this
machine, GPU or not, with wgmma and TMA, and without spilling registers: dense and causal, and the options
(sliding windows with both bounds or the left one only, softcap, ALiBi with (H,) and (B, H) slopes, and
their combinations)."""

from __future__ import annotations

import pytest

from flashtile.kernels.hopper.sm90_compile import compile_all_in_subprocess, fwd_configurations

FWD_CASES = fwd_configurations()
# The largest shared-memory allocation of a block on sm_90 (227 KB).
SHARED_LIMIT = 232448


@pytest.fixture(scope="module")
def fwd_reports() -> dict:
    """Every forward compile, each in a child of one clean process (a compiler abort fails only its case)."""
    return compile_all_in_subprocess("fwd")


@pytest.mark.parametrize("case", FWD_CASES, ids=[f"d{d}-{variant}-{t}" for d, variant, t in FWD_CASES])
def test_gluon_fwd_compiles_for_sm90(fwd_reports, case):
    report = fwd_reports[case]
    if isinstance(report, Exception):
        raise report
    assert report.has_wgmma, f"{case}: no wgmma in the PTX"
    assert report.has_fp8_wgmma == (case[2] == "fp8e4nv"), f"{case}: float8 wgmma {report.has_fp8_wgmma}"
    assert report.has_tma, f"{case}: no TMA bulk tensor copies in the PTX"
    # A learnable sink adds its terms to the epilogue only: the allowances below are its variant's without it.
    variant = "+".join(word for word in case[1].split("+") if word != "sink")
    assert report.local_bytes == 0, f"{case}: {report.local_bytes} B of local memory (spills)"
    # The varlen kernel at D = 256 with every option holds four per-sequence values (the lengths and the
    # window's diagonals, loaded rather than kernel parameters) beside the dense kernel's: ptxas parks three
    # thread-index offsets in a 16-byte stack frame, read back once per masked/unmasked phase change (4
    # LDLs per program, none inside a tile loop; docs/design/hopper.md, "Variable length").
    stack_allowed = 16 if case[0] == 256 and variant == "varlen+window+softcap+alibi" else 0
    # Local loads and stores inside a key loop (CompileReport.loop_spills): none, but where recorded below.
    loop_spills_allowed = 0
    # A block mask's mask_mod or its bits (ids, bounds and pointers beside the dense kernel's): ptxas parks a
    # few scalars in a 16–32-byte frame at D = 128 and 256 (none at D = 64), 16 accesses inside the loops.
    if variant in ("mod", "bits"):
        stack_allowed, loop_spills_allowed = 32, 16
    # Dropout's draws (hopper/dropout.py: four Philox calls a thread a tile, two points each; at D = 256 the
    # asm computes the round keys itself) beside S in flight: no spill alone; with every option as well at
    # D = 256, an 8-byte frame read outside the loops (16 bytes and 20 accesses inside them with the key
    # schedule's 20 registers, before the seventeenth session's 8-bit draws).
    if "dropout" in variant:
        stack_allowed, loop_spills_allowed = 0, 0
        if variant == "window+softcap+alibi+dropout":
            stack_allowed = 8
    # The persistent grid (plain attention and causal at D = 64 and 128) keeps values hoisted out of its
    # work-tile loop: ptxas parks a few in an 8–16-byte frame, read back once a work tile; no spill inside a
    # key loop.
    if variant in ("full", "causal", "full+three", "causal+three", "causal+short") and case[0] <= 128:
        stack_allowed = 16
    # D = 256 on the persistent grid (its output staged in the one Q buffer): 16 bytes without a mask, 48
    # causal (the causal mask's key offsets held across tiles, LOCAL_OFFSETS, and the paired row blocks),
    # stored once a program and read once a work tile, outside the key loops.
    if variant in ("full", "causal") and case[0] == 256:
        stack_allowed = 16 if variant == "full" else 48
    # Softcap, ALiBi and dropout on the persistent grid (dense, not float8; dropout not at D = 256): values
    # hoisted out of the work-tile loop in an 8–32-byte frame, read back once a work tile, none inside a
    # key loop.
    words = set(variant.split("+"))
    options = words & {"softcap", "alibi", "alibi2d", "dropout"}
    persistent_options = options and not words & {"varlen", "sparse"}
    if persistent_options and case[2] != "fp8e4nv" and not (case[0] == 256 and "dropout" in words):
        stack_allowed = max(stack_allowed, 32)
    # At D = 256 causal the sink's terms beside the held key offsets take 8 bytes more (outside the loops).
    if "sink" in case[1].split("+") and case[0] == 256:
        stack_allowed += 8
    assert report.stack_bytes <= stack_allowed, f"{case}: {report.stack_bytes} B of stack (spilled registers)"
    assert report.loop_spills <= loop_spills_allowed, f"{case}: {report.loop_spills} local accesses in a loop"
    assert report.shared_bytes <= SHARED_LIMIT, f"{case}: {report.shared_bytes} B of shared memory"
    # Two consumers at D = 64 release K/V slots thread by thread; three consumers and the other head dims
    # keep the one-thread arrive (fwd._release, the rule in attn_fwd_kernel).
    per_thread = case[0] == 64 and "three" not in variant.split("+")
    assert report.thread_arrives == per_thread, f"{case}: per-thread slot releases {report.thread_arrives}"


def test_option_variants_are_covered():
    # Each option word reaches at least one compiled case per head dim.
    variants = {variant for _, variant, _ in FWD_CASES}
    words = {word for variant in variants for word in variant.split("+")}
    expected = {"full", "causal", "window", "left", "softcap", "alibi", "alibi2d", "varlen", "sparse", "sink"}
    assert words >= expected
