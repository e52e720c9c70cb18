"""A/B of the ring's scaling under torchrun (maintainer tool): `tileattn bench cp`'s multi-GPU body at the given
S_local, with the Hopper forward's grid persistent or not (--persistent 0: one CTA per tile, so SMs that the
NCCL transfer holds take fewer tiles instead of delaying a static share). NCCL settings come from the
environment. Prints one line per row and the summary.

    torchrun --nproc-per-node=2 scripts/cp_ab.py --seqlens 16384 --persistent 0
"""
import argparse
import dataclasses
import os

from tileattn.bench import cp
from tileattn.ops.common import configs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="16384")
    ap.add_argument("--persistent", type=int, default=1)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    for d, cfg in configs.SM90.items():  # the grid forced either way (the table picks it per length otherwise)
        configs.SM90[d] = dataclasses.replace(cfg, persistent=bool(args.persistent), one_cta_from=0)
    grid = cp.Grid(seqlens=tuple(int(s) for s in args.seqlens.split(",")))
    rank = int(os.environ["RANK"])
    doc = cp.run(grid, log=print if rank == 0 else (lambda *a, **k: None))
    if rank == 0:
        tag = args.label or f"persistent={args.persistent}"
        for r in doc["rows"]:
            c = r["case"]
            print(f"AB {tag} {r['provider']:>8} S={c['S_local']} causal={c['causal']} {c['mode']:>6} "
                  f"{r['ms']:8.3f} ms eff={r.get('scaling_efficiency', float('nan')):.3f}")
        print(f"AB {tag} summary {doc['summary']}")


if __name__ == "__main__":
    main()
