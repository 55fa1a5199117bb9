"""Where a training step of examples/train_llama.py spends its time, flashtile vs sdpa (8k packed rows)."""
import sys, time, torch, transformers
sys.path.insert(0, "examples")
from train_llama import documents, packed_rows
from flashtile.integrations.transformers import register
from torch.profiler import profile, ProfilerActivity

def build(attn):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=8192)
    m = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).cuda()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)

def step(m, opt, ids, pos):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = m(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

for attn in (register(), "sdpa"):
    m, opt = build(attn)
    rows = packed_rows(documents(0), 8192)
    batches = [tuple(t.cuda() for t in next(rows)) for _ in range(20)]
    print(attn, "docs per row:", [int((p == 0).sum()) for _, p in batches[:10]])
    for b in batches[:8]: step(m, opt, *b)
    torch.cuda.synchronize(); t = time.perf_counter()
    for b in batches[8:16]: step(m, opt, *b)
    torch.cuda.synchronize(); print(attn, "ms/step", (time.perf_counter() - t) / 8 * 1e3)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[16:20]: step(m, opt, *b)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=70))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=70))
