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


ALL_OPTIONS = ("local", "softcap", "alibi", "dropout", "varlen")
# Each option alone at D = 128, and all of them together at every head dim whose config differs.
OPTION_CASES = [(128, (word,)) for word in ALL_OPTIONS] + [(d, ALL_OPTIONS) for d in (64, 128, 256)]
# Block-sparse (a 128 × 128 block mask with masks.causal in its partial tiles), alone and with a window.
OPTION_CASES += [(128, ("blocksparse",)), (128, ("blocksparse", "local", "varlen"))]


@pytest.mark.parametrize(
    ("head_dim", "options"), OPTION_CASES, ids=[f"d{d}-{'+'.join(o)}" for d, o in OPTION_CASES]
)
@pytest.mark.parametrize("kind", ["fwd", "bwd"])
def test_options_compile_for_sm90_without_spills(kind, head_dim, options):
    for report in compile_in_subprocess(kind, head_dim, False, options=options):
        assert report.has_wgmma and report.has_tma, f"{report.kernel} {options}: no wgmma or no TMA"
        assert report.local_bytes == 0, f"{report.kernel} {options}: {report.local_bytes} B of local memory"
