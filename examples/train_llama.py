"""Train a small random-initialised Llama on packed sequences with flashtile, sdpa or eager attention.

The text is the Python standard library's own source (every installation ships it), read as bytes
(vocabulary 256, no tokenizer to download); each file is one document. Documents are packed back to back
into rows of ``--context`` tokens with ``position_ids`` restarting at every document, the padding-free
layout of ``DataCollatorWithFlattening``: no attention crosses a document boundary and no token is padding.
Prints tokens/s and peak memory, writes ``<out-dir>/<attn>_loss.csv`` and redraws ``<out-dir>/loss.png``
from every CSV there, so runs with different ``--attn`` overlay.

    python examples/train_llama.py --attn flashtile --context 8192 --steps 300
    python examples/train_llama.py --attn sdpa --context 8192 --steps 300
    python examples/train_llama.py --hidden 512 --backward-thread caller  # host-bound size, backward here
    python examples/train_llama.py --device cpu --context 256 --steps 5 --hidden 64 --layers 2  # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import csv
import io
import math
import pstats
import random
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers

from flashtile.integrations.transformers import register


def documents(seed: int) -> list[bytes]:
    """The standard library's .py files as byte strings, shuffled."""
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    random.Random(seed).shuffle(paths)
    return [text for p in paths if (text := p.read_bytes())]


def packed_rows(docs: list[bytes], context: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Rows of ``context`` byte tokens and their position ids, restarting at each document."""
    tokens: list[int] = []
    positions: list[int] = []
    for doc in docs:
        # A document longer than the context is cut into pieces, each its own sequence.
        for start in range(0, len(doc), context):
            piece = doc[start : start + context]
            tokens.extend(piece)
            positions.extend(range(len(piece)))
            while len(tokens) >= context:
                yield torch.tensor([tokens[:context]]), torch.tensor([positions[:context]])
                tokens, positions = tokens[context:], positions[context:]
                # The rest of a document cut by the row's end starts the next row as a sequence of its own.
                cut = next((i for i, p in enumerate(positions) if p == 0), len(positions))
                positions[:cut] = range(cut)


def learning_rate(step: int, steps: int, peak: float) -> float:
    warmup = max(1, steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def count_compilations() -> list[str]:
    """From now on, the name of every Triton kernel compiled (a compilation takes a step seconds longer)."""
    from triton import knobs

    names: list[str] = []
    previous = knobs.runtime.jit_cache_hook

    def hook(*, fn, **kwargs):  # Triton calls it before compiling a kernel it has not cached
        names.append(fn.name)
        return previous(fn=fn, **kwargs) if previous else None

    knobs.runtime.jit_cache_hook = hook
    return names


def plot(out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    for path in sorted(out_dir.glob("*_loss.csv")):
        with path.open() as f:
            rows = list(csv.DictReader(f))
        axes.plot([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], label=path.stem[:-5])
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (nats/byte)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out_dir / "loss.png", dpi=120)
    return out_dir / "loss.png"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn", choices=["flashtile", "sdpa", "eager"], default="flashtile")
    parser.add_argument("--context", type=int, default=8192, help="tokens per packed row (2k-16k)")
    parser.add_argument("--steps", type=int, default=300)
    # 8 heads of 128 (Llama's head dim) by default.
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--backward-thread",
        choices=["caller", "engine"],
        default="engine",
        help="where autograd runs the backward, for every --attn alike: this thread "
        "(torch.autograd.set_multithreading_enabled(False)) or PyTorch's per-device thread (its default), "
        "where one layer's flashtile forward + backward took 830 µs of host time against 490-530 µs on "
        "this thread on an H100 host (scripts/engine_thread_check.py)",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("train-results"))
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="profile this many steps after the untimed ones; writes <out-dir>/<attn>_profile.txt",
    )
    parser.add_argument(
        "--python-profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="cProfile this many steps after the untimed ones (where the host's Python time goes); writes "
        "<out-dir>/<attn>_python_profile.txt",
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    attn = register() if args.attn == "flashtile" else args.attn
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.context,
    )
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    # bf16 autocast on the GPU (flashtile's kernels take fp16/bf16); float32 on the CPU.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    # PyTorch's default is the engine's device thread; one GPU needs no second thread for its backward.
    backward_thread = (
        contextlib.nullcontext
        if args.backward_thread == "engine"
        else lambda: torch.autograd.set_multithreading_enabled(False)
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log_path = args.out_dir / f"{args.attn}_loss.csv"
    rows = packed_rows(documents(args.seed), args.context)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timed_tokens, timed_seconds = 0, 0.0
    first_timed = min(5, args.steps - 1)
    compiled: list[str] = []
    profiler = None
    if args.profile > 0:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # Records only the steps from first_timed on (the first ones compile kernels).
        schedule = torch.profiler.schedule(wait=first_timed, warmup=0, active=args.profile, repeat=1)
        profiler = torch.profiler.profile(activities=activities, schedule=schedule)
        profiler.start()
    python_profiler = cProfile.Profile() if args.python_profile > 0 else None
    with log_path.open("w", newline="") as log:
        writer = csv.writer(log)
        writer.writerow(["step", "loss"])
        for step in range(args.steps):
            ids, position_ids = (t.to(device) for t in next(rows))
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, args.steps, args.lr)
            if step == first_timed:
                compiled = count_compilations()
                if python_profiler is not None:
                    python_profiler.enable()
            if python_profiler is not None and step == first_timed + args.python_profile:
                python_profiler.disable()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with autocast:
                loss = model(input_ids=ids, position_ids=position_ids, labels=ids, use_cache=False).loss
            with backward_thread():
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            # The first steps compile kernels and warm the allocator: not timed.
            if step >= first_timed:
                timed_tokens += ids.numel()
                timed_seconds += time.perf_counter() - start
            if profiler is not None:
                profiler.step()
            writer.writerow([step, f"{loss.item():.5f}"])
            if step % 25 == 0 or step == args.steps - 1:
                print(f"step {step:4d}  loss {loss.item():.4f}")

    if profiler is not None:
        profiler.stop()
        averages = profiler.key_averages()
        sorts = ["self_cpu_time_total"] + (["self_cuda_time_total"] if device.type == "cuda" else [])
        tables = [averages.table(sort_by=sort, row_limit=40, max_name_column_width=70) for sort in sorts]
        (args.out_dir / f"{args.attn}_profile.txt").write_text("\n\n".join(tables))
        print(tables[-1])
    if python_profiler is not None:
        python_profiler.disable()
        report = io.StringIO()
        stats = pstats.Stats(python_profiler, stream=report)
        for sort in ("tottime", "cumulative"):
            stats.sort_stats(sort).print_stats(45)
        (args.out_dir / f"{args.attn}_python_profile.txt").write_text(report.getvalue())
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    print(
        f"attn={args.attn} context={args.context} tokens/s={timed_tokens / timed_seconds:,.0f} "
        f"peak memory={peak:.2f} GiB"
    )
    if compiled:
        print(
            f"{len(compiled)} Triton kernels compiled in the timed steps: {', '.join(sorted(set(compiled)))}"
        )
    print(f"loss curve: {log_path}, plot: {plot(args.out_dir)}")


if __name__ == "__main__":
    main()
