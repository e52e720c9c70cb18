"""Plain PyTorch reference for dense attention: the function the tests trust.

Computes in float32 by default (float64 on request) on whatever device the inputs live, with the same
masking semantics as the kernels (ops/common/masking.py): bottom-right causal alignment by default, windows,
softcap, GQA, Dv != D. Rows that see no key give out = 0 and lse = -inf.
"""
import math

import torch


def visibility_mask(seqlen_q, seqlen_k, causal, window, align_bottom_right=True, device=None):
    """Boolean [Sq, Sk] mask, True where key j is visible to query i."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    off = seqlen_k - seqlen_q if align_bottom_right else 0
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    vis = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        vis &= j <= i + off + right
    if left >= 0:
        vis &= j >= i + off - left
    return vis


def attention_ref(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, dtype=torch.float32):
    """Reference for q [B, Sq, Hq, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv].

    causal: True aligns the diagonal bottom-right (FlashAttention's convention, as `attention`), "top_left"
    as torch's SDPA (query i sees key j iff j <= i; also the window's alignment then).
    Returns (out [B, Sq, Hq, Dv] in `dtype`, lse [B, Hq, Sq] in `dtype`). Pass dtype=q.dtype to get the
    same computation in the input precision (the `ref_lp` of the tolerance rule). For fp8 inputs pass the
    dequantized values, and dtype=<their fp8 dtype> for the `ref_lp` of fp8 attention: float32 arithmetic
    with the probabilities rounded to that dtype as the kernels round them (scaled by 2 ** P_SHIFT first,
    ops/common/fp8.py); out and lse in float32.
    """
    quantize_p = dtype if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else None
    if quantize_p is not None:
        dtype = torch.float32
    align_bottom_right = causal != "top_left"
    causal = bool(causal)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    group = Hq // Hkv
    qf = q.to(dtype).transpose(1, 2)  # [B, Hq, Sq, D]
    kf = k.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)  # [B, Hq, Sk, D]
    vf = v.to(dtype).transpose(1, 2).repeat_interleave(group, dim=1)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # [B, Hq, Sq, Sk]
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    vis = visibility_mask(Sq, Sk, causal, window, align_bottom_right, device=q.device)
    s = s.masked_fill(~vis, float("-inf"))
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # the softmax's precision
    lse = torch.logsumexp(s.to(wide), dim=-1)  # [B, Hq, Sq]
    seen = vis.any(dim=-1)  # [Sq]
    p = torch.exp(s.to(wide) - torch.where(seen, lse, torch.zeros_like(lse))[..., None]).to(dtype)
    if quantize_p is not None:
        from ..common.fp8 import P_SHIFT
        p = (p * 2.0 ** P_SHIFT).to(quantize_p).to(dtype) * 2.0 ** -P_SHIFT
    out = torch.matmul(p, vf)  # [B, Hq, Sq, Dv]
    out = out.transpose(1, 2).contiguous()
    lse = torch.where(seen, lse, torch.full_like(lse, -math.inf))
    return out, lse.to(dtype)


def varlen_attention_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, dtype=torch.float32, **kwargs):
    """Reference for the packed layout: q [total_q, Hq, D], k/v [total_k, Hkv, D(v)].

    Returns (out [total_q, Hq, Dv], lse [Hq, total_q]).
    """
    outs, lses = [], []
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        qb = q[cq[b]:cq[b + 1]].unsqueeze(0)
        kb = k[ck[b]:ck[b + 1]].unsqueeze(0)
        vb = v[ck[b]:ck[b + 1]].unsqueeze(0)
        if qb.shape[1] == 0:
            continue
        o, lse = attention_ref(qb, kb, vb, dtype=dtype, **kwargs)
        outs.append(o[0])
        lses.append(lse[0])
    Hq, Dv = q.shape[1], v.shape[2]
    out = torch.cat(outs) if outs else q.new_zeros(0, Hq, Dv, dtype=dtype)
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(Hq, 0, dtype=dtype)
    return out, lse
