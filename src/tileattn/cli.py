"""The `tileattn` command (also `python -m tileattn`).

    tileattn --version
    tileattn info [--all]
    tileattn bench demo
    tileattn bench [dense] [--dtype fp16|bf16] [--long] [--providers ...] [--head-dims ...] [--seqlens ...]
                   [--append FILE] [--cluster]
    tileattn bench fp8 [--fp8-dtypes e4m3,e5m2] [--head-dims 64,128,256] [--seqlens ...]
    tileattn bench mla [--dtype bf16|fp16] [--groups seed,page1,long,hq128,b128,fp8,qk_shard]
    tileattn bench flex
    tileattn bench bwd [--dtype fp16|bf16] [--seqlens ...]
    tileattn bench large-d [--dtype fp16|bf16] [--head-dims 256,320,...]
    tileattn bench decode [--quick]
    tileattn bench cp [--simulate] [--dtype bf16|fp16] [--seqlens ...]   (multi-GPU: torchrun or >= 2 GPUs)
    (every bench suite: [--out FILE.json] [--plot FILE.png]; the plot defaults to the JSON's name, .png)

Every suite but `demo` measures against the peers on a CUDA GPU, prints a line per measured row and a summary,
and writes its results JSON and a PNG plot beside it; on a machine without a CUDA GPU it says so and exits 2.
`demo` runs a small correctness check of the kernels (through the Triton interpreter on a CPU machine).
`info` prints the versions, the device, the environment switches set, and which kernel serves typical problems
of each op on this machine, with the reason every other one was skipped (--all: more problems).
Exit status: 0 done, 1 a check of the kernels' outputs failed, 2 bad usage or no GPU for the suite.
"""
import argparse
import os
import sys

GPU_SUITES = ("dense", "fp8", "mla", "flex", "bwd", "large-d", "decode", "cp")
SUITES = ("demo",) + GPU_SUITES
# the options each suite reads (argparse's dest names); any other given to a suite is an error
SUITE_OPTIONS = {
    "demo": set(),
    "dense": {"dtype", "long", "providers", "head_dims", "seqlens", "append", "cluster"},
    "fp8": {"fp8_dtypes", "head_dims", "seqlens"},
    "mla": {"dtype", "groups"},
    "flex": set(),
    "bwd": {"dtype", "seqlens"},
    "large-d": {"dtype", "head_dims"},
    "decode": {"quick"},
    "cp": {"simulate", "dtype", "seqlens"},
}
OPTION_FLAGS = {"dtype": "--dtype", "long": "--long", "providers": "--providers", "head_dims": "--head-dims",
                "seqlens": "--seqlens", "fp8_dtypes": "--fp8-dtypes", "quick": "--quick",
                "simulate": "--simulate", "groups": "--groups", "append": "--append", "cluster": "--cluster"}


def _int_list(text):
    """'64,128' -> (64, 128): positive integers, comma-separated."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _name_list(allowed):
    def parse(text):
        names = tuple(x for x in text.split(",") if x)
        unknown = sorted(set(names) - set(allowed))
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"{unknown or text!r}: expected a comma-separated subset of "
                                             f"{','.join(allowed)}")
        return names
    return parse


def _parser():
    from . import __version__
    p = argparse.ArgumentParser(prog="tileattn", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"tileattn {__version__}")
    sub = p.add_subparsers(dest="cmd")
    b = sub.add_parser("bench", help="run a benchmark suite against the peers on this GPU (demo: a CPU check)")
    b.add_argument("suite", nargs="?", default="dense", choices=SUITES)
    b.add_argument("--dtype", default=None, choices=["fp16", "bf16"], help="default: fp16 (dense, bwd, large-d), "
                   "bf16 (mla, cp)")
    b.add_argument("--long", action="store_true", help="dense: add N = 32K and 64K, and the persistent-kernel "
                   "seed's providers (tileattn-persistent, tileattn-1cta, tileattn-e4m3, tileattn-e5m2) unless "
                   "--providers says")
    b.add_argument("--providers", default=None,
                   type=_name_list(("tileattn", "cudnn", "fa2", "flex", "tileattn-persistent", "tileattn-1cta",
                                    "tileattn-e4m3", "tileattn-e5m2", "tileattn-sm90", "tileattn-cluster")),
                   help="dense: comma-separated subset of tileattn,cudnn,fa2,flex,tileattn-persistent,tileattn-1cta,"
                   "tileattn-e4m3,tileattn-e5m2,tileattn-sm90,tileattn-cluster (default: the first four, the first "
                   "eight with --long; the last two at D=128 where the cluster kernel can run: triton 3.9 on Hopper)")
    b.add_argument("--fp8-dtypes", default=None, type=_name_list(("e4m3", "e5m2")),
                   help="fp8: comma-separated subset of e4m3,e5m2 (default: both)")
    b.add_argument("--head-dims", default=None, type=_int_list,
                   help="dense (default 64,128), fp8 (64,128,256), large-d (default 256,...,1024)")
    b.add_argument("--seqlens", default=None, type=_int_list, help="dense, fp8, bwd: comma-separated N values; cp: "
                   "tokens per GPU (S_local)")
    b.add_argument("--groups", default=None,
                   type=_name_list(("seed", "page1", "long", "hq128", "b128", "fp8", "qk_shard")),
                   help="mla: comma-separated subset of seed,page1,long,hq128,b128,fp8,qk_shard (default: all)")
    b.add_argument("--quick", action="store_true", help="decode: batch 1 and 32, kv 4K and 32K only")
    b.add_argument("--simulate", action="store_true", help="cp: predict the ring's scaling on this one GPU (step "
                   "compute against a device-to-device copy of each block) instead of running it on several")
    b.add_argument("--append", default=None, metavar="FILE", help="dense: add this run's rows to those of the "
                   "results file FILE (rows of the same case and provider replaced) and summarize both")
    b.add_argument("--cluster", action="store_true", help="dense: only the 2-CTA cluster kernel against the 1-CTA "
                   "kernel (tileattn-sm90,tileattn-cluster) at D=128 unless --providers / --head-dims say; with "
                   "--append, added to a results file made under another triton")
    b.add_argument("--out", default=None, help="results JSON (default: bench/results/<suite>.json)")
    b.add_argument("--plot", default=None, help="PNG plot (default: the JSON's path with .png)")
    i = sub.add_parser("info", help="print what tileattn sees of this machine and which kernels serve what")
    i.add_argument("--all", action="store_true", help="more example problems")
    return p


def _check_options(p, args):
    """Reject an option the chosen suite does not read (it would be silently ignored)."""
    defaults = vars(p.parse_args(["bench"]))
    for dest, flag in OPTION_FLAGS.items():
        if getattr(args, dest) != defaults[dest] and dest not in SUITE_OPTIONS[args.suite]:
            p.error(f"{flag} does not apply to `bench {args.suite}` (it takes: "
                    f"{', '.join(OPTION_FLAGS[d] for d in sorted(SUITE_OPTIONS[args.suite])) or 'no options'})")
    if getattr(args, "append", None) and not os.path.isfile(args.append):
        p.error(f"--append {args.append}: no such results file")
    if args.suite == "demo" and (args.out or args.plot):
        p.error("--out / --plot do not apply to `bench demo` (it writes no results)")


def _run_suite(args, out, plot):
    """The suite's results document (its summary carries check_failures)."""
    if args.suite == "bwd":
        from .bench import bwd
        return bwd.run(dtype=args.dtype or "fp16", seqlens=args.seqlens or (1024, 2048, 4096, 8192, 16384),
                       out_json=out, plot=plot)
    if args.suite == "cp":
        from .bench import cp
        grid = cp.Grid(dtype=args.dtype or "bf16", seqlens=args.seqlens or cp.Grid.seqlens)
        return cp.run(grid, simulate=args.simulate, out_json=out, plot=plot)
    if args.suite == "flex":
        from .bench import flex
        return flex.run(out_json=out, plot=plot)
    if args.suite == "mla":
        from .bench import mla
        return mla.run(dtype=args.dtype or "bf16", out_json=out, plot=plot, groups=args.groups or mla.GROUPS)
    if args.suite == "decode":
        from .bench import decode
        return decode.run(out_json=out, quick=args.quick, plot=plot)
    if args.suite == "large-d":
        from .bench import large_d
        return large_d.run(dtype=args.dtype or "fp16", head_dims=args.head_dims or large_d.HEAD_DIMS,
                           out_json=out, plot=plot)
    if args.suite == "fp8":
        from .bench import fp8
        return fp8.run(fp8_dtypes=args.fp8_dtypes or ("e4m3", "e5m2"), head_dims=args.head_dims or (64, 128, 256),
                       seqlens=args.seqlens, out_json=out, plot=plot)
    from .bench import dense
    if args.cluster:
        providers, head_dims = dense.CLUSTER_PROVIDERS, (dense.CLUSTER_D,)
    else:
        providers, head_dims = dense.S0_PROVIDERS if args.long else dense.PROVIDERS, (64, 128)
        if dense.cluster_available():
            providers += dense.CLUSTER_PROVIDERS
    grid = dense.Grid(dtype=args.dtype or "fp16", long=args.long, providers=args.providers or providers,
                      head_dims=args.head_dims or head_dims, seqlens=args.seqlens)
    return dense.run(grid, out_json=out, plot=plot, append=args.append)


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    if args.cmd in (None, "info"):
        from .info import print_info
        print_info(every=getattr(args, "all", False))
        return 0
    _check_options(p, args)
    import torch
    if args.suite == "demo":
        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
        from .bench.dense import cpu_demo
        return 0 if cpu_demo() else 1
    if not torch.cuda.is_available():
        print(f"tileattn bench {args.suite}: no CUDA GPU found; the suites measure against the peers on a GPU. "
              "`tileattn bench demo` runs a small correctness check here (through the Triton interpreter).",
              file=sys.stderr)
        return 2
    if args.suite == "dense" and args.cluster:  # (else only error rows, which --append would put over measured ones)
        from .bench.dense import cluster_reason
        why = cluster_reason()
        if why:
            print(f"tileattn bench dense --cluster: the cluster kernel cannot run here ({why}); it needs triton 3.9 "
                  "on a Hopper GPU", file=sys.stderr)
            return 2
    if args.suite == "cp" and not args.simulate:
        from .bench.cp import gpus_for_multi
        if gpus_for_multi() < 2:
            print("tileattn bench cp: the ring needs 2 or more GPUs (launch with torchrun --nproc-per-node=N, or on "
                  "a machine with N >= 2 visible GPUs); `tileattn bench cp --simulate` predicts it on this one GPU.",
                  file=sys.stderr)
            return 2
    out = args.out or os.path.join("bench", "results", f"{args.suite.replace('-', '_')}.json")
    plot = args.plot or os.path.splitext(out)[0] + ".png"
    doc = _run_suite(args, out, plot)
    if doc is None:  # torchrun's ranks other than 0: rank 0 reports
        return 0
    print(f"\nwrote {out} and {plot}" if os.path.exists(plot) else f"\nwrote {out} (no plot: matplotlib missing)")
    return 1 if doc["summary"]["check_failures"] else 0
