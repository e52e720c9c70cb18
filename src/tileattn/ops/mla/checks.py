"""Argument checks of MLA decode: a clear ValueError / TypeError naming the argument, before any launch."""
import math

import torch

from ... import hw
from ..common.args import check_bool, check_no_overlap, is_int, is_real
from ..common.paging import check_seqlens

_DTYPES = (torch.float16, torch.bfloat16)
_FP8 = torch.float8_e4m3fn


def is_pow2(x):
    return x > 0 and x & (x - 1) == 0


def check_plan_args(cache_seqlens, plan):
    """The plan's arguments (its attributes, set from them, before anything is allocated)."""
    check_seqlens(cache_seqlens, None, None)
    hw.check_kernel_device(cache_seqlens.device, "cache_seqlens")
    num_heads, q_len, dc, dr, page_size = plan.num_heads, plan.q_len, plan.dc, plan.dr, plan.page_size
    dtype, cache_dtype, scale = plan.dtype, plan.cache_dtype, plan.scale
    for name, x in (("num_heads", num_heads), ("q_len", q_len), ("head_dim_ckv (Dc)", dc), ("head_dim_kpe (Dr)", dr),
                    ("page_size", page_size)):
        if not is_int(x):
            raise TypeError(f"{name}: expected an int, got {type(x).__name__} {x!r}")
    if not 1 <= num_heads <= 128:
        raise ValueError(f"num_heads: expected 1..128, got {num_heads}")
    if q_len < 1:
        raise ValueError(f"q_len: expected >= 1, got {q_len}")
    for name, d in (("head_dim_ckv (Dc)", dc), ("head_dim_kpe (Dr)", dr)):
        if not (is_pow2(d) and 16 <= d <= 1024):
            raise ValueError(f"{name}: expected a power of two in 16..1024, got {d}")
    if not (is_pow2(page_size) and page_size <= 128):
        raise ValueError(f"page_size: expected a power of two in 1..128, got {page_size}")
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected torch.float16 or torch.bfloat16, got {dtype}")
    if cache_dtype not in (dtype, _FP8):
        raise TypeError(f"cache_dtype: expected {dtype} (q's dtype) or torch.float8_e4m3fn, got {cache_dtype}")
    if scale is not None and not (is_real(scale) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale: expected a positive finite number, got {scale!r}")
    check_bool("causal", plan.causal)


def check_kv_scale(kv_scale, plan):
    """kv_scale: a positive number, or a one-element float32 tensor on the plan's device (read in the kernel,
    so a CUDA graph replays with its current value; its value must be positive and finite, which is not
    checked: that would need a sync)."""
    if isinstance(kv_scale, torch.Tensor):
        if kv_scale.dtype != torch.float32 or kv_scale.numel() != 1 or kv_scale.device != plan.device:
            raise ValueError(f"kv_scale: expected a one-element float32 tensor on {plan.device}, got "
                             f"{kv_scale.dtype} of shape {tuple(kv_scale.shape)} on {kv_scale.device}")
    elif not (is_real(kv_scale) and kv_scale > 0 and kv_scale != float("inf")):
        raise ValueError(f"kv_scale: expected a positive finite number or a float32 tensor, got {kv_scale!r}")


def check_run_args(plan, r):
    """A run's tensors (plan.MLARun) against the plan."""
    q_nope, q_pe, ckv_cache, kpe_cache, block_table, out, lse = (r.q_nope, r.q_pe, r.ckv_cache, r.kpe_cache,
                                                                 r.block_table, r.out, r.lse)
    B, S, H, dc, dr = plan.batch, plan.q_len, plan.num_heads, plan.dc, plan.dr
    for name, t in (("q_nope", q_nope), ("q_pe", q_pe), ("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache),
                    ("block_table", block_table)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device != plan.device:
            raise ValueError(f"{name}: on {t.device}, the plan (cache_seqlens) is on {plan.device}")
    for name, t, shape in (("q_nope", q_nope, (B, S, H, dc)), ("q_pe", q_pe, (B, S, H, dr))):
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape [B, q_len, num_heads, D] = {list(shape)} for this plan, "
                             f"got {list(t.shape)}")
    for name, t, want in (("q_nope", q_nope, plan.dtype), ("q_pe", q_pe, plan.dtype),
                          ("ckv_cache", ckv_cache, plan.cache_dtype), ("kpe_cache", kpe_cache, plan.cache_dtype)):
        if t.dtype != want:
            what = "dtype" if want == plan.dtype else "cache_dtype"
            raise TypeError(f"{name}: expected {want} (the plan's {what}), got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    hw.check_interpreter_dtype(q_nope.dtype, "q_nope")  # q_pe's too; an fp8 cache is converted to it for the dots
    for name, t, d in (("ckv_cache", ckv_cache, dc), ("kpe_cache", kpe_cache, dr)):
        if t.dim() != 3 or t.shape[1] != plan.page_size or t.shape[2] != d:
            raise ValueError(f"{name}: expected [num_pages, page_size={plan.page_size}, {d}], got "
                             f"{list(t.shape)}")
    if kpe_cache.shape[0] != ckv_cache.shape[0]:
        raise ValueError(f"kpe_cache: {kpe_cache.shape[0]} pages, ckv_cache has {ckv_cache.shape[0]}")
    if ckv_cache.shape[0] == 0 and plan.max_len > 0:
        raise ValueError("ckv_cache: no pages, but cache_seqlens has tokens")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table: expected an int32 [B={B}, max_pages_per_seq] tensor, got "
                         f"{block_table.dtype} {list(block_table.shape)}")
    if block_table.stride(-1) != 1:
        raise ValueError("block_table: the last dimension must be contiguous (stride 1)")
    if plan.max_len > block_table.shape[1] * plan.page_size:
        raise ValueError(f"cache_seqlens: a sequence of {plan.max_len} tokens does not fit a block table of "
                         f"{block_table.shape[1]} pages of {plan.page_size}")
    if out is not None and (tuple(out.shape) != (B, S, H, dc) or out.dtype != plan.dtype or out.stride(-1) != 1
                            or out.device != plan.device):
        raise ValueError(f"out: expected a {plan.dtype} [B, q_len, num_heads, Dc] = {[B, S, H, dc]} tensor with a "
                         f"contiguous last dimension on {plan.device}")
    if lse is not None and (tuple(lse.shape) != (B, H, S) or lse.dtype != torch.float32
                            or lse.device != plan.device or lse.stride(-1) != 1):
        raise ValueError(f"lse: expected a float32 [B, num_heads, q_len] = {[B, H, S]} tensor with a contiguous "
                         f"last dimension on {plan.device}")
    for name, t in (("out", out), ("lse", lse)):
        if t is not None:
            check_no_overlap(name, t)
