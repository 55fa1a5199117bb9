"""``flashtile check``: run attention through every backend this machine has and grade it against float64.

For each backend (the PyTorch reference; Triton on CUDA, or under ``TRITON_INTERPRET=1`` on the CPU), each
dtype it supports and a few small shapes (causal and not, MHA/GQA/MQA, seqlen_q ≠ seqlen_k, fully masked
rows), the forward and backward are compared with the float64 reference under flash-attention's rule
(:mod:`flashtile.reference.compare`). PyTorch's ``scaled_dot_product_attention`` is graded the same way as a
comparison line; it does not count towards the verdict.

Run it as ``python -m flashtile.selfcheck [--device cpu|cuda]`` or ``flashtile check``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from flashtile import autograd as _autograd
from flashtile import backend as _backend
from flashtile import validation
from flashtile.reference.compare import GRAD_FACTOR, OUTPUT_FACTOR, Comparison, compare

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NAMES = ("out", "lse", "dq", "dk", "dv")


@dataclass(frozen=True)
class Case:
    """One problem: q is (batch, seqlen_q, nheads, head_dim), k and v are (batch, seqlen_k, nheads_kv, …)."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    head_dim: int
    causal: bool

    def __str__(self) -> str:
        heads = f"H{self.nheads}" if self.nheads == self.nheads_kv else f"H{self.nheads}/{self.nheads_kv}"
        return f"B{self.batch} N{self.seqlen_q}×{self.seqlen_k} {heads} D{self.head_dim}"

    @property
    def has_masked_rows(self) -> bool:
        return self.causal and self.seqlen_q > self.seqlen_k


# Small enough for Triton's CPU interpreter: MHA, GQA with seqlen_q < seqlen_k, MQA with fully masked rows.
SMALL_CASES = (
    Case(2, 33, 33, 2, 2, 32, False),
    Case(2, 33, 33, 2, 2, 32, True),
    Case(1, 17, 45, 4, 2, 64, True),
    Case(1, 40, 24, 4, 1, 40, True),
)
# Sizes past one tile, for CUDA only.
CUDA_CASES = (
    Case(2, 257, 257, 8, 2, 128, True),
    Case(1, 1000, 1000, 4, 4, 64, False),
)


@dataclass
class Row:
    """The grades of one implementation on one case and dtype; ``counts``: whether it enters the verdict."""

    implementation: str
    dtype: torch.dtype
    case: Case
    results: dict[str, Comparison]
    counts: bool
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(r.passed for r in self.results.values())

    @property
    def margin(self) -> float:
        """The largest ``max|err| / allowed`` over the compared tensors: the row passes while it is ≤ 1."""
        return max((r.max_abs_error / r.allowed for r in self.results.values()), default=math.inf)


def _inputs(case: Case, dtype: torch.dtype, device: torch.device, generator: torch.Generator):
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)

    q = randn(case.batch, case.seqlen_q, case.nheads, case.head_dim)
    k = randn(case.batch, case.seqlen_k, case.nheads_kv, case.head_dim)
    v = randn(case.batch, case.seqlen_k, case.nheads_kv, case.head_dim)
    dout = randn(case.batch, case.seqlen_q, case.nheads, case.head_dim)
    return q, k, v, dout


def _forward_backward(fn, q, k, v, dout):
    """``fn(q, k, v) -> (out, lse or None)`` and the gradients of ``(out · dout).sum()``."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, lse = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _reference_fn(scale: float, causal: bool):
    from flashtile.reference.naive import attention

    def fn(q, k, v):
        return attention(q, k, v, softmax_scale=scale, causal=causal)

    return fn


def _flashtile_fn(scale: float, causal: bool, backend: str):
    def fn(q, k, v):
        return _autograd.attention(q, k, v, scale, causal, backend)

    return fn


def _sdpa_fn(scale: float, causal: bool):
    from flashtile.bench.peers import sdpa
    from flashtile.reference.naive import keep_mask

    def fn(q, k, v):
        # SDPA's is_causal is top-left aligned; flash_attn's bottom-right mask goes in as attn_mask.
        mask = keep_mask(q.shape[1], k.shape[1], causal=True, device=q.device) if causal else None
        return sdpa(q, k, v, scale, attn_mask=mask), None

    return fn


def _grade(implementation, fn, case, dtype, inputs, oracle, baseline, counts) -> Row:
    try:
        ours = _forward_backward(fn, *inputs)
    except Exception as error:  # a backend that crashes is reported as a failed row, not raised
        return Row(implementation, dtype, case, {}, counts, error=f"{type(error).__name__}: {error}")
    results = {}
    for name in _NAMES:
        if ours[name] is None:
            continue
        factor = OUTPUT_FACTOR if name in ("out", "lse") else GRAD_FACTOR
        results[name] = compare(name, ours[name], oracle[name], baseline[name], factor)
    return Row(implementation, dtype, case, results, counts)


def check_backends(device: torch.device, cases: Sequence[Case], seed: int = 0) -> list[Row]:
    """Grade every available backend (and SDPA) on every case and supported dtype."""
    backends = _backend.available_backends(device)
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for case in cases:
        scale = 1.0 / math.sqrt(case.head_dim)
        for dtype in _DTYPES:
            users = [b for b in backends if dtype in validation.supported_dtypes(b, device)]
            if not users:
                continue
            inputs = _inputs(case, dtype, device, generator)
            oracle = _forward_backward(_reference_fn(scale, case.causal), *(t.double() for t in inputs))
            baseline = _forward_backward(_reference_fn(scale, case.causal), *inputs)
            for backend in users:
                fn = _flashtile_fn(scale, case.causal, backend)
                rows.append(_grade(backend, fn, case, dtype, inputs, oracle, baseline, counts=True))
            # SDPA gives NaN on fully masked rows by design: compare it only where every row sees a key.
            if not case.has_masked_rows:
                fn = _sdpa_fn(scale, case.causal)
                rows.append(_grade("sdpa", fn, case, dtype, inputs, oracle, baseline, counts=False))
    return rows


_TABLE_WIDTH = 120
_SHORT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def _cell(result: Comparison | None) -> str:
    if result is None:
        return "[dim]—[/dim]"
    style = "green" if result.passed else "bold red"
    return f"[{style}]{result.max_abs_error:.1e}[/{style}]"


def _verdict(row: Row) -> str:
    if row.error is not None:
        return f"[bold red]error[/bold red] {row.error[:100]}"
    if row.passed:
        return "[green]pass[/green]"
    return "[bold red]FAIL[/bold red]" if row.counts else "[red]fail[/red]"


def _table(rows: Sequence[Row], title: str):
    from rich import box
    from rich.table import Table

    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        caption=(
            "max|err| against the float64 reference; margin = max of err / allowed, where allowed is 2× "
            "(out, lse) or 3× (gradients) the error of the reference run in the same dtype. sdpa* is "
            "PyTorch's scaled_dot_product_attention, shown for comparison only."
        ),
    )
    for column in ("backend", "dtype", "case", "causal"):
        table.add_column(column, no_wrap=True)
    for name in (*_NAMES, "margin"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("result")
    for row in rows:
        margin = f"{row.margin:.2f}" if row.results else "—"
        table.add_row(
            row.implementation if row.counts else f"{row.implementation}*",
            _SHORT_DTYPES.get(row.dtype, str(row.dtype)),
            str(row.case),
            "yes" if row.case.causal else "no",
            *(_cell(row.results.get(n)) for n in _NAMES),
            margin,
            _verdict(row),
        )
    return table


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run(device: torch.device | str | None = None, console=None) -> bool:
    """Grade every backend available on ``device`` (default: CUDA if present, else CPU); print a table.

    Returns True when every flashtile backend passes on every case; the SDPA lines are for comparison only.
    ``console`` is a ``rich.console.Console`` (a new one on stdout by default).
    """
    from rich.console import Console

    import flashtile

    device = _default_device() if device is None else torch.device(device)
    if console is None:
        console = Console()
        # The table needs about 110 columns; narrower consoles (and pipes, read as 80) would cut its cells.
        if console.width < _TABLE_WIDTH:
            console = Console(width=_TABLE_WIDTH)
    cases = SMALL_CASES + (CUDA_CASES if device.type == "cuda" else ())
    backends = _backend.available_backends(device)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    if device.type == "cpu" and "triton" in backends:
        where += " (Triton interpreter)"
    console.print(
        f"flashtile {flashtile.__version__}, torch {torch.__version__}, triton {triton_version}; "
        f"device {device} ({where}); backends: {', '.join(backends)}"
    )
    rows = check_backends(device, cases)
    ok = all(row.passed for row in rows if row.counts)
    console.print(_table(rows, title=f"flashtile self-check on {device}"))
    failed = sum(1 for row in rows if row.counts and not row.passed)
    if ok:
        console.print(f"[green]all {sum(row.counts for row in rows)} flashtile checks passed[/green]")
    else:
        console.print(f"[bold red]{failed} flashtile check(s) failed[/bold red]")
    return ok


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``flashtile check``; its exit status is 0 when every check passes."""
    parser = subparsers.add_parser(
        "check",
        help="check that flashtile computes attention correctly on this machine",
        description="Run attention through every available backend; compare it with the float64 reference.",
        epilog="On a CPU, set TRITON_INTERPRET=1 to include the Triton kernels (run by its interpreter).",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.set_defaults(func=_command)
    return parser


def _command(args: argparse.Namespace) -> int:
    from flashtile.bench.results import device_of

    # A device torch cannot parse, or CUDA on a machine without it, is a one-line error, not a traceback.
    try:
        device = None if args.device is None else device_of(args.device)
    except ValueError as exc:
        print(f"flashtile check: {exc}", file=sys.stderr)
        return 2
    return 0 if run(device) else 1


if __name__ == "__main__":
    from flashtile.cli import main

    raise SystemExit(main(["check", *sys.argv[1:]]))
