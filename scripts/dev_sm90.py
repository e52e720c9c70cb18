"""Check and time the Hopper Gluon forward kernel directly (before and besides its wiring into the API).

    python scripts/dev_sm90.py [--quick] [--dims 64,128]
        [--cfg D:BM:BN:STAGES:REGS[:PERSISTENT[:Q_SLOTS]] ...]

1. correctness of launch_sm90.launch against the float32 reference (tolerance rule) over edge cases;
2. the dense grid (B=4, H=32, fp16): Gluon kernel vs the portable Triton kernel vs cuDNN, outputs checked
   against cuDNN before timing. Prints one line per case and a summary.
"""
import argparse
import math
import sys

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from tileattn.launcher import KernelLauncher
from tileattn.ops.dense import launch, launch_sm90, plans, reference
from tileattn.tolerance import allowed_error


def rand(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


def run_gluon(q, k, v, causal=False, window=(-1, -1), softcap=0.0, return_lse=False, cfg=None,
              bottom_right=True, programs=None):
    scale = q.shape[-1] ** -0.5
    left, right = launch.effective_window(causal, window)
    out = torch.full(q.shape[:-1] + (v.shape[-1],), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    assert launch_sm90.supports(q, k, v, out, False, False, scale, softcap)  # the shape (masks: any)
    launch_sm90.launch(q, k, v, out, lse, scale, left, right, softcap, bottom_right, return_lse, cfg=cfg,
                       programs=programs)
    return out, lse


def check(name, q, k, v, cfg=None, **kw):
    out, lse = run_gluon(q, k, v, return_lse=True, cfg=cfg, **kw)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention_ref(q, k, v, causal=kw.get("causal", False), window=kw.get("window", (-1, -1)),
                                           softcap=kw.get("softcap", 0.0))
    ref_lp, _ = reference.attention_ref(q, k, v, causal=kw.get("causal", False), window=kw.get("window", (-1, -1)),
                                        softcap=kw.get("softcap", 0.0), dtype=q.dtype)
    err = (out.float() - ref).abs().max().item()
    tol = allowed_error((ref_lp.float() - ref).abs().max().item(), ref, q.dtype)
    fin = torch.isfinite(ref_lse)
    lse_ok = torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (
        not fin.any() or (lse[fin] - ref_lse[fin]).abs().max().item() < 1e-2)
    ok = err <= tol and not torch.isnan(out).any() and lse_ok
    print(f"{'ok  ' if ok else 'FAIL'} {name}: err {err:.2e} tol {tol:.2e} lse_ok {lse_ok}", flush=True)
    return ok


def correctness(cfgs):
    fails = 0
    f16, bf16 = torch.float16, torch.bfloat16
    cases = []
    for d in sorted(launch_sm90._CONFIGS):
        for (sq, sk) in ((1, 1), (17, 17), (127, 127), (1000, 1000), (128, 1000), (1000, 128), (17, 300),
                         (300, 17), (256, 256), (2048, 2048)):
            for causal in (False, True):
                cases.append((f"D{d} Sq{sq} Sk{sk} causal={causal}", dict(B=2, Sq=sq, Sk=sk, Hq=4, Hkv=4, D=d,
                                                                          dtype=f16), dict(causal=causal)))
        cases.append((f"D{d} GQA4 bf16 causal", dict(B=2, Sq=500, Sk=700, Hq=8, Hkv=2, D=d, dtype=bf16),
                      dict(causal=True)))
        cases.append((f"D{d} MQA window(100,20)", dict(B=1, Sq=700, Sk=900, Hq=4, Hkv=1, D=d, dtype=f16),
                      dict(window=(100, 20))))
        cases.append((f"D{d} window(0,0)", dict(B=1, Sq=300, Sk=300, Hq=2, Hkv=2, D=d, dtype=f16),
                      dict(window=(0, 0))))
        cases.append((f"D{d} softcap30 causal", dict(B=1, Sq=600, Sk=600, Hq=2, Hkv=2, D=d, dtype=f16),
                      dict(causal=True, softcap=30.0)))
        cases.append((f"D{d} left-only window 64", dict(B=1, Sq=600, Sk=600, Hq=2, Hkv=2, D=d, dtype=f16),
                      dict(window=(64, -1))))
        cases.append((f"D{d} causal Sq>Sk fully-masked rows", dict(B=1, Sq=400, Sk=100, Hq=2, Hkv=2, D=d,
                                                                   dtype=f16), dict(causal=True)))
    for name, shp, kw in cases:
        q = rand(shp["B"], shp["Sq"], shp["Hq"], shp["D"], dtype=shp["dtype"])
        k = rand(shp["B"], shp["Sk"], shp["Hkv"], shp["D"], dtype=shp["dtype"])
        v = rand(shp["B"], shp["Sk"], shp["Hkv"], shp["D"], dtype=shp["dtype"])
        for cfg in cfgs.get(shp["D"], [None]):
            fails += not check(name + (f" {cfg}" if cfg else ""), q, k, v, cfg=cfg, **kw)
    # non-contiguous strides: [B, H, S, D] storage seen as [B, S, H, D]
    q = rand(2, 4, 333, 128, dtype=f16).transpose(1, 2)
    k = rand(2, 4, 444, 128, dtype=f16).transpose(1, 2)
    v = rand(2, 4, 444, 128, dtype=f16).transpose(1, 2)
    fails += not check("head-major strides D128 causal", q, k, v, causal=True)
    # persistent grid: few CTAs walk many tiles of unequal length (barrier phases carried across tiles)
    for d in sorted(launch_sm90._CONFIGS):
        for programs in (1, 3, 37, None):
            for kw in (dict(causal=True), dict(window=(100, 20)), dict()):
                q = rand(3, 333, 16, d, dtype=f16)
                k = rand(3, 555, 4, d, dtype=f16)
                v = rand(3, 555, 4, d, dtype=f16)
                fails += not check(f"D{d} persistent programs={programs} {kw}", q, k, v, programs=programs, **kw)
    return fails


def _variant(q, k, v, causal, cfg, old=False):
    """A launch of one kernel variant as the API makes it (compiled once, replayed by KernelLauncher)."""
    mod = launch_sm90
    if old:  # another revision's kernel, for an A/B in one run (scripts/snapshot_sm90.sh)
        from scripts.scratch_old import launch_sm90 as mod
    d = q.shape[-1]
    scale = d ** -0.5
    out = torch.empty_like(q)
    lse = torch.empty(0, device=q.device)
    kernel, grid, args, kwargs = mod.kernel_call(q, k, v, out, lse, scale, -1, 0 if causal else -1, 0.0, True,
                                                 False, cfg)
    run = KernelLauncher(kernel, args, kwargs, mod.VARYING)
    scales = mod.scales(scale, 0.0)

    def f():
        run(grid, q, k, v, out, lse, lse, lse, lse, *scales, 1.0)  # no descales: placeholders, out_scale 1
        return out
    return f


def bench(quick, variants, dims=(64, 128)):
    """variants: {name: (D or None, kwargs of _variant)}; tileattn's default plan and cuDNN always run."""
    torch.manual_seed(0)
    rows = {}
    ns = (1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384)
    for d in dims:
        for causal in (False, True):
            for n in ns:
                B, H = 4, 32
                q, k, v = (rand(B, n, H, d, dtype=torch.float16) for _ in range(3))
                flops = 4 * B * H * n * n * d * (0.5 if causal else 1.0)
                qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
                tf = lambda t: flops / t * 1e-9
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
                    f_cudnn = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    t_cudnn = triton.testing.do_bench(f_cudnn, warmup=50, rep=200)
                fns = {"plan": lambda: plans.attn_fwd(q, k, v, None, None, 0, 0, d ** -0.5, -1, 0 if causal else -1,
                                                      0.0, True, False)[0]}
                for name, (vd, kw) in variants.items():
                    if vd in (None, d):
                        fns[name] = _variant(q, k, v, causal, **kw)
                line = []
                for name, f in fns.items():
                    err = (f().float() - ref.float()).abs().max().item()
                    ok = err < 2e-2
                    t = triton.testing.do_bench(f, warmup=50, rep=200)
                    rows.setdefault(name, []).append((tf(t) / tf(t_cudnn), ok))
                    line.append(f"{name} {tf(t):4.0f}{'' if ok else '!'}")
                print(f"D={d} causal={causal:d} N={n:5d}: cudnn {tf(t_cudnn):4.0f} " + " ".join(line), flush=True)
    for name, rs in rows.items():
        gm = math.exp(sum(math.log(r[0]) for r in rs) / len(rs))
        print(f"BENCH {name}: geomean/cudnn {gm:.3f} min {min(r[0] for r in rs):.3f}, "
              f"check failures {sum(not r[1] for r in rs)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--dims", default="64,128", help="head dims of the benchmark grid")
    ap.add_argument("--cfg", action="append", default=[],
                    help="D:BM:BN:STAGES:REGS[:PERSISTENT 0/1[:Q_SLOTS]]")
    ap.add_argument("--old", action="store_true",
                    help="also time another revision's kernel (scripts/snapshot_sm90.sh REV puts it in "
                         "scripts/scratch_old)")
    a = ap.parse_args()
    cfgs, variants = {}, {}
    for s in a.cfg:
        d, bm, bn, st, regs, *rest = (int(x) for x in s.split(":"))
        cfg = launch_sm90.Sm90Config(bm, bn, st, regs, bool(rest[0]) if rest else True,
                                     q_slots=rest[1] if len(rest) > 1 else 2)
        cfgs.setdefault(d, []).append(cfg)
        variants[s] = (d, dict(cfg=cfg))
    if a.old:
        variants["old"] = (None, dict(cfg=None, old=True))
    fails = 0 if a.no_check else correctness(cfgs)
    print(f"CHECK failures: {fails}", flush=True)
    if not a.no_bench:
        bench(a.quick, variants, tuple(int(x) for x in a.dims.split(",")))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
