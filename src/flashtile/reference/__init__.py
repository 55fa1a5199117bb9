"""The pure-PyTorch reference: the oracle of every test and the CPU backend.

``naive`` materialises S and P and defines every option of ``flash_attn_func``; ``tiled`` is the
FlashAttention algorithm itself (online softmax forward, recomputing backward) in O(N) memory;
``dropout`` draws dropout's keep mask bitwise as the kernels do; ``compare`` holds the accuracy rule.
Nothing here imports the kernels: the oracle stays independent of what it checks.
"""

from flashtile.reference import compare, dropout, naive, tiled


# The reference backend's entry points (flashtile.backend, the launchers' contract of docs/design/options.md),
# looked up at call time so that tiled stays the one place to replace or patch.
def attn_fwd(*args, **kwargs):
    """:func:`flashtile.reference.tiled.attention_fwd`."""
    return tiled.attention_fwd(*args, **kwargs)


def attn_bwd(*args, deterministic: bool = False, **kwargs):
    """:func:`flashtile.reference.tiled.attention_bwd`; deterministic either way."""
    return tiled.attention_bwd(*args, **kwargs)


__all__ = ["attn_bwd", "attn_fwd", "compare", "dropout", "naive", "tiled"]
