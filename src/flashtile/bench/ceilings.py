"""The machine's two ceilings, measured: matmul FLOP/s and device-to-device copy bandwidth.

Also the provenance columns (``results.environment``: commit, machine, versions, date) that ``roofline`` and
``memory`` start their rows with.

On CUDA the matmul is bf16 (or the dtype asked for) at 8192³ on random data and the copy moves 1 GiB,
counted as bytes read plus bytes written; both are timed by the benchmark harness (``timing.time_calls``:
warm-up, per-call CUDA events, median). On the CPU the same measurements run at small sizes and every label
says CPU.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from flashtile.bench.results import Environment, environment
from flashtile.bench.timing import TimingBudget, time_calls

PROVENANCE_COLUMNS = tuple(field.name for field in dataclasses.fields(Environment))


@dataclass(frozen=True)
class Ceilings:
    """Measured roofs of one device: matmul FLOP/s and copy bandwidth in bytes (read + written) per s."""

    device: str
    is_cpu: bool
    matmul_flops: float
    matmul_dtype: str
    matmul_size: int
    copy_bandwidth: float
    copy_bytes: int

    @property
    def ridge_intensity(self) -> float:
        """FLOP per byte where the bandwidth roof meets the compute roof."""
        return self.matmul_flops / self.copy_bandwidth

    def attainable(self, intensity: float) -> float:
        """The roofline: min(compute roof, bandwidth × intensity), in FLOP/s."""
        return min(self.matmul_flops, self.copy_bandwidth * intensity)


def _matmul_ms(n: int, dtype: torch.dtype, device: torch.device, budget: TimingBudget) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    return time_calls(lambda _: torch.mm(a, b, out=c), 1, device, budget).p50_ms


def _copy_ms(nbytes: int, device: torch.device, budget: TimingBudget) -> float:
    src = torch.randint(0, 256, (nbytes,), device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    return time_calls(lambda _: dst.copy_(src), 1, device, budget).p50_ms


def measure_ceilings(
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
    *,
    matmul_size: int | None = None,
    copy_bytes: int | None = None,
    budget: TimingBudget | None = None,
) -> Ceilings:
    """Measure the matmul rate at ``matmul_size``³ in ``dtype`` and the bandwidth of a ``copy_bytes`` copy.

    Defaults: 8192³ and 1 GiB on CUDA; 1024³ and 64 MiB on the CPU. Both operands are big enough to miss
    every cache, so one input set suffices.
    """
    on_cuda = device.type == "cuda"
    n = matmul_size or (8192 if on_cuda else 1024)
    nbytes = copy_bytes or (1 << 30 if on_cuda else 64 << 20)
    if budget is None:
        budget = TimingBudget(25, 200, 10, 200) if on_cuda else TimingBudget(5, 50, 3, 10)

    matmul_ms = _matmul_ms(n, dtype, device, budget)
    copy_ms = _copy_ms(nbytes, device, budget)
    return Ceilings(
        device=environment(device).gpu,
        is_cpu=not on_cuda,
        matmul_flops=2 * n**3 / (matmul_ms / 1e3),
        matmul_dtype=str(dtype).removeprefix("torch."),
        matmul_size=n,
        copy_bandwidth=2 * nbytes / (copy_ms / 1e3),
        copy_bytes=nbytes,
    )


def provenance(device: torch.device) -> dict[str, str]:
    """The columns every row starts with: the benchmark's environment (commit, device name, driver, library
    versions, UTC date, device kind)."""
    return dataclasses.asdict(environment(device))
