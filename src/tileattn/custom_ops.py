"""torch.library registrations, so torch.compile traces tileattn calls without graph breaks.

Each op has a fake (meta) implementation that produces outputs of the right shape, dtype and strides
without touching data. attn_fwd's autograd formula is attn_bwd (ops/dense/bwd.py): it needs the forward's
lse, which api._run requests whenever a gradient is tracked; fp8 inputs have no backward (a clear error).
"""
from typing import Optional

import torch

from .ops.dense import bwd as dense_bwd
from .ops.dense import launch as dense_launch
from .ops.dense import plans as dense_plans


@torch.library.custom_op("tileattn::attn_fwd", mutates_args=())
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
             cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float,
             window_left: int, window_right: int, softcap: float, align_bottom_right: bool,
             return_lse: bool, q_descale: Optional[torch.Tensor] = None,
             k_descale: Optional[torch.Tensor] = None, v_descale: Optional[torch.Tensor] = None,
             out_scale: float = 1.0, out_dtype: Optional[torch.dtype] = None,
             v_packed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return dense_plans.attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                                window_left, window_right, softcap, align_bottom_right, return_lse, q_descale,
                                k_descale, v_descale, out_scale, out_dtype, v_packed)


@attn_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left, window_right,
      softcap, align_bottom_right, return_lse, q_descale=None, k_descale=None, v_descale=None, out_scale=1.0,
      out_dtype=None, v_packed=False):
    varlen = cu_seqlens_q is not None
    return (dense_launch.alloc_out(q, v.shape[-1], varlen, out_dtype),
            dense_launch.alloc_lse(q, varlen, return_lse))


@torch.library.custom_op("tileattn::attn_bwd", mutates_args=())
def attn_bwd(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, grad_lse: Optional[torch.Tensor], cu_seqlens_q: Optional[torch.Tensor],
             cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int, scale: float,
             window_left: int, window_right: int, softcap: float,
             align_bottom_right: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return dense_bwd.attn_bwd(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, scale, window_left, window_right, softcap, align_bottom_right)


@attn_bwd.register_fake
def _(grad_out, q, k, v, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
      window_left, window_right, softcap, align_bottom_right):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right, return_lse, q_descale,
     k_descale, v_descale, out_scale, out_dtype, v_packed) = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zero tensor made or read)
    ctx.fp8 = q.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    ctx.has_lse = return_lse
    ctx.params = (max_q, max_k, scale, left, right, softcap, bottom_right)
    if return_lse and not ctx.fp8:
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)


def _backward(ctx, grad_out, grad_lse):
    if ctx.fp8:
        raise NotImplementedError("tileattn: fp8 attention has no backward pass (train in fp16 / bf16)")
    if not ctx.has_lse:
        raise RuntimeError("tileattn::attn_fwd: a gradient needs the forward's lse (call it with return_lse=True; "
                           "tileattn.attention does)")
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    if grad_out is None:  # only the lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv = attn_bwd(grad_out.contiguous() if grad_out.stride(-1) != 1 else grad_out, q, k, v, out, lse,
                          grad_lse, cu_q, cu_k, *ctx.params)
    return (dq, dk, dv) + (None,) * 16


attn_fwd.register_autograd(_backward, setup_context=_setup_context)
