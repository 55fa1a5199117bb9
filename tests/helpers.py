"""The one assertion helper of the suite: flash-attention's rule, with a readable failure."""

from __future__ import annotations

import torch

from flashtile.reference.compare import GRAD_FACTOR, OUTPUT_FACTOR, compare


def assert_matches_oracle(
    name: str,
    ours: torch.Tensor,
    oracle: torch.Tensor,
    baseline: torch.Tensor,
    *,
    grad: bool = False,
    seed: int | None = None,
) -> None:
    """Fail unless ``ours`` is within 2× (3× for gradients) of the baseline's error against the oracle."""
    result = compare(name, ours, oracle, baseline, GRAD_FACTOR if grad else OUTPUT_FACTOR)
    assert result.passed, f"{result} (seed {seed})"


def nan_poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer whose every unwritten element reads as NaN."""
    return torch.full_like(t, float("nan"))
