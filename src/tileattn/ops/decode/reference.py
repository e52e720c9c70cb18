"""Plain PyTorch reference of attention over a KV cache: the function the tests and the benchmark trust.

Gathers each sequence's tokens (through the block table, or from the contiguous cache) into dense [n, Hkv, D]
keys and values, then computes in float32 (or `dtype`) with the masking and score modifiers of kernels.py.
"""
import torch

from ..common.paging import gather_tokens

_OPTS = dict(cu_seqlens_q=None, causal=True, scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None,
             k_scale=1.0, v_scale=1.0)


def kvcache_attention_ref(q, k_cache, v_cache, seqlens, block_table=None, *, dtype=torch.float32, **opts):
    """Reference for q ([B, Sq, Hq, D], or packed [total_q, Hq, D] with cu_seqlens_q) over the caches, sequence
    b attending to its first seqlens[b] tokens (the queries at its last positions). k_scale / v_scale: numbers
    or float32 tensors of 1 or Hkv elements. Returns (out like q, lse [B, Hq, Sq] or [Hq, total_q]) in `dtype`
    (pass q.dtype for the input-precision computation of the tolerance rule; an fp8 cache is then read as
    q's dtype too). opts: cu_seqlens_q, causal, scale, window, softcap, alibi_slopes, sinks, k_scale, v_scale,
    as kvcache_attention's."""
    unknown = set(opts) - set(_OPTS)
    if unknown:
        raise TypeError(f"kvcache_attention_ref: unknown options {sorted(unknown)}")
    o = {**_OPTS, **opts}
    cu_seqlens_q, causal, scale, window, softcap = (o["cu_seqlens_q"], o["causal"], o["scale"], o["window"],
                                                    o["softcap"])
    alibi_slopes, sinks, k_scale, v_scale = o["alibi_slopes"], o["sinks"], o["k_scale"], o["v_scale"]
    packed = cu_seqlens_q is not None
    B = seqlens.shape[0]
    Hq, D = q.shape[-2], q.shape[-1]
    Hkv = k_cache.shape[-2]
    G = Hq // Hkv
    scale = D ** -0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    lse = torch.full((Hq, q.shape[0]) if packed else (B, Hq, q.shape[1]), float("-inf"), dtype=dtype,
                     device=q.device)
    ks = torch.as_tensor(k_scale, dtype=torch.float32, device=q.device).reshape(-1, 1, 1).expand(Hkv, 1, 1)
    vs = torch.as_tensor(v_scale, dtype=torch.float32, device=q.device).reshape(-1, 1, 1).expand(Hkv, 1, 1)
    wl, wr = window
    for b in range(B):
        n = int(seqlens[b])
        if packed:
            s0, s1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
            qb = q[s0:s1]
        else:
            qb = q[b]
        m = qb.shape[0]
        lo_dtype = dtype if dtype == torch.float32 else q.dtype
        k = gather_tokens(k_cache, block_table, b, n).to(lo_dtype).to(dtype)  # [n, Hkv, D]
        v = gather_tokens(v_cache, block_table, b, n).to(lo_dtype).to(dtype)
        k = (k.transpose(0, 1) * ks.to(dtype)).repeat_interleave(G, 0)  # [Hq, n, D]
        v = (v.transpose(0, 1) * vs.to(dtype)).repeat_interleave(G, 0)
        s = (qb.to(dtype).transpose(0, 1) @ k.transpose(1, 2)).float() * scale  # [Hq, m, n]
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos = (n - m + torch.arange(m, device=q.device))[:, None]  # [m, 1]
        j = torch.arange(n, device=q.device)[None, :]
        if alibi_slopes is not None:
            s = s - alibi_slopes.float()[:, None, None] * (pos - j).abs().float()
        vis = torch.ones(m, n, dtype=torch.bool, device=q.device)
        if causal:
            vis &= j <= pos
        if wl >= 0:
            vis &= j >= pos - wl
        if wr >= 0:
            vis &= j <= pos + wr
        s = s.masked_fill(~vis, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [Hq, m]
        if sinks is not None:
            row_lse = torch.logaddexp(row_lse, sinks.float()[:, None].expand_as(row_lse))
        seen = torch.isfinite(row_lse)
        p = torch.exp(s - torch.where(seen, row_lse, 0.0)[..., None])
        p = torch.where(seen[..., None], p, 0.0).to(dtype)
        o = (p @ v).transpose(0, 1)  # [m, Hq, D]
        if packed:
            out[s0:s1] = o.to(dtype)
            lse[:, s0:s1] = row_lse.to(dtype)
        else:
            out[b] = o.to(dtype)
            lse[b] = row_lse.to(dtype)
    return out, lse
