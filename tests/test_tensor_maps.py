"""The cached TMA tensor maps of the direct relaunch (kernels/_tensor_maps.py): the C launcher receives what
Triton 3.6's own descriptor wrapper gives it, and a map is encoded once per (address, shape, strides,
padding). CPU: the driver's encoder is a recording stand-in; the GPU test in test_launch_cache.py checks
the results bitwise against Triton's launch."""

from __future__ import annotations

import pytest
import torch
import triton
from triton.backends.nvidia import driver as nvidia_driver

from flashtile.kernels import _launch_cache
from flashtile.kernels._tensor_maps import MAX_MAPS, TensorMapLauncher, tensor_map_launcher
from flashtile.kernels.hopper.descriptors import descriptor

# A kernel (q_desc, n, out_ptr, k_desc) and the metadata Triton's compiler records for its two descriptors.
SIGNATURE = {
    "q_desc": "tensordesc<bf16[64, 64]>",
    "n": "i32",
    "out_ptr": "*fp32",
    "k_desc": "tensordesc<bf16[128, 64]>",
}
METAS = [
    {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [64, 64], "fp4_padded": False},
    {"swizzle": 3, "elem_size": 2, "elem_type": 9, "block_size": [128, 64], "fp4_padded": False},
]
BASE = (1, 2, 3, 42, "function", False, False, None, None, ("packed",), None, "enter", "exit")


class Encoder:
    """The driver's ``fill_tma_descriptor``: a distinct map per call, every call counted."""

    def __init__(self) -> None:
        self.calls = 0

    def fill_tma_descriptor(self, *args):
        self.calls += 1
        block, shape, strides = (tuple(a) for a in args[4:7])
        return ("map", self.calls, *args[:4], block, shape, strides, args[7])


class Driver:
    def __init__(self) -> None:
        self.utils = Encoder()


@pytest.fixture
def encoder(monkeypatch: pytest.MonkeyPatch) -> Encoder:
    driver = Driver()
    monkeypatch.setattr(triton.runtime.driver, "_active", driver)
    return driver.utils


def _wrapped() -> tuple[list, object]:
    """Triton's wrapper around a C launcher that records its calls: (the calls, the wrapper)."""
    calls: list = []
    return calls, nvidia_driver.wrap_handle_tensordesc(lambda *a: calls.append(a), SIGNATURE, METAS)


def _args(q: torch.Tensor, k: torch.Tensor, out: torch.Tensor, q_row_stride: int | None = None) -> tuple:
    seqlen = q.shape[0]
    return (
        descriptor(q, (seqlen, 64), (q_row_stride or q.stride(0), 1), (64, 64)),
        seqlen,
        out,
        descriptor(k, (seqlen, 64), (k.stride(0), 1), (128, 64)),
    )


def _tensors(seqlen: int = 300) -> tuple[torch.Tensor, ...]:
    dtypes = (torch.bfloat16, torch.bfloat16, torch.float32)
    return tuple(torch.randn(seqlen, 64, dtype=dtype) for dtype in dtypes)


def test_the_c_launcher_gets_what_tritons_wrapper_gives_it(encoder: Encoder) -> None:
    triton_calls, wrapper = _wrapped()
    ours = tensor_map_launcher(type("Run", (), {"launch": staticmethod(wrapper)})())
    assert ours is not None
    q, k, out = _tensors()
    wrapper(*BASE, *_args(q, k, out))
    ours(BASE, _args(q, k, out))
    assert len(triton_calls) == 2
    through_triton, through_ours = triton_calls
    # The maps differ only in the encoder's call count; everything else, and every other argument, matches.
    assert len(through_triton) == len(through_ours)
    for a, b in zip(through_triton, through_ours, strict=True):
        if type(a) is tuple and a and a[0] == "map":
            assert a[2:] == b[2:]
        else:
            assert a is b or a == b


def test_a_map_is_encoded_once_per_address_shape_strides_and_padding(encoder: Encoder) -> None:
    calls: list = []
    ours = TensorMapLauncher(lambda *a: calls.append(a), dict(zip((0, 3), METAS, strict=True)))
    q, k, out = _tensors()
    for _ in range(3):
        ours(BASE, _args(q, k, out))
    assert encoder.calls == 2, "the same descriptors were encoded again"
    assert calls[0] == calls[1] == calls[2]
    ours(BASE, _args(q.clone(), k, out))
    assert encoder.calls == 3, "a new address reused the old map"
    # The same address and shape, every other row: only the strides differ.
    ours(BASE, _args(q, k, out, q_row_stride=2 * q.stride(0)))
    assert encoder.calls == 4, "new strides reused the old map"
    ours(BASE, _args(q[:200], k[:200], out))
    assert encoder.calls == 6, "a new shape reused the old map"
    nan_padded = _args(q, k, out)
    nan_padded[0].padding = "nan"
    ours(BASE, nan_padded)
    assert encoder.calls == 7, "another padding reused the old map"
    assert calls[-1][len(BASE)][-1] == 1, "the encoder did not get the NaN padding"


def test_the_cache_starts_over_when_full_and_stays_right(encoder: Encoder) -> None:
    calls: list = []
    ours = TensorMapLauncher(lambda *a: calls.append(a), dict(zip((0, 3), METAS, strict=True)))
    _, k, out = _tensors()
    queries = [torch.randn(300, 64, dtype=torch.bfloat16) for _ in range(MAX_MAPS + 5)]
    for q in queries:
        ours(BASE, _args(q, k, out))
    assert len(ours._maps) <= MAX_MAPS
    ours(BASE, _args(queries[0], k, out))
    assert calls[-1][len(BASE)][2] == queries[0].data_ptr()


def test_launchers_without_descriptor_metadata_are_left_to_triton(encoder: Encoder) -> None:
    plain = nvidia_driver.wrap_handle_tensordesc(lambda *a: None, {"n": "i32"}, None)
    unspecified = nvidia_driver.wrap_handle_tensordesc(lambda *a: None, SIGNATURE, None)
    for launch in (plain, unspecified, print):
        assert tensor_map_launcher(type("Run", (), {"launch": staticmethod(launch)})()) is None
    assert tensor_map_launcher(object()) is None


class _Compiled:
    """A compiled Gluon kernel as Triton 3.6 returns it: its run is a CudaLauncher-like object."""

    function = "function"
    packed_metadata = ("packed",)

    metadata = type("Metadata", (), {"global_scratch_size": 0, "profile_scratch_size": 0})

    def __init__(self, launch) -> None:
        self.run = type("CudaLauncher", (), {"launch": staticmethod(launch)})()
        self.run.launch_cooperative_grid, self.run.launch_pdl = False, True

    def launch_metadata(self, grid, stream, *args) -> None:
        return None


def test_the_direct_relaunch_expands_descriptors_from_the_cache(encoder: Encoder, monkeypatch) -> None:
    monkeypatch.setattr(_launch_cache, "current_stream", lambda device_index: 42)
    calls, wrapper = _wrapped()
    entry = _launch_cache._Compiled(_Compiled(wrapper))
    assert isinstance(entry.tensor_maps, TensorMapLauncher)
    q, k, out = _tensors()
    for _ in range(2):
        entry((1, 2), torch.device("cpu"), _args(q, k, out))
    assert encoder.calls == 2
    hooks = (triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook)
    head = (1, 2, 1, 42, "function", False, True, None, None, ("packed",), None, *hooks)
    assert calls[0][: len(head)] == head and calls[0] == calls[1]
