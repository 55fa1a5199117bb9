"""The Gluon forward with and without its persistent grid, beside SDPA's cuDNN backend, kernel time only.

Each cell (bf16, B·N = 16k tokens, H·D = 2048, as `flashtile bench --paper`; plus the options bench's window
(256, 0) and causal cells at N = 8k, and sliding windows (256, 0) at D = 64 and 128 from 2k to 16k) is
timed as CUDA-graph replays of 20 back-to-back calls of the launchers (no host path in the figure), median
of 7 replays, each implementation once in every position of the cell's order (the median of those), for
flashtile's forward with two consumer warpgroups and FLASHTILE_HOPPER_FWD_PERSISTENT=1 (one program an SM
looping over work tiles) and =0 (one program a work tile), and cuDNN (dense and causal cells). Every
output is compared with the per-tile one first (max |difference|). ``--consumers`` adds the D = 64 forward
with three consumer warpgroups (FLASHTILE_HOPPER_FWD_CONSUMERS=3, persistent where the grid rule allows).
``--causal-only`` times the grid's causal cells alone (the persistent grid pairs their row blocks);
``--any-keys`` adds the persistent grid past its key bound at D > 64; ``--stages 3 4`` adds the forward with
K/V rings of those depths (with ``--consumers`` at D = 64 also with three consumers), ``--block-n 64`` with
K/V tiles of that many keys (each from the tiling the dispatcher gives the cell, one field changed);
``--only-grid`` leaves out the window and 8k cells.

    PYTHONPATH=src python scripts/hopper_persistent_check.py [--head-dims 64 128 256] [--csv out.csv] \
        [--baseline path/to/an/earlier/hopper/fwd.py]

``--baseline`` times another version of kernels/hopper/fwd.py (e.g. ``git show <rev>:src/flashtile/kernels/
hopper/fwd.py > old_fwd.py``) in the same process, as "baseline" (persistent where its rule allows, two
consumers; with ``--consumers`` also "baseline-3" at D = 64).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import os
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

from flashtile.bench.decode import graph_time_ms
from flashtile.kernels import configs
from flashtile.kernels.hopper import fwd as fwd_module
from flashtile.kernels.hopper.fwd import CONSUMERS_ENV, PERSISTENT_ENV
from flashtile.kernels.hopper.fwd import attn_fwd as hopper_fwd

TOKENS, HIDDEN = 16384, 2048
CALLS, REPLAYS = 20, 7


def graph_ms(fn) -> float:
    """Median over REPLAYS of one captured graph of CALLS calls, per call (the decode bench's timer)."""
    return graph_time_ms([fn] * CALLS, reps=REPLAYS)[1]


def launcher(
    attn_fwd, q, k, v, causal: bool, window: tuple[int, int], consumers: int = 2, persistent=True, config=None
):
    """A version's launcher with the persistent grid where its rule allows (or never) and ``consumers``
    warpgroups (and its tiling ``config``, a HopperFwdConfig, if given). The knobs are read at each launch
    (the graph captures the launch it picked), and every implementation sets them."""
    scale = q.shape[-1] ** -0.5
    tiling = {} if config is None else {"config": config}

    def run():
        os.environ[PERSISTENT_ENV] = "1" if persistent else "0"
        os.environ[CONSUMERS_ENV] = str(consumers)
        return attn_fwd(q, k, v, scale, causal, window_size=window, **tiling)[0]

    return run


def flashtile(persistent: bool, q, k, v, causal: bool, window: tuple[int, int], consumers: int = 2):
    return launcher(hopper_fwd, q, k, v, causal, window, consumers, persistent)


def any_keys(q, k, v, causal: bool, window: tuple[int, int]):
    """The persistent grid without its key bound: the bound lifted while the launch is prepared (at the
    graph's capture), then restored."""
    persistent = flashtile(True, q, k, v, causal, window)

    def run():
        bound = fwd_module.PERSISTENT_MAX_KEYS
        fwd_module.PERSISTENT_MAX_KEYS = 1 << 30
        fwd_module._fwd_launch.cache_clear()
        try:
            return persistent()
        finally:
            fwd_module.PERSISTENT_MAX_KEYS = bound
            fwd_module._fwd_launch.cache_clear()

    return run


def cudnn(q, k, v, causal: bool, window: tuple[int, int]):
    if window != (-1, -1) and not causal:
        return None

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal
            ).transpose(1, 2)

    return run


def flops(batch: int, seqlen: int, heads: int, head_dim: int, causal: bool, window: tuple[int, int]) -> float:
    """Forward FLOPs counted on the visible pairs (4·D per pair)."""
    i = torch.arange(seqlen)
    j = torch.arange(seqlen)
    left, right = window
    visible = torch.ones(seqlen, seqlen, dtype=torch.bool)
    if causal or right >= 0:
        visible &= j[None, :] <= i[:, None] + (0 if causal else right)
    if left >= 0:
        visible &= j[None, :] >= i[:, None] - left
    return 4.0 * batch * heads * head_dim * float(visible.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument(
        "--seqlens", type=int, nargs="*", default=[512, 1024, 2048, 4096, 16384],
        help="the paper grid's lengths to time (none: only the window and causal cells)",
    )  # fmt: skip
    parser.add_argument("--csv", help="append one row per cell and implementation to this CSV")
    parser.add_argument("--baseline", help="another version of kernels/hopper/fwd.py to time beside")
    parser.add_argument(
        "--stages", type=int, nargs="*", default=[],
        help="also time the forward with K/V rings of these depths (persistent where the rule allows)",
    )  # fmt: skip
    parser.add_argument(
        "--block-n", type=int, nargs="*", default=[],
        help="also time the forward with K/V tiles of these many keys (persistent where the rule allows)",
    )  # fmt: skip
    parser.add_argument(
        "--only-grid", action="store_true", help="leave out the window and causal cells at 8k"
    )  # fmt: skip
    parser.add_argument(
        "--consumers", action="store_true",
        help="also time three consumer warpgroups (FLASHTILE_HOPPER_FWD_CONSUMERS=3; D = 64 only)",
    )  # fmt: skip
    parser.add_argument(
        "--causal-only", action="store_true",
        help="only the causal cells of the grid (persistent: row blocks dealt out in pairs)",
    )  # fmt: skip
    parser.add_argument(
        "--any-keys", action="store_true",
        help="also time the persistent grid past its key bound (PERSISTENT_MAX_KEYS) at D > 64",
    )  # fmt: skip
    args = parser.parse_args()
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_hopper_fwd", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
    cells = [
        (d, n, causal, (-1, 0) if causal else (-1, -1))
        for d in args.head_dims
        for n in args.seqlens
        for causal in ((True,) if args.causal_only else (False, True))
    ]
    if not (args.causal_only or args.only_grid):
        cells += [(128, 8192, True, (-1, 0)), (128, 8192, False, (256, 0))]
        # Sliding windows: every work tile visits about the same keys, so they take the persistent grid.
        cells += [(d, n, False, (256, 0)) for d in (64, 128) for n in (2048, 4096, 16384)]
        cells += [(64, 8192, False, (256, 0)), (64, 8192, True, (-1, 0))]
    rows = []
    print(f"{torch.cuda.get_device_name()}: ms per forward (TFLOP/s), CUDA-graph replays of {CALLS} calls")
    for head_dim, seqlen, causal, window in cells:
        batch, heads = TOKENS // seqlen, HIDDEN // head_dim
        q, k, v = (
            torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3)
        )
        impls = {
            "persistent": flashtile(True, q, k, v, causal, window),
            "per-tile": flashtile(False, q, k, v, causal, window),
            "sdpa-cudnn": cudnn(q, k, v, causal, window),
        }
        if baseline is not None:
            impls["baseline"] = launcher(baseline.attn_fwd, q, k, v, causal, window)
        # The tiling the dispatcher gives this cell (a 3-deep ring for plain D = 64), one field changed.
        default_tiling = configs.hopper_fwd_config(head_dim, plain=window in ((-1, -1), (-1, 0)))
        for depth in args.stages:
            tiling = dataclasses.replace(default_tiling, STAGES=depth)
            impls[f"stages-{depth}"] = launcher(hopper_fwd, q, k, v, causal, window, config=tiling)
            if args.consumers and head_dim == 64:
                impls[f"stages-{depth}-3"] = launcher(
                    hopper_fwd, q, k, v, causal, window, consumers=3, config=tiling
                )
        for keys in args.block_n:
            tiling = dataclasses.replace(default_tiling, BLOCK_N=keys)
            impls[f"block-n-{keys}"] = launcher(hopper_fwd, q, k, v, causal, window, config=tiling)
        if args.any_keys and head_dim > 64:
            impls["persistent-any-keys"] = any_keys(q, k, v, causal, window)
        if args.consumers and head_dim == 64:
            impls["3-consumers"] = flashtile(True, q, k, v, causal, window, consumers=3)
            if baseline is not None:
                impls["baseline-3"] = launcher(baseline.attn_fwd, q, k, v, causal, window, consumers=3)
        impls = {name: fn for name, fn in impls.items() if fn is not None}
        outs = {name: fn().float() for name, fn in impls.items()}
        ref = outs["per-tile"]
        work = flops(batch, seqlen, heads, head_dim, causal, window)
        line = f"D={head_dim:3d} N={seqlen:5d} {'causal' if causal else 'full  '} window={window}:"
        # Each implementation is timed once in every position of the order (whichever runs first in a
        # cell read up to 11 % faster, identical kernels included): the median of those runs.
        names = list(impls)
        times = {name: [] for name in names}
        for start in range(len(names)):
            for name in names[start:] + names[:start]:
                times[name].append(graph_ms(impls[name]))
        for name in names:
            ms = statistics.median(times[name])
            diff = float((outs[name] - ref).abs().max())
            line += f"  {name} {ms:.4f} ({work / ms / 1e9:.0f}, diff {diff:.1e})"
            rows.append(
                dict(
                    gpu=torch.cuda.get_device_name(),
                    impl=name,
                    head_dim=head_dim,
                    seqlen=seqlen,
                    batch=batch,
                    heads=heads,
                    causal=causal,
                    window=f"{window[0]},{window[1]}",
                    ms=ms,
                    tflops=work / ms / 1e9,
                    max_diff_vs_per_tile=diff,
                )
            )
        print(line, flush=True)
    if args.csv:
        new = not os.path.exists(args.csv)
        with open(args.csv, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
