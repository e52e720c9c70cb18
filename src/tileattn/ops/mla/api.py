"""Public MLA decode entry point (the functional form; MLADecodePlan is the plan/run form)."""
from __future__ import annotations

import torch

from ..common.paging import check_pages
from .checks import check_run_args
from .plan import MLADecodePlan, MLARun


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
               block_table: torch.Tensor, cache_seqlens: torch.Tensor, *, scale: float | None = None,
               causal: bool = True, return_lse: bool = False,
               kv_scale: float | torch.Tensor = 1.0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-style Multi-head Latent Attention decode over a paged compressed KV cache.

    q_nope [B, Sq, Hq, Dc], q_pe [B, Sq, Hq, Dr] (fp16 / bf16); ckv_cache [num_pages, page_size, Dc] (the
    compressed keys, also used as values) and kpe_cache [num_pages, page_size, Dr] (rotary keys), in q's dtype
    or both float8_e4m3fn; kv_scale: the caches' values times it are the keys and values (an fp8 cache's
    float32 scale; a number or a one-element float32 tensor);
    block_table [B, max_pages_per_seq] int32 page ids; cache_seqlens [B] int32 tokens in each sequence's
    cache, the Sq new ones included. Hq 1..128; Dc, Dr powers of two; page_size a power of two 1..128.

    With causal, query t (0-based) sees cache positions < cache_seqlens - Sq + t + 1; without, all of them.
    scale defaults to (Dc + Dr) ** -0.5. Returns out [B, Sq, Hq, Dc] in q's dtype, and with return_lse also
    lse [B, Hq, Sq] float32 (natural log). A sequence of length 0 gives out = 0 and lse = -inf.

    This form makes a plan per call (one device sync, and a host check of the page ids in use); for CUDA
    graphs and repeated steps use MLADecodePlan(cache_seqlens, ...).run(...).
    """
    for name, t, dims in (("q_nope", q_nope, "[B, Sq, Hq, Dc]"), ("q_pe", q_pe, "[B, Sq, Hq, Dr]"),
                          ("ckv_cache", ckv_cache, "[num_pages, page_size, Dc]")):
        if not isinstance(t, torch.Tensor) or t.dim() != len(dims.split(",")):
            raise ValueError(f"{name}: expected a {dims} tensor")
    plan = MLADecodePlan(cache_seqlens, num_heads=q_nope.shape[2], q_len=q_nope.shape[1],
                         head_dim_ckv=q_nope.shape[3], head_dim_kpe=q_pe.shape[3], page_size=ckv_cache.shape[1],
                         dtype=q_nope.dtype, causal=causal, scale=scale,
                         cache_dtype=torch.float8_e4m3fn if ckv_cache.dtype == torch.float8_e4m3fn else None)
    # every shape / dtype / device rule of the plan first, then the page ids (a sync), then the launch
    check_run_args(plan, MLARun(q_nope, q_pe, ckv_cache, kpe_cache, block_table, kv_scale))
    check_pages(block_table, cache_seqlens, plan.page_size, ckv_cache.shape[0])
    return plan.run(q_nope, q_pe, ckv_cache, kpe_cache, block_table, kv_scale=kv_scale, return_lse=return_lse)
