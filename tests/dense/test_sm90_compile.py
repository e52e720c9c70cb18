"""The Hopper Gluon kernels compiled for sm90 without a GPU (scripts/compile_sm90_cpu.py, ptxas included): the
routed configs must not have their wgmma pipeline serialized by ptxas (C7511 / C7512: every wgmma then waits for
the one before it; nothing fails, the kernel is 11-16% slower), and the large-D kernel and the split backward's
score kernel (its masked forms) must not spill (the dense kernel spills 4-12 bytes with causal masks or the LSE;
the Hopper backward 84-132 bytes, ~480 at D=128 causal: docs/design/backward.md)."""
import os
import re
import subprocess
import sys

import pytest
import triton

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "compile_sm90_cpu.py")

CASES = [
    ["--dtype", "fp16", "--d", "128", "--causal", "--lse"],
    ["--dtype", "bf16", "--d", "256"],
    ["--dtype", "e4m3", "--d", "128"],
    ["--dtype", "e4m3", "--d", "256", "--causal"],
    ["--large-d", "--d", "256", "--causal", "--lse"],
    ["--large-d", "--d", "200", "--dv", "256"],
    ["--large-d", "--d", "384", "--causal", "--lse"],
    ["--large-d", "--d", "576", "--dv", "512", "--causal"],
    ["--large-d", "--d", "1024", "--lse"],
    ["--bwd-sm90", "--d", "128", "--causal"],
    ["--bwd-sm90", "--dtype", "bf16", "--d", "64"],
    ["--bwd-large-d", "--d", "256", "--causal", "--hkv", "4"],
    ["--bwd-large-d", "--dtype", "bf16", "--d", "256", "--softcap", "30", "--window", "100"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a).replace("--", ""))
def test_sm90_kernel_compiles_without_serialized_wgmma(args, tmp_path):
    from tileattn.ops.common.tma import gluon_available
    if not gluon_available():  # Gluon changes between releases: the kernels are verified on 3.6 and 3.9
        pytest.skip("the Gluon kernels need triton 3.6 or 3.9")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, SCRIPT, *args, "--out", str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=900)
    verdict = re.search(r"wgmma serialized: (\w+), spill stores: (\d+) bytes", res.stdout)
    assert verdict, res.stdout[-3000:] + res.stderr[-3000:]
    assert verdict.group(1) == "False"
    if "--bwd-large-d" in args:
        # the split backward's Hopper score kernel (D = 256): no spills. Under triton 3.9 only with dO in shared
        # memory (gluon_bwd_scores_sm90.DO_SHARED): with Q and dO both in registers 3.9's ptxas spilled 124 bytes,
        # 476 causal (docs/design/backward.md, triton 3.9). Both cases here are masked, the kernels that take dO in
        # shared memory; an unmasked one keeps dO in registers (launch_bwd_large_d._scores) and spills under 3.9
        assert int(verdict.group(2)) == 0
    if "--large-d" in args:
        # triton 3.9 spills at D = 384 with a causal mask and the LSE: 20 bytes under the GPU machine's ptxas 13.0,
        # which measured no slower (bench/results/h100-triton39/large_d.json: D = 384 within 2% of triton 3.6's);
        # 48 under the wheel's own ptxas 13.4 with --regAllocOptLevel=2 (what this check compiles with since
        # compile_sm90_cpu.py passes 3.9's flag; not yet timed on a GPU: docs/design/backward.md, triton 3.9)
        allowed = 48 if triton.__version__.startswith("3.9.") and args[2] == "384" else 0
        assert int(verdict.group(2)) <= allowed
