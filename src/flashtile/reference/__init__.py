"""The pure-PyTorch reference: the oracle of every test and the CPU backend.

``naive`` materialises S and P and defines every option of ``flash_attn_func``; ``tiled`` is the
FlashAttention algorithm itself (online softmax forward, recomputing backward) in O(N) memory;
``dropout`` draws dropout's keep mask bitwise as the kernels do; ``compare`` holds the accuracy rule.
Nothing here imports the kernels: the oracle stays independent of what it checks.
"""

from flashtile.reference import compare, dropout, naive, tiled

__all__ = ["compare", "dropout", "naive", "tiled"]
