"""Where flashtile stands on the paper grid: each cell's latest ratio to the best peer, from the CSV.

The paper grid's cells have been re-run in parts since its last whole run (a mode, a head dim). This takes
``benchmarks/results/bench.csv``, keeps the paper grid's bf16 cells (B·N = 16k tokens, H·D = 2048) of the
named commits' runs on one GPU model (a commit's last row of each implementation, so one run a commit), and
for each cell uses the last of those commits (in the order given) that timed it: flashtile's TFLOP/s over
the best other implementation's in the same run, as ``flashtile bench`` summarises a run. Prints a markdown
table per mode (rows: head dim and mask; columns: N) and each mode's geometric mean; with ``--plot``, the
same as one figure (a panel per mode, each cell coloured by its ratio).

    PYTHONPATH=src python scripts/paper_standing.py --gpu "NVIDIA H200" \
        --commits 6a70cc0 e669a48 63cf771 a13383c fa408b3 1730143 5158a52 60c3a0e fa9fdd5 \
        --plot benchmarks/results/paper_standing.png
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from flashtile.bench.grid import (
    MODES,
    PAPER_HEAD_DIMS,
    PAPER_HIDDEN,
    PAPER_SEQLENS,
    PAPER_TOKENS,
    seqlen_label,
)
from flashtile.bench.plots import MODE_TITLES
from flashtile.bench.results import read_rows

# The colour scale's ends: a ratio this far from 1.0 either way is drawn at full strength.
_SPREAD = 0.15


def paper_cells(csv_path: Path, gpu: str, commits: list[str]) -> dict[tuple, tuple[float, str, str]]:
    """(mode, D, causal, N) -> (flashtile / best peer, the best peer, the commit), the last commit winning."""
    runs: dict[tuple, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in read_rows(csv_path):
        commit = next((c for c in commits if row["commit"].startswith(c)), None)
        d, n = int(row["head_dim"]), int(row["seqlen_q"])
        paper = (
            row["dtype"] == "bf16" and int(row["batch"]) * n == PAPER_TOKENS
            and int(row["heads"]) * d == PAPER_HIDDEN and row["seqlen_k"] == row["seqlen_q"]
            and row["heads_kv"] == row["heads"]
        )  # fmt: skip
        if commit is None or row["gpu"] != gpu or not paper or row["status"] != "ok" or not row["tflops"]:
            continue
        cell = (row["mode"], d, row["causal"] == "true", n)
        runs[cell][commit][row["impl"]] = float(row["tflops"])
    standing = {}
    for cell, by_commit in runs.items():
        for commit in reversed(commits):
            impls = by_commit.get(commit, {})
            peers = {impl: t for impl, t in impls.items() if impl != "flashtile"}
            if "flashtile" in impls and peers:
                best = max(peers, key=peers.get)
                standing[cell] = (impls["flashtile"] / peers[best], best, commit)
                break
    return standing


def _ratio_text(ratio: float) -> str:
    """Two decimals (three below 1.0 where two would round up to 1.00)."""
    return f"{ratio:.3f}" if 0.995 <= ratio < 1.0 else f"{ratio:.2f}"


def _format_ratio(ratio: float) -> str:
    """:func:`_ratio_text`, bold below 1.0."""
    return _ratio_text(ratio) if ratio >= 1.0 else f"**{_ratio_text(ratio)}**"


def _summary(ratios: list[float]) -> str:
    geomean = statistics.geometric_mean(ratios)
    wins = sum(r >= 1.0 for r in ratios)
    return f"geometric mean {geomean:.3f}× over {len(ratios)} cells, ≥ 1.0× in {wins}"


def plot_standing(standing: dict[tuple, tuple[float, str, str]], gpu: str, path: Path) -> None:
    """One panel per mode: rows head dim and mask, columns N, each cell its ratio (red below 1.0, blue
    above; blank where no run timed it)."""
    rows = [(d, causal) for d in PAPER_HEAD_DIMS for causal in (False, True)]
    figure = Figure(figsize=(4.2 * len(MODES), 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, len(MODES), sharey=True)
    for ax, mode in zip(axes, MODES, strict=True):
        grid = [[float("nan")] * len(PAPER_SEQLENS) for _ in rows]
        for i, (d, causal) in enumerate(rows):
            for j, n in enumerate(PAPER_SEQLENS):
                found = standing.get((mode, d, causal, n))
                if found is not None:
                    grid[i][j] = found[0]
                    # White on the strongest colours, black elsewhere.
                    colour = "white" if abs(found[0] - 1) > 0.6 * _SPREAD else "black"
                    ax.text(j, i, _ratio_text(found[0]), ha="center", va="center", fontsize=8, color=colour)
        image = ax.imshow(grid, cmap="RdBu", vmin=1 - _SPREAD, vmax=1 + _SPREAD)
        ratios = [r for line in grid for r in line if not math.isnan(r)]
        summary = f"geomean {statistics.geometric_mean(ratios):.3f}×" if ratios else "no cells"
        ax.set_title(f"{MODE_TITLES[mode]} ({summary})", fontsize=10)
        ax.set_xticks(range(len(PAPER_SEQLENS)), [seqlen_label(n) for n in PAPER_SEQLENS])
        ax.set_yticks(range(len(rows)), [f"D={d} {'causal' if c else 'full'}" for d, c in rows])
        ax.set_xlabel("N")
    figure.colorbar(image, ax=axes, shrink=0.8, label="flashtile / best peer")
    figure.suptitle(f"flashtile against the best peer of each cell's run, bf16, {gpu}", fontsize=11)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=Path("benchmarks/results/bench.csv"))
    parser.add_argument("--gpu", default="NVIDIA H200", help="the CSV's gpu column")
    parser.add_argument("--commits", nargs="+", required=True, help="commit prefixes, oldest run first")
    parser.add_argument("--plot", type=Path, help="also draw the tables as one PNG here")
    args = parser.parse_args()
    standing = paper_cells(args.csv, args.gpu, args.commits)
    if args.plot:
        plot_standing(standing, args.gpu, args.plot)
    every = [ratio for ratio, _, _ in standing.values()]
    for mode in MODES:
        print(f"\n{mode}: flashtile / best peer, below 1.0× in bold\n")
        labels = [seqlen_label(n) for n in PAPER_SEQLENS]
        print("| D | mask | " + " | ".join(labels) + " | run |")
        print("|---|---|" + "---|" * (len(PAPER_SEQLENS) + 1))
        ratios = []
        for d in PAPER_HEAD_DIMS:
            for causal in (False, True):
                cells, row_commits = [], []
                for n in PAPER_SEQLENS:
                    found = standing.get((mode, d, causal, n))
                    if found is None:
                        cells.append("–")
                        continue
                    ratio, _, commit = found
                    ratios.append(ratio)
                    row_commits += [commit] if commit not in row_commits else []
                    cells.append(_format_ratio(ratio))
                mask = "causal" if causal else "full"
                print(f"| {d} | {mask} | " + " | ".join(cells) + f" | {', '.join(row_commits)} |")
        if ratios:
            print(f"\n{_summary(ratios)}")
    if every:
        print(f"\nevery mode: {_summary(every)}")


if __name__ == "__main__":
    main()
