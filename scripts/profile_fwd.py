"""One forward call between cudaProfilerStart/Stop, for Nsight Compute (`gpu_check.sh ncu-fwd`).

    ncu --profile-from-start off ... python scripts/profile_fwd.py --provider tileattn --H 48 --N 8192 --D 1024 --causal

A first call (compiles, warms up) runs outside the profiled range. Inputs are random normal, [B, S, H, D] for
tileattn and the [B, H, S, D] view of the same values for torch's SDPA backends.
"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--provider", default="tileattn", choices=("tileattn", "cudnn", "efficient"))
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=48)
    ap.add_argument("--N", type=int, default=8192)
    ap.add_argument("--D", type=int, default=1024)
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    q, k, v = (torch.randn(a.B, a.N, a.H, a.D, device="cuda", dtype=torch.float16) for _ in range(3))
    if a.provider == "tileattn":
        import tileattn
        fn = lambda: tileattn.attention(q, k, v, causal=a.causal)  # noqa: E731
    else:
        from tileattn.bench.dense import sdpa
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        fn = lambda: sdpa(a.provider)(qh, kh, vh, a.causal)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
