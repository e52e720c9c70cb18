"""`tileattn bench decode`: attention over a paged KV cache (KVCachePlan) against torch's SDPA and the GPU's
read bandwidth.

Grid (targets.md): bf16, D = 128, heads Hq 32 / Hkv 8, Hq 64 / Hkv 8 and MHA 32 / 32; batch 1, 8, 32, 64,
128; kv length 1K, 4K, 16K, 32K (every sequence that long); pages of 16 and 64 tokens in random, non-contiguous
block tables; q_len 1. Plus multi-token rows (q_len 4 and 16, page 16) and fp8 (e4m3) cache rows (page 16,
per-head scales). Cases whose cache passes CACHE_LIMIT bytes are left out (MHA at batch 128 x 32K would need
64 GB, twice with SDPA's copy).

Peers in the same run: torch SDPA on the same cache gathered into a contiguous [B, Hkv, kv, D] tensor, every
backend that runs (FLASH, EFFICIENT, cuDNN; with enable_gqa, or with K / V expanded to Hq heads where a
backend refuses it), the best time kept ("sdpa"). FlashInfer is not on the GPU image (no package registry
there). Bytes = cache bytes read + q + out; the fraction is of the read bandwidth of a 1 GiB torch reduction
measured in the same run.

Every tileattn row is checked against a float32 gather-and-SDPA reference (ops/decode/reference.py) on a sample
of sequences under the tolerance rule before it is timed; plans are made outside the timed region (run only).
Times: best of two do_bench medians (common.bench_rounds), L2 flushed before every call (do_bench).
"""
import torch

from ..tolerance import allowed_error
from .common import bench_rounds, finish, fmt, geomean, read_bandwidth, results_header

D = 128
HEADS = [(32, 8), (64, 8), (32, 32)]
BATCHES = [1, 8, 32, 64, 128]
KV_LENS = [1024, 4096, 16384, 32768]
PAGES = [16, 64]
CACHE_LIMIT = 24 << 30  # bytes of K + V
EXPAND_LIMIT = 16 << 30  # bytes of K + V expanded to Hq heads for an SDPA backend that refuses enable_gqa
MULTI = [(hq, hkv, b, kv, sq) for hq, hkv in HEADS[:2] for b in (1, 32, 128) for kv in (4096, 16384) for sq in (4, 16)]
FP8 = [(hq, hkv, b, kv) for hq, hkv in HEADS[:2] for b in (32, 128) for kv in (4096, 16384, 32768)]


def make_cache(batch, kv_len, hkv, page, dtype, seed=0):
    """(k_cache, v_cache, block_table, seqlens): random pages in a random order, every sequence kv_len long."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = -(-kv_len // page)
    num_pages = batch * pages_per
    k = torch.randn(num_pages, page, hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(num_pages, page, hkv, D, device="cuda", dtype=torch.bfloat16, generator=g)
    if dtype == torch.float8_e4m3fn:
        k, v = k.to(dtype), v.to(dtype)
    table = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32).view(batch, pages_per)
    seqlens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    return k, v, table, seqlens


def contiguous(cache, table, kv_len):
    """The paged cache gathered into [B, Hkv, kv_len, D] (SDPA's layout)."""
    B = table.shape[0]
    page = cache.shape[1]
    tok = torch.arange(kv_len, device="cuda")
    rows = cache[table[:, tok // page].long(), (tok % page)[None, :].expand(B, -1)]  # [B, kv, Hkv, D]
    return rows.transpose(1, 2).contiguous()


def sdpa_fns(q, k, v):
    """{backend: fn} of torch SDPA backends that run on q [B, Hq, Sq, D], k / v [B, Hkv, S, D] (decode, no mask)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    group = q.shape[1] // k.shape[1]
    fns = {}
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        for gqa in ((True, False) if group > 1 else (False,)):
            if not gqa and group > 1 and 2 * k.numel() * group * k.element_size() > EXPAND_LIMIT:
                continue
            kk, vv = (k, v) if gqa or group == 1 else (k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))

            def fn(be=be, kk=kk, vv=vv, gqa=gqa):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, kk, vv, enable_gqa=gqa)
            try:
                fn()
                torch.cuda.synchronize()
            except RuntimeError:
                continue
            fns[name] = fn
            break
    return fns


def check(out, q, k, v, table, seqlens, scales=None, sample=4):
    """Tolerance rule on a sample of sequences against the float32 reference (scales: k_scale / v_scale)."""
    from ..ops.decode.reference import kvcache_attention_ref
    idx = torch.linspace(0, q.shape[0] - 1, min(sample, q.shape[0]), device="cuda").long().unique()
    args = (q[idx], k, v, seqlens[idx], table[idx])
    ref, _ = kvcache_attention_ref(*args, **(scales or {}))
    ref_lp, _ = kvcache_attention_ref(*args, **(scales or {}), dtype=q.dtype)
    err = (out[idx].float() - ref).abs().max().item()
    tol = allowed_error((ref_lp.float() - ref).abs().max().item(), ref, q.dtype)
    return bool(err <= tol and torch.isfinite(out).all()), {"err": err, "tol": tol}


def _row(case, provider, ms, nbytes, bw):
    gbps = nbytes / (ms * 1e-3) / 1e9 if ms else None
    return {"case": case, "provider": provider, "ms": ms, "tflops": None, "gbps": gbps,
            "fraction_of_read_bw": gbps / bw if gbps else None}


def _nbytes(batch, kv_len, hq, hkv, sq, cache_bytes):
    return batch * kv_len * hkv * D * 2 * cache_bytes + 2 * batch * sq * hq * D * 2


def run(out_json=None, plot=None, log=print, quick=False):
    import tileattn
    doc = results_header("decode")
    bw = read_bandwidth()
    log(f"read bandwidth (x.sum() over 1 GiB): {bw:.0f} GB/s")
    rows, failures = [], 0
    log(f"{'Hq':>3} {'Hkv':>3} {'batch':>5} {'kv':>6} {'sq':>2} {'page':>4} {'cache':>5} {'ms':>8} {'GB/s':>6} "
        f"{'of bw':>5} {'sdpa ms':>8} {'vs sdpa':>7} {'sdpa best':>10}")
    cases = [(hq, hkv, b, kv, 1, torch.bfloat16) for hq, hkv in HEADS for b in BATCHES for kv in KV_LENS]
    cases += [(hq, hkv, b, kv, sq, torch.bfloat16) for hq, hkv, b, kv, sq in MULTI]
    cases += [(hq, hkv, b, kv, 1, torch.float8_e4m3fn) for hq, hkv, b, kv in FP8]
    if quick:
        cases = [c for c in cases if c[2] in (1, 32) and c[3] in (4096, 32768)]
    for hq, hkv, batch, kv_len, sq, cdt in cases:
        cache_bytes = cdt.itemsize
        if batch * kv_len * hkv * D * 2 * cache_bytes > CACHE_LIMIT:
            continue
        pages = PAGES if sq == 1 and cdt == torch.bfloat16 else [16]
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(batch, sq, hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
        sdpa_ms, sdpa_best, kc, vc = None, None, None, None
        for page in pages:
            case = {"Hq": hq, "Hkv": hkv, "batch": batch, "kv_len": kv_len, "q_len": sq, "page_size": page, "D": D,
                    "dtype": "bfloat16", "cache_dtype": str(cdt).split(".")[-1]}
            k, v, table, seqlens = make_cache(batch, kv_len, hkv, page, cdt)
            scales = {}
            if cdt == torch.float8_e4m3fn:  # per-head scales: cache values times them are the keys / values
                scales = {"k_scale": torch.linspace(0.5, 1.5, hkv, device="cuda"),
                          "v_scale": torch.linspace(1.5, 0.5, hkv, device="cuda")}
            plan = tileattn.KVCachePlan(seqlens, num_heads=hq, num_kv_heads=hkv, head_dim=D, page_size=page, q_len=sq,
                                        dtype=torch.bfloat16, cache_dtype=cdt)
            out = plan.run(q, k, v, table, **scales)
            ok, info = check(out, q, k, v, table, seqlens, scales)
            nbytes = _nbytes(batch, kv_len, hq, hkv, sq, cache_bytes)
            fns = {"tileattn": lambda: plan.run(q, k, v, table, **scales)}
            if sq == 1 and cdt == torch.bfloat16 and sdpa_ms is None:
                kc, vc = contiguous(k, table, kv_len), contiguous(v, table, kv_len)
                peers = sdpa_fns(q.transpose(1, 2), kc, vc)
            else:
                peers = {}
            if not ok:
                failures += 1
                log(f"CHECK FAILED {case}: {info}")
                row = _row(case, "tileattn", None, nbytes, bw)
            else:
                times = bench_rounds({**fns, **peers})
                row = _row(case, "tileattn", times["tileattn"], nbytes, bw)
                if peers:
                    sdpa_best = min(peers, key=times.get)
                    sdpa_ms = times[sdpa_best]
                    for p in peers:
                        prow = _row(case, f"sdpa-{p}", times[p], nbytes, bw)
                        rows.append(prow)
            row.update(check=info, plan=repr(plan))
            if sdpa_ms is not None and row["ms"]:
                row["vs_best_sdpa"] = sdpa_ms / row["ms"]
                row["best_sdpa"] = sdpa_best
            rows.append(row)
            log(f"{hq:3d} {hkv:3d} {batch:5d} {kv_len:6d} {sq:2d} {page:4d} {case['cache_dtype'][:5]:>5} "
                f"{fmt(row['ms'], '{:.4f}'):>8} {fmt(row['gbps']):>6} {fmt(row['fraction_of_read_bw'], '{:.2f}'):>5} "
                f"{fmt(sdpa_ms, '{:.4f}'):>8} {fmt(row.get('vs_best_sdpa'), '{:.2f}'):>7} {sdpa_best or '-':>10}")
            k = v = table = seqlens = plan = out = None  # frees the GPU memory now
            peers = kc = vc = None
            torch.cuda.empty_cache()
    doc.update(read_bandwidth_gbps=bw, rows=rows)
    doc["summary"] = summarize(rows, failures, bw)
    return finish(doc, out_json, log, plot)


def summarize(rows, failures, bw):
    """The summary keys of issue 21 from the rows (tileattn's only)."""
    ours = [r for r in rows if r["provider"] == "tileattn"]

    def sel(q_lens, cache="bfloat16", big=False):
        return [r for r in ours if r["case"]["q_len"] in q_lens and r["case"]["cache_dtype"] == cache
                and (not big or (r["case"]["batch"] >= 32 and r["case"]["kv_len"] >= 4096))]
    single = sel((1,))
    big = sel((1,), big=True)
    multi = sel((4, 16), big=True)
    bf16 = {tuple(sorted((k, v) for k, v in r["case"].items() if k != "cache_dtype")): r for r in single}
    speedups = []
    for r in sel((1,), cache="float8_e4m3fn"):
        twin = bf16.get(tuple(sorted((k, v) for k, v in r["case"].items() if k != "cache_dtype")))
        if twin and twin["ms"] and r["ms"]:
            speedups.append(twin["ms"] / r["ms"])
    vs = [r.get("vs_best_sdpa") or 0.0 for r in single]

    def lowest(rs, key):
        vals = [r.get(key) or 0.0 for r in rs]
        return min(vals) if vals else None
    return {
        "min_fraction_of_read_bw_b32plus": lowest(big, "fraction_of_read_bw"),
        "min_vs_best_sdpa": min(vs) if vs else None,
        "geomean_vs_best_sdpa": geomean(vs),
        "multi_token_min_fraction_of_read_bw": lowest(multi, "fraction_of_read_bw"),
        "fp8_cache_speedup_vs_bf16_geomean": geomean(speedups),
        "read_bandwidth_gbps": bw,
        "check_failures": failures,
    }
