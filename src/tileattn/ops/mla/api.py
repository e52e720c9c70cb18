"""Public MLA decode entry point (the functional form; MLADecodePlan is the plan/run form)."""
from .checks import check_pages
from .plan import MLADecodePlan


def mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, block_table, cache_seqlens, *, scale=None, causal=True,
               return_lse=False):
    """DeepSeek-style Multi-head Latent Attention decode over a paged compressed KV cache.

    q_nope [B, Sq, Hq, Dc], q_pe [B, Sq, Hq, Dr] (fp16 / bf16); ckv_cache [num_pages, page_size, Dc] (the
    compressed keys, also used as values) and kpe_cache [num_pages, page_size, Dr] (rotary keys), same dtype;
    block_table [B, max_pages_per_seq] int32 page ids; cache_seqlens [B] int32 tokens in each sequence's
    cache, the Sq new ones included. Hq 1..128; Dc, Dr powers of two; page_size a power of two 1..128.

    With causal, query t (0-based) sees cache positions < cache_seqlens - Sq + t + 1; without, all of them.
    scale defaults to (Dc + Dr) ** -0.5. Returns out [B, Sq, Hq, Dc] in q's dtype, and with return_lse also
    lse [B, Hq, Sq] float32 (natural log). A sequence of length 0 gives out = 0 and lse = -inf.

    This form makes a plan per call (one device sync, and a host check of the page ids in use); for CUDA
    graphs and repeated steps use MLADecodePlan(cache_seqlens, ...).run(...).
    """
    if not hasattr(q_nope, "shape") or q_nope.dim() != 4:
        raise ValueError("q_nope: expected a [B, Sq, Hq, Dc] tensor")
    if not hasattr(q_pe, "shape") or q_pe.dim() != 4:
        raise ValueError("q_pe: expected a [B, Sq, Hq, Dr] tensor")
    if not hasattr(ckv_cache, "shape") or ckv_cache.dim() != 3:
        raise ValueError("ckv_cache: expected a [num_pages, page_size, Dc] tensor")
    B, Sq, Hq, Dc = q_nope.shape
    if q_pe.shape[:3] != q_nope.shape[:3]:
        raise ValueError(f"q_pe: expected [B, Sq, Hq] = {list(q_nope.shape[:3])} like q_nope, got "
                         f"{list(q_pe.shape[:3])}")
    if ckv_cache.shape[-1] != Dc:
        raise ValueError(f"ckv_cache: last dimension {ckv_cache.shape[-1]} != Dc = {Dc} of q_nope")
    if kpe_cache.dim() != 3 or kpe_cache.shape[-1] != q_pe.shape[-1]:
        raise ValueError(f"kpe_cache: expected [num_pages, page_size, Dr = {q_pe.shape[-1]}], got "
                         f"{list(kpe_cache.shape)}")
    plan = MLADecodePlan(cache_seqlens, num_heads=Hq, q_len=Sq, head_dim_ckv=Dc, head_dim_kpe=q_pe.shape[-1],
                         page_size=ckv_cache.shape[1], dtype=q_nope.dtype, causal=causal, scale=scale)
    if block_table.dim() == 2 and block_table.shape[0] == B and plan.max_len <= block_table.shape[1] * plan.page_size:
        check_pages(block_table, cache_seqlens, plan.page_size, ckv_cache.shape[0])
    return plan.run(q_nope, q_pe, ckv_cache, kpe_cache, block_table, return_lse=return_lse)
