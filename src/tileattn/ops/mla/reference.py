"""Plain PyTorch reference for MLA decode over a paged cache: the function the tests trust.

Gathers each sequence's pages into a dense [seqlen, Dc] / [seqlen, Dr] cache, then computes in float32 (or
`dtype`) with the masking of kernels.py. Rows that see nothing give out = 0 and lse = -inf.
"""
import torch

from ..common.paging import gather_tokens


def mla_decode_ref(q, caches, block_table, cache_seqlens, *, scale=None, causal=True, dtype=torch.float32,
                   kv_scale=1.0):
    """Reference for q = (q_nope [B, Sq, Hq, Dc], q_pe [B, Sq, Hq, Dr]) over the paged caches = (ckv_cache,
    kpe_cache) (their values times kv_scale are the keys and values).

    Returns (out [B, Sq, Hq, Dc], lse [B, Hq, Sq]) in `dtype` (pass q_nope.dtype for the input-precision
    computation of the tolerance rule)."""
    (q_nope, q_pe), (ckv_cache, kpe_cache) = q, caches
    B, Sq, Hq, Dc = q_nope.shape
    Dr = q_pe.shape[-1]
    scale = (Dc + Dr) ** -0.5 if scale is None else scale
    out = torch.zeros(B, Sq, Hq, Dc, dtype=dtype, device=q_nope.device)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=dtype, device=q_nope.device)
    for b in range(B):
        n = int(cache_seqlens[b])
        if n == 0:
            continue
        ckv = gather_tokens(ckv_cache, block_table, b, n).to(dtype) * kv_scale  # [n, Dc]
        kpe = gather_tokens(kpe_cache, block_table, b, n).to(dtype) * kv_scale  # [n, Dr]
        s = (q_nope[b].to(dtype) @ ckv.T + q_pe[b].to(dtype) @ kpe.T) * scale  # [Sq, Hq, n]
        if causal:
            t = torch.arange(Sq, device=s.device)[:, None, None]
            j = torch.arange(n, device=s.device)[None, None, :]
            s = s.masked_fill(j >= n - Sq + t + 1, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)  # [Sq, Hq]
        seen = torch.isfinite(row_lse)
        p = torch.exp(s - torch.where(seen, row_lse, 0.0)[..., None])
        p = torch.where(seen[..., None], p, 0.0)
        out[b] = (p @ ckv).to(dtype)
        lse[b] = row_lse.T.to(dtype)
    return out, lse
