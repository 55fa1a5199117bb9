"""Context parallelism on GPUs (flashtile.distributed, ring and Ulysses): accuracy and time against one GPU.

    python -m torch.distributed.run --nproc-per-node 2 scripts/context_parallel_check.py [--csv F]

Every rank builds the same global q, k, v and dO (bf16, B = 1, H = 16, D = 128) and runs the ring (or
Ulysses) on its shards. Accuracy: the output and gradients against the single-GPU call in fp32 (the
reference backend), within 2× (3× for gradients) the error of the single-GPU bf16 call, as the test suite's
rule (``--seqlens``; ``--time-seqlens`` are timed only, where the fp32 reference's scores would not fit).
Time (CUDA events on each rank, the slowest rank's per call, median of 10 calls after 3): the forward and
forward + backward on W GPUs; for the ring the same with the exchanges replaced by no-ops (compute alone)
and the exchanges alone (W − 1 K/V passes); the single-GPU call on the whole sequence. Rank 0 prints a
line per cell and appends it to ``--csv``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

from flashtile import distributed, flash_attn_func
from flashtile.distributed import ring_flash_attn_func, ulysses_flash_attn_func, zigzag_shard

SCHEMES = {"ring": ring_flash_attn_func, "ulysses": ulysses_flash_attn_func}


def _time_ms(fn, calls: int = 10, warmup: int = 3) -> float:
    """Median over calls of the slowest rank's time: a call ends when every rank has finished, and with a
    causal contiguous split rank 0 finishes long before the others."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    slowest = torch.tensor(times, device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def _shard(x: torch.Tensor, layout: str, rank: int, world: int) -> torch.Tensor:
    return zigzag_shard(x, 1) if layout == "zigzag" else x.chunk(world, 1)[rank]


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want.float()).abs().max().item()


def _check(q, k, v, dout, ring, causal: bool, layout: str, rank: int, world: int) -> dict:
    """The ring's (out, dq, dk, dv) on this rank against the single-GPU call in fp32 (the reference
    backend: the kernels take fp16/bf16 on a GPU), within 2× (3× for gradients) the bf16 call's error."""
    results = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        backend = {"FLASHTILE_BACKEND": "reference"} if dtype == torch.float32 else {}
        with mock.patch.dict(os.environ, backend):
            leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
            out = flash_attn_func(*leaves, causal=causal)
            results[name] = (out, *torch.autograd.grad(out, leaves, dout.to(dtype)))
    row = {}
    passed = True
    for index, name in enumerate(("out", "dq", "dk", "dv")):
        want = _shard(results["fp32"][index], layout, rank, world)
        baseline = _error(_shard(results["bf16"][index], layout, rank, world), want)
        error = _error(ring[index], want)
        row[f"{name}_error"], row[f"{name}_allowed"] = error, (2 if name == "out" else 3) * baseline + 1e-5
        passed &= error <= row[f"{name}_allowed"]
    row["passed"] = passed
    return row


def run_cell(
    scheme: str, seqlen: int, heads_kv: int, causal: bool, layout: str, rank: int, world: int, check: bool
) -> dict:
    generator = torch.Generator(device="cuda").manual_seed(seqlen + heads_kv)
    q, k, v, dout = (
        torch.randn(1, seqlen, h, 128, device="cuda", generator=generator)
        for h in (16, heads_kv, heads_kv, 16)
    )
    local = [_shard(t, layout, rank, world).to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    local_dout = _shard(dout, layout, rank, world).to(torch.bfloat16)
    attention = SCHEMES[scheme]
    row = dict(scheme=scheme, seqlen=seqlen, heads_kv=heads_kv, causal=causal, layout=layout, world=world)
    if check:
        out = attention(*local, causal=causal, layout=layout)
        ring = (out, *torch.autograd.grad(out, local, local_dout))
        row.update(_check(q, k, v, dout, ring, causal, layout, rank, world))
    else:
        row.update(
            {f"{name}_{what}": None for name in ("out", "dq", "dk", "dv") for what in ("error", "allowed")}
        )
        # Timed only (--time-seqlens): no accuracy figures.
        row["passed"] = None

    def ring_fwd() -> None:
        attention(*local, causal=causal, layout=layout)

    def ring_fwd_bwd() -> None:
        o = attention(*local, causal=causal, layout=layout)
        torch.autograd.grad(o, local, local_dout)

    whole = [t.to(torch.bfloat16).requires_grad_() for t in (q, k, v)]
    row["fwd_ms"], row["fwd_bwd_ms"] = _time_ms(ring_fwd), _time_ms(ring_fwd_bwd)
    # The ring's steps without their exchanges: its compute alone (Ulysses' all-to-alls cannot be left out).
    row["compute_fwd_ms"] = row["compute_fwd_bwd_ms"] = None
    if scheme == "ring":
        with mock.patch.object(distributed, "_exchange", lambda sends, *_: (sends, [])):
            row["compute_fwd_ms"], row["compute_fwd_bwd_ms"] = _time_ms(ring_fwd), _time_ms(ring_fwd_bwd)
    kv = [local[1].detach().contiguous(), local[2].detach().contiguous()]

    def exchanges() -> None:
        for _ in range(world - 1):
            _, requests = distributed._exchange(kv, None, rank, world)
            for request in requests:
                request.wait()

    row["exchange_ms"] = _time_ms(exchanges)
    row["one_gpu_fwd_ms"] = _time_ms(lambda: flash_attn_func(*whole, causal=causal))
    row["one_gpu_fwd_bwd_ms"] = _time_ms(
        lambda: torch.autograd.grad(flash_attn_func(*whole, causal=causal), whole, dout.to(torch.bfloat16))
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # The fp32 reference materialises the scores: 32k would need a 68 GB matrix.
    parser.add_argument("--seqlens", type=int, nargs="*", default=[8192], help="checked and timed")
    parser.add_argument(
        "--time-seqlens", type=int, nargs="*", default=[], help="timed only (no fp32 reference), e.g. 32768"
    )
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    rows = []
    cells = [
        (scheme, seqlen, heads_kv, causal, layout, seqlen in args.seqlens)
        for seqlen in [*args.seqlens, *args.time_seqlens]
        for heads_kv in (16, 4)
        for scheme, causal, layout in (
            ("ring", False, "contiguous"), ("ring", True, "contiguous"), ("ring", True, "zigzag"),
            ("ulysses", True, "zigzag"),
        )
    ]  # fmt: skip
    for cell in cells:
        scheme, seqlen, heads_kv, causal, layout, check = cell
        row = run_cell(scheme, seqlen, heads_kv, causal, layout, rank, world, check)
        if check:
            passed = torch.tensor([row["passed"]], device="cuda", dtype=torch.int32)
            dist.all_reduce(passed, op=dist.ReduceOp.MIN)
            row["passed"] = bool(passed.item())
        rows.append(row)
        if rank == 0:
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    if rank == 0 and args.csv:
        new = not args.csv.exists()
        with args.csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            if new:
                writer.writeheader()
            writer.writerows(rows)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
