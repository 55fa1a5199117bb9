"""Where a step of examples/train_llama.py spends host and GPU time: flashtile vs sdpa, alternating.

    python train_diag.py                # timing, synchronisations, profiles
    python train_diag.py --timing-only  # the alternating timing alone (run as train_time.py in callA/callB)
"""
import sys, time, warnings, statistics, torch, transformers
sys.path.insert(0, "examples")
from train_llama import documents, packed_rows
from flashtile.integrations.transformers import register
from torch.profiler import profile, ProfilerActivity

def build(attn):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).cuda()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)

def step(m, opt, ids, pos, marks=None):
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = m(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    if marks is not None:
        marks.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))

flash = register()
models = {a: build(a) for a in (flash, "sdpa")}
rows = packed_rows(documents(0), 8192)
batches = [tuple(t.cuda() for t in next(rows)) for _ in range(60)]
for a, (m, opt) in models.items():
    for b in batches[:6]: step(m, opt, *b)
torch.cuda.synchronize()
# Alternate blocks of 6 steps so machine noise falls on both.
marks = {a: [] for a in models}
for rep in range(6):
    for a, (m, opt) in models.items():
        for b in batches[6 + rep * 6: 12 + rep * 6]:
            step(m, opt, *b, marks=marks[a])
for a, ms in marks.items():
    tot = [sum(x) * 1e3 for x in ms]
    cols = list(zip(*ms))
    print(f"{a:16s} step median {statistics.median(tot):6.1f} ms  min {min(tot):6.1f}  "
          f"host fwd {statistics.median(cols[0])*1e3:5.1f} bwd {statistics.median(cols[1])*1e3:5.1f} "
          f"opt {statistics.median(cols[2])*1e3:5.1f} wait {statistics.median(cols[3])*1e3:5.1f}")
if "--timing-only" in sys.argv:
    raise SystemExit(0)
# Synchronisations inside one step, with the Python frames that caused them.
import traceback
for a, (m, opt) in models.items():
    seen = []
    def show(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        seen.append((str(message)[:80], [f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in frames[-6:]]))
    old_show = warnings.showwarning
    warnings.showwarning = show
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        step(m, opt, *batches[50])
        torch.cuda.set_sync_debug_mode(0)
    warnings.showwarning = old_show
    print(a, "synchronising calls in one step:", len(seen))
    for msg, frames in seen[:8]:
        print("   ", msg, "|", " <- ".join(reversed(frames)))
for a, (m, opt) in models.items():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[52:56]: step(m, opt, *b)
        torch.cuda.synchronize()
    print(a)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
