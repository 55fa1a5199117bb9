"""``flashtile bench --masks``: block-sparse attention and programmable masks beside FlexAttention.

One sequence of 16k tokens, H = 16, D = 128, bf16, forward and backward; masks on 128 × 128 tiles:

- ``block_sparse``: random tiles (seed 0), 75 % of them empty, every query block keeping the same number of
  key blocks; flashtile with ``BlockMask.from_tiles`` and FlexAttention with the ``BlockMask`` it builds from
  the same tile lists (``from_kv_blocks``), beside flashtile's dense non-causal kernel (``flashtile-dense``).
  Target: ≥ 3× faster than dense, in time.
- ``document``: 8 documents of :data:`DOCUMENT_LENGTHS` tokens (not multiples of 128, so the tiles at their
  boundaries are partial): ``flashtile.masks.document()`` over document ids against Flex's mask_mod
  ``ids[q] == ids[kv]``. Target: ≥ 1.2× Flex.
- ``prefix_lm``: a bidirectional prefix of 2k tokens, causal after it: ``flashtile.masks.prefix_lm(2048)``
  against Flex's ``(kv < 2048) | (kv <= q)``. Target: ≥ 1.2× Flex.
- first call: the wall time of a new mask's first training step (building the block mask, forward and
  backward, compilation included) in a fresh process whose Triton and Inductor caches are empty
  (``TRITON_CACHE_DIR`` and ``TORCHINDUCTOR_CACHE_DIR`` point at new temporary folders); imports and the CUDA
  context come before the clock starts (:mod:`flashtile.bench.first_call`); and ``first_call_new_mask``, the
  same in a fresh process whose caches hold what a first step with the other mask (document or prefix-LM)
  left there, as on a machine where the library has run before. Target: ≤ 1/4 of Flex's.

FlexAttention is ``torch.compile(flex_attention)`` compiled for this shape; its block mask comes from its own
``create_block_mask`` at 128 × 128. Block masks are built once, outside the timed calls (they are reused
across layers and steps). TFLOP/s count the visible (query, key) pairs: forward 4·H·D·pairs, backward 2.5×.
Each implementation is first checked, on the very call that is then timed, against the float64 oracle with
the same mask (flashtile's reference evaluating the mask function on index tensors) under the 2×/3× rule;
the oracle covers the last query head, as the other presets' oracles cover their last heads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import flashtile
from flashtile import masks
from flashtile.bench import bench, results
from flashtile.bench.grid import Config
from flashtile.bench.peers import Peer
from flashtile.bench.timing import TimingBudget, time_calls
from flashtile.block_mask import BlockMask, create_block_mask
from flashtile.mods import Mods
from flashtile.reference.compare import GRAD_FACTOR, OUTPUT_FACTOR, compare

HEADS, HEAD_DIM, DTYPE, DTYPE_NAME = 16, 128, torch.bfloat16, "bf16"
SEQLEN = 16384
BLOCK = 128
EMPTY_SHARE = 0.75
TILE_SEED = 0
# The documents of the 16k-token sequence; other lengths scale them (document_lengths).
DOCUMENT_LENGTHS = (3000, 1200, 2900, 700, 2600, 1700, 2200, 2084)
PREFIX_SHARE = 8
MODES = ("fwd", "bwd")
CASES = ("block_sparse", "document", "prefix_lm")
QUICK_CASES = ("block_sparse", "document")
FIRST_CALL_CASES = ("document", "prefix_lm")
QUICK_FIRST_CALL_CASES = ("document",)
# Targets: time speedup over dense, flashtile / Flex TFLOP/s, flashtile / Flex first-call seconds.
SPARSE_TARGET, FLEX_TARGET, FIRST_CALL_TARGET = 3.0, 1.2, 0.25
TIMING = TimingBudget(warmup_ms=25, rep_ms=100, min_reps=10, max_reps=100)
QUICK_TIMING = TimingBudget(warmup_ms=10, rep_ms=40, min_reps=5, max_reps=40)
FIRST_CALL_TIMEOUT_S = 600
COLUMNS = (
    *results.COLUMNS[: results.COLUMNS.index("date") + 1],
    "impl",
    "case",
    "mask",
    "mode",
    "dtype",
    "batch",
    "heads",
    "seqlen",
    "head_dim",
    "block_size",
    "empty_tiles",
    "pairs",
    "p20_ms",
    "p50_ms",
    "p80_ms",
    "tflops",
    "first_call_s",
    "status",
    "detail",
)


def check_seqlen(seqlen: int) -> int:
    """``seqlen`` if the masks fit it exactly (a multiple of 4 · 128: 75 % of every row of tiles empty)."""
    if seqlen < 4 * BLOCK or seqlen % (4 * BLOCK):
        raise ValueError(f"--masks needs a sequence length that is a multiple of {4 * BLOCK}; got {seqlen}")
    return seqlen


def document_lengths(seqlen: int) -> tuple[int, ...]:
    """The 8 document lengths at ``seqlen`` tokens: :data:`DOCUMENT_LENGTHS` scaled, the last one taking the
    rest.

    >>> document_lengths(16384) == DOCUMENT_LENGTHS, document_lengths(1024)
    (True, (187, 75, 181, 43, 162, 106, 137, 133))
    """
    scaled = [n * seqlen // SEQLEN for n in DOCUMENT_LENGTHS[:-1]]
    return (*scaled, seqlen - sum(scaled))


def prefix_length(seqlen: int) -> int:
    """The bidirectional prefix of the prefix-LM case: 2k of 16k tokens."""
    return seqlen // PREFIX_SHARE


def random_tiles(seqlen: int) -> torch.Tensor:
    """Bool ``(NQ, NK)`` on the CPU: each query block keeps ``NK / 4`` key blocks drawn without replacement
    from a generator seeded with :data:`TILE_SEED`, so exactly 75 % of the tiles are empty."""
    n_blocks = seqlen // BLOCK
    generator = torch.Generator().manual_seed(TILE_SEED)
    order = torch.rand(n_blocks, n_blocks, generator=generator).argsort(dim=1)
    keep = round(n_blocks * (1 - EMPTY_SHARE))
    tiles = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    return tiles.scatter_(1, order[:, :keep], True)


def describe(case: str, seqlen: int) -> str:
    """The mask of ``case`` in words (the CSV's ``mask`` column)."""
    if case == "block_sparse":
        keep = round(seqlen // BLOCK * (1 - EMPTY_SHARE))
        return (
            f"{EMPTY_SHARE:.0%} of {BLOCK}x{BLOCK} tiles empty: {keep} of {seqlen // BLOCK} key blocks per "
            f"query block, random (seed {TILE_SEED})"
        )
    if case == "document":
        lengths = document_lengths(seqlen)
        return f"{len(lengths)} documents of {' '.join(str(n) for n in lengths)} tokens"
    if case == "prefix_lm":
        return f"prefix {prefix_length(seqlen)} bidirectional, then causal"
    return "dense non-causal"


def flashtile_mask(
    case: str, seqlen: int, device: torch.device
) -> tuple[BlockMask, tuple[torch.Tensor, ...] | None]:
    """flashtile's block mask for ``case`` and the ``aux_tensors`` its mask function reads."""
    if case == "block_sparse":
        return BlockMask.from_tiles(random_tiles(seqlen).to(device), seqlen, seqlen, BLOCK), None
    if case == "document":
        bounds = torch.tensor((0, *document_lengths(seqlen)), device=device).cumsum(0)
        aux = (masks.document_ids(bounds, seqlen),)
        return create_block_mask(masks.document(), None, None, seqlen, seqlen, BLOCK, device, aux), aux
    if case == "prefix_lm":
        mask_mod = masks.prefix_lm(prefix_length(seqlen))
        return create_block_mask(mask_mod, None, None, seqlen, seqlen, BLOCK, device), None
    raise ValueError(f"unknown mask case {case!r}; known: {', '.join(CASES)}")


def flex_mask_mod(case: str, seqlen: int, device: torch.device) -> Callable[..., torch.Tensor]:
    """Flex's ``mask_mod`` with the semantics of flashtile's mask for ``case`` (document or prefix_lm)."""
    if case == "document":
        bounds = torch.tensor((0, *document_lengths(seqlen)), device=device).cumsum(0)
        ids = masks.document_ids(bounds, seqlen)

        def document(
            b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            return ids[q_idx] == ids[kv_idx]

        return document
    if case == "prefix_lm":
        prefix = prefix_length(seqlen)

        def prefix_lm(
            b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
        ) -> torch.Tensor:
            return (kv_idx < prefix) | (kv_idx <= q_idx)

        return prefix_lm
    raise ValueError(f"FlexAttention's mask_mod exists for document and prefix_lm, not {case!r}")


def flex_block_mask(case: str, seqlen: int, device: torch.device) -> object:
    """FlexAttention's ``BlockMask`` for ``case``: from flashtile's tile lists for ``block_sparse`` (the same
    tiles, all full), else from Flex's own ``create_block_mask`` of :func:`flex_mask_mod`."""
    from torch.nn.attention import flex_attention as flex

    if case == "block_sparse":
        ours = BlockMask.from_tiles(random_tiles(seqlen).to(device), seqlen, seqlen, BLOCK)
        return flex.BlockMask.from_kv_blocks(
            ours.kv_num_blocks,
            ours.kv_indices,
            ours.full_kv_num_blocks,
            ours.full_kv_indices,
            BLOCK_SIZE=BLOCK,
        )
    return flex.create_block_mask(
        flex_mask_mod(case, seqlen, device), None, None, seqlen, seqlen, device=device, BLOCK_SIZE=BLOCK
    )


def implementation(impl: str, case: str, seqlen: int, device: torch.device) -> Callable[..., torch.Tensor]:
    """``fn(q, k, v) -> out`` on flash_attn's (B, N, H, D) layout for ``impl`` ("flashtile", "flex" or
    "flashtile-dense") on ``case``; building it builds the block mask."""
    if impl == "flashtile-dense":
        return lambda q, k, v: flashtile.flash_attn_func(q, k, v)
    if impl == "flashtile":
        block_mask, aux = flashtile_mask(case, seqlen, device)
        return lambda q, k, v: flashtile.flash_attn_func(q, k, v, block_mask=block_mask, aux_tensors=aux)
    if impl != "flex":
        raise ValueError(f"unknown implementation {impl!r}; known: flashtile, flex, flashtile-dense")
    from torch.nn.attention.flex_attention import flex_attention

    from flashtile.bench.peers import _raise_recompile_limits

    _raise_recompile_limits()
    compiled = torch.compile(flex_attention, dynamic=False)
    block_mask = flex_block_mask(case, seqlen, device)

    def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
        return out.transpose(1, 2)

    return flex


def visible_pairs(
    block_mask: BlockMask, aux: tuple[torch.Tensor, ...] | None, rows_per_chunk: int = 1024
) -> int:
    """The (query, key) pairs one head sees through ``block_mask`` and its mask function, counted in chunks
    of rows on the mask's device."""
    device = block_mask.tile_states.device
    zero = torch.zeros(1, 1, dtype=torch.int64, device=device)
    cols = torch.arange(block_mask.seqlen_k, device=device)[None, :]
    mods = Mods(aux_tensors=aux)
    total = 0
    for start in range(0, block_mask.seqlen_q, rows_per_chunk):
        rows = torch.arange(start, min(start + rows_per_chunk, block_mask.seqlen_q), device=device)[:, None]
        total += int(block_mask.visible(zero, zero, rows, cols, mods).sum())
    return total


@dataclass(frozen=True)
class Verdict:
    """The check of one implementation: ``status`` "ok" or "wrong" (or a failure's), per mode."""

    fwd: tuple[str, str]
    bwd: tuple[str, str]


def oracle(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    mods: Mods | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """Naive attention of the last query head (and its KV head) in ``dtype``: out, dq, dk, dv."""
    from flashtile.reference.naive import attention

    leaves = [t[:, :, -1:].detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    out = attention(*leaves, mods=mods)[0]
    return out.detach(), *torch.autograd.grad(out, leaves, dout[:, :, -1:].to(dtype))


def check(
    fn: Callable[..., torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    reference: tuple[tuple[torch.Tensor, ...], ...],
) -> Verdict:
    """``fn`` on the full ``inputs`` (q, k, v, dout) against ``reference`` (the float64 oracle's and the
    low-precision baseline's out, dq, dk, dv on the last head): 2× for the output, 3× for the gradients."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs[:3]]
    names = ("out", "dq", "dk", "dv")

    def verdict(ours: tuple[torch.Tensor, ...]) -> tuple[str, str]:
        found = [
            compare(name, mine[:, :, -1:], ref64, low, OUTPUT_FACTOR if name == "out" else GRAD_FACTOR)
            for name, mine, ref64, low in zip(names[: len(ours)], ours, *reference, strict=False)
        ]
        failed = [c for c in found if not c.passed]
        if failed:
            return "wrong", "; ".join(str(c) for c in failed)[:400]
        errors = ", ".join(f"{c.name} {c.max_abs_error:.1e}/{c.allowed:.1e}" for c in found)
        return "ok", f"checked on the last head: max|err|/allowed {errors}"

    try:
        out = fn(*leaves)
    except Exception as exc:
        failed = bench._failure(exc)
        return Verdict((failed.status, failed.detail), (failed.status, failed.detail))
    fwd = verdict((out,))
    if fwd[0] != "ok":
        return Verdict(fwd, fwd)
    try:
        grads = torch.autograd.grad(out, leaves, inputs[3])
    except Exception as exc:
        failed = bench._failure(exc)
        return Verdict(fwd, (failed.status, failed.detail))
    return Verdict(fwd, verdict((out, *grads)))


def flops(pairs: int, mode: str) -> float:
    """FLOPs of one call over ``pairs`` visible pairs (all heads): 4·D per pair forward, 2.5× backward."""
    return 4.0 * HEAD_DIM * pairs * (1.0 if mode == "fwd" else 2.5)


def _base_row(env: results.Environment, impl: str, case: str, seqlen: int) -> dict[str, object]:
    return {
        **env.__dict__,
        "impl": impl,
        "case": case,
        "mask": describe("dense" if impl == "flashtile-dense" else case, seqlen),
        "dtype": DTYPE_NAME,
        "batch": 1,
        "heads": HEADS,
        "seqlen": seqlen,
        "head_dim": HEAD_DIM,
        "block_size": BLOCK,
    }


def _timed_row(
    row: dict[str, object],
    fn: Callable[..., torch.Tensor],
    config: Config,
    inputs: list[tuple[torch.Tensor, ...]],
    timing: TimingBudget,
) -> dict[str, object]:
    """``row`` (checked "ok") with the times of ``fn`` in ``config``'s mode, or the failure that stops it."""
    peer = Peer(row["impl"], lambda q, k, v, causal, scale: fn(q, k, v), lambda c: None)
    try:
        fn_i = bench._measured_fn(peer, config, inputs, {})
        timed = time_calls(fn_i, len(inputs), torch.device(config.device), timing)
    except Exception as exc:
        failed = bench._failure(exc)
        return {**row, "status": failed.status, "detail": failed.detail}
    return {
        **row,
        "p20_ms": f"{timed.p20_ms:.6g}",
        "p50_ms": f"{timed.p50_ms:.6g}",
        "p80_ms": f"{timed.p80_ms:.6g}",
        "tflops": f"{flops(int(row['pairs']), config.mode) / (timed.p50_ms * 1e9):.6g}",
        "detail": f"{row['detail']}; {timed.reps} calls over {len(inputs)} input copies",
    }


# The implementations --peers may name; "flashtile" brings its dense yardstick (flashtile-dense) along.
PEERS = ("flashtile", "flex")


def chosen_peers(names: list[str] | None) -> tuple[str, ...]:
    """The implementations ``--peers`` keeps (all of :data:`PEERS` without it), in their order; a clear
    ValueError for any other name."""
    if not names:
        return PEERS
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ValueError(
            f"--peers: {', '.join(unknown)} not in the --masks preset; choose from {', '.join(PEERS)}"
        )
    return tuple(p for p in PEERS if p in names)


def measure_case(
    case: str,
    seqlen: int,
    device: torch.device,
    env: results.Environment,
    timing: TimingBudget,
    peers: tuple[str, ...] = PEERS,
) -> list[dict[str, object]]:
    """Rows of each implementation of ``peers`` on ``case``, fwd and bwd: checked, then timed."""
    block_mask, aux = flashtile_mask(case, seqlen, device)
    mods = Mods(block_mask, None, None, None, aux)
    masked = (HEADS * visible_pairs(block_mask, aux), f"{block_mask.sparsity():.4f}", mods)
    impls = {name: masked for name in peers}
    if case == "block_sparse" and "flashtile" in peers:
        impls["flashtile-dense"] = (HEADS * seqlen * seqlen, "0", None)
    config = Config(device.type, DTYPE_NAME, "fwd", False, 1, HEADS, HEADS, seqlen, seqlen, HEAD_DIM)
    inputs = bench._make_inputs(config, device)
    # The float64 oracle and the bf16 baseline per mask: the case's, and no mask for flashtile-dense.
    references: dict[bool, tuple[tuple[torch.Tensor, ...], ...]] = {}
    rows = []
    for impl, (pairs, empty, impl_mods) in impls.items():
        base = {**_base_row(env, impl, case, seqlen), "empty_tiles": empty, "pairs": pairs}
        dense = impl_mods is None
        try:
            fn = implementation(impl, case, seqlen, device)
            if dense not in references:
                references[dense] = tuple(oracle(*inputs[0], impl_mods, d) for d in (torch.float64, DTYPE))
        except ImportError as exc:
            failed = bench._Verdict("unsupported", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            failed = bench._failure(exc)
        else:
            failed = None
        if failed is not None:
            rows += [{**base, "mode": m, "status": failed.status, "detail": failed.detail} for m in MODES]
            continue
        verdict = check(fn, inputs[0], references[dense])
        for mode, (status, detail) in zip(MODES, (verdict.fwd, verdict.bwd), strict=True):
            row = {**base, "mode": mode, "status": status, "detail": detail}
            if status == "ok":
                row = _timed_row(row, fn, config.with_mode(mode), inputs, timing)
            rows.append(row)
    return rows


def fresh_cache_env(folder: Path) -> dict[str, str]:
    """The environment of a first-call child: empty Triton and Inductor caches under ``folder``, and this
    flashtile first on the import path."""
    package_root = str(Path(flashtile.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "TRITON_CACHE_DIR": str(folder / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"),
        "PYTHONPATH": path,
    }


# The mask whose first step fills the caches before a "new mask" first call: the other first-call case.
OTHER_MASK = {"document": "prefix_lm", "prefix_lm": "document"}


def first_call(
    impl: str, case: str, seqlen: int, heads: int = HEADS, device: str = "cuda", caches: Path | None = None
) -> dict[str, float]:
    """The seconds of ``impl``'s first training step with ``case``'s mask, measured in a fresh process
    (:mod:`flashtile.bench.first_call`) whose Triton and Inductor caches are in ``caches`` (None: new, empty
    ones): ``mask_s``, ``forward_s``, ``backward_s``, ``warm_s`` (the same step again, compiled)."""
    command = [sys.executable, "-m", "flashtile.bench.first_call", impl, case, str(seqlen)]
    command += ["--heads", str(heads), "--device", device]
    with tempfile.TemporaryDirectory(prefix="flashtile-first-call-") as folder:
        done = subprocess.run(
            command,
            env=fresh_cache_env(caches or Path(folder)),
            capture_output=True,
            text=True,
            timeout=FIRST_CALL_TIMEOUT_S,
            check=False,
        )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the first-call process exited with {done.returncode}: {tail}")
    return json.loads(lines[-1])


def measure_first_call(
    case: str, seqlen: int, env: results.Environment, peers: tuple[str, ...] = PEERS
) -> list[dict[str, object]]:
    """Two first-call rows per implementation of ``peers`` for ``case``: ``first_call``, a fresh process
    with empty caches; ``first_call_new_mask``, a fresh process whose caches hold what a first step with
    another mask (:data:`OTHER_MASK`) left there: what a user pays for a mask new to an installation
    already in use."""
    rows = []
    for impl in peers:
        for mode in ("first_call", "first_call_new_mask"):
            row = {**_base_row(env, impl, case, seqlen), "mode": mode}
            try:
                with tempfile.TemporaryDirectory(prefix="flashtile-caches-") as caches:
                    if mode == "first_call_new_mask":
                        first_call(impl, OTHER_MASK[case], seqlen, caches=Path(caches))
                    seconds = first_call(impl, case, seqlen, caches=Path(caches))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                rows.append({**row, "status": "error", "detail": str(exc)[:400]})
                continue
            total = seconds["mask_s"] + seconds["forward_s"] + seconds["backward_s"]
            caches_were = (
                "empty TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR"
                if mode == "first_call"
                else f"TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR as a first step with {OTHER_MASK[case]} "
                "left them"
            )
            rows.append(
                {
                    **row,
                    "first_call_s": f"{total:.4g}",
                    "status": "ok",
                    "detail": f"block mask {seconds['mask_s']:.3g} s, forward {seconds['forward_s']:.3g} s, "
                    f"backward {seconds['backward_s']:.3g} s; "
                    f"the next step {seconds['warm_s'] * 1e3:.3g} ms; {caches_were}",
                }
            )
    return rows


@dataclass(frozen=True)
class Comparison:
    """One target line: flashtile's number against its yardstick's, and the target ratio."""

    what: str
    mode: str
    ours: float
    theirs: float
    ratio: float
    target: float
    unit: str

    @property
    def met(self) -> bool:
        return self.ratio <= self.target if self.mode.startswith("first_call") else self.ratio >= self.target


def comparisons(rows: list[dict[str, str]]) -> list[Comparison]:
    """The targets of a run's rows: block-sparse time against dense, document and prefix-LM TFLOP/s against
    Flex, first-call seconds against Flex's."""
    ok = {(r["case"], r["mode"], r["impl"]): r for r in rows if r["status"] == "ok"}
    found = []
    for (case, mode, impl), r in ok.items():
        if impl != "flashtile":
            continue
        if mode.startswith("first_call"):
            flex = ok.get((case, mode, "flex"))
            if flex:
                ours, theirs = float(r["first_call_s"]), float(flex["first_call_s"])
                what = f"{case} first call{' (new mask)' if mode.endswith('new_mask') else ''} / Flex"
                found.append(Comparison(what, mode, ours, theirs, ours / theirs, FIRST_CALL_TARGET, "s"))
            continue
        dense = ok.get((case, mode, "flashtile-dense"))
        if dense:
            ours, theirs = float(r["p50_ms"]), float(dense["p50_ms"])
            found.append(
                Comparison(
                    f"{case}: dense time / block-sparse time",
                    mode,
                    ours,
                    theirs,
                    theirs / ours,
                    SPARSE_TARGET,
                    "ms",
                )
            )
        flex = ok.get((case, mode, "flex"))
        if flex:
            ours, theirs = float(r["tflops"]), float(flex["tflops"])
            target = FLEX_TARGET if case != "block_sparse" else 1.0
            found.append(
                Comparison(f"{case}: TFLOP/s / Flex", mode, ours, theirs, ours / theirs, target, "TFLOP/s")
            )
    return found


def render(rows: list[dict[str, str]], console: object) -> None:
    """The measurements (one line per case, mode and implementation) and the targets."""
    from rich.table import Table

    table = Table(title="masks · bf16, D=128, H=16 · TFLOP/s on visible pairs", title_justify="left")
    for name in ("case", "mode", "impl", "p50 ms", "TFLOP/s", "first call s", "status"):
        table.add_column(name, justify="right" if name in ("p50 ms", "TFLOP/s", "first call s") else "left")
    for r in rows:
        table.add_row(
            r["case"],
            r["mode"],
            r["impl"],
            r.get("p50_ms") or "",
            r.get("tflops") or "",
            r.get("first_call_s") or "",
            r["status"] if r["status"] == "ok" else f"{r['status']}: {r['detail'][:60]}",
        )
    console.print(table)
    targets = Table(title="masks · flashtile against its targets", title_justify="left")
    for name in ("comparison", "mode", "flashtile", "other", "ratio", "target"):
        targets.add_column(name, justify="left" if name in ("comparison", "mode") else "right")
    for c in comparisons(rows):
        sign = "≤" if c.mode.startswith("first_call") else "≥"
        color = "green" if c.met else "red"
        targets.add_row(
            c.what,
            c.mode,
            f"{c.ours:.4g} {c.unit}",
            f"{c.theirs:.4g} {c.unit}",
            f"[{color}]{c.ratio:.2f}×[/]",
            f"{sign} {c.target:g}×",
        )
    console.print(targets)


def plot(csv_path: Path, date: str) -> Path | None:
    """TFLOP/s per (case, mode) and first-call seconds per case, one bar per implementation."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in results.read_rows(csv_path) if r["date"] == date and r["status"] == "ok"]
    if not ok:
        return None
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    fig = Figure(figsize=(11, 4), layout="constrained")
    FigureCanvasAgg(fig)
    speed, first = fig.subplots(1, 2, width_ratios=(3, 1))
    for ax, timed, value, label in (
        (speed, True, "tflops", "TFLOP/s (visible pairs)"),
        (first, False, "first_call_s", "first call, s (compile included)"),
    ):
        chosen = [r for r in ok if (not r["mode"].startswith("first_call")) == timed]
        groups = list(dict.fromkeys((r["case"], r["mode"]) for r in chosen))
        present = [impl for impl in impls if any(r["impl"] == impl for r in chosen)]
        width = 0.8 / max(len(present), 1)
        for i, impl in enumerate(present):
            bars = [
                (groups.index((r["case"], r["mode"])), float(r[value])) for r in chosen if r["impl"] == impl
            ]
            color = f"C{impls.index(impl)}"
            ax.bar([g + i * width for g, _ in bars], [v for _, v in bars], width, label=impl, color=color)
        middle = (len(present) - 1) * width / 2
        ax.set_xticks([g + middle for g in range(len(groups))], [f"{c}\n{m}" for c, m in groups], fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
        if groups:
            ax.legend(fontsize=7)
    fig.suptitle(
        f"Masks, bf16, D=128, H=16, N={ok[0]['seqlen']}: {ok[0]['gpu']}\n"
        f"torch {ok[0]['torch']}, triton {ok[0]['triton']}, commit {ok[0]['commit']}, {date}",
        fontsize=9,
    )
    path = csv_path.with_suffix(".png")
    fig.savefig(path, dpi=120)
    return path


def main(args: argparse.Namespace) -> int:
    """``flashtile bench --masks [--quick]``."""
    from rich.console import Console

    console = Console() if Console().is_terminal else Console(width=132)
    if args.paper or args.options or args.decode:
        print("flashtile bench: --masks takes --quick, not --paper, --options or --decode", file=sys.stderr)
        return 2
    csv_path = args.out_dir / f"{args.name or 'bench_masks'}.csv"
    if args.plot_only:
        try:
            rows, date = results.latest_run(csv_path, COLUMNS)
        except ValueError as exc:
            print(f"flashtile bench: {exc}", file=sys.stderr)
            return 2
        render(rows, console)
        path = plot(csv_path, date)
        if path:
            console.print(f"plot: {path}", highlight=False)
        return 0
    try:
        seqlen = check_seqlen(args.seqlen[0] if args.seqlen else SEQLEN)
        peers = chosen_peers(args.peers)
    except ValueError as exc:
        print(f"flashtile bench: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() or args.device == "cpu":
        print(
            "flashtile bench --masks: needs a CUDA device (FlexAttention is compiled for it and times come "
            "from CUDA events)",
            file=sys.stderr,
        )
        return 2
    try:
        results.check_output(csv_path, COLUMNS)
    except ValueError as exc:
        print(f"flashtile bench: {exc}", file=sys.stderr)
        return 2
    base = QUICK_TIMING if args.quick else TIMING
    timing = TimingBudget(
        warmup_ms=args.warmup_ms or base.warmup_ms,
        rep_ms=args.rep_ms or base.rep_ms,
        min_reps=args.min_reps or base.min_reps,
        max_reps=base.max_reps,
    )
    device = torch.device("cuda")
    torch.manual_seed(args.seed)
    env = results.environment(device)
    cases = QUICK_CASES if args.quick else CASES
    first_calls = QUICK_FIRST_CALL_CASES if args.quick else FIRST_CALL_CASES
    console.print(
        f"flashtile bench --masks on {env.gpu}, torch {env.torch}, triton {env.triton}, commit {env.commit}: "
        f"N={seqlen}, {', '.join(peers)}, cases {', '.join(cases)}, first calls {', '.join(first_calls)} "
        f"→ {csv_path}",
        highlight=False,
    )
    started = time.monotonic()
    found: list[dict[str, object]] = []
    status = 0
    try:
        for case in cases:
            rows = measure_case(case, seqlen, device, env, timing, peers)
            results.append_rows(csv_path, rows, COLUMNS)
            found += rows
            torch.cuda.empty_cache()
            console.print(f"{case}: {time.monotonic() - started:.0f} s", highlight=False)
        for case in first_calls:
            rows = measure_first_call(case, seqlen, env, peers)
            results.append_rows(csv_path, rows, COLUMNS)
            found += rows
            console.print(f"{case} first call: {time.monotonic() - started:.0f} s", highlight=False)
    except bench._FatalDeviceError as exc:
        console.print(f"[red]flashtile bench: CUDA context lost, stopping: {exc}[/red]")
        status = 1
    render([{k: str(v) for k, v in r.items()} for r in found], console)
    console.print(
        f"{len(found)} rows appended to {csv_path} in {time.monotonic() - started:.0f} s", highlight=False
    )
    if not args.no_plot and found:
        path = plot(csv_path, env.date)
        if path:
            console.print(f"plot: {path}", highlight=False)
    return status
