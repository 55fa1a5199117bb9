"""Prepared plain calls (flashtile.kernels.hopper.prepared): a repeated plain call on the Hopper backend
launches exactly what the general path launches — the same kernels, arguments, descriptors and tensors in
the same places — and hands back to the general path what it cannot take (unaligned inputs, an unusual dO)."""

from __future__ import annotations

import textwrap

import pytest
import torch

import flashtile.backend
from flashtile import flash_attn_func, plain_calls
from tests.test_launch_cache import _FAKE_SM90, _run_sm90_check

# The fake sm_90 machine of test_launch_cache (compiled kernels recorded, Triton's binder for real), with
# the Hopper backend taking CPU tensors: its device checks answer as on a Hopper GPU.
_PREPARED_CHECK = _FAKE_SM90 + textwrap.dedent(
    """
    import flashtile.backend as backend
    from flashtile import flash_attn_func, plain_calls
    from flashtile.kernels.hopper import prepared, support

    os.environ["FLASHTILE_BACKEND"] = "auto"
    backend.hopper_unavailable_reason = lambda device: None
    support.device_unsupported_reason = lambda device: None
    gluon_check = hopper_bwd.bwd_unsupported_reason
    on_cuda = lambda t: type(
        "OnCuda", (), {"device": torch.device("cuda"), "dtype": t.dtype, "shape": t.shape, "dim": t.dim,
        "numel": t.numel},
    )()
    capability = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    hopper_bwd.bwd_unsupported_reason = lambda q, k, v, dout, options: gluon_check(
        on_cuda(q), k, v, dout, options
    )
    TAKEN = []
    for name in ("forward", "backward"):
        method = getattr(prepared.PlainAttention, name)

        def counted(self, *args, _method=method, _name=name):
            result = _method(self, *args)
            TAKEN.append((_name, result is not None))
            return result

        setattr(prepared.PlainAttention, name, counted)


    def normalised(launches):
        # Each tensor by dtype, shape, strides and which of the call's tensors it is (first seen first).
        seen = {}

        def one(value):
            if isinstance(value, torch.Tensor):
                key = (value.data_ptr(), value.dtype, tuple(value.shape))
                which = seen.setdefault(key, len(seen))
                return ("tensor", value.dtype, tuple(value.shape), value.stride(), which)
            if isinstance(value, CheckedDescriptor):
                fields = (value.shape, value.strides, value.block_shape, value.layout)
                return ("descriptor", one(value.base), *fields)
            if isinstance(value, tuple):
                return tuple(one(v) for v in value)
            return value

        return [(name, one(args)) for name, args in launches]


    def tensors(shape_q, shape_kv, dtype=torch.float16, offset=0):
        made = []
        for shape in (shape_q, shape_kv, shape_kv):
            count = torch.Size(shape).numel()
            raw = torch.randn(count + 8, dtype=dtype)
            made.append(raw[offset : offset + count].view(shape).requires_grad_())
        return made


    def one_call(shape_q, shape_kv, options, offset=0, dout_of=torch.randn_like):
        LAUNCHES.clear(), TRITON_RUNS.clear(), TAKEN.clear()
        q, k, v = tensors(shape_q, shape_kv, offset=offset)
        out = flash_attn_func(q, k, v, **options)
        torch.autograd.grad(out, (q, k, v), dout_of(out))
        return normalised(LAUNCHES), list(TRITON_RUNS), list(TAKEN)


    prepare = backend.prepare

    def on_the_general_path(call, *args, **kwargs):
        # A call validated, routed and launched through Triton: no prepared call for its signature, and no
        # verdict kept (the next call, a first call again, is prepared).
        plain_calls._verdicts.clear()
        backend.prepare = lambda *args, **kwargs: None
        try:
            return call(*args, **kwargs)
        finally:
            backend.prepare = prepare
            plain_calls._verdicts.clear()


    B, H = 2, 4
    cases = {
        "dense-d64": ((B, 77, H, 64), (B, 77, H, 64), {}),
        "causal-gqa-d128": ((B, 77, H, 128), (B, 130, 2, 128), {"causal": True}),
        "window-softcap-d128": ((B, 100, H, 128), (B, 90, H, 128), {"window_size": (17, 5), "softcap": 9.0}),
        "causal-deterministic-d128": (
            (B, 64, H, 128), (B, 64, 1, 128), {"causal": True, "deterministic": True}
        ),
        "dense-d256": ((1, 33, 2, 256), (1, 47, 2, 256), {}),
        # ALiBi's slopes (their address at each call) and dropout's random state (drawn at each call).
        "causal-alibi-d128": (
            (B, 77, H, 128), (B, 130, 2, 128), {"causal": True, "alibi_slopes": torch.rand(H)}
        ),
        "dropout-d64": ((B, 77, H, 64), (B, 77, H, 64), {"dropout_p": 0.2}),
        "window-alibi2d-dropout-d128": (
            (B, 100, H, 128), (B, 90, H, 128),
            {"window_size": (17, 5), "alibi_slopes": torch.rand(B, H), "dropout_p": 0.1},
        ),
        # A learnable sink (its float32 tensor a call's): the Gluon backward sums its gradient at D = 64 and
        # 128; at D = 256 the prepared call's backward hands the call to the general path (the portable one).
        "causal-sink-d64": (
            (B, 77, H, 64), (B, 130, 2, 64),
            {"causal": True, "learnable_sink": torch.randn(H).requires_grad_()},
        ),
        "sink-d128": ((B, 77, H, 128), (B, 77, H, 128), {"learnable_sink": torch.randn(H).requires_grad_()}),
        "sink-d256": ((B, 77, H, 256), (B, 77, H, 256), {"learnable_sink": torch.randn(H).requires_grad_()}),
    }
    # The cases whose backward the prepared call leaves to the general path.
    general_backward = {"sink-d256"}
    for name, (shape_q, shape_kv, options) in cases.items():
        general, _, taken = on_the_general_path(one_call, shape_q, shape_kv, options)
        assert taken == [], (name, taken)
        # A signature's first call is prepared too (its graph's backward with it); its first direct launch
        # of each kernel goes through Triton (a new pointer signature there).
        first, _, taken = one_call(shape_q, shape_kv, options)
        prepared_backward = name not in general_backward
        assert taken == [("forward", True), ("backward", prepared_backward)], (name, taken)
        assert first == general, name
        again, runs, taken = one_call(shape_q, shape_kv, options)
        assert taken == [("forward", True), ("backward", prepared_backward)], (name, taken)
        assert runs == [], (name, runs)
        assert again == general, name
        # q, k, v 2 bytes off a 16-byte boundary: the forward hands the call back (TMA cannot read them) and
        # the backward copies them, as the general path does with such inputs.
        unaligned, _, taken = one_call(shape_q, shape_kv, options, offset=1)
        assert taken == [("forward", False), ("backward", prepared_backward)], (name, taken)
        general, _, taken = on_the_general_path(one_call, shape_q, shape_kv, options, offset=1)
        assert taken == [] and unaligned == general, name
        first_args = general[0][1]
        assert not any(isinstance(a, tuple) and a[:1] == ("descriptor",) for a in first_args), name
        # dO with a stride of 0 (a sum's gradient): the Gluon backward's general launch, which copies it.
        expanded = lambda out: torch.ones(()).to(out.dtype).expand_as(out)
        general, _, _ = on_the_general_path(one_call, shape_q, shape_kv, options, dout_of=expanded)
        again, _, taken = one_call(shape_q, shape_kv, options, dout_of=expanded)
        assert taken == [("forward", True), ("backward", prepared_backward)], (name, taken)
        assert again == general, name
    # q, k, v as views of one (B, N, 3, H, D) tensor: rows 3·H·D apart, read in place either way.
    def packed_views_call():
        LAUNCHES.clear(), TRITON_RUNS.clear(), TAKEN.clear()
        qkv = torch.randn(2, 50, 3, 4, 64, dtype=torch.float16, requires_grad=True)
        out = flash_attn_func(*qkv.unbind(2), causal=True)
        torch.autograd.grad(out, (qkv,), torch.randn_like(out))
        return normalised(LAUNCHES), list(TRITON_RUNS), list(TAKEN)

    general, _, _ = on_the_general_path(packed_views_call)
    packed_views_call()
    again, runs, taken = packed_views_call()
    assert taken == [("forward", True), ("backward", True)] and runs == [] and again == general
    # FLASHTILE_CACHED_LAUNCH=0: the prepared launches go through Triton's launch, with the same arguments.
    os.environ[ENV_VAR] = "0"
    shape_q, shape_kv, options = cases["causal-gqa-d128"]
    general, _, _ = on_the_general_path(one_call, shape_q, shape_kv, options)
    again, runs, taken = one_call(shape_q, shape_kv, options)
    assert taken == [("forward", True), ("backward", True)] and len(runs) == 4 and again == general
    print("ok")
    """
)


def test_prepared_calls_launch_what_the_general_path_launches() -> None:
    """Dense, causal with GQA and N_q ≠ N_k, a window with softcap, deterministic, D = 256, ALiBi (1-D and
    2-D slopes) and dropout, alone and with a window, a learnable sink (D = 64 causal; D = 128, whose
    backward is the portable one): a plain call's first and second runs (prepared, the second's every
    launch direct) pass each compiled kernel the arguments the general path (validated, routed, through
    Triton, no prepared call) passes, q, k and v as views of one packed tensor too; unaligned inputs and a
    stride-0 dO take the general path; with FLASHTILE_CACHED_LAUNCH=0 the prepared launches go through
    Triton with the same arguments."""
    _run_sm90_check(_PREPARED_CHECK)


@pytest.fixture
def fresh_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plain_calls, "_verdicts", {})


def test_knob_names_are_those_the_hopper_launchers_read() -> None:
    from flashtile.backend import ENV_VAR
    from flashtile.kernels.hopper.bwd import DK_LAST_ENV, DQ_BY_PRODUCER_ENV, VARIANT_ENV
    from flashtile.kernels.hopper.bwd import PERSISTENT_ENV as BWD_PERSISTENT_ENV
    from flashtile.kernels.hopper.fwd import CONSUMERS_ENV, EXP2_POLY_ENV, PERSISTENT_ENV, PINGPONG_ENV

    names = {knob.name for knob in plain_calls.KNOBS}
    knobs = {
        PERSISTENT_ENV, CONSUMERS_ENV, PINGPONG_ENV, VARIANT_ENV, BWD_PERSISTENT_ENV, DQ_BY_PRODUCER_ENV,
        DK_LAST_ENV, EXP2_POLY_ENV,
    }  # fmt: skip
    assert names == {ENV_VAR, "TRITON_INTERPRET", *knobs}


def test_a_knob_change_makes_a_new_verdict(fresh_verdicts, monkeypatch) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    q, k, v = (torch.randn(1, 9, 2, 16) for _ in range(3))
    flash_attn_func(q, k, v)
    monkeypatch.setenv("FLASHTILE_HOPPER_FWD_PERSISTENT", "0")
    flash_attn_func(q, k, v)
    monkeypatch.delenv("FLASHTILE_HOPPER_FWD_PERSISTENT")
    flash_attn_func(q, k, v)
    assert len(plain_calls._verdicts) == 2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape_q, shape_kv, options",
    [
        ((2, 203, 4, 64), (2, 203, 4, 64), {}),
        ((2, 203, 4, 128), (2, 150, 2, 128), {"causal": True}),
        ((2, 129, 4, 128), (2, 300, 4, 128), {"window_size": (40, 3), "softcap": 15.0}),
        ((2, 203, 4, 128), (2, 203, 1, 128), {"causal": True, "deterministic": True}),
        ((1, 97, 2, 256), (1, 97, 2, 256), {}),
        ((2, 203, 4, 128), (2, 150, 2, 128), {"causal": True, "alibi_slopes": (4,)}),
        ((2, 129, 4, 64), (2, 300, 4, 64), dict(window_size=(40, 3), alibi_slopes=(2, 4), dropout_p=0.2)),
        ((2, 203, 4, 64), (2, 150, 2, 64), {"causal": True, "learnable_sink": (4,)}),
        ((2, 203, 4, 128), (2, 203, 4, 128), {"learnable_sink": (4,)}),
    ],
    ids=[
        "dense-d64",
        "causal-gqa-d128",
        "window-softcap-d128",
        "deterministic-mqa-d128",
        "dense-d256",
        "causal-alibi-d128",
        "window-alibi2d-dropout-d64",
        "causal-sink-d64",
        "sink-d128",
    ],
)
def test_prepared_calls_give_the_general_paths_bits(
    fresh_verdicts, monkeypatch, shape_q, shape_kv, options
) -> None:
    """The general path (validated, routed, launched through Triton, no prepared call) and the prepared
    calls, a signature's first among them, give the same forward bits and the same dK, dV (and dQ and a
    learnable sink's gradient, which the fused kernel adds by atomics unless deterministic: there within
    fp32 summation order)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the prepared calls are the Hopper backend's")
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    if "alibi_slopes" in options:
        # The slopes' shape in the parameters (no CUDA tensor at collection); fresh slopes for the calls.
        options = {**options, "alibi_slopes": torch.rand(options["alibi_slopes"], device="cuda")}
    sink = None
    if "learnable_sink" in options:
        # The same: a bfloat16 sink, as transformers hands GPT-OSS's; its gradient compared too.
        sink = torch.randn(options["learnable_sink"], device="cuda", dtype=torch.bfloat16)
        options = {key: value for key, value in options.items() if key != "learnable_sink"}

    def run() -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with_sink = {}
        if sink is not None:
            leaves.append(sink.clone().requires_grad_())
            with_sink = {"learnable_sink": leaves[-1]}
        # Dropout draws its random state from PyTorch's generator at each call: the same seed, the same mask.
        torch.manual_seed(0)
        out = flash_attn_func(*leaves[:3], **options, **with_sink)
        return (out, *torch.autograd.grad(out, leaves, dout))

    with monkeypatch.context() as general_path:
        general_path.setattr(flashtile.backend, "prepare", lambda *args, **kwargs: None)
        first = run()
    plain_calls._verdicts.clear()
    for _ in range(2):
        again = run()
        entry = next(iter(plain_calls._verdicts.values()))
        assert entry[-1] is not None, "a plain Hopper call is prepared"
        for name, a, b in zip(("out", "dq", "dk", "dv", "dsink")[: len(first)], first, again, strict=True):
            # dQ (and the sink's gradient) are summed by atomics unless deterministic.
            if name in ("dq", "dsink") and not options.get("deterministic"):
                torch.testing.assert_close(a, b, rtol=0, atol=2e-2 * b.abs().max().item())
            else:
                assert torch.equal(a, b), name
