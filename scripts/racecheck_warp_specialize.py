"""Does compute-sanitizer racecheck report hazards in a Gluon ``warp_specialize`` kernel that has no shared
memory of its own? If it does, the reports on the Hopper kernels at their entry (docs/design/hopper.md,
"compute-sanitizer racecheck") come from Gluon's partition hand-off, not from our TMA rings.

Four kernels, each launched once on a Hopper GPU:
  empty      a default partition that stores one value per thread to global memory and a 1-warp worker
             that does nothing: no shared memory is allocated by this code;
  smem       the same, the default partition also writing and reading back a shared tile (a CTA barrier
             orders them: no hazard of ours);
  mbarrier   a worker that writes a shared tile and arrives on an mbarrier, a default partition that waits
             on it and reads the tile (ordered by the mbarrier only, as the kernels' rings are);
  shaped     the fused kernels' partition shape (a 4-warp default, 4-warp and 1-warp workers, 240/24
             registers, maxnreg 168): the 1-warp worker fills a shared tile four times through a one-slot
             ring (full/empty mbarriers), the default sums it (output 4.0).

    compute-sanitizer --tool racecheck python scripts/racecheck_warp_specialize.py [empty|smem|mbarrier]
"""

from __future__ import annotations

import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

ROWS = 128


@gluon.jit
def _store_rows(out_ptr, value):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout=layout)
    gl.store(out_ptr + offs, gl.full([128], value, gl.float32, layout))


@gluon.jit
def _idle_worker(out_ptr):
    pass


@gluon.jit
def empty_kernel(out_ptr):
    gl.warp_specialize([(_store_rows, (out_ptr, 1.0)), (_idle_worker, (out_ptr,))], [1], [24])


@gluon.jit
def _store_through_smem(out_ptr):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    smem = gl.allocate_shared_memory(gl.float32, [128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    offs = gl.arange(0, 128, layout=layout)
    smem.store(gl.full([128], 2.0, gl.float32, layout))
    gl.thread_barrier()
    gl.store(out_ptr + offs, smem.load(layout))


@gluon.jit
def smem_kernel(out_ptr):
    gl.warp_specialize([(_store_through_smem, (out_ptr,)), (_idle_worker, (out_ptr,))], [1], [24])


@gluon.jit
def _read_after_barrier(out_ptr, tile, bar):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    mbarrier.wait(bar, 0)
    gl.store(out_ptr + gl.arange(0, 128, layout=layout), tile.load(layout))


@gluon.jit
def _write_then_arrive(out_ptr, tile, bar):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
    tile.store(gl.full([128], 3.0, gl.float32, layout))
    mbarrier.arrive(bar)


@gluon.jit
def mbarrier_kernel(out_ptr):
    tile = gl.allocate_shared_memory(gl.float32, [128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    gl.warp_specialize(
        [(_read_after_barrier, (out_ptr, tile, bar)), (_write_then_arrive, (out_ptr, tile, bar))], [1], [24]
    )


@gluon.jit
def _loop_then_store(out_ptr, tile, full, empty, steps):
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    acc = gl.zeros([128], gl.float32, layout)
    for i in range(steps):
        mbarrier.wait(full, i & 1)
        acc += tile.load(layout)
        mbarrier.arrive(empty)
    gl.store(out_ptr + gl.arange(0, 128, layout=layout), acc / steps)


@gluon.jit
def _idle_warpgroup(out_ptr, tile, full, empty, steps):
    pass


@gluon.jit
def _write_every_step(out_ptr, tile, full, empty, steps):
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
    for i in range(steps):
        mbarrier.wait(empty, (i & 1) ^ 1)
        tile.store(gl.full([128], 4.0, gl.float32, layout))
        mbarrier.arrive(full)


@gluon.jit
def shaped_kernel(out_ptr, steps):
    tile = gl.allocate_shared_memory(gl.float32, [128], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(full, count=1)
    mbarrier.init(empty, count=1)
    gl.warp_specialize(
        [
            (_loop_then_store, (out_ptr, tile, full, empty, steps)),
            (_idle_warpgroup, (out_ptr, tile, full, empty, steps)),
            (_write_every_step, (out_ptr, tile, full, empty, steps)),
        ],
        [4, 1],
        [240, 24],
    )


KERNELS = {
    "empty": (empty_kernel, 1.0),
    "smem": (smem_kernel, 2.0),
    "mbarrier": (mbarrier_kernel, 3.0),
    "shaped": (shaped_kernel, 4.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernels", nargs="*", choices=list(KERNELS), help="default: all three")
    args = parser.parse_args()
    for name in args.kernels or list(KERNELS):
        kernel, expected = KERNELS[name]
        out = torch.zeros(ROWS, device="cuda")
        if name == "shaped":
            kernel[(1,)](out, 4, num_warps=4, maxnreg=168)
        else:
            kernel[(1,)](out, num_warps=4)
        torch.cuda.synchronize()
        ok = bool((out == expected).all())
        print(f"[{name}] ran, output {'as expected' if ok else 'WRONG'}", flush=True)


if __name__ == "__main__":
    main()
