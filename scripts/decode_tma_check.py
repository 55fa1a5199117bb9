"""One GPU run: the Hopper TMA decode kernel (kernels/hopper/decode.py) at several tilings against the
portable decode kernel and SDPA's cuDNN backend, contiguous and paged, batch 1 to 64.

    PYTHONPATH=src python scripts/decode_tma_check.py [--mode tilings|splits|head-dims|paged] [--reps 50]
        [--rounds 2] [--quick]

``tilings`` (the default): every tiling of TMA_TILINGS on D = 128 shapes, contiguous and paged;
``splits``: the default tiling at the heuristic's split count, half and twice it, at batch 1;
``head-dims``: D = 64 and 256 at the default tiling and a deeper ring;
``margins``: the cells nearest issue 11's lines (batch 1, GQA 1 at 16k against cuDNN; paged against the same
keys contiguous) at the default configuration and at other split counts and ring depths;
``paged``: where paged caches trail contiguous ones, the same keys contiguous, paged in a random page order
(the bench's), paged in order (the contiguous cache seen as pages: the kernel's paged path without the
scattered placement), and in a random order of 2 MB groups.

Timed as scripts/decode_check.py times (CUDA graphs over rotated cache copies, K and V read once); the
variants alternate within each round, so a slow phase of the machine falls on all of them. Each variant's
output is checked against fp32 attention first (2x the bf16 baseline's error).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_check import Problem

from flashtile.bench.decode import copy_bandwidth
from flashtile.kernels import configs
from flashtile.kernels.decode import KERNEL_ENV, decode_fwd, num_splits_heuristic
from flashtile.kernels.hopper.decode import programs_per_sm

# (MAX_BLOCK_M, BLOCK_N, num_warps, stages) of the TMA kernel at D = 128; the first is its default. The
# first run (H100, d407526) had (64, 64, 4, 3) first: 2 stages were as fast or faster in 20 of 23 cells.
TMA_TILINGS = ((64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 6), (64, 128, 4, 2), (64, 64, 4, 5))


def _ours(problem: Problem, kernel: str, config: configs.DecodeConfig | None, splits: int = 0):
    def call(i: int) -> torch.Tensor:
        k, v, table = problem.caches[i][:3]
        os.environ[KERNEL_ENV] = kernel
        try:
            return decode_fwd(
                problem.q, k, v, problem.seqlens, softmax_scale=problem.head_dim**-0.5, block_table=table,
                window_size=(-1, 0), config=config, num_splits=splits,
            )[0]  # fmt: skip
        finally:
            os.environ.pop(KERNEL_ENV)

    return call


def _auto_splits(problem: Problem) -> int:
    """The split count decode_fwd's heuristic gives the TMA kernel's default tiling on this problem."""
    cuda = torch.device("cuda")
    default = configs.decode_tma_config(problem.head_dim)
    programs = problem.batch * problem.heads_kv
    sms = configs.multiprocessor_count(cuda)
    small_pages = bool(problem.page_size) and problem.page_size < default.BLOCK_N
    per_sm = programs_per_sm(problem.head_dim, default, problem.seqlen, programs, sms, small_pages)
    return num_splits_heuristic(programs, problem.seqlen, default.BLOCK_N, cuda, per_sm)


def split_variants(problem: Problem) -> dict[str, object]:
    """The default tiling at the heuristic's split count and at half and twice it (the first run also
    timed 3/4 and 3/2 of it, and three programs an SM: never the fastest)."""
    auto = _auto_splits(problem)
    calls = {f"tma splits {auto} (auto)": _ours(problem, "tma", None)}
    for factor in (0.5, 2.0):
        splits = max(1, round(auto * factor))
        calls[f"tma splits {splits}"] = _ours(problem, "tma", None, splits)
    calls["sdpa cudnn"] = lambda i: problem.sdpa(i, SDPBackend.CUDNN_ATTENTION)
    return calls


def head_dim_variants(problem: Problem) -> dict[str, object]:
    """The portable kernel, the TMA kernel's default and a deeper ring, and cuDNN, at D = 64 or 256."""
    default = configs.decode_tma_config(problem.head_dim)
    deeper = configs.DecodeConfig(default.MAX_BLOCK_M, default.BLOCK_N, 4, default.num_stages + 1)
    calls = {"portable": _ours(problem, "portable", None)}
    for cfg in (default, deeper):
        calls["tma " + "/".join(map(str, (cfg.MAX_BLOCK_M, cfg.BLOCK_N, 4, cfg.num_stages)))] = _ours(
            problem, "tma", cfg
        )
    calls["sdpa cudnn"] = lambda i: problem.sdpa(i, SDPBackend.CUDNN_ATTENTION)
    return calls


def paged_variants(problem: Problem) -> dict[str, object]:
    """Contiguous against paged: page tables in a random order (the bench's), in order (the contiguous
    cache seen as pages), in a random order of 2 MB groups of pages (each group in order), and one random
    table for every copy. (In s16b and s16c a prefetch into L2 of whole tiles, or of one line a tile, 1 to 8
    tiles ahead of the ring, was slower everywhere; in s21a so was a prefetch of the block-table row into L2
    or L1 while the sequence's length loads: removed.)"""
    batch, pages = problem.batch, problem.seqlen // problem.page_size
    cuda = torch.device("cuda")
    in_order = torch.arange(batch * pages, device=cuda, dtype=torch.int32).view(batch, pages)
    page_bytes = problem.page_size * problem.heads_kv * problem.head_dim * 2
    group = max(1, min(batch * pages, 2**21 // page_bytes))
    groups = torch.randperm(batch * pages // group, device=cuda)
    grouped = (groups[:, None] * group + torch.arange(group, device=cuda)).flatten()

    def as_pages(t: torch.Tensor) -> torch.Tensor:
        """A (B, L, H_KV, D) cache seen as (B·pages, page_size, H_KV, D)."""
        return t.view(batch * pages, problem.page_size, *t.shape[2:])

    # One random table for every copy, as a serving engine's layers share one block table per sequence
    # (each copy a layer's pool): the table stays in cache where the bench's per-copy tables do not.
    shared = problem.caches[0][2]
    shared_slots = shared.flatten().long()
    grouped_tables, shared_tables = [], []
    for _, _, _, k, v in problem.caches:
        kp, vp = as_pages(torch.empty_like(k)), as_pages(torch.empty_like(v))
        kp[grouped], vp[grouped] = as_pages(k), as_pages(v)
        grouped_tables.append((kp, vp, grouped.view(batch, pages).to(torch.int32)))
        kp, vp = as_pages(torch.empty_like(k)), as_pages(torch.empty_like(v))
        kp[shared_slots], vp[shared_slots] = as_pages(k), as_pages(v)
        shared_tables.append((kp, vp, shared))

    def call(layout: str):
        def run(i: int) -> torch.Tensor:
            kp, vp, table, k, v = problem.caches[i]
            if layout == "contiguous":
                kp, vp, table = k, v, None
            elif layout == "in order":
                kp, vp, table = as_pages(k), as_pages(v), in_order
            elif layout == "2 MB groups":
                kp, vp, table = grouped_tables[i]
            elif layout == "one table":
                kp, vp, table = shared_tables[i]
            return decode_fwd(
                problem.q, kp, vp, problem.seqlens, softmax_scale=problem.head_dim**-0.5, block_table=table,
                window_size=(-1, 0),
            )[0]  # fmt: skip

        return run

    calls = {"contiguous": call("contiguous"), "paged": call("random")}
    calls["paged in order"] = call("in order")
    calls["paged 2 MB groups"] = call("2 MB groups")
    calls["paged one table"] = call("one table")
    return calls


def margin_variants(problem: Problem) -> dict[str, object]:
    """The default call, and the TMA kernel at 64-row tiles with rings of 2, 3 and 4 (one program an SM
    fits 4) at the default split count; at batch 1 without pages also half and twice the splits (three rings
    each) and cuDNN; with pages the same keys contiguous first."""
    auto = _auto_splits(problem)
    default = configs.decode_tma_config(problem.head_dim)
    calls = {}
    if problem.page_size:
        calls["contiguous"] = lambda i: decode_fwd(
            problem.q, *problem.caches[i][3:], problem.seqlens, softmax_scale=problem.head_dim**-0.5,
            window_size=(-1, 0),
        )[0]  # fmt: skip
    calls[f"default (splits {auto})"] = _ours(problem, "tma", None)
    ring = (default.MAX_BLOCK_M, default.BLOCK_N, default.num_warps)
    split_counts = [auto] if problem.page_size or problem.batch > 1 else [auto, max(1, auto // 2), 2 * auto]
    for splits in split_counts:
        for stages in (2, 3, 4):
            calls[f"splits {splits} ring {stages}"] = _ours(
                problem, "tma", configs.DecodeConfig(*ring, stages), splits
            )
    if not problem.page_size:
        calls["sdpa cudnn"] = lambda i: problem.sdpa(i, SDPBackend.CUDNN_ATTENTION)
    return calls


def variants(problem: Problem, quick: bool) -> dict[str, object]:
    def ours(kernel: str, config: configs.DecodeConfig | None):
        return _ours(problem, kernel, config)

    calls = {"portable": ours("portable", None)}
    for tiling in TMA_TILINGS[:1] if quick else TMA_TILINGS:
        calls["tma " + "/".join(map(str, tiling))] = ours("tma", configs.DecodeConfig(*tiling))
    if not problem.page_size:
        calls["sdpa cudnn"] = lambda i: problem.sdpa(i, SDPBackend.CUDNN_ATTENTION)
    return calls


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the default tiling only")
    modes = ("tilings", "splits", "head-dims", "paged", "margins")
    parser.add_argument("--mode", choices=modes, default="tilings")
    parser.add_argument(
        "--shape", nargs=4, type=int, action="append", metavar=("B", "L", "G", "PAGE"),
        help="margins: time this shape (PAGE 0: contiguous) instead of the default ones; repeatable",
    )  # fmt: skip
    args = parser.parse_args()
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    # (batch, cache, GQA group, page size, head dim)
    if args.mode == "tilings":
        shapes = [(1, n, g, None, 128) for g in (4, 1, 8) for n in (4096, 16384, 65536, 131072)]
        shapes += [(16, 16384, 4, None, 128), (64, 4096, 8, None, 128)]
        shapes += [(1, n, 4, p, 128) for n in (4096, 131072) for p in (64, 256)]
        shapes += [(16, 16384, 4, p, 128) for p in (16, 64, 256)] + [(64, 4096, 8, 64, 128)]
    elif args.mode == "splits":
        shapes = [(1, n, g, None, 128) for g in (1, 8, 4) for n in (4096, 16384, 32768, 65536, 131072)]
    elif args.mode == "paged":
        shapes = [(1, 4096, 4, p, 128) for p in (64, 256)] + [(1, 131072, 4, 64, 128)]
        shapes += [(16, n, 4, 64, 128) for n in (4096, 16384, 131072)] + [(16, 131072, 4, 256, 128)]
    elif args.mode == "margins":
        shapes = [(1, n, 1, None, 128) for n in (4096, 16384)] + [(1, 4096, 4, 64, 128)]
        shapes += [(16, 131072, 4, p, 128) for p in (64, 256)] + [(64, 16384, 4, 256, 128)]
        if args.shape:
            shapes = [(b, n, g, p or None, 128) for b, n, g, p in args.shape]
    else:
        shapes = [(b, n, 4, None, d) for d in (64, 256) for b, n in ((1, 4096), (1, 65536), (16, 16384))]
    print("shape,variant,round,p20_us,p50_us,p80_us", flush=True)
    for batch, seqlen, group, page, head_dim in shapes:
        problem = Problem(batch, seqlen, group, 1, page, head_dim)
        if args.mode == "splits":
            calls = split_variants(problem)
        elif args.mode == "head-dims":
            calls = head_dim_variants(problem)
        elif args.mode == "paged":
            calls = paged_variants(problem)
        elif args.mode == "margins":
            calls = margin_variants(problem)
        else:
            calls = variants(problem, args.quick)
        for name, call in list(calls.items()):
            if name.startswith("sdpa"):
                continue
            try:
                err, base = problem.check(call(0))
            except Exception as error:  # a variant that does not compile or launch is reported, not timed
                print(f"# {problem.label()} {name}: {type(error).__name__}: {error}"[:400], flush=True)
                del calls[name]
                continue
            verdict = "ok" if err <= 2 * base + 1e-5 else "FAIL"
            print(f"# {problem.label()} {name}: max|err| {err:.2e} (bf16 {base:.2e}) {verdict}", flush=True)
        p50s = problem.time_rounds(calls, args.rounds, args.reps)
        base_name = next(n for n in ("sdpa cudnn", "contiguous", "portable") if n in p50s)
        base_ms = statistics.median(p50s[base_name])
        for name, times in p50s.items():
            ms = statistics.median(times)
            tbs = problem.kv_bytes / (ms * 1e-3) / 1e12
            print(f"## {problem.label()} {name:<18} {ms * 1e3:8.2f} µs  {tbs:5.2f} TB/s  "
                  f"{base_ms / ms:5.2f}x {base_name}", flush=True)  # fmt: skip
        del problem, calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
