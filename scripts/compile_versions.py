"""Compile the Hopper kernels the benchmarks route to and record what ptxas made of each, so that two Triton
releases (or two ptxas builds under one release) can be set side by side without a GPU.

    python scripts/compile_versions.py --out OUT.json [--only PREFIX] [--keep DIR]
    python scripts/compile_versions.py --table A.json B.json [C.json ...]

The first compiles every case below (compile_sm90_cpu.py's stand-in driver: nothing is launched) under the
Triton on the path and writes, per compiled kernel: registers, stack, shared memory, STL / LDL in the SASS, the
innermost wgmma loops (instructions, wgmmas, LDL, STL: compile_sm90_cpu.loops), HGMMA / QGMMA and MUFU counts,
spill bytes and ptxas's wgmma-serialization warning (ptxas rerun on the PTX with the flags Triton passes), the
ptxas version and the PTX ISA version. --keep DIR also writes each Gluon kernel's TTGIR, PTX and SASS there.
The second prints a markdown table, one column per file.

Triton 3.6 (the GPU image's) from its unpacked wheel: `PYTHONPATH=/tmp/t36full python scripts/compile_versions.py
...`. Triton 3.9 compiles sm90 with the ptxas it calls ptxas-blackwell: its bundled one (13.4, what a pip install
gets) unless TRITON_PTXAS_BLACKWELL_PATH names another (scripts/gpu_check.sh names the GPU machine's CUDA 13.0).
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import compile_sm90_cpu as cc  # noqa: E402 - sets the environment before triton (and torch) are imported

F16, BF16, E4 = cc.torch.float16, cc.torch.bfloat16, cc.torch.float8_e4m3fn
SM90_BWD = "TILEATTN_SM90_BWD"


def cases():
    """{name: thunk}: the routed kernels of the bench grids (dense, fp8, large-D, backward, flex)."""
    out = {}
    # dense forward: two consumers at D=64 below 2K (masked: 16K), three from there (configs.SM90_THREE_FROM)
    out["fwd-f16-D64-N1K"] = lambda: cc.dense(F16, 64, backend="dense.sm90")
    out["fwd-f16-D64-N1K-causal"] = lambda: cc.dense(F16, 64, backend="dense.sm90", causal=True)
    out["fwd-f16-D64-N4K-three"] = lambda: cc.dense(F16, 64, backend="dense.sm90", N=4096)
    out["fwd-f16-D64-N16K-three-causal"] = lambda: cc.dense(F16, 64, backend="dense.sm90", N=16384, causal=True)
    out["fwd-f16-D128"] = lambda: cc.dense(F16, 128, backend="dense.sm90")
    out["fwd-f16-D128-causal"] = lambda: cc.dense(F16, 128, backend="dense.sm90", causal=True)
    out["fwd-e4m3-D128"] = lambda: cc.dense(E4, 128, backend="dense.sm90")
    out["fwd-e4m3-D128-causal"] = lambda: cc.dense(E4, 128, backend="dense.sm90", causal=True)
    # D=256 (and above) forward: the large-D Gluon kernel (dispatch: D and Dv in [193, 384], or >= 512)
    for d, c in ((256, False), (256, True), (512, False), (1024, False)):
        out[f"fwd-large-f16-D{d}" + ("-causal" if c else "")] = lambda d=d, c=c: cc.dense(
            F16, d, backend="dense.large_d_sm90", H=2, causal=c)
    # Hopper backward (D <= 128), the bench's 32 heads: rotated walks below 16K without a mask, paired (D=128
    # causal up to 4K), plain otherwise (launch_bwd_sm90.grid)
    for d in (64, 128):
        for c in (False, True):
            for n in (4096, 16384):
                out[f"bwd-f16-D{d}-N{n // 1024}K" + ("-causal" if c else "")] = lambda d=d, c=c, n=n: cc._with_env(
                    SM90_BWD, "1", cc.backward, F16, d, c, False, 4, 0.0, (-1, -1), n)
    # D=256 backward: the split backward's Hopper score kernel (then cuBLAS GEMMs)
    out["bwd-f16-D256"] = lambda: cc.split_sm90(F16, 256, False)
    out["bwd-f16-D256-causal"] = lambda: cc.split_sm90(F16, 256, True)
    # flex forward (Gluon) and Hopper backward, bf16 D=128 (the flex bench's)
    for which in ("causal", "alibi_causal", "softcap_causal"):
        out[f"flex-fwd-bf16-D128-{which}"] = lambda w=which: cc.flex(BF16, 128, w)
        out[f"flex-bwd-bf16-D128-{which}"] = lambda w=which: cc.flex(BF16, 128, w, bwd_sm90=True)
    return out


def _count(pattern, text):
    return len(re.findall(pattern, text))


def ptxas_check(ptx_path):
    """(spill store bytes, spill load bytes, wgmma serialized, ptxas version) of the PTX under the ptxas and the
    flags Triton uses (3.9 adds --regAllocOptLevel=2)."""
    ptxas = cc._ptxas()
    res = subprocess.run([*ptxas, "-lineinfo", "-v", "--gpu-name=sm_90a", ptx_path, "-o", ptx_path + ".o"],
                         capture_output=True, text=True)
    log = res.stdout + res.stderr
    st = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    version = re.search(r"release (\d+\.\d+)", subprocess.run([ptxas[0], "--version"], capture_output=True,
                                                               text=True).stdout).group(1)
    return (int(st.group(1)) if st else -1, int(st.group(2)) if st else -1,
            "wgmma.mma_async instructions are serialized" in log, version)


def stats(ck, tmp):
    """What ptxas made of one compiled kernel (a dict of numbers)."""
    base = os.path.join(tmp, "cv")
    with open(base + ".ptx", "w") as f:
        f.write(ck.asm["ptx"])
    sass = cc._sass(ck, base + ".cubin")
    res = subprocess.run([cc._tool("cuobjdump"), "-res-usage", base + ".cubin"], capture_output=True, text=True).stdout
    reg, stack = (int(re.search(k + r":(\d+)", res).group(1)) for k in ("REG", "STACK"))
    spill_st, spill_ld, serialized, ptxas = ptxas_check(base + ".ptx")
    body = [line for line in sass.splitlines() if line.strip().startswith("/*")]
    text = "\n".join(body)
    return dict(
        reg=reg, stack=stack, shared=ck.metadata.shared, spill_st=spill_st, spill_ld=spill_ld, serialized=serialized,
        stl=_count(r"\bSTL\b", text), ldl=_count(r"\bLDL\b", text), instructions=len(body),
        hgmma=_count(r"\bHGMMA\b", text), qgmma=_count(r"\bQGMMA\b", text), mufu=_count(r"\bMUFU\.", text),
        ex2=_count(r"\bMUFU\.EX2\b", text), setmaxreg=_count(r"SETMAXREG", text),
        loops=[list(x[2:]) for x in cc.loops(sass)], ptxas=ptxas,
        ptx_isa=re.search(r"^\.version (\S+)", ck.asm["ptx"], re.M).group(1))


def collect(out_path, only, keep, tmp):
    import triton
    res = {"triton": triton.__version__, "cases": {}}
    for name, fn in cases().items():
        if only and not any(name.startswith(o) for o in only):
            continue
        cc.COMPILED.clear()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        rows = {}
        for kname, ck in cc.COMPILED:
            if "ttgir" not in ck.asm or "wgmma" not in ck.asm["ptx"]:
                continue  # (the Triton preprocess and conversions: not the kernels compared here)
            rows[kname] = stats(ck, tmp)
            if keep:
                os.makedirs(keep, exist_ok=True)
                for ext in ("ttgir", "ptx"):
                    with open(os.path.join(keep, f"{name}.{kname}.{ext}"), "w") as f:
                        f.write(ck.asm[ext])
                with open(os.path.join(keep, f"{name}.{kname}.sass"), "w") as f:
                    f.write(cc._sass(ck, os.path.join(tmp, "cv.cubin")))
            print(name, kname, json.dumps(rows[kname]), flush=True)
        res["cases"][name] = rows
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)


def _cell(s):
    if s is None:
        return "-"
    inner = "; ".join(f"{n}/{g}" + (f" L{ld}S{st}" if ld or st else "") for n, g, ld, st in s["loops"])
    return (f"{s['reg']}r {s['stack']}stk {s['shared'] // 1024}K spill {s['spill_st']}/{s['spill_ld']} "
            f"STL/LDL {s['stl']}/{s['ldl']} GMMA {s['hgmma'] + s['qgmma']} EX2 {s['ex2']} MUFU {s['mufu']}"
            + (" SERIAL" if s["serialized"] else "") + f" loops [{inner}]")


def table(paths):
    files = [json.load(open(p)) for p in paths]
    heads = [f"{os.path.basename(p)} (triton {f['triton']})" for p, f in zip(paths, files)]
    print("| case / kernel | " + " | ".join(heads) + " |")
    print("| --- |" + " --- |" * len(files))
    names = [n for n in files[0]["cases"]]
    for name in names:
        kernels = sorted({k for f in files for k in f["cases"].get(name, {})})
        for k in kernels:
            cells = [_cell(f["cases"].get(name, {}).get(k)) for f in files]
            print(f"| {name} `{k}` | " + " | ".join(cells) + " |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", help="write the cases' numbers under the Triton on the path to this file")
    p.add_argument("--only", action="append", help="cases whose names start so (repeatable)")
    p.add_argument("--keep", help="also write each kernel's TTGIR, PTX and SASS into this directory")
    p.add_argument("--tmp", default="/tmp")
    p.add_argument("--table", nargs="+", help="print the markdown table of these files")
    a = p.parse_args()
    if a.table:
        table(a.table)
        return 0
    cc._setup()
    collect(a.out, a.only, a.keep, a.tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
