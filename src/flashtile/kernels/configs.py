"""Every block size, warp count and pipeline depth the launchers can pick, in one place.

Hopper (sm_90) values come from the measurements in docs/design/kernels.md and
benchmarks/results/; other GPUs get smaller tiles that fit ~100 KB of shared memory; the CPU
interpreter gets small tiles so that odd sequence lengths cross several blocks in the tests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from flashtile._environ import Knob


@dataclass(frozen=True)
class FwdConfig:
    """Tiling of the forward kernel: BLOCK_M query rows per program, BLOCK_N keys per step."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class BwdConfig:
    """Tiling of the backward: the dK/dV kernel owns BLOCK_N1 keys and streams BLOCK_M1 queries
    (num_warps1, num_stages1); the dQ kernel owns BLOCK_M2 queries and streams BLOCK_N2 keys."""

    BLOCK_M1: int
    BLOCK_N1: int
    num_warps1: int
    num_stages1: int
    BLOCK_M2: int
    BLOCK_N2: int
    num_warps2: int
    num_stages2: int


_INTERPRET = Knob("TRITON_INTERPRET")


def is_interpreter() -> bool:
    return _INTERPRET.get() == "1"


def block_d(head_dim: int) -> int:
    """The register tile width for a head dim: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, 1 << (head_dim - 1).bit_length())


# Looked up once per device: querying the capability costs microseconds on every launch otherwise.
@functools.cache
def _is_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def fwd_config(
    head_dim: int,
    device: torch.device,
    head_dim_v: int | None = None,
    dropout: bool = False,
    fp8: bool = False,
) -> FwdConfig:
    """The forward's tiling for Q/K head dim ``head_dim`` and V head dim ``head_dim_v`` (default the same);
    ``dropout``: the kernel draws a dropout mask (its draws change layout through shared memory); ``fp8``:
    float8 inputs (flashtile.fp8), whose tiles take half the shared memory."""
    bd = block_d(head_dim)
    bdv = bd if head_dim_v is None else block_d(head_dim_v)
    if is_interpreter() or device.type != "cuda":
        return FwdConfig(32, 32, 4, 1)
    if fp8:
        # H200, scripts/fp8_configs.py (docs/design/fp8.md): the fastest of 5-6 tilings a head dim over
        # N = 4k and 16k, causal and not (measured on Hopper only; Ada takes the same).
        if bd <= 64:
            return FwdConfig(128, 128, 4, 3)
        return FwdConfig(64, 128, 4, 3) if bd <= 128 else FwdConfig(64, 64, 4, 3)
    if max(bd, bdv) > 256:
        return _wide_fwd_config(bd, _is_hopper(device))
    if _is_hopper(device):
        if bd <= 64:
            return FwdConfig(128, 128, 4, 3)
        if bd <= 128:
            # The dropout mask's layout change (through shared memory) would pass 227 KB with 3 stages.
            return FwdConfig(128, 128, 8, 2 if dropout else 3)
        return FwdConfig(128, 64, 8, 2)
    if bd <= 64:
        return FwdConfig(128, 64, 4, 3)
    if bd <= 128:
        return FwdConfig(128, 32, 4, 2)
    return FwdConfig(64, 32, 4, 2)


def bwd_config(head_dim: int, causal: bool, device: torch.device, head_dim_v: int | None = None) -> BwdConfig:
    """The backward's tiling for Q/K head dim ``head_dim``, V head dim ``head_dim_v`` (default the same)."""
    bd = block_d(head_dim)
    bdv = bd if head_dim_v is None else block_d(head_dim_v)
    if is_interpreter() or device.type != "cuda":
        return BwdConfig(32, 32, 4, 1, 32, 32, 4, 1)
    if max(bd, bdv) > 256:
        return _WIDE_BWD_CONFIG
    if _is_hopper(device):
        # Head dims 64 and 256: benchmarks/results/kernel_sweep_d{64,256}*_h100_2026-11-23.csv.
        if bd <= 64 and causal:
            return BwdConfig(64, 128, 4, 3, 128, 64, 4, 3)
        if bd <= 64:
            return BwdConfig(32, 128, 4, 3, 128, 32, 4, 3)
        if bd <= 128:
            return BwdConfig(64, 128, 8, 3, 128, 64, 8, 3)
        return BwdConfig(64, 64, 8, 2, 64, 32, 4, 3)
    if bd <= 64:
        return BwdConfig(32, 64, 4, 2, 64, 32, 4, 2)
    return BwdConfig(16, 64, 4, 2, 64, 16, 4, 2)


def _wide_fwd_config(bd: int, hopper: bool) -> FwdConfig:
    """Head dims past 256 (Q/K up to 576 in a 1024-wide tile, V up to 512): the Q tile and the fp32
    output accumulator dominate, so few query rows and narrow K/V steps keep shared memory under sm_90's
    227 KB (docs/design/kernels.md, "Head dims past 256")."""
    if hopper:
        return FwdConfig(64, 32, 8, 2) if bd <= 512 else FwdConfig(64, 16, 8, 1)
    return FwdConfig(32, 16, 4, 1)


# Head dims past 256: the dK/dV program holds K, V and their fp32 gradients for its keys, the dQ program Q,
# dO and dQ for its queries, so both own 16 rows. On sm_90 every config tried still spills at D = 512
# (docs/design/kernels.md, "Head dims past 256"); this one spills least.
_WIDE_BWD_CONFIG = BwdConfig(16, 16, 4, 1, 16, 16, 4, 1)


@dataclass(frozen=True)
class HopperFwdConfig:
    """Tiling of the Gluon forward (kernels/hopper/fwd.py): 128 query rows per program (two 64-row consumer
    warpgroups), BLOCK_N keys per K/V tile, a ring of STAGES K/V tiles in shared memory."""

    BLOCK_N: int
    STAGES: int


# Head dims the Gluon forward is compiled for; others take the portable kernels.
HOPPER_FWD_HEAD_DIMS = (64, 128, 256)


# The plain causal forward at D = 64 takes 64-key tiles up to this many rows (query and key): each
# consumer then steps through its own key tiles and skips the diagonal's wholly masked half tile
# (docs/design/hopper.md, "64-key tiles for short causal rows at D = 64").
SHORT_CAUSAL_MAX_ROWS = 512


def short_causal(head_dim: int, plain: bool, causal: bool, seqlen_q: int, seqlen_k: int) -> bool:
    """Whether a forward call takes :func:`hopper_fwd_config`'s short causal tiling: plain causal at
    D = 64 with N_q and N_k ≤ :data:`SHORT_CAUSAL_MAX_ROWS`."""
    return head_dim == 64 and plain and causal and max(seqlen_q, seqlen_k) <= SHORT_CAUSAL_MAX_ROWS


def hopper_fwd_config(head_dim: int, plain: bool = False, short: bool = False) -> HopperFwdConfig:
    """``plain``: dense or causal attention without an option, window, varlen batch, block mask, float8 or
    sink (:func:`flashtile.kernels.hopper.fwd.plain_call`); ``short``: :func:`short_causal`."""
    # D = 256: a 64×256 fp32 accumulator is 128 registers a thread, so S stays 64 keys wide. D = 64 plain
    # calls: a 3-deep K/V ring, 1.7-4 % faster than 2 at N = 1k-4k causal on an H200 and within 1 %
    # elsewhere (docs/design/hopper.md, "A 3-deep ring at D = 64"); calls with options keep 2 (not timed).
    # Short causal D = 64: 64-key tiles, 2-3 % less kernel time at N = 512 on an H200, 5-10 % more at 1k-4k.
    stages = 3 if head_dim == 64 and plain else 2
    return HopperFwdConfig(BLOCK_N=64 if head_dim > 128 or (short and head_dim == 64) else 128, STAGES=stages)


@dataclass(frozen=True)
class RowsConfig:
    """Tiling of the row kernels (rotary, KV-cache append): BLOCK_M rows of one head per program."""

    BLOCK_M: int
    num_warps: int


def rows_config(head_dim: int, device: torch.device) -> RowsConfig:
    if is_interpreter() or device.type != "cuda":
        return RowsConfig(8, 1)
    # Memory-bound copies: 16-byte accesses over a row of D, enough rows in flight to cover latency.
    return RowsConfig(16 if block_d(head_dim) <= 128 else 8, 4)


@dataclass(frozen=True)
class DecodeConfig:
    """Tiling of the split-KV decode kernel: up to MAX_BLOCK_M packed query rows (GQA group × query tokens)
    per program, BLOCK_N cache rows per step."""

    MAX_BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int


# The combine kernel loads a [parts, rows, D] tile of partial outputs at once; this many elements at most
# (64 fp32 registers a thread at 4 warps).
COMBINE_TILE_ELEMENTS = 8192


def combine_blocks(parts: int, block_d: int, rows: int, sms: int) -> tuple[int, int]:
    """(BLOCK_S, BLOCK_R) of the combine kernel: every part in one load up to 64 parts, then as many rows
    as fit the tile, but no more than spread ``rows`` over every one of ``sms`` SMs. At batch 1, GQA 1 (32
    rows, 8 parts), 8 rows a program made 4 programs and a 5.7 µs combine against cuDNN's 2.0 µs reduction
    (H100, scripts/decode_profile.py; docs/design/decode.md, "Combine")."""
    block_s = min(64, 1 << (max(parts, 1) - 1).bit_length())
    fit = max(1, COMBINE_TILE_ELEMENTS // (block_s * block_d))
    spread = 1 << (max(-(-rows // max(sms, 1)), 1) - 1).bit_length()
    return block_s, min(fit, spread)


# Shared memory a Hopper SM gives its programs (227 KB).
HOPPER_SHARED_BYTES = 227 * 1024


def decode_tma_config(head_dim: int) -> DecodeConfig:
    """Tiling of the Hopper TMA decode kernel (kernels/hopper/decode.py; num_stages is its ring's depth):
    two programs an SM fit at every head dim. At D = 128 a ring of 2 tiles was as fast as 3 or faster in
    20 of 23 cells (H100, batch 1-64, contiguous and paged; docs/design/decode.md, "TMA decode"); D = 64
    keeps as many bytes in flight with 3 half-size tiles, D = 256 with 2 tiles of 32 rows."""
    if block_d(head_dim) <= 64:
        return DecodeConfig(64, 64, 4, 3)
    if block_d(head_dim) <= 128:
        return DecodeConfig(64, 64, 4, 2)
    # At D = 256, 64 packed rows would hold a 64 × 256 fp32 accumulator: 32 rows, as the portable kernel.
    return DecodeConfig(32, 32, 4, 2)


def decode_config(head_dim: int, device: torch.device) -> DecodeConfig:
    bd = block_d(head_dim)
    if is_interpreter() or device.type != "cuda":
        return DecodeConfig(16, 16, 4, 1)
    if _is_hopper(device):
        # One program an SM (the split heuristic) needs 3 stages in flight: 2 stages ran 1.2-1.5x slower
        # (H100, docs/test-runs/2026-11-23-h100-decode/check_run2.log).
        if bd <= 128:
            return DecodeConfig(64, 64, 4, 3)
        return DecodeConfig(32, 64, 4, 2)
    if bd <= 128:
        return DecodeConfig(64, 64, 4, 3)
    return DecodeConfig(32, 32, 4, 2)


@functools.cache
def peak_memory_bandwidth(device: torch.device) -> float:
    """Bytes a second a CUDA device's memory moves at its peak: two transfers a memory clock over the bus
    (3.35e12 on an H100 SXM, 4.8e12 on an H200); 0 off CUDA or where torch does not report the clock."""
    if is_interpreter() or device.type != "cuda":
        return 0.0
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8


@functools.cache
def multiprocessor_count(device: torch.device) -> int:
    """SMs of a CUDA device; the interpreter pretends to have four, so that the split heuristic splits the
    small problems of the CPU tests."""
    if is_interpreter() or device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count
