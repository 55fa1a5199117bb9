"""flashtile: exact FlashAttention with flash_attn's API, Triton kernels on CUDA and PyTorch on the CPU."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from flashtile import bert_padding, distributed, masks
from flashtile.block_mask import BlockMask, create_block_mask
from flashtile.fp8 import flash_attn_fp8_func, quantize_fp8
from flashtile.interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from flashtile.kvcache import flash_attn_with_kvcache
from flashtile.modules import FlashAttention
from flashtile.rotary import apply_rotary_emb

try:
    __version__ = version("flashtile")
except PackageNotFoundError:
    __version__ = "0+unknown"

__all__ = [
    "BlockMask",
    "FlashAttention",
    "__version__",
    "apply_rotary_emb",
    "bert_padding",
    "create_block_mask",
    "distributed",
    "flash_attn_fp8_func",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "masks",
    "quantize_fp8",
]
