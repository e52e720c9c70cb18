"""Per-kernel GPU time of the backward passes (torch.profiler): tileattn's flex and dense backward and torch's
compiled flex backward, flex grid shapes (B=4, H=16, N=8192, D=128, bf16).

    python scripts/profile_bwd.py
"""
import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.profiler import ProfilerActivity, profile

import tileattn
from tileattn.bench import flex as fx


def kernel_times(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            rows.append((e.self_device_time_total / reps / 1e3, e.key[:90]))
    return sorted(rows, reverse=True)[:6]


def host_us(fn, reps=20):
    """Median host microseconds to issue fn() (synchronized before each call, not after)."""
    import time
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[reps // 2]


def main(N=8192):
    B, H, D = fx.B, fx.H, fx.D
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    flex_c = fx._torch_flex()
    for name, (score_mod, mask_mod) in fx.make_mods(N, q.device).items():
        if name not in ("causal", "softcap_causal"):
            continue
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda")
        for who, o in (("tileattn", tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)),
                       ("torch", flex_c(q, k, v, score_mod=score_mod, block_mask=bm))):
            fn = (lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
            for ms, kname in kernel_times(fn):
                print(f"PROF {name} {who}: {ms:.3f} ms {kname}", flush=True)
            print(f"PROF {name} {who}: host {host_us(fn):.0f} us to issue the backward", flush=True)
    qd, kd, vd = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    o = tileattn.attention(qd, kd, vd, causal=True)
    for ms, kname in kernel_times(lambda: torch.autograd.grad(o, (qd, kd, vd), dout.transpose(1, 2),
                                                              retain_graph=True)):
        print(f"PROF dense-causal tileattn: {ms:.3f} ms {kname}", flush=True)


if __name__ == "__main__":
    main()
