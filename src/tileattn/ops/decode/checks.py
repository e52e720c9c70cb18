"""Argument checks of attention over a KV cache: a clear ValueError / TypeError naming the argument, before any
launch."""
import math

import torch

from ... import hw
from ..common.args import check_bool, check_no_overlap, is_int, is_real
from ..common.paging import check_seqlens
from .configs import HEAD_DIMS

_DTYPES = (torch.float16, torch.bfloat16)
_FP8 = torch.float8_e4m3fn


def check_window(window):
    # (bounds from UNBOUNDED_WINDOW up are unbounded: KVCachePlan maps them to -1, as dense attention does)
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(is_int(w) and w >= -1 for w in window)):
        raise ValueError(f"window: expected (left, right) ints >= -1 (-1: unbounded), got {window!r}")


def check_cu_seqlens_q(cu_seqlens_q, seqlens):
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dtype != torch.int32 \
            or cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] != seqlens.shape[0] + 1:
        got = (f"{cu_seqlens_q.dtype} of shape {tuple(cu_seqlens_q.shape)}" if isinstance(cu_seqlens_q, torch.Tensor)
               else type(cu_seqlens_q).__name__)
        raise ValueError(f"cu_seqlens_q: expected an int32 tensor of B + 1 = {seqlens.shape[0] + 1} "
                         f"cumulative query counts, got {got}")
    if cu_seqlens_q.device != seqlens.device:
        raise ValueError(f"cu_seqlens_q: on {cu_seqlens_q.device}, seqlens is on {seqlens.device}")


def check_plan_args(seqlens, plan, cu_seqlens_q):
    """The plan's arguments (its attributes, set from them, before anything is allocated)."""
    check_seqlens(seqlens, None, None, "seqlens")
    hw.check_kernel_device(seqlens.device, "seqlens")
    hq, hkv, d = plan.num_heads, plan.num_kv_heads, plan.head_dim
    if not (is_int(hq) and is_int(hkv) and 1 <= hkv <= hq and hq % hkv == 0):
        raise ValueError(f"num_heads, num_kv_heads: expected num_kv_heads >= 1 dividing num_heads (GQA), got "
                         f"{hq}, {hkv}")
    if hq // hkv > 64:
        raise ValueError(f"num_heads // num_kv_heads: at most 64 query heads per KV head, got {hq // hkv}")
    if not is_int(d) or d not in HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {HEAD_DIMS}, got {d}")
    if plan.page_size is not None and not (is_int(plan.page_size) and 1 <= plan.page_size <= 256):
        raise ValueError(f"page_size: expected an int in 1..256 (None: a contiguous cache), got {plan.page_size!r}")
    if cu_seqlens_q is None:
        if not (is_int(plan.q_len) and plan.q_len >= 1):
            raise ValueError(f"q_len: expected an int >= 1, got {plan.q_len!r}")
    else:
        check_cu_seqlens_q(cu_seqlens_q, seqlens)
    if plan.dtype not in _DTYPES:
        raise TypeError(f"dtype: expected torch.float16 or torch.bfloat16, got {plan.dtype}")
    if plan.cache_dtype not in (plan.dtype, _FP8):
        raise TypeError(f"cache_dtype: expected {plan.dtype} (q's dtype) or torch.float8_e4m3fn, got "
                        f"{plan.cache_dtype}")
    if plan.scale is not None and not (is_real(plan.scale) and math.isfinite(plan.scale) and plan.scale > 0):
        raise ValueError(f"scale: expected a positive finite number, got {plan.scale!r}")
    check_bool("causal", plan.causal)
    check_window(plan.window)
    if not (plan.softcap is None or (is_real(plan.softcap) and math.isfinite(plan.softcap) and plan.softcap >= 0)):
        raise ValueError(f"softcap: expected a finite number >= 0 (0: off), got {plan.softcap!r}")


def host_lengths(host_seqlens, batch):
    """update's host_seqlens as a list of `batch` ints (the lengths seqlens holds; not compared with it, that
    would need a sync): a list or tuple of ints (numpy's too), or a 1-D integer tensor on the CPU. A list of
    Python ints is taken as it is (a decode step's host time)."""
    if type(host_seqlens) is list and all(type(n) is int for n in host_seqlens):
        lens = host_seqlens
    elif isinstance(host_seqlens, torch.Tensor):
        if host_seqlens.device.type != "cpu" or host_seqlens.dim() != 1 or host_seqlens.dtype.is_floating_point \
                or host_seqlens.dtype == torch.bool:
            raise TypeError(f"host_seqlens: expected a 1-D integer tensor on the CPU (or a list of ints), got "
                            f"{host_seqlens.dtype} of shape {tuple(host_seqlens.shape)} on {host_seqlens.device}")
        lens = host_seqlens.tolist()
    else:
        if isinstance(host_seqlens, (str, bytes)) or not hasattr(host_seqlens, "__len__") \
                or not all(is_int(n) for n in host_seqlens):
            raise TypeError(f"host_seqlens: expected a list of ints, got {type(host_seqlens).__name__}")
        lens = [int(n) for n in host_seqlens]
    if len(lens) != batch:
        raise ValueError(f"host_seqlens: expected one length per sequence (batch {batch}), got {len(lens)}")
    return lens


def check_lengths(lens, q_lens):
    """Host lengths of the batch, >= 0. A sequence may hold fewer tokens than its queries (e.g. an empty slot
    of a padded batch): the queries sit at positions n - m + t, and those below 0 see nothing when causal.
    Returns the first such sequence, (b, length, q_len), or None: run's k_new would be written before its first
    position (into another sequence's page), so run refuses k_new then."""
    short = None
    for b, (n, m) in enumerate(zip(lens, q_lens)):
        if n < m:
            if n < 0:
                raise ValueError(f"seqlens: lengths must be >= 0, sequence {b} has {n}")
            if short is None:
                short = (b, n, m)
    return short


def check_scale(name, x, plan):
    """k_scale / v_scale: a positive number, or a float32 tensor on the plan's device holding one element (any
    shape: [], [1], [1, 1] all broadcast, as attention's descales do) or num_kv_heads of them in one dimension
    (read in the kernel, so a CUDA graph replays with its current value; the values are not checked: that
    would need a sync)."""
    if isinstance(x, torch.Tensor):
        per_head = x.dim() == 1 and x.numel() == plan.num_kv_heads
        if x.dtype != torch.float32 or not (x.numel() == 1 or per_head) or x.device != plan.device:
            raise ValueError(f"{name}: expected a float32 tensor on {plan.device} holding one element (any shape) "
                             f"or one per KV head [num_kv_heads={plan.num_kv_heads}], got {x.dtype} of shape "
                             f"{tuple(x.shape)} on {x.device}")
    elif not (is_real(x) and 0 < x < float("inf")):
        raise ValueError(f"{name}: expected a positive finite number or a float32 tensor, got {x!r}")


def check_head_vector(name, x, plan):
    if x is None:
        return
    if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.shape[0] != plan.num_heads \
            or x.dtype != torch.float32 or x.device != plan.device:
        raise ValueError(f"{name}: expected a float32 tensor of num_heads={plan.num_heads} values on "
                         f"{plan.device}, got {getattr(x, 'dtype', type(x).__name__)} "
                         f"{tuple(getattr(x, 'shape', ()))}")
    if x.shape[0] > 1 and x.stride(0) != 1:  # the kernel reads it at offset h (a copy here would not be captured)
        raise ValueError(f"{name}: expected a contiguous tensor (stride 1), got stride {x.stride(0)}")


def _check_tensor(name, t, plan):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device != plan.device:
        raise ValueError(f"{name}: on {t.device}, the plan (seqlens) is on {plan.device}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")


def check_run_args(plan, r):
    """A run's tensors (plan.DecodeRun) against the plan."""
    B, H, Hkv, D = plan.batch, plan.num_heads, plan.num_kv_heads, plan.head_dim
    q_shape = [plan.total_q, H, D] if plan.varlen else [B, plan.q_len, H, D]
    q_dims = "[total_q, num_heads, head_dim]" if plan.varlen else "[B, q_len, num_heads, head_dim]"
    _check_tensor("q", r.q, plan)
    if list(r.q.shape) != q_shape:
        raise ValueError(f"q: expected {q_dims} = {q_shape} for this plan, got {list(r.q.shape)}")
    if r.q.dtype != plan.dtype:
        raise TypeError(f"q: expected {plan.dtype} (the plan's dtype), got {r.q.dtype}")
    if plan.cache_dtype != _FP8:  # with an fp8 cache the kernel converts q and the cache to float16 for the dots
        hw.check_interpreter_dtype(r.q.dtype, "q")
    for name in ("k_cache", "v_cache"):
        t = getattr(r, name)
        _check_tensor(name, t, plan)
        if t.dtype != plan.cache_dtype:
            raise TypeError(f"{name}: expected {plan.cache_dtype} (the plan's cache_dtype), got {t.dtype}")
        if plan.paged:
            if t.dim() != 4 or t.shape[1] != plan.page_size or t.shape[2] != Hkv or t.shape[3] != D:
                raise ValueError(f"{name}: expected [num_pages, page_size={plan.page_size}, num_kv_heads={Hkv}, "
                                 f"head_dim={D}], got {list(t.shape)}")
        elif t.dim() != 4 or t.shape[0] != B or t.shape[2] != Hkv or t.shape[3] != D:
            raise ValueError(f"{name}: expected a contiguous cache [B={B}, max_seqlen, num_kv_heads={Hkv}, "
                             f"head_dim={D}], got {list(t.shape)}")
    if r.v_cache.shape[:2] != r.k_cache.shape[:2]:
        raise ValueError(f"v_cache: shape {list(r.v_cache.shape)} does not match k_cache's {list(r.k_cache.shape)}")
    if plan.paged:
        bt = r.block_table
        if not isinstance(bt, torch.Tensor) or bt.dtype != torch.int32 or bt.dim() != 2 or bt.shape[0] != B:
            raise ValueError(f"block_table: expected an int32 [B={B}, max_pages_per_seq] tensor, got "
                             f"{getattr(bt, 'dtype', type(bt).__name__)} {list(getattr(bt, 'shape', []))}")
        _check_tensor("block_table", bt, plan)
        if r.k_cache.shape[0] == 0 and plan.max_len > 0:
            raise ValueError("k_cache: no pages, but seqlens has tokens")
        if plan.max_len > bt.shape[1] * plan.page_size:
            raise ValueError(f"seqlens: a sequence of {plan.max_len} tokens does not fit a block table of "
                             f"{bt.shape[1]} pages of {plan.page_size}")
    else:
        if r.block_table is not None:
            raise ValueError("block_table: the plan is for a contiguous cache (page_size=None); make a paged plan")
        if plan.max_len > r.k_cache.shape[1]:
            raise ValueError(f"seqlens: a sequence of {plan.max_len} tokens does not fit a cache of "
                             f"{r.k_cache.shape[1]} positions")
    if (r.k_new is None) != (r.v_new is None):
        raise ValueError("k_new, v_new: pass both or neither")
    if r.k_new is not None:
        for name in ("k_new", "v_new"):
            t = getattr(r, name)
            _check_tensor(name, t, plan)
            want = q_shape[:-2] + [Hkv, D]
            if list(t.shape) != want:
                raise ValueError(f"{name}: expected {want} (q's tokens, num_kv_heads, head_dim), got {list(t.shape)}")
            if t.dtype != plan.dtype:
                raise TypeError(f"{name}: expected {plan.dtype} (q's dtype), got {t.dtype}")
        if plan.short is not None:
            b, n, m = plan.short
            raise ValueError(f"seqlens: with k_new, each sequence's length must be >= its q_len (the new tokens "
                             f"are its last q_len positions), sequence {b} has {n} < {m} (kvcache_attention: "
                             f"cache_seqlens must be >= 0)")
    check_scale("k_scale", r.k_scale, plan)
    check_scale("v_scale", r.v_scale, plan)
    check_head_vector("alibi_slopes", r.alibi_slopes, plan)
    check_head_vector("sinks", r.sinks, plan)
    if r.out is not None and (list(r.out.shape) != q_shape or r.out.dtype != plan.dtype
                              or r.out.device != plan.device or r.out.stride(-1) != 1):
        raise ValueError(f"out: expected a {plan.dtype} {q_dims} = {q_shape} tensor with a contiguous last "
                         f"dimension on {plan.device}")
    if r.out is not None:
        check_no_overlap("out", r.out)
    lse_shape = [H, plan.total_q] if plan.varlen else [B, H, plan.q_len]
    if r.lse is not None and (list(r.lse.shape) != lse_shape or r.lse.dtype != torch.float32
                              or r.lse.device != plan.device):
        raise ValueError(f"lse: expected a float32 {lse_shape} tensor on {plan.device}")
    if r.lse is not None:
        check_no_overlap("lse", r.lse)
