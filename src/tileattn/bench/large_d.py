"""`tileattn bench large-d`: large head dims against torch's SDPA EFFICIENT backend (and cuDNN at D <= 256).

Grid (targets.md): B=1, H=48, N=8192 and B=1, H=8, N=16384; D = Dv in {256, 320, 384, 512, 768, 1024}; causal
F/T; fp16 by default. tileattn gets [B, S, H, D] tensors, the torch peers [B, H, S, D] views of the same
values. Before timing, tileattn's output is checked under the tolerance rule on a slice (heads 0-1) against a
float32 reference, with the EFFICIENT backend's own error on that slice standing in for the input-precision
error, and against the EFFICIENT output on every head. A case that fails is reported and gets no throughput.

Summary: min_vs_efficient_noncausal / _causal, the minimum over D in 320..1024 (both shapes) of tileattn's
throughput over EFFICIENT's; the per-D ratios; tileattn / cuDNN at D = 256.
"""
import torch

from ..ops.dense.reference import attention_ref
from ..tolerance import allowed_error, rounding_floor
from .common import Progress, attn_tflops, bench_rounds, finish, fmt, max_abs, results_header, warm_up_gpu
from .dense import DTYPES, sdpa

SHAPES = ((1, 48, 8192), (1, 8, 16384))
HEAD_DIMS = (256, 320, 384, 512, 768, 1024)


def check_case(ours_bshd, eff_bhsd, q, k, v, causal):
    """Tolerance rule on heads 0-1 against float32 (EFFICIENT's error standing in for the input-precision
    error), plus agreement with EFFICIENT on every head."""
    qs, ks, vs = (t[:1, :2].transpose(1, 2) for t in (q, k, v))  # [1, N, 2, D]
    ref, _ = attention_ref(qs, ks, vs, causal=causal)
    err = max_abs(ours_bshd[:1, :, :2], ref)
    err_eff = max_abs(eff_bhsd[:1, :2].transpose(1, 2), ref)
    finite = bool(torch.isfinite(ours_bshd).all())
    diff = max_abs(ours_bshd.transpose(1, 2), eff_bhsd)
    atol = rounding_floor(ref, q.dtype)
    ok = finite and err <= allowed_error(err_eff, ref, q.dtype) and diff <= 4 * (err_eff + atol) + 1e-3
    return ok, {"err_vs_fp32": err, "efficient_err_vs_fp32": err_eff, "max_diff_vs_efficient": diff,
                "finite": finite}


def run(dtype="fp16", shapes=SHAPES, head_dims=HEAD_DIMS, out_json=None, plot=None, log=print):
    import tileattn
    dt = DTYPES[dtype]
    doc = results_header("large_d")
    rows, failures = [], []
    warm_up_gpu(dt)
    progress = Progress(len(shapes) * len(head_dims) * 2)
    for B, H, N in shapes:
        for D in head_dims:
            for causal in (False, True):
                case = {"B": B, "H": H, "N": N, "D": D, "Dv": D, "causal": causal,
                        "dtype": str(dt).split(".")[-1]}
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # tileattn's layout
                ours = tileattn.attention(qt, kt, vt, causal=causal)
                eff = sdpa("efficient")(q, k, v, causal)
                ok, info = check_case(ours, eff, q, k, v, causal)
                ours = eff = None  # frees the GPU memory now
                if not ok:
                    failures.append((case, info))
                    log(f"CHECK FAILED {case}: {info}")
                fns = {"efficient": lambda: sdpa("efficient")(q, k, v, causal)}
                if ok:
                    fns["tileattn"] = lambda: tileattn.attention(qt, kt, vt, causal=causal)
                if D <= 256:
                    fns["cudnn"] = lambda: sdpa("cudnn")(q, k, v, causal)
                times = bench_rounds(fns)
                for p in ("tileattn", "efficient", "cudnn"):
                    if p == "cudnn" and D > 256:
                        continue
                    ms = times.get(p)
                    row = {"case": case, "provider": p, "ms": ms,
                           "tflops": attn_tflops(B, H, N, N, D, D, causal, ms) if ms else None, "gbps": None}
                    if p == "tileattn":
                        row["check"] = info
                        if not ok:
                            row["error"] = "output check failed: not timed"
                    rows.append(row)
                got = {r["provider"]: r["tflops"] for r in rows if r["case"] == case}
                ratio = got["tileattn"] / got["efficient"] if got.get("tileattn") and got.get("efficient") else None
                log(progress() + f"B={B} H={H:<2} N={N:<5} D={D:<4} causal={int(causal)} " +
                    " ".join(f"{p}={fmt(t)}" for p, t in got.items()) + f"  x{fmt(ratio, '{:.2f}')} efficient")
                q = k = v = qt = kt = vt = None  # frees the GPU memory now
                torch.cuda.empty_cache()
    doc["rows"] = rows
    doc["summary"] = summarize(rows)
    doc["summary"]["check_failures"] = len(failures)
    return finish(doc, out_json, log, plot)


def _ratio(rows, case, other):
    got = {r["provider"]: r["tflops"] for r in rows if r["case"] == case}
    t, o = got.get("tileattn"), got.get(other)
    if not o:
        return None
    return t / o if t else 0.0  # an unchecked or failed row counts as a miss


def summarize(rows):
    cases = [r["case"] for r in rows if r["provider"] == "tileattn"]
    out = {}
    for causal, name in ((False, "noncausal"), (True, "causal")):
        rs = [_ratio(rows, c, "efficient") for c in cases if c["causal"] == causal and 320 <= c["D"] <= 1024]
        rs = [r for r in rs if r is not None]
        out[f"min_vs_efficient_{name}"] = min(rs) if rs else None
    for c in cases:
        r = _ratio(rows, c, "efficient")
        out[f"vs_efficient_H{c['H']}_D{c['D']}_{'causal' if c['causal'] else 'full'}"] = r
        if c["D"] <= 256:
            out[f"vs_cudnn_H{c['H']}_D{c['D']}_{'causal' if c['causal'] else 'full'}"] = _ratio(rows, c, "cudnn")
    return out
