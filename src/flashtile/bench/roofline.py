"""``flashtile roofline``: the IO accounting of one attention shape, and with ``--measure`` a roofline plot.

Without ``--measure`` it prints the FLOPs, HBM bytes and arithmetic intensity of the naive, tiled and
minimum algorithms (``io_model``), term by term for the forward; the default shape is the worked example
of ``docs/design/io_accounting.md``. With ``--measure`` it measures the device's ceilings (``ceilings``),
times the forward of naive attention, each available peer and flashtile at that shape, appends a row per
implementation to ``DIR/roofline.csv`` (``--out-dir``, default ``./flashtile-results``) and draws them on a
log-log roofline, ``DIR/roofline.png``.

Each implementation is placed at the intensity of the algorithm it runs: ``naive`` for the reference that
materialises S and P, ``tiled`` (with ``--block-m``/``--block-n``) for flashtile and the fused peers, whose
own tile sizes may differ. The model counts every K/V re-read as HBM traffic; on a GPU, programs working on
the same head share those re-reads through L2, so a fused kernel can sit above the bandwidth roof.

    flashtile roofline                       # the worked example, N = 2048, D = 64, fp32, B_r = 64
    flashtile roofline --measure --batch 8 --heads 16 --seqlen 2048 --head-dim 128 --dtype bf16 \\
        --block-m 128 --block-n 128
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from flashtile.bench.ceilings import PROVENANCE_COLUMNS, Ceilings, measure_ceilings, provenance
from flashtile.bench.grid import DTYPES, Config
from flashtile.bench.io_model import Algorithm, AttentionShape, Traffic, account
from flashtile.bench.peers import AttentionFn, available_peers
from flashtile.bench.results import add_output_arguments, append_rows, check_output, device_of, output_csv
from flashtile.bench.timing import TimingBudget, rotation_copies, time_calls

COLUMNS = (
    *PROVENANCE_COLUMNS,
    "impl",
    "io_model",
    "batch",
    "heads",
    "seqlen_q",
    "seqlen_k",
    "head_dim",
    "dtype",
    "causal",
    "block_m",
    "block_n",
    "flops",
    "hbm_bytes",
    "intensity",
    "p20_ms",
    "p50_ms",
    "p80_ms",
    "achieved_tflops",
    "matmul_tflops",
    "copy_tbps",
    "roof_tflops",
    "status",
    "note",
)


@dataclass(frozen=True)
class Contender:
    """One implementation: ``fn(q, k, v, causal, softmax_scale) -> out`` on (B, N, H, D) tensors,
    differentiable, and the IO model (``naive`` or ``tiled``) of the algorithm it runs."""

    name: str
    fn: AttentionFn | None
    io_model: Algorithm
    unavailable: str | None = None
    supports: Callable[[Config], str | None] | None = None

    def skip(self, config: Config) -> tuple[str, str] | None:
        """``(status, reason)`` when this implementation cannot run ``config``, None when it can."""
        if self.fn is None or self.unavailable is not None:
            return "unavailable", self.unavailable or "not available"
        reason = self.supports(config) if self.supports is not None else None
        return ("unsupported", reason) if reason else None


def make_config(shape: AttentionShape, dtype: str, device: torch.device, mode: str) -> Config:
    """The benchmark grid's description of one call, as the peers' ``supports`` expects it."""
    return Config(
        device=device.type,
        dtype=dtype,
        mode=mode,
        causal=shape.causal,
        batch=shape.batch,
        heads=shape.heads,
        heads_kv=shape.heads,
        seqlen_q=shape.seqlen_q,
        seqlen_k=shape.seqlen_k,
        head_dim=shape.head_dim,
    )


def _io_model_of(name: str) -> Algorithm:
    """Implementations that materialise S and P (the naive reference, SDPA's math path) sit on the naive
    model; fused kernels on the tiled one."""
    lowered = name.lower()
    return "naive" if "math" in lowered or "naive" in lowered else "tiled"


def contenders(
    device: torch.device, only: Sequence[str] | None = None, *, flex_compile: str = "static"
) -> list[Contender]:
    """flashtile, the peers available on ``device`` and the naive reference; ``only`` keeps the named ones.
    ``flex_compile`` "dynamic" compiles FlexAttention once for every sequence length (``memory``'s sweep)."""
    found = [
        Contender(p.name, p.fn, _io_model_of(p.name), p.unavailable, p.supports)
        for p in available_peers(device.type, flex_compile=flex_compile)
    ]
    if only:
        unknown = set(only) - {c.name for c in found}
        if unknown:
            raise ValueError(
                f"--impls names {sorted(unknown)}; the implementations here are {[c.name for c in found]}"
            )
        found = [c for c in found if c.name in only]
    return found


def usage_error(command: str, error: ValueError) -> int:
    """Report a flag value found bad after parsing as ``flashtile COMMAND: message`` on stderr; returns 2,
    argparse's exit status for usage errors (as ``flashtile bench`` and ``flashtile check``)."""
    print(f"flashtile {command}: {error}", file=sys.stderr)
    return 2


def positive_int(text: str) -> int:
    """argparse type of a size flag: an integer, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def failure_status(error: BaseException) -> tuple[str, str]:
    """("oom" | "error", one-line note) for an exception raised by an implementation."""
    text = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    lowered = str(error).lower()
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in lowered or "can't allocate" in lowered:
        return "oom", text
    return "error", text


def _shape_from_args(args: argparse.Namespace) -> AttentionShape:
    return AttentionShape(
        batch=args.batch,
        heads=args.heads,
        seqlen_q=args.seqlen,
        seqlen_k=args.seqlen,
        head_dim=args.head_dim,
        dtype_bytes=DTYPES[args.dtype].itemsize,
        block_m=args.block_m,
        block_n=args.block_n,
        causal=args.causal,
    )


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.2f}"


def accounting_tables(shape: AttentionShape) -> list[Table]:
    """The summary of every algorithm and direction, then the forward terms of naive and tiled."""
    traffic = account(shape)
    summary = Table(
        title=(
            f"IO accounting: B={shape.batch} H={shape.heads} N_q={shape.seqlen_q} N_k={shape.seqlen_k} "
            f"D={shape.head_dim}, {shape.dtype_bytes}-byte elements, B_r={shape.block_m} "
            f"B_c={shape.block_n}, {'causal' if shape.causal else 'non-causal'} "
            f"(T_r={shape.row_blocks}, T_c={shape.col_blocks})"
        )
    )
    for col in ("direction", "algorithm", "FLOPs", "HBM bytes", "MiB", "FLOP/byte"):
        summary.add_column(col, justify="left" if col in ("direction", "algorithm") else "right")
    for t in traffic:
        summary.add_row(
            t.direction,
            t.algorithm,
            f"{t.flops:,}",
            f"{t.hbm_bytes:,}",
            _mib(t.hbm_bytes),
            f"{t.intensity:.2f}",
        )
    tables = [summary]
    for t in traffic[:2]:
        terms = Table(title=f"{t.algorithm} {t.direction}: terms")
        for col in ("term", "elements", "bytes"):
            terms.add_column(col, justify="left" if col == "term" else "right")
        for term in t.terms:
            terms.add_row(term.what, f"{term.elements:,}", f"{term.nbytes:,}")
        terms.add_row("total", "", f"{t.hbm_bytes:,}", style="bold")
        tables.append(terms)
    return tables


def _random_inputs(
    shape: AttentionShape, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q_shape = (shape.batch, shape.seqlen_q, shape.heads, shape.head_dim)
    kv_shape = (shape.batch, shape.seqlen_k, shape.heads, shape.head_dim)
    return (
        torch.randn(q_shape, device=device, dtype=dtype),
        torch.randn(kv_shape, device=device, dtype=dtype),
        torch.randn(kv_shape, device=device, dtype=dtype),
    )


def measure_points(
    shape: AttentionShape,
    dtype: str,
    device: torch.device,
    ceilings: Ceilings,
    impls: Sequence[Contender],
    budget: TimingBudget,
) -> list[dict[str, object]]:
    """Time the forward of each implementation and return one CSV row each (failures included)."""
    traffic = account(shape)
    models: dict[str, Traffic] = {"naive": traffic[0], "tiled": traffic[1]}
    minimum = traffic[2]
    config = make_config(shape, dtype, device, "fwd")
    input_bytes = (
        (shape.seqlen_q + 2 * shape.seqlen_k) * shape.heads_total * shape.head_dim * shape.dtype_bytes
    )
    copies = rotation_copies(minimum.hbm_bytes, input_bytes, device)
    inputs = [_random_inputs(shape, DTYPES[dtype], device) for _ in range(copies)]
    scale = shape.head_dim**-0.5
    base = provenance(device)
    rows: list[dict[str, object]] = []
    for impl in impls:
        model = models[impl.io_model]
        row: dict[str, object] = {
            **base,
            "impl": impl.name,
            "io_model": impl.io_model,
            "batch": shape.batch,
            "heads": shape.heads,
            "seqlen_q": shape.seqlen_q,
            "seqlen_k": shape.seqlen_k,
            "head_dim": shape.head_dim,
            "dtype": dtype,
            "causal": "true" if shape.causal else "false",
            "block_m": shape.block_m,
            "block_n": shape.block_n,
            "flops": model.flops,
            "hbm_bytes": model.hbm_bytes,
            "intensity": f"{model.intensity:.6g}",
            "matmul_tflops": f"{ceilings.matmul_flops / 1e12:.6g}",
            "copy_tbps": f"{ceilings.copy_bandwidth / 1e12:.6g}",
            "roof_tflops": f"{ceilings.attainable(model.intensity) / 1e12:.6g}",
            "status": "ok",
            "note": "",
        }
        skip = impl.skip(config)
        if skip is not None:
            row.update(status=skip[0], note=skip[1])
            rows.append(row)
            continue
        fn = impl.fn
        assert fn is not None
        try:
            with torch.no_grad():
                timing = time_calls(
                    lambda i, fn=fn: fn(*inputs[i], shape.causal, scale), copies, device, budget
                )
        except Exception as e:  # a benchmark records a failing implementation and goes on to the next
            status, note = failure_status(e)
            row.update(status=status, note=note)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            row.update(
                p20_ms=f"{timing.p20_ms:.6g}",
                p50_ms=f"{timing.p50_ms:.6g}",
                p80_ms=f"{timing.p80_ms:.6g}",
                achieved_tflops=f"{model.flops / timing.p50_ms / 1e9:.6g}",
            )
        rows.append(row)
    return rows


def plot_roofline(rows: Sequence[Mapping[str, object]], path: Path) -> None:
    """Log-log roofline from the CSV rows of one run: the measured roofs, a point per implementation."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, NullFormatter

    rate = EngFormatter(unit="FLOP/s")

    first = rows[0]
    peak = float(first["matmul_tflops"]) * 1e12
    bandwidth = float(first["copy_tbps"]) * 1e12
    points = [r for r in rows if r["status"] == "ok"]
    xs = [float(r["intensity"]) for r in points]
    ridge = peak / bandwidth
    lo = min([*xs, ridge]) / 8
    hi = max([*xs, ridge]) * 8
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]

    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.loglog(grid, [min(peak, bandwidth * x) for x in grid], color="black", linewidth=1.5)
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    ax.annotate(f"matmul ({first['dtype']}) {rate(peak)}", (hi, peak), ha="right", va="bottom", fontsize=8)
    ax.annotate(
        f"copy {EngFormatter(unit='B/s')(bandwidth)} (read + write)",
        (lo * 1.2, bandwidth * lo * 1.2),
        ha="left",
        fontsize=8,
    )
    ys = [float(r["achieved_tflops"]) * 1e12 for r in points]
    markers = itertools.cycle("os^Dvp*hX")
    for row, x, y in zip(points, xs, ys, strict=True):
        ax.loglog(
            [x], [y], marker=next(markers), linestyle="none", label=f"{row['impl']} ({row['io_model']} IO)"
        )
    # At least two decades, so that the log axis carries several labels.
    ax.set_ylim(min([y for y in ys if y > 0] + [bandwidth * lo, peak / 100]) / 2, peak * 3)
    ax.xaxis.set_major_formatter(EngFormatter())
    ax.yaxis.set_major_formatter(rate)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("arithmetic intensity, FLOP per HBM byte (modelled)")
    ax.set_ylabel("achieved (forward)")
    ax.set_title(
        f"{first['gpu']}: B={first['batch']} H={first['heads']} N={first['seqlen_q']} D={first['head_dim']} "
        f"{first['dtype']} {'causal' if first['causal'] == 'true' else 'non-causal'}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    if points:
        ax.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)


def results_table(rows: Sequence[Mapping[str, object]]) -> Table:
    first = rows[0]
    table = Table(
        title=f"forward on {first['gpu']}: matmul {first['matmul_tflops']} TFLOP/s, "
        f"copy {first['copy_tbps']} TB/s"
    )
    for col in ("impl", "IO", "FLOP/B", "p50 ms", "TFLOP/s", "roof", "% roof", "status"):
        table.add_column(col, justify="left" if col in ("impl", "IO", "status") else "right")
    for r in rows:
        ok = r["status"] == "ok"
        achieved, roof = (float(r["achieved_tflops"]), float(r["roof_tflops"])) if ok else (0.0, 0.0)
        table.add_row(
            str(r["impl"]),
            str(r["io_model"]),
            f"{float(r['intensity']):.1f}",
            f"{float(r['p50_ms']):.3g}" if ok else "",
            f"{achieved:.3g}" if ok else "",
            f"{float(r['roof_tflops']):.3g}",
            f"{100 * achieved / roof:.0f}" if ok else "",
            "ok" if ok else f"[red]{r['status']}[/red]: {r['note']}",
        )
    return table


def run(args: argparse.Namespace) -> int:
    """The ``flashtile roofline`` command; returns the exit status (2 for a bad flag value)."""
    try:
        shape = _shape_from_args(args)
        if args.measure:
            device = device_of(args.device)
            impls = contenders(device, args.impls.split(",") if args.impls else None)
            # A CSV that cannot be written is found now, before the ceilings are measured.
            check_output(output_csv(args), COLUMNS)
    except ValueError as exc:
        return usage_error("roofline", exc)
    console = Console()
    for table in accounting_tables(shape):
        console.print(table)
    if not args.measure:
        return 0
    ceilings = measure_ceilings(device, DTYPES[args.dtype])
    budget = TimingBudget(25, 100, 10, 200) if device.type == "cuda" else TimingBudget(5, 50, 3, 10)
    rows = measure_points(shape, args.dtype, device, ceilings, impls, budget)
    csv_path = output_csv(args)
    append_rows(csv_path, rows, COLUMNS)
    plot_roofline(rows, csv_path.with_suffix(".png"))
    console.print(results_table(rows))
    if ceilings.is_cpu:
        console.print("[yellow]CPU numbers: roofs and points measured on the CPU, not a GPU.[/yellow]")
    console.print(f"appended {len(rows)} rows to {csv_path}; plot in {csv_path.with_suffix('.png')}")
    return 0 if all(r["status"] == "ok" for r in rows if r["impl"] == "flashtile") else 1


def add_common_arguments(parser: argparse.ArgumentParser, name: str, *, heads: int, head_dim: int) -> None:
    """The shape, device, implementation and output (``name``: the file stem) flags of ``roofline`` and
    ``memory``."""
    parser.add_argument("--batch", type=positive_int, default=1, help="B (default 1)")
    parser.add_argument("--heads", type=positive_int, default=heads, help=f"H (default {heads})")
    parser.add_argument("--head-dim", type=positive_int, default=head_dim, help=f"D (default {head_dim})")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cuda, cuda:1, cpu")
    parser.add_argument("--impls", default=None, help="comma-separated implementations (default all)")
    add_output_arguments(parser, name)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``flashtile roofline``."""
    parser = subparsers.add_parser(
        "roofline",
        help="HBM traffic and arithmetic intensity of naive vs tiled attention; --measure plots a roofline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser, "roofline", heads=1, head_dim=64)
    parser.add_argument("--seqlen", type=positive_int, default=2048, help="N_q = N_k (default 2048)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="element type (default fp32)")
    parser.add_argument(
        "--block-m", type=positive_int, default=64, help="B_r, query rows per program (default 64)"
    )
    parser.add_argument("--block-n", type=positive_int, default=64, help="B_c, keys per step (default 64)")
    parser.add_argument("--causal", action="store_true", help="bottom-right causal mask")
    parser.add_argument(
        "--measure", action="store_true", help="measure ceilings, time each implementation, plot"
    )
    parser.set_defaults(func=run)
    return parser
