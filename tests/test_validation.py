"""Bad arguments raise the right exception, naming the argument and what was received, before any launch."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from flashtile import backend as flashtile_backend
from flashtile import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    validation,
)
from flashtile.errors import FlashtileTypeError, FlashtileValueError
from flashtile.reference import naive, tiled


def _qkv(
    batch: int = 2,
    seqlen_q: int = 5,
    seqlen_k: int = 7,
    nheads: int = 4,
    nheads_kv: int = 2,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(batch, seqlen_q, nheads, head_dim, dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_kv, head_dim, dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_kv, head_dim, dtype=dtype)
    return q, k, v


def _raises(exc: type[Exception], fn, *fragments: str) -> str:
    """Run ``fn``, expect ``exc``, and check that its message contains every fragment; return the message.

    Every error is also a RuntimeError, which code written against flash_attn's C++ checks catches.
    """
    with pytest.raises(exc) as info:
        fn()
    assert isinstance(info.value, RuntimeError), f"{type(info.value).__name__} is not a RuntimeError"
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from the message: {message}"
    return message


@pytest.fixture
def no_launch(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace every backend by one that records its calls: a validation error must come before any launch."""
    calls: list[str] = []

    def record(name: str):
        def launch(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} launched although validation should have failed")

        return launch

    monkeypatch.setattr(tiled, "attention_fwd", record("reference fwd"))
    monkeypatch.setattr(tiled, "attention_bwd", record("reference bwd"))
    monkeypatch.setattr(importlib.import_module("flashtile.kernels.fwd"), "attn_fwd", record("triton fwd"))
    return calls


def test_q_not_a_tensor(no_launch: list[str]) -> None:
    _, k, v = _qkv()
    _raises(TypeError, lambda: flash_attn_func([[1.0]], k, v), "q must be a torch.Tensor", "list")
    assert no_launch == []


def test_unsupported_dtype_lists_supported_ones(no_launch: list[str]) -> None:
    q, k, v = (t.to(torch.int32) for t in _qkv())
    _raises(
        TypeError,
        lambda: flash_attn_func(q, k, v),
        "q.dtype is torch.int32",
        "torch.float16, torch.bfloat16, torch.float32, torch.float64",
    )
    assert no_launch == []


def test_triton_backend_rejects_float64_and_lists_its_dtypes(
    monkeypatch: pytest.MonkeyPatch, no_launch: list[str]
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    q, k, v = _qkv(dtype=torch.float64)
    _raises(
        TypeError,
        lambda: flash_attn_func(q, k, v),
        "q.dtype is torch.float64",
        "triton backend",
        "accepted: torch.float16, torch.float32",
        "FLASHTILE_BACKEND=reference",
    )
    assert no_launch == []


def test_triton_on_cuda_accepts_only_half_precision() -> None:
    assert validation.supported_dtypes("triton", torch.device("cuda")) == (torch.float16, torch.bfloat16)
    assert torch.float64 in validation.supported_dtypes("reference", torch.device("cuda"))


def test_qkv_dtype_mismatch(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(
        TypeError,
        lambda: flash_attn_func(q, k.half(), v),
        "same dtype",
        "q torch.float32",
        "k torch.float16",
        "v torch.float32",
    )
    assert no_launch == []


def test_devices_differ(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(ValueError, lambda: flash_attn_func(q, k.to("meta"), v), "same device", "q on cpu", "k on meta")
    assert no_launch == []


def test_triton_on_cpu_without_interpreter(monkeypatch: pytest.MonkeyPatch, no_launch: list[str]) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = _qkv()
    _raises(ValueError, lambda: flash_attn_func(q, k, v), "FLASHTILE_BACKEND=triton", "TRITON_INTERPRET")
    assert no_launch == []


def test_unknown_backend_lists_accepted_values(monkeypatch: pytest.MonkeyPatch, no_launch: list[str]) -> None:
    monkeypatch.setenv("FLASHTILE_BACKEND", "cudnn")
    q, k, v = _qkv()
    _raises(
        ValueError,
        lambda: flash_attn_func(q, k, v),
        "FLASHTILE_BACKEND='cudnn'",
        "auto, hopper, triton, reference",
    )
    assert no_launch == []


def test_backend_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLASHTILE_BACKEND", raising=False)
    assert flashtile_backend.resolve(torch.device("cpu")) == "reference"
    assert flashtile_backend.resolve(torch.device("cuda")) == "triton"
    monkeypatch.setenv("FLASHTILE_BACKEND", "reference")
    assert flashtile_backend.resolve(torch.device("cuda")) == "reference"
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert flashtile_backend.resolve(torch.device("cpu")) == "triton"
    assert flashtile_backend.available_backends(torch.device("cpu")) == ["triton", "reference"]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert flashtile_backend.available_backends(torch.device("cpu")) == ["reference"]


def test_wrong_rank(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(
        ValueError,
        lambda: flash_attn_func(q[0], k, v),
        "q must have 4 dimensions",
        "(batch_size, seqlen_q, nheads, headdim)",
        "(5, 4, 16)",
    )
    assert no_launch == []


def test_batch_mismatch_shows_all_shapes(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(
        ValueError,
        lambda: flash_attn_func(q, k[:1], v[:1]),
        "batch_size",
        "q (2, 5, 4, 16), k (1, 7, 2, 16), v (1, 7, 2, 16)",
    )
    assert no_launch == []


def test_head_dim_mismatch_shows_all_shapes(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(
        ValueError,
        lambda: flash_attn_func(q, k[..., :8], v[..., :8]),
        "headdim",
        "q (2, 5, 4, 16), k (2, 7, 2, 8), v (2, 7, 2, 8)",
    )
    assert no_launch == []


def test_seqlen_k_differs_between_k_and_v(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(
        ValueError, lambda: flash_attn_func(q, k, v[:, :6]), "seqlen_k", "k (2, 7, 2, 16), v (2, 6, 2, 16)"
    )
    assert no_launch == []


def test_nheads_kv_differs_between_k_and_v(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(ValueError, lambda: flash_attn_func(q, k, v[:, :, :1]), "nheads_k", "v (2, 7, 1, 16)")
    assert no_launch == []


def test_nheads_not_a_multiple_of_nheads_kv(no_launch: list[str]) -> None:
    q, k, v = _qkv(nheads=4, nheads_kv=3)
    _raises(ValueError, lambda: flash_attn_func(q, k, v), "nheads of q (4)", "nheads_k of k and v (3)")
    assert no_launch == []


def test_zero_heads(no_launch: list[str]) -> None:
    q, k, v = _qkv(nheads=0, nheads_kv=0)
    _raises(ValueError, lambda: flash_attn_func(q, k, v), "at least 1", "q (2, 5, 0, 16)")
    assert no_launch == []


@pytest.mark.parametrize("head_dim", [0, 577], ids=lambda d: f"D{d}")
def test_head_dim_out_of_range(head_dim: int, no_launch: list[str]) -> None:
    q, k, v = _qkv(head_dim=head_dim, nheads_kv=4)
    _raises(ValueError, lambda: flash_attn_func(q, k, v), "headdim", "[1, 576]", f"not {head_dim}")
    assert no_launch == []


@pytest.mark.parametrize("head_dim_v", [0, 513], ids=lambda d: f"Dv{d}")
def test_v_head_dim_out_of_range(head_dim_v: int, no_launch: list[str]) -> None:
    q, k, v = _qkv(head_dim=64, nheads_kv=4)
    v = torch.randn(*v.shape[:-1], head_dim_v)
    _raises(ValueError, lambda: flash_attn_func(q, k, v), "headdim of v", "[1, 512]", f"not {head_dim_v}")
    assert no_launch == []


def test_non_unit_last_stride_is_copied_and_correct() -> None:
    q, k, v = _qkv(head_dim=8)
    # Every other element of a doubled last dimension: stride(-1) == 2.
    strided = [torch.stack((t, torch.zeros_like(t)), dim=-1).flatten(-2)[..., ::2] for t in (q, k, v)]
    assert all(t.stride(-1) == 2 for t in strided)
    torch.testing.assert_close(flash_attn_func(*strided), flash_attn_func(q, k, v), rtol=0, atol=0)


def test_softmax_scale_none_is_one_over_sqrt_head_dim() -> None:
    q, k, v = _qkv(head_dim=16)
    torch.testing.assert_close(
        flash_attn_func(q, k, v), flash_attn_func(q, k, v, softmax_scale=1 / math.sqrt(16)), rtol=0, atol=0
    )
    assert validation.check_softmax_scale(None, 64) == 0.125


@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf], ids=str)
def test_softmax_scale_non_finite(scale: float, no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(ValueError, lambda: flash_attn_func(q, k, v, softmax_scale=scale), "softmax_scale", str(scale))
    assert no_launch == []


def test_softmax_scale_not_a_number(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(TypeError, lambda: flash_attn_func(q, k, v, softmax_scale="0.5"), "softmax_scale", "'0.5'")
    assert no_launch == []


@pytest.mark.parametrize("dropout_p", [-0.1, 1.0, 1.5, math.nan], ids=str)
def test_dropout_p_outside_unit_interval(dropout_p: float, no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(ValueError, lambda: flash_attn_func(q, k, v, dropout_p=dropout_p), "dropout_p", str(dropout_p))
    assert no_launch == []


def test_dropout_p_not_a_number(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(TypeError, lambda: flash_attn_func(q, k, v, dropout_p="0.1"), "dropout_p", "'0.1'", "[0, 1)")
    assert no_launch == []


@pytest.mark.parametrize(
    ("window_size", "causal", "expected"),
    [
        ((-1, -1), False, (-1, -1)),
        ((-1, -1), True, (-1, 0)),
        ((-1, 0), False, (-1, 0)),
        ((-5, -2), False, (-1, -1)),
        ((7, 100), False, (-1, -1)),
        ((7, 3), True, (-1, 0)),
        ((3, 6), False, (3, 6)),
        ((3, 7), True, (3, 0)),
        ((0, 0), False, (0, 0)),
    ],
    ids=str,
)
def test_normalize_window(window_size, causal: bool, expected: tuple[int, int]) -> None:
    # seqlen_k = 7: negative bounds and bounds ≥ 7 are unlimited (-1), causal sets right = 0.
    assert validation.normalize_window(window_size, causal, 7) == expected


@pytest.mark.parametrize(
    "window_size",
    [
        [-1, 9],
        (np.int64(-1), np.int32(-1)),
        np.array([-1, 7]),
        torch.tensor([-1, -1]),
        (torch.tensor(-1), torch.tensor(20)),
        torch.randint(7, 50, (2,)),
    ],
    ids=["list", "numpy-ints", "numpy-array", "tensor", "0d-tensors", "randint"],
)
def test_window_size_accepts_integer_pairs_of_any_kind(window_size) -> None:
    # flash_attn's own tests pass torch.randint(0, seqlen_k, (2,)); each of these covers every key.
    q, k, v = _qkv()
    for causal in (False, True):
        torch.testing.assert_close(
            flash_attn_func(q, k, v, causal=causal, window_size=window_size),
            flash_attn_func(q, k, v, causal=causal),
            rtol=0,
            atol=0,
        )


@pytest.mark.parametrize("window_size", [(-1, 0), (-3, 0), (100, 0), [-1, np.int64(0)]], ids=str)
def test_window_with_right_zero_is_causal(window_size) -> None:
    # flash_attn's visibility j ≤ i + seqlen_k − seqlen_q + right makes (-1, 0) causal, causal=True or not.
    q, k, v = _qkv()
    expected = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(flash_attn_func(q, k, v, window_size=window_size), expected, rtol=0, atol=0)


@pytest.mark.parametrize("window_size", [(4, 0), (0, -1), [2, 2], (-1, 6), torch.tensor([3, 3])], ids=str)
def test_window_sizes_run_and_match_naive(window_size) -> None:
    q, k, v = _qkv(dtype=torch.float64)
    expected, _ = naive.attention(q, k, v, window_size=validation.normalize_window(window_size, False, 7))
    torch.testing.assert_close(flash_attn_func(q, k, v, window_size=window_size), expected)


@pytest.mark.parametrize(
    "window_size",
    [(1,), (1.5, 2), (True, -1), "ab", torch.tensor([1.0, 2.0]), np.zeros((2, 2), dtype=int), None],
    ids=str,
)
def test_window_size_malformed(window_size, no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(TypeError, lambda: flash_attn_func(q, k, v, window_size=window_size), "window_size")
    assert no_launch == []


@pytest.mark.parametrize("softcap", [0.0, 0, -1.0, -30], ids=str)
def test_softcap_not_positive_disables(softcap: float) -> None:
    # flash_attn: "Anything > 0 activates softcapping"; 0 and negative values leave it off.
    q, k, v = _qkv()
    torch.testing.assert_close(
        flash_attn_func(q, k, v, softcap=softcap), flash_attn_func(q, k, v), rtol=0, atol=0
    )


@pytest.mark.parametrize("softcap", [math.nan, math.inf, -math.inf], ids=str)
def test_softcap_non_finite(softcap: float, no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(ValueError, lambda: flash_attn_func(q, k, v, softcap=softcap), "softcap", str(softcap))
    assert no_launch == []


def test_softcap_and_alibi_run_and_match_naive() -> None:
    q, k, v = _qkv(dtype=torch.float64)
    slopes = torch.rand(4, dtype=torch.float32)
    expected, _ = naive.attention(q, k, v, softcap=3.0, alibi_slopes=slopes)
    torch.testing.assert_close(flash_attn_func(q, k, v, softcap=3.0, alibi_slopes=slopes), expected)


@pytest.mark.parametrize(
    ("slopes", "error", "fragments"),
    [
        (torch.ones(4, dtype=torch.float16), TypeError, ["dtype torch.float16", "float32"]),
        (torch.ones(4, dtype=torch.float64), TypeError, ["dtype torch.float64", "float32"]),
        (torch.ones(3), ValueError, ["shape (3,)", "(4,) or (2, 4)"]),
        (torch.ones(3, 4), ValueError, ["shape (3, 4)", "(4,) or (2, 4)"]),
        (torch.ones(2, 4, 1), ValueError, ["shape (2, 4, 1)"]),
        ([0.5] * 4, TypeError, ["[0.5, 0.5, 0.5, 0.5]", "float32 tensor"]),
        (torch.ones(4, device="meta"), ValueError, ["on meta", "on cpu"]),
    ],
    ids=["fp16", "fp64", "wrong-heads", "wrong-batch", "rank-3", "list", "other-device"],
)
def test_alibi_slopes_rejected(
    slopes, error: type[Exception], fragments: list[str], no_launch: list[str]
) -> None:
    q, k, v = _qkv()
    _raises(error, lambda: flash_attn_func(q, k, v, alibi_slopes=slopes), "alibi_slopes", *fragments)
    assert no_launch == []


def test_alibi_slopes_non_contiguous_are_copied() -> None:
    q, k, v = _qkv(dtype=torch.float64)
    slopes = torch.rand(4, 2, dtype=torch.float32).t()
    expected, _ = naive.attention(q, k, v, alibi_slopes=slopes)
    torch.testing.assert_close(flash_attn_func(q, k, v, alibi_slopes=slopes), expected)


def _varlen(total_q: int = 9, total_k: int = 11, nheads: int = 4, nheads_kv: int = 2):
    q = torch.randn(total_q, nheads, 16)
    k = torch.randn(total_k, nheads_kv, 16)
    v = torch.randn(total_k, nheads_kv, 16)
    cu_q = torch.tensor([0, 4, 4, total_q], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 8, total_k], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize(
    ("change", "error", "fragments"),
    [
        (dict(cu_seqlens_q=torch.tensor([0, 4, 4, 9])), TypeError, ["cu_seqlens_q", "torch.int64", "int32"]),
        (dict(cu_seqlens_k=[0, 3, 8, 11]), TypeError, ["cu_seqlens_k", "[0, 3, 8, 11]"]),
        (
            dict(cu_seqlens_q=torch.zeros(2, 4, dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_q", "1-D", "shape (2, 4)"],
        ),
        (
            dict(cu_seqlens_q=torch.tensor([0, 0, 4, 4, 4, 9, 9], dtype=torch.int32)[::2]),
            ValueError,
            ["cu_seqlens_q", "contiguous", "strides (2,)"],
        ),
        (
            dict(cu_seqlens_k=torch.tensor([0, 11], dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_q and cu_seqlens_k", "same length", "4 and 2"],
        ),
        (
            dict(cu_seqlens_q=torch.tensor([1, 4, 4, 9], dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_q must start at 0", "= 1"],
        ),
        (
            dict(cu_seqlens_k=torch.tensor([0, 8, 3, 11], dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_k must be non-decreasing", "[0, 8, 3, 11]"],
        ),
        (
            dict(cu_seqlens_q=torch.tensor([0, 4, 4, 8], dtype=torch.int32)),
            ValueError,
            ["cu_seqlens_q must end at", "9", "= 8"],
        ),
        (dict(max_seqlen_q=4), ValueError, ["max_seqlen_q", "longest sequence", "5", "got 4"]),
        (dict(max_seqlen_k=-1), ValueError, ["max_seqlen_k", "integer ≥ 0", "-1"]),
        (dict(max_seqlen_k=5.0), ValueError, ["max_seqlen_k", "5.0"]),
        (dict(cu_seqlens_q=torch.zeros(4, dtype=torch.int32, device="meta")), ValueError, ["on meta"]),
    ],
    ids=[
        "int64", "list", "2-D", "strided", "lengths-differ", "not-from-0", "decreasing", "wrong-total",
        "max-too-small", "max-negative", "max-float", "other-device",
    ],
)  # fmt: skip
def test_varlen_bad_cu_seqlens(
    change: dict, error: type[Exception], fragments: list[str], no_launch: list[str]
) -> None:
    q, k, v, cu_q, cu_k = _varlen()
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=5) | change
    _raises(error, lambda: flash_attn_varlen_func(q, k, v, **args), *fragments)
    assert no_launch == []


def test_varlen_qkvpacked_names_its_arguments(no_launch: list[str]) -> None:
    qkv = torch.randn(9, 3, 2, 16)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    _raises(ValueError, lambda: flash_attn_varlen_qkvpacked_func(qkv, cu, 4), "max_seqlen ", "got 4")
    _raises(ValueError, lambda: flash_attn_varlen_qkvpacked_func(qkv, cu[:-1], 5), "cu_seqlens must end")
    _raises(ValueError, lambda: flash_attn_varlen_qkvpacked_func(qkv[:, :2], cu, 5), "qkv", "3 at dim 1")
    assert no_launch == []


def test_varlen_shapes_checked(no_launch: list[str]) -> None:
    q, k, v, cu_q, cu_k = _varlen()
    _raises(
        ValueError,
        lambda: flash_attn_varlen_func(q[None], k, v, cu_q, cu_k, 5, 5),
        "(total_q, nheads, headdim)",
    )
    _raises(ValueError, lambda: flash_attn_varlen_func(q, k, v[:-1], cu_q, cu_k, 5, 5), "total_k (dim 0)")
    kv = torch.randn(11, 3, 2, 16)
    _raises(ValueError, lambda: flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 5, 5), "kv", "2 at dim 1")
    assert no_launch == []


def test_varlen_alibi_batch_is_the_number_of_sequences(no_launch: list[str]) -> None:
    q, k, v, cu_q, cu_k = _varlen()
    slopes = torch.ones(2, 4)
    _raises(
        ValueError, lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, alibi_slopes=slopes), "(3, 4)"
    )
    assert no_launch == []


def test_varlen_block_table_needs_a_paged_cache(no_launch: list[str]) -> None:
    q, k, v, cu_q, cu_k = _varlen()
    table = torch.zeros(3, 1, dtype=torch.int32)
    _raises(
        ValueError,
        lambda: flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, block_table=table),
        "k must have 4 dimensions (num_pages, page_size, nheads_k, headdim)",
    )
    assert no_launch == []


def test_varlen_values_on_cuda_checked_only_in_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    # No CUDA here: check the switch on the CPU, where the values are always checked.
    monkeypatch.delenv(validation.DEBUG_ENV_VAR, raising=False)
    assert not validation._debug()
    monkeypatch.setenv(validation.DEBUG_ENV_VAR, "1")
    assert validation._debug()


@pytest.mark.parametrize("flag", ["causal", "deterministic", "return_attn_probs"])
def test_flags_must_be_bool(flag: str, no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(TypeError, lambda: flash_attn_func(q, k, v, **{flag: 1}), flag, "got 1 (int)")
    _raises(TypeError, lambda: flash_attn_func(q, k, v, **{flag: torch.ones(2, dtype=torch.bool)}), flag)
    assert no_launch == []


@pytest.mark.parametrize("make", [np.bool_, lambda b: torch.tensor(b)], ids=["numpy", "tensor"])
def test_flags_accept_numpy_and_tensor_bools(make) -> None:
    q, k, v = _qkv()
    plain = flash_attn_func(q, k, v, causal=True, deterministic=True, return_attn_probs=True)
    flags = {"causal": make(True), "deterministic": make(False), "return_attn_probs": make(True)}
    ours = flash_attn_func(q, k, v, **flags)
    assert isinstance(ours, tuple) and len(ours) == 3
    torch.testing.assert_close(ours[:2], plain[:2], rtol=0, atol=0)
    torch.testing.assert_close(flash_attn_func(q, k, v, causal=make(False)), flash_attn_func(q, k, v))


@pytest.mark.parametrize(
    ("error", "python_class"), [(FlashtileValueError, ValueError), (FlashtileTypeError, TypeError)]
)
def test_errors_are_also_runtime_errors(error: type[Exception], python_class: type[Exception]) -> None:
    assert issubclass(error, python_class) and issubclass(error, RuntimeError)
    assert issubclass(NotImplementedError, RuntimeError)


def test_deterministic_accepted_and_bitwise_reproducible() -> None:
    q, k, v = (t.requires_grad_() for t in _qkv())
    grads = []
    for _ in range(3):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out.sum(), (q, k, v)))
    for other in grads[1:]:
        for a, b in zip(grads[0], other, strict=True):
            assert torch.equal(a, b)


def test_qkvpacked_wrong_packing(no_launch: list[str]) -> None:
    qkv = torch.randn(2, 5, 2, 4, 16)
    _raises(
        ValueError,
        lambda: flash_attn_qkvpacked_func(qkv),
        "qkv",
        "(batch_size, seqlen, 3, nheads, headdim)",
        "(2, 5, 2, 4, 16)",
    )
    _raises(ValueError, lambda: flash_attn_qkvpacked_func(qkv[:, :, 0]), "qkv must have 5 dimensions")
    assert no_launch == []


def test_qkvpacked_head_dim_names_the_packed_tensor(no_launch: list[str]) -> None:
    qkv = torch.randn(1, 3, 3, 2, 600)
    _raises(ValueError, lambda: flash_attn_qkvpacked_func(qkv), "headdim", "not 600", "qkv (1, 3, 3, 2, 600)")
    assert no_launch == []


def test_kvpacked_wrong_packing(no_launch: list[str]) -> None:
    q = torch.randn(2, 5, 4, 16)
    kv = torch.randn(2, 7, 3, 2, 16)
    _raises(
        ValueError,
        lambda: flash_attn_kvpacked_func(q, kv),
        "kv",
        "(batch_size, seqlen_k, 2, nheads_k, headdim)",
        "(2, 7, 3, 2, 16)",
    )
    _raises(ValueError, lambda: flash_attn_kvpacked_func(q, kv[:, :, 0]), "kv must have 5 dimensions")
    assert no_launch == []


def test_kvpacked_gqa_mismatch_names_kv(no_launch: list[str]) -> None:
    q = torch.randn(2, 5, 4, 16)
    kv = torch.randn(2, 7, 2, 3, 16)
    _raises(ValueError, lambda: flash_attn_kvpacked_func(q, kv), "nheads of q (4)", "kv (2, 7, 2, 3, 16)")
    assert no_launch == []


def test_kvpacked_dtype_mismatch_names_kv(no_launch: list[str]) -> None:
    q = torch.randn(2, 5, 4, 16)
    kv = torch.randn(2, 7, 2, 2, 16, dtype=torch.float64)
    _raises(TypeError, lambda: flash_attn_kvpacked_func(q, kv), "q torch.float32", "kv torch.float64")
    assert no_launch == []


def test_sparse_tensor_rejected(no_launch: list[str]) -> None:
    q, k, v = _qkv()
    _raises(TypeError, lambda: flash_attn_func(q.to_sparse(), k, v), "q must be a dense", "sparse")
    assert no_launch == []


def test_valid_call_matches_naive() -> None:
    q, k, v = _qkv()
    out = flash_attn_func(q, k, v, causal=True)
    expected, _ = naive.attention(q.double(), k.double(), v.double(), causal=True)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_triton_interpreter_rejects_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression: bf16 through Triton's CPU interpreter gave gradients up to 4.7x the reference's error.
    monkeypatch.setenv("FLASHTILE_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"bfloat16.*float16, torch.float32"):
        flash_attn_func(q, q, q)
