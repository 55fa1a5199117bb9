"""Validation's verdicts on plain calls, remembered: a shortcut through the eager host path.

A plain call is ``flash_attn_func``'s q, k, v as plain 4-D tensors with unit last strides, ALiBi slopes
(if any) a contiguous float32 tensor, a learnable sink (if any) a strided tensor, and no packed batch, block
mask, mask or score mod or attention probabilities. Validating it reads only the tensors' shapes, strides,
dtypes and devices, the option values (dropout's probability among them; its random state is drawn at each
call) and the backend's environment variables. So once one such call has passed validation, a later call
with the same key reuses the verdict: the softmax scale, the normalised options, the backend, the (empty)
mods and the backend's prepared call (flashtile.backend.prepare: the kernels' launches with every decision
the key fixes made once, a sink's calls included). Any other call, and any call not seen before, takes the
full path, which raises its errors as before and records the verdict only when it passes.
docs/design/host_path.md, "Plain calls" and "Prepared plain calls", has what this saves.
"""

from __future__ import annotations

import torch

from flashtile._environ import Knob
from flashtile.backend import ENV_VAR as BACKEND_ENV

# Verdicts kept (a training run sees a handful of shapes; the cache is emptied when full).
MAX_VERDICTS = 256
_verdicts: dict[tuple, tuple] = {}

# The environment a verdict depends on: the backend's choice, and the knobs a prepared call
# (flashtile.backend.prepare) fixes when it is made — the Hopper forward's persistent grid, consumer count,
# ping-pong and exponentials' share on the FMA pipes (kernels/hopper/fwd.py's PERSISTENT_ENV,
# CONSUMERS_ENV, PINGPONG_ENV, EXP2_POLY_ENV) and the Hopper backward's variant, grid, dQ reducer and dK
# order (bwd.py's VARIANT_ENV, PERSISTENT_ENV, DQ_BY_PRODUCER_ENV, DK_LAST_ENV).
# tests/test_prepared_calls.py checks the names against those modules.
KNOBS = tuple(
    Knob(name)
    for name in (
        BACKEND_ENV, "TRITON_INTERPRET", "FLASHTILE_HOPPER_FWD_PERSISTENT", "FLASHTILE_HOPPER_FWD_CONSUMERS",
        "FLASHTILE_HOPPER_FWD_PINGPONG", "FLASHTILE_HOPPER_BWD_VARIANT", "FLASHTILE_HOPPER_BWD_PERSISTENT",
        "FLASHTILE_HOPPER_BWD_DQ_BY_PRODUCER", "FLASHTILE_HOPPER_BWD_DK_LAST",
        "FLASHTILE_HOPPER_FWD_EXP2_POLY",
    )
)  # fmt: skip


def _plain_tensor(t: object) -> bool:
    return type(t) is torch.Tensor and t.dim() == 4 and t.stride(-1) == 1


def _slopes_key(slopes: object) -> tuple | bool | None:
    """The key's part for ``alibi_slopes``: None without, its shape and device for a contiguous float32
    tensor (validation hands those on unchanged), False for anything else (the call is not plain)."""
    if slopes is None:
        return None
    if type(slopes) is not torch.Tensor or slopes.layout != torch.strided or slopes.dtype != torch.float32:
        return False
    return (slopes.shape, slopes.device) if slopes.is_contiguous() else False


def _sink_key(sink: object) -> tuple | bool | None:
    """The key's part for ``learnable_sink``: None without, the metadata validation reads for a strided
    tensor (shape, dtype, device; its conversion to the LSE's dtype is redone at each call, as validation
    does it), False for anything else (the call is not plain)."""
    if sink is None:
        return None
    if type(sink) is not torch.Tensor or sink.layout != torch.strided:
        return False
    return (sink.shape, sink.dtype, sink.device)


def key(
    tensors: dict[str, object],
    dropout_p: object,
    softmax_scale: object,
    causal: object,
    window_size: object,
    softcap: object,
    alibi_slopes: object,
    deterministic: object,
    return_attn_probs: object,
    varlen: object,
    mods: dict[str, object] | None,
    learnable_sink: object,
) -> tuple | None:
    """The call's key if it is plain (module docstring), else None. Option values must have the exact
    types validation accepts without conversion (``True == 1`` and ``-1 == -1.0`` would share a key)."""
    if torch.compiler.is_compiling():
        return None
    # Under torch.func the tensors are one sample's views of batched ones: no prepared launches for them.
    if torch._C._are_functorch_transforms_active():
        return None
    if varlen is not None:
        return None
    sink = _sink_key(learnable_sink)
    if sink is False:
        return None
    if return_attn_probs is not False or (mods and any(value is not None for value in mods.values())):
        return None
    if type(dropout_p) not in (float, int) or type(softcap) not in (float, int):
        return None
    slopes = _slopes_key(alibi_slopes)
    if slopes is False:
        return None
    if type(causal) is not bool or type(deterministic) is not bool:
        return None
    if softmax_scale is not None and type(softmax_scale) not in (float, int):
        return None
    if type(window_size) is not tuple or len(window_size) != 2:
        return None
    if type(window_size[0]) is not int or type(window_size[1]) is not int:
        return None
    q, k, v = tensors.get("q"), tensors.get("k"), tensors.get("v")
    if len(tensors) != 3 or not (_plain_tensor(q) and _plain_tensor(k) and _plain_tensor(v)):
        return None
    return (
        q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape, v.stride(),
        v.dtype, v.device, softmax_scale, causal, window_size, softcap, deterministic, slopes, dropout_p,
        sink, *[knob.get() for knob in KNOBS],
    )  # fmt: skip


def verdict(call_key: tuple) -> tuple | None:
    """What validation returned for a call of this key, or None if none passed yet."""
    return _verdicts.get(call_key)


def remember(call_key: tuple, result: tuple) -> None:
    """Keep validation's ``result`` for calls of ``call_key`` (a plain call that passed it)."""
    if len(_verdicts) >= MAX_VERDICTS:
        _verdicts.clear()
    _verdicts[call_key] = result
