"""`tileattn bench mla`: MLA decode over a paged cache against the GPU's own read bandwidth.

No MLA peer runs on our image, so the yardstick is the read bandwidth of a large torch reduction measured in
the same run. Bytes and FLOPs by targets.md: bytes = 2 * (kv_tokens * (Dc + Dr) + B*Sq*Hq*(Dc + Dr) +
B*Sq*Hq*Dc), FLOPs = 2 * B * Sq * Hq * kv_len * (2 * Dc + Dr). Every case's output is checked against the
float32 reference (tolerance rule) before it is timed; plans are made outside the timed region (run only);
each time is the best of two do_bench medians (common.bench_rounds: one reading of a 0.3 ms case varies by
up to a quarter between runs). An fp8 cache counts 1 byte per cache value (q and out stay 16-bit).

Groups (`--groups`, default all): seed (batch 768, kv 1K/2K, Hq 16/32/64, page 64), page1 (the same, page 1),
long (batch 1-64, kv 8K/32K, Hq 64, Sq 1/2), hq128 (batch 128/768, kv 1K-8K, Hq 128), b128 (batch 128, kv 1K-8K,
Hq 16/32/64), fp8 (the seed, b128 and hq128 rows with e4m3 caches), qk_shard (the seed and hq128 rows on both
Hopper kernels, QK_SHARD on and off, forced). Summary keys: min_fraction_of_read_bw_seed_shapes,
hq128_min_tflops, b128_min_fraction_of_read_bw, fp8_cache_speedup_vs_bf16_geomean (bf16 ms / fp8 ms over the
fp8 group's rows), qk_shard_on_vs_off (geomean of off ms / on ms), check_failures.
"""
import contextlib
import dataclasses

import torch

from ..tolerance import allowed_error
from .common import Progress, bench_rounds, finish, fmt, geomean, read_bandwidth, results_header

DC, DR = 512, 64
SEED = [(768, kv, hq, 1) for kv in (1024, 2048) for hq in (16, 32, 64)]  # (batch, kv_len, Hq, Sq)
LONG = [(b, kv, 64, sq) for b in (1, 4, 16, 64) for kv in (8192, 32768) for sq in (1, 2)]
KV = (1024, 2048, 4096, 8192)
HQ128 = [(b, kv, 128, 1) for b in (128, 768) for kv in KV]  # all of DeepSeek-V3's heads on one GPU
B128 = [(128, kv, hq, 1) for kv in KV for hq in (16, 32, 64)]  # a small batch must still fill the GPU
GROUPS = ("seed", "page1", "long", "hq128", "b128", "fp8", "qk_shard")
FP8_SCALE = 0.05  # the fp8 rows' kv_scale (the cache holds values / 0.05)


def make_inputs(batch, kv_len, hq, sq, page_size, dtype, seed=0, cache_dtype=None):
    """q, shuffled pages and the block table of one case; cache_dtype: an fp8 cache (values / FP8_SCALE)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = -(-kv_len // page_size)
    num_pages = batch * pages_per
    ckv = torch.randn(num_pages, page_size, DC, device="cuda", dtype=dtype, generator=g)
    kpe = torch.randn(num_pages, page_size, DR, device="cuda", dtype=dtype, generator=g)
    if cache_dtype is not None:
        ckv, kpe = (ckv / FP8_SCALE).to(cache_dtype), (kpe / FP8_SCALE).to(cache_dtype)
    table = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32).view(batch, pages_per)
    seqlens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    qn = torch.randn(batch, sq, hq, DC, device="cuda", dtype=dtype, generator=g)
    qp = torch.randn(batch, sq, hq, DR, device="cuda", dtype=dtype, generator=g)
    return qn, qp, ckv, kpe, table, seqlens


def check(out, inputs, sample=32, kv_scale=1.0):
    """Tolerance rule on a sample of sequences (the reference loops over sequences in Python); inputs: what
    make_inputs returned."""
    from ..ops.mla.reference import mla_decode_ref
    qn, qp, ckv, kpe, table, seqlens = inputs
    idx = torch.linspace(0, qn.shape[0] - 1, min(sample, qn.shape[0]), device="cuda").long().unique()
    sub = ((qn[idx], qp[idx]), (ckv, kpe), table[idx], seqlens[idx])
    ref, _ = mla_decode_ref(*sub, kv_scale=kv_scale)
    ref_lp, _ = mla_decode_ref(*sub, dtype=qn.dtype, kv_scale=kv_scale)
    err = (out[idx].float() - ref).abs().max().item()
    tol = allowed_error((ref_lp.float() - ref).abs().max().item(), ref, qn.dtype)
    return bool(err <= tol and torch.isfinite(out).all()), {"err": err, "tol": tol}


def measure(shape, page, dt, cache_dtype=None, config=None):
    """One row: the case's output checked against the reference, then timed (None when the check fails).
    config: an MLA config forced on the plan (the qk_shard comparison)."""
    import tileattn
    batch, kv_len, hq, sq = shape
    case = {"batch": batch, "kv_len": kv_len, "Hq": hq, "Sq": sq, "page_size": page, "Dc": DC, "Dr": DR,
            "dtype": str(dt).split(".")[-1], "cache_dtype": str(cache_dtype or dt).split(".")[-1]}
    inputs = make_inputs(batch, kv_len, hq, sq, page, dt, cache_dtype=cache_dtype)
    qn, qp, ckv, kpe, table, seqlens = inputs
    ks = 1.0 if cache_dtype is None else FP8_SCALE
    with tileattn.force_backend(config=config) if config is not None else contextlib.nullcontext():
        plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, page_size=page, dtype=dt,
                                      cache_dtype=cache_dtype)
    out = plan.run(qn, qp, ckv, kpe, table, kv_scale=ks)
    ok, info = check(out, inputs, kv_scale=ks)
    row = {"case": case, "provider": "tileattn", "ms": None, "tflops": None, "gbps": None, "check": info,
           "plan": repr(plan)}
    if ok:
        ms = bench_rounds({"tileattn": lambda: plan.run(qn, qp, ckv, kpe, table, kv_scale=ks)})["tileattn"]
        elem = 1 if cache_dtype is not None else 2  # the cache's bytes per value (q and out stay 16-bit)
        nbytes = elem * batch * kv_len * (DC + DR) + 2 * (batch * sq * hq * (DC + DR) + batch * sq * hq * DC)
        flops = 2 * batch * sq * hq * kv_len * (2 * DC + DR)
        row.update(ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9, tflops=flops / (ms * 1e-3) / 1e12)
    return row


def cases(groups):
    """[(group, shape, page, cache dtype or None, forced config or None)] of the chosen groups, in order."""
    from ..ops.mla.configs import SM90_SHARD
    out = []
    if "seed" in groups:
        out += [("seed", c, 64, None, None) for c in SEED]
    if "page1" in groups:
        out += [("page1", c, 1, None, None) for c in SEED]
    if "long" in groups:
        out += [("long", c, 64, None, None) for c in LONG]
    if "hq128" in groups:
        out += [("hq128", c, 64, None, None) for c in HQ128]
    if "b128" in groups:
        out += [("b128", c, 64, None, None) for c in B128]
    if "fp8" in groups:  # the same rows as the bars' bf16 ones, the caches in e4m3
        out += [("fp8", c, 64, torch.float8_e4m3fn, None) for c in SEED + B128 + HQ128]
    if "qk_shard" in groups:  # the seed's comparison: both Hopper kernels forced on the seed and 128-head rows
        for c in SEED + HQ128:
            out += [("qk_shard", c, 64, None, cfg) for cfg in (SM90_SHARD,
                                                               dataclasses.replace(SM90_SHARD, qk_shard=False))]
    return out


def _key(row):
    c = row["case"]
    return (c["batch"], c["kv_len"], c["Hq"], c["Sq"], c["page_size"])


def summary(rows, bw, failures):
    """The issue's keys from the rows (each a min or geomean over the rows that ran)."""
    def group(name):
        return [r for r in rows if r["group"] == name]

    def frac(rs):
        vals = [r["gbps"] / bw if r["gbps"] else 0.0 for r in rs]
        return min(vals) if vals else None
    bf16 = {_key(r): r["ms"] for r in rows if r["group"] in ("seed", "b128", "hq128") and r["ms"]}
    fp8 = [bf16[_key(r)] / r["ms"] for r in group("fp8") if r["ms"] and _key(r) in bf16]
    shard = {}
    for r in group("qk_shard"):
        shard.setdefault(_key(r), {})[r["provider"]] = r["ms"]
    on_off = [v["tileattn qk_shard=off"] / v["tileattn qk_shard=on"] for v in shard.values()
              if v.get("tileattn qk_shard=on") and v.get("tileattn qk_shard=off")]
    seed = group("seed")
    hq128 = [r["tflops"] or 0.0 for r in group("hq128")]
    b16 = [r["gbps"] or 0.0 for r in group("long") if _key(r) == (16, 32768, 64, 1, 64)]
    return {
        "min_fraction_of_read_bw_seed_shapes": frac(seed),
        "min_gbps_seed_shapes": min(r["gbps"] or 0.0 for r in seed) if seed else None,
        "hq128_min_tflops": min(hq128) if hq128 else None,
        "b128_min_fraction_of_read_bw": frac(group("b128")),
        "fp8_cache_speedup_vs_bf16_geomean": geomean(fp8),
        "fp8_cache_speedup_vs_bf16_min": min(fp8) if fp8 else None,
        "qk_shard_on_vs_off": geomean(on_off),
        "gbps_b16_kv32k_hq64_sq1": b16[0] if b16 else None,
        "read_bandwidth_gbps": bw,
        "check_failures": failures,
    }


def run(dtype="bf16", out_json=None, plot=None, log=print, groups=GROUPS):
    """The chosen groups' rows (GROUPS: all); the summary keys of the groups that did not run are None."""
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    doc = results_header("mla")
    bw = read_bandwidth()
    log(f"read bandwidth (x.sum() over 1 GiB): {bw:.0f} GB/s")
    todo = cases(groups)
    progress = Progress(len(todo))
    rows, failures = [], 0
    log(f"{'group':>8} {'batch':>5} {'kv_len':>6} {'Hq':>3} {'Sq':>2} {'page':>4} {'cache':>5} {'kernel':>12} "
        f"{'ms':>8} {'GB/s':>6} {'of bw':>5} {'TFLOPS':>6}")
    for name, shape, page, cache_dtype, config in todo:
        row = measure(shape, page, dt, cache_dtype, config)
        row["group"] = name
        if config is not None:
            row["provider"] = f"tileattn qk_shard={'on' if config.qk_shard else 'off'}"
        if row["ms"] is None:
            failures += 1
            log(f"CHECK FAILED {row['case']} {row['provider']}: {row['check']}")
        else:
            row["fraction_of_read_bw"] = row["gbps"] / bw
        rows.append(row)
        kernel = row["provider"].split(" ")[-1] if config is not None else ""
        c = row["case"]
        log(f"{progress()}{name:>8} {c['batch']:5d} {c['kv_len']:6d} {c['Hq']:3d} {c['Sq']:2d} {page:4d} "
            f"{c['cache_dtype'][:5]:>5} {kernel:>12} {fmt(row['ms'], '{:.3f}'):>8} {fmt(row['gbps']):>6} "
            f"{fmt(row.get('fraction_of_read_bw'), '{:.2f}'):>5} {fmt(row['tflops']):>6}")
        torch.cuda.empty_cache()  # the case's tensors were freed on measure's return
    doc.update(read_bandwidth_gbps=bw, groups=list(groups), rows=rows)
    doc["summary"] = summary(rows, bw, failures)
    return finish(doc, out_json, log, plot)
