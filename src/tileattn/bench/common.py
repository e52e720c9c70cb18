"""Shared pieces of the benchmark suites: timing, output checks, results files, tables, plots."""
import datetime
import json
import math
import os
import subprocess

import torch


def do_bench(fn):
    """Median milliseconds of fn() after warm-up (triton.testing.do_bench, events on the device)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def read_bandwidth():
    """GB/s of a read-only reduction over 1 GiB (the ceiling a memory-bound kernel can approach)."""
    x = torch.ones(1 << 29, dtype=torch.float16, device="cuda")
    ms = do_bench(lambda: x.sum())
    del x
    return (1 << 30) / (ms * 1e-3) / 1e9


def bench_rounds(fns, rounds=2):
    """{name: best of `rounds` do_bench medians} with the functions interleaved round by round (the order
    reversed every other round), so that slow drift of the clocks cannot favour whichever runs first."""
    times = {p: [] for p in fns}
    order = list(fns)
    for r in range(rounds):
        for p in (order if r % 2 == 0 else order[::-1]):
            times[p].append(do_bench(fns[p]))
    return {p: min(t) for p, t in times.items()}


def attn_tflops(B, H, Sq, Sk, D, Dv, causal, ms):
    flops = 2.0 * B * H * Sq * Sk * (D + Dv)
    if causal and Sq == Sk:
        flops /= 2
    return flops / (ms * 1e-3) / 1e12


def git_commit():
    """TILEATTN_COMMIT when set (a copy of the tree whose .git, if any, is not the one measured), else git."""
    if os.environ.get("TILEATTN_COMMIT"):
        return os.environ["TILEATTN_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
        if sha.returncode == 0:
            return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def results_header(suite):
    import triton
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"suite": suite, "device": dev, "torch": torch.__version__, "triton": triton.__version__,
            "commit": git_commit(), "date": datetime.date.today().isoformat()}


def write_json(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def finish(doc, out_json, log):
    """Print the suite's summary line, write its results file (when asked), return the document."""
    log("summary: " + ", ".join(f"{k}={fmt(v, '{:.3f}') if isinstance(v, float) else v}"
                                for k, v in doc["summary"].items()))
    if out_json:
        write_json(out_json, doc)
    return doc


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def max_abs(a, b):
    return (a.float() - b.float()).abs().max().item()


def fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)
