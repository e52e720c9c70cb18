"""Which rounding of P (the softmax probabilities) for the fp8 P V product: measured output error.

    python scripts/fp8_p_scheme.py

CPU, torch only: attention on random fp8-quantized inputs with P rounded to e4m3 / e5m2 either as it is or
after a scaling by 2 ** P_SHIFT (fp8.py), each against the float32 reference on the same dequantized inputs.
Both cost the same in the kernels (the scaling is folded into exp2's argument); the one with the smaller error
is chosen.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))


def main():
    from tileattn.ops.dense.fp8 import P_SHIFT, quantize_fp8
    from tileattn.ops.dense.reference import visibility_mask
    torch.manual_seed(0)
    B, H, D = 1, 4, 128
    print(f"{'dtype':6} {'N':>5} {'causal':>6} {'max err, P as is':>17} {'max err, P * 2^' + str(P_SHIFT):>17}"
          f" {'mean err, as is':>16} {'mean err, scaled':>17}")
    for dt in (torch.float8_e4m3fn, torch.float8_e5m2):
        for N in (512, 2048):
            for causal in (False, True):
                q, k, v = (torch.randn(B, N, H, D) for _ in range(3))
                qf, kf, vf = (x8.float() * d[:, None, :, None] for x8, d in (quantize_fp8(t, dt) for t in (q, k, v)))
                s = torch.einsum("bqhd,bkhd->bhqk", qf, kf) * D ** -0.5
                if causal:
                    s = s.masked_fill(~visibility_mask(N, N, True, (-1, -1)), float("-inf"))
                p = torch.softmax(s, dim=-1)
                ref = torch.einsum("bhqk,bkhd->bqhd", p, vf)
                errs = []
                for shift in (0, P_SHIFT):
                    pq = (p * 2.0 ** shift).to(dt).float() * 2.0 ** -shift
                    out = torch.einsum("bhqk,bkhd->bqhd", pq, vf)
                    errs.append((out - ref).abs())
                print(f"{str(dt).split('_')[1]:6} {N:>5} {int(causal):>6} {errs[0].max():>17.4f} {errs[1].max():>17.4f}"
                      f" {errs[0].mean():>16.5f} {errs[1].mean():>17.5f}")


if __name__ == "__main__":
    main()
