"""The FlashAttention papers' benchmark grid, the options preset and the head-dims preset: presets, axes,
and the FLOP and byte counts of one call.

Conventions (the papers', described in benchmarks/README.md): total tokens B·N and hidden size H·D are fixed
(16384 and 2048), so B = 16384 / N and H = ⌊2048 / D⌋; forward FLOPs = 4·B·H·N_q·N_k·D, halved when causal;
backward = 2.5 × forward, forward+backward = 3.5 × forward. A cell with an option (window, softcap, ALiBi,
dropout, a learnable sink, a packed or padded batch of mixed lengths) counts 4·H·D per visible (query, key)
pair instead, of real tokens only (:func:`visible_pairs`). Bytes moved count each tensor read or written once:
q, k, v read and o written forward; the backward adds dO read and dq, dk, dv written (and reads o again for
rowsum(o·dO)).

With V's head dim D_v different from Q/K's D, each GEMM is counted with its own contraction or output width:
forward S = Q·Kᵀ (D) and O = P·V (D_v), 2·(D + D_v) per pair; backward S = Q·Kᵀ again (D), dP = dO·Vᵀ (D_v),
dV = Pᵀ·dO (D_v), dK = dSᵀ·Q (D) and dQ = dS·K (D), 2·(3·D + 2·D_v) per pair. With D_v = D these are 4·D and
10·D, the papers' 1 and 2.5.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from flashtile.bench.timing import TimingBudget

MODES = ("fwd", "bwd", "fwd_bwd")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

PAPER_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
PAPER_HEAD_DIMS = (64, 128, 256)
PAPER_TOKENS = 16384
PAPER_HIDDEN = 2048
# The options a cell can carry, as the peers declare them (``Peer.options``). "sink" is a learnable sink
# (``learnable_sink``); "varlen" is a packed batch (flash_attn_varlen_func); "padded" is the same sequences
# padded to the longest and run dense; "fp8" is q, k, v in float8 e4m3 (flash_attn_fp8_func, the forward).
OPTIONS = ("window", "softcap", "alibi", "dropout", "sink", "varlen", "padded", "fp8")
LAYOUTS = ("dense", "varlen", "padded")
# The head-dims preset's (D, D_v) pairs: the equal-dim yardsticks, DeepSeek's MLA prefill (192/128),
# Gemma-like 256 and 512, and MLA's 576/512.
HEAD_DIM_PAIRS = ((128, 128), (192, 128), (256, 256), (512, 512), (576, 512))
SINK_SEED = 0


def visible_pairs(
    seqlen_q: int, seqlen_k: int, causal: bool = False, window: tuple[int, int] = (-1, -1)
) -> int:
    """The (query, key) pairs flash_attn's mask keeps: query i sees key j iff
    ``i + N_k − N_q − left ≤ j ≤ i + N_k − N_q + right`` (a negative bound is unlimited, causal sets
    right = 0), counted row by row in one vectorised pass.

    >>> visible_pairs(4, 4, causal=True), visible_pairs(4, 4, window=(1, 0)), visible_pairs(2, 5, causal=True)
    (10, 7, 9)
    """
    left, right = window
    if causal:
        right = 0
    diagonal = torch.arange(seqlen_q, dtype=torch.int64) + (seqlen_k - seqlen_q)
    first = (diagonal - left).clamp(min=0) if left >= 0 else torch.zeros_like(diagonal)
    last = (
        (diagonal + right).clamp(max=seqlen_k - 1) if right >= 0 else torch.full_like(diagonal, seqlen_k - 1)
    )
    return int((last - first + 1).clamp(min=0).sum())


def alibi_slopes(heads: int) -> torch.Tensor:
    """ALiBi's slopes ``2^(−8(h+1)/H)`` for heads h = 0 … H−1, float32 ``(H,)`` on the CPU.

    >>> alibi_slopes(2).tolist()
    [0.0625, 0.00390625]
    """
    return torch.exp2(-8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads).float()


def sink_logits(heads: int) -> torch.Tensor:
    """The learnable sink of an option cell: one standard-normal logit per head from a generator seeded with
    :data:`SINK_SEED`, float32 ``(H,)`` on the CPU."""
    return torch.randn(heads, generator=torch.Generator().manual_seed(SINK_SEED))


def packed_lengths(tokens: int, shortest: int, longest: int, seed: int = 0) -> tuple[int, ...]:
    """Document lengths drawn log-uniformly in ``[shortest, longest]`` from a fixed seed until they sum to
    ``tokens``; the last one is cut to make the sum exact (so it may be shorter than ``shortest``).

    >>> lengths = packed_lengths(16384, 256, 8192)
    >>> sum(lengths), min(lengths[:-1]) >= 256, max(lengths) <= 8192
    (16384, True, True)
    """
    if not 1 <= shortest <= longest:
        raise ValueError(f"varlen lengths need 1 ≤ shortest ≤ longest, got {shortest} and {longest}")
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        drawn = round(math.exp(math.log(shortest) + u * (math.log(longest) - math.log(shortest))))
        lengths.append(min(drawn, tokens - sum(lengths)))
    return tuple(lengths)


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
    # V's head dim; 0 (the value an equal one is stored as) when it is head_dim.
    head_dim_v: int = 0
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout_p: float = 0.0
    sink: bool = False
    # "varlen": ``lengths`` packed into one (1, Σ n_i, H, D) batch, seqlen_q/k their upper bound; "padded":
    # ``lengths`` padded to seqlen_q = max(lengths), batch = len(lengths).
    layout: str = "dense"
    lengths: tuple[int, ...] = ()
    # q, k, v in float8 e4m3 (descales of 1), the output in ``dtype``: the float8 forward.
    fp8: bool = False

    def __post_init__(self) -> None:
        # One spelling of "V's head dim is Q/K's": a cell read back from a CSV equals the one measured.
        if self.head_dim_v == self.head_dim:
            object.__setattr__(self, "head_dim_v", 0)

    @property
    def dim_v(self) -> int:
        """V's (and the output's) head dim."""
        return self.head_dim_v or self.head_dim

    @property
    def head_dim_label(self) -> str:
        """ "128", or "192/128" when V's head dim differs."""
        return f"{self.head_dim}/{self.dim_v}" if self.head_dim_v else str(self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def input_dtype(self) -> torch.dtype:
        """q's, k's and v's dtype: float8 e4m3 in an fp8 cell, else the cell's dtype."""
        return torch.float8_e4m3fn if self.fp8 else self.torch_dtype

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

    @property
    def options(self) -> tuple[str, ...]:
        """The options this cell exercises, in ``OPTIONS`` order; empty for a plain dense cell."""
        present = {
            "window": self.window != (-1, -1),
            "softcap": self.softcap > 0,
            "alibi": self.alibi,
            "dropout": self.dropout_p > 0,
            "sink": self.sink,
            "varlen": self.layout == "varlen",
            "padded": self.layout == "padded",
            "fp8": self.fp8,
        }
        return tuple(name for name in OPTIONS if present[name])

    @property
    def tokens(self) -> int:
        """Query tokens in one call's q tensor (Σ n_i for a packed batch)."""
        return sum(self.lengths) if self.layout == "varlen" else self.batch * self.seqlen_q

    def q_shape(self) -> tuple[int, int, int, int]:
        """(B, N_q, H, D); a packed batch is one row of Σ n_i tokens."""
        return (
            (1, self.tokens, self.heads, self.head_dim)
            if self.layout == "varlen"
            else (self.batch, self.seqlen_q, self.heads, self.head_dim)
        )

    def kv_shape(self) -> tuple[int, int, int, int]:
        """k's shape; v's is :meth:`v_shape`."""
        if self.layout == "varlen":
            return (1, self.tokens, self.heads_kv, self.head_dim)
        return (self.batch, self.seqlen_k, self.heads_kv, self.head_dim)

    def v_shape(self) -> tuple[int, int, int, int]:
        return (*self.kv_shape()[:3], self.dim_v)

    def out_shape(self) -> tuple[int, int, int, int]:
        """out's and dout's shape: q's with V's head dim."""
        return (*self.q_shape()[:3], self.dim_v)

    def pairs(self) -> int:
        """Visible (query, key) pairs per head over the batch, of real tokens only."""
        if self.lengths:
            return sum(visible_pairs(n, n, self.causal, self.window) for n in self.lengths)
        return self.batch * visible_pairs(self.seqlen_q, self.seqlen_k, self.causal, self.window)

    def _scores(self) -> float:
        """(query, key) pairs over all heads: visible ones with an option, else B·H·N_q·N_k, halved when
        causal."""
        if self.options:
            return float(self.heads * self.pairs())
        scores = float(self.batch * self.heads * self.seqlen_q * self.seqlen_k)
        return scores / 2 if self.causal else scores

    def forward_flops(self) -> float:
        """2·(D + D_v) per pair: S = Q·Kᵀ and O = P·V."""
        return 2.0 * (self.head_dim + self.dim_v) * self._scores()

    def flops(self) -> float:
        """The mode's FLOPs; the backward's 2·(3·D + 2·D_v) per pair is 2.5 × the forward when D_v = D."""
        forward = self.forward_flops()
        backward = 2.0 * (3 * self.head_dim + 2 * self.dim_v) * self._scores()
        return {"fwd": forward, "bwd": backward, "fwd_bwd": forward + backward}[self.mode]

    def bytes_moved(self) -> float:
        """Fewest bytes one call must move through device memory (the B·H·N_q log-sum-exp left out)."""
        inputs = (self.q_shape(), self.kv_shape(), self.v_shape())
        forward = sum(math.prod(shape) for shape in inputs) * self.input_dtype.itemsize
        forward += math.prod(self.out_shape()) * self.torch_dtype.itemsize
        # Each of q, k, v and o (as dO) read again and its gradient written.
        backward = 2 * forward
        return {"fwd": forward, "bwd": backward, "fwd_bwd": forward + backward}[self.mode]

    def option_label(self) -> str:
        """The options in words ("" for a plain cell): the title of the cell's table and plot."""
        words = {
            "window": f"window {self.window}",
            "softcap": f"softcap {self.softcap:g}",
            "alibi": "ALiBi",
            "dropout": f"dropout {self.dropout_p:g}",
            "sink": "learnable sink",
            "varlen": f"varlen {len(self.lengths)} seqs/{sum(self.lengths)} tokens",
            "padded": f"padded {len(self.lengths)} seqs/{sum(self.lengths)} tokens",
            "fp8": "fp8 e4m3 inputs",
        }
        return " + ".join(words[name] for name in self.options)

    def without_options(self) -> Config:
        """The plain cell an option cell is measured against: same shape, options off.

        A packed or padded batch has no plain twin of its own; the summary pairs it by ``seqlen_q``.
        """
        return dataclasses.replace(
            self,
            window=(-1, -1),
            softcap=0.0,
            alibi=False,
            dropout_p=0.0,
            sink=False,
            layout="dense",
            lengths=(),
            fp8=False,
        )

    def label(self) -> str:
        options = f" {self.option_label()}" if self.options else ""
        return (
            f"{self.mode} {'causal' if self.causal else 'non-causal'}{options} D={self.head_dim_label} "
            f"N={self.seqlen_q} B={self.batch} H={self.heads}/{self.heads_kv} {self.dtype}"
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
class OptionCells:
    """One option of the options preset and the sequence lengths it is measured at."""

    option: str
    seqlens: tuple[int, ...]


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
    # The options preset: each option beside the plain cell it is measured against (``configs``).
    options: tuple[OptionCells, ...] = ()
    window: tuple[int, int] = (256, 0)
    softcap: float = 30.0
    dropout_p: float = 0.1
    varlen_shortest: int = 256
    # The head-dims preset: (D, D_v) pairs measured in place of ``head_dims`` (``configs``).
    head_dim_pairs: tuple[tuple[int, int], ...] = ()

    def with_overrides(self, **overrides: object) -> Preset:
        """This preset with every override that is not None applied."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def measures(self, peer: str, config: Config) -> bool:
        """Whether ``peer`` gets a row for ``config``: the options preset's plain cells are flashtile's
        yardstick, measured for flashtile alone."""
        return not self.options or bool(config.options) or peer == "flashtile"

    def configs(self) -> list[Config]:
        """Every cell, ordered dtype, head dim, causal, sequence length, mode (the order of the tables); in
        the options preset, each option's cells after the plain cell they are compared with; in the head-dims
        preset, dtype, sequence length, causal, (D, D_v), mode, so that a spent time budget costs the longest
        sequences rather than the widest heads."""
        if self.options:
            return self._option_configs()
        if self.head_dim_pairs:
            return [
                self._config(dtype, head_dim, causal, seqlen, mode, head_dim_v)
                for dtype in self.dtypes
                for seqlen in self.seqlens
                for causal in self.causal
                for head_dim, head_dim_v in self.head_dim_pairs
                for mode in self.modes
            ]
        cells = []
        for dtype in self.dtypes:
            for head_dim in self.head_dims:
                for causal in self.causal:
                    for seqlen in self.seqlens:
                        for mode in self.modes:
                            cells.append(self._config(dtype, head_dim, causal, seqlen, mode))
        return cells

    def _option_configs(self) -> list[Config]:
        cells: dict[Config, None] = {}
        for dtype in self.dtypes:
            for head_dim in self.head_dims:
                for spec in self.options:
                    for causal in self._option_masks(spec.option):
                        for seqlen in spec.seqlens:
                            for mode in self.modes:
                                for cell in self._option_cells(
                                    spec.option, dtype, head_dim, seqlen, mode, causal
                                ):
                                    cells.setdefault(cell)
        return list(cells)

    def _option_masks(self, option: str) -> tuple[bool, ...]:
        """Causal or not for an option's cells: the window (left, 0), the learnable sink and the packed
        batch are causal, as in local, GPT-OSS and packed training; softcap, ALiBi and dropout are
        non-causal unless ``causal`` (``--causal true`` or ``both``) asks otherwise (Gemma 2 caps causal
        scores)."""
        if option in ("window", "sink", "varlen"):
            return (True,)
        return self.causal or (False,)

    def _option_cells(
        self, option: str, dtype: str, head_dim: int, seqlen: int, mode: str, causal: bool
    ) -> list[Config]:
        """The plain cell (dense, causal or not as the option's cells) and the option's cells at one
        sequence length."""
        plain = self._config(dtype, head_dim, causal, seqlen, mode)
        if option == "window":
            return [plain, dataclasses.replace(plain, window=self.window)]
        if option == "softcap":
            return [plain, dataclasses.replace(plain, softcap=self.softcap)]
        if option == "alibi":
            return [plain, dataclasses.replace(plain, alibi=True)]
        if option == "dropout":
            return [plain, dataclasses.replace(plain, dropout_p=self.dropout_p)]
        if option == "sink":
            return [plain, dataclasses.replace(plain, sink=True)]
        if option == "fp8":
            # A forward only (its backward cells would have nothing to time), whose output is bf16.
            return [plain, dataclasses.replace(plain, fp8=True, dtype="bf16")] if mode == "fwd" else [plain]
        if option != "varlen":
            known = ", ".join(name for name in OPTIONS if name != "padded")
            raise ValueError(f"unknown option {option!r}; the options preset knows {known}")
        lengths = packed_lengths(self.tokens, min(self.varlen_shortest, seqlen), seqlen)
        packed = dataclasses.replace(plain, layout="varlen", batch=len(lengths), lengths=lengths)
        longest = max(lengths)
        padded = dataclasses.replace(packed, layout="padded", seqlen_q=longest, seqlen_k=longest)
        # Each document alone, a dense batch of one: the dense kernel on the same real tokens.
        alone = [dataclasses.replace(plain, batch=1, seqlen_q=n, seqlen_k=n) for n in dict.fromkeys(lengths)]
        return [plain, packed, padded, *alone]

    def _config(
        self, dtype: str, head_dim: int, causal: bool, seqlen: int, mode: str, head_dim_v: int = 0
    ) -> Config:
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
            head_dim_v=head_dim_v,
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

_OPTIONS_SKIPS = (
    Skip(
        "sdpa-math",
        4096,
        "skipped by --options' 5-minute budget: SDPA math materialises the B·H·N² scores",
    ),
)
_HEAD_DIM_SKIPS = (
    Skip(
        "sdpa-math",
        4096,
        "skipped by --head-dims' budget: SDPA math materialises the B·H·N² scores",
    ),
)
_OPTIONS_CUDA = (
    OptionCells("window", (8192,)),
    OptionCells("softcap", (4096, 16384)),
    OptionCells("alibi", (4096, 16384)),
    OptionCells("dropout", (4096, 16384)),
    OptionCells("sink", (4096, 16384)),
    OptionCells("varlen", (8192,)),
    OptionCells("fp8", (4096, 16384)),
)
_OPTIONS_CPU = (
    OptionCells("window", (64,)),
    OptionCells("softcap", (32,)),
    OptionCells("alibi", (32,)),
    OptionCells("dropout", (32,)),
    OptionCells("sink", (32,)),
    OptionCells("varlen", (64,)),
    OptionCells("fp8", (32,)),
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
        # At least 5 timed calls in each of the 3 rounds: a cell's median over 5 or 6 calls moved with one or
        # two stalled calls, which the median round now outvotes.
        timing=TimingBudget(warmup_ms=10, rep_ms=40, min_reps=15, max_reps=45),
        time_budget_s=480.0,
        skips=_PAPER_SKIPS,
    ),
    ("options", "cuda"): Preset(
        name="options",
        device="cuda",
        seqlens=(),
        head_dims=(128,),
        causal=(),
        modes=("fwd", "bwd"),
        dtypes=("bf16",),
        timing=TimingBudget(warmup_ms=10, rep_ms=30, min_reps=5, max_reps=40),
        time_budget_s=270.0,
        skips=_OPTIONS_SKIPS,
        options=_OPTIONS_CUDA,
    ),
    # H = ⌊2048 / D⌋: 16, 10, 8, 4 and 3 heads (H·D = 2048, 1920, 2048, 2048, 1728), B = 16384 / N.
    ("head-dims", "cuda"): Preset(
        name="head-dims",
        device="cuda",
        seqlens=(4096, 16384),
        head_dims=(),
        causal=(False, True),
        modes=("fwd", "bwd"),
        dtypes=("bf16",),
        timing=TimingBudget(warmup_ms=10, rep_ms=30, min_reps=5, max_reps=40),
        time_budget_s=420.0,
        skips=_HEAD_DIM_SKIPS,
        head_dim_pairs=HEAD_DIM_PAIRS,
    ),
    ("head-dims-quick", "cuda"): Preset(
        name="head-dims-quick",
        device="cuda",
        seqlens=(4096,),
        head_dims=(),
        causal=(False, True),
        modes=("fwd", "bwd"),
        dtypes=("bf16",),
        timing=TimingBudget(warmup_ms=5, rep_ms=15, min_reps=3, max_reps=20),
        time_budget_s=240.0,
        skips=_HEAD_DIM_SKIPS,
        head_dim_pairs=HEAD_DIM_PAIRS,
    ),
    ("options", "cpu"): Preset(
        name="options",
        device="cpu",
        seqlens=(),
        head_dims=(16,),
        causal=(),
        modes=("fwd", "bwd"),
        dtypes=("fp32",),
        timing=TimingBudget(warmup_ms=1, rep_ms=2, min_reps=2, max_reps=5),
        tokens=128,
        heads=2,
        options=_OPTIONS_CPU,
        window=(16, 0),
        varlen_shortest=8,
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
