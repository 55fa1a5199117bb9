"""The Hopper TMA decode kernel (kernels/hopper/decode.py) compiles for sm_90 on this machine, GPU or not,
in every configuration its launcher picks: contiguous and paged caches (pages smaller than, equal to and
larger than a key tile), the options, 16 to 64 packed rows, D = 64, 128 and 256, fp16 and bf16; with TMA
copies, without spilling, and with two programs' shared memory fitting one SM."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashtile.kernels import configs
from flashtile.kernels.hopper import decode
from flashtile.kernels.hopper.sm90_compile import (
    DECODE_WORDS,
    compile_all_in_subprocess,
    decode_configurations,
)

CASES = decode_configurations()


@pytest.fixture(scope="module")
def decode_reports() -> dict:
    """Every decode compile, each in a child of one clean process (a compiler abort fails only its case)."""
    return compile_all_in_subprocess("decode")


@pytest.mark.parametrize("case", CASES, ids=[f"d{d}-{variant}-{t}" for d, variant, t in CASES])
def test_tma_decode_compiles_for_sm90(decode_reports, case):
    report = decode_reports[case]
    if isinstance(report, Exception):
        raise report
    assert report.has_tma, f"{case}: no TMA bulk tensor copies in the PTX"
    # 64 packed rows of a paged cache with a window hold 255 registers: ptxas parks 8 bytes outside the key
    # loops (none inside them).
    stack_allowed = 8 if case[1] == "paged64+window+m64" else 0
    assert report.local_bytes == 0 and report.stack_bytes <= stack_allowed, f"{case}: spills ({report})"
    assert report.loop_spills == 0, f"{case}: {report.loop_spills} local accesses in a key loop"
    # Two programs an SM: the split heuristic counts on it (hopper.decode.programs_per_sm); the deeper ring
    # of one program an SM would fit two as well.
    cfg = configs.decode_tma_config(case[0])
    if "deep" in case[1]:
        cfg = dataclasses.replace(cfg, num_stages=decode.ONE_A_SM_STAGES)
    # 48 programs a split (batch 6, GQA 4) at a 4k cache: one an SM would fill only 96 of 132 SMs.
    assert decode.programs_per_sm(case[0], cfg, 4096, 48, 132) == 2
    assert decode.programs_per_sm(case[0], cfg, decode.LONG_CACHE_KEYS, 8, 132) == 1
    assert 2 * report.shared_bytes <= configs.HOPPER_SHARED_BYTES, f"{case}: {report.shared_bytes} B"
    assert report.shared_bytes <= decode.shared_bytes(case[0], cfg.BLOCK_N, cfg.num_stages)


def test_the_ring_deepens_at_d128_for_one_program_an_sm_on_fast_memory_or_two_waves():
    cfg = configs.decode_tma_config(128)
    h100, h200 = 3.35e12, 4.8e12
    assert cfg.num_stages == 2
    assert decode.ring_stages(128, cfg, 1, h200) == decode.ONE_A_SM_STAGES == 3
    assert decode.ring_stages(128, cfg, 2, h200) == 2
    assert decode.ring_stages(128, cfg, 1, h100) == 2
    # One to two waves of two programs an SM take the deeper ring on either GPU; one wave or four do not.
    assert decode.ring_stages(128, cfg, 2, h100, programs=512, sms=132) == 3
    assert decode.ring_stages(128, cfg, 2, h100, programs=256, sms=132) == 2
    assert decode.ring_stages(128, cfg, 2, h100, programs=1024, sms=132) == 2
    assert decode.ring_stages(128, cfg, 1, h100, programs=128, sms=132) == 2
    for head_dim in (64, 256):
        narrow = configs.decode_tma_config(head_dim)
        assert decode.ring_stages(head_dim, narrow, 1, h200) == narrow.num_stages


def test_peak_memory_bandwidth_off_cuda_is_zero():
    assert configs.peak_memory_bandwidth(torch.device("cpu")) == 0.0


def test_every_decode_word_is_compiled():
    words = {word for _, variant, _ in CASES for word in variant.split("+")}
    assert words == set(DECODE_WORDS) - {"m16"}, "each word reaches a compiled case (m16 is the default)"


def test_one_program_an_sm_where_it_fills_the_sms():
    cfg = configs.decode_tma_config(128)
    # GQA 8 at batch 1 (4 programs a split): 33 splits fill 132 SMs once, 66 twice; 16k keys give the 33
    # splits 496 keys each, 4k only 124.
    assert decode.programs_per_sm(128, cfg, 16384, 4, 132) == 1
    assert decode.programs_per_sm(128, cfg, 4096, 4, 132) == 2
    # GQA 1 (32 programs) and GQA 4 (8): one an SM fills 128 of 132 SMs (≥ ONE_A_SM_FILL): one.
    assert decode.programs_per_sm(128, cfg, 16384, 32, 132) == 1
    assert decode.programs_per_sm(128, cfg, 4096, 8, 132) == 1
    # Pages smaller than a tile keep two an SM there; an exact fill still takes one.
    assert decode.programs_per_sm(128, cfg, 16384, 8, 132, small_pages=True) == 2
    assert decode.programs_per_sm(128, cfg, 16384, 4, 132, small_pages=True) == 1
    # 48 programs (batch 6, GQA 4): one an SM fills 96: two. 80 (one wave of one an SM, not split): two.
    assert decode.programs_per_sm(128, cfg, 16384, 48, 132) == 2
    assert decode.programs_per_sm(128, cfg, 16384, 80, 132) == 2
    # Long caches: one an SM whatever the fill.
    assert decode.programs_per_sm(128, cfg, 131072, 32, 132) == 1
