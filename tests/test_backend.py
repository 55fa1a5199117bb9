"""The backend table and its one rule, on the CPU: the device's compute capability is faked, so the rule
(hopper on 9.x with Gluon and a supported call; else triton on CUDA; else reference) is checked without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from flashtile import BlockMask, backend, masks, ops
from flashtile.errors import FlashtileValueError
from flashtile.kernels import hopper, portable
from flashtile.kernels.hopper import support
from flashtile.mods import Mods
from flashtile.reference import naive
from tests.helpers import assert_matches_oracle

CUDA = torch.device("cuda")


@pytest.fixture
def capability(monkeypatch: pytest.MonkeyPatch):
    """Fake the CUDA device's compute capability: ``capability((9, 0))``; the caches are cleared around."""

    def fake(cc: tuple[int, int]) -> None:
        support.device_unsupported_reason.cache_clear()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)

    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    yield fake
    support.device_unsupported_reason.cache_clear()


@pytest.fixture
def hopper_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's device check passes for CPU tensors, so launcher() can be driven with them."""
    monkeypatch.delenv(backend.ENV_VAR, raising=False)
    monkeypatch.delenv(support.VARLEN_ENV, raising=False)
    monkeypatch.setattr(support, "device_unsupported_reason", lambda device: None)


def _qkv(dtype=torch.bfloat16, head_dim=128, head_dim_v=None, **kw):
    q = torch.randn(2, 33, 4, head_dim, dtype=dtype, **kw)
    k = torch.randn(2, 40, 2, head_dim, dtype=dtype, **kw)
    v = torch.randn(2, 40, 2, head_dim_v or head_dim, dtype=dtype, **kw)
    return q, k, v


def test_every_backend_module_offers_the_same_entry_points():
    assert backend.BACKENDS == ("hopper", "triton", "reference")
    for name in backend.BACKENDS:
        implementation = backend.module(name)
        assert callable(implementation.attn_fwd) and callable(implementation.attn_bwd), name


@pytest.mark.parametrize(
    ("cc", "expected"), [((9, 0), "hopper"), ((9, 1), "hopper"), ((8, 0), "triton"), ((10, 0), "triton")]
)
def test_auto_picks_hopper_only_on_compute_capability_9(capability, cc, expected):
    capability(cc)
    assert backend.resolve(CUDA) == expected
    assert ("hopper" in backend.available_backends(CUDA)) == (expected == "hopper")
    assert backend.resolve(torch.device("cpu")) == "reference"


def test_auto_falls_back_to_triton_without_gluon(capability, monkeypatch):
    capability((9, 0))
    monkeypatch.setattr(support, "gluon_unavailable_reason", lambda: "Gluon does not import: test")
    assert backend.resolve(CUDA) == "triton"


def test_forced_hopper_on_another_device_names_the_reason(capability, monkeypatch):
    capability((8, 6))
    monkeypatch.setenv(backend.ENV_VAR, "hopper")
    expected = r"FLASHTILE_BACKEND=hopper .* compute capability 9\.x.*8\.6"
    with pytest.raises(FlashtileValueError, match=expected):
        backend.resolve(CUDA)
    with pytest.raises(FlashtileValueError, match="not on 'cpu'"):
        backend.resolve(torch.device("cpu"))


def test_supported_call_goes_to_the_gluon_forward(hopper_everywhere):
    q, k, v = _qkv()
    options = dict(window_size=(-1, 0))
    assert backend.launcher("hopper", "attn_fwd", q, k, v, options) is hopper.attn_fwd
    # The backend's attn_bwd picks the Gluon or the portable backward per call (tested below).
    assert backend.launcher("hopper", "attn_bwd", q, k, v, options) is hopper.attn_bwd


UNSUPPORTED = [
    pytest.param(dict(dtype=torch.float32), {}, "float16 and bfloat16", id="fp32"),
    pytest.param(dict(head_dim=96), {}, "head dims 64, 128, 256", id="d96"),
    pytest.param(
        {},
        dict(dropout_p=0.1, mods=Mods(BlockMask.from_tiles(torch.ones(1, 1, dtype=torch.bool), 33, 40, 128))),
        "dropout with a block mask",
        id="dropout-block-mask",
    ),
    pytest.param({}, dict(mods=Mods(mask_mod=masks.causal)), "without a block mask", id="mods"),
    pytest.param(dict(head_dim_v=64), {}, "V head dim", id="dv64"),
]


# Options the Gluon forward runs (its backward stays with the backend's attn_bwd, which picks per call).
SUPPORTED = [
    pytest.param(dict(window_size=(8, 0)), id="causal-window"),
    pytest.param(dict(window_size=(-1, 4)), id="right-window"),
    pytest.param(dict(window_size=(5, -1)), id="left-window"),
    pytest.param(dict(window_size=(16, 16)), id="window"),
    pytest.param(dict(softcap=5.0), id="softcap"),
    pytest.param(dict(alibi_slopes=torch.ones(4)), id="alibi"),
    pytest.param(dict(alibi_slopes=torch.ones(2, 4)), id="alibi-batch"),
    pytest.param(dict(window_size=(8, 8), softcap=5.0, alibi_slopes=torch.ones(4)), id="combined"),
    pytest.param(dict(dropout_p=0.1), id="dropout"),
    pytest.param(dict(window_size=(8, 0), softcap=5.0, dropout_p=0.3), id="dropout-combined"),
    pytest.param(dict(learnable_sink=torch.zeros(4)), id="sink"),
    pytest.param(
        dict(window_size=(8, 0), alibi_slopes=torch.ones(4), learnable_sink=torch.zeros(4)),
        id="sink-combined",
    ),
]


@pytest.mark.parametrize("options", SUPPORTED)
def test_window_softcap_alibi_and_dropout_go_to_the_gluon_forward(hopper_everywhere, monkeypatch, options):
    q, k, v = _qkv()
    assert support.fwd_unsupported_reason(q, k, v, options) is None
    assert backend.launcher("hopper", "attn_fwd", q, k, v, options) is hopper.attn_fwd
    monkeypatch.setenv(backend.ENV_VAR, "hopper")
    assert backend.launcher("hopper", "attn_fwd", q, k, v, options) is hopper.attn_fwd


@pytest.mark.parametrize(("tensor_kw", "options", "reason"), UNSUPPORTED)
def test_unsupported_call_falls_back_under_auto_and_raises_when_forced(
    hopper_everywhere, monkeypatch, tensor_kw, options, reason
):
    q, k, v = _qkv(**tensor_kw)
    assert reason in support.fwd_unsupported_reason(q, k, v, options)
    assert backend.launcher("hopper", "attn_fwd", q, k, v, options) is portable.attn_fwd
    monkeypatch.setenv(backend.ENV_VAR, "hopper")
    with pytest.raises(FlashtileValueError, match=f"FLASHTILE_BACKEND=hopper was asked for but .*{reason}"):
        backend.launcher("hopper", "attn_fwd", q, k, v, options)


def test_varlen_goes_to_the_gluon_forward_only_under_its_knob(hopper_everywhere, monkeypatch):
    # Where the Gluon varlen forward is not marked GPU-checked (support.GPU_CHECKED_VARLEN), packed batches
    # take it under FLASHTILE_HOPPER_FWD_VARLEN=1 only, with the options the dense path takes and no others.
    cu = torch.tensor([0, 30, 66], dtype=torch.int32)
    q, k, v = (t.reshape(-1, *t.shape[2:]) for t in _qkv())
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=36, max_seqlen_k=36)
    monkeypatch.setattr(support, "GPU_CHECKED_VARLEN", False)
    monkeypatch.delenv(support.VARLEN_ENV, raising=False)
    assert "variable-length" in support.fwd_unsupported_reason(q, k, v, varlen)
    assert backend.launcher("hopper", "attn_fwd", q, k, v, varlen) is portable.attn_fwd
    monkeypatch.setenv(support.VARLEN_ENV, "1")
    options = dict(varlen, window_size=(8, 0), softcap=5.0, alibi_slopes=torch.ones(4))
    assert support.fwd_unsupported_reason(q, k, v, options) is None
    assert backend.launcher("hopper", "attn_fwd", q, k, v, options) is hopper.attn_fwd
    assert support.fwd_unsupported_reason(q, k, v, dict(varlen, dropout_p=0.1)) is None
    # A learnable sink is folded in the epilogue, packed batches included.
    assert support.fwd_unsupported_reason(q, k, v, dict(varlen, learnable_sink=torch.zeros(4))) is None
    assert "V head dim" in support.fwd_unsupported_reason(q, k, v[..., :64].contiguous(), varlen)
    # Marked GPU-checked, no knob is needed.
    monkeypatch.delenv(support.VARLEN_ENV)
    monkeypatch.setattr(support, "GPU_CHECKED_VARLEN", True)
    assert support.fwd_unsupported_reason(q, k, v, varlen) is None


def test_layouts_tma_cannot_read_fall_back(hopper_everywhere):
    # Head stride 68 elements (136 bytes) is not a multiple of 16 bytes; a transposed view is fine.
    q = torch.randn(1, 16, 2, 68, dtype=torch.bfloat16)[..., :64]
    k = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16).transpose(1, 2)
    assert "TMA" in support.fwd_unsupported_reason(q, k, k, {})
    assert support.fwd_unsupported_reason(k, k, k, {}) is None


def test_ops_dispatch_through_the_table(hopper_everywhere, monkeypatch, seed):
    calls = []

    def fake_gluon(q, k, v, softmax_scale, causal, **options):
        calls.append(causal)
        return torch.zeros_like(q), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    monkeypatch.setattr(hopper, "attn_fwd", fake_gluon)
    q, k, v = _qkv(head_dim=64)
    ops.run_attn_fwd(q, k, v, 0.125, True, "hopper", -1, 0)
    assert calls == [True]
    # An fp16 call with a V head dim other than Q's (and a learnable sink) is not the fast path's: the
    # portable kernels run it (interpreted).
    q, k, v = (t.half() for t in _qkv(head_dim=64))
    v = v[..., :32].contiguous()
    sink = torch.randn(4)
    out, _ = ops.run_attn_fwd(q, k, v, 0.125, False, "hopper", learnable_sink=sink)
    ref, _ = naive.attention(
        q.double(), k.double(), v.double(), softmax_scale=0.125, learnable_sink=sink.double()
    )
    base, _ = naive.attention(q, k, v, softmax_scale=0.125, learnable_sink=sink)
    assert calls == [True]
    assert_matches_oracle("out", out, ref, base, seed=seed)


@pytest.mark.parametrize("gluon_covers", [True, False])
def test_hopper_backward_routes_between_the_gluon_and_the_portable_kernel(monkeypatch, gluon_covers):
    from flashtile.kernels import bwd as portable_bwd
    from flashtile.kernels.hopper import bwd as gluon_bwd

    calls = []
    reason = None if gluon_covers else "sliding windows"
    monkeypatch.setattr(gluon_bwd, "bwd_unsupported_reason", lambda *a: reason)
    monkeypatch.delenv(gluon_bwd.VARIANT_ENV, raising=False)
    # The router checks once and launches the accepted call without checking again.
    monkeypatch.setattr(gluon_bwd, "launch_supported", lambda *a: calls.append(("gluon", a)))
    monkeypatch.setattr(portable_bwd, "attn_bwd", lambda *a, **kw: calls.append(("portable", kw)))
    q, k, v = _qkv()
    hopper.attn_bwd(q, q, k, v, q, None, 0.1, True, window_size=(-1, 0), deterministic=True)
    kind, arguments = calls[0]
    assert kind == ("gluon" if gluon_covers else "portable")
    # deterministic=True reaches the Gluon backward (its second dQ kernel); the portable one is always so.
    if gluon_covers:
        window, deterministic = arguments[7:9]
        assert (window, deterministic) == ((-1, 0), True)
    else:
        assert "deterministic" not in arguments


class _ClaimsCuda(torch.Tensor):
    """A CPU tensor whose ``device`` says CUDA, to reach the Gluon backward's checks past the device."""

    @property
    def device(self) -> torch.device:
        return CUDA


@pytest.mark.parametrize(
    ("options", "head_dim_v", "reason"),
    [
        pytest.param(
            dict(learnable_sink=torch.zeros(4), softcap=5.0),
            None,
            "a learnable sink with softcap",
            id="sink-softcap",
        ),
        pytest.param(
            dict(learnable_sink=torch.zeros(4), deterministic=True),
            None,
            "sink with deterministic",
            id="sink-det",
        ),
        pytest.param(
            dict(
                learnable_sink=torch.zeros(4),
                mods=Mods(BlockMask.from_tiles(torch.ones(1, 1, dtype=torch.bool), 33, 40, 128)),
            ),
            None,
            "a learnable sink with a block mask",
            id="sink-block-mask",
        ),
        pytest.param({}, 64, "V head dim (64) other than Q/K's (128)", id="dv64"),
    ],
)
def test_gluon_backward_declines_what_it_does_not_run(monkeypatch, options, head_dim_v, reason):
    from flashtile.kernels import bwd as portable_bwd
    from flashtile.kernels.hopper import bwd as gluon_bwd

    # A sink is the Gluon backward's at D = 64 (test below) but for these options.
    q, k, v = _qkv(head_dim=128 if head_dim_v else 64, head_dim_v=head_dim_v)
    # The reason lies past the device check: q claims to be on an sm_90 GPU.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    on_gpu = q.as_subclass(_ClaimsCuda)
    assert reason in gluon_bwd.bwd_unsupported_reason(on_gpu, k, v, q, options)
    # The hopper backend's backward then returns the portable launcher's tuple, the sink's gradient too.
    returned = (q, k, v) if head_dim_v else (q, k, v, torch.ones(4))
    monkeypatch.setattr(portable_bwd, "attn_bwd", lambda *a, **kw: returned)
    assert hopper.attn_bwd(q, q, k, v, q, None, 0.1, False, **options) is returned


def test_gluon_backward_takes_a_learnable_sink_at_head_dims_64_96_128(monkeypatch):
    from flashtile.kernels.hopper import bwd as gluon_bwd

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    declined = "the Gluon backward takes it at 64, 96 and 128"
    # Kernel head dims 64 and 128 (96 padded to it), not 256's "dim" split (nor 192 padded to it).
    for head_dim, reason in ((64, None), (128, None), (96, None), (256, declined), (192, declined)):
        q, k, v = _qkv(head_dim=head_dim)
        on_gpu = q.as_subclass(_ClaimsCuda)
        options = dict(learnable_sink=torch.zeros(4), window_size=(-1, 0))
        if head_dim in (64, 128):
            options.update(window_size=(8, 0), dropout_p=0.1)
        got = gluon_bwd.bwd_unsupported_reason(on_gpu, k, v, q, options)
        assert got == reason if reason is None else reason in got, (head_dim, got)


@pytest.mark.parametrize("entry", ["attn_fwd", "attn_bwd"])
def test_every_launcher_takes_every_launcher_keyword(entry):
    # Regression: ops passes mods=None and learnable_sink=None to every launcher; the Gluon forward
    # took neither and raised TypeError on every call the backend routed to it.
    import inspect

    from flashtile.kernels import bwd, fwd
    from flashtile.kernels.hopper import bwd as gluon_bwd
    from flashtile.kernels.hopper import fwd as gluon_fwd
    from flashtile.reference import tiled

    q, k, v = _qkv()
    keywords = ops._options(-1, 0, 0.0, None, 0.0, None, None, None, 0, 0, None, None)
    launchers = {
        "attn_fwd": (fwd.attn_fwd, tiled.attention_fwd, gluon_fwd.attn_fwd),
        "attn_bwd": (bwd.attn_bwd, tiled.attention_bwd, gluon_bwd.attn_bwd),
    }[entry]
    leading = (q, k, v, 0.1, True) if entry == "attn_fwd" else (q, q, k, v, q, None, 0.1, True)
    for launch in launchers:
        inspect.signature(launch).bind(*leading, **keywords)


def test_kernels_without_a_gluon_version_run_portable_under_the_hopper_backend():
    from flashtile import ops_kvcache

    assert ops_kvcache._kernel_family("hopper") == "triton"
    assert ops_kvcache._kernel_family("triton") == "triton"
    assert ops_kvcache._kernel_family("reference") == "reference"
    with pytest.raises(ValueError, match="backend must be one of hopper, triton, reference"):
        ops_kvcache._kernel_family("cuda")


def test_hopper_backward_takes_only_gpu_checked_head_dims_by_default(monkeypatch):
    from flashtile.kernels.hopper import bwd as gluon_bwd

    monkeypatch.delenv(gluon_bwd.VARIANT_ENV, raising=False)
    # Every kernel head dim's default variant has passed the GPU checks (D = 96 and 192 run padded).
    assert all(gluon_bwd.routed_by_default(d) for d in (64, 96, 128, 192, 256))
    monkeypatch.setattr(gluon_bwd, "GPU_CHECKED_HEAD_DIMS", (64, 128))
    assert not gluon_bwd.routed_by_default(256) and not gluon_bwd.routed_by_default(192)
    monkeypatch.setenv(gluon_bwd.VARIANT_ENV, "n64")
    assert gluon_bwd.routed_by_default(256) and gluon_bwd.routed_by_default(192)


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_reaches_the_backward_launcher(monkeypatch, deterministic):
    from flashtile import flash_attn_func

    monkeypatch.setenv(backend.ENV_VAR, "reference")
    seen = []
    real = ops.launcher

    def spy(name, entry, *args):
        launch = real(name, entry, *args)
        if entry != "attn_bwd":
            return launch

        def recorded(*a, **kw):
            seen.append(kw["deterministic"])
            return launch(*a, **kw)

        return recorded

    monkeypatch.setattr(ops, "launcher", spy)
    q, k, v = _qkv(dtype=torch.float32, head_dim=16, requires_grad=True)
    flash_attn_func(q, k, v, causal=True, deterministic=deterministic).sum().backward()
    assert seen == [deterministic]


@pytest.mark.parametrize("checked", [True, False], ids=["options-checked", "options-unchecked"])
@pytest.mark.parametrize(
    ("causal", "window", "passed"),
    [
        (True, (-1, -1), (-1, -1)),
        (True, (-1, 0), (-1, 0)),
        (True, (127, 0), (127, 0)),
        (False, (5, 3), (5, 3)),
    ],
)
def test_hopper_backward_keeps_a_causal_sliding_window(monkeypatch, causal, window, passed, checked):
    # Regression: causal=True replaced the window by (-1, 0), so a causal sliding window (Mistral) ran the
    # Gluon backward as plain causal attention and returned wrong gradients. A window reaches the Gluon
    # backward as given (it applies causal itself), or the portable one where the Gluon one declines it.
    from flashtile.kernels import bwd as portable_bwd
    from flashtile.kernels.hopper import bwd as gluon_bwd

    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv(gluon_bwd.VARIANT_ENV, raising=False)
    monkeypatch.delenv(gluon_bwd.OPTIONS_ENV, raising=False)
    monkeypatch.setattr(gluon_bwd, "GPU_CHECKED_OPTIONS", checked)
    # The Gluon launch gets the window with causal's right side 0 (window_size, the 8th argument).
    monkeypatch.setattr(gluon_bwd, "launch_supported", lambda *a: calls.append(("gluon", a[7])))
    monkeypatch.setattr(
        portable_bwd, "attn_bwd", lambda *a, **kw: calls.append(("portable", kw["window_size"]))
    )
    q, k, v = (t.half().as_subclass(_ClaimsCuda) for t in _qkv(head_dim=64))
    hopper.attn_bwd(q, q, k, v, q, None, 0.1, causal, window_size=window)
    plain = window in ((-1, -1), (-1, 0))
    if checked or plain:
        assert calls == [("gluon", (passed[0], 0) if causal else passed)]
    else:
        assert calls == [("portable", passed)]


def test_gluon_backward_takes_windows_softcap_and_alibi_only_with_the_knob(monkeypatch):
    """Until their GPU cases pass, windows, softcap and ALiBi stay on the portable backward unless
    FLASHTILE_HOPPER_BWD_OPTIONS=1; with it, the "keys" split takes them, the D = 256 kernel and the
    deterministic dQ kernel do not."""
    from flashtile.kernels.hopper import bwd as gluon_bwd

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(gluon_bwd, "GPU_CHECKED_OPTIONS", False)
    q, k, v = _qkv()
    on_gpu = q.as_subclass(_ClaimsCuda)
    slopes = torch.ones(q.shape[2])
    for options in ({"window_size": (8, 0)}, {"softcap": 30.0}, {"alibi_slopes": slopes}):
        monkeypatch.delenv(gluon_bwd.OPTIONS_ENV, raising=False)
        assert gluon_bwd.OPTIONS_ENV in gluon_bwd.bwd_unsupported_reason(on_gpu, k, v, q, options)
        monkeypatch.setenv(gluon_bwd.OPTIONS_ENV, "1")
        assert gluon_bwd.bwd_unsupported_reason(on_gpu, k, v, q, options) is None
        assert "deterministic" in gluon_bwd.bwd_unsupported_reason(
            on_gpu, k, v, q, {**options, "deterministic": True}
        )
        wide = [
            t[..., :1].expand(*t.shape[:-1], 256).contiguous().as_subclass(_ClaimsCuda) for t in (q, k, v)
        ]
        assert "256" in gluon_bwd.bwd_unsupported_reason(*wide, wide[0], options)


def test_gluon_backward_takes_packed_batches_only_with_the_knob(monkeypatch):
    """Until their GPU cases pass, packed (varlen) batches stay on the portable backward unless
    FLASHTILE_HOPPER_BWD_VARLEN=1; with it the "keys" split takes them (windows and all), the D = 256
    kernel and the deterministic dQ kernel do not, and the hopper backend routes them there."""
    from flashtile.kernels import bwd as portable_bwd
    from flashtile.kernels.hopper import bwd as gluon_bwd

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(gluon_bwd, "GPU_CHECKED_VARLEN", False)
    q, k, v = (t[0].half().as_subclass(_ClaimsCuda) for t in _qkv(head_dim=64))
    cu = torch.tensor([0, 3, q.shape[0]], dtype=torch.int32)
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=q.shape[0] - 3, max_seqlen_k=q.shape[0] - 3)
    monkeypatch.delenv(gluon_bwd.VARLEN_ENV, raising=False)
    assert gluon_bwd.VARLEN_ENV in gluon_bwd.bwd_unsupported_reason(q, k, v, q, varlen)
    monkeypatch.setenv(gluon_bwd.VARLEN_ENV, "1")
    for options in ({}, {"window_size": (8, 0), "softcap": 5.0}):
        assert gluon_bwd.bwd_unsupported_reason(q, k, v, q, {**varlen, **options}) is None
    assert "deterministic" in gluon_bwd.bwd_unsupported_reason(q, k, v, q, {**varlen, "deterministic": True})
    wide = [t[..., :1].expand(*t.shape[:-1], 256).contiguous().as_subclass(_ClaimsCuda) for t in (q, k, v)]
    assert "256" in gluon_bwd.bwd_unsupported_reason(*wide, wide[0], varlen)
    dense = q.unsqueeze(0)
    assert "dimensions" in gluon_bwd.bwd_unsupported_reason(dense, dense, dense, dense, varlen)
    calls = []
    monkeypatch.setattr(gluon_bwd, "launch_supported", lambda *a: calls.append("gluon"))
    monkeypatch.setattr(portable_bwd, "attn_bwd", lambda *a, **kw: calls.append("portable"))
    hopper.attn_bwd(q, q, k, v, q, None, 0.1, True, **varlen)
    monkeypatch.delenv(gluon_bwd.VARLEN_ENV)
    hopper.attn_bwd(q, q, k, v, q, None, 0.1, True, **varlen)
    assert calls == ["gluon", "portable"]
