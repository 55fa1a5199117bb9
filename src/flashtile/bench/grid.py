"""The FlashAttention papers' benchmark grid: presets, axes, and the FLOP and byte counts of one call.

Conventions (the papers', described in benchmarks/README.md): total tokens B·N and hidden size H·D are fixed
(16384 and 2048), so B = 16384 / N and H = 2048 / D; forward FLOPs = 4·B·H·N_q·N_k·D, halved when causal;
backward = 2.5 × forward, forward+backward = 3.5 × forward. Bytes moved count each tensor read or written
once: q, k, v read and o written forward; the backward adds dO read and dq, dk, dv written (and reads o again
for rowsum(o·dO)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from flashtile.bench.timing import TimingBudget

MODES = ("fwd", "bwd", "fwd_bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}

PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
PAPER_HEAD_DIMS = (64, 128, 256)
PAPER_TOKENS = 16384
PAPER_HIDDEN = 2048


@dataclass(frozen=True)
class Config:
    """One benchmark cell: a kernel configuration and a mode (fwd, bwd or fwd_bwd)."""

    device: str
    dtype: str
    mode: str
    causal: bool
    batch: int
    heads: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5

    @property
    def gqa_ratio(self) -> int:
        return self.heads // self.heads_kv

    def with_mode(self, mode: str) -> Config:
        return dataclasses.replace(self, mode=mode)

    def with_slice(self, batch: int, heads_kv: int) -> Config:
        """The same kernel configuration on fewer sequences and heads (the GQA ratio kept)."""
        return dataclasses.replace(self, batch=batch, heads=heads_kv * self.gqa_ratio, heads_kv=heads_kv)

    def forward_flops(self) -> float:
        flops = 4.0 * self.batch * self.heads * self.seqlen_q * self.seqlen_k * self.head_dim
        return flops / 2 if self.causal else flops

    def flops(self) -> float:
        return MODE_FLOP_FACTOR[self.mode] * self.forward_flops()

    def bytes_moved(self) -> float:
        """Fewest bytes one call must move through device memory (the B·H·N_q log-sum-exp left out)."""
        size = self.torch_dtype.itemsize
        q_like = self.batch * self.seqlen_q * self.heads * self.head_dim * size
        kv_like = self.batch * self.seqlen_k * self.heads_kv * self.head_dim * size
        forward = 2 * q_like + 2 * kv_like
        backward = 4 * q_like + 4 * kv_like
        return {"fwd": forward, "bwd": backward, "fwd_bwd": forward + backward}[self.mode]

    def label(self) -> str:
        return (
            f"{self.mode} {'causal' if self.causal else 'non-causal'} D={self.head_dim} N={self.seqlen_q} "
            f"B={self.batch} H={self.heads}/{self.heads_kv} {self.dtype}"
        )


@dataclass(frozen=True)
class Skip:
    """A peer left out of the cells at or beyond ``min_seqlen``, with the reason shown in the table."""

    peer: str
    min_seqlen: int
    reason: str

    def applies(self, peer: str, config: Config) -> str | None:
        if peer == self.peer and config.seqlen_q >= self.min_seqlen:
            return self.reason
        return None


@dataclass(frozen=True)
class Preset:
    """The axes of a run; ``batch``/``heads`` of None mean B = tokens / N and H = hidden / D."""

    name: str
    device: str
    seqlens: tuple[int, ...]
    head_dims: tuple[int, ...]
    causal: tuple[bool, ...]
    modes: tuple[str, ...]
    dtypes: tuple[str, ...]
    timing: TimingBudget
    tokens: int = PAPER_TOKENS
    hidden: int = PAPER_HIDDEN
    batch: int | None = None
    heads: int | None = None
    gqa_ratio: int = 1
    time_budget_s: float | None = None
    skips: tuple[Skip, ...] = ()
    flex_compile: str = "static"

    def with_overrides(self, **overrides: object) -> Preset:
        """This preset with every override that is not None applied."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def configs(self) -> list[Config]:
        """Every cell, ordered dtype, head dim, causal, sequence length, mode (the order of the tables)."""
        cells = []
        for dtype in self.dtypes:
            for head_dim in self.head_dims:
                for causal in self.causal:
                    for seqlen in self.seqlens:
                        for mode in self.modes:
                            cells.append(self._config(dtype, head_dim, causal, seqlen, mode))
        return cells

    def _config(self, dtype: str, head_dim: int, causal: bool, seqlen: int, mode: str) -> Config:
        batch = self.batch if self.batch is not None else max(1, self.tokens // seqlen)
        heads = self.heads if self.heads is not None else self.hidden // head_dim
        if heads < 1:
            raise ValueError(f"hidden size {self.hidden} is smaller than head dim {head_dim}: pass --heads")
        if heads % self.gqa_ratio:
            raise ValueError(
                f"--gqa-ratio {self.gqa_ratio} does not divide the {heads} query heads at D={head_dim}"
            )
        return Config(
            device=self.device,
            dtype=dtype,
            mode=mode,
            causal=causal,
            batch=batch,
            heads=heads,
            heads_kv=heads // self.gqa_ratio,
            seqlen_q=seqlen,
            seqlen_k=seqlen,
            head_dim=head_dim,
        )


# SDPA's math backend materialises B·H·N² scores and their gradient: ≈ 10× slower than the fused kernels and
# tens of GiB from N = 4k on, so the --paper run leaves it out there to stay inside 10 minutes.
_PAPER_SKIPS = (
    Skip(
        "sdpa-math",
        4096,
        "skipped by --paper's 10-minute budget: SDPA math materialises the B·H·N² scores",
    ),
)

PRESETS: dict[tuple[str, str], Preset] = {
    ("default", "cuda"): Preset(
        name="default",
        device="cuda",
        seqlens=PAPER_SEQLENS,
        head_dims=(128,),
        causal=(False, True),
        modes=("fwd", "bwd"),
        dtypes=("bf16",),
        timing=TimingBudget(warmup_ms=25, rep_ms=100, min_reps=10, max_reps=200),
    ),
    ("quick", "cuda"): Preset(
        name="quick",
        device="cuda",
        seqlens=(1024, 4096),
        head_dims=(128,),
        causal=(False, True),
        modes=("fwd", "bwd"),
        dtypes=("bf16",),
        timing=TimingBudget(warmup_ms=10, rep_ms=30, min_reps=5, max_reps=50),
    ),
    ("paper", "cuda"): Preset(
        name="paper",
        device="cuda",
        seqlens=PAPER_SEQLENS,
        # D = 128 first: if the time budget runs out, the cells lost are D = 256's, not the headline's.
        head_dims=(128, 64, 256),
        causal=(False, True),
        modes=MODES,
        dtypes=("bf16",),
        timing=TimingBudget(warmup_ms=10, rep_ms=40, min_reps=5, max_reps=40),
        time_budget_s=480.0,
        skips=_PAPER_SKIPS,
    ),
    ("default", "cpu"): Preset(
        name="default",
        device="cpu",
        seqlens=(128, 256),
        head_dims=(64,),
        causal=(False, True),
        modes=MODES,
        dtypes=("fp32",),
        timing=TimingBudget(warmup_ms=5, rep_ms=50, min_reps=3, max_reps=20),
        batch=2,
        heads=4,
    ),
    ("quick", "cpu"): Preset(
        name="quick",
        device="cpu",
        seqlens=(64, 128),
        head_dims=(32,),
        causal=(False, True),
        modes=("fwd", "bwd"),
        dtypes=("fp32",),
        timing=TimingBudget(warmup_ms=2, rep_ms=10, min_reps=3, max_reps=10),
        batch=1,
        heads=2,
    ),
}


def preset(name: str, device: str) -> Preset:
    """The preset ``name`` for a device kind ("cuda" or "cpu")."""
    if (name, device) not in PRESETS:
        kinds = sorted(d for n, d in PRESETS if n == name)
        raise ValueError(
            f"preset --{name} needs a device of kind {' or '.join(kinds)}; this run is on {device}"
        )
    return PRESETS[(name, device)]


def parse_seqlen(text: str) -> int:
    """A sequence length such as 512, 4k or 16K."""
    text = text.strip().lower()
    value = int(text[:-1]) * 1024 if text.endswith("k") else int(text)
    if value < 1:
        raise ValueError(f"sequence length must be positive, got {text!r}")
    return value


def seqlen_label(seqlen: int) -> str:
    """512, 1k, 16k: the labels of the papers' x axes."""
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)
