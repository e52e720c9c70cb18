"""`tileattn bench mla`: MLA decode over a paged cache against the GPU's own read bandwidth.

No MLA peer runs on our image, so the yardstick is the read bandwidth of a large torch reduction measured in
the same run. Bytes and FLOPs by targets.md: bytes = 2 * (kv_tokens * (Dc + Dr) + B*Sq*Hq*(Dc + Dr) +
B*Sq*Hq*Dc), FLOPs = 2 * B * Sq * Hq * kv_len * (2 * Dc + Dr). Every case's output is checked against the
float32 reference (tolerance rule) before it is timed; plans are made outside the timed region (run only);
each time is the best of two do_bench medians (common.bench_rounds: one reading of a 0.3 ms case varies by
up to a quarter between runs).
"""
import torch

from ..tolerance import allowed_error
from .common import bench_rounds, finish, fmt, read_bandwidth, results_header

DC, DR = 512, 64
SEED = [(768, kv, hq, 1) for kv in (1024, 2048) for hq in (16, 32, 64)]  # (batch, kv_len, Hq, Sq)
LONG = [(b, kv, 64, sq) for b in (1, 4, 16, 64) for kv in (8192, 32768) for sq in (1, 2)]


def make_inputs(batch, kv_len, hq, sq, page_size, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = -(-kv_len // page_size)
    num_pages = batch * pages_per
    ckv = torch.randn(num_pages, page_size, DC, device="cuda", dtype=dtype, generator=g)
    kpe = torch.randn(num_pages, page_size, DR, device="cuda", dtype=dtype, generator=g)
    table = torch.randperm(num_pages, device="cuda", generator=g).to(torch.int32).view(batch, pages_per)
    seqlens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    qn = torch.randn(batch, sq, hq, DC, device="cuda", dtype=dtype, generator=g)
    qp = torch.randn(batch, sq, hq, DR, device="cuda", dtype=dtype, generator=g)
    return qn, qp, ckv, kpe, table, seqlens


def check(out, qn, qp, ckv, kpe, table, seqlens, sample=32):
    """Tolerance rule on a sample of sequences (the reference loops over sequences in Python)."""
    from ..ops.mla.reference import mla_decode_ref
    idx = torch.linspace(0, qn.shape[0] - 1, min(sample, qn.shape[0]), device="cuda").long().unique()
    sub = ((qn[idx], qp[idx]), (ckv, kpe), table[idx], seqlens[idx])
    ref, _ = mla_decode_ref(*sub)
    ref_lp, _ = mla_decode_ref(*sub, dtype=qn.dtype)
    err = (out[idx].float() - ref).abs().max().item()
    tol = allowed_error((ref_lp.float() - ref).abs().max().item(), ref, qn.dtype)
    return bool(err <= tol and torch.isfinite(out).all()), {"err": err, "tol": tol}


def run(dtype="bf16", out_json=None, plot=None, log=print, cases=None):
    import tileattn
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    doc = results_header("mla")
    bw = read_bandwidth()
    log(f"read bandwidth (x.sum() over 1 GiB): {bw:.0f} GB/s")
    cases = cases or [(c, 64) for c in SEED] + [(c, 1) for c in SEED] + [(c, 64) for c in LONG]
    rows, failures = [], 0
    log(f"{'batch':>5} {'kv_len':>6} {'Hq':>3} {'Sq':>2} {'page':>4} {'ms':>8} {'GB/s':>6} {'of bw':>5} {'TFLOPS':>6}")
    for (batch, kv_len, hq, sq), page in cases:
        case = {"batch": batch, "kv_len": kv_len, "Hq": hq, "Sq": sq, "page_size": page, "Dc": DC, "Dr": DR,
                "dtype": str(dt).split(".")[-1]}
        qn, qp, ckv, kpe, table, seqlens = make_inputs(batch, kv_len, hq, sq, page, dt)
        plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, page_size=page, dtype=dt)
        out = plan.run(qn, qp, ckv, kpe, table)
        ok, info = check(out, qn, qp, ckv, kpe, table, seqlens)
        row = {"case": case, "provider": "tileattn", "ms": None, "tflops": None, "gbps": None, "check": info,
               "plan": repr(plan)}
        if ok:
            ms = bench_rounds({"tileattn": lambda: plan.run(qn, qp, ckv, kpe, table)})["tileattn"]
            nbytes = 2 * (batch * kv_len * (DC + DR) + batch * sq * hq * (DC + DR) + batch * sq * hq * DC)
            flops = 2 * batch * sq * hq * kv_len * (2 * DC + DR)
            row.update(ms=ms, gbps=nbytes / (ms * 1e-3) / 1e9, tflops=flops / (ms * 1e-3) / 1e12)
            row["fraction_of_read_bw"] = row["gbps"] / bw
        else:
            failures += 1
            log(f"CHECK FAILED {case}: {info}")
        rows.append(row)
        log(f"{batch:5d} {kv_len:6d} {hq:3d} {sq:2d} {page:4d} {fmt(row['ms'], '{:.3f}'):>8} "
            f"{fmt(row['gbps']):>6} {fmt(row.get('fraction_of_read_bw'), '{:.2f}'):>5} {fmt(row['tflops']):>6}")
        qn = qp = ckv = kpe = table = seqlens = plan = out = None  # frees the GPU memory now
        torch.cuda.empty_cache()
    seed = [r for r in rows if r["case"]["batch"] == 768 and r["case"]["page_size"] == 64]
    seed_gbps = [r["gbps"] or 0.0 for r in seed]
    b16 = [r["gbps"] or 0.0 for r in rows if (r["case"]["batch"], r["case"]["kv_len"], r["case"]["Sq"],
                                              r["case"]["page_size"]) == (16, 32768, 1, 64)]
    doc.update(read_bandwidth_gbps=bw, rows=rows)
    doc["summary"] = {
        "min_gbps_seed_shapes": min(seed_gbps) if seed_gbps else None,
        "min_fraction_of_read_bw_seed_shapes": min(seed_gbps) / bw if seed_gbps else None,
        "gbps_b16_kv32k_hq64_sq1": b16[0] if b16 else None,
        "read_bandwidth_gbps": bw,
        "check_failures": failures,
    }
    return finish(doc, out_json, log, plot)
