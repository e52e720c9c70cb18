"""`tileattn bench flex`: programmable attention (score / mask mods) against torch's flex_attention.

The flex grid of targets.md: B=4, H=16, N in {2048, 8192}, D=128, bf16; mods causal, sliding window 1024,
document mask, prefix-LM 1024, ALiBi + causal, tanh softcap 30 + causal. The same mod functions and the same
torch BlockMask go to tileattn.flex_attention and to torch's flex_attention under torch.compile; plain causal
also runs through SDPA's cuDNN backend and tileattn.attention's causal path. Every tileattn output is checked
against torch's flex in float32 (tolerance rule, torch's bf16 output as the input-precision error) before it is
timed. FLOPs count only the visible (query, key) pairs (the block mask's density times N^2, D and Dv each 2
FLOPs per pair). With fwdbwd (default) the six mods at the largest N also run backward and forward + backward
against torch's compiled flex (flex_rows, also in `bench bwd`: gradients checked first; summary
fwdbwd_geomean_vs_torch_flex, fwdbwd_min_vs_torch_flex).
"""
import torch

from ..ops.flex import mods
from ..tolerance import allowed_error
from .common import bench_rounds, do_bench, finish, fmt, geomean, results_header

B, H, D = 4, 16, 128
MODS = ("causal", "sliding_window", "document", "prefix_lm", "alibi_causal", "softcap_causal")


def make_mods(N, device):
    """name -> (score_mod, mask_mod). Documents: lengths drawn once (seeded) to sum to N, mean ~N/6."""
    g = torch.Generator().manual_seed(0)
    cuts = torch.randperm(N - 1, generator=g)[:5].sort().values + 1
    lengths = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([N])]))
    docs = mods.document_ids_from_lengths(lengths, device=device)
    slopes = mods.alibi_slopes(H, device=device)
    return {
        "causal": (None, mods.causal),
        "sliding_window": (None, mods.sliding_window(1024)),
        "document": (None, mods.document(docs)),
        "prefix_lm": (None, mods.prefix_lm(1024)),
        "alibi_causal": (mods.alibi(slopes), mods.causal),
        "softcap_causal": (mods.tanh_softcap(30.0), mods.causal),
    }


_compiled = None


def _torch_flex():
    global _compiled
    if _compiled is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def run(out_json=None, plot=None, log=print, seqlens=(2048, 8192), fwdbwd=True):
    from torch.nn.attention.flex_attention import create_block_mask

    import tileattn
    dt = torch.bfloat16
    doc = results_header("flex")
    rows, failures = [], 0
    flex_c = _torch_flex()
    log(f"{'N':>6} {'mod':>15} {'tileattn':>9} {'torch flex':>10} {'ratio':>6}   ms; TFLOPS of visible pairs")
    for N in seqlens:
        g = torch.Generator(device="cuda").manual_seed(N)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=g) for _ in range(3))
        for name, (score_mod, mask_mod) in make_mods(N, q.device).items():
            bm = create_block_mask(mask_mod, None, None, N, N, device="cuda") if mask_mod else None
            density = _density(mask_mod, N) if mask_mod else 1.0
            flops = 4.0 * B * H * N * N * D * density
            case = {"B": B, "H": H, "N": N, "D": D, "mod": name, "dtype": "bfloat16", "density": density}
            out = tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
            ref = flex_c(q.float(), k.float(), v.float(), score_mod=score_mod, block_mask=bm)
            ref_lp = flex_c(q, k, v, score_mod=score_mod, block_mask=bm)
            err = (out.float() - ref).abs().max().item()
            tol = allowed_error((ref_lp.float() - ref).abs().max().item(), ref, dt)
            ok = bool(err <= tol and torch.isfinite(out).all())
            ref = ref_lp = out = None  # frees the GPU memory now
            fns = {"tileattn": lambda: tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm),
                   "flex": lambda: flex_c(q, k, v, score_mod=score_mod, block_mask=bm)}
            if name == "causal":
                from torch.nn.attention import SDPBackend, sdpa_kernel
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                def cudnn():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                fns["cudnn"] = cudnn
                fns["tileattn_dense"] = lambda: tileattn.attention(qt, kt, vt, causal=True)
            ms = {}
            for p, fn in fns.items():
                if p == "tileattn" and not ok:
                    continue
                ms[p] = do_bench(fn)
                rows.append({"case": case, "provider": p, "ms": ms[p], "tflops": flops / (ms[p] * 1e-3) / 1e12,
                             "gbps": None, **({"check": {"err": err, "tol": tol}} if p == "tileattn" else {})})
            if not ok:
                failures += 1
                log(f"CHECK FAILED {case}: err {err:.3e} > tol {tol:.3e}")
            t, f = ms.get("tileattn"), ms["flex"]
            log(f"{N:6d} {name:>15} {fmt(t, '{:.3f}'):>9} {f:10.3f} {fmt(f / t if t else None, '{:.2f}'):>6}   "
                + " ".join(f"{p} {m:.3f}" for p, m in ms.items() if p not in ("tileattn", "flex")))
            ms8 = _fp8_row((q, k, v), (score_mod, mask_mod, bm), case, flops, rows, log)
            if ms8 is None:
                failures += 1
            elif t:
                log(f"{'':6} {'':>15} fp8 (e4m3, Fp8V) {ms8:.3f} ms: {t / ms8:.2f}x tileattn bf16")
            bm = None  # frees the GPU memory now
        q = k = v = None  # frees the GPU memory now
        torch.cuda.empty_cache()

    def ms_of(p, N, mod):
        for r in rows:
            if r["provider"] == p and r["case"]["N"] == N and r["case"]["mod"] == mod:
                return r["ms"]
        return None
    nmax = max(seqlens)
    vs_flex = [ms_of("flex", nmax, m) / ms_of("tileattn", nmax, m) for m in MODS if ms_of("tileattn", nmax, m)]
    dense_ratio = None
    if ms_of("tileattn", nmax, "causal") and ms_of("tileattn_dense", nmax, "causal"):
        dense_ratio = ms_of("tileattn_dense", nmax, "causal") / ms_of("tileattn", nmax, "causal")
    vs_bf16 = [ms_of("tileattn", nmax, m) / ms_of("tileattn_fp8", nmax, m) for m in MODS
               if ms_of("tileattn", nmax, m) and ms_of("tileattn_fp8", nmax, m)]
    fb = None
    if fwdbwd:  # forward + backward at the largest N (bwd.flex_rows: gradients checked, then timed)
        _, fb, fb_failures = flex_rows(rows, log, N=nmax)
        failures += fb_failures
    doc.update(rows=rows)
    doc["summary"] = {
        "geomean_vs_torch_flex": geomean(vs_flex) if len(vs_flex) == len(MODS) else None,
        "min_vs_torch_flex": min(vs_flex) if len(vs_flex) == len(MODS) else None,
        "fwdbwd_geomean_vs_torch_flex": geomean(fb) if fb and len(fb) == len(MODS) else None,
        "fwdbwd_min_vs_torch_flex": min(fb) if fb and len(fb) == len(MODS) else None,
        "fp8_vs_bf16_geomean": geomean(vs_bf16) if len(vs_bf16) == len(MODS) else None,
        "causal_vs_tileattn_causal": dense_ratio,
        "check_failures": failures,
    }
    return finish(doc, out_json, log, plot)


def flex_rows(rows, log, N=8192):
    """Backward, and forward + backward, of the flex grid's mods at N: appends rows, returns (backward ratios
    torch / tileattn, forward + backward ratios, failures)."""
    from torch.nn.attention.flex_attention import create_block_mask

    import tileattn

    from ..ops.flex.reference import flex_ref
    dt = torch.bfloat16
    flex_c = _torch_flex()
    g = torch.Generator(device="cuda").manual_seed(N)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=g)
    ratios, fb_ratios, failures = [], [], 0
    log(f"flex backward, N={N}: {'mod':>15} {'tileattn':>9} {'torch flex':>10} {'ratio':>6}   ms"
        "   (forward + backward: tileattn, torch flex, ratio)")
    for name, (score_mod, mask_mod) in make_mods(N, q.device).items():
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda") if mask_mod else None
        density = _density(mask_mod, N) if mask_mod else 1.0
        flops = 2.5 * 4.0 * B * H * N * N * D * density
        case = {"B": B, "H": H, "N": N, "D": D, "mod": name, "dtype": "bfloat16", "density": density}
        out = tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
        grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        def ref_grads(dtype):
            x = [t[:1, :1].detach().to(dtype).requires_grad_() for t in (q, k, v)]
            o = flex_ref(*x, score_mod=score_mod, mask_mod=mask_mod, dtype=dtype)[0]
            return torch.autograd.grad(o, x, dout[:1, :1].to(dtype))
        ref, ref_lp = ref_grads(torch.float32), ref_grads(dt)
        info, ok = {}, True
        for gname, gr, r, rl in zip(("dq", "dk", "dv"), grads, ref, ref_lp):
            err = (gr[:1, :1].float() - r).abs().max().item()
            tol = allowed_error((rl.float() - r).abs().max().item(), r, dt)
            info[gname] = {"err": err, "tol": tol}
            ok = ok and err <= tol and bool(torch.isfinite(gr).all())
        grads = ref = ref_lp = None  # frees the GPU memory now
        if not ok:
            failures += 1
            log(f"CHECK FAILED flex {case}: {info}")
        out_t = flex_c(q, k, v, score_mod=score_mod, block_mask=bm)
        outs = {"tileattn": out, "flex": out_t} if ok else {"flex": out_t}
        ms = bench_rounds({p: (lambda o=o: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True))
                           for p, o in outs.items()})
        for p in outs:  # (case "mode" tells these rows from the forward rows of `bench flex`)
            rows.append({"case": {**case, "mode": "bwd"}, "provider": p, "ms": ms[p], "gbps": None,
                         "tflops": flops / (ms[p] * 1e-3) / 1e12, **({"check": info} if p == "tileattn" else {})})
        if "tileattn" in ms:
            ratios.append(ms["flex"] / ms["tileattn"])
        # forward + backward (what a training step pays): the same checked functions, the forward inside
        fns = {"tileattn": lambda: tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm),
               "flex": lambda: flex_c(q, k, v, score_mod=score_mod, block_mask=bm)}
        fb = bench_rounds({p: (lambda f=fns[p]: torch.autograd.grad(f(), (q, k, v), dout)) for p in outs})
        for p in outs:
            rows.append({"case": {**case, "mode": "fwdbwd"}, "provider": p, "ms": fb[p], "gbps": None,
                         "tflops": 3.5 / 2.5 * flops / (fb[p] * 1e-3) / 1e12})
        if "tileattn" in fb:
            fb_ratios.append(fb["flex"] / fb["tileattn"])
        t, tf = ms.get("tileattn"), fb.get("tileattn")
        log(f"{'':>23}{name:>15} {fmt(t, '{:.3f}'):>9} {ms['flex']:10.3f} "
            f"{fmt(ms['flex'] / t if t else None, '{:.2f}'):>6}   {fmt(tf, '{:.3f}')} {fb['flex']:.3f} "
            f"{fmt(fb['flex'] / tf if tf else None, '{:.2f}')}")
        out = out_t = bm = None  # frees the GPU memory now
        torch.cuda.empty_cache()
    return ratios, fb_ratios, failures


def fp8_case(qkv, mods):
    """(fn, check) of tileattn flex with e4m3 inputs (qkv: the bf16 inputs; mods: score_mod, mask_mod, block mask;
    per-(batch, head) descales, V in the Fp8V layout a cache would keep): fn() runs it; check(out) -> (ok, err, tol)
    compares out on batch 0, heads 0-1 with the reference on the dequantized values (P rounded to e4m3 in the
    input-precision one)."""
    import tileattn

    from ..ops.flex.reference import flex_ref
    (q, k, v), (score_mod, mask_mod, bm) = qkv, mods
    fp8 = torch.float8_e4m3fn
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(x.transpose(1, 2), fp8) for x in (q, k, v))
    v8p = tileattn.fp8_v_layout(v8)
    q8, k8 = q8.transpose(1, 2), k8.transpose(1, 2)

    def fn():
        return tileattn.flex_attention(q8, k8, v8p, score_mod=score_mod, block_mask=bm, q_descale=qd, k_descale=kd,
                                       v_descale=vd)
    deq = [(x.float() * d[:, None, :, None]).transpose(1, 2)[:1, :2] for x, d in
           ((q8.transpose(1, 2), qd), (k8.transpose(1, 2), kd), (v8, vd))]
    ref, _ = flex_ref(*deq, score_mod, mask_mod)
    ref_lp, _ = flex_ref(*deq, score_mod, mask_mod, dtype=torch.bfloat16, quantize_p=fp8)
    tol = allowed_error((ref_lp.float() - ref).abs().max().item(), ref, torch.bfloat16)
    ref_lp = deq = None

    def check(out):
        err = (out[:1, :2].float() - ref).abs().max().item()
        return bool(err <= tol and torch.isfinite(out).all()), err, tol
    return fn, check


def _fp8_row(qkv, mods, case, flops, rows, log):
    """fp8_case's run, checked, then timed; its row appended to rows. Returns ms, or None when the check fails."""
    fn, check = fp8_case(qkv, mods)
    ok, err, tol = check(fn())
    check = None  # (its float32 reference: freed before the timing)
    case8 = dict(case, dtype="float8_e4m3fn")
    row = {"case": case8, "provider": "tileattn_fp8", "ms": None, "tflops": None, "gbps": None,
           "check": {"err": err, "tol": tol}}
    if ok:
        ms = do_bench(fn)
        row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
    else:
        log(f"CHECK FAILED fp8 {case8}: err {err:.3e} > tol {tol:.3e}")
    rows.append(row)
    return row["ms"]


def _density(mask_mod, N):
    """Fraction of (query, key) pairs the mask keeps (exact, from a strided sample of query rows)."""
    qi = torch.arange(0, N, 7, device="cuda")[:, None]
    kv = torch.arange(N, device="cuda")[None, :]
    keep = mask_mod(torch.zeros((), dtype=torch.int32, device="cuda"), torch.zeros((), dtype=torch.int32,
                                                                                    device="cuda"), qi, kv)
    return keep.float().mean().item()
