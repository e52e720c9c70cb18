"""Maintainer sweeps: time candidate configs (ops/*/configs.py tables) on the GPU, each output checked before it is
timed; a config that fails the check, does not compile or is refused is reported and skipped. Subcommands:

    dense   [--out sweep.json] [--heads 64,128] [--seqlens 1024,4096,16384] [--dtype fp16] [--budget-s 300]
            [--set all|ctas]: portable forward kernel (AttnConfig) vs cuDNN, B=4, H=32. A JSON line per (case,
            config), "BEST D=..." per case, the results file, a ranking per (D, causal): "  D=... <geomean> <cfg>"
    fwd     [--dims 64,128] [--causal 0,1] [--seqlens N,..] [--dtype fp16|bf16|e4m3] [--variants "pingpong=1;..."]
            [--tag T] [--warm] [--cluster] [--lse]: the Hopper forward (dense.sm90) with the table's Sm90Config and
            with each variant's field overrides, vs cuDNN, B=4, H=32, outputs checked against cuDNN's: "FWD D=...
            N=...: cudnn: <TFLOPS> | ..."; --warm: compile only; --cluster: the 2-CTA cluster kernel too; --lse:
            tileattn's calls return the lse (the forward of a training step; cuDNN's column without it)
    flex-fwd [--n 8192] [--d 128] [--variants ...] [--tag T] [--fp8]: the flex forward (flex.sm90) on the six
            mods, per Sm90Config variant, checked on one head against torch's eager flex (--fp8: e4m3 inputs with
            the fp8 table's config, checked as the flex bench's fp8 rows): "FLEXFWD <mod> N=... ms: ..."
    bwd     [--quick | --seqlens N,..] [--dims 64,128] [--causal 0,1] [--warm] [--only NAME,..] [--tag T]
            [--unchecked] [--flex | --flex-only]: backward
            tiles (BwdConfig) and the Hopper backward forced on (sm90); --only: these columns (cuDNN always),
            --tag: a line prefix, --unchecked: time wrong outputs too (diagnostic trees); cuDNN first,
            "D=... causal=... N=...: <name>: <TFLOPS> | ..." (2.5x forward FLOPs, gradients checked, N=1K again
            last: a drift check); --flex: the flex
            backward on three mods of the flex grid, "FLEX <mod> N=8192 ms: torch <ms> | <tiles>: <ms> | ..."
    bwd-large-d [--dims 320,512] [--causal 0,1] [--seqlens 4096] [--tiles I,J] [--peers efficient,math] [--whole]
            [--pieces 4] [--bh 1,16] [--workspace-mib 2048] [--no-sm90]:
            the split large-D backward per score-tile candidate (SCORE_TILES), and with the Hopper score kernel
            where it serves D ("sm90 scores"), gradients checked, against SDPA's backward, B=1, H=16:
            "BWDL D=... causal=... N=... ms: <peer>: <ms> | [tiles]: <ms> | ..."
    large-d [--dims 320,512,1024] [--causal 0,1] [--n 8192] [--heads 48] [--configs I,J] [--budget-s 500]
            [--sm90]: large-D Triton kernel (LargeDConfig) vs SDPA EFFICIENT, B=1: "EFF" per case, "CFG <i> ..."
            per (config, case) (i: index into LARGE_D; --sm90: CFG -1, unforced, the Gluon kernel where it
            serves), "BEST" per case
    mla     [--quick]: MLA decode (MLASm90Config, MLAConfig), GB/s per (shape, config), and the read bandwidth
    mla-sched [--shapes BxKVxHQxSQ;...] [--waves 1,2] [--configs I,J]: MLA decode schedules (plan._WAVES) and
            configs (MLA_SCHED): eager and CUDA-graph ms, host us per call: "SCHED <shape>:" then a line each
    bwd-order [--groups 1,2,4,8] [--flex-mods all]: the flex Hopper backward's head group
            (launch_bwd_sm90.FLEX_HEAD_GROUP: taken where the mask's walks start in ties) on the flex bench's mods
            (N=8192), two rounds with the groups alternated; each group's gradients must equal group 1's bit for
            bit: "ORDER <case>: torch <ms> | g=<G>: <ms> | ..."
    decode  [--quick]: attention over a paged KV cache (DecodeConfig, and plan.FINE_WAVES / FINE_STEPS), GB/s per
            (shape, config): "DEC <shape> (<table's choice>): <cfg>: <GB/s> | ..."

scripts/gpu_check.sh: step sweep runs `sweep.py dense --out "$OUT/sweep.json" --budget-s ${SWEEP_BUDGET:-330}`
(greps ^BEST, ^  D=), sweep-bwd `sweep.py bwd ${SWEEP_ARGS:-}` (^D=, ^FLEX), sweep-large-d
`sweep.py large-d ${LARGE_D_ARGS:-}` (^EFF, ^BEST, ^CFG).

Configs are forced with tileattn.force_backend(config=...) (a config's class names its backend; process-wide, so
the backward's own threads see it too).
"""
import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import time

import torch

import tileattn
from tileattn.bench.common import attn_tflops, do_bench, max_abs
from tileattn.ops.common.configs import BwdConfig
from tileattn.ops.decode.configs import DecodeConfig
from tileattn.ops.dense.configs import AttnConfig, LargeDConfig
from tileattn.ops.mla.configs import MLAConfig, MLASm90Config

A, L, M, G, BW = AttnConfig, LargeDConfig, MLAConfig, MLASm90Config, BwdConfig
# dense: (128,128,8,2,TMA) crashed ptxas and warp specialization with 4 warps failed to compile (triton 3.6, H100,
# 2026-11-20): left out. The third group issues q.k of the next block before this block's softmax.
DENSE = [
    A(128, 64, 4, 3), A(128, 64, 8, 3), A(128, 128, 8, 3), A(64, 64, 4, 3),
    A(128, 128, 8, 3, True), A(128, 128, 4, 3, True), A(64, 64, 4, 3, True), A(128, 64, 8, 3, True),
    A(128, 128, 8, 3, True, True), A(128, 64, 8, 3, True, True),
    A(128, 64, 4, 3, pipeline_qk=True), A(128, 64, 8, 3, pipeline_qk=True), A(128, 128, 8, 3, pipeline_qk=True),
    A(128, 128, 8, 3, True, pipeline_qk=True), A(128, 128, 4, 3, True, pipeline_qk=True),
    A(64, 64, 4, 3, True, pipeline_qk=True), A(128, 64, 8, 3, True, pipeline_qk=True),
]
# thread-block clusters (num_ctas=2) against the table's winners: dense --set ctas
DENSE_CTAS = [A(128, 64, 8, 3), A(128, 64, 8, 3, num_ctas=2), A(128, 128, 8, 3, True),
              A(128, 128, 8, 3, True, num_ctas=2), A(128, 64, 4, 3), A(128, 64, 4, 3, num_ctas=2)]
# backward: (name, tiles; None: the table's, configs.bwd_config)
BWD = [("table", None), ("kv128-8w", BW((64, 128, 8, 2), (128, 64, 8, 2))),
       ("kv128-8w-s3", BW((64, 128, 8, 3), (128, 64, 8, 3))), ("kv128/q64", BW((64, 128, 8, 2), (64, 64, 4, 2))),
       ("kv64/q128", BW((64, 64, 4, 2), (128, 64, 8, 2))), ("32x128-4w", BW((32, 128, 4, 2), (128, 32, 4, 2)))]
FLEX_BWD = [None, BW((64, 128, 8, 2), (128, 64, 8, 2)), BW((64, 128, 8, 3), (128, 64, 8, 3)),
            BW((64, 128, 8, 3), (64, 64, 4, 2)), BW((128, 128, 8, 2), (128, 64, 8, 2)),
            BW((64, 64, 4, 2), (128, 64, 8, 3))]
# large-D: the H100 table's entries (configs.LARGE_D_SM90) and their closest rivals (docs/design/large_d.md)
LARGE_D = [L(128, 128, 64, 256, 8, 3, 64), L(128, 128, 64, 256, 8, 4, 64), L(128, 64, 64, 256, 8, 4, 128),
           L(128, 128, 64, 256, 8, 3, 128), L(128, 128, 64, 256, 8, 4), L(128, 128, 64, 256, 8, 3),
           L(128, 64, 64, 256, 8, 3), L(64, 128, 64, 512, 8, 2)]
# MLA: the Gluon kernel's (block_n, stages, consumer regs), then the portable kernel's (block_n, warps, stages, split)
MLA = [G(32, 4), G(32, 3), G(64, 2), G(16, 8), G(32, 4, 232),
       M(64, 8, 2, 1), M(32, 8, 2, 1), M(32, 8, 3, 1), M(32, 4, 2, 1), M(64, 8, 1, 1), M(32, 4, 2, 2), M(64, 4, 2, 2),
       M(16, 4, 1, 2), M(16, 4, 1, 4)]
# mla-sched: Hopper configs against the table's choice (QK_SHARD stages and registers); 7: the seesaw kernel's pair
# schedule (configs.SM90_PAIR, gluon_sm90_seesaw.py; the table's first for 16-bit caches). docs/design/mla.md's
# history names the indices of then: 7 the seesaw at its default turn order (the first form, later order 2), 8 / 9
# orders 0 / 1, 10 the pair (the earlier orders are gone)
MLA_SCHED = [G(32, 4, qk_shard=True), G(32, 3, qk_shard=True), G(32, 4, 232, qk_shard=True), G(32, 4), G(32, 2),
             G(16, 8), G(64, 2), G(64, 2, seesaw=True)]
# mla-sched --fp8: (block_n, 16-bit stages, consumer registers, fp8 stages)
# 2 / 1: the fp8 table's QK_SHARD / plain kernels with the widening switches off (the A/B's baselines; the table's
# configs.SM90_SHARD_FP8 / SM90_FP8 now have them on), 4-6 / 7-9: the same with widen_once, fence_late, both
# (docs/design/mla.md, 2c); the table's own: 4 (QK_SHARD, once) and 9 (plain, both)
_SHARD8, _PLAIN8 = G(32, 3, qk_shard=True, fp8_stages=2), G(32, 3, 232, fp8_stages=2)
MLA_SCHED_FP8 = [G(32, 3, fp8_stages=2), _PLAIN8, _SHARD8, G(32, 3, 232, qk_shard=True, fp8_stages=2)] + [
    dataclasses.replace(base, **switches) for base in (_SHARD8, _PLAIN8)
    for switches in (dict(widen_once=True), dict(fence_late=True), dict(widen_once=True, fence_late=True))]
MLA_QUICK = MLA[:5] + [M(64, 8, 2, 1), M(32, 4, 2, 1)]
# decode: (block_n, warps, stages); then programs per SM with the table's config
DEC = [DecodeConfig(*c) for c in ((64, 4, 3), (128, 4, 2), (32, 4, 6), (64, 2, 3))]
DEC_PPS = [(4, 16), (2, 16), (8, 16), (4, 8)]  # (FINE_WAVES, FINE_STEPS)


# ---- shared parts -------------------------------------------------------------------------------------------
def ints(s):
    """argparse type of a comma list of integers ("64,128")."""
    return [int(x) for x in s.split(",") if x.strip()]


@contextlib.contextmanager
def forced(cfg):
    """Every call (backward included) served as config `cfg` says; None: the tables'."""
    with tileattn.force_backend(config=cfg) if cfg is not None else contextlib.nullcontext():
        yield


def checked_ms(fn, check):
    """(ms, info): fn() once, check(its result) -> (ok, info), then fn timed (do_bench median); ms None if not ok."""
    ok, info = check(fn())
    return (do_bench(fn) if ok else None), info


def grad_fn(out, inputs, dout):
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def err(e, n=300):
    return f"{type(e).__name__}: {str(e)[:n]}"


# ---- dense ---------------------------------------------------------------------------------------------------
def dense_case(a, candidates, t0, D, causal, N, B=4, H=32):
    """The entries of one (D, causal, N): every candidate config (until the budget since t0 runs out) timed and
    checked against cuDNN. Its tensors are freed on return."""
    from tileattn.bench.dense import DTYPES, sdpa
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=DTYPES[a.dtype]) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    ref = sdpa("cudnn")(q, k, v, causal)
    ms_cudnn = do_bench(lambda: sdpa("cudnn")(q, k, v, causal))

    def check(out):
        diff = max_abs(out.transpose(1, 2), ref)
        if not torch.isfinite(out).all() or diff > 2e-2:
            raise RuntimeError(f"wrong output: max diff vs cudnn {diff:.3e}")
        return True, diff
    best, entries = None, []
    for cfg in candidates:
        if time.time() - t0 > a.budget_s:
            break
        entry = {"D": D, "causal": causal, "N": N, "cfg": vars(cfg)}
        try:
            with forced(cfg):
                ms, diff = checked_ms(lambda: tileattn.attention(qt, kt, vt, causal=causal), check)
            entry.update(ms=ms, tflops=attn_tflops(B, H, N, N, D, D, causal, ms), vs_cudnn=ms_cudnn / ms, diff=diff)
            if best is None or ms < best["ms"]:
                best = entry
        except Exception as e:  # noqa: BLE001
            entry["error"] = err(e)
        entries.append(entry)
        print(json.dumps(entry), flush=True)
    if best:
        print(f"BEST D={D} causal={int(causal)} N={N}: {best['cfg']} {best['tflops']:.0f} TFLOPS "
              f"({best['vs_cudnn']:.2f}x cudnn {attn_tflops(B, H, N, N, D, D, causal, ms_cudnn):.0f})", flush=True)
    return entries


def dense(a):
    candidates, t0, res = DENSE_CTAS if a.set == "ctas" else DENSE, time.time(), []
    for D, causal, N in itertools.product(a.heads, (False, True), a.seqlens):
        res += dense_case(a, candidates, t0, D, causal, N)
        torch.cuda.empty_cache()  # the case's tensors, freed on its return
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print("\nconfig ranking per (D, causal), geomean vs cudnn over N:")  # only configs measured at every N
    for D in sorted({r["D"] for r in res}):
        for causal in (False, True):
            scores = {}
            for r in res:
                if r["D"] == D and r["causal"] == causal and "ms" in r:
                    scores.setdefault(json.dumps(r["cfg"]), []).append(r["vs_cudnn"])
            nmax = max((len(v) for v in scores.values()), default=0)
            ranked = sorted(((math.exp(sum(map(math.log, v)) / len(v)), c) for c, v in scores.items()
                             if len(v) == nmax), reverse=True)
            for g, c in ranked[:4]:
                print(f"  D={D} causal={int(causal)} {g:.3f} {c}")


# ---- Hopper forward ------------------------------------------------------------------------------------------
def sm90_variants(spec, table):
    """[(name, Sm90Config)] of --variants "pingpong=1;stages=3,q_slots=1": the table's entry first, then the
    entry with each item's fields overridden."""
    out = [("table", table)]
    for item in filter(None, (x.strip() for x in spec.split(";"))):
        over = {}
        for kv in item.split(","):
            k, v = (x.strip() for x in kv.split("="))
            over[k] = type(getattr(table, k))(int(v) if v.lstrip("-").isdigit() else v)
        try:  # (an invalid combination, e.g. 3 consumers with the fp8 D=64 table's pingpong, fills its column only)
            out.append((item, dataclasses.replace(table, **over)))
        except ValueError as e:
            out.append((item, e))
    return out


def fwd_case(D, causal, N, variants, dtype, B=4, H=32, tag="", table_n=None, cluster=False, lse=False):
    """One (D, causal, N) of the dense forward: cuDNN (fp16 for an fp8 dtype), then the Hopper kernel with the
    shipped config of the shape (configs.sm90_dense_config: per head dim, causal and N; of N = table_n if given)
    and with each variant's overrides (variants: the --variants text), each output checked before it is timed:
    against cuDNN's (16-bit), or by the fp8 bench's tolerance rule on a slice (e4m3: tileattn/bench/fp8_check.py)."""
    from tileattn.bench.dense import sdpa
    from tileattn.ops.common.configs import sm90_dense_config
    fp8 = dtype.itemsize == 1
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16 if fp8 else dtype) for _ in range(3))
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    ref = sdpa("cudnn")(qh, kh, vh, causal).transpose(1, 2)
    ms = do_bench(lambda: sdpa("cudnn")(qh, kh, vh, causal))
    line = [f"cudnn{'-fp16' if fp8 else ''}: {attn_tflops(B, H, N, N, D, D, causal, ms):.0f}"]
    if fp8:
        from tileattn.bench import fp8_check
        (q, qd), (k, kd), (v8, vd) = (tileattn.quantize_fp8(t, dtype=dtype) for t in (q, k, v))
        ref, tol = fp8_check.reference(q, k, v8, qd, kd, vd, causal)
        v = tileattn.fp8_v_layout(v8)
        opts = dict(causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        opts = dict(causal=causal)
    opts["return_lse"] = lse

    def check(out):
        out = out[0] if lse else out
        if fp8:
            ok, info = fp8_check.check(lambda: out, ref, tol)
            return ok, info.get("err_vs_fp32", float("nan"))
        diff = max_abs(out, ref)
        return bool(torch.isfinite(out).all()) and diff <= 2e-2, diff
    for name, cfg in sm90_variants(variants, sm90_dense_config(D, dtype, table_n or N, causal)):
        try:
            if isinstance(cfg, Exception):
                raise cfg
            with tileattn.force_backend("dense.sm90", config=cfg):
                ms, diff = checked_ms(lambda: tileattn.attention(q, k, v, **opts), check)
            line.append(f"{name}: {attn_tflops(B, H, N, N, D, D, causal, ms):.0f}" if ms else
                        f"{name}: WRONG ({diff:.2e})")
        except Exception as e:  # noqa: BLE001
            line.append(f"{name}: {err(e, 60)}")
    if cluster:  # the 2-CTA cluster prototype (triton 3.9, D = 128, 16-bit; top-left causal = bottom-right here)
        from tileattn.ops.dense.launch_cluster_sm90 import attention_cluster_sm90
        try:
            ms, diff = checked_ms(lambda: attention_cluster_sm90(q, k, v, causal=causal, return_lse=lse), check)
            line.append(f"cluster: {attn_tflops(B, H, N, N, D, D, causal, ms):.0f}" if ms else
                        f"cluster: WRONG ({diff:.2e})")
        except Exception as e:  # noqa: BLE001
            line.append(f"cluster: {err(e, 60)}")
    print(f"{tag}FWD D={D} causal={int(causal)} N={N}{' lse' if lse else ''}: " + " | ".join(line), flush=True)


def fwd(a):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn}[a.dtype]
    if a.warm:  # compile every variant of these cases at a small shape (one process per case runs them in parallel),
        # from each distinct shipped config the sequence lengths take
        from tileattn.ops.common.configs import sm90_dense_config
        for D, causal in itertools.product(a.dims, [bool(c) for c in a.causal]):
            seen = []
            for n in a.seqlens:
                cfg = sm90_dense_config(D, dtype, n, causal)
                if cfg not in seen:
                    seen.append(cfg)
                    fwd_case(D, causal, 512, a.variants, dtype, B=1, H=4, tag="WARM ", table_n=n, lse=a.lse)
        return
    for D, causal, N in itertools.product(a.dims, [bool(c) for c in a.causal], a.seqlens):
        fwd_case(D, causal, N, a.variants, dtype, tag=a.tag, cluster=a.cluster, lse=a.lse)
        torch.cuda.empty_cache()


def flex_fwd(a):
    """The flex bench's mods at one N (B=4, H=16, D=128 or --d, bf16): tileattn's flex forward per Sm90Config variant,
    each output checked on (batch 0, head 0) against torch's eager flex_attention in float32; --fp8: e4m3 inputs
    and the fp8 table's config, checked as the flex bench's fp8 rows (bench.flex.fp8_case)."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    from tileattn.bench import flex as fx
    from tileattn.ops.common.configs import sm90_config
    from tileattn.ops.common.masking import FLEX_TAIL
    from tileattn.ops.flex import launch_sm90
    if a.force_tail:
        launch_sm90.flex_mode = lambda *seqlens: FLEX_TAIL
    B, H, D, N = fx.B, fx.H, a.d, a.n
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    variants = sm90_variants(a.variants, sm90_config(D, torch.float8_e4m3fn if a.fp8 else torch.bfloat16))
    for name, (score_mod, mask_mod) in fx.make_mods(N, q.device).items():
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda")  # broadcast: fits the slice too
        if a.fp8:  # the flex bench's fp8 row: e4m3 inputs, its check
            run, check8 = fx.fp8_case((q, k, v), (score_mod, mask_mod, bm))

            def check(out):
                ok, err, _ = check8(out)
                return ok, err
        else:
            ref = torch_flex(*(t[:1, :1].float() for t in (q, k, v)), score_mod=score_mod, block_mask=bm)

            def run(score_mod=score_mod, bm=bm):
                return tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

            def check(out):
                diff = max_abs(out[:1, :1], ref)
                return bool(torch.isfinite(out).all()) and diff <= 2e-2, diff
        line = []
        for vname, cfg in variants:
            try:
                if isinstance(cfg, Exception):
                    raise cfg
                with tileattn.force_backend("flex.sm90", config=cfg):
                    ms, diff = checked_ms(run, check)
                line.append(f"{vname}: {ms:.3f}" if ms else f"{vname}: WRONG ({diff:.2e})")
            except Exception as e:  # noqa: BLE001
                line.append(f"{vname}: {err(e, 60)}")
        print(f"{a.tag}FLEXFWD {name} N={N} ms: " + " | ".join(line), flush=True)


# ---- backward ------------------------------------------------------------------------------------------------
def bwd_case(D, causal, N, B=4, H=32, only=None, tag="", sm90_cfgs=(), unchecked=False):
    from tileattn.bench.bwd import _check
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    from tileattn.bench.dense import sdpa
    qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    o = sdpa("cudnn")(qh, kh, vh, causal)
    ms = do_bench(grad_fn(o, (qh, kh, vh), dout.transpose(1, 2)))
    line = [f"cudnn: {2.5 * attn_tflops(B, H, N, N, D, D, causal, ms):.0f}"]
    o = qh = kh = vh = None
    from tileattn.ops.dense import bwd as dense_bwd
    from tileattn.ops.dense import launch_bwd_sm90
    # (a tree from before UNMASKED_CONFIGS, `gpu_check.sh ab-bwd`, gets a dict of its own that nothing reads)
    unmasked_table = launch_bwd_sm90.pipeline.__dict__.setdefault("UNMASKED_CONFIGS", {})
    table, unmasked = dict(launch_bwd_sm90.CONFIGS), dict(unmasked_table)
    extra = [(f"sm90{list(c)}", c) for d, c in sm90_cfgs if d == D]
    for name, cfg in BWD + [("sm90", None)] + extra:  # the Hopper backward (TILEATTN_SM90_BWD=1) last
        if only and name not in only and not name.startswith("sm90["):
            continue
        sm90 = name.startswith("sm90")
        os.environ["TILEATTN_SM90_BWD"] = "1" if sm90 else "0"
        launch_bwd_sm90.CONFIGS[D] = cfg if name.startswith("sm90[") else table[D]
        unmasked_table.clear()  # a config given runs masked and unmasked problems alike
        unmasked_table.update({} if name.startswith("sm90[") else unmasked)
        dense_bwd.clear_plans()  # (a launch plan keeps the config it was made with)
        try:
            with forced(None if sm90 else cfg):
                out = tileattn.attention(q, k, v, causal=causal)
                fn = grad_fn(out, (q, k, v), dout)
                ms, _ = checked_ms(fn, lambda g: _check(g, q, k, v, dout, causal))
                if ms is None and unchecked:
                    ms, name = do_bench(fn), f"{name} (WRONG)"
            line.append(f"{name}: {2.5 * attn_tflops(B, H, N, N, D, D, causal, ms):.0f}" if ms else f"{name}: WRONG")
        except Exception as e:  # noqa: BLE001
            line.append(f"{name}: {err(e, 60)}")
    os.environ.pop("TILEATTN_SM90_BWD")
    launch_bwd_sm90.CONFIGS.update(table)
    unmasked_table.update(unmasked)
    dense_bwd.clear_plans()
    print(f"{tag}D={D} causal={causal} N={N}: " + " | ".join(line), flush=True)


def bwd_flex(N=8192):
    from torch.nn.attention.flex_attention import create_block_mask

    from tileattn.bench import flex as fx
    B, H, D = fx.B, fx.H, fx.D
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    flex_c = fx._torch_flex()
    for name, (score_mod, mask_mod) in fx.make_mods(N, q.device).items():
        if name not in ("causal", "document", "softcap_causal"):
            continue
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda")
        with forced(None):  # timed the same way as ours
            o = flex_c(q, k, v, score_mod=score_mod, block_mask=bm)
            line = [f"torch {do_bench(grad_fn(o, (q, k, v), dout)):.3f}"]
        for cfg in FLEX_BWD:  # not checked here: tests/flex/test_flex_backward.py and `tileattn bench bwd` check them
            tiles = None if cfg is None else (cfg.dkdv, cfg.dq)
            try:
                with forced(cfg):
                    out = tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
                    line.append(f"{tiles}: {do_bench(grad_fn(out, (q, k, v), dout)):.3f}")
            except Exception as e:  # noqa: BLE001
                line.append(f"{tiles}: {err(e, 60)}")
        print(f"FLEX {name} N={N} ms: " + " | ".join(line), flush=True)


def bwd(a):
    if a.flex or a.flex_only:
        bwd_flex()
    if a.flex_only:
        return
    seqlens = (1024, 4096) if a.quick else (1024, 2048, 4096, 16384)
    if a.seqlens:
        seqlens = tuple(int(n) for n in a.seqlens.split(","))
    only = a.only.split(",") if a.only else None
    # --sm90-cfgs "128:2,2,232,40,2,1;64:...": more columns, the Hopper backward with these CONFIGS entries
    cfgs = [(int(d), tuple(int(x) for x in c.split(","))) for d, c in
            (e.split(":") for e in a.sm90_cfgs.split(";"))] if a.sm90_cfgs else []
    dims, causals = a.dims, [bool(c) for c in a.causal]
    if a.warm:  # compile the Hopper backward's variants of these cases (one process per case runs them in parallel)
        os.environ["TILEATTN_SM90_BWD"] = "1"
        for D, causal in itertools.product(dims, causals):
            q, k, v = (torch.randn(1, 256, 1, D, device="cuda", dtype=torch.float16, requires_grad=True)
                       for _ in range(3))
            tileattn.attention(q, k, v, causal=causal).sum().backward()
        torch.cuda.synchronize()
        return
    for D, causal, N in itertools.product(dims, causals, seqlens):
        bwd_case(D, causal, N, only=only, tag=a.tag, sm90_cfgs=cfgs, unchecked=a.unchecked)
        torch.cuda.empty_cache()  # the case's tensors, freed on its return
    for D, causal in itertools.product(dims, causals):  # drift check
        bwd_case(D, causal, 1024, only=only, tag=a.tag, sm90_cfgs=cfgs, unchecked=a.unchecked)
        torch.cuda.empty_cache()


def bwd_order(a):
    """The flex Hopper backward per head group (launch_bwd_sm90.FLEX_HEAD_GROUP, taken where the block mask's walks
    start in ties) on the flex bench's mods at N=8192 (B=4, H=16, D=128, bf16). Per mod: torch's compiled backward
    timed, then every group twice (second round in reverse order), the best of the two kept; plans cleared at each
    switch (a flex plan keeps its backward's launches from its forward on: each group gets a new forward). A group
    whose gradients differ from the first group's in any bit is reported as DIFFERS."""
    from torch.nn.attention.flex_attention import create_block_mask

    from tileattn.bench import flex as fx
    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    from tileattn.ops.flex import plans as flex_plans
    groups, saved = ints(a.groups), pipeline.FLEX_HEAD_GROUP
    B, H, D, N = fx.B, fx.H, fx.D, 8192
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    flex_c = fx._torch_flex()
    os.environ["TILEATTN_SM90_BWD"] = "1"
    for mod, (score_mod, mask_mod) in fx.make_mods(N, q.device).items():
        if a.flex_mods != "all" and mod not in a.flex_mods.split(","):
            continue
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda")
        o = flex_c(q, k, v, score_mod=score_mod, block_mask=bm)
        line, ms, ref = [f"torch {do_bench(grad_fn(o, (q, k, v), dout)):.3f}"], {}, None
        o = None
        for r in range(2):
            for g in (groups if r == 0 else groups[::-1]):
                pipeline.FLEX_HEAD_GROUP = g
                flex_plans.clear_plans()
                fn = grad_fn(tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm), (q, k, v), dout)
                grads = fn()
                ref = ref or [t.clone() for t in grads]
                same = all(torch.equal(x, y) for x, y in zip(grads, ref))
                t, grads, fn = do_bench(fn), None, None
                ms[g] = min(ms.get(g, t), t) if same else float("nan")
        line += [f"g={g}: {ms[g]:.3f}" if ms[g] == ms[g] else f"g={g}: DIFFERS" for g in groups]
        print(f"ORDER flex {mod} N={N}: " + " | ".join(line), flush=True)
    pipeline.FLEX_HEAD_GROUP = saved
    flex_plans.clear_plans()
    os.environ.pop("TILEATTN_SM90_BWD")


# the split large-D backward's score tiles (launch_bwd_large_d.SCORE_TILES candidates: BLOCK_M, BLOCK_N, BLOCK_K,
# warps, stages); the table's entry first
SCORE_TILES = [(128, 64, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 3),
               (64, 128, 64, 4, 3), (128, 128, 32, 8, 4), (64, 64, 64, 4, 3), (128, 128, 128, 8, 2),
               (128, 64, 128, 8, 2), (128, 64, 64, 8, 4)]


def bwd_large_d(a):
    """The split large-D backward per score-tile candidate (and, causal, GEMM pieces) against SDPA backends
    (default the bench's LARGE_D_ROWS: EFFICIENT and MATH, B=1, H=16), gradients checked before timing:
    "BWDL D=... causal=... N=... ms: <peer>: <ms> | [tiles]: <ms> | ..."."""
    from tileattn.bench.bwd import _check
    from tileattn.bench.dense import sdpa
    from tileattn.ops.dense import bwd as dense_bwd
    from tileattn.ops.dense import launch_bwd_large_d as split
    table = (split.SCORE_TILES, split.PIECES_MASKED, split.WORKSPACE_BYTES, dense_bwd.SPLIT_ABOVE_HEAD_DIM,
             split.SCORES_SM90)
    B, H = a.bh
    for D, causal, N in itertools.product(a.dims, (bool(x) for x in a.causal), a.seqlens):
        q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16).requires_grad_() for _ in range(3))
        dout = torch.randn_like(q)
        line = []

        def timed(name):
            """tileattn's backward under the module settings made by the caller, checked, then timed; the label
            says which score kernel the chunks took when they were not all of one kind."""
            dense_bwd.clear_plans()
            kinds = set()
            real = split._scores
            split._scores = lambda p, c, do, delta, ch, *r: kinds.add(ch.sm90) or real(p, c, do, delta, ch, *r)
            try:
                out = tileattn.attention(q, k, v, causal=causal)
                ms, _ = checked_ms(grad_fn(out, (q, k, v), dout), lambda g: _check(g, q, k, v, dout, causal))
                ran = "" if kinds == {split.SCORES_SM90} else f" (score kernels run: {sorted(kinds)})"
                line.append(f"{name}{ran}: {ms:.2f}" if ms else f"{name}{ran}: WRONG")
            except Exception as e:  # noqa: BLE001
                line.append(f"{name}: {err(e, 60)}")
            finally:
                split._scores = real
            torch.cuda.empty_cache()
        for p in (x for x in a.peers.split(",") if x):
            qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
            try:
                o = sdpa(p)(qh, kh, vh, causal)
                line.append(f"{p}: {do_bench(grad_fn(o, (qh, kh, vh), dout.transpose(1, 2))):.2f}")
            except Exception as e:  # noqa: BLE001
                line.append(f"{p}: {err(e, 50)}")
            o = None
        cfgs = SCORE_TILES if a.tiles is None else [SCORE_TILES[i] for i in a.tiles]
        # the Triton score kernel with each tile candidate, then the Hopper one where it serves D
        sm90 = [True] if D in split.SCORES_SM90_CONFIGS and not a.no_sm90 else []
        ws_values = a.workspace_mib or [table[2] >> 20]
        for cfg, n, ws in itertools.product([*cfgs, *sm90], a.pieces if causal else a.pieces[:1], ws_values):
            split.SCORES_SM90 = cfg is True
            split.SCORE_TILES = table[0] if cfg is True else cfg
            split.PIECES_MASKED, split.WORKSPACE_BYTES = n, ws << 20
            timed(("sm90 scores" if cfg is True else f"{list(cfg)}") + (f" pieces={n}" if causal else "")
                  + (f" ws={ws}M" if ws != table[2] >> 20 else ""))
        split.SCORE_TILES, split.PIECES_MASKED, split.WORKSPACE_BYTES, split.SCORES_SM90 = table[:3] + (table[4], )
        if a.whole and D <= dense_bwd.MAX_WHOLE_HEAD_DIM:  # the whole-row Triton kernels instead of the split one
            dense_bwd.SPLIT_ABOVE_HEAD_DIM = dense_bwd.MAX_WHOLE_HEAD_DIM
            timed("whole-row")
            dense_bwd.SPLIT_ABOVE_HEAD_DIM = table[3]
        print(f"BWDL D={D} causal={causal} N={N} ms: " + " | ".join(line), flush=True)
        q = k = v = dout = None
        torch.cuda.empty_cache()


# ---- large head dims -----------------------------------------------------------------------------------------
def kernel_info(q, k, v, causal, cfg):
    """Shared memory, registers and spills of the kernel the forward compiles under `cfg` (None: unforced)."""
    from tileattn.ops.dense.plans import compile_only
    try:
        with forced(cfg):
            kern = compile_only(q, k, v, causal)  # the chosen (here: forced) backend's first launch
        kern._init_handles()  # n_regs and n_spills are read when the binary is loaded
        return f"{kern.metadata.shared} regs={kern.n_regs} spills={kern.n_spills}"
    except Exception as e:  # noqa: BLE001
        return f"? ({err(e, 100)})"


def large_d_case(a, cfgs, t_start, best, D, causal):
    """One (D, causal): every config of cfgs (until the budget since t_start runs out) checked and timed against
    SDPA EFFICIENT; the fastest correct one goes into best[(D, causal)]. Its tensors are freed on return."""
    from tileattn.bench.dense import sdpa
    from tileattn.bench.large_d import check_case
    B, H, N = 1, a.heads, a.n
    q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=torch.float16) for _ in range(3))
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    eff_out = sdpa("efficient")(qh, kh, vh, causal)
    eff_tf = attn_tflops(B, H, N, N, D, D, causal, do_bench(lambda: sdpa("efficient")(qh, kh, vh, causal)))
    print(f"EFF D={D} causal={causal} {eff_tf:.0f} TFLOPS", flush=True)
    for i, cfg in cfgs:
        if time.time() - t_start > a.budget_s:
            print("budget exhausted", flush=True)
            break
        name = cfg if cfg is not None else "unforced"
        try:
            with forced(cfg):
                # the bench's check: float32 on heads 0-1, EFFICIENT on every head
                ms, info = checked_ms(lambda: tileattn.attention(q, k, v, causal=causal),
                                      lambda out: check_case(out, eff_out, qh, kh, vh, causal))
        except Exception as e:  # noqa: BLE001
            print(f"CFG {i} {name} D={D} causal={causal} ERROR {err(e)}", flush=True)
            continue
        smem = kernel_info(q, k, v, causal, cfg)
        tf = attn_tflops(B, H, N, N, D, D, causal, ms) if ms else 0.0
        print(f"CFG {i} {name} D={D} causal={causal} smem={smem} err={info['err_vs_fp32']:.2e} "
              f"diff_eff={info['max_diff_vs_efficient']:.1e} ok={ms is not None} {tf:.0f} TFLOPS "
              f"x{tf / eff_tf:.2f} eff", flush=True)
        if ms and tf > best.get((D, causal), (0,))[0]:
            best[(D, causal)] = (tf, i, tf / eff_tf, name)


def large_d(a):
    t_start, best = time.time(), {}
    cfgs = list(enumerate(LARGE_D)) if a.configs is None else [(i, LARGE_D[i]) for i in a.configs]
    cfgs = [(-1, None)] * a.sm90 + cfgs
    for D, causal in itertools.product(a.dims, (bool(x) for x in a.causal)):
        large_d_case(a, cfgs, t_start, best, D, causal)
        torch.cuda.empty_cache()  # the case's tensors, freed on its return
    for (D, causal), (tf, i, r, name) in sorted(best.items()):
        print(f"BEST D={D} causal={causal}: cfg {i} {name} {tf:.0f} TFLOPS x{r:.2f} eff")


# ---- MLA decode ----------------------------------------------------------------------------------------------
def mla_name(cfg):
    if isinstance(cfg, G):
        return (f"sm90 {cfg.block_n}/{cfg.stages}/{cfg.consumer_regs}" + (" shard" if cfg.qk_shard else "")
                + (f" fp8x{cfg.fp8_stages}" if cfg.fp8_stages else "") + (" once" if cfg.widen_once else "")
                + (" late" if cfg.fence_late else "") + (" seesaw" if cfg.seesaw else ""))
    return f"{cfg.block_n}/{cfg.num_warps}/{cfg.num_stages}/{cfg.out_split}"


def mla_case(configs, batch, kv, hq, sq, page):
    """One shape: every config of `configs` checked and timed (GB/s). Its tensors are freed on return."""
    from tileattn.bench.mla import DC, DR, check, make_inputs
    inputs = make_inputs(batch, kv, hq, sq, page, torch.bfloat16)
    qn, qp, ckv, kpe, table, seqlens = inputs
    nbytes = 2 * (batch * kv * (DC + DR) + batch * sq * hq * (DC + DR) + batch * sq * hq * DC)
    line = []
    for cfg in configs:
        try:
            with forced(cfg):  # the plan keeps the config chosen when it is made
                plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, page_size=page)
            ms, info = checked_ms(lambda: plan.run(qn, qp, ckv, kpe, table),
                                  lambda out: check(out, inputs, sample=8))
            line.append(f"{mla_name(cfg)}: {nbytes / ms / 1e6:.0f}" if ms else f"{mla_name(cfg)}: WRONG {info}")
        except Exception as e:  # noqa: BLE001
            line.append(f"{mla_name(cfg)}: {err(e, 80)}")
    plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, page_size=page)  # the unforced schedule
    print(f"b{batch} kv{kv} h{hq} sq{sq} p{page} items={plan.num_items} chunk={plan.chunk} "
          f"({mla_name(plan.config)}): " + " | ".join(line), flush=True)


def mla(a):
    from tileattn.bench.common import read_bandwidth
    print(f"read bandwidth {read_bandwidth():.0f} GB/s", flush=True)
    shapes = [(768, 1024, 16, 1, 64), (768, 2048, 64, 1, 64), (16, 32768, 64, 1, 64), (768, 1024, 32, 1, 64)]
    if not a.quick:
        shapes += [(768, 2048, 16, 1, 64), (768, 1024, 64, 1, 1), (4, 8192, 64, 2, 64)]
    for shape in shapes:
        mla_case(MLA_QUICK if a.quick else MLA, *shape)
        torch.cuda.empty_cache()  # the case's tensors, freed on its return


def _graph_ms(fn):
    """do_bench of fn's CUDA graph (one capture after a warm-up on a side stream): the GPU time alone."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay)


def _host_us(fn, n=200):
    """Microseconds of host time per fn() call (back to back, no sync inside; the queue absorbs the GPU)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def mla_sched(a):
    """Per shape, per (waves, config): eager ms, CUDA-graph ms and host us per call, output checked."""
    from profile_kernels import kernel_times
    from tileattn.bench.common import read_bandwidth
    from tileattn.bench.mla import DC, DR, FP8_SCALE, check, make_inputs
    from tileattn.ops.mla import plan as plan_mod
    print(f"read bandwidth {read_bandwidth():.0f} GB/s", flush=True)
    cfgs = [None] + [(MLA_SCHED_FP8 if a.fp8 else MLA_SCHED)[i] for i in (a.configs or ())]
    for shape in a.shapes.split(";"):
        batch, kv, hq, sq = (int(x) for x in shape.split("x"))
        fp8 = torch.float8_e4m3fn if a.fp8 else None
        inputs = make_inputs(batch, kv, hq, sq, 64, torch.bfloat16, cache_dtype=fp8)
        qn, qp, ckv, kpe, table, seqlens = inputs
        scale = FP8_SCALE if a.fp8 else 1.0
        nbytes = (1 if a.fp8 else 2) * batch * kv * (DC + DR) + 2 * (batch * sq * hq * (DC + DR) + batch * sq * hq * DC)
        flops = 2 * batch * sq * hq * kv * (2 * DC + DR)
        line = []
        for waves, cfg in itertools.product(a.waves, cfgs):
            old = plan_mod._WAVES
            plan_mod._WAVES = waves
            try:
                with forced(cfg):
                    plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, page_size=64, cache_dtype=fp8)
                fn = lambda: plan.run(qn, qp, ckv, kpe, table, kv_scale=scale)  # noqa: E731
                ok, info = check(fn(), inputs, sample=8, kv_scale=scale)
                if not ok:
                    line.append(f"w{waves} {mla_name(plan.config)}: WRONG {info}")
                    continue
                ms, gms, us = do_bench(fn), _graph_ms(fn), _host_us(fn)
                kernels = " + ".join(f"{k_ms * 1e3:.1f}" for k_ms, _ in kernel_times(fn)) if a.kernels else ""
                line.append(f"w{waves} {mla_name(plan.config)} items={plan.num_items}: eager {ms:.3f} ms "
                            f"graph {gms:.3f} ms ({nbytes / gms / 1e6:.0f} GB/s, {flops / gms / 1e9:.0f} TFLOPS) "
                            f"host {us:.0f} us" + (f" kernels {kernels} us" if kernels else ""))
            except Exception as e:  # noqa: BLE001
                line.append(f"w{waves}: {err(e, 80)}")
            finally:
                plan_mod._WAVES = old
        print(f"SCHED b{batch} kv{kv} h{hq} sq{sq}:\n  " + "\n  ".join(line), flush=True)
        qn = qp = ckv = kpe = table = seqlens = inputs = plan = None
        torch.cuda.empty_cache()


# ---- attention over a paged KV cache ------------------------------------------------------------------------
def decode_case(hq, hkv, batch, kv, sq, page, cdt):
    """One shape: every DecodeConfig of DEC and every split schedule of DEC_PPS checked and timed (GB/s), then the
    table's config replayed from a CUDA graph. Its tensors are freed on return."""
    from tileattn.bench.decode import D, _nbytes, check, make_cache
    from tileattn.ops.decode import plan as plan_mod
    bf = torch.bfloat16
    default_pps = (plan_mod.FINE_WAVES, plan_mod.FINE_STEPS)
    k, v, table, seqlens = make_cache(batch, kv, hkv, page, cdt)
    q = torch.randn(batch, sq, hq, D, device="cuda", dtype=bf)
    nbytes = _nbytes(batch, kv, hq, hkv, sq, cdt.itemsize)
    line = []
    variants = [(c, default_pps) for c in DEC] + [(None, p) for p in DEC_PPS]
    for cfg, pps in variants:
        name = f"{cfg.block_n}/{cfg.num_warps}/{cfg.num_stages}" if cfg else f"fine{pps[0]}/{pps[1]}"
        plan_mod.FINE_WAVES, plan_mod.FINE_STEPS = pps
        try:
            with forced(cfg):  # the plan keeps the config chosen when it is made
                plan = tileattn.KVCachePlan(seqlens, num_heads=hq, num_kv_heads=hkv, head_dim=D, page_size=page,
                                            q_len=sq, dtype=bf, cache_dtype=cdt)
            ms, info = checked_ms(lambda: plan.run(q, k, v, table),
                                  lambda out: check(out, q, k, v, table, seqlens, sample=2))
            line.append(f"{name}: {nbytes / ms / 1e6:.0f}" if ms else f"{name}: WRONG {info}")
        except Exception as e:  # noqa: BLE001
            line.append(f"{name}: {err(e, 80)}")
        finally:
            plan_mod.FINE_WAVES, plan_mod.FINE_STEPS = default_pps
    plan = tileattn.KVCachePlan(seqlens, num_heads=hq, num_kv_heads=hkv, head_dim=D, page_size=page, q_len=sq,
                                dtype=bf, cache_dtype=cdt)
    plan.run(q, k, v, table)
    graph = torch.cuda.CUDAGraph()  # the table's config without host time: a captured run replayed
    with torch.cuda.graph(graph):
        plan.run(q, k, v, table)
    line.append(f"graph: {nbytes / do_bench(graph.replay) / 1e6:.0f}")
    print(f"DEC hq{hq}/{hkv} b{batch} kv{kv} sq{sq} p{page} {str(cdt)[6:]} items={plan.num_items} "
          f"chunk={plan.chunk} ({plan.config}): " + " | ".join(line), flush=True)


def decode(a):
    from tileattn.bench.common import read_bandwidth
    print(f"read bandwidth {read_bandwidth():.0f} GB/s", flush=True)
    f8, bf = torch.float8_e4m3fn, torch.bfloat16
    shapes = [(32, 8, 1, 32768, 1, 16, bf), (32, 8, 1, 4096, 1, 16, bf), (32, 8, 64, 4096, 1, 16, bf),
              (32, 8, 8, 16384, 1, 16, bf), (32, 8, 32, 16384, 1, 16, f8), (64, 8, 128, 16384, 1, 16, f8),
              (64, 8, 32, 4096, 16, 16, bf), (64, 8, 8, 1024, 1, 16, bf)]
    if not a.quick:
        shapes += [(64, 8, 64, 16384, 1, 16, bf), (32, 32, 32, 4096, 1, 16, bf), (32, 8, 8, 1024, 1, 16, bf),
                   (32, 8, 1, 1024, 1, 64, bf), (32, 8, 128, 16384, 1, 64, bf), (32, 8, 128, 32768, 1, 16, f8)]
    for shape in shapes:
        decode_case(*shape)
        torch.cuda.empty_cache()  # the case's tensors (and the graph), freed on its return


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("dense", help="portable forward kernel configs against cuDNN")
    p.add_argument("--out", default="sweep.json")
    p.add_argument("--heads", type=ints, default="64,128", help="head dims")
    p.add_argument("--seqlens", type=ints, default="1024,4096,16384")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--budget-s", type=float, default=300)
    p.add_argument("--set", default="all", choices=["all", "ctas"])
    p.set_defaults(func=dense)
    p = sub.add_parser("fwd", help="the Hopper forward's table config against variants of it, and cuDNN")
    p.add_argument("--dims", type=ints, default="64,128", help="head dims")
    p.add_argument("--causal", type=ints, default="0,1")
    p.add_argument("--seqlens", type=ints, default="1024,2048,4096,16384")
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "e4m3"))
    p.add_argument("--variants", default="pingpong=1",
                   help='";"-separated Sm90Config overrides, each "field=value,...", e.g. "pingpong=1;stages=3"')
    p.add_argument("--tag", default="", help="printed before each line")
    p.add_argument("--warm", action="store_true", help="only compile the variants (at a small shape)")
    p.add_argument("--cluster", action="store_true", help="also the 2-CTA cluster kernel (triton 3.9, D=128, 16-bit)")
    p.add_argument("--lse", action="store_true", help="tileattn's calls return the lse (a training step's forward)")
    p.set_defaults(func=fwd)
    p = sub.add_parser("flex-fwd", help="the flex forward (Hopper kernel) on the flex bench's mods, per variant")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--d", type=int, default=128, help="head dim (the flex bench's: 128)")
    p.add_argument("--variants", default="", help="as fwd's")
    p.add_argument("--fp8", action="store_true", help="e4m3 inputs as the flex bench's fp8 rows (their table, check)")
    p.add_argument("--tag", default="", help="printed before each line")
    p.add_argument("--force-tail", action="store_true",
                   help="the Hopper kernel's tail mode (FLEX_TAIL) even where N is a multiple of 128 (its cost alone)")
    p.set_defaults(func=flex_fwd)
    p = sub.add_parser("bwd", help="backward tiles (dense; flex with --flex)")
    p.add_argument("--quick", action="store_true", help="N 1K and 4K only")
    p.add_argument("--seqlens", default="", help="comma-separated N (default 1024,2048,4096,16384)")
    p.add_argument("--dims", type=ints, default="64,128", help="head dims")
    p.add_argument("--causal", type=ints, default="0,1")
    p.add_argument("--warm", action="store_true", help="only compile the Hopper backward for these cases")
    p.add_argument("--unchecked", action="store_true",
                   help="time outputs that fail the check too (diagnostic trees that skip work: 'X (WRONG)')")
    p.add_argument("--only", default=None, help="comma-separated column names (e.g. table,sm90); cuDNN always")
    p.add_argument("--tag", default="", help="printed before each line (which tree ran it, in an A/B)")
    p.add_argument("--sm90-cfgs", default="", help='more Hopper backward columns: "D:CONFIGS entry;...", e.g. '
                   '"128:2,2,232,40,2,1" (the last: TMA dQ, 0 or 1)')
    g = p.add_mutually_exclusive_group()
    g.add_argument("--flex", action="store_true", help="also the flex backward's tiles, first")
    g.add_argument("--flex-only", action="store_true", help="the flex backward's tiles only")
    p.set_defaults(func=bwd)
    p = sub.add_parser("bwd-order", help="the flex Hopper backward's work-item order (head groups)")
    p.add_argument("--groups", default="1,2,4,8", help="head groups (the first is the reference for the bit check)")
    p.add_argument("--flex-mods", default="all", help="comma-separated flex bench mods, or all")
    p.set_defaults(func=bwd_order)
    p = sub.add_parser("bwd-large-d", help="large-D backward tiles against SDPA EFFICIENT / MATH")
    p.add_argument("--dims", type=ints, default="320,512")
    p.add_argument("--causal", type=ints, default="0,1")
    p.add_argument("--seqlens", type=ints, default="4096")
    p.add_argument("--tiles", type=ints, default=None, help="comma-separated indices into SCORE_TILES")
    p.add_argument("--peers", default="efficient,math", help="SDPA backends timed first")
    p.add_argument("--whole", action="store_true", help="also the whole-row Triton kernels (D <= 256)")
    p.add_argument("--pieces", type=ints, default="4", help="PIECES_MASKED values (causal rows)")
    p.add_argument("--bh", type=ints, default="1,16", help="batch, heads")
    p.add_argument("--workspace-mib", type=ints, default=None,
                   help="WORKSPACE_BYTES values, MiB (default: the module's)")
    p.add_argument("--no-sm90", action="store_true", help="not the Hopper score kernel (SCORES_SM90_CONFIGS dims)")
    p.set_defaults(func=bwd_large_d)
    p = sub.add_parser("large-d", help="large-D Triton kernel configs against SDPA EFFICIENT")
    p.add_argument("--dims", type=ints, default="320,512,1024")
    p.add_argument("--causal", type=ints, default="0,1")
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--heads", type=int, default=48)
    p.add_argument("--configs", type=ints, default=None, help="comma-separated indices into LARGE_D")
    p.add_argument("--budget-s", type=float, default=500)
    p.add_argument("--sm90", action="store_true", help="also time the unforced path (the Gluon kernel)")
    p.set_defaults(func=large_d)
    p = sub.add_parser("mla", help="MLA decode configs against the read bandwidth")
    p.add_argument("--quick", action="store_true", help="four shapes, seven configs")
    p.set_defaults(func=mla)
    p = sub.add_parser("mla-sched", help="MLA decode schedules: eager / CUDA-graph ms and host time per call")
    p.add_argument("--shapes", default="128x1024x64x1;128x1024x128x1;768x1024x64x1",
                   help="';'-separated BATCHxKVxHQxSQ (page 64, bf16)")
    p.add_argument("--waves", type=ints, default="1", help="plan._WAVES values")
    p.add_argument("--configs", type=ints, default=None, help="indices into MLA_SCHED, besides the table's")
    p.add_argument("--fp8", action="store_true", help="e4m3 caches (the fp8 configs: MLA_SCHED_FP8)")
    p.add_argument("--kernels", action="store_true", help="also each kernel's GPU us per call (torch.profiler, "
                   "run last per case: it may leave launch hooks that slow later eager calls)")
    p.set_defaults(func=mla_sched)
    p = sub.add_parser("decode", help="attention over a paged KV cache: configs against the read bandwidth")
    p.add_argument("--quick", action="store_true", help="six shapes")
    p.set_defaults(func=decode)
    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
