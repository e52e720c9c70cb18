"""Compile the Hopper Gluon forward kernel for sm90 on any machine (no GPU needed) and print what the
compiled kernel uses: registers, spills, shared memory, and the wgmma / exp2 / wait counts of its SASS.

    python scripts/inspect_sm90.py [--D 128] [--causal] [--softcap] [--window] [--sass FILE]

Triton ships ptxas and cuobjdump, and compiling needs no driver: a stand-in driver reports an sm90 target.
"""
import argparse
import collections
import os
import subprocess
import tempfile

import torch
import triton
import triton.runtime.driver as driver
from triton.backends.compiler import GPUTarget


class _Sm90Target:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--softcap", action="store_true")
    ap.add_argument("--window", action="store_true")
    ap.add_argument("--sass", help="write the SASS here")
    a = ap.parse_args()
    driver.set_active(_Sm90Target())
    from tileattn.ops.dense import launch_sm90

    B, S, H, D = 2, 256, 4, a.D
    q = torch.randn(B, S, H, D, dtype=torch.float16)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, S)
    cfg = launch_sm90.config_for(D)
    right = 0 if a.causal else (20 if a.window else -1)
    ck = launch_sm90.launch(q, q, q, out, lse, D ** -0.5, 100 if a.window else -1, right,
                            30.0 if a.softcap else 0.0, True, True, cfg=cfg, compile_only=True)
    cubin = tempfile.mktemp(suffix=".cubin")
    with open(cubin, "wb") as f:
        f.write(ck.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    usage = subprocess.run([tool, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
    # cuobjdump rather than ck.asm["sass"], which came back cut short for the larger (softcap) variants
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    os.unlink(cubin)
    if a.sass:
        with open(a.sass, "w") as f:
            f.write(sass)
    ops = collections.Counter()
    for line in sass.splitlines():
        for key in ("HGMMA", "MUFU.EX2", "WARPGROUP.DEPBAR", "USETMAXREG", "LDL", "STL", "BAR.SYNC", "UTMALDG",
                    "UTMASTG"):
            if key in line:
                ops[key] += 1
    print(f"config {cfg}; shared {ck.metadata.shared} B; warps {ck.metadata.num_warps}")
    print(usage.strip().splitlines()[-1].strip())
    print("SASS:", dict(ops))


if __name__ == "__main__":
    main()
