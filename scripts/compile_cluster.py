"""Compile the 2-CTA cluster forward prototype (ops/dense/gluon_cluster_sm90.py) for sm90 on a machine without a
GPU, through compile_sm90_cpu.py's harness (a stand-in driver reporting an H100; launches become compiles), and
print what ptxas made of it: registers, shared memory, spills, whether the wgmmas are serialized, the TMA
multicast and cluster instructions in the PTX / SASS.

    python scripts/compile_cluster.py [--dtype fp16|bf16] [--causal] [--n 4096] [--hq 4] [--hkv 2] [--out DIR]
                                      [--route] [--lse]

--lse compiles the kernel that writes the lse (RETURN_LSE; through --route: a call with return_lse=True).

--route compiles through tileattn.attention instead (dispatch, the launch plan, its KernelLauncher): the kernel
the route compiled is the one reported. Exit status 1 when ptxas spills or serializes the wgmmas, no multicast
load is found, or (--route) dispatch took another kernel.
"""
import argparse
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "src"))
import torch  # noqa: E402

import compile_sm90_cpu as h  # noqa: E402  (sets TRITON_INTERPRET=0 before triton is imported)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="fp16", choices=("fp16", "bf16"))
    p.add_argument("--causal", action="store_true")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--b", type=int, default=1)
    p.add_argument("--hq", type=int, default=4)
    p.add_argument("--hkv", type=int, default=2)
    p.add_argument("--out", default="/tmp/cluster_proto/build")
    p.add_argument("--loops", action="store_true", help="each innermost wgmma loop's length and LDL / STL")
    p.add_argument("--route", action="store_true", help="through tileattn.attention (dispatch and launch plan)")
    p.add_argument("--lse", action="store_true", help="the kernel that writes the lse (RETURN_LSE)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    h._setup()
    from tileattn.ops.dense import launch_cluster_sm90 as lc
    dt = h.DT[a.dtype]
    D = lc.D_SERVED
    q = h._rand(a.b, a.n, a.hq, D, dtype=dt)
    k, v = h._rand(a.b, a.n, a.hkv, D, dtype=dt), h._rand(a.b, a.n, a.hkv, D, dtype=dt)
    if a.route:
        import tileattn
        tileattn.attention(q, k, v, causal=a.causal, return_lse=a.lse)
        name, ck = h.COMPILED[-1]
        print(f"route: tileattn.attention compiled {name}")
        if name != "attn_fwd_cluster_sm90_kernel":
            return 1
    else:
        lse = torch.empty(a.b, a.hq, a.n, dtype=torch.float32) if a.lse else None
        ck = lc.launch(q, k, v, torch.empty_like(q), causal=a.causal, lse=lse)
    base = os.path.join(a.out, f"cluster_{a.dtype}_{'causal' if a.causal else 'full'}{'_lse' if a.lse else ''}")
    for ext in ("ttgir", "ptx"):
        with open(f"{base}.{ext}", "w") as f:
            f.write(ck.asm[ext])
    ptx = ck.asm["ptx"]
    md = ck.metadata
    print(f"kernel attn_fwd_cluster_sm90_kernel {a.dtype} {'causal' if a.causal else 'non-causal'}"
          f"{', lse' if a.lse else ''}: num_ctas "
          f"{md.num_ctas}, num_warps {md.num_warps}, shared {md.shared} bytes, grid {lc.grid(a.b, a.hq, a.n)} clusters")
    for i, meta in enumerate(getattr(md, "tensordesc_meta", None) or []):
        print(f"descriptor {i}: TMA box {meta.get('block_size')} swizzle {meta.get('swizzle')}")
    sass = h._sass(ck, base + ".cubin")
    with open(base + ".sass", "w") as f:
        f.write(sass)
    res = subprocess.run([h._tool("cuobjdump"), "-res-usage", base + ".cubin"], capture_output=True, text=True).stdout
    print(re.sub(r"\s+", " ", res.split("Function")[-1]).strip()[:300])
    ptxas = subprocess.run([*h._ptxas(), "-arch=sm_90a", "-v", f"{base}.ptx", "-o", base + "_check.cubin"],
                           capture_output=True, text=True)
    log = ptxas.stdout + ptxas.stderr
    serialized = "wgmma.mma_async instructions are serialized" in log
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    spill_st, spill_ld = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    print(f"ptxas: wgmma serialized: {serialized}, spill stores {spill_st} bytes, spill loads {spill_ld} bytes")
    for line in log.splitlines():
        if "warning" in line.lower() or "error" in line.lower():
            print("ptxas:", line.strip())
    # PTX: multicast loads (per issuing site) and the cluster machinery
    ptx_counts = {
        "cp.async.bulk.tensor ... multicast::cluster": len(
            re.findall(r"cp\.async\.bulk\.tensor[^;]*multicast::cluster", ptx)),
        "cp.async.bulk.tensor global->shared, unicast (Q)": len(re.findall(
            r"cp\.async\.bulk\.tensor\.\dd\.shared::(?:cta|cluster)\.global(?![^;]*multicast)", ptx)),
        "cp.async.bulk.tensor shared->global (O)": len(
            re.findall(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)),
        "mbarrier.arrive.shared::cluster (remote arrive)": len(re.findall(r"mbarrier\.arrive\.shared::cluster", ptx)),
        "fence.mbarrier_init.release.cluster": ptx.count("fence.mbarrier_init.release.cluster"),
        "barrier.cluster.arrive": ptx.count("barrier.cluster.arrive"),
        "%cluster_ctarank reads": ptx.count("%cluster_ctarank"),
        "%clusterid reads": len(re.findall(r"%clusterid", ptx)),
    }
    for name, n in ptx_counts.items():
        print(f"PTX  {name:48s} {n}")
    sass_counts = {
        "UTMALDG.*MULTICAST": len(re.findall(r"UTMALDG[^;]*MULTICAST", sass)),
        "UTMALDG (all)": len(re.findall(r"UTMALDG", sass)),
        "UTMASTG": len(re.findall(r"UTMASTG", sass)),
        "HGMMA": len(re.findall(r"HGMMA", sass)),
        "UCGABAR (cluster barrier)": len(re.findall(r"UCGABAR", sass)),
        "SYNCS.ARRIVE* (mbarrier arrives, local and remote)": len(re.findall(r"SYNCS\.ARRIVE", sass)),
        "MUFU.EX2": len(re.findall(r"MUFU\.EX2", sass)),
        "STG (plain global stores: the lse)": len(re.findall(r"\bSTG\b", sass)),
        "STL": len(re.findall(r"\bSTL\b", sass)),
        "LDL": len(re.findall(r"\bLDL\b", sass)),
    }
    for name, n in sass_counts.items():
        print(f"SASS {name:48s} {n}")
    if a.loops:
        for lo, hi, n, gmma, ldl, stl in h.loops(sass):
            print(f"loop {lo:#07x}-{hi:#07x}: {n} instructions, {gmma} wgmma, LDL {ldl}, STL {stl}")
    bad = serialized or spill_st != 0 or ptx_counts["cp.async.bulk.tensor ... multicast::cluster"] == 0
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
