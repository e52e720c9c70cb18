"""`tileattn bench bwd`: attention backward on the dense grid against SDPA's cuDNN and FLASH backward.

Backward only: the forward runs once outside the timed region and each timed call is
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True); providers are timed interleaved over two rounds,
the best median kept (common.bench_rounds; each provider first runs 0.3 s untimed), after a second of matmuls
(common.warm_up_gpu). FLOPs 2.5x the
forward's (targets.md). Before timing, tileattn's gradients of (batch 0, head 0) are checked against autograd
through the float32 reference (tolerance rule; autograd through the same reference in the inputs' dtype is the
input-precision error).
Flex rows: the flex grid's six mods at N=8192 (B=4, H=16, D=128, bf16; bench/flex.py's functions and torch
BlockMasks), tileattn.flex_attention's backward against torch's compiled flex_attention backward; gradients
of (batch 0, head 0) checked first against autograd through the materialised reference (ops/flex/reference.py)
in float32, the same in bf16 as the input-precision error. FLOPs: 2.5x the forward's visible pairs. The same
functions are timed forward + backward too (rows with case mode "fwdbwd", 3.5x the forward's FLOPs; summary
flex_fwdbwd_geomean_vs_torch_flex).
D = 256 rows (D256_ROWS: N 4K / 8K, against cuDNN where it runs them; summary d256_min_vs_cudnn) and large
head dims (LARGE_D_ROWS: D 320 / 512, N 4K / 8K, B=1, H=16, against the fastest torch SDPA backend whose
backward runs, EFFICIENT or MATH; summary large_d_min_vs_best_torch), checked like the grid.
"""
import torch

from ..ops.dense.reference import attention_ref
from ..tolerance import allowed_error
from .common import Progress, attn_tflops, bench_rounds, error_text, finish, fmt, geomean, results_header, warm_up_gpu
from .dense import sdpa

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


BATCH, HEADS = 4, 32  # the grid's B and H
DEVICE = "cuda"  # (a CPU smoke test of the suite's code paths sets "cpu")
# D = 256 rows (against cuDNN, where it runs them) and the large head dims (against the fastest torch SDPA
# backend that runs their backward: EFFICIENT or MATH); B and H of the large-D rows keep MATH's float32 score
# matrices (B H N^2 x 4 bytes, a few of them) within the GPU's memory at N = 8K
D256_ROWS = dict(B=BATCH, H=HEADS, D=(256,), N=(4096, 8192), providers=("cudnn", "fa2"))
LARGE_D_ROWS = dict(B=1, H=16, D=(320, 512), N=(4096, 8192), providers=("efficient", "math"))


def _case_rows(shape, dt, providers, rows, log):
    """One case, shape = (B, H, N, D, causal): tileattn's gradients checked, then tileattn and the torch
    providers (SDPA backends) timed. Appends rows; returns ({provider: ms}, check passed)."""
    import tileattn
    B, H, N, D, causal = shape
    case = {"B": B, "H": H, "N": N, "D": D, "causal": causal, "dtype": str(dt).split(".")[-1]}
    q, k, v = (torch.randn(B, N, H, D, device=DEVICE, dtype=dt).requires_grad_() for _ in range(3))
    dout = torch.randn(B, N, H, D, device=DEVICE, dtype=dt)
    out = tileattn.attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    ok, info = _check(grads, q, k, v, dout, causal)
    grads = None  # frees the GPU memory now
    if not ok:
        log(f"CHECK FAILED {case}: {info}")
    qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    douth = dout.transpose(1, 2)
    outs = {"tileattn": (out, (q, k, v), dout)} if ok else {}
    for p in providers:
        try:
            outs[p] = (sdpa(p)(qh, kh, vh, causal), (qh, kh, vh), douth)
            torch.autograd.grad(outs[p][0], outs[p][1], douth, retain_graph=True)  # runs its backward too
        except Exception as e:  # noqa: BLE001 - a peer that refuses a shape (or its backward) is reported
            outs.pop(p, None)
            log(f"{p} refused {case}: {error_text(e, 100)}")
    # each provider warmed for 0.3 s first: without it, the first short row of a group (the first timed after
    # the check and a compile) measured 0.5-0.8x its rerun, tileattn's alone (2026-11-25, bench-bwd: D=128 causal
    # 1K 201 TFLOPS, 240-254 in ab-bwd runs of the same tree)
    ms = bench_rounds({p: (lambda o=o, x=x, g=g: torch.autograd.grad(o, x, g, retain_graph=True))
                       for p, (o, x, g) in outs.items()}, warm_s=0.3)
    for p in outs:
        rows.append({"case": case, "provider": p, "ms": ms[p], "gbps": None,
                     "tflops": 2.5 * attn_tflops(B, H, N, N, D, D, causal, ms[p]),
                     **({"check": info} if p == "tileattn" else {})})
    return ms, ok


def run(dtype="fp16", head_dims=(64, 128), seqlens=(1024, 2048, 4096, 8192, 16384), out_json=None, plot=None,
        log=print, flex=True, extra_rows=True):
    """The grid (head_dims x causal x seqlens, B=BATCH, H=HEADS, against cuDNN and FA2), then (extra_rows) the
    D = 256 and large-D rows, then (flex) the flex rows."""
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    doc = results_header("bwd")
    rows, failures = [], 0
    warm_up_gpu(dt)
    progress = Progress(len(head_dims) * 2 * len(seqlens))
    log(f"{'D':>4} {'causal':>6} {'N':>6} " + " ".join(f"{p:>9}" for p in PROVIDERS) + "   TFLOPS (2.5x fwd)")

    def tflops_line(B, H, N, D, causal, ms, providers):
        return f"{D:4d} {str(causal):>6} {N:6d} " + " ".join(
            f"{p}={fmt(2.5 * attn_tflops(B, H, N, N, D, D, causal, ms[p]) if p in ms else None)}"
            for p in ("tileattn", *providers))

    for D in head_dims:
        for causal in (False, True):
            for N in seqlens:
                ms, ok = _case_rows((BATCH, HEADS, N, D, causal), dt, ("cudnn", "fa2"), rows, log)
                failures += not ok
                log(progress() + tflops_line(BATCH, HEADS, N, D, causal, ms, ("cudnn", "fa2")))
                torch.cuda.empty_cache()
    n_grid = len(rows)
    extra = {"d256": [], "large_d": []}
    if extra_rows:
        for key, spec in (("d256", D256_ROWS), ("large_d", LARGE_D_ROWS)):
            for D in spec["D"]:
                for causal in (False, True):
                    for N in spec["N"]:
                        ms, ok = _case_rows((spec["B"], spec["H"], N, D, causal), dt, spec["providers"], rows,
                                            log)
                        failures += not ok
                        log(tflops_line(spec["B"], spec["H"], N, D, causal, ms, spec["providers"]))
                        torch.cuda.empty_cache()
                        peers = [ms[p] for p in spec["providers"] if p in ms]
                        if "tileattn" in ms and peers:
                            # d256: against cuDNN; large D: against the fastest torch backend that ran
                            peer = ms.get("cudnn") if key == "d256" else min(peers)
                            if peer is not None:
                                extra[key].append(peer / ms["tileattn"])
    vs = {p: [] for p in ("cudnn", "fa2")}
    for r in rows[:n_grid]:  # the grid's rows only (the D = 256 rows have their own key)
        if r["provider"] == "tileattn":
            for p in vs:
                other = [x for x in rows if x["case"] == r["case"] and x["provider"] == p]
                if other:
                    vs[p].append(other[0]["ms"] / r["ms"])
    flex_ratios = flex_fb = None
    if flex:
        from .flex import flex_rows
        flex_ratios, flex_fb, flex_failures = flex_rows(rows, log)
        failures += flex_failures
    doc.update(rows=rows)
    doc["summary"] = {"geomean_vs_fa2": geomean(vs["fa2"]) if vs["fa2"] else None,
                      "geomean_vs_cudnn": geomean(vs["cudnn"]) if vs["cudnn"] else None,
                      "min_vs_fa2": min(vs["fa2"]) if vs["fa2"] else None,
                      "min_vs_cudnn": min(vs["cudnn"]) if vs["cudnn"] else None,
                      "flex_geomean_vs_torch_flex": geomean(flex_ratios) if flex_ratios and len(flex_ratios) == 6
                      else None,
                      "flex_fwdbwd_geomean_vs_torch_flex": geomean(flex_fb) if flex_fb and len(flex_fb) == 6
                      else None,
                      "d256_min_vs_cudnn": min(extra["d256"]) if extra["d256"] else None,
                      "large_d_min_vs_best_torch": min(extra["large_d"]) if extra["large_d"] else None,
                      "check_failures": failures}
    return finish(doc, out_json, log, plot)
