"""The prepared kernel launch (kernels/_launch_cache.py): the arguments it builds, when the opt-in direct
relaunch (FLASHTILE_CACHED_LAUNCH=1) takes over from Triton's launch and when it falls back, and that its
cache signature covers everything Triton 3.6 specialises on, for every launch the launchers build."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from flashtile import flash_attn_func, flash_attn_varlen_func
from flashtile.block_mask import BlockMask
from flashtile.kernels import _launch_cache, bwd, fwd
from flashtile.kernels._launch_cache import ENV_VAR, KernelLaunch
from flashtile.masks import causal as causal_mask_mod
from flashtile.mods import Mods

CPU = torch.device("cpu")


class FakeCompiled:
    """A compiled kernel that records the launches made through its launcher."""

    def __init__(self) -> None:
        self.function = object()
        self.packed_metadata = ("packed",)
        self.launches: list[tuple] = []

    def launch_metadata(self, grid, stream, *args) -> None:
        return None

    def run(self, *args) -> None:
        self.launches.append(args)


class FakeJit:
    """Stands in for a jit function compiled into a kernel (a mask_mod)."""


class FakeKernel:
    """A JIT kernel ``(a_ptr, n, b_ptr, aux, scale, BLOCK)`` whose ``kernel[grid](...)`` records the call."""

    def __init__(self, compiled: FakeCompiled | None) -> None:
        self.arg_names = ["a_ptr", "n", "b_ptr", "aux", "scale", "BLOCK"]
        self.fn = self
        self.__name__ = "fake_kernel"
        self.compiled = compiled
        self.pre_run_hooks: list = []
        self.triton_launches: list[tuple] = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.triton_launches.append((grid, args, kwargs))
            return self.compiled

        return run


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> int:
    """The direct relaunch requested, under Triton 3.6, with a fixed current stream; returns the stream."""
    monkeypatch.setenv(ENV_VAR, "1")
    monkeypatch.setattr(_launch_cache, "current_stream", lambda device_index: 42)
    monkeypatch.setattr(_launch_cache, "ENABLED", True)
    return 42


def _launch(kernel: FakeKernel, n=7, block=64) -> KernelLaunch:
    values = {"n": n, "scale": 0.5, "BLOCK": block}
    return KernelLaunch(kernel, (3, 2), CPU, ("a_ptr", "b_ptr", "aux"), values, {"num_warps": 8})


def _launch_three_times() -> tuple[FakeKernel, FakeCompiled, tuple]:
    compiled = FakeCompiled()
    kernel = FakeKernel(compiled)
    launch = _launch(kernel)
    args = (torch.zeros(8), torch.zeros(8, dtype=torch.int32), (torch.zeros(4),))
    for _ in range(3):
        launch(*args)
    return kernel, compiled, args


def test_launches_go_through_triton_when_the_direct_launch_is_turned_off(monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "0")
    kernel, compiled, (a, b, aux) = _launch_three_times()
    assert not compiled.launches
    # Every parameter in order: pointers between the fixed values; launch options as keywords.
    assert kernel.triton_launches == [((3, 2), (a, 7, b, aux, 0.5, 64), {"num_warps": 8})] * 3


def test_the_direct_launch_is_the_default(direct: int, monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    kernel, compiled, _ = _launch_three_times()
    # The first call compiles through Triton; the next two call the compiled kernel.
    assert len(kernel.triton_launches) == 1 and len(compiled.launches) == 2


def test_second_launch_calls_the_compiled_kernel_with_every_argument_in_parameter_order(direct: int) -> None:
    compiled = FakeCompiled()
    kernel = FakeKernel(compiled)
    launch = _launch(kernel)
    a, b, aux = torch.zeros(8), torch.zeros(8, dtype=torch.int32), (torch.zeros(4),)
    launch(a, b, aux)
    assert len(kernel.triton_launches) == 1 and not compiled.launches
    a2, b2, aux2 = torch.ones(8), torch.ones(8, dtype=torch.int32), (torch.ones(4),)
    launch(a2, b2, aux2)
    assert len(kernel.triton_launches) == 1
    (args,) = compiled.launches
    assert args[:7] == (3, 2, 1, direct, compiled.function, ("packed",), None)
    # The hooks (args[7:9]) are Triton's; then a_ptr, n, b_ptr, aux, scale, BLOCK, without num_warps.
    assert args[9] is a2 and args[11] is b2 and args[12] is aux2
    assert args[9:] == (a2, 7, b2, aux2, 0.5, 64)


def test_a_new_pointer_signature_launches_through_triton_first(direct: int) -> None:
    compiled = FakeCompiled()
    kernel = FakeKernel(compiled)
    launch = _launch(kernel)
    storage = torch.zeros(64, dtype=torch.float16)
    aligned, misaligned = storage[:8], storage[1:9]
    fp64 = torch.zeros(8, dtype=torch.float64)
    signatures = [
        (aligned, None, None),
        (misaligned, None, None),
        (fp64, None, None),
        (aligned, aligned, None),
        (aligned, None, (aligned,)),
        (aligned, None, (misaligned,)),
        (aligned, None, (aligned, aligned)),
    ]
    for pointers in signatures:
        launch(*pointers)
    assert len(kernel.triton_launches) == len(signatures) and not compiled.launches
    for pointers in signatures:
        launch(*pointers)
    assert len(kernel.triton_launches) == len(signatures)
    assert len(compiled.launches) == len(signatures)


@pytest.mark.parametrize(
    "case", ["interpreter", "pre_run_hook", "numpy_scalar", "jit_function", "triton_version"]
)
def test_launches_that_never_skip_triton(direct: int, monkeypatch, case: str) -> None:
    compiled = None if case == "interpreter" else FakeCompiled()
    kernel = FakeKernel(compiled)
    if case == "pre_run_hook":
        kernel.pre_run_hooks.append(lambda *args, **kwargs: None)
    if case == "triton_version":
        monkeypatch.setattr(_launch_cache, "ENABLED", False)
    n = np.int64(7) if case == "numpy_scalar" else 7
    launch = _launch(kernel, n=n, block=FakeJit() if case == "jit_function" else 64)
    for _ in range(3):
        launch(torch.zeros(8), None, None)
    assert len(kernel.triton_launches) == 3
    assert compiled is None or not compiled.launches


@pytest.mark.parametrize(
    "pointers, values",
    [
        (("a_ptr", "b_ptr"), {"n": 1, "scale": 0.5, "BLOCK": 64}),
        (("a_ptr", "b_ptr", "aux"), {"n": 1, "scale": 0.5, "BLOCK": 64, "num_warps": 4}),
        (("b_ptr", "a_ptr", "aux"), {"n": 1, "scale": 0.5, "BLOCK": 64}),
    ],
    ids=["missing", "unknown", "out-of-order"],
)
def test_a_launch_must_name_each_parameter_once_in_order(pointers, values) -> None:
    with pytest.raises(ValueError, match="fake_kernel"):
        KernelLaunch(FakeKernel(None), (1,), CPU, pointers, values, {})


def test_calls_share_one_prepared_launch_per_signature_mods_included(seed: int) -> None:
    """A block mask's lists are per-call tensors; a mask_mod is part of the signature and keeps the
    launch on Triton's path (which checks the function's globals at each launch)."""
    q, k, v = (torch.randn(1, 64, 2, 16, dtype=torch.float16) for _ in range(3))
    fwd._fwd_launch.cache_clear()
    states = torch.tensor([[[[2, 0], [1, 2]]]], dtype=torch.int8)
    for _ in range(2):
        fwd.attn_fwd(q, k, v, 0.25, False, mods=Mods(BlockMask.from_states(states, 64, 64, 32)))
    for _ in range(2):
        fwd.attn_fwd(
            q, k, v, 0.25, False, mods=Mods(BlockMask.from_states(states, 64, 64, 32), causal_mask_mod)
        )
    info = fwd._fwd_launch.cache_info()
    assert (info.currsize, info.hits) == (2, 2)


def test_packed_batches_of_nearby_longest_lengths_share_one_prepared_launch(seed: int) -> None:
    """Training packs rows whose longest document changes every step: the grid is cut from max_seqlen
    rounded up (kernels._layout.grid_seqlen), so nearby lengths reuse the forward's and backward's
    launches, and each result still equals the sequences run one by one."""
    heads, head_dim, total = 2, 16, 160
    q, k, v, dout = (torch.randn(total, heads, head_dim, dtype=torch.float16) for _ in range(4))
    fwd._fwd_launch.cache_clear(), bwd._bwd_launches.cache_clear()
    results = {}
    for longest in (100, 120):
        cu = torch.tensor([0, longest, total], dtype=torch.int32)
        varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
        out, lse = fwd.attn_fwd(q, k, v, 0.25, True, window_size=(-1, 0), **varlen)
        grads = bwd.attn_bwd(dout, q, k, v, out, lse, 0.25, True, window_size=(-1, 0), **varlen)
        results[longest] = out, grads
    prepared = fwd._fwd_launch.cache_info(), bwd._bwd_launches.cache_info()
    assert [(info.currsize, info.hits) for info in prepared] == [(1, 1), (1, 1)]
    for longest, (out, grads) in results.items():
        for rows in (slice(0, longest), slice(longest, total)):
            one_out, one_lse = fwd.attn_fwd(q[None, rows], k[None, rows], v[None, rows], 0.25, True)
            assert torch.equal(one_out[0], out[rows]), (longest, rows, seed)
            one_grads = bwd.attn_bwd(
                dout[None, rows], q[None, rows], k[None, rows], v[None, rows], one_out, one_lse, 0.25, True
            )
            for name, one, packed in zip(("dq", "dk", "dv"), one_grads, grads, strict=True):
                assert torch.equal(one[0], packed[rows]), (name, longest, rows, seed)


# Runs without the interpreter, so that the kernels are JITFunctions with Triton's binder (for sm_90).
# JITFunction.run runs for real up to the compiled kernel's launcher, which records its arguments
# (compilation is skipped: a recording stand-in is cached in its place).
_FAKE_SM90 = textwrap.dedent(
    """
    import os

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from flashtile.block_mask import BlockMask
    from flashtile.kernels import _launch_cache, bwd, fwd
    from flashtile.kernels._launch_cache import ENV_VAR, KernelLaunch
    from flashtile.kernels.hopper import bwd as hopper_bwd
    from flashtile.kernels.hopper import fwd as hopper_fwd
    from flashtile.kernels.hopper.descriptors import CheckedDescriptor
    from flashtile.block_mask import create_block_mask
    from flashtile.masks import causal as causal_mask_mod
    from flashtile.masks import document, document_ids
    from flashtile.mods import Mods

    TARGET = GPUTarget("cuda", 90, 32)
    BACKEND = make_backend(TARGET)
    LAUNCHES, PREPARED, TRITON_RUNS, COMPILES = [], [], [], []


    class Driver:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device):
            return 7

        def get_current_target(self):
            return TARGET


    class Compiled:
        function = 1
        packed_metadata = ()

        def __init__(self, name):
            self.name = name

        def launch_metadata(self, grid, stream, *args):
            return None

        def run(self, *args):
            LAUNCHES.append((self.name, args))


    def compile_stand_in(self, key, signature, device, constexprs, options, attrs, warmup):
        COMPILES.append(self.fn.__name__)
        kernel = Compiled(self.fn.__name__)
        self.device_caches[device][0][key] = kernel
        return kernel


    triton_run = JITFunction.run


    def counted_run(self, *args, **kwargs):
        TRITON_RUNS.append(self.fn.__name__)
        return triton_run(self, *args, **kwargs)


    launch_call = KernelLaunch.__call__


    def recorded_call(self, *pointers):
        PREPARED.append((self, pointers))
        return launch_call(self, *pointers)


    driver.set_active(Driver())
    JITFunction._do_compile = compile_stand_in
    JITFunction.run = counted_run
    KernelLaunch.__call__ = recorded_call


    def packed_row(rng, total):
        # A training row: documents of random lengths packed back to back (1 to 16 of them); its varlen
        # keywords and its number of documents.
        bounds = [0, *sorted(rng.sample(range(1, total), rng.randrange(16))), total]
        cu = torch.tensor(bounds, dtype=torch.int32)
        longest = max(b - a for a, b in zip(bounds, bounds[1:]))
        varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
        return varlen, len(bounds) - 1
    """
)

_LAUNCHER_CHECK = _FAKE_SM90 + textwrap.dedent(
    """


    def normalised(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", value.dtype, tuple(value.shape), value.stride())
        if isinstance(value, CheckedDescriptor):
            return ("descriptor", normalised(value.base), value.shape, value.strides, value.block_shape)
        if isinstance(value, tuple):
            return tuple(normalised(v) for v in value)
        return value


    def run(call, env):
        os.environ[ENV_VAR] = env
        LAUNCHES.clear(), PREPARED.clear(), TRITON_RUNS.clear()
        call()
        return [normalised(launch) for launch in LAUNCHES], len(TRITON_RUNS), list(PREPARED)


    def tensor_at(like, offset):
        # A tensor like ``like`` at ``offset`` bytes past a 16-byte boundary.
        size = like.numel() * like.element_size()
        raw = torch.zeros(size + 64, dtype=torch.uint8)
        start = (-raw.data_ptr()) % 16 + offset
        return raw[start : start + size].view(like.dtype).view(like.shape)


    def spec(launch, pointers):
        kernel = launch.kernel
        binder = create_function_from_signature(kernel.signature, kernel.params, BACKEND)
        args = launch.arguments(pointers)
        bound, specialization, options = binder(
            *args, **launch.options, debug=False, instrumentation_mode=""
        )
        # The direct launch passes ``args``; Triton passes what it bound.
        values = list(bound.values())
        assert len(values) == len(args) == len(kernel.arg_names), kernel
        assert all(a is b for a, b in zip(values, args)), kernel
        return str(specialization) + str(options)


    def moved(pointers):
        # Every tensor pointer (also inside a tuple) in turn, at each alignment; a descriptor's base at
        # another 16-byte aligned address (TMA reads no other).
        for i, p in enumerate(pointers):
            if isinstance(p, CheckedDescriptor):
                base = tensor_at(p.base, 16)
                new = CheckedDescriptor(base, p.shape, p.strides, p.block_shape, p.layout)
                yield pointers[:i] + (new,) + pointers[i + 1 :]
                continue
            parts = p if isinstance(p, tuple) else (p,)
            for j, t in enumerate(parts):
                if t is None:
                    continue
                es = t.element_size()
                for offset in (0, 16, es, 16 + es):
                    new = list(parts)
                    new[j] = tensor_at(t, offset)
                    pointer = tuple(new) if isinstance(p, tuple) else new[0]
                    yield pointers[:i] + (pointer,) + pointers[i + 1 :]


    def check_signatures(prepared):
        for launch, pointers in prepared:
            seen = {}
            for variant in moved(pointers):
                key = tuple(_launch_cache._pointer_signature(p) for p in variant)
                # One cache signature, one Triton specialisation.
                assert seen.setdefault(key, spec(launch, variant)) == spec(launch, variant), launch.kernel


    B, N, H, H_KV = 2, 40, 4, 2


    def inputs(n=N, d=64, dv=None, varlen=False, heads_kv=H_KV):
        def make(heads, dim):
            shape = (B * n, heads, dim) if varlen else (B, n, heads, dim)
            return torch.randn(shape, dtype=torch.float16)

        return make(H, d), make(heads_kv, d), make(heads_kv, dv or d)


    def call_of(q, k, v, causal=False, **options):
        def call():
            out, lse = fwd.attn_fwd(q, k, v, 0.125, causal, **options)
            bwd.attn_bwd(torch.randn_like(out), q, k, v, out, lse, 0.125, causal, **options)

        return call


    def hopper_call_of(q, k, v, causal=False, deterministic=False, **fwd_options):
        # The backward gets the forward's window, softcap, ALiBi slopes and mods (the fused kernel's options).
        def call():
            out, lse = hopper_fwd.attn_fwd(q, k, v, 0.125, causal, **fwd_options)
            dout = torch.randn_like(out)
            window = fwd_options.get("window_size", (-1, 0) if causal else (-1, -1))
            softcap, slopes = fwd_options.get("softcap", 0.0), fwd_options.get("alibi_slopes")
            hopper_bwd._launch(
                dout, q, k, v, out, lse, 0.125, causal, deterministic, window, softcap, slopes, None,
                fwd_options.get("mods"),
            )  # fmt: skip

        return call


    def hopper_varlen_call_of(q, k, v, causal=False, **fwd_options):
        # The Gluon forward's packed batches; their backward is the portable one (hopper.attn_bwd).
        def call():
            out, lse = hopper_fwd.attn_fwd(q, k, v, 0.125, causal, **fwd_options)
            options = {n: fwd_options[n] for n in fwd_options if n.startswith(("cu_", "max_"))}
            bwd.attn_bwd(torch.randn_like(out), q, k, v, out, lse, 0.125, causal, **options)

        return call


    cu = torch.tensor([0, 13, 2 * N], dtype=torch.int32)
    tiles = torch.tensor([[True, False], [True, True]])
    block_mask = BlockMask.from_tiles(tiles, N, N, 32)
    aux = (torch.zeros(N, dtype=torch.int32), torch.zeros(3, dtype=torch.float32))
    # Blocks of 128 for the Gluon kernels: a document mask (its bits when the aux tensors are its own).
    doc_ids = (document_ids(torch.tensor([0, 17, N])),)
    doc_mask = create_block_mask(document(), None, None, N, N, 128, "cpu", doc_ids)
    sink = torch.randn(H)
    cases = {
        "dense": call_of(*inputs()),
        "causal-gqa-d59": call_of(*inputs(d=59), causal=True),
        "seqlen-1": call_of(*inputs(n=1)),
        "window-softcap-alibi-dropout": call_of(
            *inputs(), window_size=(5, 3), softcap=30.0, alibi_slopes=torch.rand(B, H), dropout_p=0.1,
            rng_state=torch.tensor([1, 2], dtype=torch.int64),
        ),
        "varlen": call_of(
            *inputs(varlen=True), causal=True, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2 * N - 13,
            max_seqlen_k=2 * N - 13,
        ),
        "block-sparse": call_of(*inputs(), mods=Mods(block_mask)),
        "block-sparse-aux": call_of(*inputs(), mods=Mods(block_mask, aux_tensors=aux)),
        "sink": call_of(*inputs(), causal=True, learnable_sink=sink),
        "v-dim-96-40": call_of(*inputs(d=96, dv=40)),
        "block-sparse-sink-v-dim": call_of(*inputs(d=64, dv=32), mods=Mods(block_mask), learnable_sink=sink),
        "mask-mod": call_of(*inputs(), mods=Mods(block_mask, causal_mask_mod)),
        "hopper-dense-d64": hopper_call_of(*inputs()),
        "hopper-causal-gqa-d128-deterministic": hopper_call_of(
            *inputs(d=128), causal=True, deterministic=True
        ),
        "hopper-seqlen-1-d256": hopper_call_of(*inputs(n=1, d=256)),
        "hopper-window-softcap-alibi": hopper_call_of(
            *inputs(d=128), window_size=(5, 3), softcap=30.0, alibi_slopes=torch.rand(B, H)
        ),
        "hopper-varlen": hopper_varlen_call_of(
            *inputs(d=128, varlen=True), causal=True, window_size=(-1, 0), cu_seqlens_q=cu,
            cu_seqlens_k=cu, max_seqlen_q=2 * N - 13, max_seqlen_k=2 * N - 13,
        ),
        "hopper-block-sparse-d128": hopper_call_of(
            *inputs(d=128), mods=Mods(BlockMask.from_tiles(torch.ones(1, 1, dtype=torch.bool), N, N, 128))
        ),
        "hopper-mask-bits": hopper_call_of(*inputs(), mods=Mods(doc_mask, aux_tensors=doc_ids)),
        "hopper-mask-mod": hopper_call_of(*inputs(), causal=True, mods=Mods(doc_mask, causal_mask_mod)),
        "hopper-varlen-window-softcap-alibi-d64": hopper_varlen_call_of(
            *inputs(varlen=True), window_size=(5, 3), softcap=30.0, alibi_slopes=torch.rand(B, H),
            cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=2 * N - 13, max_seqlen_k=2 * N - 13,
        ),
    }
    for name, call in cases.items():
        # Launches shared with an earlier case would already hold their compiled kernels.
        fwd._fwd_launch.cache_clear(), bwd._bwd_launches.cache_clear()
        hopper_fwd._fwd_launch.cache_clear(), hopper_bwd._bwd_launches.cache_clear()
        through_triton, triton_runs, prepared = run(call, "0")
        assert triton_runs == len(through_triton) == 4, (name, triton_runs, len(through_triton))
        check_signatures(prepared)
        first, first_runs, _ = run(call, "1")
        assert first == through_triton and first_runs == 4, name
        direct, direct_runs, _ = run(call, "1")
        # The compiled kernels get the arguments Triton gives them, without Triton; but the mask_mod's
        # forward, dK/dV and dQ (the preprocess takes no mods), whose globals Triton checks at each launch.
        assert direct == through_triton, name
        # The Gluon backward's dQ leaves by the postprocess: there a mask_mod enters two launches.
        assert direct_runs == {"mask-mod": 3, "hopper-mask-mod": 2}.get(name, 0), (name, direct_runs)
    print("ok")
    """
)


def _run_sm90_check(script: str) -> None:
    """Run a fake-sm_90 check script (compiled kernels, Triton's binder) in a fresh process; it prints ok."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_launchers_pass_the_compiled_kernels_what_triton_does() -> None:
    """Every launch the launchers build (dense, causal GQA with a padded head dim, seqlen 1, window +
    softcap + ALiBi + dropout, varlen, block-sparse with and without aux tensors, sinks, V head dims, a
    mask_mod that takes the fallback, and the Gluon forward and backward with their TMA descriptors): with
    FLASHTILE_CACHED_LAUNCH=1 the second call hands each compiled kernel exactly the arguments Triton's
    launch gave it, without Triton; and, under Triton's binder for sm_90, pointers with one cache
    signature get one specialisation, whichever pointer moves."""
    _run_sm90_check(_LAUNCHER_CHECK)


_PACKED_TRAINING_CHECK = _FAKE_SM90 + textwrap.dedent(
    """
    import random

    from flashtile.kernels import configs

    # An H100's SMs and the Hopper tiling of D = 64, so that the dK/dV kernel's GQA split is decided as
    # there (launches are recorded, not run: the tensors' contents do not matter).
    configs.multiprocessor_count = lambda device: 132
    fwd_config = configs.FwdConfig(128, 128, 4, 3)
    bwd_config = configs.BwdConfig(64, 128, 4, 3, 128, 64, 4, 3)
    rng = random.Random(0)
    total, heads, heads_kv, head_dim = 8192, 8, 2, 64
    q = torch.randn(total, heads, head_dim, dtype=torch.float16)
    k, v = (torch.randn(total, heads_kv, head_dim, dtype=torch.float16) for _ in range(2))
    first = None
    for step in range(60):
        varlen, documents = packed_row(rng, total)
        out, lse = fwd.attn_fwd(q, k, v, 0.125, True, window_size=(-1, 0), config=fwd_config, **varlen)
        bwd.attn_bwd(
            torch.randn_like(out), q, k, v, out, lse, 0.125, True, window_size=(-1, 0), config=bwd_config,
            **varlen,
        )
        if first is None:
            first = list(COMPILES)
        assert COMPILES == first, (step, documents, COMPILES[len(first):])
    print("ok")
    """
)


_HOPPER_PACKED_TRAINING_CHECK = _FAKE_SM90 + textwrap.dedent(
    """
    import random

    # The Gluon forward on packed rows (causal, GQA 8/2, D = 128, then a window with softcap and ALiBi):
    # the number of documents, the longest and the window's clamps change at every step, the compiled
    # kernel does not.
    rng = random.Random(0)
    total, heads, heads_kv, head_dim = 8192, 8, 2, 128
    q = torch.randn(total, heads, head_dim, dtype=torch.bfloat16)
    k, v = (torch.randn(total, heads_kv, head_dim, dtype=torch.bfloat16) for _ in range(2))
    slopes = torch.rand(heads)
    windowed = dict(window_size=(100, 7), softcap=30.0, alibi_slopes=slopes)
    for options in (dict(causal=True, window_size=(-1, 0)), windowed):
        first = None
        for step in range(40):
            varlen, documents = packed_row(rng, total)
            causal = options.get("causal", False)
            rest = {n: o for n, o in options.items() if n != "causal"}
            hopper_fwd.attn_fwd(q, k, v, 0.125, causal, **rest, **varlen)
            if first is None:
                first = list(COMPILES)
            assert COMPILES == first, (step, documents, COMPILES[len(first):])
        assert COMPILES.count("attn_fwd_kernel") >= 1
        COMPILES.clear()
    print("ok")
    """
)


_HOPPER_BWD_PACKED_TRAINING_CHECK = _FAKE_SM90 + textwrap.dedent(
    """
    import random

    # The Gluon backward on packed rows (causal, GQA 8/2, D = 64, then a window with softcap and ALiBi at
    # D = 128): the number of documents, the longest and the window's clamps change at every step, the
    # compiled kernels do not.
    rng = random.Random(0)
    total, heads, heads_kv = 8192, 8, 2
    for head_dim, options in ((64, ((-1, 0), 0.0, None)), (128, ((100, 7), 30.0, torch.rand(heads)))):
        q = torch.randn(total, heads, head_dim, dtype=torch.bfloat16)
        k, v = (torch.randn(total, heads_kv, head_dim, dtype=torch.bfloat16) for _ in range(2))
        out, lse = torch.randn_like(q), torch.randn(heads, total)
        first = None
        for step in range(40):
            varlen, documents = packed_row(rng, total)
            packed = tuple(varlen.values())
            causal = options[0] == (-1, 0)
            args = (torch.randn_like(q), q, k, v, out, lse, 0.125, causal, False, *options, packed)
            grads = hopper_bwd._launch(*args)
            assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
            if first is None:
                first = list(COMPILES)
            assert COMPILES == first, (step, documents, COMPILES[len(first):])
        assert COMPILES.count("attn_bwd_kernel") == 1, COMPILES
        COMPILES.clear()
    print("ok")
    """
)


def test_gluon_varlen_backward_packed_training_compiles_once() -> None:
    """The Gluon backward's packed batches (FLASHTILE_HOPPER_BWD_VARLEN): forty packed rows of 8192 tokens,
    under Triton's binder for sm_90, compile its three kernels at the first row only."""
    _run_sm90_check(_HOPPER_BWD_PACKED_TRAINING_CHECK)


def test_gluon_varlen_packed_training_compiles_once() -> None:
    """The Gluon forward's packed batches (FLASHTILE_HOPPER_FWD_VARLEN): forty packed rows of 8192 tokens,
    under Triton's binder for sm_90, compile its kernel at the first row only."""
    _run_sm90_check(_HOPPER_PACKED_TRAINING_CHECK)


def test_packed_training_compiles_each_kernel_once() -> None:
    """Varlen training changes the longest sequence and the number of sequences every step: under
    Triton's binder for sm_90, sixty packed rows of 8192 tokens (causal, GQA 8/2, D = 64) compile the
    forward's and backward's kernels at the first row only (a compilation mid-run costs seconds)."""
    _run_sm90_check(_PACKED_TRAINING_CHECK)


def _fwd_bwd(call, tensors, dout):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    results = call(*leaves)
    grads = torch.autograd.grad(results, leaves, dout)
    return (results, *grads)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        "dense",
        "causal-gqa-d59",
        "seqlen-1",
        "window-softcap-alibi-dropout",
        "varlen",
        "block-sparse",
        "sink",
        "v-dim-192-128",
        "mask-mod",
        "hopper-causal-gqa-deterministic",
    ],
)
def test_direct_launch_is_bitwise_equal_to_tritons(case: str, seed: int, monkeypatch) -> None:
    """The portable kernels, and the Gluon ones (deterministic: the fused backward adds dQ by atomics),
    without FLASHTILE_CACHED_LAUNCH (checked against the oracle by the GPU suite) and with it, on its
    first call (through Triton) and its second (direct): the same bits."""
    hopper = case.startswith("hopper")
    if hopper and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernels run on compute capability 9.x only")
    monkeypatch.setenv("FLASHTILE_BACKEND", "hopper" if hopper else "triton")
    direct_launches = []
    compiled_call = _launch_cache._Compiled.__call__

    def counted(self, *args):
        direct_launches.append((self.needs_scratch, self.tensor_maps is not None))
        return compiled_call(self, *args)

    monkeypatch.setattr(_launch_cache._Compiled, "__call__", counted)
    dev, dtype = "cuda", torch.bfloat16
    batch, seqlen, heads, heads_kv, head_dim, head_dim_v = 2, 203, 4, 4, 64, 64
    kwargs: dict = {}
    if case == "causal-gqa-d59":
        heads_kv, head_dim, head_dim_v, kwargs = 2, 59, 59, {"causal": True}
    elif case == "seqlen-1":
        seqlen = 1
    elif case == "window-softcap-alibi-dropout":
        slopes = torch.rand(heads, device=dev)
        kwargs = {"window_size": (31, 7), "softcap": 20.0, "alibi_slopes": slopes, "dropout_p": 0.1}
    elif case == "block-sparse":
        tiles = torch.rand(4, 4, device=dev) < 0.6
        kwargs = {"block_mask": BlockMask.from_tiles(tiles, seqlen, seqlen, 64)}
    elif case == "sink":
        kwargs = {"causal": True, "learnable_sink": torch.randn(heads, device=dev)}
    elif case == "v-dim-192-128":
        head_dim, head_dim_v = 192, 128
    elif case == "mask-mod":
        kwargs = {"mask_mod": causal_mask_mod}
    elif hopper:
        heads_kv, head_dim, head_dim_v = 2, 128, 128
        kwargs = {"causal": True, "deterministic": True}
    q = torch.randn(batch, seqlen, heads, head_dim, device=dev, dtype=dtype)
    k = torch.randn(batch, seqlen, heads_kv, head_dim, device=dev, dtype=dtype)
    v = torch.randn(batch, seqlen, heads_kv, head_dim_v, device=dev, dtype=dtype)
    dout = torch.randn(batch, seqlen, heads, head_dim_v, device=dev, dtype=dtype)
    if case == "varlen":
        lengths = torch.tensor([0, 70, 203, 2 * seqlen], device=dev, dtype=torch.int32)
        q, k, v, dout = (t.reshape(batch * seqlen, *t.shape[2:]) for t in (q, k, v, dout))

        def call(q, k, v):
            return flash_attn_varlen_func(q, k, v, lengths, lengths, 203, 203, causal=True)

    else:

        def call(q, k, v):
            return flash_attn_func(q, k, v, **kwargs)

    def run(env: str, tensors=(q, k, v)):
        monkeypatch.setenv(ENV_VAR, env)
        # Dropout draws its seed from the generator: the same seed gives the same mask every time.
        torch.manual_seed(seed)
        return _fwd_bwd(call, tensors, dout)

    through_triton = run("0")
    assert not direct_launches
    first, second = run("1"), run("1")
    # Each of the four launches of the second call, but for the mask_mod's three (only the preprocess).
    expected = 1 if case == "mask-mod" else 4
    assert len(direct_launches) == expected, f"{case}: {len(direct_launches)} direct launches, not {expected}"
    if hopper:
        # The Gluon kernels take host-side descriptors: no scratch, so they launch without run_on_device,
        # and the fused backward and forward take their tensor maps from the cache (kernels/_tensor_maps.py).
        assert not any(scratch for scratch, _ in direct_launches), f"{case}: a kernel asks for scratch"
        assert sum(maps for _, maps in direct_launches) >= 2, f"{case}: {direct_launches}"
    # New addresses for q, k and v: the cached tensor maps must not be reused for them.
    moved = run("1", tuple(t.clone() for t in (q, k, v)))
    for name, a, b, c, d in zip(("out", "dq", "dk", "dv"), through_triton, first, second, moved, strict=True):
        assert torch.equal(a, b), f"{case}: {name} of the first launch with {ENV_VAR}=1 differs"
        assert torch.equal(a, c), f"{case}: {name} of the direct launch differs from Triton's launch"
        assert torch.equal(a, d), f"{case}: {name} with q, k, v at new addresses differs"
