"""Causal attention, top-left aligned: query ``q_idx`` sees keys ``kv_idx ≤ q_idx``."""

import triton
import triton.language as tl  # noqa: F401 (Triton's interpreter needs it in a jit function's module)


@triton.jit
def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx
