"""Time tileattn fp8 (e4m3, V in the fast layout) against tileattn fp16 on a few dense shapes (B=4, H=32).

    python scripts/dev_fp8.py [--shapes D:N:causal,...] [--check] [--cfg D:BM:BN:STAGES:REGS ...]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="64:4096:0,64:4096:1,128:4096:0,128:4096:1,128:16384:0,128:16384:1")
    p.add_argument("--check", action="store_true")
    p.add_argument("--cfg", action="append", default=[], help="D:BM:BN:STAGES:REGS, the fp8 Gluon config of D")
    args = p.parse_args()
    import tileattn
    from tileattn.ops.dense import launch_sm90
    for c in args.cfg:
        d, bm, bn, st, regs = (int(x) for x in c.split(":"))
        launch_sm90._FP8_CONFIGS[d] = launch_sm90.Sm90Config(bm, bn, st, regs)
        print("config", d, launch_sm90._FP8_CONFIGS[d])
    from tileattn.bench.common import attn_tflops, do_bench
    for spec in args.shapes.split(","):
        D, N, causal = (int(x) for x in spec.split(":"))
        B, H = 4, 32
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16) for _ in range(3))
        (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(t) for t in (q, k, v))
        vf = tileattn.fp8_v_layout(v8)
        f8 = lambda: tileattn.attention(q8, k8, vf, causal=bool(causal), q_descale=qd, k_descale=kd, v_descale=vd)
        f16 = lambda: tileattn.attention(q, k, v, causal=bool(causal))
        err = (f8().float() - f16().float()).abs().max().item() if args.check else float("nan")
        t8, t16 = do_bench(f8), do_bench(f16)
        tf8, tf16 = (attn_tflops(B, H, N, N, D, D, bool(causal), t) for t in (t8, t16))
        print(f"D={D} N={N} causal={causal}: fp8 {tf8:.0f} fp16 {tf16:.0f} ratio {tf8 / tf16:.3f} "
              f"max|fp8-fp16| {err:.3f}", flush=True)


if __name__ == "__main__":
    main()
