"""tileattn: fast, correct attention kernels for PyTorch on NVIDIA GPUs, written in Triton.

Public API:
    attention(q, k, v, *, causal, scale, window, softcap, return_lse)        [B, S, H, D] layout
    varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)  packed layout
    scaled_dot_product_attention(query, key, value, ...)                      drop-in for torch's SDPA
    quantize_fp8(x, dtype), fp8_v_layout(v) -> Fp8V                          fp8 inputs of attention
    mla_decode(q_nope, q_pe, ckv_cache, kpe_cache, block_table, cache_seqlens, ...)  MLA over a paged cache
    MLADecodePlan(cache_seqlens, num_heads=..., ...).run(...)                  the same, planned once
    kvcache_attention(q, k_cache, v_cache, cache_seqlens, block_table, ...)   decode / prefill over a KV cache
    KVCachePlan(seqlens, num_heads=..., num_kv_heads=..., ...).run(...)        the same, planned once
    flex_attention(query, key, value, score_mod, block_mask, ...)             torch's FlexAttention model
    create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=...)               torch's, for flex_attention
    mods                                                                       ready-made score / mask mods
    force_backend(name=None, config=None)                                      force a kernel (context manager)
    ring_attention(q, k, v, group, *, causal, scale, layout, return_lse)      context parallel over ranks
    shard_sequence(x, rank, world_size, ...), unshard_sequence(x, group, ...)  its sequence shards

The kernels load on first use, so a tool (the `tileattn` command) can choose Triton's interpreter for a
CPU-only machine before any kernel is defined.
"""
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each name loads on first use (__getattr__)
    from .ops.common.backend import force_backend
    from .ops.common.fp8 import Fp8V, fp8_v_layout, quantize_fp8
    from .ops.decode.api import kvcache_attention
    from .ops.decode.plan import KVCachePlan
    from .ops.dense.api import attention, scaled_dot_product_attention, varlen_attention
    from .ops.distributed.api import ring_attention, shard_sequence, unshard_sequence
    from .ops.flex import mods
    from .ops.flex.api import create_block_mask, flex_attention
    from .ops.flex.trace import FlexCompileError
    from .ops.mla.api import mla_decode
    from .ops.mla.plan import MLADecodePlan

__version__ = "0.1.0"
__all__ = ["attention", "varlen_attention", "scaled_dot_product_attention", "quantize_fp8", "fp8_v_layout",
           "Fp8V", "mla_decode", "MLADecodePlan", "kvcache_attention", "KVCachePlan", "flex_attention",
           "create_block_mask", "FlexCompileError", "mods", "force_backend", "ring_attention", "shard_sequence",
           "unshard_sequence",
           "__version__"]


def __getattr__(name: str) -> object:
    if name in ("attention", "varlen_attention", "scaled_dot_product_attention"):
        from .ops.dense import api
        return getattr(api, name)
    if name in ("quantize_fp8", "fp8_v_layout", "Fp8V"):
        from .ops.common import fp8
        return getattr(fp8, name)
    if name == "force_backend":
        from .ops.common.backend import force_backend
        return force_backend
    if name == "mla_decode":
        from .ops.mla.api import mla_decode
        return mla_decode
    if name == "MLADecodePlan":
        from .ops.mla.plan import MLADecodePlan
        return MLADecodePlan
    if name == "kvcache_attention":
        from .ops.decode.api import kvcache_attention
        return kvcache_attention
    if name == "KVCachePlan":
        from .ops.decode.plan import KVCachePlan
        return KVCachePlan
    if name == "flex_attention":
        from .ops.flex.api import flex_attention
        return flex_attention
    if name == "create_block_mask":
        from .ops.flex.api import create_block_mask
        return create_block_mask
    if name == "FlexCompileError":
        from .ops.flex.trace import FlexCompileError
        return FlexCompileError
    if name in ("ring_attention", "shard_sequence", "unshard_sequence"):
        from .ops.distributed import api as distributed_api
        return getattr(distributed_api, name)
    if name == "mods":
        from .ops.flex import mods
        return mods
    raise AttributeError(f"module 'tileattn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
