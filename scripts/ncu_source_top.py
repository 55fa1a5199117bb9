"""Where a kernel's warps wait, from an Nsight Compute source page (``ncu -i R --page source
--print-source sass --csv``): the warp-stall samples summed by opcode, then the instructions that gather
the most of them, in program order. A softmax's samples spread over thousands of instructions, so the
opcode sums say more than any one line (the twenty-eighth session's first run printed the lines alone).

    python scripts/ncu_source_top.py source.csv --top 40
"""

from __future__ import annotations

import argparse
import collections
import csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv_path")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with open(args.csv_path, newline="") as f:
        lines = [line for line in f if line.strip()]
    # The page may start with a kernel title line before the header row.
    start = next(i for i, line in enumerate(lines) if "Source" in line and "," in line)
    rows = list(csv.DictReader(lines[start:]))
    header = list(rows[0]) if rows else []
    print("columns:", header)
    sampled = [c for c in header if "Sampling" in c and "All" in c] or [c for c in header if "Sampl" in c]
    if not sampled:
        return
    column = sampled[0]

    def samples(row: dict[str, str]) -> float:
        try:
            return float(row[column].replace(",", "") or 0)
        except ValueError:
            return 0.0

    total = sum(samples(r) for r in rows)
    print(f"{column}: {total:.0f} samples over {len(rows)} instructions")
    by_opcode = collections.Counter()
    for row in rows:
        # "@!P0 BRA ..." → BRA; "HGMMA.64x128x16.F32.BF16 ..." → HGMMA.
        words = [w for w in row.get("Source", "").split() if not w.startswith("@")]
        by_opcode[words[0].split(".")[0] if words else "?"] += samples(row)
    print("by opcode:", ", ".join(f"{op} {n / total:.1%}" for op, n in by_opcode.most_common(20)))
    ranked = sorted(range(len(rows)), key=lambda i: -samples(rows[i]))[: args.top]
    for i in sorted(ranked):
        row = rows[i]
        print(f"{samples(row) / total:6.1%}  #{i:5d}  {row.get('Source', '')[:110]}")


if __name__ == "__main__":
    main()
