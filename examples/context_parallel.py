"""Attention over a sequence split across processes: flashtile's ring and Ulysses context parallelism.

Each process holds 1/W of the sequence (the zigzag layout, which balances causal work) and runs a
``ContextParallelAttention`` layer on it; the example checks the gathered output against one process running
``FlashAttention`` on the whole sequence and prints the largest difference. NCCL with one GPU a process, or
gloo on the CPU:

    torchrun --nproc-per-node 2 examples/context_parallel.py                  # GPUs if there are, else CPU
    torchrun --nproc-per-node 4 examples/context_parallel.py --scheme ulysses --seqlen 4096
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from flashtile import FlashAttention
from flashtile.distributed import ContextParallelAttention, zigzag_shard, zigzag_unshard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheme", choices=("ring", "ulysses"), default="ring")
    parser.add_argument("--seqlen", type=int, default=2048, help="the whole sequence, divisible by 2 × W")
    parser.add_argument("--embed-dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32

    torch.manual_seed(0)  # the same weights and input on every rank
    options = dict(causal=True, device=device, dtype=dtype)
    whole = FlashAttention(args.embed_dim, args.heads, **options)
    layer = ContextParallelAttention(
        args.embed_dim, args.heads, scheme=args.scheme, layout="zigzag", **options
    )
    layer.load_state_dict(whole.state_dict())
    x = torch.randn(1, args.seqlen, args.embed_dim, device=device, dtype=dtype)

    with torch.no_grad():
        out = zigzag_unshard(layer(zigzag_shard(x, dim=1)), dim=1)
        reference = whole(x)
    difference = (out.float() - reference.float()).abs().max().item()
    if dist.get_rank() == 0:
        world, tokens = dist.get_world_size(), args.seqlen
        print(f"{args.scheme} over {world} processes, {tokens} tokens: max |difference| {difference:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
