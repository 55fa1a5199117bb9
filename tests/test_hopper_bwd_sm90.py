"""The Hopper (Gluon) backward compiles for sm_90 on this machine, GPU or not, in every configuration its
launcher can pick, using wgmma, TMA loads and (unless deterministic) the TMA reduce-add, without spills."""

from __future__ import annotations

import pytest

from flashtile.kernels.hopper.bwd_compile import compile_in_subprocess


@pytest.mark.parametrize("deterministic", [False, True], ids=["reduce", "deterministic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_hopper_bwd_compiles_for_sm90(head_dim, causal, deterministic):
    for report, has_reduce in compile_in_subprocess(head_dim, causal, deterministic):
        assert report.has_wgmma, f"{report.kernel}: no wgmma in the PTX"
        assert report.has_tma, f"{report.kernel}: no TMA bulk tensor copies in the PTX"
        assert report.local_bytes == 0, f"{report.kernel}: {report.local_bytes} B of local memory (spills)"
        assert report.shared_bytes <= 232448, f"{report.kernel}: {report.shared_bytes} B of shared memory"
        fused = report.kernel == "attn_bwd_kernel"
        assert has_reduce == (fused and not deterministic), f"{report.kernel}: TMA reduce-add {has_reduce}"
