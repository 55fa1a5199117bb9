"""The custom ops pass torch.library.opcheck; the public API compiles (fullgraph=True) to eager's results.

``flashtile.autograd.FlashAttnFunction`` differentiates attention, calling the ops under torch.compile;
``attn_fwd`` also carries its own gradient (``attn_bwd``) for graphs that hold the op alone, such as a
torch.export'ed model: opcheck runs with and without inputs that require grad. Gradients through the
compiled graph are checked against eager below.
"""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from flashtile import (
    FlashAttention,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)


@pytest.fixture(autouse=True)
def fresh_compiler() -> None:
    torch.compiler.reset()


def _op_args(
    batch: int,
    seqlen_q: int,
    seqlen_k: int,
    nheads: int,
    nheads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    requires_grad: bool = False,
) -> tuple[torch.Tensor, ...]:
    q = torch.randn(batch, seqlen_q, nheads, head_dim, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(batch, seqlen_k, nheads_kv, head_dim, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(batch, seqlen_k, nheads_kv, head_dim, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


OPCHECK_CASES = [
    pytest.param((2, 17, 17, 2, 2, 32), False, torch.float32, id="MHA-fp32"),
    pytest.param((1, 19, 33, 4, 2, 40), True, torch.float16, id="GQA-causal-fp16"),
    pytest.param((1, 33, 19, 4, 1, 16), True, torch.float32, id="MQA-causal-masked-rows-fp32"),
    pytest.param((2, 5, 0, 2, 2, 16), False, torch.float32, id="no-keys"),
    pytest.param((0, 5, 7, 2, 2, 16), True, torch.float32, id="empty-batch"),
]


@pytest.mark.parametrize(("dims", "causal", "dtype"), OPCHECK_CASES)
def test_opcheck_reference(dims: tuple[int, ...], causal: bool, dtype: torch.dtype, seed: int) -> None:
    q, k, v = _op_args(*dims, dtype)
    scale = dims[-1] ** -0.5
    torch.library.opcheck(torch.ops.flashtile.attn_fwd.default, (q, k, v, scale, causal, "reference"))
    out, lse = torch.ops.flashtile.attn_fwd(q, k, v, scale, causal, "reference")
    dout = torch.randn_like(out)
    detached = [t.detach() for t in (q, k, v, out)]
    torch.library.opcheck(
        torch.ops.flashtile.attn_bwd.default, (dout, *detached, lse, scale, causal, "reference")
    )


def test_opcheck_triton_interpreter(seed: int) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton backend on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    q, k, v = _op_args(1, 9, 12, 2, 1, 16, torch.float16)
    torch.library.opcheck(torch.ops.flashtile.attn_fwd.default, (q, k, v, 0.25, True, "triton"))
    out, lse = torch.ops.flashtile.attn_fwd(q, k, v, 0.25, True, "triton")
    detached = [t.detach() for t in (q, k, v, out)]
    torch.library.opcheck(
        torch.ops.flashtile.attn_bwd.default, (torch.randn_like(out), *detached, lse, 0.25, True, "triton")
    )


def test_unknown_backend_argument_rejected() -> None:
    q, k, v = _op_args(1, 4, 4, 1, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="backend must be one of hopper, triton, reference; got 'cuda'"):
        torch.ops.flashtile.attn_fwd(q, k, v, 1.0, False, "cuda")


def _eager_and_compiled(fn, *inputs: torch.Tensor, dynamic: bool | None = None):
    """Outputs and input gradients of ``fn`` run eagerly and compiled with fullgraph=True."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=dynamic)
    results = []
    for f in (fn, compiled):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = f(*leaves)
        first = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(first, leaves, torch.ones_like(first))
        results.append((out, grads))
    return results


def _assert_same(eager, compiled) -> None:
    (out_e, grads_e), (out_c, grads_c) = eager, compiled
    outs_e = out_e if isinstance(out_e, tuple) else (out_e,)
    outs_c = out_c if isinstance(out_c, tuple) else (out_c,)
    for a, b in zip((*outs_e, *grads_e), (*outs_c, *grads_c), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_compile_flash_attn_func(causal: bool, seed: int) -> None:
    q, k, v = _op_args(2, 13, 21, 4, 2, 32, torch.float32)

    def fn(q, k, v):
        return flash_attn_func(q, k, v, causal=causal)

    _assert_same(*_eager_and_compiled(fn, q, k, v))


def test_compile_return_attn_probs(seed: int) -> None:
    q, k, v = _op_args(1, 9, 9, 2, 2, 16, torch.float32)

    def fn(q, k, v):
        return flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, return_attn_probs=True)

    _assert_same(*_eager_and_compiled(fn, q, k, v))


def test_compile_packed_variants(seed: int) -> None:
    qkv = torch.randn(2, 11, 3, 2, 16)
    q = torch.randn(2, 7, 4, 16)
    kv = torch.randn(2, 11, 2, 1, 16)
    _assert_same(*_eager_and_compiled(lambda qkv: flash_attn_qkvpacked_func(qkv, causal=True), qkv))
    _assert_same(*_eager_and_compiled(lambda q, kv: flash_attn_kvpacked_func(q, kv, causal=True), q, kv))


def test_compile_dynamic_shapes(seed: int) -> None:
    compiled = torch.compile(
        lambda q, k, v: flash_attn_func(q, k, v, causal=True), fullgraph=True, dynamic=True
    )
    for seqlen in (9, 17):
        q, k, v = _op_args(1, seqlen, seqlen + 3, 2, 2, 16, torch.float32)
        torch.testing.assert_close(compiled(q, k, v), flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)


def test_compile_module(seed: int) -> None:
    layer = FlashAttention(32, num_heads=4, num_kv_heads=2, causal=True)
    x = torch.randn(2, 10, 32)
    compiled = torch.compile(layer, fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)


def test_compile_triton_interpreter(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton backend on the CPU needs TRITON_INTERPRET=1 before triton is imported")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = _op_args(1, 9, 12, 2, 1, 16, torch.float16)
    _assert_same(*_eager_and_compiled(lambda q, k, v: flash_attn_func(q, k, v, causal=True), q, k, v))


def test_compiled_graph_calls_the_custom_ops(seed: int) -> None:
    # Eager autograd calls the implementations directly; a compiled graph must hold the opaque ops instead.
    graphs = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm.print_readable(print_output=False))
        return gm.forward

    q, k, v = (t.requires_grad_() for t in _op_args(1, 9, 12, 2, 1, 16, torch.float32))
    compiled = torch.compile(
        lambda q, k, v: flash_attn_func(q, k, v, causal=True), backend=record, fullgraph=True
    )
    compiled(q, k, v).sum().backward()
    assert any("flashtile.attn_fwd" in g for g in graphs), graphs
    assert any("flashtile.attn_bwd" in g for g in graphs), graphs


def _options_args(dtype: torch.dtype) -> tuple:
    """Op arguments with every option: window, softcap, (B, H) ALiBi slopes and dropout's rng_state."""
    q, k, v = _op_args(2, 13, 21, 4, 2, 16, dtype)
    slopes = torch.rand(2, 4)
    rng_state = torch.tensor([123, 456], dtype=torch.int64)
    return (q, k, v, 0.25, False, "reference", 5, 2, 3.0, slopes, 0.2, rng_state)


def _varlen_args(dtype: torch.dtype) -> tuple:
    cu_q = torch.tensor([0, 7, 7, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 13, 13], dtype=torch.int32)
    q = torch.randn(19, 4, 16, dtype=dtype)
    k, v = torch.randn(13, 2, 16, dtype=dtype), torch.randn(13, 2, 16, dtype=dtype)
    slopes = torch.rand(4)
    rng_state = torch.tensor([7, 8], dtype=torch.int64)
    return (q, k, v, 0.25, True, "reference", 3, 0, 0.0, slopes, 0.3, rng_state, cu_q, cu_k, 12, 9)


@pytest.mark.parametrize("make", [_options_args, _varlen_args], ids=["dense-options", "varlen-options"])
def test_opcheck_with_options(make, seed: int) -> None:
    args = make(torch.float32)
    torch.library.opcheck(torch.ops.flashtile.attn_fwd.default, args)
    out, lse = torch.ops.flashtile.attn_fwd(*args)
    q, k, v = args[:3]
    assert lse.shape == ((4, 19) if len(args) > 12 else (2, 4, 13))
    torch.library.opcheck(
        torch.ops.flashtile.attn_bwd.default, (torch.randn_like(out), q, k, v, out, lse, *args[3:])
    )
    rng_state = args[11]
    torch.library.opcheck(
        torch.ops.flashtile.dropout_keep_mask.default, (rng_state, 0.3, 2, 3, 5, 7, "reference")
    )


def _sink_args(dtype: torch.dtype) -> tuple:
    """GQA with V's head dim unlike Q's, causal, a window, softcap, ALiBi and a learnable sink."""
    q, k = torch.randn(2, 9, 4, 16, dtype=dtype), torch.randn(2, 11, 2, 16, dtype=dtype)
    v = torch.randn(2, 11, 2, 24, dtype=dtype)
    options = (4, 1, 2.0, torch.rand(4, dtype=dtype), 0.0, None, None, None, 0, 0)
    return (q, k, v, 0.25, True, "reference", *options, torch.randn(4, dtype=dtype))


@pytest.mark.parametrize(
    "make", [_options_args, _varlen_args, _sink_args], ids=["dense-dropout", "varlen-dropout", "sink-dv24"]
)
def test_opcheck_attn_fwd_autograd(make, seed: int) -> None:
    # attn_fwd carries its own gradient (for graphs that hold the op outside FlashAttnFunction, such as a
    # torch.export'ed model): opcheck with inputs that require grad checks it is registered and traces.
    args = list(make(torch.float32))
    for i in (0, 1, 2, 16):
        if i < len(args) and isinstance(args[i], torch.Tensor):
            args[i] = args[i].requires_grad_()
    torch.library.opcheck(torch.ops.flashtile.attn_fwd.default, tuple(args))


def test_attn_fwd_op_gradcheck(seed: int) -> None:
    f64 = dict(dtype=torch.float64, requires_grad=True)
    q, k, v = torch.randn(1, 5, 4, 8, **f64), torch.randn(1, 6, 2, 8, **f64), torch.randn(1, 6, 2, 12, **f64)
    sink, slopes, rng_state = torch.randn(4, **f64), torch.rand(4, dtype=torch.float64), torch.tensor([3, 4])
    op = torch.ops.flashtile.attn_fwd

    def dense(q, k, v, sink):
        options = (3, 1, 2.0, slopes, 0.3, rng_state, None, None, 0, 0, sink)
        return op(q, k, v, 0.3, True, "reference", *options)[0]

    assert torch.autograd.gradcheck(dense, (q, k, v, sink), fast_mode=True)
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    q, k, v = torch.randn(7, 4, 8, **f64), torch.randn(9, 2, 8, **f64), torch.randn(9, 2, 8, **f64)

    def varlen(q, k, v, sink):
        return op(q, k, v, 0.3, True, "reference", -1, -1, 0.0, None, 0.0, None, cu_q, cu_k, 4, 5, sink)[0]

    assert torch.autograd.gradcheck(varlen, (q, k, v, sink), fast_mode=True)


def test_exported_module_trains_like_eager(seed: int) -> None:
    # torch.export keeps the op, not FlashAttnFunction: training the exported module needs the op's gradient.
    layer = FlashAttention(32, num_heads=4, num_kv_heads=2, causal=True, window_size=(5, 0), softcap=3.0)
    x = torch.randn(2, 9, 32)
    exported = torch.export.export(layer, (x,)).module()
    results = []
    for module in (layer, exported):
        leaf = x.clone().requires_grad_()
        out = module(leaf)
        params = list(module.parameters())
        results.append((out, torch.autograd.grad(out.square().sum(), [leaf, *params])))
    _assert_same(*results)


@pytest.mark.parametrize(
    "options",
    [
        dict(window_size=torch.tensor([3, 0])),
        dict(causal=torch.tensor(True)),
        dict(softcap=torch.tensor(2.0).numpy()[()]),
    ],
    ids=["tensor-window", "tensor-causal", "numpy-softcap"],
)
def test_compile_module_with_tensor_or_numpy_options(options: dict, seed: int) -> None:
    # The layer keeps its options as Python values: the compiled forward does not meet the tensor or array.
    layer = FlashAttention(32, num_heads=4, **options)
    x = torch.randn(2, 9, 32)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), layer(x), rtol=1e-6, atol=1e-6)


def test_compile_with_options(seed: int) -> None:
    q, k, v = _op_args(2, 13, 21, 4, 2, 16, torch.float32)
    slopes = torch.rand(2, 4)

    def fn(q, k, v):
        return flash_attn_func(
            q, k, v, window_size=(5, 2), softcap=3.0, alibi_slopes=slopes, return_attn_probs=True
        )

    _assert_same(*_eager_and_compiled(fn, q, k, v))


def test_compile_varlen(seed: int) -> None:
    cu_q = torch.tensor([0, 7, 7, 19], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 13, 13], dtype=torch.int32)
    q, k, v = torch.randn(19, 4, 16), torch.randn(13, 2, 16), torch.randn(13, 2, 16)

    def fn(q, k, v):
        return flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 12, 9, causal=True, window_size=(3, -1), softcap=2.0
        )

    _assert_same(*_eager_and_compiled(fn, q, k, v))


def test_compile_dropout_runs_and_matches_its_s_dmask(seed: int) -> None:
    # Inductor draws rng_state with its own generator, so compare with the reference given the S_dmask.
    from flashtile.reference import naive

    q, k, v = (t.requires_grad_() for t in _op_args(1, 9, 12, 2, 1, 16, torch.float64))
    compiled = torch.compile(
        lambda q, k, v: flash_attn_func(q, k, v, dropout_p=0.3, causal=True, return_attn_probs=True),
        fullgraph=True,
    )
    out, _, s_dmask = compiled(q, k, v)
    keep = ~torch.signbit(s_dmask)
    expected, _ = naive.attention(q, k, v, causal=True, dropout_p=0.3, dropout_mask=keep)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected_grads = torch.autograd.grad(expected.sum(), (q, k, v))
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_compile_varlen_s_dmask_matches_eager(device: str, seed: int) -> None:
    # The varlen S_dmask is laid out from cu_seqlens by tensor ops: fullgraph=True traces it, no host loop.
    from flashtile.reference import naive

    cu_q = torch.tensor([0, 5, 5, 16], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 3, 10, 10], dtype=torch.int32, device=device)
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k, v = (torch.randn(n, h, 16, device=device, dtype=dtype) for n, h in ((16, 4), (10, 2), (10, 2)))
    slopes = torch.rand(3, 4, device=device)
    options = dict(causal=True, window_size=(4, -1), softcap=2.0, alibi_slopes=slopes)

    def fn(q, k, v):
        return flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, 11, 7, dropout_p=0.3, return_attn_probs=True, **options
        )

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        # aot_eager draws dropout's rng_state from the generator eager uses: the same seed, the same mask.
        torch.manual_seed(seed)
        results.append(f(q, k, v))
    for eager, compiled in zip(*results, strict=True):
        assert torch.equal(compiled, eager) and torch.equal(compiled.signbit(), eager.signbit())
    s_dmask = results[0][2]
    assert s_dmask.shape == (3, 4, 11, 7)
    bounds_q, bounds_k = cu_q.tolist(), cu_k.tolist()
    for b in range(3):
        (q0, q1), (k0, k1) = bounds_q[b : b + 2], bounds_k[b : b + 2]
        # Sequence b fills [b, :, :N_q, :N_k] (its own bottom-right alignment) and +0 is beyond it.
        expected = naive.attention_probs(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], **dict(options, alibi_slopes=slopes[b])
        )
        torch.testing.assert_close(s_dmask[b, :, : q1 - q0, : k1 - k0].abs(), expected[0])
        inside = torch.zeros_like(s_dmask[b], dtype=torch.bool)
        inside[:, : q1 - q0, : k1 - k0] = True
        assert not s_dmask[b][~inside].any() and not s_dmask[b][~inside].signbit().any(), b


@triton.jit
def _relative_bias(score, b, h, q_idx, kv_idx):
    return score - 0.125 * tl.abs(q_idx - kv_idx).to(tl.float32)


@triton.jit
def _unit_grad(score, b, h, q_idx, kv_idx):
    return score * 0.0 + 1.0


def test_mods_under_compile_run_eagerly_behind_a_graph_break(seed: int) -> None:
    # A block mask and a score_mod cannot enter the custom ops: the call leaves the graph (one break) and
    # gives eager's output and gradients; fullgraph=True refuses the break.
    from flashtile import create_block_mask
    from flashtile.masks import causal

    q, k, v = _op_args(2, 40, 40, 2, 1, 16, torch.float32)
    mask = create_block_mask(causal, 1, 1, 40, 40, block_size=32)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (
            flash_attn_func(q, k, v, block_mask=mask, score_mod=_relative_bias, score_mod_bwd=_unit_grad) * 2
        )

    counters = torch._dynamo.utils.counters
    counters.clear()
    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager")):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = f(*leaves)
        results.append((out, torch.autograd.grad(out, leaves, torch.ones_like(out))))
    _assert_same(*results)
    assert counters["graph_break"], "the call did not leave the graph"
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(fn, fullgraph=True)(q, k, v)
