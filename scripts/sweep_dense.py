"""Time candidate configs of the dense forward kernel on the GPU (chooses the sm90 table in configs.py).

Every config's output is checked against cuDNN's before it is timed; a config that fails the check or does
not compile is reported and skipped. Usage:
    python scripts/sweep_dense.py --out sweep.json [--heads 64,128] [--seqlens 1024,4096,16384] [--budget-s 300]
"""
import argparse
import json
import time

import torch

import tileattn
from tileattn.bench.common import attn_tflops, do_bench, max_abs
from tileattn.bench.dense import sdpa
from tileattn.ops.dense.configs import AttnConfig as C
from tileattn.ops.dense.launch import force_config

# (128,128,8,2,TMA) crashed ptxas and warp specialization with 4 warps failed to compile (triton 3.6, H100,
# 2026-11-20): left out.
CANDIDATES = [
    C(128, 64, 4, 3), C(128, 64, 8, 3), C(128, 128, 8, 3), C(64, 64, 4, 3),
    C(128, 128, 8, 3, True), C(128, 128, 4, 3, True), C(64, 64, 4, 3, True), C(128, 64, 8, 3, True),
    C(128, 128, 8, 3, True, True), C(128, 64, 8, 3, True, True),
    # q.k of the next block issued before this block's softmax
    C(128, 64, 4, 3, pipeline_qk=True), C(128, 64, 8, 3, pipeline_qk=True), C(128, 128, 8, 3, pipeline_qk=True),
    C(128, 128, 8, 3, True, pipeline_qk=True), C(128, 128, 4, 3, True, pipeline_qk=True),
    C(64, 64, 4, 3, True, pipeline_qk=True), C(128, 64, 8, 3, True, pipeline_qk=True),
]

# thread-block clusters (num_ctas=2) against the table's winners: --set ctas
CANDIDATES_CTAS = [
    C(128, 64, 8, 3), C(128, 64, 8, 3, num_ctas=2), C(128, 128, 8, 3, True), C(128, 128, 8, 3, True, num_ctas=2),
    C(128, 64, 4, 3), C(128, 64, 4, 3, num_ctas=2),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sweep.json")
    ap.add_argument("--heads", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--set", default="all", choices=["all", "ctas"])
    a = ap.parse_args()
    candidates = CANDIDATES_CTAS if a.set == "ctas" else CANDIDATES
    dt = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    t0 = time.time()
    res = []
    for D in [int(x) for x in a.heads.split(",")]:
        for causal in (False, True):
            for N in [int(x) for x in a.seqlens.split(",")]:
                B, H = 4, 32
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                ref = sdpa("cudnn")(q, k, v, causal)
                ms_cudnn = do_bench(lambda: sdpa("cudnn")(q, k, v, causal))
                best = None
                for cfg in candidates:
                    if time.time() - t0 > a.budget_s:
                        break
                    entry = {"D": D, "causal": causal, "N": N, "cfg": vars(cfg)}
                    try:
                        with force_config(cfg):
                            out = tileattn.attention(qt, kt, vt, causal=causal)
                            diff = max_abs(out.transpose(1, 2), ref)
                            if not torch.isfinite(out).all() or diff > 2e-2:
                                raise RuntimeError(f"wrong output: max diff vs cudnn {diff:.3e}")
                            ms = do_bench(lambda: tileattn.attention(qt, kt, vt, causal=causal))
                        entry.update(ms=ms, tflops=attn_tflops(B, H, N, N, D, D, causal, ms),
                                     vs_cudnn=ms_cudnn / ms, diff=diff)
                        if best is None or ms < best["ms"]:
                            best = entry
                    except Exception as e:
                        entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    res.append(entry)
                    print(json.dumps(entry), flush=True)
                if best:
                    print(f"BEST D={D} causal={int(causal)} N={N}: {best['cfg']} {best['tflops']:.0f} TFLOPS "
                          f"({best['vs_cudnn']:.2f}x cudnn {attn_tflops(B, H, N, N, D, D, causal, ms_cudnn):.0f})",
                          flush=True)
                del q, k, v, qt, kt, vt, ref
                torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    # per (D, causal): the config with the best geomean over N
    print("\nconfig ranking per (D, causal), geomean vs cudnn over N:")
    import math
    for D in sorted({r["D"] for r in res}):
        for causal in (False, True):
            scores = {}
            for r in res:
                if r["D"] == D and r["causal"] == causal and "ms" in r:
                    scores.setdefault(json.dumps(r["cfg"]), []).append(r["vs_cudnn"])
            nmax = max((len(v) for v in scores.values()), default=0)
            ranked = sorted(((math.exp(sum(map(math.log, v)) / len(v)), c) for c, v in scores.items()
                             if len(v) == nmax), reverse=True)
            for g, c in ranked[:4]:
                print(f"  D={D} causal={int(causal)} {g:.3f} {c}")


if __name__ == "__main__":
    main()
