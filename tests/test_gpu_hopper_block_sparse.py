"""Block masks in the Hopper (Gluon) kernels on a GPU of compute capability 9.x: the forward walks each query
block's listed key blocks, the backward each key block's listed query blocks. Random tile states (empty,
partial without a mask_mod, full) of 128- and 256-row blocks, odd lengths, causal or not, MHA with a mask
per head and GQA with one mask for every head, and block masks of flashtile.masks' mask_mods (document ids
as aux tensors) and a custom one, read as create_block_mask's bits or compiled into the kernels, against
the float64 oracle (2×/3× rule); a query block with no key block gives out = 0, lse = −inf and no NaN. Each
case also checks which kernels the backend picks.
Skipped elsewhere: Gluon does not run in Triton's interpreter (CPU CI compiles these kernels for sm_90,
tests/test_kernels_hopper_sm90.py and tests/test_hopper_bwd_sm90.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl  # noqa: F401  (a mask_mod's module must import it: flashtile.mods.check_is_jit)

import flashtile
from flashtile import BlockMask, backend, masks
from flashtile.kernels import _mask_bits, hopper
from flashtile.kernels.hopper import bwd as hopper_bwd
from flashtile.mods import Mods
from flashtile.reference import naive
from tests.helpers import HEAD_LAYOUTS, RESULT_NAMES, assert_matches_oracle

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    reason = backend.hopper_unavailable_reason(torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)


def _random_states(batch: int, heads: int, n_q: int, n_k: int, block: tuple[int, int]) -> torch.Tensor:
    """Tile states (0 empty, 1 partial, 2 full) of density about 0.4; query block 0 sees no key block."""
    shape = (batch, heads, -(-n_q // block[0]), -(-n_k // block[1]))
    states = torch.randint(0, 5, shape, device="cuda").clamp(max=2) * (torch.rand(shape, device="cuda") < 0.6)
    states[:, :, 0] = 0
    return states.to(torch.int8)


def _matches_oracle(q, k, v, dout, causal: bool, mods: Mods, label: str, seed: int, sink=None):
    """flash_attn_func with ``mods``' block mask and aux tensors, forward and backward, against the float64
    oracle (2×/3× rule, no NaN); ``sink``: a learnable sink (fp32, requiring grad), its gradient checked
    too. Returns (out, lse)."""
    out, lse, _ = flashtile.flash_attn_func(
        q,
        k,
        v,
        causal=causal,
        block_mask=mods.block_mask,
        aux_tensors=mods.aux_tensors,
        return_attn_probs=True,
        learnable_sink=sink,
    )
    out.backward(dout)
    ours = (out, lse, q.grad, k.grad, v.grad) + (() if sink is None else (sink.grad,))

    def reference(ref_dtype):
        leaves = [t.detach().to(ref_dtype).requires_grad_() for t in (q, k, v)]
        if sink is not None:
            # The float64 oracle's sink in float64, the baseline's in float32 (the kernels' precision).
            sink_dtype = torch.float64 if ref_dtype == torch.float64 else torch.float32
            leaves.append(sink.detach().to(sink_dtype).requires_grad_())
        o, l_ = naive.attention(
            *leaves[:3], softmax_scale=q.shape[-1] ** -0.5, causal=causal, mods=mods,
            learnable_sink=leaves[3] if sink is not None else None,
        )  # fmt: skip
        o.backward(dout.to(ref_dtype))
        return o, l_, *(t.grad for t in leaves)

    oracle, baseline = reference(torch.float64), reference(q.dtype)
    names = RESULT_NAMES if sink is None else (*RESULT_NAMES, "dsink")
    for result, mine, ref, base in zip(names, ours, oracle, baseline, strict=True):
        assert not torch.isnan(mine).any(), f"{result}: NaN ({label}, seed {seed})"
        assert_matches_oracle(result, mine, ref, base, grad=result.startswith("d"), seed=seed)
    return out, lse


CASES = [
    # (batch, N_q, N_k, head dim, layout, mask per head, block size, causal)
    (2, 1000, 1500, 128, "mha", True, (128, 128), False),
    (1, 1025, 2048, 128, "gqa", False, (128, 128), True),
    (2, 640, 384, 64, "gqa", False, (256, 128), False),
    (1, 2048, 1025, 64, "mha", True, (128, 256), True),
    (1, 777, 777, 128, "mqa", False, (256, 256), True),
    # GQA with a mask per query head: the forward in Gluon, the backward in the portable kernels.
    (1, 513, 700, 128, "gqa", True, (128, 128), False),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_block_mask_in_the_gluon_kernels_matches_oracle(case, dtype, seed: int) -> None:
    batch, n_q, n_k, d, layout, per_head, block, causal = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    states = _random_states(batch, heads if per_head else 1, n_q, n_k, block)
    bm = BlockMask.from_states(states, n_q, n_k, block)
    mods = Mods(bm)
    q = torch.randn(batch, n_q, heads, d, dtype=dtype, device="cuda", requires_grad=True)
    k = torch.randn(batch, n_k, heads_kv, d, dtype=dtype, device="cuda", requires_grad=True)
    v = torch.randn(batch, n_k, heads_kv, d, dtype=dtype, device="cuda", requires_grad=True)
    dout = torch.randn_like(q)

    options = {"mods": mods, "window_size": (-1, 0) if causal else (-1, -1)}
    assert hopper.unsupported_reason("attn_fwd", q, k, v, options) is None
    bwd_reason = hopper_bwd.bwd_unsupported_reason(q, k, v, dout, options)
    if per_head and heads != heads_kv:
        assert bwd_reason is not None and "GQA" in bwd_reason
    else:
        assert bwd_reason is None

    out, lse = _matches_oracle(q, k, v, dout, causal, mods, str(case), seed)
    # Query block 0 lists no key block.
    rows = slice(0, block[0])
    assert (out[:, rows] == 0).all()
    assert (lse[:, :, rows] == -math.inf).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: "-".join(map(str, c)).replace(" ", ""))
def test_block_mask_with_a_learnable_sink_matches_oracle(case, dtype, seed: int) -> None:
    # The Gluon forward folds the sink in after the listed tiles; the backward with a sink and a block mask
    # is the portable one (hopper_bwd.bwd_unsupported_reason: not yet run on a GPU in the Gluon one).
    batch, n_q, n_k, d, layout, per_head, block, causal = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    states = _random_states(batch, heads if per_head else 1, n_q, n_k, block)
    mods = Mods(BlockMask.from_states(states, n_q, n_k, block))
    q = torch.randn(batch, n_q, heads, d, dtype=dtype, device="cuda", requires_grad=True)
    k = torch.randn(batch, n_k, heads_kv, d, dtype=dtype, device="cuda", requires_grad=True)
    v = torch.randn(batch, n_k, heads_kv, d, dtype=dtype, device="cuda", requires_grad=True)
    sink = torch.randn(heads, device="cuda", requires_grad=True)
    options = {"mods": mods, "window_size": (-1, 0) if causal else (-1, -1), "learnable_sink": sink}
    assert hopper.unsupported_reason("attn_fwd", q, k, v, options) is None
    out, lse = _matches_oracle(q, k, v, torch.randn_like(q), causal, mods, str(case), seed, sink=sink)
    # Query block 0 lists no key block: out 0, lse = the sink.
    rows = slice(0, block[0])
    assert (out[:, rows] == 0).all()
    torch.testing.assert_close(lse[:, :, rows], sink.detach()[None, :, None].expand_as(lse[:, :, rows]))


@triton.jit
def _odd_heads_causal(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) | (h % 2 == 0)


MOD_CASES = [
    # (name, mask_mod, per head, takes document ids, N, head dim, layout, block size, causal)
    ("document", masks.document(), False, True, 1500, 128, "gqa", (128, 128), False),
    ("causal_document", masks.and_masks(masks.causal, masks.document()), False, True, 2000, 64, "mha",
     (128, 256), False),
    ("prefix_lm", masks.prefix_lm(300), False, False, 1025, 128, "mqa", (128, 128), False),
    ("sliding_window", masks.sliding_window(200, 50), False, False, 1111, 128, "mha", (256, 128), True),
    ("odd_heads_causal", _odd_heads_causal, True, False, 900, 64, "mha", (128, 128), False),
]  # fmt: skip


@pytest.mark.parametrize("bits", [True, False], ids=["bits", "compiled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", MOD_CASES, ids=lambda c: c[0])
def test_mask_mod_in_the_gluon_kernels_matches_oracle(
    case, dtype, bits: bool, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bits: the kernels read create_block_mask's bits in the partial tiles; compiled: they run the mask_mod.
    monkeypatch.setenv(_mask_bits.ENV_VAR, "1" if bits else "0")
    name, mask_mod, per_head, documents, n, d, layout, block, causal = case
    heads, heads_kv = HEAD_LAYOUTS[layout]
    aux = None
    if documents:
        # Documents of odd lengths, one shorter than a block.
        aux = (masks.document_ids(torch.tensor([0, 77, n // 2, n - 300, n], device="cuda")),)
    bm = flashtile.create_block_mask(mask_mod, None, heads if per_head else None, n, n, block, "cuda", aux)
    mods = Mods(bm, None, None, None, aux)
    assert _mask_bits.reads_bits(mods) == bits
    q = torch.randn(2, n, heads, d, dtype=dtype, device="cuda", requires_grad=True)
    k = torch.randn(2, n, heads_kv, d, dtype=dtype, device="cuda", requires_grad=True)
    v = torch.randn(2, n, heads_kv, d, dtype=dtype, device="cuda", requires_grad=True)
    dout = torch.randn_like(q)
    options = {"mods": mods, "window_size": (-1, 0) if causal else (-1, -1)}
    assert hopper.unsupported_reason("attn_fwd", q, k, v, options) is None
    assert hopper_bwd.bwd_unsupported_reason(q, k, v, dout, options) is None

    _matches_oracle(q, k, v, dout, causal, mods, name, seed)
