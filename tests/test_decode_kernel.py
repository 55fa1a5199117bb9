"""The split-KV decode kernel and the combine kernel against the float64 oracle under the 2× rule.

Each sequence's valid keys (cache slots ``[leftpad, seqlen)``, through ``cache_batch_idx`` or the block
table) are gathered into a contiguous cache and attended by ``reference.naive``; every other slot and every
unused page holds NaN, so a key read that should not happen fails the check. On the CPU the kernels run in
Triton's interpreter (fp16/fp32, tiny shapes); ``pytest -m gpu`` runs the larger grid in fp16 and bf16.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch

from flashtile.kernels import configs, decode
from flashtile.kernels.combine import attn_combine
from flashtile.kernels.decode import MIN_TILES_PER_SPLIT, decode_fwd, num_splits_heuristic
from flashtile.reference import naive
from tests.helpers import assert_matches_oracle

NAN = float("nan")


@dataclass(frozen=True)
class DecodeCase:
    """One decode step: ``seqlens`` are the valid slots of each sequence (cache_seqlens), ``leftpad`` its
    first valid slot; ``page_size`` None is a contiguous cache."""

    seqlens: tuple[int, ...]
    seqlen_q: int = 1
    heads: int = 4
    heads_kv: int = 1
    head_dim: int = 32
    page_size: int | None = None
    leftpad: tuple[int, ...] | None = None
    batch_idx: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    num_splits: int = 0
    dtype: torch.dtype = torch.float16
    device: str = "cpu"

    @property
    def id(self) -> str:
        parts = [
            self.device,
            "paged" + str(self.page_size) if self.page_size else "contiguous",
            "k" + ",".join(map(str, self.seqlens)),
            f"q{self.seqlen_q}",
            f"h{self.heads}-{self.heads_kv}",
            f"d{self.head_dim}",
            f"splits{self.num_splits or 'auto'}",
        ]
        parts += ["leftpad"] if self.leftpad else []
        parts += ["batchidx"] if self.batch_idx else []
        parts += [f"w{self.window[0]},{self.window[1]}"] if self.window != (-1, -1) else []
        parts += [f"cap{self.softcap}"] if self.softcap else []
        parts += ["alibi"] if self.alibi else []
        return "-".join([*parts, str(self.dtype).removeprefix("torch.")])


@dataclass
class DecodeInputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_seqlens: torch.Tensor
    block_table: torch.Tensor | None
    cache_batch_idx: torch.Tensor | None
    cache_leftpad: torch.Tensor | None
    alibi_slopes: torch.Tensor | None
    # Each sequence's cache as the kernel should see it: (B, capacity, H_KV, D), NaN outside the valid slots.
    k_seq: torch.Tensor
    v_seq: torch.Tensor


def make_inputs(case: DecodeCase) -> DecodeInputs:
    """Random q and caches for ``case``, every slot and page the kernel must not read filled with NaN."""
    dtype, device = case.dtype, torch.device(case.device)
    batch = len(case.seqlens)
    longest = max(case.seqlens, default=0)
    page = case.page_size or 1
    # Room past the longest sequence, so that unused slots exist in every layout.
    capacity = (longest + 20 + page - 1) // page * page
    shape = (batch, capacity, case.heads_kv, case.head_dim)
    k_seq = torch.randn(shape, device=device).to(dtype)
    v_seq = torch.randn(shape, device=device).to(dtype)
    leftpad = case.leftpad or (0,) * batch
    slots = torch.arange(capacity, device=device)
    for b, (start, stop) in enumerate(zip(leftpad, case.seqlens, strict=True)):
        unused = (slots < start) | (slots >= stop)
        k_seq[b, unused] = NAN
        v_seq[b, unused] = NAN
    block_table = batch_idx = None
    if case.page_size:
        pages_per_seq = capacity // page
        # Spare pages that no table entry names, all NaN, between the used ones.
        num_pages = batch * pages_per_seq + 3
        order = torch.randperm(num_pages, device=device)[: batch * pages_per_seq]
        block_table = order.view(batch, pages_per_seq).to(torch.int32)
        k_cache = torch.full((num_pages, page, case.heads_kv, case.head_dim), NAN, dtype=dtype, device=device)
        v_cache = torch.full_like(k_cache, NAN)
        k_cache[order.long()] = k_seq.reshape(batch * pages_per_seq, page, case.heads_kv, case.head_dim)
        v_cache[order.long()] = v_seq.reshape(batch * pages_per_seq, page, case.heads_kv, case.head_dim)
    elif case.batch_idx:
        rows = batch + 2
        batch_idx = torch.randperm(rows, device=device)[:batch].to(torch.int32)
        k_cache = torch.full((rows, *shape[1:]), NAN, dtype=dtype, device=device)
        v_cache = torch.full_like(k_cache, NAN)
        k_cache[batch_idx.long()] = k_seq
        v_cache[batch_idx.long()] = v_seq
    else:
        k_cache, v_cache = k_seq, v_seq
    return DecodeInputs(
        q=torch.randn(batch, case.seqlen_q, case.heads, case.head_dim, device=device).to(dtype),
        k_cache=k_cache,
        v_cache=v_cache,
        cache_seqlens=torch.tensor(case.seqlens, dtype=torch.int32, device=device),
        block_table=block_table,
        cache_batch_idx=batch_idx,
        cache_leftpad=torch.tensor(leftpad, dtype=torch.int32, device=device) if case.leftpad else None,
        alibi_slopes=torch.rand(batch, case.heads, device=device) * 0.3 if case.alibi else None,
        k_seq=k_seq,
        v_seq=v_seq,
    )


def gathered_reference(
    case: DecodeCase, inputs: DecodeInputs, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Naive attention of each sequence over its valid keys, gathered contiguous, in ``dtype``."""
    leftpad = case.leftpad or (0,) * len(case.seqlens)
    outs, lses = [], []
    for b, (start, stop) in enumerate(zip(leftpad, case.seqlens, strict=True)):
        slopes = None if inputs.alibi_slopes is None else inputs.alibi_slopes[b]
        out, lse = naive.attention(
            inputs.q[b : b + 1].to(dtype),
            inputs.k_seq[b : b + 1, start:stop].to(dtype),
            inputs.v_seq[b : b + 1, start:stop].to(dtype),
            softmax_scale=case.head_dim**-0.5,
            window_size=case.window,
            softcap=case.softcap,
            alibi_slopes=slopes,
        )
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


def run_decode(case: DecodeCase, inputs: DecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return decode_fwd(
        inputs.q,
        inputs.k_cache,
        inputs.v_cache,
        inputs.cache_seqlens,
        softmax_scale=case.head_dim**-0.5,
        block_table=inputs.block_table,
        cache_batch_idx=inputs.cache_batch_idx,
        cache_leftpad=inputs.cache_leftpad,
        window_size=case.window,
        softcap=case.softcap,
        alibi_slopes=inputs.alibi_slopes,
        num_splits=case.num_splits,
    )


def check_case(case: DecodeCase, seed: int) -> None:
    inputs = make_inputs(case)
    out, lse = run_decode(case, inputs)
    out64, lse64 = gathered_reference(case, inputs, torch.float64)
    out_low, lse_low = gathered_reference(case, inputs, case.dtype)
    assert_matches_oracle("out", out, out64, out_low, seed=seed)
    assert_matches_oracle("lse", lse, lse64, lse_low, seed=seed)


CPU_CASES = [
    DecodeCase((0, 37, 100), num_splits=1),
    DecodeCase((77, 9), seqlen_q=4, heads=2, heads_kv=2, num_splits=3, dtype=torch.float32),
    DecodeCase((150,), heads=8, page_size=16),
    DecodeCase((70, 130), seqlen_q=4, page_size=64, leftpad=(5, 64), window=(-1, 0), num_splits=3),
    DecodeCase((200, 3), heads=2, heads_kv=2, page_size=256, num_splits=3),
    DecodeCase((90, 50), 2, batch_idx=True, leftpad=(17, 0), window=(5, 0), alibi=True, num_splits=3),
    DecodeCase((61, 120), seqlen_q=4, heads=4, heads_kv=2, page_size=16, softcap=2.0, alibi=True),
    DecodeCase((45,), seqlen_q=3, window=(7, 2), num_splits=2),
    DecodeCase((33, 0), head_dim=64, heads=4, heads_kv=4, page_size=16, num_splits=3),
    DecodeCase((40,), seqlen_q=8, heads=8, heads_kv=1, num_splits=2, dtype=torch.float32),
]


def _gpu_cases():
    dtypes = itertools.cycle((torch.float16, torch.bfloat16))
    splits = itertools.cycle((1, 3, 0))
    lengths = (0, 1, 777, 4099)
    for page, (heads, heads_kv), seqlen_q in itertools.product(
        (None, 16, 64, 256), ((32, 32), (32, 8), (32, 4)), (1, 4)
    ):
        yield DecodeCase(
            lengths, seqlen_q, heads, heads_kv, 128, page, num_splits=next(splits), dtype=next(dtypes),
            device="cuda",
        )  # fmt: skip
    for head_dim, dtype in itertools.product((64, 256), (torch.float16, torch.bfloat16)):
        yield DecodeCase((1000, 513), 4, 16, 4, head_dim, 64, device="cuda", dtype=dtype)
    options = (
        dict(leftpad=(0, 0, 300, 4000)),
        dict(batch_idx=True, leftpad=(0, 1, 100, 3)),
        dict(window=(-1, 0)),
        dict(window=(256, 0), page_size=16),
        dict(window=(100, 3), page_size=64),
        dict(softcap=30.0, page_size=256),
        dict(alibi=True, window=(-1, 0), page_size=64),
        dict(softcap=10.0, alibi=True),
    )
    for extra, seqlen_q, dtype in itertools.product(options, (1, 4), (torch.float16, torch.bfloat16)):
        case = DecodeCase(lengths, seqlen_q, 32, 8, 128, num_splits=next(splits), dtype=dtype, device="cuda")
        yield DecodeCase(**{**case.__dict__, **extra})
    yield DecodeCase((131072, 5), 1, 32, 8, 128, 256, dtype=torch.bfloat16, device="cuda")


def _params(cases, marks=()):
    return [pytest.param(c, id=c.id, marks=marks) for c in cases]


@pytest.mark.parametrize("case", [*_params(CPU_CASES), *_params(_gpu_cases(), marks=(pytest.mark.gpu,))])
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_decode_matches_oracle(case: DecodeCase, seed: int) -> None:
    check_case(case, seed)


def _each_kernel_cases():
    """Shapes that reach each of the TMA kernel's tilings (16, 32 and 64 packed rows, two row blocks; pages
    smaller than a key tile, equal and larger, the smaller at D = 64 in whole rows and at D = 128 and 256
    a column block at a time; D = 64, 128 and 256) and its options."""
    lengths = (0, 1, 777, 4099)
    cuda = dict(device="cuda", dtype=torch.bfloat16)
    yield DecodeCase(lengths, 1, 32, 32, 128, num_splits=0, **cuda)
    yield DecodeCase(lengths, 4, 32, 4, 128, num_splits=3, **cuda)
    yield DecodeCase(lengths, 4, 64, 4, 128, 64, num_splits=0, **cuda)
    yield DecodeCase(lengths, 16, 32, 4, 128, num_splits=1, window=(-1, 0), **cuda)
    yield DecodeCase(lengths, 1, 32, 8, 64, 16, window=(100, 3), num_splits=0, **cuda)
    yield DecodeCase(lengths, 4, 32, 8, 128, 16, window=(-1, 0), num_splits=3, **cuda)
    yield DecodeCase(lengths, 1, 16, 4, 256, 16, softcap=30.0, num_splits=0, **cuda)
    yield DecodeCase(lengths, 2, 16, 4, 64, 32, softcap=30.0, alibi=True, num_splits=3, **cuda)
    yield DecodeCase(lengths, 4, 16, 4, 256, 256, window=(-1, 0), num_splits=0, **cuda)
    yield DecodeCase(lengths, 1, 32, 8, 128, batch_idx=True, leftpad=(0, 1, 100, 3), window=(50, 0), **cuda)
    yield DecodeCase((131072, 5), 1, 32, 8, 128, 64, device="cuda", dtype=torch.float16)


def _is_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["portable", "tma"])
@pytest.mark.parametrize("case", _params(_each_kernel_cases()))
@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_each_decode_kernel_matches_oracle(
    case: DecodeCase, kernel: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernel == "tma" and not _is_hopper():
        pytest.skip("the TMA decode kernel runs on compute capability 9.x only")
    monkeypatch.setenv(decode.KERNEL_ENV, kernel)
    check_case(case, seed)


def test_forcing_the_tma_kernel_where_it_cannot_run_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    case = DecodeCase((20,), num_splits=1)
    inputs = make_inputs(case)
    monkeypatch.setenv(decode.KERNEL_ENV, "tma")
    with pytest.raises(ValueError, match=r"FLASHTILE_DECODE_KERNEL=tma.*does not run this call"):
        run_decode(case, inputs)
    monkeypatch.setenv(decode.KERNEL_ENV, "fast")
    with pytest.raises(ValueError, match="FLASHTILE_DECODE_KERNEL must be 'tma' or 'portable', not 'fast'"):
        run_decode(case, inputs)


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_empty_sequences_give_zero_and_minus_inf(seed: int) -> None:
    case = DecodeCase((0, 0), seqlen_q=2, page_size=16, num_splits=3)
    out, lse = run_decode(case, make_inputs(case))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


def test_splits_partition_the_keys_exactly(seed: int) -> None:
    # Every split count gives the same answer to within fp32 rounding: no key is lost or counted twice.
    case = DecodeCase((150, 33), seqlen_q=2, heads=2, heads_kv=1, page_size=16, dtype=torch.float32)
    inputs = make_inputs(case)
    out1, lse1 = run_decode(case, inputs)
    for splits in (2, 5, 10, 64):
        out, lse = run_decode(DecodeCase(**{**case.__dict__, "num_splits": splits}), inputs)
        torch.testing.assert_close(out, out1, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, lse1, rtol=1e-5, atol=1e-5)


def test_heuristic_splits_only_when_the_batch_leaves_sms_idle() -> None:
    device = torch.device("cpu")
    sms = configs.multiprocessor_count(device)
    assert num_splits_heuristic(sms, 1 << 20, 64, device) == 1
    assert num_splits_heuristic(1, 1 << 20, 64, device) > 1
    # A short cache keeps at least MIN_TILES_PER_SPLIT tiles per split.
    assert num_splits_heuristic(1, 64 * 8, 64, device) <= 8 // MIN_TILES_PER_SPLIT


def _merge64(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The combine by definition, in float64: weights softmax(lse) over the parts."""
    lse = lse.double()
    total = torch.logsumexp(lse, dim=0)
    w = torch.exp(lse - torch.where(torch.isneginf(total), 0.0, total))
    out = (torch.where(w[..., None] > 0, w[..., None] * o.double(), 0.0)).sum(0)
    return out, total


@pytest.mark.usefixtures("nan_poisoned_allocations")
def test_combine_matches_definition(seed: int) -> None:
    parts, batch, seqlen, heads, head_dim = 5, 2, 3, 4, 40
    o = torch.randn(parts, batch, seqlen, heads, head_dim)
    lse = torch.randn(parts, batch, heads, seqlen) * 5
    # Parts that saw no key carry −inf and garbage; one row no part saw.
    lse[1, 0] = -math.inf
    o[1, 0] = NAN
    lse[:, 1, 2, 0] = -math.inf
    o[:, 1, 0, 2] = NAN
    out, merged = attn_combine(o, lse, out_dtype=torch.float16)
    out64, lse64 = _merge64(o.permute(0, 1, 3, 2, 4), lse)
    out64 = out64.permute(0, 2, 1, 3)
    assert out.dtype == torch.float16
    assert torch.equal(out[1, 0, 2], torch.zeros(head_dim, dtype=torch.float16))
    assert merged[1, 2, 0] == -math.inf
    # The only rounding is the final fp16 cast; lse stays fp32.
    torch.testing.assert_close(out.double(), out64, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(merged.double(), lse64, rtol=1e-6, atol=1e-6)


def test_combine_of_flat_rows(seed: int) -> None:
    # More parts than one load takes: the running rescale across chunks of parts.
    o = torch.randn(70, 37, 16)
    lse = torch.randn(70, 37) * 3
    lse[:66, :5] = -math.inf
    out, merged = attn_combine(o, lse)
    out64, lse64 = _merge64(o, lse)
    torch.testing.assert_close(out.double(), out64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(merged.double(), lse64, rtol=1e-6, atol=1e-6)


# Compiles the decode kernel for sm_90 (no GPU needed) as the launcher would on an H100, with the 16-divisible
# pointers and strides Triton's launch specialises on, and counts the PTX's asynchronous copies per size and
# its waits on them per depth.
_SM90_DECODE_COPIES = textwrap.dedent(
    """
    import collections, json, re

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashtile.kernels import configs, decode

    configs._is_hopper = lambda device: True
    cfg = configs.decode_config(128, torch.device("cuda"))
    fn = decode.attn_decode_kernel
    results = {}
    for paged in (False, True):
        constexprs = dict(
            GROUP=8, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=cfg.BLOCK_N, PAGE_SIZE=64 if paged else 1,
            IS_PAGED=paged, HAS_BATCH_IDX=False, HAS_LEFTPAD=False, IS_LOCAL=False, HAS_WINDOW_LEFT=False,
            HAS_SOFTCAP=False, FAST_TANH=True, HAS_ALIBI=False, DOT_FP32=False, PAGE_IN_REGISTER=True,
            batch_idx_ptr=None, leftpad_ptr=None, alibi_ptr=None, EARLY_COMBINE=False,
        )
        if not paged:
            constexprs["block_table_ptr"] = None
        ints = {"seqlens_ptr": "*i32", "block_table_ptr": "*i32", "o_ptr": "*fp32", "lse_ptr": "*fp32"}
        floats = {"qk_scale", "softcap_qk", "softcap_out"}
        signature = {
            name: "constexpr" if name in constexprs
            else ints.get(name, "*bf16") if name.endswith("_ptr")
            else "fp32" if name in floats else "i32"
            for name in fn.arg_names
        }
        aligned = {
            (i,): [["tt.divisibility", 16]]
            for i, name in enumerate(fn.arg_names)
            if signature[name] != "constexpr" and (name.endswith("_ptr") or name.startswith("stride_k")
                                                   or name.startswith("stride_v"))
        }
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned)
        ptx = triton.compile(
            source, target=GPUTarget("cuda", 90, 32),
            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages},
        ).asm["ptx"]
        copy = r"cp\\.async\\.c[ag]\\.shared\\.global \\[[^]]*\\], \\[[^]]*\\], (0x[0-9a-f]+)"
        sizes = collections.Counter(re.findall(copy, ptx))
        waits = collections.Counter(re.findall(r"cp\\.async\\.wait_group\\s+(\\d+)", ptx))
        results["paged" if paged else "contiguous"] = {"sizes": sizes, "waits": waits}
    print(json.dumps(results))
    """
)


def test_paged_decode_keeps_copies_in_flight_as_the_contiguous_one() -> None:
    """On Hopper a paged cache's tile is one page whose number the step loads first. Through tl.load the
    pipeliner copied that number to shared memory asynchronously, and the copies' first-in-first-out waits
    then emptied the K/V prefetch at every step (wait_group 0: paged ran at 0.69-0.87 of contiguous on an
    H100). The number goes to a register instead: the paged loops make the contiguous loops' 16-byte copies
    and waits, and no 4-byte ones."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = "import torch\n" + _SM90_DECODE_COPIES
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    copies = json.loads(result.stdout.strip().splitlines()[-1])
    assert (
        copies["paged"]["sizes"]
        == copies["contiguous"]["sizes"]
        == {"0x10": copies["paged"]["sizes"]["0x10"]}
    )
    assert copies["paged"]["waits"] == copies["contiguous"]["waits"], copies


def test_heuristic_puts_two_programs_on_every_sm_for_a_small_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 132 SMs, a batch that leaves most SMs idle (batch 1 with 4, 8 or 33 KV heads) gets about two
    programs an SM and never more; one that fills half of them or more is split in even waves."""
    monkeypatch.setattr(configs, "multiprocessor_count", lambda device: 132)
    device = torch.device("cpu")
    for programs in (4, 8, 33):
        splits = num_splits_heuristic(programs, 1 << 17, 64, device, per_sm=2)
        assert 0.95 * 264 <= programs * splits <= 264, (programs, splits)
    # Past half of the SMs, waves of one program an SM, each nearly full.
    splits = num_splits_heuristic(100, 1 << 17, 64, device, per_sm=2)
    assert (100 * splits) / (-(-100 * splits // 132) * 132) >= 0.95, splits


@pytest.mark.parametrize(("splits", "stages"), [(32, 2), (8, 3)])
def test_splits_of_two_tiles_or_fewer_run_two_stages(
    monkeypatch: pytest.MonkeyPatch, splits: int, stages: int
) -> None:
    # A 4k cache of 64-key tiles in 32 splits gives each 2 tiles, too few for a third stage to fetch.
    monkeypatch.setattr(decode.configs, "decode_config", lambda *_: configs.DecodeConfig(64, 64, 4, 3))
    launched = {}
    monkeypatch.setattr(
        decode, "launch", lambda kernel, grid, device, *args, **kwargs: launched.update(kwargs)
    )
    monkeypatch.setattr(decode, "attn_combine", lambda *args, **kwargs: None)
    q = torch.randn(1, 1, 8, 64)
    cache = torch.randn(1, 4096, 2, 64)
    decode_fwd(
        q, cache, cache, torch.full((1,), 4096, dtype=torch.int32), softmax_scale=0.125, num_splits=splits
    )
    assert launched["num_stages"] == stages


# Compiles the split kernel and the combine for sm_90 as a Hopper decode launches them (the combine by
# programmatic dependent launch), and lists their grid-dependency instructions.
_SM90_EARLY_COMBINE = textwrap.dedent(
    """
    import json

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from flashtile.kernels import combine, decode

    def compile(fn, constexprs, pointers, options):
        signature = {
            name: "constexpr" if name in constexprs else pointers.get(name, "i32")
            for name in fn.arg_names
        }
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)

    split = compile(
        decode.attn_decode_kernel,
        dict(
            GROUP=4, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=64, PAGE_SIZE=1, IS_PAGED=False,
            HAS_BATCH_IDX=False, HAS_LEFTPAD=False, IS_LOCAL=True, HAS_WINDOW_LEFT=False, HAS_SOFTCAP=False,
            FAST_TANH=True, HAS_ALIBI=False, DOT_FP32=False, PAGE_IN_REGISTER=True, EARLY_COMBINE=True,
            block_table_ptr=None, batch_idx_ptr=None, leftpad_ptr=None, alibi_ptr=None,
        ),
        {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*fp32", "lse_ptr": "*fp32",
         "seqlens_ptr": "*i32", "qk_scale": "fp32", "softcap_qk": "fp32", "softcap_out": "fp32"},
        {"num_warps": 4, "num_stages": 2},
    )
    merge = compile(
        combine.attn_combine_kernel,
        dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_R=1, BLOCK_S=64, AFTER_PRIOR_GRID=True),
        {"o_part_ptr": "*fp32", "lse_part_ptr": "*fp32", "o_ptr": "*bf16", "lse_ptr": "*fp32"},
        {"num_warps": 4, "launch_pdl": True},
    )
    def grid_dependency(kernel):
        lines = kernel.asm["ptx"].splitlines()
        return sorted({line.split(";")[0].strip() for line in lines if "griddepcontrol" in line})

    found = {"split": grid_dependency(split), "combine": grid_dependency(merge)}
    print(json.dumps({**found, "combine_launch_pdl": bool(merge.metadata.launch_pdl)}))
    """
)


def test_hopper_combine_launches_while_the_split_kernel_runs() -> None:
    """On Hopper the combine is launched by programmatic dependent launch: the split kernel lets it launch at
    once (``griddepcontrol.launch_dependents``) and the combine waits for the split kernel's results
    (``griddepcontrol.wait``) before it reads them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _SM90_EARLY_COMBINE], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {
        "split": ["griddepcontrol.launch_dependents"],
        "combine": ["griddepcontrol.wait"],
        "combine_launch_pdl": True,
    }


@pytest.mark.parametrize(
    "choice, portable, tma", [(None, True, False), ("0", False, False), ("1", True, True), ("", True, False)]
)
def test_the_combine_launches_early_after_the_portable_kernel_and_not_after_the_tma_one(
    choice: str | None, portable: bool, tma: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rule of kernels/decode.py's PDL_ENV on a compute-capability 9.0 device (faked: no GPU here).
    monkeypatch.setattr(configs, "is_interpreter", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    if choice is None:
        monkeypatch.delenv(decode.PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(decode.PDL_ENV, choice)
    cuda = torch.device("cuda", 0)
    assert decode._early_combine(cuda, tma=False) is portable
    assert decode._early_combine(cuda, tma=True) is tma
    assert decode._early_combine(torch.device("cpu"), tma=False) is False
