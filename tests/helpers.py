"""The one assertion helper of the suite (flash-attention's rule, with a readable failure) and the
vocabulary the kernel and API tests share: head layouts, result names, one option case."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from flashtile.reference import tiled
from flashtile.reference.compare import GRAD_FACTOR, OUTPUT_FACTOR, compare


def assert_matches_oracle(
    name: str,
    ours: torch.Tensor,
    oracle: torch.Tensor,
    baseline: torch.Tensor,
    *,
    grad: bool = False,
    seed: int | None = None,
    floor: torch.Tensor | None = None,
) -> None:
    """Fail unless ``ours`` is within 2× (3× for gradients) of the baseline's error against the oracle.

    ``floor``, for a gradient: the exact float64 backward handed the low-precision ``out`` the forward
    stored, which then stands in for the baseline where it errs more. Every flash backward takes Δ = dO·O
    from that output, so O's rounding reaches dS = P·(dP − Δ), where PyTorch's autograd sums P·dP in fp32;
    on rows of one or two visible keys, or beside a sink, that alone can pass 3× PyTorch's error
    (docs/testing.md, "The stored-output floor")."""
    if floor is not None and oracle.numel():
        floor_err = (floor.double() - oracle.double()).abs().max()
        if floor_err > (baseline.double() - oracle.double()).abs().max():
            baseline = floor
    result = compare(name, ours, oracle, baseline, GRAD_FACTOR if grad else OUTPUT_FACTOR)
    assert result.passed, f"{result} (seed {seed})"


def stored_output_floor(dout, q, k, v, out, lse, softmax_scale: float, causal: bool, **options) -> tuple:
    """dq, dk, dv (and dsink with a ``learnable_sink``) of the exact float64 backward handed the stored
    low-precision ``out``: :func:`assert_matches_oracle`'s ``floor``. ``lse``: the oracle's (or ours: its
    fp32 rounding is far below the input dtype's); ``options``: the tiled reference's keywords."""
    sink = options.get("learnable_sink")
    if sink is not None:
        options = dict(options, learnable_sink=sink.double())
    wide = (t.detach().double() for t in (dout, q, k, v, out, lse))
    return tiled.attention_bwd(*wide, softmax_scale, causal, **options)


def nan_poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer whose every unwritten element reads as NaN."""
    return torch.full_like(t, float("nan"))


# (nheads, nheads_kv) of each head layout the tests rotate through.
HEAD_LAYOUTS = {"mha": (4, 4), "gqa": (4, 2), "mqa": (3, 1)}
RESULT_NAMES = ("out", "lse", "dq", "dk", "dv")


@dataclass(frozen=True)
class OptionCase:
    """One problem: ``seqlens`` is one (N_q, N_k) pair per sequence; dense cases use the first pair for a
    batch of ``len(seqlens)``, varlen cases pack them."""

    seqlens: tuple[tuple[int, int], ...]
    layout: str = "gqa"
    head_dim: int = 32
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: str | None = None
    dropout_p: float = 0.0
    varlen: bool = False
    dtype: torch.dtype = torch.float16
    device: str = "cpu"

    @property
    def id(self) -> str:
        lengths = "_".join(f"{q}x{k}" for q, k in self.seqlens)
        parts = [self.device, "varlen" if self.varlen else "dense", lengths, f"d{self.head_dim}", self.layout]
        parts += ["causal"] if self.causal else []
        parts += [f"w{self.window[0]},{self.window[1]}"] if self.window != (-1, -1) else []
        parts += [f"cap{self.softcap}"] if self.softcap else []
        parts += [f"alibi-{self.alibi}"] if self.alibi else []
        parts += [f"drop{self.dropout_p}"] if self.dropout_p else []
        return "-".join([*parts, str(self.dtype).removeprefix("torch.")])


def packed_batch(
    lengths: list[tuple[int, int]],
    heads: int,
    heads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str = "cuda",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Random packed q (total_q, H, D), k and v (total_k, H_KV, D) of sequences with (N_q, N_k) =
    ``lengths``, and the varlen keywords (int32 cu_seqlens_q/k, max_seqlen_q/k)."""
    cu_q, cu_k = (
        torch.tensor([0, *itertools.accumulate(n[i] for n in lengths)], dtype=torch.int32, device=device)
        for i in (0, 1)
    )
    q = torch.randn(int(cu_q[-1]), heads, head_dim, dtype=dtype, device=device)
    k, v = (torch.randn(int(cu_k[-1]), heads_kv, head_dim, dtype=dtype, device=device) for _ in range(2))
    longest = dict(max_seqlen_q=max(n[0] for n in lengths), max_seqlen_k=max(n[1] for n in lengths))
    return q, k, v, dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **longest)
