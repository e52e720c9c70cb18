"""Time tile configs of the backward kernels (ops/dense/bwd.py FORCE) on the GPU, gradients checked first.

    python scripts/sweep_bwd.py
Prints backward TFLOPS (2.5x forward FLOPs) per (D, causal, N) and config.
"""
import torch

import tileattn
from tileattn.bench.bwd import _check
from tileattn.bench.common import attn_tflops, do_bench
from tileattn.ops.dense import bwd

CANDIDATES = [
    ((64, 64, 4, 2), (64, 64, 4, 2)),
    ((64, 128, 8, 2), (128, 64, 8, 2)),
    ((64, 128, 8, 3), (128, 64, 8, 3)),
    ((32, 128, 4, 2), (128, 32, 4, 2)),
    ((64, 128, 4, 2), (128, 64, 4, 2)),
    ((128, 128, 8, 2), (128, 128, 8, 2)),
]


def main():
    B, H = 4, 32
    for D in (64, 128):
        for causal in (False, True):
            for N in (2048, 8192):
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16).requires_grad_()
                           for _ in range(3))
                dout = torch.randn_like(q)
                line = []
                for cfg in CANDIDATES:
                    bwd.FORCE = cfg
                    try:
                        out = tileattn.attention(q, k, v, causal=causal)
                        g = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                        ok, _ = _check(g, q, k, v, dout, causal)
                        if not ok:
                            line.append(f"{cfg}: WRONG")
                            continue
                        ms = do_bench(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
                        line.append(f"{cfg[0]}/{cfg[1]}: {2.5 * attn_tflops(B, H, N, N, D, D, causal, ms):.0f}")
                    except Exception as e:  # noqa: BLE001
                        line.append(f"{cfg}: {type(e).__name__} {str(e)[:60]}")
                print(f"D={D} causal={causal} N={N}: " + " | ".join(line), flush=True)
                del q, k, v, dout
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
