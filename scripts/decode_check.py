"""One GPU run: the decode kernel's accuracy on the timed shapes, a config and split sweep, paged against
contiguous, and SDPA's cuDNN and flash backends, all timed in CUDA graphs against the measured copy bandwidth.

    PYTHONPATH=src python scripts/decode_check.py [--quick]

Every timed call rotates over enough cache copies that one replay reads at least 3× the L2; times are
medians over graph replays divided by the calls per replay. Bandwidth counts K and V read once.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from flashtile.bench.decode import copy_bandwidth, graph_time_ms
from flashtile.kernels import configs
from flashtile.kernels.decode import decode_fwd, num_splits_heuristic, programs_per_sm

HEADS, HEAD_DIM, DTYPE = 32, 128, torch.bfloat16


class Problem:
    """Caches (copies rotated), q and cache_seqlens for one decode shape; paged caches when page_size."""

    def __init__(self, batch, seqlen, group, seqlen_q=1, page_size=None, head_dim=HEAD_DIM):
        self.batch, self.seqlen, self.group = batch, seqlen, group
        self.head_dim = head_dim
        self.seqlen_q, self.page_size = seqlen_q, page_size
        self.heads_kv = HEADS // group
        self.kv_bytes = 2 * batch * self.heads_kv * seqlen * head_dim * 2
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.copies = max(1, min(8, math.ceil(3 * l2 / self.kv_bytes)))
        self.q = torch.randn(batch, seqlen_q, HEADS, head_dim, device="cuda", dtype=DTYPE)
        self.seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
        self.caches = []
        for _ in range(self.copies):
            k = torch.randn(batch, seqlen, self.heads_kv, head_dim, device="cuda", dtype=DTYPE)
            v = torch.randn_like(k)
            table = None
            if page_size:
                pages = seqlen // page_size
                perm = torch.randperm(batch * pages, device="cuda")
                table = perm.view(batch, pages).to(torch.int32)
                kp = torch.empty(batch * pages, page_size, *k.shape[2:], device="cuda", dtype=DTYPE)
                vp = torch.empty_like(kp)
                kp[perm] = k.view(batch * pages, page_size, self.heads_kv, head_dim)
                vp[perm] = v.view(batch * pages, page_size, self.heads_kv, head_dim)
                self.caches.append((kp, vp, table, k, v))
                del k, v
            else:
                self.caches.append((k, v, None, k, v))

    def label(self):
        page = f" page {self.page_size}" if self.page_size else ""
        dim = f" D={self.head_dim}" if self.head_dim != HEAD_DIM else ""
        return f"B={self.batch} L={self.seqlen // 1024}k G={self.group} Nq={self.seqlen_q}{page}{dim}"

    def ours(self, i, config=None, splits=0):
        k, v, table = self.caches[i][:3]
        return decode_fwd(
            self.q, k, v, self.seqlens, softmax_scale=self.head_dim**-0.5, block_table=table,
            window_size=(-1, 0), num_splits=splits, config=config,
        )[0]  # fmt: skip

    def sdpa(self, i, backend):
        k, v = self.caches[i][3:]
        q = self.q.transpose(1, 2)
        kt, vt = k.transpose(1, 2), v.transpose(1, 2)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backend):
            # One query token sees every key; with several, bottom-right causal is an explicit mask.
            if self.seqlen_q == 1:
                return sdpa(q, kt, vt, enable_gqa=self.group > 1)
            mask = torch.ones(self.seqlen_q, self.seqlen, dtype=torch.bool, device="cuda").tril(
                self.seqlen - self.seqlen_q
            )
            return sdpa(q, kt, vt, attn_mask=mask, enable_gqa=self.group > 1)

    def check(self, out):
        """Max error of sequence 0 against fp32 attention, and the bf16 SDPA-math baseline's error."""
        k, v = self.caches[0][3:]
        q = self.q[:1].float().transpose(1, 2)
        kk = k[:1].float().transpose(1, 2).repeat_interleave(self.group, 1)
        vv = v[:1].float().transpose(1, 2).repeat_interleave(self.group, 1)
        s = q @ kk.transpose(-1, -2) * self.head_dim**-0.5
        causal = torch.ones(self.seqlen_q, self.seqlen, dtype=torch.bool, device="cuda").tril(
            self.seqlen - self.seqlen_q
        )
        s = s.masked_fill(~causal, -math.inf)
        ref = (torch.softmax(s, -1) @ vv).transpose(1, 2)
        low = (torch.softmax(s, -1).to(DTYPE).float() @ vv).transpose(1, 2).to(DTYPE)
        return (out[:1].float() - ref).abs().max().item(), (low.float() - ref).abs().max().item()

    def time(self, fn):
        return graph_time_ms([functools.partial(fn, i) for i in range(self.copies)])[1]

    def time_rounds(self, calls, rounds, reps):
        """p50 of each call of ``calls`` (name → fn(copy index)) in each of ``rounds`` rounds, the calls in
        turn within a round (a slow phase of the machine falls on all of them); each timing printed as a
        CSV row ``shape,variant,round,p20_us,p50_us,p80_us``."""
        p50s = {name: [] for name in calls}
        for r in range(rounds):
            for name, call in calls.items():
                p20, p50, p80 = graph_time_ms(
                    [functools.partial(call, i) for i in range(self.copies)], reps=reps
                )
                p50s[name].append(p50)
                print(
                    f"{self.label()},{name},{r},{p20 * 1e3:.2f},{p50 * 1e3:.2f},{p80 * 1e3:.2f}", flush=True
                )
        return p50s


def report(name, problem, ms, bw, extra=""):
    tbs = problem.kv_bytes / (ms * 1e-3) / 1e12
    share = tbs * 1e12 / bw
    print(f"  {name:<34} {ms * 1e3:9.1f} µs {tbs:6.2f} TB/s {share:6.1%} of copy {extra}", flush=True)
    return tbs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    sms = configs.multiprocessor_count(torch.device("cuda"))
    print(torch.cuda.get_device_name(), torch.__version__, sms, "SMs")
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    default = configs.decode_config(HEAD_DIM, torch.device("cuda"))
    # Batch 1 reads too little to hide a step's latency: deeper, wider and narrower tiles against the default.
    sweep = [default] + [
        configs.DecodeConfig(*c)
        for c in ((64, 128, 4, 2), (64, 64, 4, 4), (64, 64, 8, 3), (64, 32, 4, 4), (64, 32, 4, 6))
        if configs.DecodeConfig(*c) != default
    ]
    shapes = [(1, 4096, 4, 1), (1, 16384, 4, 1), (1, 65536, 4, 1), (1, 131072, 4, 1), (16, 16384, 8, 1)]
    shapes += [(16, 32768, 4, 4)]
    if args.quick:
        shapes = shapes[:2]
    started = time.monotonic()
    for batch, seqlen, group, seqlen_q in shapes:
        problem = Problem(batch, seqlen, group, seqlen_q)
        programs = batch * problem.heads_kv
        cuda = torch.device("cuda")
        auto = num_splits_heuristic(programs, seqlen, default.BLOCK_N, cuda, programs_per_sm(HEAD_DIM, cuda))
        mib = problem.kv_bytes / 2**20
        print(f"{problem.label()}: {mib:.0f} MiB K+V, {problem.copies} copies, auto splits {auto}")
        err, base = problem.check(problem.ours(0))
        verdict = "ok" if err <= 2 * base + 1e-5 else "FAIL"
        print(f"  accuracy: max|err| {err:.2e}, bf16 baseline {base:.2e} -> {verdict}")
        for cfg in sweep:
            ms = problem.time(functools.partial(problem.ours, config=cfg))
            name = f"flashtile {cfg.MAX_BLOCK_M}/{cfg.BLOCK_N}/{cfg.num_warps}w/{cfg.num_stages}s"
            report(name, problem, ms, bw)
        if batch == 1:
            for splits in (8, 16, 33, 66):
                ms = problem.time(functools.partial(problem.ours, splits=splits))
                report(f"flashtile splits {splits}", problem, ms, bw)
        for name, backend in (("cudnn", "CUDNN_ATTENTION"), ("flash", "FLASH_ATTENTION")):
            try:
                be = getattr(torch.nn.attention.SDPBackend, backend)
                out = problem.sdpa(0, be)
                ms = problem.time(functools.partial(problem.sdpa, backend=be))
                e, _ = problem.check(out.transpose(1, 2))
                report(f"sdpa {name}", problem, ms, bw, f"(err {e:.1e})")
            except Exception as exc:
                print(f"  sdpa {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
        del problem
        torch.cuda.empty_cache()
    for batch, seqlen, group, seqlen_q in [(1, 131072, 4, 1), (16, 32768, 4, 4)]:
        for page in (None, 16, 64, 256):
            problem = Problem(batch, seqlen, group, seqlen_q, page)
            err, base = problem.check(problem.ours(0))
            ms = problem.time(problem.ours)
            report(problem.label(), problem, ms, bw, f"(err {err:.1e}, baseline {base:.1e})")
            del problem
            torch.cuda.empty_cache()
    print(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
