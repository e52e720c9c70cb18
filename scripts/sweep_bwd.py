"""Time variants of the backward kernels (ops/dense/bwd.py FORCE tiles) on the GPU, gradients
checked first.

    python scripts/sweep_bwd.py [--quick] [--flex | --flex-only]
Prints backward TFLOPS (2.5x forward FLOPs) per (D, causal, N) and variant; N=1K runs again at the end (a
drift check). --flex: flex backward tile configs (ops/flex/bwd.py FORCE) on three of the flex grid's mods at
N=8192, in ms next to torch's compiled flex backward.
"""
import sys

import torch

import tileattn
from tileattn.bench.bwd import _check
from tileattn.bench.common import attn_tflops, do_bench
from tileattn.ops.dense import bwd

# (name, tiles: (BLOCK_M, BLOCK_N, warps, stages) of dK/dV, the same of dQ; None: bwd._tiles's)
CANDIDATES = [
    ("table", None),
    ("kv128-8w", ((64, 128, 8, 2), (128, 64, 8, 2))),
    ("kv128-8w-s3", ((64, 128, 8, 3), (128, 64, 8, 3))),
    ("kv128/q64", ((64, 128, 8, 2), (64, 64, 4, 2))),
    ("kv64/q128", ((64, 64, 4, 2), (128, 64, 8, 2))),
    ("32x128-4w", ((32, 128, 4, 2), (128, 32, 4, 2))),
]
FLEX_CANDIDATES = [None, ((64, 128, 8, 2), (128, 64, 8, 2)), ((64, 128, 8, 3), (128, 64, 8, 3)),
                   ((64, 128, 8, 3), (64, 64, 4, 2)), ((128, 128, 8, 2), (128, 64, 8, 2)),
                   ((64, 64, 4, 2), (128, 64, 8, 3))]


def measure(D, causal, N, B=4, H=32):
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    line = []
    for name, tiles in CANDIDATES:
        bwd.FORCE = tiles
        try:
            out = tileattn.attention(q, k, v, causal=causal)
            g = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            ok, _ = _check(g, q, k, v, dout, causal)
            if not ok:
                line.append(f"{name}: WRONG")
                continue
            ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            line.append(f"{name}: {2.5 * attn_tflops(B, H, N, N, D, D, causal, ms):.0f}")
        except Exception as e:  # noqa: BLE001
            line.append(f"{name}: {type(e).__name__} {str(e)[:60]}")
    bwd.FORCE = None
    print(f"D={D} causal={causal} N={N}: " + " | ".join(line), flush=True)
    del q, k, v, dout
    torch.cuda.empty_cache()


def flex_sweep(N=8192):
    from torch.nn.attention.flex_attention import create_block_mask
    from tileattn.bench import flex as fx
    from tileattn.ops.flex import bwd as fbwd
    B, H, D = fx.B, fx.H, fx.D
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    flex_c = fx._torch_flex()
    for name, (score_mod, mask_mod) in fx.make_mods(N, q.device).items():
        if name not in ("causal", "document", "softcap_causal"):
            continue
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda")
        o = flex_c(q, k, v, score_mod=score_mod, block_mask=bm)
        line = [f"torch {do_bench(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)):.3f}"]
        for cfg in FLEX_CANDIDATES:
            fbwd.FORCE = cfg
            try:
                out = tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
                ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                line.append(f"{cfg}: {ms:.3f}")
            except Exception as e:  # noqa: BLE001
                line.append(f"{cfg}: {type(e).__name__} {str(e)[:60]}")
        fbwd.FORCE = None
        print(f"FLEX {name} N={N} ms: " + " | ".join(line), flush=True)


def main():
    if "--flex" in sys.argv or "--flex-only" in sys.argv:
        flex_sweep()
    if "--flex-only" in sys.argv:
        return
    seqlens = (1024, 4096) if "--quick" in sys.argv else (1024, 2048, 4096, 16384)
    for D in (64, 128):
        for causal in (False, True):
            for N in seqlens:
                measure(D, causal, N)
    for D in (64, 128):
        for causal in (False, True):
            measure(D, causal, 1024)


if __name__ == "__main__":
    main()
