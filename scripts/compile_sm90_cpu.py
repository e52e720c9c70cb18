"""Compile tileattn's kernels for sm90 on a machine without a GPU (nothing is launched): what ptxas makes of
them, before spending device time.

    python scripts/compile_sm90_cpu.py [--dtype fp16|bf16|e4m3|e5m2] [--d 128] [--causal] [--lse] [--softcap X]
                                       [--pingpong 0|1] [--exp2-fma 0|1|2] [--consumers 2|3]
                                       [--epilogue tma|deferred|kstage]
    python scripts/compile_sm90_cpu.py --large-d [--d 1024] [--dv 1024] [--causal] [--lse]
    python scripts/compile_sm90_cpu.py --mla [--dtype bf16] [--hq 64] [--sq 1] [--shard | --seesaw]
    python scripts/compile_sm90_cpu.py --bwd 64,64,4,2 [--d 128] [--causal]
    python scripts/compile_sm90_cpu.py --bwd-sm90 [--d 128] [--causal] [--hkv 4] [--n 16384]
                                       (the Hopper backward, TILEATTN_SM90_BWD=1; it prints the walks N takes)
    python scripts/compile_sm90_cpu.py --bwd-large-d [--d 512] [--causal] [--hkv 4] [--softcap X] [--window L]
                                                  (D > 128 backward: split (D = 256: the Hopper score kernel), varlen)
    python scripts/compile_sm90_cpu.py --fingerprint OUT.json [--compare OLD.json] [--only NAME_PREFIX]

The first three compile one routed Gluon kernel through the public API (dispatch chooses it, as on an H100)
and print its registers, spills, shared memory, instruction counts and ptxas's verdict on the wgmma pipeline
(Triton drops it: C7511 / C7512 mean every wgmma waits for the one before it); exit 1 when ptxas spills or
serializes (tests/dense/test_sm90_compile.py runs them for the routed configs).

--fingerprint compiles every kernel variant the benchmarks and tests lean on (dense Gluon and Triton, fp8,
large-D, backward, flex, MLA) and writes a hash of each one's SASS: a refactor that must not change the
kernels proves it with --compare against the file of the revision before (identical SASS, identical speed).
Under triton 3.6 the bundled ptxas (12.8) schedules the seesaw kernel differently from run to run on the same PTX
(with address randomization; without it, still with the line info), so that hash is no check there:
compare the kernel's PTX without line info (its .loc / .file lines and debug sections), or its SASS under 3.9.

Triton compiles through its bundled ptxas; a stand-in driver reports an H100 (sm90, 132 SMs, 227 KB), the
Triton launch is replaced by a compile, and the host code runs on CPU tensors as it would on the GPU.

Another Triton than the environment's (the GPU machines' 3.6, whose compiler fails on code that 3.9 takes):
unpack its wheel into a directory and put that first, `PYTHONPATH=DIR python scripts/compile_sm90_cpu.py ...`.
"""
import argparse
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "0"  # before triton is imported
os.environ["TILEATTN_DIRECT_LAUNCH"] = "0"
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
COMPILED = []  # (kernel name, compiled kernel) of every launch since the last clear


def _setup():
    """Stand-in driver, H100 facts, launches turned into compiles, CPU tensors let through the checks."""
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from host_overhead import fake_cuda_driver  # this directory: the same stand-in the launch checks use
    driver.set_active(fake_cuda_driver()[0])
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        COMPILED.append((self.fn.__name__, kernel))
        return kernel
    JITFunction.run = compile_only
    from tileattn import hw
    h100 = hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448)
    hw.device_info = lambda device: h100
    hw.is_hopper = lambda device: True
    hw.check_kernel_device = lambda device, what: None


def _tool(name):
    """A CUDA tool: the copy Triton's package carries, else the machine's (a slim Triton carries none)."""
    import shutil

    from triton.backends.nvidia import compiler as nvc
    bundled = os.path.join(os.path.dirname(nvc.__file__), "bin", name)
    return bundled if os.path.exists(bundled) else (shutil.which(name) or f"/usr/local/cuda/bin/{name}")


def _ptxas():
    """The ptxas Triton itself runs for sm90 (3.9 compiles Hopper with its newer ptxas-blackwell) and the flags
    it adds (3.9: --regAllocOptLevel=2)."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas
    return [get_ptxas(90).path] + (["--regAllocOptLevel=2"] if triton.__version__ >= "3.9" else [])


def _sass(ck, path):
    with open(path, "wb") as f:
        f.write(ck.asm["cubin"])
    return subprocess.run([_tool("cuobjdump"), "-sass", path], capture_output=True, text=True).stdout


def _rand(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


# ---- variants ---------------------------------------------------------------------------------------------------
def dense(dt, D, Dv=None, backend=None, N=1024, B=1, H=4, Hkv=2, packed_v=True, descale=False, config=None, **opts):
    """tileattn.attention on (B, N, H / Hkv, D / Dv) inputs; fp8: v as an Fp8V (packed) unless told otherwise."""
    import tileattn
    from tileattn import force_backend
    Dv = Dv or D
    q, k, v = _rand(B, N, H, D, dtype=dt), _rand(B, N, Hkv, D, dtype=dt), _rand(B, N, Hkv, Dv, dtype=dt)
    fp8 = dt.itemsize == 1
    if fp8 and packed_v:
        v = tileattn.fp8_v_layout(v)
    if descale:
        opts.update(q_descale=torch.ones(B, Hkv), k_descale=torch.ones(B, Hkv), v_descale=torch.ones(B, Hkv))
    with force_backend(backend, config=config):
        tileattn.attention(q, k, v, **opts)


def varlen(dt, D, backend="dense.triton", N=4096, **opts):
    import tileattn
    from tileattn import force_backend
    q, k, v = _rand(2 * N, 4, D, dtype=dt), _rand(2 * N, 2, D, dtype=dt), _rand(2 * N, 2, D, dtype=dt)
    cu = torch.tensor([0, N, 2 * N], dtype=torch.int32)
    with force_backend(backend):
        tileattn.varlen_attention(q, k, v, cu, cu, N, N, **opts)


def backward(dt, D, causal, varlen=False, hkv=2, softcap=0.0, window=(-1, -1), n=None):
    """The backward kernels on random forward results (no forward compiled); 4 query heads over hkv kv heads (4:
    no GQA, the bench grid's case, where Triton specializes the group size of 1 away), N = 1024. n: the sequence
    length instead, with the bench's 32 query heads (and 8 * hkv kv heads) in one batch, inputs left empty: the
    Hopper backward's schedule (launch_bwd_sm90.grid: plain, rotated or paired walks) depends on N and the heads."""
    from tileattn.ops.dense.bwd import attn_bwd
    from tileattn.ops.dense.problem import AttnOptions, AttnProblem, Call
    if n is None:
        q, k, v = _rand(2, 1024, 4, D, dtype=dt), _rand(2, 1024, hkv, D, dtype=dt), _rand(2, 1024, hkv, D, dtype=dt)
        do, o, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(2, 4, 1024)
    else:
        q, k, v = (torch.empty(1, n, h, D, dtype=dt) for h in (32, 8 * hkv, 8 * hkv))
        do, o, lse = torch.empty_like(q), torch.empty_like(q), torch.empty(1, 32, n)
    cu, opts = None, AttnOptions(scale=D ** -0.5, window=(window[0], 0 if causal else window[1]), softcap=softcap)
    if varlen:
        q, k, v, do, o = (t.reshape(-1, *t.shape[2:]) for t in (q, k, v, do, o))
        lse, cu = torch.randn(4, 2048), torch.tensor([0, 1024, 2048], dtype=torch.int32)
        opts = AttnOptions(scale=D ** -0.5, window=(-1, 0 if causal else -1), max_seqlen_q=1024, max_seqlen_k=1024)
    c = Call(q, k, v, o, lse, cu, cu, None, opts.scale, 0.0, 1.0)
    attn_bwd(AttnProblem.of(c, opts), c, do, None)


def flex(dt, D, which, gluon=True, bwd_sm90=False, N=1024):
    """The flex kernels (Gluon forward, or the Triton forward and backward; bwd_sm90: the Hopper backward
    alone, TILEATTN_SM90_BWD=1) on synthetic block lists; N not a multiple of 128: the Hopper kernels' tail
    mode."""
    from tileattn import mods
    from tileattn.ops.flex.bwd import flex_bwd
    from tileattn.ops.flex.launch_sm90 import Sm90Backend
    from tileattn.ops.flex.launch_triton import TritonBackend
    from tileattn.ops.flex.problem import FlexCall, FlexProblem
    from tileattn.ops.flex.trace import compile_mod
    B, H = 1, 2
    q, k, v = (_rand(B, H, N, D, dtype=dt) for _ in range(3))
    odt = torch.bfloat16 if dt.itemsize == 1 else dt
    smod = mmod = lists = None
    fn = mods.alibi(mods.alibi_slopes(H, device="cpu"))  # (held: the trace holds captures weakly)
    if which.startswith("alibi"):  # alibi, alibi_causal
        smod = compile_mod(fn, "score")
    elif which.startswith("softcap"):  # softcap, softcap_causal
        smod = compile_mod(lambda s, b, h, qi, ki: 30.0 * torch.tanh(s / 30.0), "score")
    if which in ("causal", "alibi_causal", "softcap_causal"):
        mmod = compile_mod(mods.causal, "mask")
        nb = -(-N // 128)
        num = torch.full((1, 1, nb), 1, dtype=torch.int32)
        idx = torch.arange(nb, dtype=torch.int32).expand(1, 1, nb, nb).contiguous()
        lists = (num, idx, num, idx)
    p = FlexProblem(B, H, H, N, N, D, D, dt, odt, q.device, D ** -0.5, smod, mmod, lists is not None,
                    return_lse=True, tma=True)
    c = FlexCall(q, k, v, torch.empty(B, H, N, D, dtype=odt), torch.empty(B, H, N), lists, lists)
    if bwd_sm90:
        _with_env("TILEATTN_SM90_BWD", "1", flex_bwd, p, c, torch.randn_like(q), None)
    elif gluon:
        Sm90Backend().run(p, c)
    else:
        TritonBackend().run(p, c)
        flex_bwd(p, c, torch.randn_like(q), None)


def mla(dt=torch.bfloat16, hq=64, sq=1, fp8_cache=False, qk_shard=False, portable=False, seesaw=False):
    import tileattn
    from tileattn.ops.mla.configs import SM90_FP8, SM90_PAIR, SM90_SHARD, SM90_SHARD_FP8
    B, P, DC, DR = 4, 64, 512, 64
    # (an fp8 cache without qk_shard: the kernel without QK_SHARD, which the fp8 table no longer puts first)
    force = tileattn.force_backend("mla.triton") if portable else \
        tileattn.force_backend(config=SM90_PAIR) if seesaw else \
        tileattn.force_backend(config=SM90_SHARD_FP8 if fp8_cache else SM90_SHARD) if qk_shard else \
        tileattn.force_backend(config=SM90_FP8) if fp8_cache else contextlib.nullcontext()
    with force:
        plan = tileattn.MLADecodePlan(torch.full((B,), 1000, dtype=torch.int32), num_heads=hq, q_len=sq,
                                      page_size=P,
                                      dtype=dt, cache_dtype=torch.float8_e4m3fn if fp8_cache else None)
    cdt = torch.float8_e4m3fn if fp8_cache else dt
    plan.run(_rand(B, sq, hq, DC, dtype=dt), _rand(B, sq, hq, DR, dtype=dt), _rand(64, P, DC, dtype=cdt),
             _rand(64, P, DR, dtype=cdt), torch.zeros(B, 16, dtype=torch.int32), return_lse=True)


def _with_env(name, value, fn, *args):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        fn(*args)
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def split_sm90(dt, D, causal, **kw):
    """The split backward with its Hopper score kernel on the stand-in's small grid (SCORES_SM90_MIN_WAVES = 0)."""
    from tileattn.ops.dense import launch_bwd_large_d
    old = launch_bwd_large_d.SCORES_SM90_MIN_WAVES
    launch_bwd_large_d.SCORES_SM90_MIN_WAVES = 0
    try:
        backward(dt, D, causal, hkv=4, **kw)
    finally:
        launch_bwd_large_d.SCORES_SM90_MIN_WAVES = old


def variants():
    """{name: thunk}: the kernel variants the fingerprint covers."""
    f16, bf16, e4, e5 = torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
    out = {}
    for dt in (f16, bf16):
        for D in (64, 128):
            for c in (False, True):
                out[f"sm90-{dt}-D{D}-c{c}"] = lambda dt=dt, D=D, c=c: dense(dt, D, backend="dense.sm90", causal=c,
                                                                            return_lse=c)
    out["sm90-f16-D256"] = lambda: dense(f16, 256, backend="dense.sm90")
    out["sm90-f16-D128-softcap-lse"] = lambda: dense(f16, 128, backend="dense.sm90", causal=True, softcap=30.0,
                                                     return_lse=True)
    out["sm90-bf16-D64-window"] = lambda: dense(bf16, 64, backend="dense.sm90", causal=True, window=(256, -1))
    out["sm90-e4m3-D128-causal-desc"] = lambda: dense(e4, 128, backend="dense.sm90", causal=True, return_lse=True,
                                                      descale=True)
    out["sm90-e5m2-D64"] = lambda: dense(e5, 64, backend="dense.sm90")
    out["sm90-e4m3-D64-causal"] = lambda: dense(e4, 64, backend="dense.sm90", causal=True)
    # three consumer warpgroups (Sm90Config.consumers; no table holds them yet)
    from tileattn.ops.common.configs import Sm90Config
    three = Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=160, consumers=3)
    out["sm90three-f16-D64"] = lambda: dense(f16, 64, backend="dense.sm90", config=three, N=2048)
    out["sm90three-e4m3-D64-causal"] = lambda: dense(e4, 64, backend="dense.sm90", config=three, N=2048, causal=True)
    for D in (64, 128):
        for c in (False, True):
            for N in (1024, 4096, 16384):
                out[f"triton-f16-D{D}-c{c}-N{N}"] = lambda D=D, c=c, N=N: dense(
                    f16, D, backend="dense.triton", B=2, N=N, causal=c, return_lse=c)
    out["triton-bf16-D256-c"] = lambda: dense(bf16, 256, backend="dense.triton", B=2, N=4096, causal=True,
                                              return_lse=True)
    out["triton-f16-D128-varlen-c"] = lambda: varlen(f16, 128, causal=True, return_lse=True)
    out["triton-f16-D64-softcap-window"] = lambda: dense(f16, 64, backend="dense.triton", B=2, N=4096, causal=True,
                                                         softcap=20.0, window=(100, -1))
    out["triton-e4m3-D128-varlen"] = lambda: varlen(e4, 128, return_lse=True)
    for D, Dv, c, lse in ((256, 256, True, True), (256, 256, False, False), (200, 256, False, False),
                          (384, 384, True, True), (576, 512, True, False), (1024, 1024, False, True),
                          (512, 512, True, False)):
        out[f"ldsm90-D{D}-{Dv}-c{c}-l{lse}"] = lambda D=D, Dv=Dv, c=c, lse=lse: dense(
            f16, D, Dv, backend="dense.large_d_sm90", H=2, causal=c, return_lse=lse)
    for D, c in ((320, False), (384, True), (512, False), (1024, True)):
        out[f"ldtriton-D{D}-{D}-c{c}"] = lambda D=D, c=c: dense(f16, D, backend="dense.large_d", H=2, causal=c,
                                                                return_lse=True)
    out["ldtriton-D512-window"] = lambda: dense(bf16, 512, backend="dense.large_d", H=2, causal=True,
                                                window=(64, -1))
    for D in (64, 128, 256):
        for c in (False, True):
            out[f"bwd-f16-D{D}-c{c}"] = lambda D=D, c=c: backward(f16, D, c)
    out["bwd-bf16-D128-varlen"] = lambda: backward(bf16, 128, True, varlen=True)
    out["bwd-f16-D320-cTrue"] = lambda: backward(f16, 320, True)
    out["bwdsplit-f16-D256-c"] = lambda: split_sm90(f16, 256, True)
    out["bwdsplit-bf16-D256-softcap-window"] = lambda: split_sm90(bf16, 256, False, softcap=30.0, window=(100, -1))
    # (unmasked: dO stays in registers under triton 3.9 too, launch_bwd_large_d._scores)
    out["bwdsplit-f16-D256"] = lambda: split_sm90(f16, 256, False)
    out["bwd-bf16-D512-cFalse"] = lambda: backward(bf16, 512, False)
    out["bwdsm90-f16-D128-c"] = lambda: _with_env("TILEATTN_SM90_BWD", "1", backward, f16, 128, True)
    # (no GQA, N = 1K: the paired walks, launch_bwd_sm90.PAIRED_MAX_KV_BLOCKS)
    out["bwdsm90-f16-D128-c-mha"] = lambda: _with_env("TILEATTN_SM90_BWD", "1", backward, f16, 128, True, False, 4)
    out["bwdsm90-bf16-D64"] = lambda: _with_env("TILEATTN_SM90_BWD", "1", backward, bf16, 64, False)
    for which in ("alibi", "softcap", "causal"):
        out[f"flexsm90-bf16-D128-{which}"] = lambda w=which: flex(bf16, 128, w)
        out[f"flextriton-bf16-D128-{which}"] = lambda w=which: flex(f16, 128, w, gluon=False)
    out["flexsm90-e4m3-D64-causal"] = lambda: flex(e4, 64, "causal")
    for which in ("alibi", "softcap", "causal", "alibi_causal"):
        out[f"flexbwdsm90-bf16-D128-{which}"] = lambda w=which: flex(bf16, 128, w, bwd_sm90=True)
    out["flexbwdsm90-f16-D64-causal"] = lambda: flex(f16, 64, "causal", bwd_sm90=True)
    for which in ("alibi_causal", "softcap", "causal"):  # lengths that are not multiples of the mask's blocks
        out[f"flexsm90tail-bf16-D128-{which}"] = lambda w=which: flex(bf16, 128, w, N=1000)
        out[f"flexbwdsm90tail-bf16-D128-{which}"] = lambda w=which: flex(bf16, 128, w, bwd_sm90=True, N=1000)
    out["flexbwdsm90tail-f16-D64-causal"] = lambda: flex(f16, 64, "causal", bwd_sm90=True, N=1000)
    out["mla-sm90-hq64"] = lambda: mla()
    out["mla-sm90-shard-hq128"] = lambda: mla(hq=128, qk_shard=True)
    out["mla-sm90-seesaw-hq128"] = lambda: mla(hq=128, seesaw=True)
    out["mla-triton-hq16"] = lambda: mla(hq=16, portable=True)
    out["mla-triton-hq64-fp8"] = lambda: mla(fp8_cache=True, portable=True)
    out["mla-sm90-hq64-fp8"] = lambda: mla(fp8_cache=True)
    out["mla-sm90-shard-hq128-fp8"] = lambda: mla(hq=128, fp8_cache=True, qk_shard=True)
    return out


def fingerprint(path, compare, tmp, only=None):
    res, failures = {}, 0
    for name, fn in variants().items():
        if only and not name.startswith(only):
            continue
        COMPILED.clear()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            res[name], failures = None, failures + 1
            continue
        rows = []
        for kname, ck in COMPILED:
            sass = _sass(ck, os.path.join(tmp, "fp.cubin"))
            body = "\n".join(line for line in sass.splitlines() if line.strip().startswith("/*"))
            rows.append([kname, hashlib.sha1(body.encode()).hexdigest()[:16], len(body.splitlines()),
                         ck.metadata.shared])
        res[name] = rows
        print(name, rows, flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=0)
    if compare:
        old = json.load(open(compare))
        diff = [n for n in old if (not only or n.startswith(only)) and old[n] != res.get(n)]
        print(f"COMPARE {len(old)} variants against {compare}: {len(diff)} differ" + (f": {diff}" if diff else ""))
        failures += len(diff)
    return 1 if failures else 0


def loops(sass):
    """[(first address, last address, instructions, wgmmas, LDL, STL)] of the SASS's loops that issue wgmmas, innermost
    first: a loop is a branch back to an earlier address, and 'innermost' holds no other such loop. The step loops'
    local-memory traffic (descriptor reloads, spills) shows here, per loop and warpgroup partition."""
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?);", line) for line in sass.splitlines()) if m]
    index = {a: i for i, (a, _) in enumerate(ins)}
    spans = []
    for i, (a, text) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) <= a and int(m.group(1), 16) in index:
            spans.append((index[int(m.group(1), 16)], i))
    spans = [(lo, hi) for lo, hi in spans if any("GMMA" in t for _, t in ins[lo:hi + 1])]
    out = []
    for lo, hi in spans:
        if any(lo <= lo2 and hi2 <= hi and (lo2, hi2) != (lo, hi) for lo2, hi2 in spans):
            continue  # holds another wgmma loop (barrier waits are loops too: they do not count)
        body = [t for _, t in ins[lo:hi + 1]]
        out.append((ins[lo][0], ins[hi][0], len(body), sum("GMMA" in t for t in body),
                    sum(re.search(r"\bLDL\b", t) is not None for t in body),
                    sum(re.search(r"\bSTL\b", t) is not None for t in body)))
    return out


def report(ck, out_dir, show_loops=False):
    """ptxas's resources and verdict on one compiled kernel (1 when it spills or serializes the wgmmas);
    show_loops: the wgmma loops' local-memory accesses too (loops())."""
    base = os.path.join(out_dir, "sm90_cpu")
    open(base + ".ptx", "w").write(ck.asm["ptx"])
    print("shared", ck.metadata.shared)
    sass = _sass(ck, base + ".cubin")
    if show_loops:
        for lo, hi, n, gmma, ldl, stl in loops(sass):
            print(f"loop {lo:#07x}-{hi:#07x}: {n} instructions, {gmma} wgmma, LDL {ldl}, STL {stl}")
    res = subprocess.run([_tool("cuobjdump"), "-res-usage", base + ".cubin"], capture_output=True, text=True).stdout
    print(re.sub(r"\s+", " ", res.split("Function")[-1])[:300])
    for op in ("HGMMA", "QGMMA", "MUFU.EX2", "STL", "LDL", "SHFL", "PRMT", "LOP3", "SHF", "F2FP", "BAR.SYNC"):
        print(f"{op:10s} {len(re.findall(op, sass))}")
    ptxas = subprocess.run([*_ptxas(), "-arch=sm_90a", "-v", base + ".ptx", "-o", base + "_check.cubin"],
                           capture_output=True, text=True)
    serialized = "wgmma.mma_async instructions are serialized" in ptxas.stdout + ptxas.stderr
    spills = int(re.search(r"(\d+) bytes spill stores", ptxas.stdout + ptxas.stderr).group(1))
    print(f"wgmma serialized: {serialized}, spill stores: {spills} bytes")
    return 1 if serialized or spills else 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="fp16", choices=sorted(DT))
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--dv", type=int, default=0)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--softcap", type=float, default=0.0)
    p.add_argument("--window", type=int, default=-1, help="--bwd-large-d: a left window bound")
    p.add_argument("--lse", action="store_true")
    p.add_argument("--large-d", action="store_true", help="the large-D Gluon kernel")
    p.add_argument("--mla", action="store_true", help="the MLA decode Gluon split kernel")
    p.add_argument("--shard", action="store_true", help="with --mla: the QK_SHARD kernel")
    p.add_argument("--seesaw", action="store_true",
                   help="with --mla: the seesaw kernel's pair schedule (configs.SM90_PAIR)")
    p.add_argument("--fp8-cache", action="store_true", help="with --mla: an e4m3 cache (the converter partition)")
    p.add_argument("--bwd", default=None, metavar="M,N,WARPS,STAGES",
                   help="the dense backward's dK/dV kernel with these tiles")
    p.add_argument("--bwd-sm90", action="store_true", help="the dense backward's Hopper (Gluon) kernel")
    p.add_argument("--pingpong", type=int, default=None, choices=(0, 1),
                   help="dense forward: the table's Sm90Config with pingpong set to this")
    p.add_argument("--consumers", type=int, default=None, choices=(2, 3),
                   help="the dense forward's consumer warpgroups (3: 160 registers each, no pingpong)")
    p.add_argument("--epilogue", default=None, choices=("tma", "deferred", "kstage"),
                   help="the dense forward's Sm90Config.epilogue")
    p.add_argument("--exp2-fma", type=int, default=None, choices=(0, 1, 2, 3),
                   help="the config's exp2_fma instead of the table's (of every 4 exp2s, how many on the FMA pipe)")
    p.add_argument("--hq", type=int, default=64)
    p.add_argument("--hkv", type=int, default=2, choices=(1, 2, 4),
                   help="--bwd-sm90, --bwd-large-d: kv heads of the 4 query heads")
    p.add_argument("--sq", type=int, default=1, help="--mla: query rows per sequence")
    p.add_argument("--n", type=int, default=None,
                   help="--bwd-sm90: the sequence length, with the bench's 32 query heads (default: N=1024, 4 heads)")
    p.add_argument("--fingerprint", default=None, help="write the SASS hashes of every variant to this file")
    p.add_argument("--compare", default=None, help="with --fingerprint: an earlier file that must be equal")
    p.add_argument("--only", default=None, help="with --fingerprint: the variants whose names start so")
    p.add_argument("--bwd-large-d", action="store_true",
                   help="the dense backward's kernels above D = 128 (the split backward's score kernel, varlen's)")
    p.add_argument("--out", default="/tmp")
    p.add_argument("--loops", action="store_true", help="each innermost wgmma loop's length and local-memory accesses")
    a = p.parse_args()
    _setup()
    if a.fingerprint:
        return fingerprint(a.fingerprint, a.compare, a.out, a.only)
    if a.bwd_large_d:  # the split backward's score kernel (batched) and the fused kernels (varlen)
        from tileattn.ops.dense import launch_bwd_large_d
        launch_bwd_large_d.SCORES_SM90_MIN_WAVES = 0  # (the small stand-in grid)
        backward(DT[a.dtype], a.d, a.causal, hkv=a.hkv, softcap=a.softcap, window=(a.window, -1))
        backward(DT[a.dtype], a.d, a.causal, varlen=True)
        names = ("bwd_scores_sm90_kernel" if a.d == 256 else "bwd_scores_kernel", "bwd_dkdv_large_d_kernel",
                 "bwd_dq_large_d_kernel")
        compiled = [name for name in names if any(n == name for n, _ in COMPILED)]  # (varlen D <= 256: whole rows)
        assert compiled, "no split backward kernel was compiled"
        return max(report(next(k for n, k in COMPILED if n == name), a.out, a.loops) for name in compiled)
    if a.bwd_sm90:
        os.environ["TILEATTN_SM90_BWD"] = "1"
        from tileattn.ops.common import launch_bwd_sm90
        grid = launch_bwd_sm90.grid

        def grid_shown(*args):  # which walks the problem takes (a constexpr of the kernel)
            g = grid(*args)
            print(f"schedule: {('plain', 'rotated', 'paired')[g[2]]} walks, grid {g[0]}, {g[1]} work items")
            return g
        launch_bwd_sm90.grid = grid_shown
        backward(DT[a.dtype], a.d, a.causal, hkv=a.hkv, n=a.n)
        launch_bwd_sm90.grid = grid
        name = "attn_bwd_sm90_kernel"
    elif a.bwd:
        from tileattn import force_backend
        from tileattn.ops.common.configs import BwdConfig
        tiles = tuple(int(x) for x in a.bwd.split(","))
        with force_backend(config=BwdConfig(tiles, tiles)):
            backward(DT[a.dtype], a.d, a.causal)
        name = "bwd_dkdv_kernel"
    elif a.mla:
        mla(DT[a.dtype] if a.dtype in ("fp16", "bf16") else torch.bfloat16, a.hq, a.sq, qk_shard=a.shard,
            fp8_cache=a.fp8_cache, seesaw=a.seesaw)
        name = "mla_split_sm90_seesaw_kernel" if a.seesaw else \
            "mla_split_sm90_shard_kernel" if a.shard else "mla_split_sm90_kernel"
    elif a.large_d:
        dense(DT[a.dtype], a.d, a.dv or a.d, backend="dense.large_d_sm90", H=2, causal=a.causal, return_lse=a.lse)
        name = "attn_fwd_large_d_sm90_kernel"
    else:
        import dataclasses

        from tileattn.ops.common.configs import sm90_config
        cfg = None
        if a.pingpong is not None:
            cfg = dataclasses.replace(sm90_config(a.d, DT[a.dtype]), pingpong=bool(a.pingpong))
        if a.exp2_fma is not None:
            cfg = dataclasses.replace(cfg or sm90_config(a.d, DT[a.dtype]), exp2_fma=a.exp2_fma)
        if a.epilogue is not None:
            cfg = dataclasses.replace(cfg or sm90_config(a.d, DT[a.dtype]), epilogue=a.epilogue)
        if a.consumers is not None:
            three = dict(consumer_regs=160, pingpong=False) if a.consumers == 3 else {}
            cfg = dataclasses.replace(cfg or sm90_config(a.d, DT[a.dtype]), consumers=a.consumers, **three)
        dense(DT[a.dtype], a.d, backend="dense.sm90", H=2, causal=a.causal, softcap=a.softcap, return_lse=a.lse,
              config=cfg)
        name = "attn_fwd_sm90_kernel"
    ck = next(k for n, k in COMPILED if n == name)
    return report(ck, a.out, a.loops)


if __name__ == "__main__":
    sys.exit(main())
