"""Shared pieces of the benchmark suites: timing, output checks, results files, tables, plots."""
import datetime
import json
import math
import os
import subprocess

import torch

NOT_TIMED = "output check failed: not timed"  # a results row's error where the output check failed


def error_text(e, n=200):
    """An exception as a results row's `error`: its type and the first n characters of its message."""
    return f"{type(e).__name__}: {str(e)[:n]}"


def do_bench(fn):
    """Median milliseconds of fn() after warm-up (triton.testing.do_bench, events on the device)."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def warm_up_gpu(dtype=torch.float16, seconds=1.0):
    """Matmuls for about `seconds`: a freshly started GPU's first timings run slow (clocks, first-touch
    allocations) and would bias whichever row of a grid comes first."""
    import time
    x = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            x @ x
        torch.cuda.synchronize()


def read_bandwidth():
    """GB/s of a read-only reduction over 1 GiB (the ceiling a memory-bound kernel can approach)."""
    x = torch.ones(1 << 29, dtype=torch.float16, device="cuda")
    ms = do_bench(lambda: x.sum())
    x = None  # frees the GPU memory now
    return (1 << 30) / (ms * 1e-3) / 1e9


class Progress:
    """The prefix of a suite's row line: rows done of the grid's total and the seconds since the start
    (`[ 3/20   41 s] `), so that a long suite shows how far it is."""

    def __init__(self, total):
        import time
        self.total, self.done, self.t0, self._clock = total, 0, time.monotonic(), time.monotonic

    def __call__(self):
        self.done += 1
        width = len(str(self.total))
        return f"[{self.done:>{width}}/{self.total} {self._clock() - self.t0:5.0f} s] "


def bench_rounds(fns, rounds=2, warm_s=0.0):
    """{name: best of `rounds` do_bench medians} with the functions interleaved round by round (the order
    reversed every other round), so that slow drift of the clocks cannot favour whichever runs first. warm_s:
    first each function runs for about that many seconds, untimed."""
    import time
    for fn in fns.values():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm_s:
            fn()
            torch.cuda.synchronize()
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


def _summary_value(v):
    """A summary value as the summary line prints it (a list of rows: its length; their table is the suite's)."""
    if isinstance(v, float):
        return fmt(v, "{:.3f}")
    return f"[{len(v)} rows]" if isinstance(v, list) else v


def finish(doc, out_json, log, plot=None):
    """Print the suite's summary line, write its results file and its plot (when asked), return the document."""
    log("summary: " + ", ".join(f"{k}={_summary_value(v)}" for k, v in doc["summary"].items()))
    if out_json:
        write_json(out_json, doc)
    if plot:
        plot_doc(doc, plot)
    return doc


def _case_label(case):
    """A short x-axis label of a row's case: its values, the names of the grid's usual keys left out."""
    skip = {"dtype", "B", "H"}

    def value(v):
        return f"{v:.2f}" if isinstance(v, float) else v
    return " ".join(f"{k}={value(v)}" if not isinstance(v, bool) else (k if v else "") for k, v in case.items()
                    if k not in skip and v not in (None, "")).replace("  ", " ").strip()


def plot_doc(doc, path):
    """A PNG of a results document: for each measured case, each provider's TFLOPS (or GB/s for memory-bound
    suites), one bar per provider. Nothing is written without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in doc["rows"] if r.get("ms")]
    metric = "gbps" if any(r.get("gbps") for r in rows) else "tflops"
    cases, providers = [], []
    for r in rows:
        key = json.dumps(r["case"], sort_keys=True)
        if key not in cases:
            cases.append(key)
        if r["provider"] not in providers:
            providers.append(r["provider"])
    value = {(json.dumps(r["case"], sort_keys=True), r["provider"]): r.get(metric) for r in rows}
    width = 0.8 / max(len(providers), 1)
    fig, ax = plt.subplots(figsize=(min(24.0, max(6.0, 0.12 * len(cases) * max(len(providers), 1))), 5.0))
    for j, p in enumerate(providers):
        xs = [i + j * width for i, c in enumerate(cases) if value.get((c, p))]
        ys = [value[(c, p)] for c in cases if value.get((c, p))]
        ax.bar(xs, ys, width, label=p)
    if len(cases) <= 60:
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
        ax.set_xticklabels([_case_label(json.loads(c)) for c in cases], rotation=90, fontsize=6)
    else:  # too many to name: the x axis counts the cases in the JSON's order
        ax.set_xlabel("case (in the order of the JSON's rows)")
    ax.set_ylabel("GB/s" if metric == "gbps" else "TFLOPS")
    ax.set_title(f"tileattn bench {doc['suite']} ({doc['device']}, triton {doc['triton']}, {doc['commit'][:10]})",
                 fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def max_abs(a, b):
    return (a.float() - b.float()).abs().max().item()


def fmt(x, spec="{:.0f}"):
    return "-" if x is None else spec.format(x)
