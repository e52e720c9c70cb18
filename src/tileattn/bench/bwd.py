"""`tileattn bench bwd`: attention backward on the dense grid against SDPA's cuDNN and FLASH backward.

Backward only: the forward runs once outside the timed region and each timed call is
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True). FLOPs 2.5x the forward's (targets.md). Before
timing, tileattn's gradients of (batch 0, head 0) are checked against autograd through the float32 reference
(tolerance rule; autograd through the same reference in the inputs' dtype is the input-precision error).
Flex rows (torch flex backward) are not in this suite yet.
"""
import torch

from ..ops.dense.reference import attention_ref
from ..tolerance import allowed_error
from .common import attn_tflops, do_bench, finish, fmt, geomean, results_header
from .dense import _sdpa

PROVIDERS = ("tileattn", "cudnn", "fa2")


def _check(grads, q, k, v, dout, causal):
    """Tolerance rule on the (batch 0, head 0) slice; returns (ok, info)."""
    sl = [t[:1, :, :1].detach() for t in (q, k, v, dout)]  # [1, N, 1, D]

    def ref_grads(dtype):
        x = [t.to(dtype).requires_grad_() for t in sl[:3]]
        out = attention_ref(*x, causal=causal, dtype=dtype)[0]
        return torch.autograd.grad(out, x, sl[3].to(dtype))
    ref, ref_lp = ref_grads(torch.float32), ref_grads(q.dtype)
    info, ok = {}, True
    for name, g, r, rl in zip(("dq", "dk", "dv"), grads, ref, ref_lp):
        err = (g[:1, :, :1].float() - r).abs().max().item()
        tol = allowed_error((rl.float() - r).abs().max().item(), r, q.dtype)
        info[name] = {"err": err, "tol": tol}
        ok = ok and err <= tol and bool(torch.isfinite(g).all())
    return ok, info


def run(dtype="fp16", head_dims=(64, 128), seqlens=(1024, 2048, 4096, 8192, 16384), batch=4, heads=32,
        out_json=None, log=print):
    import tileattn
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    doc = results_header("bwd")
    rows, failures = [], 0
    log(f"{'D':>4} {'causal':>6} {'N':>6} " + " ".join(f"{p:>9}" for p in PROVIDERS) + "   TFLOPS (2.5x fwd)")
    for D in head_dims:
        for causal in (False, True):
            for N in seqlens:
                B, H = batch, heads
                case = {"B": B, "H": H, "N": N, "D": D, "causal": causal, "dtype": str(dt).split(".")[-1]}
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=dt).requires_grad_() for _ in range(3))
                dout = torch.randn(B, N, H, D, device="cuda", dtype=dt)
                out = tileattn.attention(q, k, v, causal=causal)
                grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                ok, info = _check(grads, q, k, v, dout, causal)
                del grads
                if not ok:
                    failures += 1
                    log(f"CHECK FAILED {case}: {info}")
                qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                douth = dout.transpose(1, 2)
                outs = {"tileattn": (out, (q, k, v), dout)}
                for p in ("cudnn", "fa2"):
                    try:
                        outs[p] = (_sdpa(p)(qh, kh, vh, causal), (qh, kh, vh), douth)
                    except Exception as e:  # noqa: BLE001 - a peer that refuses a shape is reported
                        log(f"{p} refused {case}: {type(e).__name__}: {str(e)[:100]}")
                ms = {}
                for p, (o, x, g) in outs.items():
                    if p == "tileattn" and not ok:
                        continue
                    ms[p] = do_bench(lambda: torch.autograd.grad(o, x, g, retain_graph=True))
                    rows.append({"case": case, "provider": p, "ms": ms[p], "gbps": None,
                                 "tflops": 2.5 * attn_tflops(B, H, N, N, D, D, causal, ms[p]),
                                 **({"check": info} if p == "tileattn" else {})})
                log(f"{D:4d} {str(causal):>6} {N:6d} " + " ".join(
                    f"{fmt(2.5 * attn_tflops(B, H, N, N, D, D, causal, ms[p]) if p in ms else None):>9}"
                    for p in PROVIDERS))
                del q, k, v, dout, out, outs, qh, kh, vh
                torch.cuda.empty_cache()
    vs = {p: [] for p in ("cudnn", "fa2")}
    for r in rows:
        if r["provider"] == "tileattn":
            for p in vs:
                other = [x for x in rows if x["case"] == r["case"] and x["provider"] == p]
                if other:
                    vs[p].append(other[0]["ms"] / r["ms"])
    doc.update(rows=rows)
    doc["summary"] = {"geomean_vs_fa2": geomean(vs["fa2"]) if vs["fa2"] else None,
                      "geomean_vs_cudnn": geomean(vs["cudnn"]) if vs["cudnn"] else None,
                      "flex_geomean_vs_torch_flex": None,  # flex backward: not implemented yet
                      "check_failures": failures}
    return finish(doc, out_json, log)
