"""Figures from a results CSV: TFLOP/s against sequence length, as in the FlashAttention papers.

One PNG per (dtype, mode) of a run, one panel per (causal, head dim), one line per implementation. Only rows
whose status is "ok" are drawn; a missing point means the implementation had no valid number there. A run of
the options preset draws one PNG per (option, dtype, mode) instead: the option's lines beside flashtile's
plain kernel at the same lengths (dashed), a packed batch beside the same sequences padded. A run of the
head-dims preset (its CSV has ``head_dim_v``) draws one PNG per (dtype, mode) with one panel per (causal, N)
and a group of bars per (D, D_v), one bar per implementation.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from flashtile.bench.grid import MODES, seqlen_label
from flashtile.bench.results import COLUMNS, Result, read_rows

MODE_TITLES = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward + backward"}


def _latest_date(rows: list[dict[str, str]]) -> str | None:
    return max((r["date"] for r in rows), default=None)


def plot_results(csv_path: Path, out_dir: Path, date: str | None = None) -> list[Path]:
    """Draw the run started at ``date`` (default: the latest run in the CSV); returns the files written, none
    where the run has no timed row. ValueError for a CSV that is not ``flashtile bench``'s."""
    rows = read_rows(csv_path, COLUMNS)
    date = date or _latest_date(rows)
    run = [r for r in rows if r["date"] == date]
    ok = [r for r in run if r["status"] == "ok" and r["tflops"]]
    if not ok:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    if "head_dim_v" in ok[0]:
        return _head_dim_figures(csv_path, out_dir, ok, run[0])
    by_figure: dict[tuple[str, str, str], list[dict[str, str]]] = defaultdict(list)
    for r in _with_series(ok):
        by_figure[(r["option"], r["dtype"], r["mode"])].append(r)
    if any(option for option, _, _ in by_figure):
        by_figure = _options_beside_plain(by_figure)
    impls = list(dict.fromkeys(r["series"] for rs in by_figure.values() for r in rs))
    written = []
    order = sorted(by_figure, key=lambda k: (k[0], k[1], MODES.index(k[2]) if k[2] in MODES else len(MODES)))
    for option, dtype, mode in order:
        stem = f"{csv_path.stem}_{option}" if option else csv_path.stem
        path = out_dir / f"{stem}_{mode}_{dtype}.png"
        _figure(by_figure[(option, dtype, mode)], impls, mode, dtype, run[0], option).savefig(path, dpi=120)
        written.append(path)
    return written


def _with_series(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Each row with its figure (``option``: the options' names, a padded batch with its packed one) and its
    line (``series``: the implementation, with "padded" for a padded batch)."""
    found = []
    for r in rows:
        config = Result.from_row(r).config
        padded = "padded" in config.options
        option = "+".join("varlen" if name == "padded" else name for name in config.options)
        # A float8 cell (dtype "fp8" in the CSV) is drawn with the plain cells of its output dtype.
        series = f"{r['impl']} padded" if padded else r["impl"]
        found.append({**r, "dtype": config.dtype, "option": option, "series": series})
    return found


def _options_beside_plain(
    by_figure: dict[tuple[str, str, str], list[dict[str, str]]],
) -> dict[tuple[str, str, str], list[dict[str, str]]]:
    """Each option's figure with the plain rows of the same causal flag and lengths, as dashed lines; not a
    packed batch's documents timed alone (dense batches of one at the documents' lengths, one of them the
    padded batch's), which the options table compares with it as a whole."""
    plain = [r for (option, _, _), rs in by_figure.items() if not option for r in rs]
    figures = {}
    for (option, dtype, mode), rows in by_figure.items():
        if not option:
            continue
        shapes = {(r["causal"], r["seqlen_q"]) for r in rows}
        documents = {n for r in rows for n in r.get("lengths", "").split()}
        beside = [
            {**r, "series": f"{r['series']} (no option)"}
            for r in plain
            if (r["dtype"], r["mode"]) == (dtype, mode)
            and (r["causal"], r["seqlen_q"]) in shapes
            and not (r["batch"] == "1" and r["seqlen_q"] in documents)
        ]
        figures[(option, dtype, mode)] = rows + beside
    return figures


def _figure(
    rows: list[dict[str, str]], impls: list[str], mode: str, dtype: str, meta: dict[str, str], option: str
) -> Figure:
    causals = sorted({r["causal"] for r in rows}, key=lambda c: c == "true")
    head_dims = sorted({int(r["head_dim"]) for r in rows})
    fig = Figure(figsize=(max(7.0, 4.2 * len(head_dims)), 1.0 + 3.4 * len(causals)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(causals), len(head_dims), squeeze=False)
    colors = {impl: f"C{i % 10}" for i, impl in enumerate(impls)}
    for i, causal in enumerate(causals):
        for j, head_dim in enumerate(head_dims):
            ax = axes[i][j]
            panel = [r for r in rows if r["causal"] == causal and int(r["head_dim"]) == head_dim]
            seqlens = sorted({int(r["seqlen_q"]) for r in panel})
            for impl in impls:
                points = sorted(
                    (int(r["seqlen_q"]), float(r["tflops"])) for r in panel if r["series"] == impl
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    bold = impl == "flashtile"
                    ax.plot(
                        xs,
                        ys,
                        marker="o",
                        label=impl,
                        color=colors[impl],
                        linewidth=2.4 if bold else 1.3,
                        linestyle="--" if impl.endswith("(no option)") else "-",
                    )
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [seqlen_label(n) for n in seqlens])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_title(
                f"{'causal' if causal == 'true' else 'non-causal'}, head dim {head_dim}", fontsize=10
            )
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.legend(fontsize=7)
    device = "CPU numbers (smoke test, not performance)" if meta["device"] == "cpu" else meta["gpu"]
    what = f"Attention with {option}, TFLOP/s on visible pairs:\n" if option else "Attention "
    fig.suptitle(
        f"{what}{MODE_TITLES.get(mode, mode)}, {dtype}: {device}\n"
        f"torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}",
        fontsize=10,
    )
    return fig


def _head_dim_figures(
    csv_path: Path, out_dir: Path, ok: list[dict[str, str]], meta: dict[str, str]
) -> list[Path]:
    """The head-dims run: per (dtype, mode), panels (causal × N) of bars per (D, D_v) and implementation."""
    impls = list(dict.fromkeys(r["impl"] for r in ok))
    colors = {impl: f"C{i % 10}" for i, impl in enumerate(impls)}
    written = []
    figures = sorted({(r["dtype"], r["mode"]) for r in ok}, key=lambda k: (k[0], MODES.index(k[1])))
    for dtype, mode in figures:
        rows = [r for r in ok if (r["dtype"], r["mode"]) == (dtype, mode)]
        causals = sorted({r["causal"] for r in rows}, key=lambda c: c == "true")
        seqlens = sorted({int(r["seqlen_q"]) for r in rows})
        pairs = sorted({(int(r["head_dim"]), int(r["head_dim_v"])) for r in rows})
        fig = Figure(figsize=(4.5 * len(seqlens) + 1, 1.2 + 3.2 * len(causals)), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(causals), len(seqlens), squeeze=False)
        width = 0.8 / len(impls)
        for i, causal in enumerate(causals):
            for j, seqlen in enumerate(seqlens):
                ax = axes[i][j]
                panel = [r for r in rows if r["causal"] == causal and int(r["seqlen_q"]) == seqlen]
                for k, impl in enumerate(impls):
                    bars = [
                        (pairs.index((int(r["head_dim"]), int(r["head_dim_v"]))), float(r["tflops"]))
                        for r in panel
                        if r["impl"] == impl
                    ]
                    if bars:
                        xs, ys = zip(*bars, strict=True)
                        ax.bar([x + k * width for x in xs], ys, width, label=impl, color=colors[impl])
                middle = (len(impls) - 1) * width / 2
                ax.set_xticks([x + middle for x in range(len(pairs))], [f"{d}/{dv}" for d, dv in pairs])
                ax.set_xlabel("head dim D/D_v")
                ax.set_ylabel("TFLOP/s")
                ax.grid(True, axis="y", alpha=0.3)
                ax.set_title(
                    f"{'causal' if causal == 'true' else 'non-causal'}, N={seqlen_label(seqlen)}", fontsize=10
                )
                ax.legend(fontsize=7)
        fig.suptitle(
            f"Attention by head dim, {MODE_TITLES.get(mode, mode)}, {dtype}: {meta['gpu']}\n"
            f"torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}",
            fontsize=10,
        )
        path = out_dir / f"{csv_path.stem}_{mode}_{dtype}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
    return written
