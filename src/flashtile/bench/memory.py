"""``flashtile memory``: peak extra memory of one forward + backward against sequence length.

For each implementation (flashtile, the naive reference, the peers) and N doubling from ``--min-seqlen`` to
``--max-seqlen``: allocate Q, K, V and dO, run forward + backward once to warm up (compilation and workspaces
stay out of the number), then measure a second forward + backward. The first out-of-memory error stops that
implementation; the table reports the longest N each one survived. Rows go to
``DIR/memory.csv`` (``--out-dir``, default ``./flashtile-results``), the log-log plot of memory against N
to ``DIR/memory.png``.

What "extra memory" means:

- CUDA: ``torch.cuda.max_memory_allocated()`` during the measured run minus ``memory_allocated()`` just
  before it (after ``reset_peak_memory_stats``), so Q, K, V and dO are excluded and O, the LSE, the gradients,
  saved tensors and workspaces are included.
- CPU: the same difference taken on the process's resident set size: Linux's peak RSS (``VmHWM``), reset
  through ``/proc/self/clear_refs`` before the run, minus the RSS before it. It is coarser (allocator caching,
  pages), and reported as ``n/a`` where the kernel offers no reset.

Beside each measurement is the analytic extra memory of the algorithm the implementation runs
(``io_model.extra_memory``): linear in N for the tiled algorithm, quadratic for the naive one.

    flashtile memory                    # CUDA: B=1 H=16 D=128 causal bf16, N = 1k … 128k
    flashtile memory --max-seqlen 16384 --impls flashtile,naive
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from flashtile.bench.ceilings import PROVENANCE_COLUMNS, provenance
from flashtile.bench.grid import DTYPES
from flashtile.bench.io_model import AttentionShape, extra_memory
from flashtile.bench.results import append_rows, check_output, device_of, output_csv
from flashtile.bench.roofline import (
    AttentionFn,
    Contender,
    add_common_arguments,
    contenders,
    failure_status,
    make_config,
    positive_int,
    usage_error,
)

# (min, max) sequence length when --min-seqlen / --max-seqlen are not given.
DEFAULT_SEQLENS = {"cuda": (1024, 131072), "cpu": (256, 1024)}

COLUMNS = (
    *PROVENANCE_COLUMNS,
    "impl",
    "io_model",
    "batch",
    "heads",
    "seqlen",
    "head_dim",
    "dtype",
    "causal",
    "measure",
    "peak_extra_bytes",
    "model_bytes",
    "status",
    "note",
)


@dataclass(frozen=True)
class Point:
    """One implementation at one N: measured peak extra bytes (None when not measured) and the model's."""

    impl: str
    io_model: str
    seqlen: int
    status: str
    peak_extra_bytes: int | None
    model_bytes: int
    note: str = ""


def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def _trim_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc), so that a run reusing them shows in the RSS."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak_rss() -> bool:
    """Reset Linux's peak-RSS mark to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _proc_status_bytes("VmHWM")
    except OSError:
        return False
    return True


def measure_label(device: torch.device) -> str:
    if device.type == "cuda":
        return "cuda max_memory_allocated"
    return "cpu peak RSS (VmHWM)" if _reset_peak_rss() else "cpu: no peak-RSS reset (n/a)"


def peak_extra_bytes(
    fn: AttentionFn, shape: AttentionShape, dtype: torch.dtype, device: torch.device
) -> int | None:
    """Allocate the inputs, warm up, then return the peak extra bytes of one forward + backward
    (None on a CPU whose kernel cannot reset the peak RSS)."""
    gen = torch.Generator(device=device).manual_seed(shape.seqlen_q)
    q_shape = (shape.batch, shape.seqlen_q, shape.heads, shape.head_dim)
    kv_shape = (shape.batch, shape.seqlen_k, shape.heads, shape.head_dim)

    def randn(size: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(size, generator=gen, device=device, dtype=dtype)

    q, k, v = (randn(size).requires_grad_() for size in (q_shape, kv_shape, kv_shape))
    dout = randn(q_shape)
    scale = shape.head_dim**-0.5

    def step() -> None:
        fn(q, k, v, shape.causal, scale).backward(dout)

    step()
    q.grad = k.grad = v.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    gc.collect()
    _trim_heap()
    if not _reset_peak_rss():
        return None
    base = _proc_status_bytes("VmRSS")
    step()
    return _proc_status_bytes("VmHWM") - base


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def sweep(
    impls: Sequence[Contender],
    seqlens: Sequence[int],
    *,
    batch: int,
    heads: int,
    head_dim: int,
    dtype: str,
    causal: bool,
    device: torch.device,
) -> list[Point]:
    """Measure every implementation at growing N, stopping one at its first failure."""
    points: list[Point] = []
    torch_dtype = DTYPES[dtype]
    for impl in impls:
        for n in seqlens:
            shape = AttentionShape(batch, heads, n, n, head_dim, torch_dtype.itemsize, causal=causal)
            model = extra_memory(shape, impl.io_model)
            skip = impl.skip(make_config(shape, dtype, device, "fwd_bwd"))
            if skip is not None:
                points.append(Point(impl.name, impl.io_model, n, skip[0], None, model, skip[1]))
                break
            assert impl.fn is not None
            failure = None
            try:
                peak = peak_extra_bytes(impl.fn, shape, torch_dtype, device)
            except Exception as e:  # record OOM (or a peer's failure) and stop growing this implementation
                failure = failure_status(e)
            # Outside the except block: its traceback no longer holds the failed run's tensors.
            _release(device)
            if failure is not None:
                status, note = failure
                points.append(Point(impl.name, impl.io_model, n, status, None, model, note))
                break
            points.append(Point(impl.name, impl.io_model, n, "ok", peak, model))
    return points


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def longest_survived(points: Sequence[Point], impl: str) -> int | None:
    ok = [p.seqlen for p in points if p.impl == impl and p.status == "ok"]
    return max(ok) if ok else None


def memory_table(points: Sequence[Point], seqlens: Sequence[int], title: str) -> Table:
    """Rows: implementations, then the two analytic models; columns: N, then the longest N that ran."""
    table = Table(title=title)
    table.add_column("impl")
    for n in seqlens:
        table.add_column(_tokens(n), justify="right")
    table.add_column("longest N", justify="right")
    by_impl: dict[str, dict[int, Point]] = {}
    for p in points:
        by_impl.setdefault(p.impl, {})[p.seqlen] = p
    for impl, row in by_impl.items():
        cells = []
        for n in seqlens:
            p = row.get(n)
            if p is None:
                cells.append("")
            elif p.status != "ok":
                cells.append(f"[red]{p.status}[/red]")
            else:
                cells.append(_size(p.peak_extra_bytes) if p.peak_extra_bytes is not None else "n/a")
        longest = longest_survived(points, impl)
        table.add_row(impl, *cells, _tokens(longest) if longest else "none")
    for model in ("tiled", "naive"):
        models = {p.seqlen: p.model_bytes for p in points if p.io_model == model}
        if models:
            cells = [_size(models[n]) if n in models else "" for n in seqlens]
            table.add_row(f"[dim]model: {model}[/dim]", *cells, "", style="dim")
    return table


def plot_memory(rows: Sequence[Mapping[str, object]], path: Path) -> None:
    """Log-log peak extra memory against N from CSV rows of one run, with the linear and quadratic models."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, NullFormatter

    first = rows[0]
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    markers = itertools.cycle("os^Dvp*hX")
    impls = list(dict.fromkeys(str(r["impl"]) for r in rows))
    for impl in impls:
        mine = [r for r in rows if r["impl"] == impl]
        measured = [
            (int(r["seqlen"]), int(r["peak_extra_bytes"])) for r in mine if r["peak_extra_bytes"] != ""
        ]
        failed = [r for r in mine if r["status"] != "ok"]
        label = impl + (
            f" ({failed[0]['status']} at N={_tokens(int(failed[0]['seqlen']))})" if failed else ""
        )
        if measured:
            xs, ys = zip(*measured, strict=True)
            ax.loglog(xs, ys, marker=next(markers), label=label)
    for model, style in (("tiled", "--"), ("naive", ":")):
        mine = sorted({(int(r["seqlen"]), int(r["model_bytes"])) for r in rows if r["io_model"] == model})
        if mine:
            xs, ys = zip(*mine, strict=True)
            growth = "∝ N" if model == "tiled" else "∝ N²"
            ax.loglog(xs, ys, linestyle=style, color="grey", label=f"model: {model} ({growth})")
    seqlens = sorted({int(r["seqlen"]) for r in rows})
    ax.xaxis.set_major_locator(FixedLocator(seqlens))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _tokens(round(x))))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(EngFormatter(unit="B"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length N")
    ax.set_ylabel(f"peak extra memory, forward + backward ({first['measure']})")
    ax.set_title(
        f"{first['gpu']}: B={first['batch']} H={first['heads']} D={first['head_dim']} {first['dtype']} "
        f"{'causal' if first['causal'] == 'true' else 'non-causal'}",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)


def run(args: argparse.Namespace) -> int:
    """The ``flashtile memory`` command; returns the exit status (2 for a bad flag value)."""
    try:
        device = device_of(args.device)
        low, high = DEFAULT_SEQLENS["cuda" if device.type == "cuda" else "cpu"]
        low, high = args.min_seqlen or low, args.max_seqlen or high
        if low < 1 or high < low:
            raise ValueError(f"--min-seqlen {low} and --max-seqlen {high}: need 1 ≤ min ≤ max")
        impls = contenders(device, args.impls.split(",") if args.impls else None, flex_compile="dynamic")
        # A CSV that cannot be written is found now, before the sweep.
        check_output(output_csv(args), COLUMNS)
    except ValueError as exc:
        return usage_error("memory", exc)
    seqlens = list(itertools.takewhile(lambda n: n <= high, (low << i for i in itertools.count())))
    points = sweep(
        impls,
        seqlens,
        batch=args.batch,
        heads=args.heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        causal=args.causal,
        device=device,
    )
    base = {**provenance(device), "measure": measure_label(device)}
    rows = [
        {
            **base,
            "impl": p.impl,
            "io_model": p.io_model,
            "batch": args.batch,
            "heads": args.heads,
            "seqlen": p.seqlen,
            "head_dim": args.head_dim,
            "dtype": args.dtype,
            "causal": "true" if args.causal else "false",
            "peak_extra_bytes": "" if p.peak_extra_bytes is None else p.peak_extra_bytes,
            "model_bytes": p.model_bytes,
            "status": p.status,
            "note": p.note,
        }
        for p in points
    ]
    console = Console()
    title = (
        f"peak extra memory, fwd+bwd, {base['gpu']} ({base['measure']}): B={args.batch} H={args.heads} "
        f"D={args.head_dim} {args.dtype} {'causal' if args.causal else 'non-causal'}"
    )
    console.print(memory_table(points, seqlens, title))
    for p in points:
        if p.status not in ("ok", "oom"):
            console.print(f"{p.impl} at N={p.seqlen}: {p.status}: {p.note}")
    if device.type != "cuda":
        console.print(
            "[yellow]CPU: measured as the peak resident set size over the RSS before the run; the model rows "
            "are the algorithms' own footprint. Neither is a GPU number.[/yellow]"
        )
    if rows:
        csv_path = output_csv(args)
        append_rows(csv_path, rows, COLUMNS)
        plot_memory(rows, csv_path.with_suffix(".png"))
        console.print(f"appended {len(rows)} rows to {csv_path}; plot in {csv_path.with_suffix('.png')}")
    failed = [p for p in points if p.impl == "flashtile" and p.status not in ("ok", "oom")]
    return 1 if failed else 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``flashtile memory``."""
    parser = subparsers.add_parser(
        "memory",
        help="peak extra memory of forward+backward against N, flashtile vs naive vs peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser, "memory", heads=16, head_dim=128)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="element type (default bf16)")
    parser.add_argument(
        "--causal", action=argparse.BooleanOptionalAction, default=True, help="causal mask (default on)"
    )
    parser.add_argument(
        "--min-seqlen", type=positive_int, default=None, help="first N (default 1024 on CUDA, 256 on CPU)"
    )
    parser.add_argument(
        "--max-seqlen", type=positive_int, default=None, help="last N (default 131072 on CUDA, 1024 on CPU)"
    )
    parser.set_defaults(func=run)
    return parser
