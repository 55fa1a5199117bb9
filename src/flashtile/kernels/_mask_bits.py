"""When the Gluon kernels read a block mask's bits in place of its ``mask_mod``.

``create_block_mask`` evaluates the ``mask_mod`` over every (query, key) pair anyway; it keeps the pairs of
the partial tiles, one bit each (:class:`flashtile.block_mask.MaskBits`). The Hopper kernels then read those
bits in the partial tiles (``MASK_BITS``): one compiled kernel serves every mask, so a call with a new mask
compiles nothing (docs/design/block_sparse.md, "Mask bits"). The portable kernels compile the mask_mod.
"""

from __future__ import annotations

from flashtile._environ import Knob

# FLASHTILE_MASK_BITS=0: the Hopper kernels compile and run a block mask's mask_mod instead.
ENV_VAR = "FLASHTILE_MASK_BITS"
_KNOB = Knob(ENV_VAR)


def reads_bits(mods) -> bool:
    """Whether the Hopper kernels read the bits of ``mods.block_mask``: the mask has them, the call gives no
    mask_mod of its own (or the mask's), its aux tensors are those the bits came from, unmodified, and
    ``FLASHTILE_MASK_BITS`` is not 0 (read per call)."""
    if mods is None or _KNOB.get("").strip() == "0":
        return False
    bm = mods.block_mask
    if bm is None or bm.bits is None or mods.mask_mod not in (None, bm.mask_mod):
        return False
    return bm.bits.matches(mods.aux_tensors)
