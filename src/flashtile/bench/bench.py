"""``flashtile bench``: check, then time, flashtile and its peers on the grid, in one process.

For each kernel configuration every peer is first checked against a float64 naive-attention oracle with the
accuracy rule of ``flashtile.reference.compare`` (2× the low-precision baseline's error for the output, 3× for
the gradients); a peer that fails gets no number. The peer runs on the full configuration, the same call
that is then timed; the oracle and the baseline cover its last ``b`` sequences and last ``h`` heads (their
KV heads with them), as many as fit the budgets of ``check_slice``: all of them for small shapes, one KV
head's group of query heads at N = 16k. The last ones, because an index that overflows shows there first.
Rows go to the CSV after each configuration; tables and plots come at the end.

``--options`` measures each flash_attn option (window, softcap, ALiBi, dropout, a learnable sink, a packed
batch) beside flashtile's plain kernel at the same shape and beside the peers that implement the option; the
oracle checks every option but dropout, whose mask each implementation draws from its own generator.
``--head-dims`` measures (D, D_v) pairs up to 576/512 and each one's TFLOP/s against the equal-dim 128 and
256 cells. ``--decode`` and ``--masks`` are presets of their own (:mod:`flashtile.bench.decode`,
:mod:`flashtile.bench.masks`).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import flashtile.bench.peers as registry
from flashtile.bench import grid, results
from flashtile.bench.grid import DTYPES, MODES, Config, Preset
from flashtile.bench.peers import Peer
from flashtile.bench.results import Environment, Result
from flashtile.bench.timing import rotation_copies, time_in_rounds
from flashtile.fp8 import rounded_like_the_kernel
from flashtile.reference.compare import GRAD_FACTOR, OUTPUT_FACTOR, Comparison, compare

# Largest float64 score tensor (B·H·N_q·N_k elements, 1 GiB) and largest q-shaped tensor (B·N·H·D elements)
# the oracle covers; the second bounds the host-side comparisons, four per peer and configuration.
_SCORE_BUDGET = 2**27
_TOKEN_BUDGET = 2**19
# Naive float64 attention with its backward keeps about this many score-sized tensors alive at once.
_LIVE_SCORE_TENSORS = 8
_DETAIL_CHARS = 400
# A call whose host time is this share of its per-call GPU time or more is marked host-bound: the GPU's
# queue runs dry between calls (an H100 at D = 128, N = 512 in the twenty-third session: host 105 µs, the
# forward's kernel 120-140 µs, per-call time flipping between 0.12-0.15 and 0.20-0.23 ms).
HOST_BOUND = 0.8
_DROPOUT_UNCHECKED = (
    "not checked: dropout's mask comes from each implementation's own random generator, which the oracle "
    "cannot reproduce"
)
_LOG_WIDTH = 132
_FATAL_CUDA = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
)


def rotation_shift(index: int, count: int) -> int:
    """Where configuration ``index`` starts its list of ``count`` peers: one place further per configuration,
    and one more after each ``count`` of them, so that a grid whose rows have ``count`` lengths (six
    lengths, six peers in ``--paper``) does not time the same length first in every row."""
    return (index + index // count) % count


class _FatalDeviceError(RuntimeError):
    """A CUDA error that leaves the context unusable: the run stops after writing what it has."""


@dataclass(frozen=True)
class _Verdict:
    status: str
    detail: str
    error: float | None = None


@dataclass
class _Reference:
    """Full-size inputs, and the float64 oracle's and the low-precision baseline's results on the part of
    them that ``part`` describes (the last sequences, query heads and KV heads, by ``select``)."""

    config: Config
    part: Config
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    dout: torch.Tensor
    out64: torch.Tensor
    out_low: torch.Tensor
    grads64: tuple[torch.Tensor, ...] | None
    grads_low: tuple[torch.Tensor, ...] | None


# The options preset's option names ("padded" is varlen's twin, not an option of its own).
PRESET_OPTIONS = tuple(name for name in grid.OPTIONS if name != "padded")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``flashtile bench``."""
    parser = subparsers.add_parser(
        "bench",
        help="check and time flashtile against its peers on the FlashAttention papers' grid",
        description=(
            "Check every implementation against a float64 oracle, then time it (median, p20/p80) in TFLOP/s, "
            "in turn over rounds (--rounds, 3), the turn rotating by one implementation per shape (each row "
            "records its place and the rounds' medians). "
            "Appends rows to a CSV, prints one table per (mode, causal, head dim), draws plots from the CSV. "
            "Without a GPU the defaults are tiny CPU shapes."
        ),
    )
    preset = parser.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="a few small cells, short timing")
    preset.add_argument(
        "--paper",
        action="store_true",
        help="the full grid (N 512..16k, D 64/128/256, causal and not, fwd/bwd/fwd_bwd, bf16) in under 10 "
        "minutes on an H100: SDPA math skipped from N = 4k",
    )
    preset.add_argument(
        "--options",
        nargs="*",
        choices=PRESET_OPTIONS,
        metavar="OPTION",
        help="flash_attn's options (window (256, 0) at 8k; softcap 30, ALiBi, dropout 0.1 at 4k and 16k, "
        "non-causal unless --causal true or both; a "
        "learnable sink (one N(0, 1) logit per head, causal) at 4k and 16k; a packed batch of mixed lengths; "
        "float8 e4m3 q, k, v through flash_attn_fp8_func at 4k and 16k, forward only) "
        "beside the plain kernel and FlexAttention / SDPA flash, about 5 minutes on an H100; --seqlen "
        f"replaces every option's lengths; names among {', '.join(PRESET_OPTIONS)} keep only those",
    )
    parser.add_argument(
        "--decode",
        action="store_true",
        help="decoding with a KV cache: batch 1-256, cache 1k-128k, GQA 1/4/8, pages 16/64/256, 1 and 4 "
        "query tokens, µs and TB/s against the measured copy bandwidth (with --quick: 8 cells); CUDA only",
    )
    parser.add_argument(
        "--masks",
        action="store_true",
        help="block-sparse attention (75%% empty tiles, against dense), document (8 documents) and prefix-LM "
        "(prefix 2k) masks against FlexAttention, bf16, D=128, H=16, N=16k, fwd and bwd, and the first "
        "call of a new mask (compile included) in a fresh process with empty caches; about 4 minutes on "
        "an H100 with empty compile caches (with --quick, no prefix-LM: about 2); --seqlen replaces 16k; "
        "--peers flashtile or flex keeps one; CUDA only",
    )
    parser.add_argument(
        "--head-dims",
        action="store_true",
        help="head dims (D, D_v) = 128/128, 192/128, 256/256, 512/512, 576/512, bf16, causal and not, N 4k "
        "and 16k (with --quick: 4k), B·N = 16k, H = floor(2048 / D), fwd and bwd, TFLOP/s beside the "
        "equal-dim 128 and 256 cells and the peers that take each shape; up to 7 minutes on an H100; CUDA "
        "only",
    )
    axes = parser.add_argument_group("axes (each overrides the preset)")
    axes.add_argument(
        "--device", choices=("auto", "cuda", "cpu"), default="auto", help="default auto: CUDA when present"
    )
    axes.add_argument("--dtype", nargs="+", choices=tuple(DTYPES))
    axes.add_argument("--head-dim", nargs="+", type=int, metavar="D")
    axes.add_argument("--seqlen", nargs="+", type=_seqlen_argument, metavar="N", help="e.g. 512 4k 16k")
    axes.add_argument("--causal", choices=("true", "false", "both"))
    axes.add_argument("--batch", type=int, help="fixed batch (default: tokens / N)")
    axes.add_argument("--heads", type=int, help="fixed query heads (default: hidden / D)")
    axes.add_argument("--tokens", type=int, help="B·N when --batch is not given (default 16384)")
    axes.add_argument("--hidden", type=int, help="H·D when --heads is not given (default 2048)")
    axes.add_argument("--gqa-ratio", type=int, help="query heads per KV head (default 1)")
    axes.add_argument("--mode", nargs="+", choices=MODES)
    axes.add_argument(
        "--peers", nargs="+", metavar="NAME", help="implementations to run (default: all available)"
    )
    run = parser.add_argument_group("timing and output")
    run.add_argument(
        "--flex-compile", choices=("static", "dynamic"), help="FlexAttention compile per shape or once"
    )
    run.add_argument("--warmup-ms", type=float, help="warm-up time per measurement (default: the preset's)")
    run.add_argument("--rep-ms", type=float, help="timed time per measurement (default: the preset's)")
    run.add_argument(
        "--min-reps", type=int, help="fewest timed calls per measurement (default: the preset's)"
    )
    run.add_argument(
        "--rounds", type=int, help="rounds of a cell's implementations in turn, the median one reported (3)"
    )
    run.add_argument(
        "--time-budget",
        type=float,
        metavar="S",
        help="stop measuring after S seconds (rest: skipped; default none, but --paper, --options and "
        "--head-dims have their own)",
    )
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    results.add_output_arguments(
        run,
        "bench",
        name_note="; bench_options, bench_head_dims, bench_decode, bench_masks with --options, --head-dims, "
        "--decode, --masks",
    )
    run.add_argument("--no-plot", action="store_true", help="write the CSV and tables, draw no plots")
    run.add_argument(
        "--plot-only", action="store_true", help="measure nothing: tabulate and plot the CSV's latest run"
    )
    # The default --name depends on --options: main resolves it.
    parser.set_defaults(func=main, name=None)
    return parser


def _seqlen_argument(text: str) -> int:
    """``grid.parse_seqlen`` for argparse, whose message then says why (not "invalid parse_seqlen value")."""
    try:
        return grid.parse_seqlen(text)
    except ValueError as exc:
        reason = exc if "positive" in str(exc) else f"{text!r} is not a length such as 512, 4k or 16k"
        raise argparse.ArgumentTypeError(str(reason)) from None


def _device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device")
    return torch.device(choice)


def build_preset(args: argparse.Namespace, device: torch.device) -> Preset:
    """The preset the flags name, for this device, with every axis flag applied."""
    if args.head_dims:
        if args.paper or args.options:
            raise ValueError("--head-dims takes --quick, not --paper or --options")
        if args.head_dim:
            raise ValueError("--head-dims measures its own (D, D_v) pairs: leave out --head-dim")
        if device.type != "cuda":
            raise ValueError(
                "--head-dims needs a CUDA device (the head dims past 256 are the GPU kernels'; "
                f"this run is on {device.type})"
            )
        name = "head-dims-quick" if args.quick else "head-dims"
    else:
        name = "paper" if args.paper else "quick" if args.quick else "options" if args.options else "default"
    base = grid.preset(name, device.type)
    if getattr(args, "option_names", ()):
        base = dataclasses.replace(
            base, options=tuple(o for o in base.options if o.option in args.option_names)
        )
    if base.options and args.seqlen:
        lengths = tuple(dict.fromkeys(args.seqlen))
        base = dataclasses.replace(
            base, options=tuple(dataclasses.replace(o, seqlens=lengths) for o in base.options)
        )
    for flag in ("batch", "heads", "tokens", "hidden", "gqa_ratio", "min_reps", "rounds"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.head_dim is not None and min(args.head_dim) < 1:
        raise ValueError(f"--head-dim must be positive, got {args.head_dim}")
    for flag in ("warmup_ms", "rep_ms"):
        value = getattr(args, flag)
        if value is not None and not value >= 0:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 0, got {value}")
    # A budget of 0 would read as "no budget" (the preset's None), a negative one would skip every cell.
    if args.time_budget is not None and not args.time_budget > 0:
        raise ValueError(f"--time-budget must be positive, got {args.time_budget}")
    timing = dataclasses.replace(
        base.timing,
        **{
            k: v
            for k, v in (
                ("warmup_ms", args.warmup_ms),
                ("rep_ms", args.rep_ms),
                ("min_reps", args.min_reps),
                ("rounds", args.rounds),
            )
            if v is not None
        },
    )
    causal = {"true": (True,), "false": (False,), "both": (False, True)}.get(args.causal)
    return base.with_overrides(
        seqlens=tuple(dict.fromkeys(args.seqlen)) if args.seqlen and not base.options else None,
        head_dims=tuple(dict.fromkeys(args.head_dim)) if args.head_dim else None,
        causal=causal,
        modes=tuple(m for m in MODES if m in args.mode) if args.mode else None,
        dtypes=tuple(dict.fromkeys(args.dtype)) if args.dtype else None,
        batch=args.batch,
        heads=args.heads,
        tokens=args.tokens,
        hidden=args.hidden,
        gqa_ratio=args.gqa_ratio,
        flex_compile=args.flex_compile,
        time_budget_s=args.time_budget,
        timing=timing,
    )


def select_peers(names: list[str] | None, preset: Preset) -> tuple[list[Peer], list[str]]:
    """The peers to run and a note for each default peer that could not be imported."""
    every = registry.available_peers(preset.device, flex_compile=preset.flex_compile)
    by_name = {p.name: p for p in every}
    if names is None:
        chosen = [p for p in every if p.default and p.unavailable is None]
        notes = [f"{p.name}: not measured, {p.unavailable}" for p in every if p.default and p.unavailable]
        return chosen, notes
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(
            f"--peers: unknown {', '.join(unknown)}; on {preset.device} choose from {', '.join(by_name)}"
        )
    return [by_name[n] for n in dict.fromkeys(names)], []


def check_slice(config: Config, device: torch.device) -> Config:
    """The largest part (fewer sequences first, then fewer KV-head groups) whose float64 oracle fits.

    At N = 16k it is one sequence and one KV head's group of query heads.
    """
    score_budget = _SCORE_BUDGET
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        score_budget = min(score_budget, free // (_LIVE_SCORE_TENSORS * 8))
    if config.layout == "varlen":
        # A packed batch is one row of tokens: the oracle covers every sequence of the last heads.
        heads = max(
            1,
            min(
                score_budget // sum(n * n for n in config.lengths),
                _TOKEN_BUDGET // (config.tokens * max(config.head_dim, config.dim_v)),
            ),
        )
        if heads >= config.heads:
            return config
        return config.with_slice(config.batch, max(1, min(config.heads_kv, heads // config.gqa_ratio)))
    rows = max(
        1,
        min(
            score_budget // (config.seqlen_q * config.seqlen_k),
            _TOKEN_BUDGET // (config.seqlen_q * max(config.head_dim, config.dim_v)),
        ),
    )
    if config.batch * config.heads <= rows:
        return config
    if config.heads <= rows:
        return config.with_slice(rows // config.heads, config.heads_kv)
    return config.with_slice(1, max(1, min(config.heads_kv, rows // config.gqa_ratio)))


def _select(part: Config, config: Config, *, kv: bool = False) -> tuple[slice, slice, slice]:
    """Index of ``part`` (the last sequences and heads) in a (B, N, H, D) or, with ``kv``, (B, N, H_KV, D)
    tensor of ``config`` (a packed batch keeps its one row: ``check_slice`` keeps all its sequences)."""
    heads, part_heads = (config.heads_kv, part.heads_kv) if kv else (config.heads, part.heads)
    return slice(config.batch - part.batch, None), slice(None), slice(heads - part_heads, None)


def call_options(config: Config, device: torch.device) -> dict[str, object]:
    """The keywords a peer receives for ``config``'s options (see ``flashtile.bench.peers``); empty for a
    plain cell. ALiBi's slopes are ``2^(−8(h+1)/H)``; a learnable sink is ``grid.sink_logits`` and requires
    grad, so that the backward computes its gradient as training does."""
    options: dict[str, object] = {}
    if config.window != (-1, -1):
        options["window_size"] = config.window
    if config.softcap > 0:
        options["softcap"] = config.softcap
    if config.alibi:
        options["alibi_slopes"] = grid.alibi_slopes(config.heads).to(device)
    if config.dropout_p > 0:
        options["dropout_p"] = config.dropout_p
    if config.sink:
        options["learnable_sink"] = grid.sink_logits(config.heads).to(device).requires_grad_(True)
    if config.fp8:
        options["fp8"] = True
    if config.layout == "varlen":
        bounds = torch.tensor((0, *config.lengths)).cumsum(0)
        options["cu_seqlens"] = bounds.to(device=device, dtype=torch.int32)
        options["max_seqlen"] = max(config.lengths)
    return options


def _oracle(
    config: Config,
    part: Config,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: dict[str, object],
    learnable_sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Naive attention of the part ``part`` of ``config`` with the cell's options (dropout excepted) and
    ``learnable_sink``, the part's heads of the cell's sink."""
    from flashtile.reference.naive import attention, attention_varlen

    keywords: dict[str, object] = {
        "softmax_scale": config.softmax_scale,
        "causal": config.causal,
        "window_size": config.window,
        "softcap": config.softcap,
    }
    if config.alibi:
        keywords["alibi_slopes"] = options["alibi_slopes"][config.heads - part.heads :]
    if learnable_sink is not None:
        keywords["learnable_sink"] = learnable_sink
    if config.layout == "varlen":
        cu, longest = options["cu_seqlens"], options["max_seqlen"]
        return attention_varlen(q[0], k[0], v[0], cu, cu, longest, longest, **keywords)[0][None]
    return attention(q, k, v, **keywords)[0]


def _checks_sink_grad(config: Config, part: Config, need_grads: bool) -> bool:
    """Whether the sink's gradient is checked: it sums over the batch, so only where the oracle covers every
    sequence."""
    return config.sink and need_grads and part.batch == config.batch


def _reference(
    config: Config, need_grads: bool, device: torch.device, options: dict[str, object]
) -> _Reference:
    part = check_slice(config, device)
    q = torch.randn(config.q_shape(), device=device)
    k = torch.randn(config.kv_shape(), device=device)
    v = torch.randn(config.v_shape(), device=device)
    dout = torch.randn(config.out_shape(), device=device).to(config.torch_dtype)
    inputs = tuple(t.to(config.input_dtype) for t in (q, k, v))
    del q, k, v
    rows, kv_rows = _select(part, config), _select(part, config, kv=True)
    sub = (inputs[0][rows], inputs[1][kv_rows], inputs[2][kv_rows])
    sink = options.get("learnable_sink")
    sink_grad = _checks_sink_grad(config, part, need_grads)

    def naive(dtype: torch.dtype) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        leaves = [t.detach().to(dtype).requires_grad_(need_grads) for t in sub]
        part_sink = None
        if sink is not None:
            part_sink = sink.detach()[rows[2]].to(dtype).requires_grad_(sink_grad)
        out = _oracle(config, part, *leaves, options, part_sink)
        wrt = [*leaves, part_sink] if sink_grad else leaves
        grads = torch.autograd.grad(out, wrt, dout[rows].to(dtype)) if need_grads else None
        return out.detach(), grads

    out64, grads64 = naive(torch.float64)
    if config.fp8:
        # The float8 kernel's roundings (P in e4m3, a bf16 output) computed by PyTorch: the fp8 baseline.
        keywords = dict(softmax_scale=config.softmax_scale, causal=config.causal, window_size=config.window)
        out_low = rounded_like_the_kernel(
            *(t.to(torch.float32) for t in sub), softcap=config.softcap, **keywords
        )
        grads_low = None
    else:
        out_low, grads_low = naive(config.torch_dtype)
    return _Reference(config, part, inputs, dout, out64, out_low, grads64, grads_low)


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:_DETAIL_CHARS]


def _failure(exc: BaseException, warned: Iterable[str] = ()) -> _Verdict:
    """Classify an exception: out of memory, unsupported (no kernel for these inputs), or an error."""
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text:
        return _Verdict("oom", _short(exc))
    if "No available kernel" in text:
        reasons = "; ".join(dict.fromkeys(w.strip().replace("\n", " ") for w in warned if w.strip()))
        return _Verdict("unsupported", (reasons or "no available kernel for these inputs")[:_DETAIL_CHARS])
    if isinstance(exc, NotImplementedError):
        return _Verdict("unsupported", _short(exc))
    if any(s in text for s in _FATAL_CUDA):
        raise _FatalDeviceError(_short(exc)) from exc
    return _Verdict("error", f"{type(exc).__name__}: {_short(exc)}"[:_DETAIL_CHARS])


def _judge(comparisons: list[Comparison], config: Config, part: Config) -> _Verdict:
    failed = [c for c in comparisons if not c.passed]
    if failed:
        worst = max(
            failed, key=lambda c: c.max_abs_error / c.allowed if math.isfinite(c.max_abs_error) else math.inf
        )
        return _Verdict("wrong", "; ".join(str(c) for c in failed)[:_DETAIL_CHARS], worst.max_abs_error)
    where = f"checked on the last {part.batch}/{config.batch} sequences, {part.heads}/{config.heads} heads"
    errors = ", ".join(f"{c.name} {c.max_abs_error:.1e}/{c.allowed:.1e}" for c in comparisons)
    return _Verdict("ok", f"{where}: max|err|/allowed {errors}")


def _check_peer(
    peer: Peer, ref: _Reference, need_grads: bool, options: dict[str, object]
) -> tuple[_Verdict, _Verdict | None]:
    """The forward verdict and, when asked, the backward verdict of one peer on the check slice."""
    config, part = ref.config, ref.part
    rows, kv_rows = _select(part, config), _select(part, config, kv=True)
    leaves = [t.detach().clone().requires_grad_(True) for t in ref.inputs]
    sink = options.get("learnable_sink")
    if sink is not None:
        sink = sink.detach().clone().requires_grad_(True)
        options = {**options, "learnable_sink": sink}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = peer.fn(*leaves, config.causal, config.softmax_scale, **options)
        except Exception as exc:
            verdict = _failure(exc, (str(w.message) for w in caught))
            return verdict, verdict
    fwd = _judge([compare("out", out[rows], ref.out64, ref.out_low, OUTPUT_FACTOR)], config, part)
    if not need_grads:
        return fwd, None
    if fwd.status != "ok":
        return fwd, fwd
    sink_grad = _checks_sink_grad(config, part, need_grads)
    try:
        grads = torch.autograd.grad(out, [*leaves, sink] if sink_grad else leaves, ref.dout)
    except Exception as exc:
        return fwd, _failure(exc)
    ours = (grads[0][rows], grads[1][kv_rows], grads[2][kv_rows], *(g[rows[2]] for g in grads[3:]))
    comparisons = [
        compare(n, g, g64, g_low, GRAD_FACTOR)
        for n, g, g64, g_low in zip(
            ("dq", "dk", "dv", "dsink"), ours, ref.grads64, ref.grads_low, strict=False
        )
    ]
    bwd = _judge(comparisons, config, part)
    if config.sink and not sink_grad and bwd.status == "ok":
        why = f"; dsink not checked: it sums over {config.batch} sequences, the oracle covers {part.batch}"
        bwd = dataclasses.replace(bwd, detail=bwd.detail + why)
    return fwd, bwd


def _make_inputs(config: Config, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """Rotated copies of random (q, k, v, dout); q, k, v require grad."""
    fwd = config.with_mode("fwd").bytes_moved()
    copies = rotation_copies(int(fwd), int(3 * fwd), device)
    made = []
    for _ in range(copies):
        q = torch.randn(config.q_shape(), device=device)
        k = torch.randn(config.kv_shape(), device=device)
        v = torch.randn(config.v_shape(), device=device)
        dout = torch.randn(config.out_shape(), device=device)
        q, k, v = (t.to(config.input_dtype).requires_grad_(True) for t in (q, k, v))
        made.append((q, k, v, dout.to(config.torch_dtype)))
    return made


def _measured_fn(
    peer: Peer, config: Config, inputs: list[tuple[torch.Tensor, ...]], options: dict[str, object]
) -> Callable[[int], object]:
    """``fn(i)`` for the timer: forward, backward alone (``autograd.grad`` on a kept graph), or both."""

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return peer.fn(q, k, v, config.causal, config.softmax_scale, **options)

    if config.mode == "fwd":
        return lambda i: call(*inputs[i][:3])
    if config.mode == "bwd":
        outs = [call(q, k, v) for q, k, v, _ in inputs]
        return lambda i: torch.autograd.grad(outs[i], inputs[i][:3], inputs[i][3], retain_graph=True)

    def fwd_bwd(i: int) -> object:
        q, k, v, dout = inputs[i]
        return torch.autograd.grad(call(q, k, v), (q, k, v), dout)

    return fwd_bwd


class _Runner:
    """Runs the cells one kernel configuration at a time and keeps the results and the time each peer took."""

    def __init__(self, preset: Preset, peers: list[Peer], device: torch.device, progress: Progress) -> None:
        self.preset, self.peers, self.device, self.progress = preset, peers, device, progress
        self.deadline = time.monotonic() + preset.time_budget_s if preset.time_budget_s else None
        self.peer_seconds: dict[str, float] = defaultdict(float)
        # Kernel configurations timed so far: each starts its timings one peer further along the list.
        self.shapes_timed = 0
        self.task = progress.add_task(
            "starting", total=sum(preset.measures(p.name, c) for c in preset.configs() for p in peers)
        )

    def _out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def _free(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run_configuration(self, configs: list[Config]) -> list[Result]:
        """All modes of one kernel configuration, every peer."""
        done: list[Result] = []
        todo: dict[str, list[Config]] = {}
        for peer in self.peers:
            for config in configs:
                if not self.preset.measures(peer.name, config):
                    continue
                verdict = self._excluded(peer, config)
                if verdict:
                    done.append(Result(config, peer.name, verdict.status, verdict.detail))
                    self.progress.advance(self.task)
                else:
                    todo.setdefault(peer.name, []).append(config)
        if not todo:
            return done
        options = call_options(configs[0], self.device)
        verdicts = self._check(configs[0], todo, options)
        # Per mode, the peers to time in _timing_order's turn, timed together in rounds (_time_together).
        pending: dict[Config, list[tuple[Peer, _Verdict]]] = {}
        for peer in self._timing_order(todo):
            for config in todo[peer.name]:
                verdict = verdicts[(peer.name, config.mode)]
                if verdict.status != "ok":
                    done.append(
                        Result(config, peer.name, verdict.status, verdict.detail, error=verdict.error)
                    )
                    self.progress.advance(self.task)
                else:
                    pending.setdefault(config, []).append((peer, verdict))
        inputs: list[tuple[torch.Tensor, ...]] | None = None
        no_inputs = ""
        for config, peers in pending.items():
            self.progress.update(self.task, description=f"{config.label()} · timing {len(peers)} in turn")
            if self._out_of_time():
                done.extend(Result(config, peer.name, "skipped", self._budget_reason()) for peer, _ in peers)
            else:
                if inputs is None:
                    try:
                        inputs = _make_inputs(config, self.device)
                    except torch.OutOfMemoryError as exc:
                        inputs, no_inputs = [], f"allocating the inputs: {_short(exc)}"
                    self._free()
                if inputs:
                    done.extend(self._time_together(peers, config, inputs, options))
                else:
                    done.extend(Result(config, peer.name, "oom", no_inputs) for peer, _ in peers)
            self.progress.advance(self.task, len(peers))
        del inputs
        self._free()
        return done

    def _timing_order(self, todo: dict[str, list[Config]]) -> list[Peer]:
        """The peers to time in this configuration, the list rotated by one place per configuration. Whichever
        is timed first runs on a GPU the checks left idle, and the position moved a kernel's time by up to
        11 % (README, "Measured"): rotating spreads that over the peers instead of giving it to one."""
        timed = [peer for peer in self.peers if peer.name in todo]
        shift = rotation_shift(self.shapes_timed, len(timed))
        self.shapes_timed += 1
        return timed[shift:] + timed[:shift]

    def _budget_reason(self) -> str:
        return f"run time budget of {self.preset.time_budget_s:.0f} s spent"

    def _excluded(self, peer: Peer, config: Config) -> _Verdict | None:
        if peer.fn is None:
            return _Verdict("unsupported", f"unavailable: {peer.unavailable}")
        reason = peer.lacks(config) or peer.supports(config)
        if reason:
            return _Verdict("unsupported", reason)
        for skip in self.preset.skips:
            if reason := skip.applies(peer.name, config):
                return _Verdict("skipped", reason)
        if self._out_of_time():
            return _Verdict("skipped", self._budget_reason())
        return None

    def _check(
        self, config: Config, todo: dict[str, list[Config]], options: dict[str, object]
    ) -> dict[tuple[str, str], _Verdict]:
        """A verdict for every (peer, mode) to run, from one oracle shared by all peers."""
        if config.dropout_p > 0:
            unchecked = _Verdict("ok", _DROPOUT_UNCHECKED)
            return {(name, c.mode): unchecked for name, cs in todo.items() for c in cs}
        needs_grads = {name: any(c.mode != "fwd" for c in cs) for name, cs in todo.items()}
        self.progress.update(self.task, description=f"{config.label()} · float64 oracle")
        verdicts: dict[tuple[str, str], _Verdict] = {}
        try:
            ref = _reference(config, any(needs_grads.values()), self.device, options)
        except Exception as exc:
            failed = _failure(exc)
        else:
            failed = None
        if failed is not None:
            self._free()
            text = f"not checked: the float64 oracle failed ({failed.status}: {failed.detail})"
            oracle = _Verdict("error", text[:_DETAIL_CHARS])
            return {(name, c.mode): oracle for name, cs in todo.items() for c in cs}
        for peer in self.peers:
            if peer.name not in todo:
                continue
            self.progress.update(self.task, description=f"{config.label()} · checking {peer.name}")
            start = time.monotonic()
            fwd, bwd = _check_peer(peer, ref, needs_grads[peer.name], options)
            self._free()
            self.peer_seconds[peer.name] += time.monotonic() - start
            for c in todo[peer.name]:
                verdicts[(peer.name, c.mode)] = fwd if c.mode == "fwd" else bwd
        del ref
        self._free()
        return verdicts

    def _time_together(
        self,
        peers: list[tuple[Peer, _Verdict]],
        config: Config,
        inputs: list[tuple[torch.Tensor, ...]],
        options: dict[str, object],
    ) -> list[Result]:
        """Time ``peers`` (checked, in their turn) on one cell in the preset's rounds, in turn
        (``timing.time_in_rounds``): a drift of the GPU's clocks or heat within the cell then reaches every
        peer, not whichever came last."""
        done: list[Result] = []
        ready: list[tuple[Peer, _Verdict, Callable[[int], object]]] = []
        for peer, check in peers:
            start = time.monotonic()
            try:
                ready.append((peer, check, _measured_fn(peer, config, inputs, options)))
            except Exception as exc:
                failed = _failure(exc)
                self._free()
                done.append(Result(config, peer.name, failed.status, failed.detail))
            self.peer_seconds[peer.name] += time.monotonic() - start
        start = time.monotonic()
        timings = time_in_rounds([fn for _, _, fn in ready], len(inputs), self.device, self.preset.timing)
        # The rounds interleave the peers: their time is shared out evenly.
        for peer, _, _ in ready:
            self.peer_seconds[peer.name] += (time.monotonic() - start) / max(len(ready), 1)
        for place, ((peer, check, _), timed) in enumerate(zip(ready, timings, strict=True)):
            if isinstance(timed, Exception):
                failed = _failure(timed)
                done.append(Result(config, peer.name, failed.status, failed.detail))
                continue
            timing = timed.timing
            detail = f"{check.detail}; {timing.reps} calls over {len(inputs)} input copies"
            # The place in the first round's turn (_timing_order), and each round's median: to read a bias.
            rounds = ", ".join(f"{ms:.4g}" for ms in timed.p50s_ms)
            detail += f"; timed {place + 1} of {len(ready)}, median of rounds {rounds} ms"
            if self.device.type == "cuda" and timing.host_ms is not None:
                detail += host_note(timing.host_ms, timing.p50_ms)
            note = peer.cell_note(config) if peer.cell_note is not None else peer.note
            if note:
                detail = f"{note}; {detail}"
            done.append(Result(config, peer.name, "ok", detail, timing=timing))
        del ready
        self._free()
        return done


def host_note(host_ms: float, call_ms: float) -> str:
    """The detail's host part: the median host time of a call, and "host-bound" where it is HOST_BOUND of
    the per-call time or more (the GPU then waits for the host, and per-call timing reads host and kernels
    together)."""
    note = f"; host {1e3 * host_ms:.0f} µs a call"
    return note + " (host-bound)" if host_ms >= HOST_BOUND * call_ms else note


def _configurations(configs: list[Config]) -> list[list[Config]]:
    """The cells grouped by kernel configuration (all modes of one shape together), in order."""
    groups: dict[Config, list[Config]] = {}
    for c in configs:
        groups.setdefault(c.with_mode(""), []).append(c)
    return list(groups.values())


def _format_tflops(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def render_tables(found: list[Result], env: Environment, order: list[str], console: Console) -> None:
    """One table per (options, dtype, mode, causal, head dim): TFLOP/s per implementation and N, and
    flashtile/best."""
    tables: dict[tuple[str, str, str, bool, tuple[int, int]], list[Result]] = defaultdict(list)
    for r in found:
        c = r.config
        tables[(c.option_label(), c.dtype, c.mode, c.causal, (c.head_dim, c.dim_v))].append(r)
    cpu = env.device == "cpu"
    for key in sorted(tables, key=lambda k: (k[0], k[1], MODES.index(k[2]), k[3], k[4])):
        option, dtype, mode, causal, _ = key
        head_dim = tables[key][0].config.head_dim_label
        option = f" · {option}" if option else ""
        cells = {(r.impl, r.config.seqlen_q): r for r in tables[key]}
        seqlens = sorted({n for _, n in cells})
        impls = [i for i in order if any((i, n) in cells for n in seqlens)]
        where = "CPU numbers, tiny shapes: a smoke test, not performance" if cpu else env.gpu
        table = Table(
            title=f"{mode} · {'causal' if causal else 'non-causal'}{option} · D={head_dim} · {dtype} "
            "· TFLOP/s",
            caption=where,
            title_justify="left",
            caption_justify="left",
        )
        table.add_column("impl")
        for n in seqlens:
            sample = next(cells[(i, n)].config for i in impls if (i, n) in cells)
            table.add_column(f"N={grid.seqlen_label(n)}\nB={sample.batch} H={sample.heads}", justify="right")
        notes: dict[str, int] = {}
        best = _best_peers(cells, seqlens)
        for impl in impls:
            row = [impl]
            for n in seqlens:
                r = cells.get((impl, n))
                row.append(_cell(r, notes, bold=best.get(n, (None,))[0] == impl))
            table.add_row(*row)
        if "flashtile" in impls:
            table.add_row(
                "flashtile / best", *[_ratio(cells.get(("flashtile", n)), best.get(n)) for n in seqlens]
            )
        console.print(table)
        for text, number in notes.items():
            console.print(f"  [{number}] {text}", highlight=False, soft_wrap=True)


def _best_peers(cells: dict[tuple[str, int], Result], seqlens: list[int]) -> dict[int, tuple[str, float]]:
    """For each N, the fastest correct implementation other than flashtile."""
    best: dict[int, tuple[str, float]] = {}
    for (impl, n), r in cells.items():
        if impl != "flashtile" and r.tflops is not None and (n not in best or r.tflops > best[n][1]):
            best[n] = (impl, r.tflops)
    return best


def _cell(r: Result | None, notes: dict[str, int], bold: bool) -> str:
    if r is None:
        return ""
    if r.status == "ok" and r.tflops is not None:
        text = _format_tflops(r.tflops)
        return f"[bold]{text}[/bold]" if bold else text
    if r.status == "wrong":
        return f"[red]wrong (err {r.error:.1e})[/red]" if r.error is not None else "[red]wrong[/red]"
    label = {"oom": "OOM", "unsupported": "n/a", "skipped": "skipped", "error": "error"}.get(
        r.status, r.status
    )
    note = notes.setdefault(f"{r.impl}: {r.detail}", len(notes) + 1)
    return f"[dim]{label} [{note}][/dim]" if r.status != "error" else f"[red]error [{note}][/red]"


def _ratio(ours: Result | None, best: tuple[str, float] | None) -> str:
    if ours is None or ours.tflops is None or best is None:
        return "–"
    return _signal(ours.tflops / best[1], 1.0)


@dataclass(frozen=True)
class OptionComparison:
    """flashtile on an option cell against a yardstick (its plain kernel at the same N, or for a packed batch
    also its documents run alone and the same sequences padded to the longest) and against the fastest peer
    on the same cell."""

    option: str
    mode: str
    seqlen: int
    tflops: float
    yardstick: str
    yardstick_tflops: float | None
    speedup: float | None
    peer: str | None
    peer_tflops: float | None

    @property
    def ratio(self) -> float | None:
        return self.tflops / self.yardstick_tflops if self.yardstick_tflops else None

    @property
    def peer_ratio(self) -> float | None:
        return self.tflops / self.peer_tflops if self.peer_tflops else None


def _plain_key(config: Config) -> tuple[object, ...]:
    """What pairs an option cell with its plain cell: everything but the batch, which a packed batch of mixed
    lengths cannot share with a dense one of the same token count."""
    c = config.without_options()
    return (c.dtype, c.mode, c.head_dim, c.heads, c.heads_kv, c.causal, c.seqlen_q, c.seqlen_k)


def documents_alone(packed: Config, ours: list[Result]) -> tuple[float, float] | None:
    """A packed batch's documents run one by one, each a dense batch of one (the options preset measures
    them beside it): their TFLOP/s over all of them and their summed ms, or None if one was not timed."""
    dense = {r.config: r for r in ours if not r.config.options}
    total_ms = total_work = 0.0
    for n in packed.lengths:
        cell = dataclasses.replace(packed, layout="dense", lengths=(), batch=1, seqlen_q=n, seqlen_k=n)
        alone = dense.get(cell)
        if alone is None:
            return None
        total_ms += alone.timing.p50_ms
        total_work += alone.tflops * alone.timing.p50_ms
    return total_work / total_ms, total_ms


def option_comparisons(found: list[Result]) -> list[OptionComparison]:
    """flashtile's option cells, each against its yardstick and its fastest peer, in the order measured."""
    ours = [r for r in found if r.impl == "flashtile" and r.tflops]
    plain = {_plain_key(r.config): r for r in ours if not r.config.options}
    padded = {(r.config.mode, r.config.lengths): r for r in ours if r.config.layout == "padded"}
    compared = []
    for r in ours:
        c = r.config
        if not c.options or c.layout == "padded":
            continue
        peers = [p for p in found if p.config == c and p.impl != "flashtile" and p.tflops]
        best = max(peers, key=lambda p: p.tflops, default=None)
        yard = plain.get(_plain_key(c))
        name = "dense causal" if c.causal else "dense"
        compared.append(
            OptionComparison(
                c.option_label(),
                c.mode,
                c.seqlen_q,
                r.tflops,
                name,
                yard.tflops if yard else None,
                yard.timing.p50_ms / r.timing.p50_ms if yard else None,
                best.impl if best else None,
                best.tflops if best else None,
            )
        )
        alone = documents_alone(c, ours) if c.layout == "varlen" else None
        if alone is not None:
            alone_tflops, alone_ms = alone
            compared.append(
                OptionComparison(
                    c.option_label(), c.mode, c.seqlen_q, r.tflops, "documents alone", alone_tflops,
                    alone_ms / r.timing.p50_ms, None, None,
                )
            )  # fmt: skip
        pad = padded.get((c.mode, c.lengths)) if c.layout == "varlen" else None
        if pad is not None:
            compared.append(
                OptionComparison(
                    c.option_label(),
                    c.mode,
                    c.seqlen_q,
                    r.tflops,
                    "padded to longest",
                    pad.tflops,
                    pad.timing.p50_ms / r.timing.p50_ms,
                    None,
                    None,
                )
            )
    return compared


def render_option_summary(found: list[Result], console: Console) -> None:
    """The options table: TFLOP/s counted on visible pairs, option / yardstick (target ≥ 0.9), the speedup
    in time over the yardstick (the window's over dense causal, the packed batch's over its documents run
    alone and over padding), and flashtile / the fastest peer with the option (target ≥ 1.0)."""
    compared = option_comparisons(found)
    if not compared:
        return
    table = Table(
        title="options · flashtile TFLOP/s on visible pairs against its plain kernel and the peers",
        title_justify="left",
    )
    for name in (
        "option",
        "mode",
        "N",
        "TFLOP/s",
        "flashtile on",
        "TFLOP/s ",
        "ratio",
        "speedup",
        "peer",
        "vs peer",
    ):
        table.add_column(
            name, justify="left" if name in ("option", "mode", "flashtile on", "peer") else "right"
        )
    for c in compared:
        table.add_row(
            c.option,
            c.mode,
            grid.seqlen_label(c.seqlen),
            _format_tflops(c.tflops),
            c.yardstick,
            _format_tflops(c.yardstick_tflops) if c.yardstick_tflops else "–",
            _signal(c.ratio, 0.9),
            f"{c.speedup:.2f}×" if c.speedup else "–",
            f"{c.peer} {_format_tflops(c.peer_tflops)}" if c.peer else "–",
            _signal(c.peer_ratio, 1.0),
        )
    console.print(table)


@dataclass(frozen=True)
class HeadDimComparison:
    """flashtile on one (D, D_v) cell against its own equal-dim 128 and 256 cells of the same dtype, mode,
    causal flag and N, and against the fastest peer on the same cell."""

    head_dims: str
    mode: str
    causal: bool
    seqlen: int
    tflops: float
    vs_128: float | None
    vs_256: float | None
    peer: str | None
    peer_tflops: float | None

    @property
    def peer_ratio(self) -> float | None:
        return self.tflops / self.peer_tflops if self.peer_tflops else None


def head_dim_comparisons(found: list[Result]) -> list[HeadDimComparison]:
    """flashtile's cells of a run with several (D, D_v) pairs, in the order measured; empty when every cell
    has V's head dim equal to Q/K's (a plain run)."""
    if not any(r.config.head_dim_v for r in found):
        return []
    ours = [r for r in found if r.impl == "flashtile" and r.tflops]

    def shape(c: Config) -> tuple[object, ...]:
        return (c.dtype, c.mode, c.causal, c.seqlen_q)

    equal = {(shape(r.config), r.config.head_dim): r.tflops for r in ours if not r.config.head_dim_v}
    compared = []
    for r in ours:
        c = r.config
        peers = [p for p in found if p.config == c and p.impl != "flashtile" and p.tflops]
        best = max(peers, key=lambda p: p.tflops, default=None)
        base_128, base_256 = equal.get((shape(c), 128)), equal.get((shape(c), 256))
        compared.append(
            HeadDimComparison(
                c.head_dim_label if c.head_dim_v else f"{c.head_dim}/{c.head_dim}",
                c.mode,
                c.causal,
                c.seqlen_q,
                r.tflops,
                r.tflops / base_128 if base_128 else None,
                r.tflops / base_256 if base_256 else None,
                best.impl if best else None,
                best.tflops if best else None,
            )
        )
    return compared


def render_head_dim_summary(found: list[Result], console: Console) -> None:
    """The head-dims table: flashtile's TFLOP/s per (D, D_v), the ratio to its 128/128 and 256/256 cells at
    the same mode, causal flag and N, and the fastest peer that ran the shape."""
    compared = head_dim_comparisons(found)
    if not compared:
        return
    table = Table(
        title="head dims · flashtile TFLOP/s against its equal-dim 128 and 256 cells and the peers",
        title_justify="left",
    )
    for name in ("D/D_v", "mode", "causal", "N", "TFLOP/s", "/ 128/128", "/ 256/256", "peer", "vs peer"):
        table.add_column(name, justify="left" if name in ("D/D_v", "mode", "causal", "peer") else "right")
    for c in compared:
        table.add_row(
            c.head_dims,
            c.mode,
            "causal" if c.causal else "non-causal",
            grid.seqlen_label(c.seqlen),
            _format_tflops(c.tflops),
            f"{c.vs_128:.2f}×" if c.vs_128 else "–",
            f"{c.vs_256:.2f}×" if c.vs_256 else "–",
            f"{c.peer} {_format_tflops(c.peer_tflops)}" if c.peer else "–",
            _signal(c.peer_ratio, 1.0),
        )
    console.print(table)


def _signal(ratio: float | None, target: float) -> str:
    if ratio is None:
        return "–"
    return f"[{'green' if ratio >= target else 'red'}]{ratio:.2f}×[/]"


def summarise(found: list[Result], console: Console) -> None:
    """Geometric mean of flashtile / best peer per (dtype, mode) over the cells where both have a number."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_cell: dict[Config, list[Result]] = defaultdict(list)
    for r in found:
        by_cell[r.config].append(r)
    for config, rs in by_cell.items():
        ours = next((r.tflops for r in rs if r.impl == "flashtile" and r.tflops), None)
        others = [r.tflops for r in rs if r.impl != "flashtile" and r.tflops]
        if ours and others:
            ratios[(config.dtype, config.mode)].append(ours / max(others))
    for (dtype, mode), values in sorted(ratios.items(), key=lambda kv: (kv[0][0], MODES.index(kv[0][1]))):
        geomean = math.exp(sum(math.log(x) for x in values) / len(values))
        wins = sum(x >= 1.0 for x in values)
        console.print(
            f"flashtile / best peer, {mode} {dtype}: geometric mean {geomean:.2f}× over {len(values)} cells, "
            f"≥ 1.0× in {wins}",
            highlight=False,
        )


def _plot(csv_path: Path, console: Console, date: str | None) -> int:
    from flashtile.bench.plots import plot_results

    if not csv_path.exists():
        print(f"flashtile bench: no results file at {csv_path}", file=sys.stderr)
        return 2
    written = plot_results(csv_path, csv_path.parent, date=date)
    for path in written:
        console.print(f"plot: {path}", highlight=False)
    if not written:
        console.print(f"no plot: the run of {date} in {csv_path} has no timed (ok) row", highlight=False)
    return 0


def _report(csv_path: Path, console: Console) -> int:
    """Tables, summary and plots of the latest run in a CSV, without measuring anything."""
    if not csv_path.exists():
        print(f"flashtile bench: no results file at {csv_path}", file=sys.stderr)
        return 2
    try:
        rows = results.read_rows(csv_path, results.COLUMNS)
    except ValueError as exc:
        print(f"flashtile bench: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"flashtile bench: no rows in {csv_path}", file=sys.stderr)
        return 2
    date = max(r["date"] for r in rows)
    run = [r for r in rows if r["date"] == date]
    if run:
        found = [Result.from_row(r) for r in run]
        env = results.environment_of(run[0])
        console.print(
            f"run of {env.date} on {env.gpu}, torch {env.torch}, commit {env.commit}", highlight=False
        )
        render_tables(found, env, list(dict.fromkeys(r.impl for r in found)), console)
        summarise(found, console)
        render_option_summary(found, console)
        render_head_dim_summary(found, console)
    return _plot(csv_path, console, date=date)


def main(args: argparse.Namespace) -> int:
    """The ``flashtile bench`` command; returns the exit status."""
    # ``--options`` alone is every option; with names, only those (args.options then says "the preset").
    if isinstance(args.options, list):
        args.option_names = tuple(args.options)
        args.options = True
    elif args.options is None:
        args.options = False
    # Off a terminal (CI, a remote run's captured log) rich assumes 80 columns, which wraps the tables.
    console = Console() if Console().is_terminal else Console(width=_LOG_WIDTH)
    if args.head_dims and (args.masks or args.decode):
        print("flashtile bench: --head-dims, --masks and --decode are separate runs", file=sys.stderr)
        return 2
    if args.masks:
        from flashtile.bench import masks

        return masks.main(args)
    if args.decode:
        from flashtile.bench import decode

        return decode.main(args)
    if args.name is None:
        args.name = "bench_options" if args.options else "bench_head_dims" if args.head_dims else "bench"
    csv_path = results.output_csv(args)
    if args.plot_only:
        return _report(csv_path, console)
    try:
        device = _device(args.device)
        preset = build_preset(args, device)
        configs = preset.configs()
        peers, notes = select_peers(args.peers, preset)
        columns = (
            results.OPTION_COLUMNS
            if preset.options
            else results.HEAD_DIM_COLUMNS
            if preset.head_dim_pairs
            else results.COLUMNS
        )
        # A CSV that cannot be written is found now, not after the first cell's measurement.
        results.check_output(csv_path, columns)
    except ValueError as exc:
        print(f"flashtile bench: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    env = results.environment(device)
    console.print(
        f"flashtile bench ({preset.name}) on {env.gpu}, torch {env.torch}, triton {env.triton or '–'}, "
        f"commit {env.commit}: {len(configs)} cells × {len(peers)} implementations → {csv_path}",
        highlight=False,
    )
    for note in notes:
        console.print(f"  {note}", highlight=False, soft_wrap=True)
    found: list[Result] = []
    started = time.monotonic()
    status = 0
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with progress:
        runner = _Runner(preset, peers, device, progress)
        for group in _configurations(configs):
            try:
                rows = runner.run_configuration(group)
            except _FatalDeviceError as exc:
                console.print(f"[red]flashtile bench: CUDA context lost, stopping: {exc}[/red]")
                status = 1
                break
            results.append_rows(csv_path, [r.row(env) for r in rows], columns)
            found.extend(rows)
    render_tables(found, env, [p.name for p in peers], console)
    summarise(found, console)
    render_option_summary(found, console)
    render_head_dim_summary(found, console)
    seconds = ", ".join(
        f"{name} {s:.0f} s" for name, s in sorted(runner.peer_seconds.items(), key=lambda kv: -kv[1])
    )
    console.print(
        f"{len(found)} rows appended to {csv_path} in {time.monotonic() - started:.0f} s "
        f"(check and timing, compilation included: {seconds or 'none'})",
        highlight=False,
    )
    if not args.no_plot and found:
        status = _plot(csv_path, console, date=env.date) or status
    return status
