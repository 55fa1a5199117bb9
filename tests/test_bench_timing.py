"""The bench's per-call timing (flashtile.bench.timing): a stalled probe call does not cut the timed calls."""

from __future__ import annotations

import time

import torch

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
