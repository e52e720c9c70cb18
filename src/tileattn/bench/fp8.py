"""`tileattn bench fp8`: the dense forward grid with fp8 inputs against tileattn fp16, cuDNN fp16 and flex fp8.

Grid (targets.md): B=4, H=32, D in {64, 128}, causal F/T, N in 1K..16K, plus D=256 at N 4K..16K (issue 23's
fp8_vs_fp16_min_d256; flex-e4m3 is not timed there). Each case draws fresh fp16 values
([B, S, H, D]) and quantizes them per (batch, head) with tileattn.quantize_fp8; every provider sees those
values in its own layout: tileattn [B, S, H, D] (fp8 V once in tileattn.fp8_v_layout, or row-major for
`-vrow`, whose transpose inside the call is timed), the torch peers [B, H, S, D] (flex gets its column-major
fp8 V, made outside the timed region, and no descales: it does less work than we do). Before timing, each
tileattn output is checked on a slice (batch 0, two heads) against the float32 reference of the dequantized
inputs (fp16: dense.check_case); a provider that fails is reported and gets no throughput. `case.dtype` is
the dtype of the source values.
"""
import torch

from . import dense
from .common import NOT_TIMED, Progress, attn_tflops, do_bench, error_text, finish, fmt, geomean, results_header
from .fp8_check import FP8, call, check, quantized

PROVIDERS = ("tileattn-e4m3", "tileattn-e4m3-vrow", "tileattn-e5m2", "tileattn-fp16", "cudnn-fp16",
             "flex-e4m3")
SEQLENS = (1024, 2048, 4096, 8192, 16384)
SEQLENS_D256 = (4096, 8192, 16384)
ROUNDS = 2


def _fp8_providers(name, q16, k16, v16, causal, N, flex=True):
    """Quantized inputs of one fp8 dtype: ({provider: fn to time (flex: maker of it, with flex)}, {provider:
    check})."""
    import tileattn
    q8, k8, v8, descales, ref, tol = quantized(q16, k16, v16, name, causal)
    # fast V layout made once, untimed; row-major V (`-vrow`) re-laid out inside each call
    fns = {f"tileattn-{name}": call(q8, k8, tileattn.fp8_v_layout(v8), descales, causal)}
    if name == "e4m3":
        fns["tileattn-e4m3-vrow"] = call(q8, k8, v8, descales, causal)
    checks = {p: check(fn, ref, tol) for p, fn in fns.items()}
    if name == "e4m3" and flex:
        qb, kb = (t.transpose(1, 2).contiguous() for t in (q8, k8))
        vb = v8.permute(0, 2, 3, 1).contiguous().transpose(2, 3)  # [B, H, S, D] column-major, flex's fp8 V
        fns["flex-e4m3"] = lambda: dense._flex(qb, kb, vb, causal, N)
    return fns, checks


def _time(fns, providers, errors):
    """Min over ROUNDS of each provider's median, providers interleaved as in dense.run."""
    times = {p: [] for p in providers}
    for _ in range(ROUNDS):
        for p in providers:
            if p in errors:
                continue
            try:
                times[p].append(do_bench(fns[p]() if p.startswith("flex") else fns[p]))
            except Exception as e:  # noqa: BLE001 - a peer that refuses a shape (or fp8) is reported, not fatal
                errors[p] = error_text(e)
    return times


def _run_case(case, providers, fp8_dtypes, log):
    """Rows of one case and its number of failed checks; its tensors are freed on return."""
    import tileattn
    B, H, N, D, causal = (case[k] for k in ("B", "H", "N", "D", "causal"))
    q16, k16, v16 = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q16, k16, v16))  # the torch peers' layout
    cudnn = dense.sdpa("cudnn")
    fns = {"tileattn-fp16": lambda: tileattn.attention(q16, k16, v16, causal=causal),
           "cudnn-fp16": lambda: cudnn(qt, kt, vt, causal)}
    fp16_check = dense.check_case(fns["tileattn-fp16"](), fns["cudnn-fp16"](), qt, kt, vt, causal)
    checks = {"tileattn-fp16": fp16_check}
    for name in fp8_dtypes:
        more_fns, more_checks = _fp8_providers(name, q16, k16, v16, causal, N, "flex-e4m3" in providers)
        fns.update(more_fns)
        checks.update(more_checks)
    failed = [p for p, (ok, _) in checks.items() if not ok]
    for p in failed:
        log(f"CHECK FAILED {p} {case}: {checks[p][1]}")
    errors = {p: NOT_TIMED for p in failed}
    times = _time(fns, providers, errors)
    rows = []
    for p in providers:
        ms = min(times[p]) if times[p] and p not in errors else None
        row = {"case": case, "provider": p, "ms": ms,
               "tflops": attn_tflops(B, H, N, N, D, D, causal, ms) if ms else None, "gbps": None}
        if p in checks:
            row["check"] = checks[p][1]
        if p in errors:
            row["error"] = errors[p]
        rows.append(row)
    return rows, len(failed)


def _seqlens(D, seqlens):
    return seqlens or (SEQLENS_D256 if D == 256 else SEQLENS)


def run(fp8_dtypes=("e4m3", "e5m2"), head_dims=(64, 128, 256), seqlens=None, batch=4, heads=32, out_json=None,
        plot=None, log=print):
    providers = [p for p in PROVIDERS if p.split("-")[1] not in FP8 or p.split("-")[1] in fp8_dtypes]
    doc = results_header("fp8")
    rows, failures = [], 0
    progress = Progress(2 * sum(len(_seqlens(D, seqlens)) for D in head_dims))
    for D in head_dims:
        for causal in (False, True):
            for N in _seqlens(D, seqlens):
                case = {"B": batch, "H": heads, "N": N, "D": D, "causal": causal, "dtype": "float16"}
                new, failed = _run_case(case, [p for p in providers if D <= 128 or not p.startswith("flex")],
                                        fp8_dtypes, log)
                torch.cuda.empty_cache()
                rows += new
                failures += failed
                log(progress() + f"D={D:<4} causal={int(causal)} N={N:<6} " +
                    " ".join(f"{r['provider']}={fmt(r['tflops'])}" for r in new))
    doc["rows"] = rows
    doc["summary"] = summarize(rows)
    doc["summary"]["check_failures"] = failures
    print_tables(rows, log)
    return finish(doc, out_json, log, plot)


def _row(rows, case, p):
    return next((r for r in rows if r["case"] == case and r["provider"] == p), None)


def _cases(rows):
    return [r["case"] for r in rows if r["provider"] == "tileattn-fp16"]


def _ratios(rows, num, den, where=lambda c: True):
    """num/den TFLOPS per case; a missing tileattn figure is a miss (None), a peer's refusal is skipped."""
    out = []
    for c in filter(where, _cases(rows)):
        a, b = _row(rows, c, num), _row(rows, c, den)
        if a is None or b is None or (b["tflops"] is None and not den.startswith("tileattn")):
            continue  # provider not run, or a peer without a figure
        out.append(a["tflops"] / b["tflops"] if a["tflops"] and b["tflops"] else None)
    return out


def _agg(f, xs):
    return None if not xs or None in xs else f(xs)


def _big(c):
    return c["D"] == 128 and c["N"] >= 4096


def _dense_grid(c):
    return c["D"] in (64, 128)


def summarize(rows):
    """fp8/fp16 ratios (min at D=128, N >= 4K; min at D=64 and at D=256, N >= 4K; geomean over the D 64 / 128
    grid), and fp8 against the peers (D 64 / 128)."""
    e4, f16 = "tileattn-e4m3", "tileattn-fp16"
    return {"fp8_vs_fp16_min_d128_n4k": _agg(min, _ratios(rows, e4, f16, _big)),
            "fp8_vs_fp16_min_d64": _agg(min, _ratios(rows, e4, f16, lambda c: c["D"] == 64 and c["N"] >= 4096)),
            "fp8_vs_fp16_min_d256": _agg(min, _ratios(rows, e4, f16, lambda c: c["D"] == 256 and c["N"] >= 4096)),
            "fp8_vs_fp16_geomean": _agg(geomean, _ratios(rows, e4, f16, _dense_grid)),
            "fp8_vrow_vs_fp16_min_d128_n4k": _agg(min, _ratios(rows, "tileattn-e4m3-vrow", f16, _big)),
            "fp8_vs_cudnn_fp16_geomean": _agg(geomean, _ratios(rows, e4, "cudnn-fp16", _dense_grid)),
            "e5m2_vs_fp16_geomean": _agg(geomean, _ratios(rows, "tileattn-e5m2", f16, _dense_grid)),
            "fp8_vs_flex_fp8_geomean": _agg(geomean, _ratios(rows, e4, "flex-e4m3", _dense_grid))}


def print_tables(rows, log=print):
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    w = {p: max(len(p), 7) for p in providers}
    for D, causal in sorted({(c["D"], c["causal"]) for c in _cases(rows)}):
        log(f"\nD={D} causal={causal}  TFLOPS (ratio = tileattn-e4m3 / tileattn-fp16)")
        log(f"{'N':>7} " + " ".join(f"{p:>{w[p]}}" for p in providers) + f" {'ratio':>7}")
        ratios = []
        for c in [c for c in _cases(rows) if c["D"] == D and c["causal"] == causal]:
            tf = {p: (_row(rows, c, p) or {}).get("tflops") for p in providers}  # (flex: D <= 128 only)
            e4, f16 = tf.get("tileattn-e4m3"), tf["tileattn-fp16"]
            ratio = e4 / f16 if e4 and f16 else None
            if ratio:
                ratios.append(ratio)
            log(f"{c['N']:>7} " + " ".join(f"{fmt(tf[p]):>{w[p]}}" for p in providers) +
                f" {fmt(ratio, '{:.2f}'):>7}")
        log(f"{'geomean':>7} " + " ".join(" " * w[p] for p in providers) +
            f" {fmt(geomean(ratios), '{:.3f}'):>7}")
