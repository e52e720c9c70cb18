"""The `tileattn` command (also `python -m tileattn`).

    tileattn bench [dense] [--dtype fp16|bf16] [--long] [--providers ...] [--out FILE] [--plot FILE]
    tileattn bench fp8 [--fp8-dtypes e4m3,e5m2] [--head-dims 64,128] [--seqlens ...] [--out FILE]
    tileattn bench mla [--dtype bf16|fp16] [--out FILE]
    tileattn bench flex [--out FILE]
    tileattn bench bwd [--dtype fp16|bf16] [--seqlens ...] [--out FILE]
    tileattn bench large-d [--dtype fp16|bf16] [--head-dims 256,320,...] [--out FILE]
    tileattn bench decode [--quick] [--out FILE]
    tileattn info [--all]

With no CUDA GPU, `bench` says so and runs a small correctness demo through the Triton interpreter. `info`
prints the versions, the device, the environment switches set, and which kernel serves typical problems of
each op on this machine, with the reason every other one was skipped (--all: more problems).
"""
import argparse
import os
import sys

SUITES = ("dense", "fp8", "mla", "flex", "bwd", "large-d", "decode")


def _parser():
    p = argparse.ArgumentParser(prog="tileattn", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    b = sub.add_parser("bench", help="run a benchmark suite against the peers on this GPU")
    b.add_argument("suite", nargs="?", default="dense", choices=SUITES)
    b.add_argument("--dtype", default=None, choices=["fp16", "bf16"], help="default: fp16 (dense), bf16 (mla)")
    b.add_argument("--long", action="store_true", help="add N = 32K and 64K")
    b.add_argument("--providers", default="tileattn,cudnn,fa2,flex",
                   help="comma-separated subset of tileattn,cudnn,fa2,flex")
    b.add_argument("--fp8-dtypes", default="e4m3,e5m2", help="fp8 suite: comma-separated subset of e4m3,e5m2")
    b.add_argument("--head-dims", default=None, help="default: the suite's grid (dense, fp8: 64,128)")
    b.add_argument("--seqlens", default=None, help="comma-separated N values (default: the suite's grid)")
    b.add_argument("--quick", action="store_true", help="decode suite: batch 1 and 32, kv 4K and 32K only")
    b.add_argument("--out", default=None, help="results JSON (default: bench/results/<suite>.json)")
    b.add_argument("--plot", default=None, help="PNG plot (default: next to the JSON)")
    i = sub.add_parser("info", help="print what tileattn sees of this machine and which kernels serve what")
    i.add_argument("--all", action="store_true", help="more example problems")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    import torch
    if args.cmd in (None, "info"):
        from .info import print_info
        print_info(every=getattr(args, "all", False))
        return 0
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        from .bench.dense import cpu_demo
        return 0 if cpu_demo() else 1
    out = args.out or os.path.join("bench", "results", f"{args.suite.replace('-', '_')}.json")
    if args.suite == "bwd":
        from .bench import bwd
        seqlens = tuple(int(x) for x in args.seqlens.split(",")) if args.seqlens else (1024, 2048, 4096, 8192, 16384)
        doc = bwd.run(dtype=args.dtype or "fp16", seqlens=seqlens, out_json=out)
        print(f"\nwrote {out}")
        return 1 if doc["summary"]["check_failures"] else 0
    if args.suite == "flex":
        from .bench import flex
        doc = flex.run(out_json=out)
        print(f"\nwrote {out}")
        return 1 if doc["summary"]["check_failures"] else 0
    if args.suite == "mla":
        from .bench import mla
        doc = mla.run(dtype=args.dtype or "bf16", out_json=out)
        print(f"\nwrote {out}")
        return 1 if doc["summary"]["check_failures"] else 0
    if args.suite == "decode":
        from .bench import decode
        doc = decode.run(out_json=out, quick=args.quick)
        print(f"\nwrote {out}")
        return 1 if doc["summary"]["check_failures"] else 0
    if args.suite == "large-d":
        from .bench import large_d
        dims = tuple(int(x) for x in args.head_dims.split(",")) if args.head_dims else large_d.HEAD_DIMS
        doc = large_d.run(dtype=args.dtype or "fp16", head_dims=dims, out_json=out)
        print(f"\nwrote {out}")
        return 1 if doc["summary"]["check_failures"] else 0
    head_dims = tuple(int(x) for x in (args.head_dims or "64,128").split(","))
    seqlens = [int(x) for x in args.seqlens.split(",")] if args.seqlens else None
    if args.suite == "fp8":
        from .bench import fp8
        names = tuple(x for x in args.fp8_dtypes.split(",") if x)
        unknown = set(names) - set(fp8.FP8)
        if unknown:
            print(f"unknown fp8 dtypes: {sorted(unknown)}", file=sys.stderr)
            return 2
        doc = fp8.run(fp8_dtypes=names, head_dims=head_dims, seqlens=seqlens, out_json=out)
        print(f"\nwrote {out}")
        return 1 if doc["summary"]["check_failures"] else 0
    from .bench import dense
    plot = args.plot or os.path.splitext(out)[0] + ".png"
    providers = tuple(p for p in args.providers.split(",") if p)
    unknown = set(providers) - set(dense.PROVIDERS)
    if unknown:
        print(f"unknown providers: {sorted(unknown)}", file=sys.stderr)
        return 2
    grid = dense.Grid(dtype=args.dtype or "fp16", long=args.long, providers=providers, head_dims=head_dims,
                      seqlens=tuple(seqlens) if seqlens else None)
    doc = dense.run(grid, out_json=out, plot=plot)
    print(f"\nwrote {out} and {plot}")
    return 1 if doc["summary"]["check_failures"] else 0
