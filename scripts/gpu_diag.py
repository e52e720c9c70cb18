"""Machine sanity before timing: clocks/power, a large bf16 matmul, and repeatability of one attention shape.

    python scripts/gpu_diag.py
"""
import functools
import subprocess

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
    for N, D in ((4096, 128),):
        cudnn_repeatability(N, D)  # its tensors are freed on return
        smi()
    host_overhead()


def cudnn_repeatability(N, D):
    """cuDNN attention at [4, 32, N, D] float16: do_bench medians at two rep counts, three times each, then plain
    event timing of many back-to-back launches."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(4, 32, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
    f = 4 * 4 * 32 * N * N * D
    fn = functools.partial(torch.nn.functional.scaled_dot_product_attention, q, k, v)
    for rep in (100, 1000):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t = [f / triton.testing.do_bench(fn, warmup=100, rep=rep, return_mode="median") / 1e9 for _ in range(3)]
        print(f"cudnn N={N} D={D} rep={rep}ms: " + " ".join(f"{x:.0f}" for x in t) + " TFLOPS", flush=True)
    # plain event timing, many back-to-back launches
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(3):
            fn()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20):
            fn()
        e.record()
        torch.cuda.synchronize()
        print(f"cudnn N={N} back-to-back x20: {f / (s.elapsed_time(e) / 20) / 1e9:.0f} TFLOPS", flush=True)


def host_overhead():
    """Per-call time of one tileattn call at a problem so small that the kernel time is negligible: the public
    call, the launch plans alone (plans.attn_fwd), the registered op (custom_ops.attn_fwd), and cuDNN's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tileattn
    from tileattn.ops.dense import custom_ops, plans
    from tileattn.ops.dense.problem import AttnOptions

    def per_call_us(fn):
        return triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median") * 1e3
    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.float16)
    us = per_call_us(lambda: tileattn.attention(q, q, q, causal=True))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        qs = q.transpose(1, 2)
        us_c = per_call_us(lambda: torch.nn.functional.scaled_dot_product_attention(qs, qs, qs, is_causal=True))
    opts = AttnOptions(scale=64 ** -0.5, window=(-1, 0), return_lse=True)  # causal, with the lse a gradient needs
    us_l = per_call_us(lambda: plans.attn_fwd(q, q, q, (), None, opts))
    options = opts.encode()
    us_o = per_call_us(lambda: custom_ops.attn_fwd(q, q, q, None, None, options))
    print(f"per-call time at a tiny shape (host overhead): tileattn {us:.0f} us (launcher alone {us_l:.0f}, "
          f"through the custom op {us_o:.0f}), cudnn {us_c:.0f} us", flush=True)


if __name__ == "__main__":
    main()
