"""Input checks of dense attention forward (shapes, dtypes, layouts, devices, options, cu_seqlens).

check_inputs() does every check that needs no tensor values (it is safe under torch.compile tracing);
check_cu_seqlens() reads the cumulative lengths (one small device-to-host copy) and runs inside the custom op.
"""
import math

import torch

from ... import hw
from .fp8 import FP8_DTYPES, is_fp8, is_seq_major

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 1024
MAX_GRAD_HEAD_DIM = 256  # the backward kernels (bwd.py) hold a whole head dim per tile
MAX_FP8_HEAD_DIM = 256  # fp8 kernels: the dense kernel's head dims (large_d.py takes float16/bfloat16)


def _check_tensor(name, t, ndim, layout):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1 and not (name == "v" and is_fp8(t.dtype) and is_seq_major(t)):
        extra = " or, for fp8, a contiguous sequence dimension (tileattn.fp8_v_layout)" if name == "v" else ""
        raise ValueError(f"{name} must have a contiguous last dimension (stride(-1) == 1){extra}, got "
                         f"strides {t.stride()}")


def _check_head_dim(name, d):
    if d % 8 != 0 or not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name} head dim must be a multiple of 8 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {d}")


def check_device(*tensors):
    dev = tensors[0].device
    for name, t in zip(("k", "v", "cu_seqlens_q", "cu_seqlens_k"), tensors[1:]):
        if t is not None and t.device != dev:
            raise ValueError(f"all tensors must be on one device: q is on {dev}, {name} on {t.device}")
    hw.check_kernel_device(dev, "q, k, v")


def check_options(causal, scale, window, softcap):
    # runs on every call (the tensor checks only once per problem key): no generator, no tuple building
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0):
        raise ValueError(f"scale must be a finite non-zero number or None, got {scale!r}")
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    left, right = window
    if type(left) is bool or type(right) is bool or not (isinstance(left, int) and isinstance(right, int)):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    if left < -1 or right < -1:
        raise ValueError(f"window bounds must be >= 0, or -1 for unbounded, got {tuple(window)}")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0 disables it), got {softcap!r}")


def check_sdpa_inputs(query, key, value, enable_gqa):
    """scaled_dot_product_attention's own checks, on the [B, H, S, D] tensors (check_inputs follows)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-dim tensor [B, H, S, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if is_fp8(t.dtype):
            raise TypeError(f"scaled_dot_product_attention takes float16 or bfloat16 ({name} is {t.dtype}); "
                            f"for fp8 use tileattn.attention, which takes descales")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True for "
                         f"grouped-query attention")


def check_inputs(q, k, v, *, varlen):
    """Shape / dtype / layout / device checks. Raises TypeError or ValueError naming the argument."""
    ndim = 3 if varlen else 4
    lay_q = "[total_q, Hq, D]" if varlen else "[B, Sq, Hq, D]"
    lay_k = "[total_k, Hkv, D]" if varlen else "[B, Sk, Hkv, D]"
    lay_v = "[total_k, Hkv, Dv]" if varlen else "[B, Sk, Hkv, Dv]"
    _check_tensor("q", q, ndim, lay_q)
    _check_tensor("k", k, ndim, lay_k)
    _check_tensor("v", v, ndim, lay_v)
    if not (q.dtype == k.dtype == v.dtype):
        hint = ""
        if any(is_fp8(t.dtype) for t in (q, k, v)):
            hint = (" (fp8 attention takes q, k and v in one fp8 dtype; with an fp8 KV cache, quantize q too: "
                    "tileattn.quantize_fp8)")
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}{hint}")
    if not varlen and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on sequence length and heads")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}) must be a positive multiple of the number of "
                         f"key/value heads ({hkv})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    _check_head_dim("q/k", q.shape[-1])
    _check_head_dim("v", v.shape[-1])
    if is_fp8(q.dtype) and max(q.shape[-1], v.shape[-1]) > MAX_FP8_HEAD_DIM:
        raise ValueError(f"fp8 attention takes head dims up to {MAX_FP8_HEAD_DIM}, got D={q.shape[-1]}, "
                         f"Dv={v.shape[-1]} (larger head dims run in float16 or bfloat16)")


def check_cu_seqlens(cu_q, cu_k, total_q, total_k, max_q, max_k):
    """Checks of the cumulative lengths that need their values (one device-to-host copy)."""
    for name, cu, total, mx in (("cu_seqlens_q", cu_q, total_q, max_q), ("cu_seqlens_k", cu_k, total_k, max_k)):
        vals = cu.tolist()
        if vals[0] != 0:
            raise ValueError(f"{name} must start at 0, got {vals[0]}")
        lens = [b - a for a, b in zip(vals[:-1], vals[1:])]
        if any(n < 0 for n in lens):
            raise ValueError(f"{name} must be non-decreasing, got {vals}")
        if vals[-1] > total:
            raise ValueError(f"{name}[-1] = {vals[-1]} exceeds the packed length {total}")
        if lens and max(lens) > mx:
            raise ValueError(f"max_seqlen {mx} is smaller than the longest sequence in {name} ({max(lens)})")


def check_cu_seqlens_meta(cu_q, cu_k, max_q, max_k):
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} must be a 1-D int32 tensor of length B + 1 >= 2, got {cu.dtype} "
                             f"shape {tuple(cu.shape)}")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"{name} must be an int >= 0, got {m!r}")


def effective_window(causal, window):
    """(left, right) with -1 = unbounded; causal clips the right bound to 0 (the diagonal)."""
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right
