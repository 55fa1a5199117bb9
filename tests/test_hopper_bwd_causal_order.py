"""The order in which the Hopper backward's causal launch numbers its key blocks (bwd._key_block, run in
Python), and the head-group rule the launcher passes it (bwd.causal_head_group)."""

from __future__ import annotations

import heapq

import pytest
import torch

from flashtile.kernels import configs
from flashtile.kernels.hopper import bwd

CPU = torch.device("cpu")
SMS = configs.multiprocessor_count(CPU)


def numbered(num_n_blocks: int, head_group: int, batch_heads: int) -> list[tuple[int, int]]:
    programs = range(num_n_blocks * batch_heads)
    return [bwd._key_block.fn(pid, num_n_blocks, head_group, batch_heads) for pid in programs]


@pytest.mark.parametrize("num_n_blocks", [1, 3, 8, 64])
@pytest.mark.parametrize("head_group", [1, 2, 5, 30])
@pytest.mark.parametrize("batch_heads", [1, 7, 32])
def test_every_key_block_of_every_head_is_numbered_once_longest_first_in_its_group(
    num_n_blocks, head_group, batch_heads
):
    order = numbered(num_n_blocks, head_group, batch_heads)
    assert sorted(order) == [(n, bh) for n in range(num_n_blocks) for bh in range(batch_heads)]
    starts = list(range(0, batch_heads - head_group + 1, head_group)) or [0]
    for group_start, group_end in zip(starts, [*starts[1:], batch_heads], strict=True):
        # The last group also takes the heads left over.
        heads = range(group_start, group_end)
        mine = [n for n, bh in order if bh in heads]
        # Causal key block n is its head's (M − n)-th longest: a group's blocks come longest first, and
        # the group's programs are consecutive.
        assert mine == sorted(mine)
        first = order.index((0, group_start))
        assert order[first : first + len(mine)] == [(n, bh) for n, bh in order if bh in heads]


def test_a_group_of_one_numbers_head_by_head():
    assert numbered(4, 1, 3) == [(n, bh) for bh in range(3) for n in range(4)]


def finish_time(lengths: list[int], sms: int) -> int:
    """When the last program ends if each goes, in order, to the first free SM."""
    free = [0] * sms
    for length in lengths:
        heapq.heappush(free, heapq.heappop(free) + length)
    return max(free)


@pytest.mark.parametrize("seqlen", [512, 1024, 2048, 4096])
def test_the_rule_ends_within_2_percent_of_even_work_where_head_by_head_ends_5_percent_late(seqlen):
    # D = 256's paper-grid cells (64-key blocks, B·N = 16k tokens, 8 heads) on a 132-SM H100/H200.
    sms, blocks, batch_heads = 132, seqlen // 64, 16384 // seqlen * 8
    group = bwd.causal_head_group(blocks, batch_heads, sms)

    def lengths(head_group: int) -> list[int]:
        return [blocks - n for n, _ in numbered(blocks, head_group, batch_heads)]

    even = sum(lengths(1)) / sms
    assert finish_time(lengths(1), sms) > 1.05 * even
    assert finish_time(lengths(group), sms) < 1.02 * even


def test_the_rule_groups_fewer_heads_as_key_blocks_grow():
    assert bwd.causal_head_group(8, 256, 132) == 30
    assert bwd.causal_head_group(64, 32, 132) == 5
    assert bwd.causal_head_group(256, 8, 132) == 2
    # Never more heads than there are, never fewer than one.
    assert bwd.causal_head_group(8, 3, 132) == 3
    assert bwd.causal_head_group(4096, 8, 132) == 1


def fused_head_group(causal: bool, varlen=None, head_groups: bool = True) -> int:
    shape_q = (1, 1000, 8, 256) if varlen else (2, 1000, 8, 256)
    _, cfg = bwd.select_variant(256)
    strides = (1000 * 8 * 256, 8 * 256, 256)
    _, fused, _ = bwd._bwd_launches(
        CPU, shape_q, (1000, 4), 0.0625, causal, False, cfg, strides, strides, (-1, 0 if causal else -1),
        0.0, None, varlen, False, None, 0.0, head_groups,
    )  # fmt: skip
    values = dict(
        zip(bwd.attn_bwd_kernel.arg_names, fused.arguments((None,) * len(bwd.FUSED_POINTERS)), strict=True)
    )
    return values["head_group"]


def test_dense_causal_launches_pass_the_rule_and_every_other_launch_head_by_head():
    # 1000 keys: 16 blocks of 64; 2 batches × 4 KV heads.
    assert fused_head_group(True) == bwd.causal_head_group(16, 8, SMS)
    assert fused_head_group(False) == 1
    assert fused_head_group(True, varlen=(2, 1024, 1024)) == 1
    # FLASHTILE_HOPPER_BWD_HEAD_GROUP=0.
    assert fused_head_group(True, head_groups=False) == 1
