"""Every configuration the dispatcher can pick on Hopper compiles for sm_90, on this machine, GPU or not,
and the compiled code uses the Hopper instructions we rely on (wgmma, TMA) without spilling registers."""

from __future__ import annotations

import pytest

from flashtile.kernels.sm90_compile import compile_in_subprocess


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_compiles_for_sm90_with_wgmma_and_tma(kind, head_dim, causal):
    for report in compile_in_subprocess(kind, head_dim, causal):
        assert report.has_wgmma, f"{report.kernel}: no wgmma in the PTX (slower MMA path)"
        assert report.has_tma, f"{report.kernel}: no TMA bulk tensor copies in the PTX"
        assert report.local_bytes == 0, f"{report.kernel}: {report.local_bytes} B of local memory (spills)"
        assert report.shared_bytes <= 232448, f"{report.kernel}: {report.shared_bytes} B of shared memory"


ALL_OPTIONS = ("local", "softcap", "alibi", "dropout", "varlen", "sink")
# Each option alone at D = 128, and all of them together at every head dim whose config differs.
OPTION_CASES = [(128, (word,)) for word in ALL_OPTIONS] + [(d, ALL_OPTIONS) for d in (64, 128, 256)]
# Block-sparse (a 128 × 128 block mask with masks.causal in its partial tiles): alone, with a window, with
# a sink.
OPTION_CASES += [
    (128, ("blocksparse",)),
    (128, ("blocksparse", "local", "varlen")),
    (128, ("blocksparse", "sink")),
]


@pytest.mark.parametrize(
    ("head_dim", "options"), OPTION_CASES, ids=[f"d{d}-{'+'.join(o)}" for d, o in OPTION_CASES]
)
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_options_compile_for_sm90_without_spills(kind, head_dim, options):
    for report in compile_in_subprocess(kind, head_dim, False, options=options):
        assert report.has_wgmma and report.has_tma, f"{report.kernel} {options}: no wgmma or no TMA"
        assert report.local_bytes == 0, f"{report.kernel} {options}: {report.local_bytes} B of local memory"
        assert report.shared_bytes <= 232448, f"{report.kernel} {options}: {report.shared_bytes} B of shared"


# The float8 forward (flashtile.fp8): e4m3 q, k, v, a bf16 output, with the options it takes.
FP8_CASES = [
    (64, False, ()),
    (128, False, ()),
    (128, True, ("softcap",)),
    (128, True, ("local",)),
    (256, True, ()),
]


@pytest.mark.parametrize(
    ("head_dim", "causal", "options"),
    FP8_CASES,
    ids=[f"d{d}-{'causal' if c else 'full'}{''.join('-' + o for o in opts)}" for d, c, opts in FP8_CASES],
)
def test_fp8_forward_compiles_for_sm90_with_e4m3_wgmma(head_dim, causal, options):
    for report in compile_in_subprocess("fwd", head_dim, causal, dtype="fp8e4nv", options=("fp8", *options)):
        assert report.has_fp8_wgmma, f"{report.kernel}: no e4m3 wgmma in the PTX"
        assert report.has_tma, f"{report.kernel}: no TMA bulk tensor copies in the PTX"
        assert report.local_bytes == 0, f"{report.kernel}: {report.local_bytes} B of local memory (spills)"
        assert report.shared_bytes <= 232448, f"{report.kernel}: {report.shared_bytes} B of shared memory"


# Q/K head dim past 256 or V's different: every config compiles, with TMA and within shared memory; the
# forward up to 512 without spills. The 576 forward and the wide backward spill (docs/design/kernels.md,
# "Head dims past 256"), which the stack size reported here tracks.
WIDE_CASES = [("fwd", 192, 128), ("fwd", 512, 512), ("fwd", 576, 512), ("bwd", 192, 128), ("bwd", 512, 512)]


@pytest.mark.parametrize(
    ("kind", "head_dim", "head_dim_v"), WIDE_CASES, ids=[f"{k}-{d}-{v}" for k, d, v in WIDE_CASES]
)
def test_wide_and_unequal_head_dims_compile_for_sm90(kind, head_dim, head_dim_v):
    for report in compile_in_subprocess(kind, head_dim, True, options=("sink",), head_dim_v=head_dim_v):
        assert report.has_tma, f"{report.kernel}: no TMA bulk tensor copies in the PTX"
        assert report.local_bytes == 0, f"{report.kernel}: {report.local_bytes} B of local memory"
        assert report.shared_bytes <= 232448, f"{report.kernel}: {report.shared_bytes} B of shared memory"
        if kind == "fwd" and head_dim <= 512:
            assert report.has_wgmma, f"{report.kernel}: no wgmma in the PTX"
            assert report.stack_bytes == 0, f"{report.kernel}: {report.stack_bytes} B of spills"
