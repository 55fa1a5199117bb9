"""The bench's per-call timing (flashtile.bench.timing): a stalled probe call does not cut the timed calls;
the host time of a call is kept, and cells where it nears the call's time are marked host-bound."""

from __future__ import annotations

import time

import torch

from flashtile.bench.bench import HOST_BOUND, host_note
from flashtile.bench.timing import TimingBudget, time_calls, time_in_rounds


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


def test_rounds_time_the_implementations_in_a_rotating_turn_and_keep_the_median_round():
    budget = TimingBudget(warmup_ms=0.0, rep_ms=3.0, min_reps=9, max_reps=9, rounds=3)
    turns: list[int] = []
    sleeps = {0: [0.001, 0.006, 0.001], 1: [0.002, 0.002, 0.002], 3: [0.001, 0.001, 0.001]}
    rounds_seen = {0: -1, 1: -1, 3: -1}

    def timed(k: int):
        def fn(i: int) -> None:
            if not turns or turns[-1] != k:
                turns.append(k)
                rounds_seen[k] += 1
            time.sleep(sleeps[k][rounds_seen[k]])

        return fn

    def broken(i: int) -> None:
        turns.append(2)
        raise RuntimeError("no kernel")

    found = time_in_rounds([timed(0), timed(1), broken, timed(3)], 1, torch.device("cpu"), budget)
    # Round 1 starts at 0, round 2 at 1, round 3 at 2; the failing one leaves after its first try.
    assert turns == [0, 1, 2, 3, 1, 3, 0, 3, 0, 1]
    assert isinstance(found[2], RuntimeError)
    first, second = found[0], found[1]
    # One slow round (6 ms) does not move the median of three.
    assert len(first.p50s_ms) == 3 and max(first.p50s_ms) >= 5.0
    assert first.timing.p50_ms < 3.0 <= max(first.p50s_ms)
    assert second.timing.p50_ms >= 1.5 and second.timing.reps == 9
