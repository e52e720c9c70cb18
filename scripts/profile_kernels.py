"""Profiling targets. Subcommands:

    profile_kernels.py fwd [--provider tileattn|cudnn|efficient] [--B 1] [--H 48] [--N 8192] [--D 1024] [--causal]
        one forward call between cudaProfilerStart/Stop, for Nsight Compute. A first call (compiles, warms up) runs
        outside the profiled range. Inputs are random normal fp16, [B, S, H, D] for tileattn and the [B, H, S, D]
        view of the same values for torch's SDPA backends.
    profile_kernels.py bwd-one [--provider tileattn|cudnn] [--B 1] [--H 32] [--N 4096] [--D 128] [--causal]
        one dense backward (autograd.grad of a forward made before) between cudaProfilerStart/Stop, for Nsight
        Compute; fp16, inputs as for fwd.
    profile_kernels.py mla-one [--batch 128] [--kv 1024] [--hq 64] [--sq 1] [--page 64]
        one MLA decode (bf16 cache, the bench's inputs, output checked first) between cudaProfilerStart/Stop.
    profile_kernels.py mla-scale [--cases 128x1024,128x4096,32x1024]
        MLADecodePlan.run with the same number kv_scale every run (the plan fills its scale buffer only when the
        number changes) against a number that changes every run (a fill per run): "MLASCALE ..." lines, do_bench's
        us per run, three repeats each, output checked first.
    profile_kernels.py small [--N 1024,2048] [--D 64,128]
        the short rows of the dense grids (fp16, B=4, H=32, causal and not), forward and backward, tileattn
        (backward on the Triton kernels and on the Hopper one, TILEATTN_SM90_BWD=0 / 1) and cuDNN: "SMALL ..."
        lines with the timed ms per call (common.do_bench, as the suites), the GPU kernels' sum per call
        (torch.profiler) and the host us to issue one call: where time = kernels, the GPU is the limit; where
        it is near host, the host is. Inputs require grad (the "fwd" rows time a tracked forward), and the
        profiler runs between cases (it may leave launch hooks installed): `host` is the cleaner host figure.
    profile_kernels.py host [--N 1024] [--D 64] [--causal]
        where a call's host time goes, in the benchmarks' conditions (fp16, B=4, H=32): forward without grad,
        forward with grad, backward (autograd.grad of a retained graph), cuDNN beside each; the tracked calls
        also with Parameter inputs (which take the registered op instead of the eager autograd Function); all
        twice. "HOST ..." lines: do_bench's ms, the host's issue time per call (batches of 20 calls back to back, no
        sync: the GPU is behind; median and minimum of 7 batches), whether every cached launcher replays directly,
        then cProfile's top entries of 50 backward calls. No profiler runs before these (torch.profiler may leave
        launch hooks installed, which send launches the slow way).
    profile_kernels.py flex-small [--N 2048]
        the flex bench's six rows at a short N (bf16, B=4, H=16, D=128): "FLEX ..." lines with the timed us per
        forward, the kernels' GPU time and the host issue time, ours and compiled torch flex's, then the same for
        the backward alone (causal, ALiBi, documents); then, causal and ALiBi, the host time with the GPU idle,
        synchronizing operations (torch's sync debug mode) and cProfile's top entries of 50 calls.
    profile_kernels.py split [--B 1] [--H 16] [--N 4096] [--D 256,512]
        per-kernel GPU time of the split backward (launch_bwd_large_d.py), causal and not: "SPLIT ..." lines.
    profile_kernels.py swing [--N 4096] [--D 256] [--reps 30] [--workspace-mib 1024,2048]
        the split backward's call-to-call swing (B=4, H=32, causal; fp16 then bf16; per workspace size): "SWING ..."
        lines with each call's event-timed ms, ours and cuDNN's alternated, the host's issue time per call, then
        (after every timing) per-kernel GPU time of a few calls profiled one by one.
    profile_kernels.py rows [--N 1024] [--D 64] [--no-causal] [--reps 4] [--dtypes fp16,bf16]
        the bwd bench's row (B=4, H=32; causal unless --no-causal) repeated: "ROW ..." lines with each repeat's
        backward us, ours, cuDNN's and FA2's, and the ratios (the row swings with the host's issue time).
    profile_kernels.py timeline [--N 1024,4096] [--D 64,128] [--reps 3]
        the dense backward's GPU timeline (fp16, B=4, H=32, causal and not; torch.profiler, `reps` calls after four
        queued matmuls that keep the host ahead): "TL ..." lines per call with each kernel's start after the call's
        first kernel (the preprocess), its duration, and the call's span to the last kernel's end (the preprocess,
        the main kernel, the dQ conversion: where the GPU waits between them). A call whose host fell behind
        anyway shows a late start; compare the calls of a case.
    profile_kernels.py bwd
        per-kernel GPU time of the backward passes (torch.profiler), "PROF ..." lines: tileattn's flex and dense
        backward and torch's compiled flex backward on the flex grid's shapes (B=4, H=16, N=8192, D=128, bf16).

scripts/gpu_check.sh runs:
    ncu-fwd      ncu --clock-control none --profile-from-start off --section ... \
                     python3 scripts/profile_kernels.py fwd $c
                 (NCU_CASES: ';'-separated argument lists of `fwd`, e.g. "--provider tileattn --D 1024 --causal")
    profile-bwd  python3 scripts/profile_kernels.py bwd   (greps ^PROF)

Not named profile.py: `python scripts/<any>.py` puts scripts/ first on sys.path, where a profile.py would shadow the
standard library's `profile`, which cProfile imports (and torch._dynamo imports cProfile).
"""
import argparse
import re
import time

import torch


def fwd(a):
    """One forward call of the provider between cudaProfilerStart/Stop (after a first, compiling call); --fp8:
    tileattn on e4m3 inputs with per-head descales (the fp8 bench's quantization and V layout)."""
    q, k, v = (torch.randn(a.B, a.N, a.H, a.D, device="cuda", dtype=torch.float16) for _ in range(3))
    if a.provider == "tileattn" and a.fp8:
        import tileattn
        (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(t) for t in (q, k, v))
        v8 = tileattn.fp8_v_layout(v8)
        fn = lambda: tileattn.attention(q8, k8, v8, causal=a.causal, q_descale=qd, k_descale=kd,  # noqa: E731
                                        v_descale=vd)
    elif a.provider == "tileattn":
        import tileattn
        fn = lambda: tileattn.attention(q, k, v, causal=a.causal)  # noqa: E731
    else:
        from tileattn.bench.dense import sdpa
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        fn = lambda: sdpa(a.provider)(qh, kh, vh, a.causal)  # noqa: E731
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def bwd_one(a):
    q, k, v = (torch.randn(a.B, a.N, a.H, a.D, device="cuda", dtype=torch.float16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    if a.provider == "tileattn":
        import tileattn
        o, inputs = tileattn.attention(q, k, v, causal=a.causal), (q, k, v)
    else:
        from tileattn.bench.dense import sdpa
        inputs = tuple(t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        o, dout = sdpa(a.provider)(*inputs, a.causal), dout.transpose(1, 2)
    torch.autograd.grad(o, inputs, dout, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    torch.autograd.grad(o, inputs, dout, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def mla_one(a):
    """One MLA decode (MLADecodePlan.run, the bench's inputs; --fp8: an e4m3 cache at the bench's kv_scale) between
    cudaProfilerStart/Stop, its output checked first (bench.mla.check). --sched I: sweep.py's MLA_SCHED[I]
    (MLA_SCHED_FP8 with --fp8) forced, for a config no table selects."""
    import tileattn
    from tileattn.bench.mla import FP8_SCALE, check, make_inputs
    fp8 = torch.float8_e4m3fn if a.fp8 else None
    scale = FP8_SCALE if a.fp8 else 1.0
    if a.sched is not None:
        import sweep  # (scripts/, this script's directory)
        forced = tileattn.force_backend(config=(sweep.MLA_SCHED_FP8 if a.fp8 else sweep.MLA_SCHED)[a.sched])
        forced.__enter__()  # for the rest of this process
    inputs = make_inputs(a.batch, a.kv, a.hq, a.sq, a.page, torch.bfloat16, cache_dtype=fp8)
    plan = tileattn.MLADecodePlan(inputs[5], num_heads=a.hq, q_len=a.sq, page_size=a.page, cache_dtype=fp8)
    ok, info = check(plan.run(*inputs[:5], kv_scale=scale), inputs, sample=8, kv_scale=scale)
    print(f"MLA b{a.batch} kv{a.kv} h{a.hq} sq{a.sq} p{a.page}{' fp8' if a.fp8 else ''}: items {plan.num_items}, "
          f"chunk {plan.chunk}, config {plan.config}; check {'ok' if ok else 'FAILED'} {info}", flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    plan.run(*inputs[:5], kv_scale=scale)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def mla_scale(a):
    """A number kv_scale on MLADecodePlan.run: the same number every run (no fill of the plan's scale buffer)
    against a number that changes every run (a fill per run), bf16 cache, Hq 64, the bench's inputs, output checked
    first: "MLASCALE ..." lines with do_bench's us per run, three repeats of each."""
    import itertools

    import tileattn
    from tileattn.bench.common import do_bench
    from tileattn.bench.mla import check, make_inputs
    for batch, kv in ((int(b), int(k)) for b, k in (c.split("x") for c in a.cases.split(","))):
        inputs = make_inputs(batch, kv, 64, 1, 64, torch.bfloat16)
        plan = tileattn.MLADecodePlan(inputs[5], num_heads=64, page_size=64)
        ok, info = check(plan.run(*inputs[:5], kv_scale=1.0), inputs, sample=8)
        vals = itertools.cycle((1.0, 1.0 + 2 ** -20))
        same = [do_bench(lambda: plan.run(*inputs[:5], kv_scale=1.0)) * 1e3 for _ in range(3)]
        changing = [do_bench(lambda: plan.run(*inputs[:5], kv_scale=next(vals))) * 1e3 for _ in range(3)]
        print(f"MLASCALE b{batch} kv{kv}: check {'ok' if ok else 'FAILED'} {info}; same number "
              f"{[round(t, 1) for t in same]} us, changing {[round(t, 1) for t in changing]} us", flush=True)


def kernel_times(fn, reps=5, top=6):
    """[(ms per call, kernel name)] of the `top` kernels with the most GPU time, most first."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.self_device_time_total > 0:
            rows.append((e.self_device_time_total / reps / 1e3, e.key[:90]))
    return sorted(rows, reverse=True)[:top]


def host_us(fn, reps=20):
    """Median host microseconds to issue fn() (synchronized before each call, not after)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[reps // 2]


def issue_us(fn, busy, n=50):
    """Host microseconds to issue fn() while the GPU is behind (a few long matmuls on `busy` queued first)."""
    for _ in range(3):
        busy @ busy
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def issue_spread(fn, busy, batches=7, n=20):
    """(min, median) of issue_us over `batches` batches of n calls: the host's hiccups move the mean of one batch
    by 2-5x on the H100 machines (2026-11-25), the minimum is what the host can do."""
    us = sorted(issue_us(fn, busy, n) for _ in range(batches))
    return us[0], us[len(us) // 2]


def _dense_rows(a):
    """(N, D, causal, q, k, v, dout) for each row a.N x a.D x (non-causal, causal) of the dense grids: fp16, B=4,
    H=32, [B, S, H, D] inputs that require grad, a random output gradient."""
    for n in (int(x) for x in a.N.split(",")):
        for d in (int(x) for x in a.D.split(",")):
            for causal in (False, True):
                q, k, v = (torch.randn(4, n, 32, d, device="cuda", dtype=torch.float16).requires_grad_()
                           for _ in range(3))
                yield n, d, causal, q, k, v, torch.randn_like(q)


def small(a):
    import os

    import tileattn
    from tileattn.bench.common import do_bench
    from tileattn.bench.dense import sdpa
    from tileattn.ops.dense import plans
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 2.0:  # clocks up before the first timing
        x @ x
    torch.cuda.synchronize()
    for n, d, causal, q, k, v, dout in _dense_rows(a):
        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        cases = {"fwd tileattn": lambda: tileattn.attention(q, k, v, causal=causal),
                 "fwd cudnn": lambda: sdpa("cudnn")(qt, kt, vt, causal)}
        o_c = sdpa("cudnn")(qt, kt, vt, causal)
        cases["bwd cudnn"] = lambda: torch.autograd.grad(o_c, (qt, kt, vt), dout.transpose(1, 2),
                                                         retain_graph=True)
        for setting in ("0", "1"):
            o_t = tileattn.attention(q, k, v, causal=causal)
            cases[f"bwd tileattn sm90={setting}"] = \
                lambda o_t=o_t: torch.autograd.grad(o_t, (q, k, v), dout, retain_graph=True)
        flops = 4.0 * 4 * 32 * n * n * d * (0.5 if causal else 1.0)
        for name, fn in cases.items():
            os.environ["TILEATTN_SM90_BWD"] = name[-1] if "sm90=" in name else ""
            plans.clear_plans()  # the switch is read when a plan is made
            ms = do_bench(fn)
            per_kernel = kernel_times(fn)
            kern = sum(t for t, _ in per_kernel)
            f = flops * (2.5 if name.startswith("bwd") else 1.0)
            print(f"SMALL N={n} D={d} causal={int(causal)} {name:>22}: timed {ms * 1e3:7.1f} us "
                  f"({f / ms / 1e9:5.0f} TFLOPS), kernels {kern * 1e3:7.1f} us, host {host_us(fn):6.1f} us",
                  flush=True)
            if a.breakdown:
                for t, kname in per_kernel:
                    print(f"    {t * 1e3:7.1f} us  {kname}", flush=True)
        os.environ.pop("TILEATTN_SM90_BWD", None)


def host(a):
    import cProfile
    import pstats

    import tileattn
    from tileattn import launcher
    from tileattn.bench.common import do_bench
    from tileattn.bench.dense import sdpa
    q, k, v = (torch.randn(4, a.N, 32, a.D, device="cuda", dtype=torch.float16) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    o_t, o_c = tileattn.attention(qg, kg, vg, causal=a.causal), sdpa("cudnn")(qt, kt, vt, a.causal)
    cases = {"fwd tileattn": lambda: tileattn.attention(q, k, v, causal=a.causal),
             "fwd cudnn": lambda: sdpa("cudnn")(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), a.causal),
             "fwd+graph tileattn": lambda: tileattn.attention(qg, kg, vg, causal=a.causal),
             "fwd+graph cudnn": lambda: sdpa("cudnn")(qt, kt, vt, a.causal),
             "bwd tileattn": lambda: torch.autograd.grad(o_t, (qg, kg, vg), dout, retain_graph=True),
             "bwd cudnn": lambda: torch.autograd.grad(o_c, (qt, kt, vt), dout.transpose(1, 2), retain_graph=True)}
    from tileattn.ops.dense import custom_ops

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            return g

    @torch.library.custom_op("profile_kernels::ident", mutates_args=())
    def ident(t: torch.Tensor) -> torch.Tensor:
        return t.clone()

    ident.register_fake(lambda t: torch.empty_like(t))
    ident.register_autograd(lambda ctx, g: g)
    o_i, o_l = Identity.apply(qg), ident(qg)
    node = o_t.grad_fn
    saved, opts = list(node.saved_tensors), node.options
    qp, kp, vp = (torch.nn.Parameter(t.clone()) for t in (q, k, v))  # a tensor subclass: the registered op
    o_p = tileattn.attention(qp, kp, vp, causal=a.causal)
    cases.update({"fwd+graph tileattn op": lambda: tileattn.attention(qp, kp, vp, causal=a.causal),
                  "bwd tileattn op": lambda: torch.autograd.grad(o_p, (qp, kp, vp), dout, retain_graph=True)})
    threads = set()

    class Shaped(torch.autograd.Function):
        """EagerAttn's shape (q, k, v in; out, lse out; five tensors saved) with a trivial or the real backward."""
        @staticmethod
        def forward(ctx, q, k, v, real):
            out, lse = o_t.detach().clone(), node.saved_tensors[4].detach().clone()
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.real = real
            return out, lse

        @staticmethod
        def backward(ctx, g, g_lse):
            import threading
            threads.add(threading.current_thread().name)
            q, k, v, out, lse = ctx.saved_tensors
            if ctx.real:
                return (*bwd.attn_bwd_planned((q, k, v, out, lse), g, None, opts), None)
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None

    from tileattn.ops.dense import bwd
    o_s, o_r = Shaped.apply(qg, kg, vg, False)[0], Shaped.apply(qg, kg, vg, True)[0]
    cases.update({"floor shaped": lambda: torch.autograd.grad(o_s, (qg, kg, vg), dout, retain_graph=True),
                  "shaped + body": lambda: torch.autograd.grad(o_r, (qg, kg, vg), dout, retain_graph=True)})
    cases.update({"floor autograd.Function": lambda: torch.autograd.grad(o_i, qg, dout, retain_graph=True),
                  "floor custom_op": lambda: torch.autograd.grad(o_l, qg, dout, retain_graph=True),
                  "bwd tileattn direct": lambda: custom_ops._attn_bwd(dout, None, saved, opts)})
    if a.only:
        cases = {n: f for n, f in cases.items() if re.search(a.only, n)}
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for name, fn in [*cases.items(), *cases.items()]:  # twice: the host's noise shows in the pairs
        fn()
        torch.cuda.synchronize()
        ms = do_bench(fn)
        low, mid = issue_spread(fn, x)
        print(f"HOST N={a.N} D={a.D} causal={int(a.causal)} {name:>23}: timed {ms * 1e3:7.1f} us, host issue "
              f"{mid:6.1f} us per call (min {low:6.1f})", flush=True)
    import threading
    print(f"HOST threads: {[t.name for t in threading.enumerate()]}; shaped backward ran on {sorted(threads)}")
    if a.no_cprofile:
        return
    direct = [lc._direct is not None for lc in launcher._CACHED.values()]
    print(f"HOST launchers: {sum(direct)} of {len(direct)} direct; hooks installed: {launcher._hooks_installed()}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        cases["bwd tileattn"]()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def flex_small(a):
    """The flex bench's rows at a short N: timed, kernels' GPU time and host issue time per forward call, ours
    and compiled torch flex's; then a cProfile of our causal forward (where its host time goes)."""
    import cProfile
    import pstats

    from torch.nn.attention.flex_attention import create_block_mask

    import tileattn
    from tileattn.bench import flex as fb
    from tileattn.bench.common import do_bench
    torch_flex = fb._torch_flex()
    q, k, v = (torch.randn(fb.B, fb.H, a.N, fb.D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    calls = {}
    for name, (smod, mmod) in fb.make_mods(a.N, q.device).items():
        bm = create_block_mask(mmod, None, None, a.N, a.N, device="cuda") if mmod else None
        calls[name] = {"tileattn": lambda s=smod, b=bm: tileattn.flex_attention(q, k, v, score_mod=s, block_mask=b),
                       "flex": lambda s=smod, b=bm: torch_flex(q, k, v, score_mod=s, block_mask=b)}
    for name, fns in calls.items():
        for prov, fn in fns.items():
            fn()
            ms = do_bench(fn)
            kern = sum(t for t, _ in kernel_times(fn))
            issue = issue_us(fn, x)
            print(f"FLEX N={a.N} {name:>15} {prov:>9}: timed {ms * 1e3:7.1f} us, kernels {kern * 1e3:7.1f} us, "
                  f"host issue {issue:6.1f} us per call", flush=True)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)
    for name, (smod, mmod) in fb.make_mods(a.N, q.device).items():  # the backward alone (a retained graph)
        if name not in ("causal", "alibi_causal", "document"):
            continue
        bm = create_block_mask(mmod, None, None, a.N, a.N, device="cuda")
        for prov, f in (("tileattn", tileattn.flex_attention), ("flex", torch_flex)):
            out = f(qg, kg, vg, score_mod=smod, block_mask=bm)
            fn = lambda out=out: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)  # noqa: E731
            fn()
            ms = do_bench(fn)
            kern = sum(t for t, _ in kernel_times(fn))
            issue = issue_us(fn, x, 20)
            print(f"FLEX N={a.N} {name:>15} {prov:>9} backward: timed {ms * 1e3:7.1f} us, kernels {kern * 1e3:7.1f} "
                  f"us, host issue {issue:6.1f} us per call", flush=True)
    for name in ("causal", "alibi_causal"):
        fn = calls[name]["tileattn"]
        print(f"FLEX N={a.N} {name:>15}  tileattn: host {host_us(fn, 50):6.1f} us per call with the GPU idle",
              flush=True)
        torch.cuda.set_sync_debug_mode("warn")  # any synchronizing operation in a call warns
        fn()
        torch.cuda.set_sync_debug_mode(0)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("cumtime").print_stats(40)


def bwd(a, N=8192):
    from torch.nn.attention.flex_attention import create_block_mask

    import tileattn
    from tileattn.bench import flex as fx
    B, H, D = fx.B, fx.H, fx.D
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    flex_c = fx._torch_flex()
    for name, (score_mod, mask_mod) in fx.make_mods(N, q.device).items():
        if name not in ("causal", "softcap_causal"):
            continue
        bm = create_block_mask(mask_mod, None, None, N, N, device="cuda")
        for who, o in (("tileattn", tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)),
                       ("torch", flex_c(q, k, v, score_mod=score_mod, block_mask=bm))):
            def fn(o=o):
                return torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)
            for ms, kname in kernel_times(fn):
                print(f"PROF {name} {who}: {ms:.3f} ms {kname}", flush=True)
            print(f"PROF {name} {who}: host {host_us(fn):.0f} us to issue the backward", flush=True)
    qd, kd, vd = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    o = tileattn.attention(qd, kd, vd, causal=True)
    for ms, kname in kernel_times(lambda: torch.autograd.grad(o, (qd, kd, vd), dout.transpose(1, 2),
                                                              retain_graph=True)):
        print(f"PROF dense-causal tileattn: {ms:.3f} ms {kname}", flush=True)


def split(a):
    """Per-kernel GPU time of the split backward (head dims above 128, batched), "SPLIT ..." lines."""
    import tileattn
    for D in (int(x) for x in a.D.split(",")):
        for causal in (False, True):
            q, k, v = (torch.randn(a.B, a.N, a.H, D, device="cuda", dtype=torch.float16).requires_grad_()
                       for _ in range(3))
            dout = torch.randn_like(q)
            o = tileattn.attention(q, k, v, causal=causal)
            rows = kernel_times(lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True), top=12)
            print(f"SPLIT D={D} causal={causal}: sum of the top kernels {sum(r[0] for r in rows):.3f} ms", flush=True)
            for ms, kname in rows:
                print(f"SPLIT D={D} causal={causal}: {ms:.3f} ms {kname}", flush=True)


def swing(a):
    """The split backward's call-to-call swing, "SWING ..." lines (docstring above). Every timing runs before the
    profiled calls: torch.profiler may leave launch hooks installed, which would slow the host's issue."""
    from tileattn.ops.dense import launch_bwd_large_d as split
    default = split.WORKSPACE_BYTES
    configs = [(dt, mib) for dt in (torch.float16, torch.bfloat16) for mib in (a.workspace_mib or [default >> 20])]
    for profiled in (False, True)[:1 + (a.profiled > 0)]:
        for dt, mib in configs:
            split.WORKSPACE_BYTES = mib << 20
            _swing_one(a, dt, f"SWING {str(dt).split('.')[-1]} D={a.D} N={a.N} ws={mib}M", profiled)
            torch.cuda.empty_cache()
    split.WORKSPACE_BYTES = default


def _swing_one(a, dt, tag, profiled):
    """One dtype's calls, timed or (profiled) under the profiler; its tensors are freed on return."""
    from torch.profiler import ProfilerActivity, profile

    import tileattn
    from tileattn.bench.dense import sdpa
    q, k, v = (torch.randn(4, a.N, 32, a.D, device="cuda", dtype=dt).requires_grad_() for _ in range(3))
    dout = torch.randn_like(q)
    o = tileattn.attention(q, k, v, causal=True)
    qh, kh, vh = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    oh = sdpa("cudnn")(qh, kh, vh, True)
    ours = lambda: torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)  # noqa: E731
    theirs = lambda: torch.autograd.grad(oh, (qh, kh, vh), dout.transpose(1, 2), retain_graph=True)  # noqa: E731
    ours(), theirs()
    torch.cuda.synchronize()
    if profiled:
        _swing_profiled(a, tag, ours, profile, ProfilerActivity)
        return
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    times = {"ours": [], "cudnn": []}
    for _ in range(a.reps):
        for name, fn in (("ours", ours), ("cudnn", theirs)):
            torch.cuda.synchronize()
            ev[0].record()
            fn()
            ev[1].record()
            torch.cuda.synchronize()
            times[name].append(ev[0].elapsed_time(ev[1]))
    for name, ts in times.items():
        print(f"{tag} {name}: median {sorted(ts)[len(ts) // 2]:.2f}: " + " ".join(f"{t:.2f}" for t in ts), flush=True)
    busy = torch.randn(16384, 16384, device="cuda", dtype=torch.float16)
    print(f"{tag} host issue ms per call (GPU behind): ours "
          + " ".join(f"{issue_us(ours, busy, n=8) / 1e3:.2f}" for _ in range(3))
          + ", cudnn " + " ".join(f"{issue_us(theirs, busy, n=8) / 1e3:.2f}" for _ in range(3)), flush=True)


def _swing_profiled(a, tag, ours, profile, ProfilerActivity):  # noqa: N803
    """a.profiled calls of `ours`, each under its own profiler: the kernels' GPU time by name."""
    for i in range(a.profiled):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            ours()
            torch.cuda.synchronize()
        per = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                key = re.sub(r"\s+", " ", e.name)[:60]
                c, t = per.get(key, (0, 0.0))
                per[key] = (c + 1, t + e.device_time_total / 1e3)
        total = sum(t for _, t in per.values())
        rows = sorted(per.items(), key=lambda kv: -kv[1][1])[:8]
        print(f"{tag} profiled call {i}: kernels {total:.2f} ms; " +
              "; ".join(f"{t:.2f} ms x{c} {k}" for k, (c, t) in rows), flush=True)

def rows(a):
    """The bwd bench's row (bench.bwd._case_rows: tileattn's gradients checked, then tileattn, cuDNN and FA2 timed
    in interleaved rounds, as the bench does) repeated: how often the row lands where."""
    from tileattn.bench import bwd as bench
    from tileattn.bench.common import warm_up_gpu
    for dtype in a.dtypes.split(","):
        dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        warm_up_gpu(dt)
        for rep in range(a.reps):
            ms, ok = bench._case_rows((4, 32, a.N, a.D, a.causal), dt, ("cudnn", "fa2"), [], print)
            ours = ms.get("tileattn", float("nan"))
            print(f"ROW {dtype} N={a.N} D={a.D} causal={int(a.causal)} #{rep}: tileattn {ours * 1e3:6.1f} us, cuDNN "
                  f"{ms['cudnn'] * 1e3:6.1f}, FA2 {ms['fa2'] * 1e3:6.1f}; vs cuDNN {ms['cudnn'] / ours:.3f}, vs FA2 "
                  f"{ms['fa2'] / ours:.3f}; check {'ok' if ok else 'FAILED'}", flush=True)


def timeline(a):
    from torch.profiler import ProfilerActivity, profile

    import tileattn
    busy = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for n, d, causal, q, k, v, dout in _dense_rows(a):
        o = tileattn.attention(q, k, v, causal=causal)
        for _ in range(3):
            torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(4):
                busy @ busy  # the host runs ahead: the timeline shows the GPU alone
            for _ in range(a.reps):
                torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
        ev = sorted((e for e in prof.events() if e.device_type.name == "CUDA"),
                    key=lambda e: e.time_range.start)
        calls = []  # a call from each preprocess on (the queued matmuls before the first one dropped)
        for e in ev:
            if "preprocess" in e.name:
                calls.append([])
            if calls and "Memset" not in e.name:
                calls[-1].append(e)
        if not calls:
            print(f"TL N={n} D={d} causal={int(causal)}: no preprocess kernel in the profile", flush=True)
        for i, c in enumerate(calls):
            t0 = c[0].time_range.start
            parts = ", ".join(f"{re.sub(r'_kernel.*', '', e.name)[:24]} +{e.time_range.start - t0:.1f} "
                              f"({e.time_range.end - e.time_range.start:.1f})" for e in c)
            print(f"TL N={n} D={d} causal={int(causal)} call {i}: span "
                  f"{max(e.time_range.end for e in c) - t0:.1f} us: {parts}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("fwd", help="one forward call in the profiled range (Nsight Compute)")
    p.add_argument("--provider", default="tileattn", choices=("tileattn", "cudnn", "efficient"))
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=48)
    p.add_argument("--N", type=int, default=8192)
    p.add_argument("--D", type=int, default=1024)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--fp8", action="store_true", help="tileattn on e4m3 inputs (per-head descales)")
    p.set_defaults(func=fwd)
    p = sub.add_parser("bwd-one", help="one dense backward in the profiled range (Nsight Compute)")
    p.add_argument("--provider", default="tileattn", choices=("tileattn", "cudnn"))
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=32)
    p.add_argument("--N", type=int, default=4096)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.set_defaults(func=bwd_one)
    p = sub.add_parser("mla-one", help="one MLA decode in the profiled range (Nsight Compute)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--kv", type=int, default=1024)
    p.add_argument("--hq", type=int, default=64)
    p.add_argument("--sq", type=int, default=1)
    p.add_argument("--page", type=int, default=64)
    p.add_argument("--fp8", action="store_true", help="an e4m3 cache (the bench's fp8 rows)")
    p.add_argument("--sched", type=int, default=None,
                   help="force sweep.py's MLA_SCHED[SCHED] (MLA_SCHED_FP8 with --fp8)")
    p.set_defaults(func=mla_one)
    p = sub.add_parser("mla-scale", help="MLA runs with the same number kv_scale against a changing one")
    p.add_argument("--cases", default="128x1024,128x4096,32x1024", help="batch x kv length, comma-separated")
    p.set_defaults(func=mla_scale)
    p = sub.add_parser("small", help="timed vs kernel vs host time of the grids' short rows")
    p.add_argument("--N", default="1024,2048")
    p.add_argument("--D", default="64,128")
    p.add_argument("--breakdown", action="store_true", help="each kernel's GPU time too")
    p.set_defaults(func=small)
    p = sub.add_parser("host", help="where a call's host time goes (forward, backward, cuDNN beside)")
    p.add_argument("--N", type=int, default=1024)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--only", default="", help="a regular expression: the cases whose names match it")
    p.add_argument("--no-cprofile", action="store_true", help="no cProfile of the backward after the timings")
    p.set_defaults(func=host)
    p = sub.add_parser("flex-small", help="timed vs kernel vs host time of the flex bench's rows at a short N")
    p.add_argument("--N", type=int, default=2048)
    p.set_defaults(func=flex_small)
    p = sub.add_parser("swing", help="the split backward's call-to-call swing (D=256 causal)")
    p.add_argument("--N", type=int, default=4096)
    p.add_argument("--D", type=int, default=256)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--profiled", type=int, default=2)
    p.add_argument("--workspace-mib", type=lambda x: [int(v) for v in x.split(",")], default=None,
                   help="the split backward's WORKSPACE_BYTES values, MiB (default: the module's)")
    p.set_defaults(func=swing)
    p = sub.add_parser("split", help="per-kernel GPU time of the split backward (D > 128, torch.profiler)")
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--N", type=int, default=4096)
    p.add_argument("--D", default="256,512")
    p.set_defaults(func=split)
    p = sub.add_parser("rows", help="the bwd bench's row repeated (checked, timed against cuDNN and FA2)")
    p.add_argument("--N", type=int, default=1024)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--no-causal", dest="causal", action="store_false")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--dtypes", default="fp16,bf16")
    p.set_defaults(func=rows)
    p = sub.add_parser("timeline", help="the dense backward's GPU timeline: kernel starts, durations, gaps")
    p.add_argument("--N", default="1024,4096")
    p.add_argument("--D", default="64,128")
    p.add_argument("--reps", type=int, default=3)
    p.set_defaults(func=timeline)
    p = sub.add_parser("bwd", help="per-kernel GPU time of the flex and dense backward (torch.profiler)")
    p.set_defaults(func=bwd)
    a = ap.parse_args()
    a.func(a)


if __name__ == "__main__":
    main()
