"""Time large-D kernel configs (ops/dense/large_d.py) on the large-d grid's shapes, each output checked first.

    python scripts/sweep_large_d.py [--dims 320,512,1024] [--causal 0,1] [--n 8192] [--heads 48] [--configs I,J]
                                    [--sm90]

Prints one line per (config, D, causal): TFLOPS, ratio to SDPA's EFFICIENT backend, check; then BEST lines.
--sm90 adds the unforced path first (CFG -1: the Gluon kernel, large_d_sm90.py, where it applies). The check is
the bench's (bench/large_d.check_case).
"""
import argparse
import contextlib
import time

import torch

from tileattn.bench import large_d as bench_large_d
from tileattn.bench.common import attn_tflops, do_bench
from tileattn.bench.dense import sdpa
from tileattn.ops.dense import large_d
from tileattn.ops.dense.launch import force_config

C = large_d.LargeDConfig
# the H100 table's entries (large_d._SM90) and their closest rivals (bench/NOTES.md "Large head dims")
CONFIGS = [
    C(128, 128, 64, 256, 8, 3, 64),
    C(128, 128, 64, 256, 8, 4, 64),
    C(128, 64, 64, 256, 8, 4, 128),
    C(128, 128, 64, 256, 8, 3, 128),
    C(128, 128, 64, 256, 8, 4),
    C(128, 128, 64, 256, 8, 3),
    C(128, 64, 64, 256, 8, 3),
    C(64, 128, 64, 512, 8, 2),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="320,512,1024")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=48)
    ap.add_argument("--configs", default=None, help="comma-separated indices into CONFIGS")
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--sm90", action="store_true", help="also time the unforced path (the Gluon kernel)")
    a = ap.parse_args()
    t_start = time.time()
    cfgs = CONFIGS if a.configs is None else [CONFIGS[int(i)] for i in a.configs.split(",") if i]
    if a.sm90:
        cfgs = [None] + cfgs
    best = {}
    for D in (int(x) for x in a.dims.split(",")):
        for causal in (bool(int(x)) for x in a.causal.split(",")):
            B, H, N = 1, a.heads, a.n
            q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16) for _ in range(3))
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
            eff_fn = lambda: sdpa("efficient")(qh, kh, vh, causal)
            eff_out = eff_fn()
            eff_tf = attn_tflops(B, H, N, N, D, D, causal, do_bench(eff_fn))
            print(f"EFF D={D} causal={causal} {eff_tf:.0f} TFLOPS", flush=True)
            for i, cfg in enumerate(cfgs, start=-1 if a.sm90 else 0):
                if time.time() - t_start > a.budget_s:
                    print("budget exhausted", flush=True)
                    break
                import tileattn
                try:
                    with force_config(cfg) if cfg is not None else contextlib.nullcontext():
                        out = tileattn.attention(q, k, v, causal=causal)
                        # the bench's check: float32 on heads 0-1, EFFICIENT on every head
                        ok, info = bench_large_d.check_case(out, eff_out, qh, kh, vh, causal)
                        err, diff = info["err_vs_fp32"], info["max_diff_vs_efficient"]
                        ms = do_bench(lambda: tileattn.attention(q, k, v, causal=causal)) if ok else None
                        if cfg is None:
                            smem = "unforced"
                        else:
                            kern = large_d.compiled(q, k, v, causal, cfg)
                            smem = f"{kern.metadata.shared} regs={kern.n_regs} spills={kern.n_spills}"
                except Exception as e:
                    print(f"CFG {i} {cfg} D={D} causal={causal} ERROR {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                tf = attn_tflops(B, H, N, N, D, D, causal, ms) if ms else 0.0
                print(f"CFG {i} {cfg} D={D} causal={causal} smem={smem} err={err:.2e} diff_eff={diff:.1e} ok={ok} "
                      f"{tf:.0f} TFLOPS x{tf / eff_tf:.2f} eff", flush=True)
                if ok and tf > best.get((D, causal), (0, None))[0]:
                    best[(D, causal)] = (tf, i, tf / eff_tf, cfg)
            del q, k, v, qh, kh, vh, eff_out
            torch.cuda.empty_cache()
    for (D, causal), (tf, i, r, cfg) in sorted(best.items()):
        print(f"BEST D={D} causal={causal}: cfg {i} {cfg} {tf:.0f} TFLOPS x{r:.2f} eff")


if __name__ == "__main__":
    main()
