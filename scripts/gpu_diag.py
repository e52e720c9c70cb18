"""Machine sanity before timing: clocks/power, a large bf16 matmul, and repeatability of one attention shape.

    python scripts/gpu_diag.py
"""
import subprocess
import time

import torch
import triton.testing


def smi():
    q = "clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu," \
        "clocks_throttle_reasons.active"
    r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True)
    print("nvidia-smi:", q, "\n   ", r.stdout.strip() or r.stderr.strip(), flush=True)


def main():
    smi()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        ms = triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")
        print(f"bf16 matmul 8192^3: {2 * 8192**3 / ms / 1e9:.0f} TFLOPS", flush=True)
    x = torch.randn(256 * 1024 * 1024, device="cuda")
    ms = triton.testing.do_bench(lambda: x.sum(), warmup=50, rep=300, return_mode="median")
    print(f"read-only reduction 1 GiB: {x.numel() * 4 / ms / 1e6:.0f} GB/s", flush=True)
    smi()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for N, D in ((4096, 128),):
        q, k, v = (torch.randn(4, 32, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
        f = 4 * 4 * 32 * N * N * D
        for rep in (100, 1000):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)  # noqa: E731
                t = []
                for _ in range(3):
                    t.append(f / triton.testing.do_bench(fn, warmup=100, rep=rep, return_mode="median") / 1e9)
            print(f"cudnn N={N} D={D} rep={rep}ms: " + " ".join(f"{x:.0f}" for x in t) + " TFLOPS", flush=True)
        # plain event timing, many back-to-back launches
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(20):
                torch.nn.functional.scaled_dot_product_attention(q, k, v)
            e.record()
            torch.cuda.synchronize()
            print(f"cudnn N={N} back-to-back x20: {f / (s.elapsed_time(e) / 20) / 1e9:.0f} TFLOPS", flush=True)
        smi()
        del q, k, v
    # host overhead of one tileattn call: a problem so small that the kernel time is negligible
    import tileattn
    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.float16)
    us = triton.testing.do_bench(lambda: tileattn.attention(q, q, q, causal=True), warmup=50, rep=200,
                                 return_mode="median") * 1e3
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qs = q.transpose(1, 2)
        us_c = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
            qs, qs, qs, is_causal=True), warmup=50, rep=200, return_mode="median") * 1e3
    from tileattn import custom_ops
    from tileattn.ops.dense import plans
    args = (q, q, q, None, None, 0, 0, 0.125, -1, 0, 0.0, True, False)
    us_l = triton.testing.do_bench(lambda: plans.attn_fwd(*args), warmup=50, rep=200, return_mode="median") * 1e3
    us_o = triton.testing.do_bench(lambda: custom_ops.attn_fwd(*args), warmup=50, rep=200,
                                   return_mode="median") * 1e3
    print(f"per-call time at a tiny shape (host overhead): tileattn {us:.0f} us (launcher alone {us_l:.0f}, "
          f"through the custom op {us_o:.0f}), cudnn {us_c:.0f} us", flush=True)


if __name__ == "__main__":
    main()
