"""The README's figures, generated from the committed benchmark results (bench/results/<machine>/*.json).

    python scripts/readme_figures.py           # print the block
    python scripts/readme_figures.py --write   # replace the block between the README's markers
    python scripts/readme_figures.py --check   # exit 1 when the README's block differs (tests/test_readme.py)

Every figure the README states comes from here, so README and JSON cannot disagree: the README's prose names
no figure of its own (tests/test_readme.py also checks that).
"""
import argparse
import json
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
README = os.path.join(ROOT, "README.md")
BEGIN, END = "<!-- figures:begin (scripts/readme_figures.py --write) -->", "<!-- figures:end -->"
# (results directory, column title): the Triton releases the H100 results were measured under
MACHINES = (("h100", "triton 3.6"), ("h100-triton39", "triton 3.9"))
X, F, GBS, TF = "{:.2f}x", "{:.2f}", "{:.0f} GB/s", "{:.0f} TFLOPS"
# (suite file, summary key, what it measures, format)
FIGURES = (
    ("dense", "geomean_vs_cudnn", "dense forward fp16 (B=4 H=32, D 64/128, N 1K-16K, causal and not): geomean vs "
     "cuDNN", X),
    ("dense", "min_vs_cudnn", "the same grid: slowest row vs cuDNN", X),
    ("dense", "geomean_vs_fa2", "the same grid: geomean vs FlashAttention-2", X),
    ("dense", "geomean_vs_flex", "the same grid: geomean vs torch's compiled flex_attention", X),
    ("large_d", "vs_cudnn_H48_D256_full", "D=256 (B=1 H=48 N=8K) vs cuDNN", X),
    ("large_d", "min_vs_efficient_noncausal", "D 320-1024: slowest row vs torch's memory-efficient SDPA (the only "
     "torch backend there)", X),
    ("fp8", "fp8_vs_fp16_min_d128_n4k", "fp8 e4m3 forward vs our fp16, D=128 N >= 4K (slowest row)", X),
    ("fp8", "fp8_vs_fp16_min_d256", "fp8 e4m3 forward vs our fp16, D=256 N 4K-16K (slowest row)", X),
    ("fp8", "fp8_vs_fp16_geomean", "fp8 e4m3 vs our fp16, D 64/128, N 1K-16K (geomean)", X),
    ("fp8", "fp8_vs_cudnn_fp16_geomean", "fp8 e4m3 vs cuDNN fp16 (geomean)", X),
    ("bwd", "geomean_vs_cudnn", "backward fp16 (B=4 H=32, D 64/128, N 1K-16K): geomean vs cuDNN", X),
    ("bwd", "geomean_vs_fa2", "backward: geomean vs FlashAttention-2", X),
    ("bwd", "flex_geomean_vs_torch_flex", "flex backward (six mods, B=4 H=16 N=8K D=128): geomean vs torch flex",
     X),
    ("bwd", "d256_min_vs_cudnn", "backward D=256 (B=4 H=32, N 4K/8K, causal and not): slowest row vs cuDNN", X),
    ("bwd", "large_d_min_vs_best_torch", "backward D 320/512 (B=1 H=16, N 4K/8K): slowest row vs the fastest "
     "torch SDPA backend that runs it (math)", X),
    ("flex", "geomean_vs_torch_flex", "flex forward (six mods, B=4 H=16 N=8K D=128 bf16): geomean vs torch's "
     "compiled flex_attention", X),
    ("flex", "fp8_vs_bf16_geomean", "flex forward, fp8 e4m3 vs bf16 (geomean)", X),
    ("mla", "min_fraction_of_read_bw_seed_shapes", "MLA decode, batch 768, kv 1K/2K, Hq 16-64: slowest row as a "
     "fraction of the measured read bandwidth", F),
    ("mla", "min_gbps_seed_shapes", "the same rows: slowest row's cache read rate", GBS),
    ("mla", "hq128_min_tflops", "MLA decode, Hq 128 (batch 128/768, kv 1K-8K): slowest row", TF),
    ("mla", "b128_min_fraction_of_read_bw", "MLA decode, batch 128, kv 1K-8K, Hq 16-64: slowest row as a fraction "
     "of the measured read bandwidth", F),
    ("mla", "fp8_cache_speedup_vs_bf16_geomean", "MLA decode with an e4m3 cache vs a bf16 cache (geomean over the "
     "seed, batch 128 and Hq 128 rows)", X),
    ("mla", "qk_shard_on_vs_off", "MLA decode: QK_SHARD kernel vs both warpgroups computing the scores (geomean, "
     "batch 768 Hq 16-64 and Hq 128 rows)", X),
    ("decode", "min_fraction_of_read_bw_b32plus", "KV-cache decode (bf16, D=128), batch >= 32, kv >= 4K: slowest "
     "row as a fraction of the read bandwidth", F),
    ("decode", "geomean_vs_best_sdpa", "KV-cache decode: geomean vs the fastest torch SDPA backend (cuDNN)", X),
    ("decode", "min_vs_best_sdpa", "KV-cache decode: slowest row vs the fastest torch SDPA backend", X),
    ("decode", "fp8_cache_speedup_vs_bf16_geomean", "KV-cache decode: fp8 cache vs bf16 cache (geomean)", X),
)


def load(machine, suite):
    path = os.path.join(ROOT, "bench", "results", machine, f"{suite}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def render():
    """The README's figures block (markdown, markers included)."""
    cols = [(m, title) for m, title in MACHINES if any(load(m, s) for s, _, _, _ in FIGURES)]
    lines = [BEGIN, "", "| figure (H100) | " + " | ".join(t for _, t in cols) + " |",
             "| --- | " + " | ".join("---:" for _ in cols) + " |"]
    for suite, key, what, spec in FIGURES:
        cells = []
        for machine, _ in cols:
            doc = load(machine, suite)
            value = doc["summary"].get(key) if doc else None
            cells.append("-" if value is None else spec.format(value))
        lines.append(f"| {what} (`{suite}.json`: `{key}`) | " + " | ".join(cells) + " |")
    lines.append("")
    sources = []
    for machine, title in cols:
        docs = {s: load(machine, s) for s, _, _, _ in FIGURES}
        runs = sorted({f"{s}.json {d['commit'][:7]} ({d['date']})" for s, d in docs.items() if d})
        sources.append(f"bench/results/{machine}/ ({title}; torch "
                       f"{sorted({d['torch'] for d in docs.values() if d})[0]}): " + ", ".join(runs))
    lines += ["Measured with `tileattn bench <suite>` on one H100 80GB, peers in the same run; files and commits:",
              ""] + [f"- {s}" for s in sources] + ["", END]
    return "\n".join(lines)


def current(text):
    """The README's block, markers included (None when the markers are missing)."""
    i, j = text.find(BEGIN), text.find(END)
    return text[i:j + len(END)] if 0 <= i < j else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--write", action="store_true")
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    block = render()
    if not (a.write or a.check):
        print(block)
        return 0
    with open(README) as f:
        text = f.read()
    old = current(text)
    if old is None:
        print(f"README.md has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    if a.check:
        if old != block:
            print("README.md's figures differ from bench/results: run scripts/readme_figures.py --write",
                  file=sys.stderr)
            return 1
        return 0
    with open(README, "w") as f:
        f.write(text.replace(old, block))
    return 0


if __name__ == "__main__":
    sys.exit(main())
