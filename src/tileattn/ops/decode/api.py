"""Public one-call entry point of attention over a KV cache (KVCachePlan, plan.py, is the plan/run form)."""
from __future__ import annotations

import torch

from ..common.paging import check_pages, check_seqlens
from .checks import check_cu_seqlens_q, check_run_args
from .plan import DecodeRun, KVCachePlan


def kvcache_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                      block_table: torch.Tensor | None = None, *, k_new: torch.Tensor | None = None,
                      v_new: torch.Tensor | None = None, cu_seqlens_q: torch.Tensor | None = None,
                      causal: bool = True, scale: float | None = None,
                      window: tuple[int, int] | list[int] = (-1, -1), softcap: float = 0.0,
                      alibi_slopes: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                      k_scale: float | torch.Tensor = 1.0, v_scale: float | torch.Tensor = 1.0,
                      return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of new queries over a KV cache, as FlashAttention's `flash_attn_with_kvcache` (decode,
    multi-token decode, chunked prefill).

    q: [B, Sq, Hq, D] (Sq 1 for decode, a few for speculative decoding), or packed [total_q, Hq, D] with
        cu_seqlens_q (int32 [B + 1], chunked prefill). float16 or bfloat16. D in {64, 128, 256}.
    k_cache, v_cache: paged [num_pages, page_size, Hkv, D] (page_size 1..256) with block_table (int32
        [B, max_pages], page ids), or contiguous [B, max_seqlen, Hkv, D] without. q's dtype, or float8_e4m3fn
        with k_scale / v_scale (numbers, or float32 tensors of one element, any shape, or [Hkv]: cache values
        times them are the keys and values).
    cache_seqlens: int32 [B], tokens already in each sequence's cache.
    k_new, v_new: optional, q's token layout with [Hkv, D] heads: appended in place at positions
        cache_seqlens ... cache_seqlens + Sq - 1 before attending (then the queries attend over
        cache_seqlens + Sq tokens); without them the queries attend over cache_seqlens tokens.
    GQA/MQA: Hq a multiple of Hkv; query head h reads KV head h // (Hq // Hkv), the query heads of one KV head
        together (each cache byte is read once).
    causal: query t of a sequence of n attended tokens and m queries sits at position n - m + t (bottom-right
        aligned) and sees positions <= its own; window (left, right) bounds them to [pos - left, pos + right]
        (-1, or a bound >= 2 ** 30: unbounded); softcap > 0: scores s become softcap * tanh(s / softcap);
        scale: default D ** -0.5; alibi_slopes: float32 [Hq], score - slope * |pos_q - pos_k|; sinks: float32
        [Hq], one learned logit per head that joins the softmax's denominator (gpt-oss).

    Returns out (q's shape and dtype), and with return_lse also lse float32 (natural log; [B, Hq, Sq], or
    [Hq, total_q] for packed queries). A row that sees no key gets out = 0 and lse = -inf (or its sink).

    Each call makes a plan (host reads of the lengths and a check of the page ids in use: device syncs); for
    CUDA graphs and repeated steps use `KVCachePlan(...).run(...)`.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache: expected [num_pages, page_size, Hkv, D] or [B, max_seqlen, Hkv, D], got "
                         f"{list(k_cache.shape)}")
    if q.dim() != (3 if cu_seqlens_q is not None else 4):
        dims = "[total_q, Hq, D] (with cu_seqlens_q)" if cu_seqlens_q is not None else "[B, Sq, Hq, D]"
        raise ValueError(f"q: expected {dims}, got {list(q.shape)}")
    check_seqlens(cache_seqlens, None, q.device)
    seqlens = cache_seqlens
    if k_new is not None:
        if cu_seqlens_q is not None:
            check_cu_seqlens_q(cu_seqlens_q, cache_seqlens)  # before the subtraction below
        new = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]) if cu_seqlens_q is not None else q.shape[1]
        seqlens = (cache_seqlens + new).to(torch.int32)
    fp8_cache = k_cache.dtype == torch.float8_e4m3fn
    plan = KVCachePlan(seqlens, num_heads=q.shape[-2], num_kv_heads=k_cache.shape[2], head_dim=q.shape[-1],
                       page_size=k_cache.shape[1] if block_table is not None else None,
                       q_len=q.shape[1] if cu_seqlens_q is None else 1, cu_seqlens_q=cu_seqlens_q, dtype=q.dtype,
                       cache_dtype=torch.float8_e4m3fn if fp8_cache else None, causal=causal, scale=scale,
                       window=window, softcap=softcap)
    # every shape / dtype / device rule first, then the page ids (a sync), then the launches
    check_run_args(plan, DecodeRun(q, k_cache, v_cache, block_table, k_new, v_new, k_scale, v_scale, alibi_slopes,
                                   sinks))
    if block_table is not None:
        check_pages(block_table, seqlens, plan.page_size, k_cache.shape[0])
    return plan.run(q, k_cache, v_cache, block_table, k_new=k_new, v_new=v_new, k_scale=k_scale, v_scale=v_scale,
                    alibi_slopes=alibi_slopes, sinks=sinks, return_lse=return_lse)
