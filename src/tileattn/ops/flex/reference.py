"""Plain PyTorch reference of flex attention (materialised scores), for fp8 checks.

The bf16/fp16 tests and benchmarks compare with torch's own flex_attention; this reference adds what torch
cannot emulate: the probabilities rounded to an fp8 dtype as the fp8 kernel rounds them (ops/dense/fp8.py).
Mods are called once on broadcast index tensors (b [B,1,1,1], h [1,H,1,1], q_idx [1,1,Sq,1], kv_idx
[1,1,1,Sk]), which suits mods written with elementwise torch operations and tensor indexing.
"""
import math

import torch


def flex_ref(q, k, v, score_mod=None, mask_mod=None, scale=None, dtype=torch.float32, quantize_p=None):
    """q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv] (real values). Returns (out [B, Hq, Sq, Dv],
    lse [B, Hq, Sq]) in `dtype`; quantize_p: round the probabilities to that fp8 dtype (scaled by 2 ** P_SHIFT)."""
    B, H, Sq, D = q.shape
    Sk, group = k.shape[2], H // k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    kf = k.to(dtype).repeat_interleave(group, dim=1)
    vf = v.to(dtype).repeat_interleave(group, dim=1)
    s = (torch.matmul(q.to(dtype), kf.transpose(-1, -2)) * scale).float()
    dev = q.device
    b = torch.arange(B, device=dev, dtype=torch.int32)[:, None, None, None]
    h = torch.arange(H, device=dev, dtype=torch.int32)[None, :, None, None]
    qi = torch.arange(Sq, device=dev, dtype=torch.int32)[None, None, :, None]
    ki = torch.arange(Sk, device=dev, dtype=torch.int32)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki).float()
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand(s.shape), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    seen = torch.isfinite(lse)
    p = torch.exp(s - torch.where(seen, lse, torch.zeros_like(lse))[..., None]).to(dtype)
    if quantize_p is not None:
        from ..common.fp8 import P_SHIFT
        p = (p * 2.0 ** P_SHIFT).to(quantize_p).to(dtype) * 2.0 ** -P_SHIFT
    out = torch.matmul(p, vf)
    return out, torch.where(seen, lse, torch.full_like(lse, -math.inf)).to(dtype)
