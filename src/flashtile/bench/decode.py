"""``flashtile bench --decode``: decoding against a KV cache, in µs and TB/s against the GPU's copy bandwidth.

Each cell is one decode step: ``seqlen_q`` query tokens of 32 heads (D = 128, bf16) against caches of
``cache_len`` keys, contiguous or paged. flashtile, SDPA's cuDNN and flash backends and flash_attn (when
importable) read the same keys; each is first checked on sequence 0 against float64 attention under the 2×
rule (the bf16 baseline's error), then timed. Times come from CUDA-graph replays (a serving engine's decode
step is a graph; eager timing would measure Python's launch cost), each replay rotating over enough cache
copies that the caches do not stay in L2. TB/s counts K and V read once; the copy bandwidth is a 2 GiB
device-to-device copy (read + write) timed in the same run. A paged cell also times flashtile on the same keys
laid out contiguously, in its own rounds (a paired paged-against-contiguous comparison), and the run ends with
the grid's targets (:func:`summary`).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from flashtile.bench import results
from flashtile.reference.compare import OUTPUT_FACTOR, compare

HEADS, HEAD_DIM, DTYPE = 32, 128, torch.bfloat16
# Cells whose caches exceed this are skipped (a copy of the caches is made for the paged layout).
MAX_CACHE_BYTES = 16 * 2**30
COLUMNS = (
    *results.COLUMNS[: results.COLUMNS.index("date") + 1],
    "impl",
    "batch",
    "heads",
    "heads_kv",
    "seqlen_q",
    "cache_len",
    "page_size",
    "head_dim",
    "dtype",
    "p20_us",
    "p50_us",
    "p80_us",
    "tb_per_s",
    "copy_tb_per_s",
    "of_copy",
    "status",
    "detail",
)


@dataclass(frozen=True)
class DecodeCell:
    batch: int
    cache_len: int
    gqa: int
    seqlen_q: int
    page_size: int | None

    @property
    def heads_kv(self) -> int:
        return HEADS // self.gqa

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * self.heads_kv * self.cache_len * HEAD_DIM * DTYPE.itemsize

    def label(self) -> str:
        page = f" page {self.page_size}" if self.page_size else ""
        return f"B={self.batch} L={self.cache_len // 1024}k G={self.gqa} Nq={self.seqlen_q}{page}"


def cells(quick: bool) -> list[DecodeCell]:
    """The grid: contiguous caches over batch × length × GQA × query tokens, and paged caches of each page
    size at GQA 4; cells past MAX_CACHE_BYTES are left out. ``quick``: a subset that answers the targets."""
    if quick:
        grid = itertools.product((1, 16), (4096, 32768), (4,), (1,), (None, 64))
    else:
        contiguous = itertools.product(
            (1, 4, 16, 64, 256), (1024, 4096, 16384, 65536, 131072), (1, 4, 8), (1, 4), (None,)
        )
        paged = itertools.product((1, 16, 64), (4096, 16384, 131072), (4,), (1, 4), (16, 64, 256))
        grid = itertools.chain(contiguous, paged)
    found = [DecodeCell(*c) for c in grid]
    return [c for c in found if c.kv_bytes <= MAX_CACHE_BYTES]


# Replays before the timed ones, for at least this long: the first timed implementation of a cell used to
# read up to 17 % slower in the first ~10 ms of replays than minutes of replays later (H100, batch 1,
# 128k cache: 214.5 µs p50 in a shape's first round, 183.8 in its second; docs/design/decode.md,
# "Timing"), which made the first-timed implementation, flashtile, pay for the GPU's wake-up.
WARMUP_MS = 30.0


def graph_time_ms(calls: list[Callable[[], object]], reps: int = 20) -> tuple[float, float, float]:
    """p20/p50/p80 of one call's time, from CUDA-graph replays of ``calls`` (one per input copy), after
    replays for WARMUP_MS."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    warm_start = time.perf_counter()
    while True:
        graph.replay()
        torch.cuda.synchronize()
        if (time.perf_counter() - warm_start) * 1e3 >= WARMUP_MS:
            break
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    q = torch.tensor(times, dtype=torch.float64).quantile(torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))
    return float(q[0]), float(q[1]), float(q[2])


def copy_bandwidth() -> float:
    """Bytes per second of a 2 GiB device-to-device copy, counting its read and its write."""
    n = 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    _, ms, _ = graph_time_ms([lambda: dst.copy_(src)], reps=10)
    return 2 * n / (ms * 1e-3)


class Problem:
    """q, cache_seqlens and rotated caches of a cell; ``caches[i]`` is ``(k, v, block_table, k_dense,
    v_dense)`` where the dense views are the same keys as (B, L, H_KV, D)."""

    def __init__(self, cell: DecodeCell) -> None:
        self.cell = cell
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.copies = max(1, min(8, math.ceil(3 * l2 / cell.kv_bytes)))
        b, length, hkv = cell.batch, cell.cache_len, cell.heads_kv
        self.q = torch.randn(b, cell.seqlen_q, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
        self.seqlens = torch.full((b,), length, dtype=torch.int32, device="cuda")
        self.caches = []
        for _ in range(self.copies):
            k = torch.randn(b, length, hkv, HEAD_DIM, device="cuda", dtype=DTYPE)
            v = torch.randn_like(k)
            if cell.page_size:
                pages = length // cell.page_size
                perm = torch.randperm(b * pages, device="cuda")
                table = perm.view(b, pages).to(torch.int32)
                kp = torch.empty(b * pages, cell.page_size, hkv, HEAD_DIM, device="cuda", dtype=DTYPE)
                vp = torch.empty_like(kp)
                kp[perm] = k.view(b * pages, cell.page_size, hkv, HEAD_DIM)
                vp[perm] = v.view(b * pages, cell.page_size, hkv, HEAD_DIM)
                self.caches.append((kp, vp, table, k, v))
            else:
                self.caches.append((k, v, None, k, v))

    def oracle(self, dtype: torch.dtype) -> torch.Tensor:
        """Bottom-right causal attention of sequence 0 in ``dtype`` (softmax in fp32 at least)."""
        from flashtile.reference.naive import attention

        k, v = self.caches[0][3:]
        return attention(self.q[:1].to(dtype), k[:1].to(dtype), v[:1].to(dtype), causal=True)[0]


def _decode(p: Problem, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor | None) -> torch.Tensor:
    from flashtile.kernels.decode import decode_fwd

    scale = HEAD_DIM**-0.5
    return decode_fwd(p.q, k, v, p.seqlens, softmax_scale=scale, block_table=table, window_size=(-1, 0))[0]


def _flashtile(p: Problem, i: int) -> torch.Tensor:
    return _decode(p, *p.caches[i][:3])


def _flashtile_contiguous(p: Problem, i: int) -> torch.Tensor:
    """flashtile on the same keys as a paged cell's, laid out contiguously: timed in the paged cell's rounds,
    so that paged against contiguous is a paired comparison (same q, keys, rounds and GPU state)."""
    return _decode(p, *p.caches[i][3:], None)


# The implementation a paged cell adds beside the others (see _flashtile_contiguous).
PAIRED_CONTIGUOUS = "flashtile_contiguous"


def _sdpa(backend_name: str) -> Callable[[Problem, int], torch.Tensor]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backend = getattr(SDPBackend, backend_name)

    def call(p: Problem, i: int) -> torch.Tensor:
        if p.cell.page_size:
            raise NotImplementedError("SDPA has no paged KV cache")
        k, v = p.caches[i][3:]
        mask = None
        if p.cell.seqlen_q > 1:
            # Bottom-right causal for the speculative tokens; flash takes no mask and reports so.
            ones = torch.ones(p.cell.seqlen_q, p.cell.cache_len, dtype=torch.bool, device="cuda")
            mask = ones.tril(p.cell.cache_len - p.cell.seqlen_q)
        with sdpa_kernel(backend):
            out = scaled_dot_product_attention(
                p.q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                enable_gqa=p.cell.gqa > 1,
            )  # fmt: skip
        return out.transpose(1, 2)

    return call


def _flash_attn() -> Callable[[Problem, int], torch.Tensor] | None:
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None

    def call(p: Problem, i: int) -> torch.Tensor:
        if p.cell.page_size and p.cell.page_size % 256:
            raise NotImplementedError("flash_attn pages must be multiples of 256")
        k, v, table = p.caches[i][:3]
        return flash_attn_with_kvcache(p.q, k, v, cache_seqlens=p.seqlens, block_table=table, causal=True)

    return call


def implementations() -> dict[str, Callable[[Problem, int], torch.Tensor]]:
    found = {
        "flashtile": _flashtile,
        "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
        "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    }
    fa = _flash_attn()
    if fa is not None:
        found["flash_attn"] = fa
    return found


# Each implementation of a cell is timed in this many rounds, the implementations in turn (each first once),
# and the median round is reported: a cell's timings on an H100 still had occasional slow rounds of 10-25 %
# after the warm-up, which struck one implementation of a cell and not the next. Five, not three: with
# three, one slow round left the median to the slower of the other two (batch 1, 4k, pages of 256, s16h:
# rounds 12.49, 23.79 and 13.30 µs read 13.30).
ROUNDS = 5


def measure(cell: DecodeCell, impls: dict, env: results.Environment, copy_bw: float) -> list[dict]:
    """One row per implementation for ``cell``: checked, then timed in ROUNDS rounds (their medians)."""
    problem = Problem(cell)
    if cell.page_size:
        impls = {**impls, PAIRED_CONTIGUOUS: _flashtile_contiguous}
    out64 = problem.oracle(torch.float64)
    out_low = problem.oracle(DTYPE)
    rows: dict[str, dict] = {}
    checks = {}
    for name, fn in impls.items():
        rows[name] = {
            **env.__dict__, "impl": name, "batch": cell.batch, "heads": HEADS, "heads_kv": cell.heads_kv,
            "seqlen_q": cell.seqlen_q, "cache_len": cell.cache_len, "page_size": cell.page_size or "",
            "head_dim": HEAD_DIM, "dtype": "bf16", "copy_tb_per_s": f"{copy_bw / 1e12:.3f}",
        }  # fmt: skip
        try:
            check = compare("out", fn(problem, 0)[:1], out64, out_low, OUTPUT_FACTOR)
            if not check.passed:
                rows[name].update(status="wrong", detail=str(check))
                continue
            checks[name] = check
        except NotImplementedError as exc:
            rows[name].update(status="unsupported", detail=str(exc))
        except RuntimeError as exc:
            status = "unsupported" if "No available kernel" in str(exc) else "error"
            rows[name].update(status=status, detail=str(exc).splitlines()[0][:300])
    timed = list(checks)
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in timed}
    for r in range(ROUNDS):
        first = r % max(len(timed), 1)
        for name in timed[first:] + timed[:first]:
            fn = impls[name]
            times[name].append(
                graph_time_ms([functools.partial(fn, problem, i) for i in range(problem.copies)])
            )
    for name in timed:
        p20, p50, p80 = (statistics.median(t[q] for t in times[name]) for q in range(3))
        tbs = cell.kv_bytes / (p50 * 1e-3)
        check = checks[name]
        rounds = ", ".join(f"{t[1] * 1e3:.2f}" for t in times[name])
        rows[name].update(
            p20_us=f"{p20 * 1e3:.2f}", p50_us=f"{p50 * 1e3:.2f}", p80_us=f"{p80 * 1e3:.2f}",
            tb_per_s=f"{tbs / 1e12:.3f}", of_copy=f"{tbs / copy_bw:.3f}", status="ok",
            detail=f"max|err| {check.max_abs_error:.2e} (allowed {check.allowed:.2e}); "
            f"{problem.copies} cache copies; median of {ROUNDS} rounds (p50s {rounds} µs)",
        )  # fmt: skip
    return list(rows.values())


# The targets the summary checks: batch ≥ TARGET_BATCH at caches ≥ TARGET_CACHE reach TARGET_OF_COPY of the
# copy bandwidth; batch 1 at caches ≥ 4k is at least as fast as cuDNN; paged caches of pages ≥ 64 run within
# 5 % of contiguous ones.
TARGET_BATCH, TARGET_CACHE, TARGET_OF_COPY = 16, 16384, 0.90
BATCH_ONE_MIN_CACHE = 4096
PAGED_MIN_PAGE, PAGED_WITHIN = 64, 0.95


def summary(rows: list[dict[str, str]]) -> list[str]:
    """The grid's targets, one line each, from one run's rows: each as met cells / cells and the worst cell.

    Paged against contiguous is given twice: against the contiguous cell of the same shape (timed minutes
    apart, other keys) and against the same keys laid out contiguously, timed in the paged cell's rounds
    (PAIRED_CONTIGUOUS; a paired comparison, free of the drift between cells).
    """

    def key(r: dict[str, str]) -> tuple:
        """(impl, batch, heads_kv, seqlen_q, cache_len, page size or 0)."""
        shape = (r["batch"], r["heads_kv"], r["seqlen_q"], r["cache_len"], r["page_size"] or 0)
        return (r["impl"], *map(int, shape))

    ok = [(key(r), r) for r in rows if r["status"] == "ok"]
    p50 = {k: float(r["p50_us"]) for k, r in ok}

    def line(name: str, ratios: list[tuple[float, str]], bound: float) -> str:
        if not ratios:
            return f"{name}: no cells"
        worst, where = min(ratios)
        met = sum(ratio >= bound for ratio, _ in ratios)
        return f"{name}: {met} of {len(ratios)} cells (worst {worst:.3f}, {where})"

    def label(batch: int, heads_kv: int, seqlen_q: int, cache: int, page: int = 0) -> str:
        paged = f" page {page}" if page else ""
        return f"B={batch} L={cache // 1024}k G={HEADS // heads_kv} Nq={seqlen_q}{paged}"

    copy = [
        (float(r["of_copy"]), label(*k[1:]))
        for k, r in ok
        if k[0] == "flashtile" and k[1] >= TARGET_BATCH and k[4] >= TARGET_CACHE
    ]
    batch_one = [
        (p50[("sdpa_cudnn", *k[1:])] / us, label(*k[1:]))
        for k, us in p50.items()
        if k[0] == "flashtile" and k[1] == 1 and k[4] >= BATCH_ONE_MIN_CACHE and k[5] == 0
        and ("sdpa_cudnn", *k[1:]) in p50
    ]  # fmt: skip
    paged = [k for k in p50 if k[0] == "flashtile" and k[5] >= PAGED_MIN_PAGE]
    across = [
        (p50[("flashtile", *k[1:5], 0)] / p50[k], label(*k[1:]))
        for k in paged
        if ("flashtile", *k[1:5], 0) in p50
    ]
    paired = [
        (p50[(PAIRED_CONTIGUOUS, *k[1:])] / p50[k], label(*k[1:]))
        for k in paged
        if (PAIRED_CONTIGUOUS, *k[1:]) in p50
    ]
    big = f"batch ≥ {TARGET_BATCH}, cache ≥ {TARGET_CACHE // 1024}k"
    paged_name = f"paged (pages ≥ {PAGED_MIN_PAGE}) within {1 - PAGED_WITHIN:.0%} of"
    return [
        line(f"{big}: ≥ {TARGET_OF_COPY:.0%} of the copy bandwidth", copy, TARGET_OF_COPY),
        line(f"batch 1, cache ≥ {BATCH_ONE_MIN_CACHE // 1024}k: ≥ 1.0× SDPA cuDNN", batch_one, 1.0),
        line(f"{paged_name} the contiguous cell", across, PAGED_WITHIN),
        line(f"{paged_name} the same keys contiguous, paired", paired, PAGED_WITHIN),
    ]


def plot(csv_path: Path, date: str) -> Path | None:
    """TB/s against cache length, one panel per (batch, query tokens) at GQA 4; flashtile's paged caches
    dashed; the copy bandwidth as a grey line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in results.read_rows(csv_path) if r["date"] == date and r["status"] == "ok"]
    ok = [r for r in ok if int(r["heads"]) // int(r["heads_kv"]) == 4]
    if not ok:
        return None
    panels = sorted({(int(r["batch"]), int(r["seqlen_q"])) for r in ok})
    fig = Figure(figsize=(4 * len(panels), 3.6))
    FigureCanvasAgg(fig)
    for idx, (batch, seqlen_q) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), idx + 1)
        rows = [r for r in ok if int(r["batch"]) == batch and int(r["seqlen_q"]) == seqlen_q]
        series = sorted({(r["impl"], r["page_size"]) for r in rows})
        for impl, page in series:
            pts = sorted(
                (int(r["cache_len"]), float(r["tb_per_s"]))
                for r in rows
                if (r["impl"], r["page_size"]) == (impl, page)
            )
            label = f"{impl} page {page}" if page else impl
            ax.plot(*zip(*pts, strict=True), marker="o", linestyle="--" if page else "-", label=label)
        ax.axhline(float(rows[0]["copy_tb_per_s"]), color="grey", linewidth=0.8, label="copy")
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {batch}, {seqlen_q} query token(s), GQA 4", fontsize=9)
        ax.set_xlabel("cache length")
        ax.set_ylabel("TB/s (K+V once)")
        ax.legend(fontsize=6)
    fig.suptitle(f"decode, D=128 bf16, 32 heads · {ok[0]['gpu']}", fontsize=10)
    fig.tight_layout()
    path = csv_path.with_suffix(".png")
    fig.savefig(path, dpi=120)
    return path


def main(args: argparse.Namespace) -> int:
    """``flashtile bench --decode [--quick]``."""
    if args.paper or args.options:
        print("flashtile bench: --decode takes --quick, not --paper or --options", file=sys.stderr)
        return 2
    name = args.name or "bench_decode"
    csv_path = args.out_dir / f"{name}.csv"
    if args.plot_only:
        # Measure nothing, as --plot-only says: the CSV's latest run, summarised and drawn (no GPU needed).
        try:
            rows, date = results.latest_run(csv_path, COLUMNS)
        except ValueError as exc:
            print(f"flashtile bench: {exc}", file=sys.stderr)
            return 2
        for target in summary(rows):
            print(target, flush=True)
        path = plot(csv_path, date)
        print(f"plot: {path}" if path else f"no plot: the run of {date} has no timed GQA-4 cell")
        return 0
    if not torch.cuda.is_available() or args.device == "cpu":
        print("flashtile bench --decode: needs a CUDA device (times come from CUDA graphs)", file=sys.stderr)
        return 2
    try:
        results.check_output(csv_path, COLUMNS)
    except ValueError as exc:
        print(f"flashtile bench: {exc}", file=sys.stderr)
        return 2
    env = results.environment(torch.device("cuda"))
    copy_bw = copy_bandwidth()
    impls = implementations()
    grid = cells(args.quick)
    print(
        f"flashtile bench --decode on {env.gpu}: {len(grid)} cells × {', '.join(impls)}; copy bandwidth "
        f"{copy_bw / 1e12:.2f} TB/s → {csv_path}",
        flush=True,
    )
    started = time.monotonic()
    for cell in grid:
        try:
            rows = measure(cell, impls, env, copy_bw)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            print(f"{cell.label()}: out of memory, skipped", flush=True)
            continue
        results.append_rows(csv_path, rows, COLUMNS)
        line = ", ".join(
            f"{r['impl']} {r['p50_us']} µs {float(r['of_copy']):.0%}"
            if r["status"] == "ok"
            else f"{r['impl']} {r['status']}"
            for r in rows
        )
        print(f"{cell.label()}: {line}", flush=True)
        torch.cuda.empty_cache()
    print(f"{len(grid)} cells in {time.monotonic() - started:.0f} s", flush=True)
    for target in summary([r for r in results.read_rows(csv_path) if r["date"] == env.date]):
        print(target, flush=True)
    if not args.no_plot:
        path = plot(csv_path, env.date)
        if path:
            print(f"plot: {path}")
    return 0
