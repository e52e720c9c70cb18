"""Time MLA decode configs (ops/mla/plan.py CONFIGS and variants) on the GPU, output checked first.

    python scripts/sweep_mla.py [--quick]
Prints GB/s per (shape, config) and the read bandwidth of the same run.
"""
import argparse

import torch

import tileattn
from tileattn.bench.common import do_bench
from tileattn.bench.mla import DC, DR, check, make_inputs, read_bandwidth
from tileattn.ops.mla.launch_sm90 import MLASm90Config as G
from tileattn.ops.mla.plan import MLAConfig as C

CANDIDATES = [
    G(32, 4), G(32, 3), G(64, 2), G(16, 8), G(32, 4, 232),  # the Gluon kernel: block_n, stages, consumer regs
    C(64, 8, 2, 1), C(32, 8, 2, 1), C(32, 8, 3, 1), C(32, 4, 2, 1), C(64, 8, 1, 1), C(32, 4, 2, 2), C(64, 4, 2, 2),
    C(16, 4, 1, 2), C(16, 4, 1, 4),
]
QUICK = CANDIDATES[:5] + [C(64, 8, 2, 1), C(32, 4, 2, 1)]


def _name(cfg):
    if isinstance(cfg, G):
        return f"sm90 {cfg.block_n}/{cfg.stages}/{cfg.consumer_regs}"
    return f"{cfg.block_n}/{cfg.num_warps}/{cfg.num_stages}/{cfg.out_split}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    bw = read_bandwidth()
    print(f"read bandwidth {bw:.0f} GB/s", flush=True)
    shapes = [(768, 1024, 16, 1, 64), (768, 2048, 64, 1, 64), (16, 32768, 64, 1, 64), (768, 1024, 32, 1, 64)]
    if not a.quick:
        shapes += [(768, 2048, 16, 1, 64), (768, 1024, 64, 1, 1), (4, 8192, 64, 2, 64)]
    for batch, kv, hq, sq, page in shapes:
        qn, qp, ckv, kpe, table, seqlens = make_inputs(batch, kv, hq, sq, page, torch.bfloat16)
        nbytes = 2 * (batch * kv * (DC + DR) + batch * sq * hq * (DC + DR) + batch * sq * hq * DC)
        line = []
        for cfg in (QUICK if a.quick else CANDIDATES):
            try:
                plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, page_size=page, config=cfg)
                out = plan.run(qn, qp, ckv, kpe, table)
                ok, info = check(out, qn, qp, ckv, kpe, table, seqlens, sample=8)
                if not ok:
                    line.append(f"{_name(cfg)}: WRONG {info}")
                    continue
                ms = do_bench(lambda: plan.run(qn, qp, ckv, kpe, table))
                line.append(f"{_name(cfg)}: {nbytes / ms / 1e6:.0f}")
            except Exception as e:
                line.append(f"{_name(cfg)}: {type(e).__name__} {str(e)[:80]}")
        print(f"b{batch} kv{kv} h{hq} sq{sq} p{page} items={plan.num_items} chunk={plan.chunk}: " + " | ".join(line),
              flush=True)
        del qn, qp, ckv, kpe, table
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
