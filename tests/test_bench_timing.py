"""The bench's per-call timing (flashtile.bench.timing): a stalled probe call does not cut the timed calls;
the host time of a call is kept, and cells where it nears the call's time are marked host-bound."""

from __future__ import annotations

import time

import torch

from flashtile.bench.bench import HOST_BOUND, host_note
from flashtile.bench.timing import TimingBudget, time_calls


def test_one_stalled_probe_call_does_not_cut_the_timed_calls():
    calls = []

    def fn(i: int) -> None:
        calls.append(i)
        # The first call is untimed; the second is the probe's first: it stalls for 40 ms, the rest take 1.
        time.sleep(0.04 if len(calls) == 2 else 0.001)

    budget = TimingBudget(warmup_ms=0.0, rep_ms=20.0, min_reps=2, max_reps=50)
    timing = time_calls(fn, copies=1, device=torch.device("cpu"), budget=budget)
    # Sized from the probe's mean (about 14 ms a call) the run would time 2 calls; from its fastest, 20 or so.
    assert timing.reps >= 10
    assert timing.p50_ms < 10.0


def test_the_host_time_of_a_call_is_kept_and_marks_host_bound_cells():
    budget = TimingBudget(warmup_ms=0.0, rep_ms=5.0, min_reps=5, max_reps=10)
    timing = time_calls(lambda i: time.sleep(0.001), copies=1, device=torch.device("cpu"), budget=budget)
    # On the CPU the host time is the time.
    assert timing.host_ms == timing.p50_ms >= 1.0
    # A 105 µs host path under a 140 µs call leaves the GPU fed; 115 µs is within HOST_BOUND of it.
    assert host_note(0.105, 0.140) == "; host 105 µs a call"
    assert host_note(0.115, 0.140) == "; host 115 µs a call (host-bound)"
    assert HOST_BOUND == 0.8
