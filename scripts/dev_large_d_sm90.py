"""A/B timings of the large-D Gluon kernel's configs (large_d_sm90.py, called directly), against the default
path and cuDNN where it runs (D <= 256); every output checked before timing.

    python scripts/dev_large_d_sm90.py [--dims 256,1024] [--causal 0,1] [--shapes 1x48x8192,1x8x16384]
                                       [--cfgs BN:BK:ST:DVS:QRES,...]

Prints one line per (shape, D, causal, provider): TFLOPS and the ratio to cuDNN (D <= 256) or to the default path.
"""
import argparse

import torch

import tileattn
from tileattn.bench.common import attn_tflops, do_bench, max_abs
from tileattn.bench.dense import sdpa
from tileattn.ops.dense import large_d
from tileattn.ops.dense.reference import attention_ref
from tileattn.tolerance import allowed_error


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="256,1024")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--shapes", default="1x48x8192,1x8x16384")
    ap.add_argument("--cfgs", default="128:64:4:256:0,128:64:4:256:1,128:64:6:256:1")
    a = ap.parse_args()
    cfgs = []
    for c in a.cfgs.split(","):
        bn, bk, st, dvs, qr = (int(x) for x in c.split(":"))
        cfgs.append((c, large_d.LargeDSm90Config(bn, bk, st, dvs, q_resident=bool(qr))))
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    do_bench(lambda: x @ x)  # warm the clocks up
    for shape in a.shapes.split(","):
        B, H, N = (int(v) for v in shape.split("x"))
        for D in (int(v) for v in a.dims.split(",")):
            for causal in (bool(int(v)) for v in a.causal.split(",")):
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16) for _ in range(3))
                ref, _ = attention_ref(q[:, :, :2], k[:, :, :2], v[:, :, :2], causal=causal)
                base = tileattn.attention(q, k, v, causal=causal)
                base_err = max_abs(base[:, :, :2], ref)
                fns = {"default": lambda: tileattn.attention(q, k, v, causal=causal)}
                if D <= 256:
                    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
                    fns["cudnn"] = lambda: sdpa("cudnn")(qh, kh, vh, causal)
                for name, cfg in cfgs:
                    if cfg.smem_bytes(D, 2) > 232448:
                        continue
                    out = torch.empty_like(q)
                    lse = torch.empty(0, device="cuda")
                    kern, grid, args, kw = large_d.kernel_call_sm90(q, k, v, out, lse, D ** -0.5, causal, True, False,
                                                                     cfg)
                    fn = (lambda kern=kern, grid=grid, args=args, kw=kw: kern[grid](*args, **kw))
                    fn()
                    torch.cuda.synchronize()
                    err = max_abs(out[:, :, :2], ref)
                    diff = max_abs(out, base)
                    ok = bool(torch.isfinite(out).all()) and err <= allowed_error(base_err, ref, q.dtype) and \
                        diff <= 4 * base_err + 2e-3
                    print(f"CHECK {shape} D={D} causal={causal} {name}: err={err:.2e} diff={diff:.1e} ok={ok}",
                          flush=True)
                    if ok:
                        fns[name] = fn
                tf = {p: attn_tflops(B, H, N, N, D, D, causal, do_bench(f)) for p, f in fns.items()}
                peer = tf.get("cudnn", tf["default"])
                print(f"RES {shape} D={D} causal={causal}: " +
                      "  ".join(f"{p} {t:.0f} ({t / peer:.2f})" for p, t in tf.items()), flush=True)
                del q, k, v, base, out
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
