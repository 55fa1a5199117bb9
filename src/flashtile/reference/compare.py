"""flash-attention's accuracy rule, shared by the tests, the self-check and the benchmark.

An implementation in low precision passes when its error against a float64 oracle is at most
``factor`` times the error of plain PyTorch in the same low precision, plus rounding noise:
``max|ours − oracle| ≤ factor · max|baseline − oracle| + atol``. The factor is 2 for outputs and
the log-sum-exp and 3 for gradients.

Non-finite values never pass unexamined: equal infinities (the −inf LSE of a fully masked row) and NaN
against NaN count as no error, and any other non-finite difference fails, whether in ``ours`` or in the
baseline (a baseline that overflowed gives no bound to measure against, and would otherwise allow any
error).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 3.0


@dataclass(frozen=True)
class Comparison:
    """How far one tensor is from the oracle, next to how far the low-precision baseline is."""

    name: str
    max_abs_error: float
    baseline_max_abs_error: float
    relative_error: float
    worst_index: tuple[int, ...]
    allowed: float
    nonfinite: int
    baseline_nonfinite: int = 0

    @property
    def passed(self) -> bool:
        return self.nonfinite == 0 and self.baseline_nonfinite == 0 and self.max_abs_error <= self.allowed

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        return (
            f"{self.name}: max|err| {self.max_abs_error:.3e} (allowed {self.allowed:.3e}, "
            f"baseline {self.baseline_max_abs_error:.3e}), rel {self.relative_error:.3e}, "
            f"worst at {self.worst_index}, non-finite {self.nonfinite} "
            f"(baseline {self.baseline_nonfinite}) -> {verdict}"
        )


def _finite_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| in float64 where equal infinities (masked rows' −inf LSE) count as no error."""
    a, b = a.double(), b.double()
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return torch.where(same, torch.zeros_like(a), (a - b).abs())


def compare(
    name: str,
    ours: torch.Tensor,
    oracle: torch.Tensor,
    baseline: torch.Tensor,
    factor: float,
    atol: float = 1e-5,
) -> Comparison:
    """Measure ``ours`` against ``oracle`` under the rule; ``baseline`` is PyTorch in the low precision."""
    if ours.shape != oracle.shape:
        raise ValueError(f"{name}: shape {tuple(ours.shape)} differs from the oracle's {tuple(oracle.shape)}")
    if oracle.numel() == 0:
        return Comparison(name, 0.0, 0.0, 0.0, (), atol, 0)
    ours_cpu, oracle_cpu, baseline_cpu = (t.detach().cpu() for t in (ours, oracle, baseline))
    diff = _finite_diff(ours_cpu, oracle_cpu)
    baseline_diff = _finite_diff(baseline_cpu, oracle_cpu)
    nonfinite = int((~torch.isfinite(diff)).sum())
    baseline_nonfinite = int((~torch.isfinite(baseline_diff)).sum())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    # The bound comes from the baseline's finite errors; its non-finite ones fail the comparison instead.
    baseline_err = float(torch.where(torch.isfinite(baseline_diff), baseline_diff, 0.0).max())
    flat = int(diff.argmax())
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    scale = float(torch.nan_to_num(oracle_cpu.double(), posinf=0.0, neginf=0.0).abs().max()) or 1.0
    max_err = float(diff.max())
    return Comparison(
        name=name,
        max_abs_error=max_err,
        baseline_max_abs_error=baseline_err,
        relative_error=max_err / scale,
        worst_index=worst,
        allowed=factor * baseline_err + atol,
        nonfinite=nonfinite,
        baseline_nonfinite=baseline_nonfinite,
    )
