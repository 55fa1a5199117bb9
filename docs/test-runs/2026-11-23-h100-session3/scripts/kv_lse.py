"""Where the kvcache lse error comes from, for the case that failed (q1, new1, cap1024, mqa, page16, rope)."""
import sys, torch
from dataclasses import replace
sys.path.insert(0, ".")
from tests.test_kvcache import Case, _inputs, _oracle, _run
from flashtile.reference.kvcache import with_kvcache

case = Case(seqlen_q=1, seqlen_new=1, capacity=1024, page_size=16, layout="mqa", rotary_fraction=1.0, device="cuda", dtype=torch.bfloat16)

def err(a, b):
    d = (a.double().cpu() - b.double().cpu()).abs()
    return float(torch.nan_to_num(d, nan=0.0).max())

for variant in ("gptj", "neox"):
    c = replace(case, interleaved=(variant == "gptj"))
    for splits in (0, 1):
        rows = []
        for s in range(20):
            torch.manual_seed(1000 + s)
            args = _inputs(c)
            before = {n: args[n].clone() for n in ("k_cache", "v_cache")}
            o_out, o_lse, _, _ = _oracle({n: t.cpu() if torch.is_tensor(t) else t for n, t in args.items()})
            base = {n: t.clone().cpu() if torch.is_tensor(t) else t for n, t in args.items()}
            base["k_cache"], base["v_cache"] = (before[n].cpu().clone() for n in ("k_cache", "v_cache"))
            b_out, b_lse = with_kvcache(**base)
            # The same rounded inputs, fp32 math: the error that input rounding alone gives.
            f32 = {n: (t.clone().float() if t.is_floating_point() else t.clone()) if torch.is_tensor(t) else t for n, t in args.items()}
            f32["k_cache"], f32["v_cache"] = (before[n].clone().float() for n in ("k_cache", "v_cache"))
            f32["k"], f32["v"] = args["k"].float(), args["v"].float()
            f32["q"] = args["q"].float()
            _, f_lse = with_kvcache(**{n: t for n, t in f32.items()})
            out, lse = _run(args, num_splits=splits)
            rows.append((err(lse, o_lse), err(b_lse, o_lse), err(f_lse, o_lse), err(lse, f_lse)))
        t = torch.tensor(rows)
        print(f"{variant} splits={splits}: ours/base mean {(t[:,0]/t[:,1]).mean():.2f} max {(t[:,0]/t[:,1]).max():.2f}; "
              f"ours {t[:,0].mean():.2e} base {t[:,1].mean():.2e} fp32-same-inputs {t[:,2].mean():.2e} ours-vs-fp32 {t[:,3].mean():.2e}")
