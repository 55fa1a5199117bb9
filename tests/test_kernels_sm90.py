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
