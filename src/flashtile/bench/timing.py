"""How one call is timed: warm-up, per-call CUDA events (or the host clock on the CPU), median with p20/p80.

The caller passes ``fn(i)``, which runs the measured operation on input copy ``i``; calls rotate over the
copies so that inputs read in one call are not still in L2 for the next (``rotation_copies`` picks how many).
``time_in_rounds`` times the implementations of one cell in turn, several rounds, so that a drift of the
GPU's state (clocks, heat) within the cell falls on all of them alike.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# An L2 size for the CPU's last-level cache and for GPUs whose properties do not report one.
_FALLBACK_CACHE_BYTES = 64 * 2**20
_MAX_COPIES = 64
# The share of free device memory the rotated copies may take, leaving room for outputs and autograd state.
_COPY_MEMORY_SHARE = 0.25


@dataclass(frozen=True)
class TimingBudget:
    """How long to warm up and measure one (implementation, configuration) pair, in milliseconds."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    min_reps: int = 10
    max_reps: int = 200
    # ``time_in_rounds``: the implementations of a cell in turn, this many rounds. Timed one after another
    # once, the first-timed kernel of a cell read up to 11 % faster than the same kernel timed second.
    rounds: int = 3


@dataclass(frozen=True)
class Timing:
    """Per-call times in milliseconds over ``reps`` timed calls."""

    p20_ms: float
    p50_ms: float
    p80_ms: float
    reps: int
    # The median host time of a timed call (the Python side of ``fn``, on the CPU's clock); on a GPU a
    # call whose host time nears its per-call time is bound by the host, not the kernels.
    host_ms: float | None = None


def cache_bytes(device: torch.device) -> int:
    """The L2 size of a CUDA device, or an assumed last-level cache size on the CPU."""
    if device.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
        return int(size) or _FALLBACK_CACHE_BYTES
    return _FALLBACK_CACHE_BYTES


def rotation_copies(bytes_per_call: int, bytes_per_copy: int, device: torch.device) -> int:
    """How many input copies to rotate over so that one rotation touches at least three caches' worth.

    ``bytes_per_call`` is what one call reads and writes; ``bytes_per_copy`` is what one copy keeps allocated
    (inputs, outputs and autograd state), which caps the count by free device memory. Never fewer than two
    copies where two fit: with one, the tail of the previous call is still in cache.
    """
    wanted = max(2, math.ceil(3 * cache_bytes(device) / max(bytes_per_call, 1)))
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        fit = int(_COPY_MEMORY_SHARE * free // max(bytes_per_copy, 1))
    else:
        fit = 8
    return max(1, min(wanted, fit, _MAX_COPIES))


def _quantiles(times_ms: list[float]) -> tuple[float, float, float]:
    q = torch.tensor(times_ms, dtype=torch.float64).quantile(
        torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64)
    )
    return float(q[0]), float(q[1]), float(q[2])


def _rep_counts(estimate_ms: float, budget: TimingBudget) -> tuple[int, int]:
    estimate_ms = max(estimate_ms, 1e-4)
    warmup = max(1, math.ceil(budget.warmup_ms / estimate_ms))
    reps = min(budget.max_reps, max(budget.min_reps, math.ceil(budget.rep_ms / estimate_ms)))
    return min(warmup, 10 * budget.max_reps), reps


def _time_cuda(fn: Callable[[int], object], copies: int, budget: TimingBudget) -> Timing:
    fn(0)
    torch.cuda.synchronize()
    probe = min(3, budget.max_reps)
    events = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(2)) for _ in range(probe)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(i % copies)
        end.record()
    torch.cuda.synchronize()
    # The fastest probe call sizes the counts: one stalled call must not cut the timed calls to a few.
    warmup, reps = _rep_counts(min(start.elapsed_time(end) for start, end in events), budget)
    for i in range(warmup):
        fn(i % copies)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    host_ms = []
    for i in range(reps):
        starts[i].record()
        begin = time.perf_counter()
        fn(i % copies)
        host_ms.append(1e3 * (time.perf_counter() - begin))
        ends[i].record()
    torch.cuda.synchronize()
    gpu_ms = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing(*_quantiles(gpu_ms), reps=reps, host_ms=statistics.median(host_ms))


def _time_cpu(fn: Callable[[int], object], copies: int, budget: TimingBudget) -> Timing:
    fn(0)
    probe = min(3, budget.max_reps)
    probe_ms = []
    for i in range(probe):
        begin = time.perf_counter()
        fn(i % copies)
        probe_ms.append(1e3 * (time.perf_counter() - begin))
    warmup, reps = _rep_counts(min(probe_ms), budget)
    for i in range(warmup):
        fn(i % copies)
    times = []
    for i in range(reps):
        begin = time.perf_counter()
        fn(i % copies)
        times.append(1e3 * (time.perf_counter() - begin))
    quantiles = _quantiles(times)
    return Timing(*quantiles, reps=reps, host_ms=quantiles[1])


def time_calls(
    fn: Callable[[int], object], copies: int, device: torch.device, budget: TimingBudget
) -> Timing:
    """Time ``fn(i % copies)``: one untimed first call (compilation, autotuning), a short probe whose fastest
    call sizes the warm-up and the repeat count from ``budget``, then one timing per call; p20/p50/p80 over
    the calls."""
    if device.type == "cuda":
        return _time_cuda(fn, copies, budget)
    return _time_cpu(fn, copies, budget)


@dataclass(frozen=True)
class RoundsTiming:
    """One implementation's timing over the rounds of ``time_in_rounds``: ``timing`` has the median of the
    rounds' quantiles and host times and the sum of their calls; ``p50s_ms`` each round's median."""

    timing: Timing
    p50s_ms: tuple[float, ...]


def _round_budget(budget: TimingBudget, rounds: int, first_round: bool) -> TimingBudget:
    """A round's share of ``budget``: the whole warm-up in the first round (caches, clocks), a share of it
    after another implementation ran; a share of the timed calls in each."""
    return TimingBudget(
        warmup_ms=budget.warmup_ms if first_round else budget.warmup_ms / rounds,
        rep_ms=budget.rep_ms / rounds,
        min_reps=max(1, math.ceil(budget.min_reps / rounds)),
        max_reps=max(1, math.ceil(budget.max_reps / rounds)),
        rounds=1,
    )


def time_in_rounds(
    fns: list[Callable[[int], object]],
    copies: int,
    device: torch.device,
    budget: TimingBudget,
) -> list[RoundsTiming | Exception]:
    """Time each of ``fns`` (one cell's implementations, in the given turn: the first round's order) with
    ``time_calls`` in ``budget.rounds`` rounds, the turn starting one implementation further along each
    round, each round with its share of ``budget``; per implementation the median of its rounds. An
    implementation that raises gets the exception in its place and leaves the later rounds."""
    rounds = budget.rounds
    per_fn: list[list[Timing]] = [[] for _ in fns]
    failed: dict[int, Exception] = {}
    for r in range(rounds):
        start = r % max(len(fns), 1)
        for k in [*range(start, len(fns)), *range(start)]:
            if k in failed:
                continue
            try:
                per_fn[k].append(time_calls(fns[k], copies, device, _round_budget(budget, rounds, r == 0)))
            except Exception as exc:  # the caller reports it; the other implementations go on
                failed[k] = exc
    found: list[RoundsTiming | Exception] = []
    for k, timings in enumerate(per_fn):
        if k in failed:
            found.append(failed[k])
            continue
        median = [statistics.median(getattr(t, q) for t in timings) for q in ("p20_ms", "p50_ms", "p80_ms")]
        hosts = [t.host_ms for t in timings if t.host_ms is not None]
        timing = Timing(
            *median, reps=sum(t.reps for t in timings), host_ms=statistics.median(hosts) if hosts else None
        )
        found.append(RoundsTiming(timing, tuple(t.p50_ms for t in timings)))
    return found
