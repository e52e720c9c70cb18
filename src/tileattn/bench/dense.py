"""`tileattn bench dense`: the dense forward grid against torch's SDPA backends and flex_attention.

Grid (targets.md): B=4, H=32, D in {64, 128}, causal F/T, N in 1K..16K (32K, 64K with --long), fp16 by
default. Every provider gets the same values in its own native layout: tileattn [B, S, H, D], the torch
peers [B, H, S, D]. Before timing, tileattn's output is checked against cuDNN's output of the same inputs and
against a float32 reference on a slice (batch 0, two heads; past 16K the last 1024 query rows, which see every
key they see in the whole problem) under the tolerance rule; a case that fails is reported and gets no
throughput.

The persistent-kernel seed's grid (mission.md, S0) adds S0_PROVIDERS (`--long` takes them by default): the
Hopper kernel forced to one CTA per SM (`tileattn-persistent`) and to one CTA per tile (`tileattn-1cta`), whose
comparison chose the table's grid per shape (`tileattn`: Sm90Config.one_cta_from), and fp8 inputs (`tileattn-e4m3`,
`tileattn-e5m2`: the fp16 values quantized per (batch, head), V in fp8_v_layout made once, untimed; checked as
in the fp8 suite: fp8_check.py).

The 2-CTA cluster kernel (issue 23's S3; `--cluster`, or by default where it can run: triton 3.9 on Hopper) adds, at
D = 128, CLUSTER_PROVIDERS: the Hopper kernel forced with its table config (`tileattn-sm90`, the kernel dispatch
takes without the cluster) and the cluster kernel forced (`tileattn-cluster`), each checked against cuDNN as the
other rows; their rows carry the triton version that ran them. The cluster kernel needs triton 3.9 and the main
grid is measured under 3.6: `--cluster --append dense.json` adds the cluster rows to a 3.6 file (summarize_cluster).
"""
import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from ..ops.dense.reference import attention_ref
from ..tolerance import allowed_error, rounding_floor
from .common import (
    NOT_TIMED,
    Progress,
    attn_tflops,
    do_bench,
    error_text,
    finish,
    fmt,
    geomean,
    max_abs,
    results_header,
)

PROVIDERS = ("tileattn", "cudnn", "fa2", "flex")
S0_PROVIDERS = PROVIDERS + ("tileattn-persistent", "tileattn-1cta", "tileattn-e4m3", "tileattn-e5m2")
GRIDS = {"tileattn-persistent": dict(persistent=True, one_cta_from=0), "tileattn-1cta": dict(persistent=False)}
CLUSTER_BACKENDS = {"tileattn-sm90": "dense.sm90", "tileattn-cluster": "dense.sm90_cluster"}  # forced, by provider
CLUSTER_PROVIDERS = tuple(CLUSTER_BACKENDS)
CLUSTER_D = 128  # the only head dim the cluster kernel serves
CHECK_ROWS = 1024  # query rows checked past 16K (the float32 reference of a whole 64K slice needs 34 GB)
ROUNDS = 2
DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def sdpa(backend):
    """fn(q, k, v, causal) running torch's SDPA on one backend ("cudnn", "fa2", "efficient", "math"),
    [B, H, S, D]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION,
          "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]

    def fn(q, k, v, causal):
        with sdpa_kernel(be):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return fn


_flex_compiled = None


def _flex(q, k, v, causal, N):
    global _flex_compiled
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex_compiled is None:
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    mask = None
    if causal:
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, N, N, device=q.device)
    return lambda: _flex_compiled(q, k, v, block_mask=mask)


def check_rows(n):
    """The query rows the checks compare: all of them up to 16K, else the last CHECK_ROWS (with the bottom-right
    alignment of attention_ref they see exactly the keys they see in the whole problem)."""
    return slice(0, n) if n <= 16384 else slice(n - CHECK_ROWS, n)


def check_case(out_bshd, cudnn_bhsd, q, k, v, causal):
    """Tolerance rule on a slice (batch 0, heads 0-1, check_rows) against float32, plus agreement with cuDNN."""
    sl, rows = slice(0, 2), check_rows(q.shape[2])
    qs = q[:1, sl, rows].transpose(1, 2)
    ks, vs = (t[:1, sl].transpose(1, 2) for t in (k, v))  # [1, N, 2, D]
    ref, _ = attention_ref(qs, ks, vs, causal=causal)
    ours = out_bshd[:1, rows, sl]
    theirs = cudnn_bhsd[:1, sl, rows].transpose(1, 2)
    err = max_abs(ours, ref)
    err_cudnn = max_abs(theirs, ref)
    atol = rounding_floor(ref, q.dtype)
    finite = bool(torch.isfinite(out_bshd).all())
    diff_full = max_abs(out_bshd.transpose(1, 2), cudnn_bhsd)
    # cuDNN's own error stands in for the input-precision error of the rule
    ok = (finite and err <= allowed_error(err_cudnn, ref, q.dtype)
          and diff_full <= 4 * (err_cudnn + atol) + 1e-3)
    return ok, {"err_vs_fp32": err, "cudnn_err_vs_fp32": err_cudnn, "max_diff_vs_cudnn": diff_full,
                "finite": finite}


@dataclass(frozen=True)
class Grid:
    """The dense suite's grid (targets.md): fp16 (or bf16), D 64 / 128, causal and not, N 1K-16K (32K, 64K with
    long; B shrinks past 16K so that B * N stays constant), B=4, H=32."""
    dtype: str = "fp16"
    long: bool = False
    providers: tuple = PROVIDERS
    head_dims: tuple = (64, 128)
    seqlens: tuple = None
    batch: int = 4
    heads: int = 32


def _s0_providers(providers, qt, kt, vt, causal, dt, D):
    """The S0 providers asked for: ({provider: fn}, {provider: (ok, info)}, {provider: context to time it in})."""
    import tileattn

    from ..ops.common.backend import force_backend
    from ..ops.common.configs import sm90_dense_config
    from . import fp8_check
    fns, checks, contexts = {}, {}, {}
    rows = check_rows(qt.shape[1])
    for p, fields in GRIDS.items():
        if p in providers:  # (the S0 grid's columns force their grid on the shipped per-shape config)
            table = sm90_dense_config(D, dt, qt.shape[1], causal)
            fns[p] = lambda: tileattn.attention(qt, kt, vt, causal=causal)
            contexts[p] = (lambda cfg: lambda: force_backend("dense.sm90", config=cfg))(
                dataclasses.replace(table, **fields))
    for name in fp8_check.FP8:
        if f"tileattn-{name}" not in providers:
            continue
        q8, k8, v8, descales, ref, tol = fp8_check.quantized(qt, kt, vt, name, causal, rows)
        fn = fns[f"tileattn-{name}"] = fp8_check.call(q8, k8, tileattn.fp8_v_layout(v8), descales, causal)  # V once
        checks[f"tileattn-{name}"] = fp8_check.check(fn, ref, tol, rows)
    return fns, checks, contexts


def cluster_reason():
    """Why the cluster kernel cannot run here ("" when it can: a Hopper GPU, triton 3.9)."""
    from ..ops.common.tma import gluon_sm90_reason
    from ..ops.dense.launch_cluster_sm90 import triton_reason
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return triton_reason() or gluon_sm90_reason(torch.device("cuda"))


def cluster_available():
    """Whether the cluster kernel can run here (cluster_reason): the default grid then adds its rows."""
    return not cluster_reason()


def _cluster_providers(providers, qt, kt, vt, causal):
    """The cluster providers asked for: ({provider: fn}, {provider: context that forces its backend})."""
    import tileattn

    from ..ops.common.backend import force_backend
    fns, contexts = {}, {}
    for p, name in CLUSTER_BACKENDS.items():
        if p in providers:
            fns[p] = lambda: tileattn.attention(qt, kt, vt, causal=causal)
            contexts[p] = (lambda name: lambda: force_backend(name))(name)
    return fns, contexts


def run(grid=Grid(), out_json=None, plot=None, log=print, append=None):
    """The grid's rows; append: a results file whose rows this run's are added to (rows of the same case and
    provider replaced), its summary recomputed over both (a partial rerun, e.g. `--long --seqlens 32768,65536`)."""
    import triton

    import tileattn
    dt = DTYPES[grid.dtype]
    old = _load_appended(append, dt) if append else None  # read first: a bad file fails before the GPU work
    providers, head_dims, batch, heads = grid.providers, grid.head_dims, grid.batch, grid.heads
    Ns = grid.seqlens or ([1024, 2048, 4096, 8192, 16384] + ([32768, 65536] if grid.long else []))
    doc = results_header("dense")
    rows, failures = [], []
    progress = Progress(len(head_dims) * 2 * len(Ns))
    for D in head_dims:
        for causal in (False, True):
            for N in Ns:
                B, H = batch, heads
                # long contexts: keep memory bounded, same work per token (B*N constant past 16K)
                if N > 16384:
                    B = max(1, batch * 16384 // N)
                case = {"B": B, "H": H, "N": N, "D": D, "causal": causal, "dtype": str(dt).split(".")[-1]}
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # tileattn's layout
                cudnn_out = sdpa("cudnn")(q, k, v, causal)
                ours = tileattn.attention(qt, kt, vt, causal=causal)
                checks = {"tileattn": check_case(ours, cudnn_out, q, k, v, causal)}
                fns = {
                    "tileattn": lambda: tileattn.attention(qt, kt, vt, causal=causal),
                    "cudnn": lambda: sdpa("cudnn")(q, k, v, causal),
                    "fa2": lambda: sdpa("fa2")(q, k, v, causal),
                }
                s0_fns, s0_checks, contexts = _s0_providers(providers, qt, kt, vt, causal, dt, D)
                fns.update(s0_fns)
                checks.update(s0_checks)
                case_providers = [p for p in providers if p not in CLUSTER_PROVIDERS or D == CLUSTER_D]
                cluster_fns, cluster_contexts = _cluster_providers(case_providers, qt, kt, vt, causal)
                fns.update(cluster_fns)
                contexts.update(cluster_contexts)
                errors = {}
                for p in contexts:  # the forced providers' outputs, checked as tileattn's
                    try:
                        with contexts[p]():
                            out = fns[p]()
                    except Exception as e:  # noqa: BLE001 - not served here (no Hopper kernel): an error row
                        errors[p] = error_text(e)
                        continue
                    checks[p] = check_case(out, cudnn_out, q, k, v, causal)
                    out = None
                ours = cudnn_out = None  # frees the GPU memory now
                for p, (ok, info) in checks.items():
                    if not ok:
                        failures.append((case, p, info))
                        log(f"CHECK FAILED {p} {case}: {info}")
                # providers interleaved over rounds, best median kept: slow drift of the clocks (seen on a
                # thermally throttled machine) then cannot favour whichever provider ran first
                times = {p: [] for p in case_providers}
                for _ in range(ROUNDS):
                    for p in case_providers:
                        if p in errors:
                            continue
                        try:
                            if p in checks and not checks[p][0]:
                                raise RuntimeError(NOT_TIMED)
                            fn = _flex(q, k, v, causal, N) if p == "flex" else fns[p]
                            with contexts.get(p, contextlib.nullcontext)():
                                times[p].append(do_bench(fn))
                        except Exception as e:  # noqa: BLE001 - a peer that refuses a shape is reported, not fatal
                            errors[p] = error_text(e)
                for p in case_providers:
                    ms = min(times[p]) if times[p] and p not in errors else None
                    row = {"case": case, "provider": p, "ms": ms,
                           "tflops": attn_tflops(B, H, N, N, D, D, causal, ms) if ms else None, "gbps": None}
                    if p in checks:
                        row["check"] = checks[p][1]
                    if p in errors:
                        row["error"] = errors[p]
                    if p in CLUSTER_PROVIDERS:  # (measured under another triton than the main grid, as a rule)
                        row["triton"] = triton.__version__
                    rows.append(row)
                q = k = v = qt = kt = vt = fns = s0_fns = cluster_fns = None  # frees the GPU memory now
                torch.cuda.empty_cache()
                _print_row(rows, case, lambda line: log(progress() + line.lstrip()))
    if old is not None:
        log(f"appended {len(rows)} rows to the rows of {append} ({old.get('commit')})")
        rows, kept_failures = _merge(old, rows, doc)
        failures += kept_failures
    doc["rows"] = rows
    doc["summary"] = summarize(rows)
    doc["summary"]["check_failures"] = len(failures)
    print_tables(rows, log)
    print_cluster_table(doc["summary"], log)
    finish(doc, out_json, log)
    if plot:
        plot_rows(rows, plot)
    return doc


def _load_appended(path, dt):
    """The dense results file at path, checked to be of this suite and dtype (ValueError otherwise)."""
    import json
    with open(path) as f:
        old = json.load(f)
    dtypes = {r["case"]["dtype"] for r in old.get("rows", [])}
    if old.get("suite") != "dense" or dtypes - {str(dt).split(".")[-1]}:
        raise ValueError(f"--append {path}: not a dense {dt} results file (suite {old.get('suite')}, {dtypes})")
    return old


def _merge(old, rows, doc):
    """(the old file's rows with this run's added, rows of the same case and provider replaced, ordered by case;
    the kept rows' failed checks). doc records the files appended to (`appended_to`, oldest first)."""
    new = {(tuple(sorted(r["case"].items())), r["provider"]) for r in rows}
    kept = [r for r in old["rows"] if (tuple(sorted(r["case"].items())), r["provider"]) not in new]
    doc["appended_to"] = old.get("appended_to", []) + [{k: old.get(k) for k in ("commit", "date", "triton")}]
    order = {p: i for i, p in enumerate(S0_PROVIDERS + CLUSTER_PROVIDERS)}
    merged = sorted(kept + rows, key=lambda r: (r["case"]["D"], r["case"]["causal"], r["case"]["N"],
                                                order.get(r["provider"], len(order))))
    return merged, [(r["case"], r["provider"]) for r in kept if r.get("error") == NOT_TIMED]


def _tf(rows, case, p):
    for r in rows:
        if r["case"] == case and r["provider"] == p:
            return r["tflops"]
    return None


def _print_row(rows, case, log):
    got = {r["provider"]: r["tflops"] for r in rows if r["case"] == case}
    log(f"  D={case['D']:<4} causal={int(case['causal'])} N={case['N']:<6} " +
        " ".join(f"{p}={fmt(t)}" for p, t in got.items()))


def summarize(rows):
    """geomean of tileattn/cuDNN and min of tileattn/FA2 over the fp16/bf16 grid N 1K-16K."""
    cases = [r["case"] for r in rows if r["provider"] == "tileattn" and r["case"]["N"] <= 16384]
    vs_cudnn, vs_fa2, vs_flex = [], [], []
    for c in cases:
        t, cd, fa, fx = (_tf(rows, c, p) for p in PROVIDERS)
        if t is None:
            vs_cudnn.append(0.0)  # an unchecked or failed row counts as a miss
            vs_fa2.append(0.0)
            continue
        if cd:
            vs_cudnn.append(t / cd)
        if fa:
            vs_fa2.append(t / fa)
        if fx:
            vs_flex.append(t / fx)
    out = {"geomean_vs_cudnn": None if 0.0 in vs_cudnn else geomean(vs_cudnn),
           "min_vs_fa2": min(vs_fa2) if vs_fa2 else None,
           "geomean_vs_fa2": geomean(vs_fa2), "geomean_vs_flex": geomean(vs_flex),
           "min_vs_cudnn": min(vs_cudnn) if vs_cudnn else None}
    out.update(summarize_s0(rows))
    out.update(summarize_cluster(rows))
    return out


def _ratio_list(rows, num, den, where):
    """num/den TFLOPS over the cases (where) that ran both providers; a failed num row counts as 0."""
    out = []
    for c in [r["case"] for r in rows if r["provider"] == den and where(r["case"])]:
        a, b = next((r for r in rows if r["case"] == c and r["provider"] == num), None), _tf(rows, c, den)
        if a is not None and b:
            out.append((a["tflops"] or 0.0) / b)
    return out


def summarize_s0(rows):
    """The S0 rows' keys, where the rows exist: N = 32K / 64K against cuDNN, fp8 there against our fp16 (each on
    its own table's grid: fp16 takes one CTA per tile at long N where Sm90Config.one_cta_from says, fp8 stays
    persistent), and the persistent grid against one CTA per tile on every shape that ran both (the choice per
    shape: dense.md)."""
    def long(c):
        return c["N"] > 16384
    keys = {"long_min_vs_cudnn": _ratio_list(rows, "tileattn", "cudnn", long),
            "long_e4m3_vs_fp16_min": _ratio_list(rows, "tileattn-e4m3", "tileattn", long),
            "long_e5m2_vs_fp16_min": _ratio_list(rows, "tileattn-e5m2", "tileattn", long),
            "persistent_vs_one_cta_min": _ratio_list(rows, "tileattn-persistent", "tileattn-1cta", lambda c: True)}
    out = {k: min(v) for k, v in keys.items() if v}
    pers = keys["persistent_vs_one_cta_min"]
    if pers:
        out["persistent_vs_one_cta_max"] = max(pers)
        out["persistent_vs_one_cta_geomean"] = None if 0.0 in pers else geomean(pers)
    return out


def summarize_cluster(rows):
    """The cluster rows' keys, where they exist: cluster_rows, per shape that ran both CLUSTER_PROVIDERS, their
    TFLOPS, the ratio cluster / 1-CTA (a failed or refused cluster row counts as 0) and whether dispatch takes the
    cluster there (`kept`: configs.cluster_from); over the kept shapes, cluster_vs_one_cta_best (max of the ratio)
    and cluster_vs_one_cta_min."""
    from ..ops.dense.configs import cluster_from
    table = []
    for r in rows:
        if r["provider"] != "tileattn-sm90" or not r["tflops"]:
            continue
        c = r["case"]
        cl = next((x for x in rows if x["case"] == c and x["provider"] == "tileattn-cluster"), None)
        if cl is None:
            continue
        start = cluster_from(c["causal"])
        table.append({"D": c["D"], "causal": c["causal"], "N": c["N"], "one_cta": r["tflops"],
                      "cluster": cl["tflops"], "ratio": (cl["tflops"] or 0.0) / r["tflops"],
                      "kept": c["D"] == CLUSTER_D and start is not None and c["N"] >= start,
                      "triton": cl.get("triton")})
    if not table:
        return {}
    out = {"cluster_rows": table}
    kept = [t["ratio"] for t in table if t["kept"]]
    if kept:
        out["cluster_vs_one_cta_best"], out["cluster_vs_one_cta_min"] = max(kept), min(kept)
    return out


def print_cluster_table(summary, log=print):
    """The cluster rows of a summary (summarize_cluster), one line per shape."""
    table = summary.get("cluster_rows")
    if not table:
        return
    log(f"\nthe 2-CTA cluster kernel against the 1-CTA kernel (triton {table[0]['triton']}), TFLOPS")
    log(f"{'D':>4} {'causal':>6} {'N':>7} {'1-CTA':>7} {'cluster':>7} {'ratio':>6}  dispatch")
    for t in table:
        log(f"{t['D']:>4} {int(t['causal']):>6} {t['N']:>7} {fmt(t['one_cta']):>7} {fmt(t['cluster']):>7} "
            f"{t['ratio']:>6.3f}  {'cluster' if t['kept'] else '1-CTA'}")


def print_tables(rows, log=print):
    keys = sorted({(r["case"]["D"], r["case"]["causal"]) for r in rows if r["provider"] == "tileattn"})
    extra = [p for p in S0_PROVIDERS[len(PROVIDERS):] if any(r["provider"] == p for r in rows)]
    w = max([len(p) for p in extra] + [0])
    for D, causal in keys:
        log(f"\nD={D} causal={causal}  TFLOPS (ratio = tileattn / cudnn)")
        log(f"{'N':>7} {'tileattn':>9} {'cudnn':>7} {'fa2':>7} {'flex':>7} {'ratio':>7} {'vs fa2':>7}" +
            "".join(f" {p:>{w}}" for p in extra))
        ratios = []
        for c in [r["case"] for r in rows if r["provider"] == "tileattn" and r["case"]["D"] == D
                  and r["case"]["causal"] == causal]:
            t, cd, fa, fx = (_tf(rows, c, p) for p in PROVIDERS)
            ratio = t / cd if t and cd else None
            if ratio:
                ratios.append(ratio)
            log(f"{c['N']:>7} {fmt(t):>9} {fmt(cd):>7} {fmt(fa):>7} {fmt(fx):>7} {fmt(ratio, '{:.2f}'):>7} "
                f"{fmt(t / fa if t and fa else None, '{:.2f}'):>7}" +
                "".join(f" {fmt(_tf(rows, c, p)):>{w}}" for p in extra))
        log(f"{'geomean':>7} {'':>9} {'':>7} {'':>7} {'':>7} {fmt(geomean(ratios), '{:.3f}'):>7}")


def plot_rows(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    keys = sorted({(r["case"]["D"], r["case"]["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False)
    for ax, (D, causal) in zip(axes[0], keys):
        for p in PROVIDERS:
            pts = [(r["case"]["N"], r["tflops"]) for r in rows if r["provider"] == p and r["tflops"]
                   and r["case"]["D"] == D and r["case"]["causal"] == causal]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={D} {'causal' if causal else 'full'}")
        ax.set_xlabel("N")
        ax.set_ylabel("TFLOPS")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cpu_demo(log=print):
    """`tileattn bench demo`: the kernel on small shapes against the float32 reference, its errors printed. On
    a CUDA GPU it runs there; else through the Triton interpreter (the caller sets TRITON_INTERPRET=1 before
    triton is imported)."""
    import tileattn
    device = "cuda" if torch.cuda.is_available() else "cpu"
    where = "on " + torch.cuda.get_device_name() if device == "cuda" else \
        "through the Triton interpreter (no CUDA GPU found)"
    log(f"A small correctness demo of tileattn's kernels {where}: float16 against the float32 reference.\n")
    log(f"{'case':<42} {'max|out-ref|':>13} {'torch fp16 err':>15} {'ok':>4}")
    cases = [(2, 64, 64, 4, 4, 64, False, (-1, -1), 0.0), (1, 100, 100, 4, 1, 64, True, (-1, -1), 0.0),
             (1, 37, 90, 8, 2, 128, True, (-1, -1), 0.0), (1, 80, 80, 2, 2, 96, False, (16, 16), 0.0),
             (1, 50, 50, 2, 2, 64, True, (-1, -1), 30.0)]
    all_ok = True
    for B, Sq, Sk, Hq, Hkv, D, causal, window, softcap in cases:
        q, k, v = (torch.randn(B, s, h, D, device=device).half() for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
        kw = dict(causal=causal, window=window, softcap=softcap)
        out = tileattn.attention(q, k, v, **kw)
        ref, _ = attention_ref(q, k, v, **kw)
        ref_lp, _ = attention_ref(q, k, v, dtype=torch.float16, **kw)
        err, err_lp = max_abs(out, ref), max_abs(ref_lp, ref)
        ok = err <= allowed_error(err_lp, ref, torch.float16)
        all_ok &= ok
        name = f"B{B} Sq{Sq} Sk{Sk} H{Hq}/{Hkv} D{D}" + (" causal" if causal else "") + \
               (f" win{window}" if window != (-1, -1) else "") + (f" cap{softcap:g}" if softcap else "")
        log(f"{name:<42} {err:>13.2e} {err_lp:>15.2e} {'yes' if ok else 'NO':>4}")
    log("\nall within the tolerance rule" if all_ok else "\nSOME CASES FAILED")
    return all_ok
