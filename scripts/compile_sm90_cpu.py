"""Compile the Hopper Gluon kernel for sm90 on a machine without a GPU (no launch): registers, spills and
shared memory of each variant, from ptxas, before spending device time.

    python scripts/compile_sm90_cpu.py [--dtype fp16|e4m3|e5m2] [--d 128] [--causal] [--vrow]
    python scripts/compile_sm90_cpu.py --mla [--dtype bf16] [--mla-cfg BN:ST:REGS] [--hq 64] [--sq 1]
    python scripts/compile_sm90_cpu.py --large-d [--d 1024] [--dv 1024] [--causal] [--lse] [--ld-cfg BN:BK:ST:DVS]

Triton compiles through its bundled ptxas; a stand-in driver answers the device queries (sm90, 132 SMs). The
PTX, cubin and LLVM IR go to --out (default /tmp, as sm90_cpu.*). Exits 1 when ptxas spills or serializes the
wgmma pipeline (tests/dense/test_sm90_compile.py runs it for the routed configs).
"""
import argparse
import os
import re
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


class _FakeDriver:
    def __init__(self):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="e4m3")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--softcap", type=float, default=0.0)
    p.add_argument("--lse", action="store_true")
    p.add_argument("--descale", action="store_true")
    p.add_argument("--cfg", default=None, help="BM:BN:ST:REGS[:Q_SLOTS]")
    p.add_argument("--mla", action="store_true", help="the MLA decode split kernel")
    p.add_argument("--mla-cfg", default="32:4:240", help="BN:ST:REGS")
    p.add_argument("--large-d", action="store_true", help="the large-D kernel (large_d_sm90.py)")
    p.add_argument("--dv", type=int, default=0)
    p.add_argument("--ld-cfg", default=None, help="BN:BK:ST:DVS[:Q_RESIDENT]")
    p.add_argument("--hq", type=int, default=64)
    p.add_argument("--sq", type=int, default=1)
    p.add_argument("--out", default="/tmp")
    args = p.parse_args()
    from triton.runtime import driver
    driver.set_active(_FakeDriver())
    from tileattn import hw
    hw.device_info = lambda dev: type("I", (), {"num_sms": 132, "smem_per_block": 232448})()
    if args.mla:
        return report(compile_mla(args), args.out)
    if args.large_d:
        return report(compile_large_d(args), args.out)
    from tileattn.ops.dense import launch_sm90
    from tileattn.ops.dense.fp8 import fp8_v_layout
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn,
          "e5m2": torch.float8_e5m2}[args.dtype]
    B, N, H, D = 1, 1024, 2, args.d
    q, k, v = (torch.randn(B, N, H, D).to(dt) for _ in range(3))
    fp8 = dt.itemsize == 1
    if fp8:
        os.environ.setdefault("TRITON_INTERPRET", "0")
        v = torch.empty(B, H, D, N, dtype=dt).permute(0, 3, 1, 2)  # sequence-major
    out = torch.empty(B, N, H, D, dtype=torch.bfloat16 if fp8 else dt)
    lse = torch.empty(B, H, N, dtype=torch.float32)
    cfg = launch_sm90.config_for(D, dt)
    if args.cfg:
        bm, bn, st, regs, *slots = (int(x) for x in args.cfg.split(":"))
        cfg = launch_sm90.Sm90Config(bm, bn, st, regs, q_slots=slots[0] if slots else 2)
    ds = (torch.ones(B, H), torch.ones(B, H), torch.ones(B, H)) if args.descale else (None, None, None)
    kernel, grid, a, kw = launch_sm90.kernel_call(q, k, v, out, lse, D ** -0.5, -1, 0 if args.causal else -1,
                                                  args.softcap, True, args.lse, cfg, programs=132,
                                                  descales=ds)
    return report(kernel.warmup(*a, grid=grid, **kw), args.out)


def compile_mla(args):
    from tileattn.ops.mla import launch_sm90, plan as mla_plan
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype if args.dtype in ("fp16", "bf16") else "bf16"]
    bn, st, regs = (int(x) for x in args.mla_cfg.split(":"))
    launch_sm90.config_for = lambda *a: None
    B, P, DC, DR = 4, 64, 512, 64
    seqlens = torch.full((B,), 1000, dtype=torch.int32)
    plan = mla_plan.MLADecodePlan.__new__(mla_plan.MLADecodePlan)
    plan.sm90 = plan.config = launch_sm90.MLASm90Config(bn, st, regs)
    plan.dc, plan.dr, plan.num_heads, plan.q_len, plan.page_size, plan.causal = DC, DR, args.hq, args.sq, P, True
    plan.row_blocks, plan.capacity, plan.scale = -(-args.hq * args.sq // launch_sm90.BLOCK_M), 140, 0.07
    plan.seqlens, plan.work = seqlens, torch.zeros(140, 4, dtype=torch.int32)
    plan.o_part, plan.lse_part = torch.empty(132, args.hq * args.sq, DC), torch.empty(132, args.hq * args.sq)
    qn = torch.randn(B, args.sq, args.hq, DC).to(dt)
    qp = torch.randn(B, args.sq, args.hq, DR).to(dt)
    ckv, kpe = torch.randn(64, P, DC).to(dt), torch.randn(64, P, DR).to(dt)
    bt = torch.zeros(B, 16, dtype=torch.int32)
    out, lse = torch.empty_like(qn), torch.empty(B, args.hq, args.sq)
    kernel, grid, a, kw = launch_sm90.kernel_call(plan, qn, qp, ckv, kpe, bt, torch.ones(1), out, lse, True)
    return kernel.warmup(*a, grid=grid, **kw)


def compile_large_d(args):
    from tileattn.ops.dense import large_d
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype if args.dtype in ("fp16", "bf16") else "fp16"]
    B, N, H, D, DV = 1, 1024, 2, args.d, args.dv or args.d
    q, k = (torch.randn(B, N, H, D).to(dt) for _ in range(2))
    v = torch.randn(B, N, H, DV).to(dt)
    out, lse = torch.empty(B, N, H, DV, dtype=dt), torch.empty(B, H, N, dtype=torch.float32)
    cfg = large_d.sm90_config(D, DV)
    if args.ld_cfg:
        bn, bk, st, dvs, *qr = (int(x) for x in args.ld_cfg.split(":"))
        cfg = large_d.LargeDSm90Config(bn, bk, st, dvs, q_resident=bool(qr and qr[0]))
    kernel, grid, a, kw = large_d.kernel_call_sm90(q, k, v, out, lse, D ** -0.5, args.causal, True, args.lse, cfg)
    return kernel.warmup(*a, grid=grid, **kw)


def report(ck, out_dir):
    base = os.path.join(out_dir, "sm90_cpu")
    open(base + ".llir", "w").write(ck.asm["llir"])
    open(base + ".ptx", "w").write(ck.asm["ptx"])
    print("shared", ck.metadata.shared)
    cubin = base + ".cubin"
    with open(cubin, "wb") as f:
        f.write(ck.asm["cubin"])
    from triton.backends.nvidia import compiler as nvc
    tool = os.path.join(os.path.dirname(nvc.__file__), "bin", "cuobjdump")
    res = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    print(re.sub(r"\s+", " ", res.split("Function")[-1])[:300])
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    for op in ("HGMMA", "QGMMA", "MUFU.EX2", "STL", "LDL", "SHFL", "PRMT", "LOP3", "SHF", "F2FP", "BAR.SYNC"):
        print(f"{op:10s} {len(re.findall(op, sass))}")
    # ptxas's own verdict on the wgmma pipeline (Triton drops it): C7511 / C7512 mean every wgmma waits for the
    # one before it
    ptxas = subprocess.run([os.path.join(os.path.dirname(tool), "ptxas"), "-arch=sm_90a", "-v", base + ".ptx",
                            "-o", base + "_check.cubin"], capture_output=True, text=True)
    serialized = "wgmma.mma_async instructions are serialized" in ptxas.stdout + ptxas.stderr
    spills = int(re.search(r"(\d+) bytes spill stores", ptxas.stdout + ptxas.stderr).group(1))
    print(f"wgmma serialized: {serialized}, spill stores: {spills} bytes")
    return 1 if serialized or spills else 0


if __name__ == "__main__":
    sys.exit(main())
