"""torch.library registrations, so torch.compile traces tileattn calls without graph breaks.

Each op has a fake (meta) implementation that produces outputs of the right shape, dtype and strides
without touching data. The forward ops have no backward yet: differentiating through them raises a clear
error instead of returning wrong gradients.
"""
from typing import Optional

import torch

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


def _no_backward_setup(ctx, inputs, output):
    pass


def _no_backward(ctx, grad_out, grad_lse):
    raise NotImplementedError(
        "tileattn: the backward pass of attention is not implemented yet; call tileattn under "
        "torch.no_grad() / inference_mode(), or use torch.nn.functional.scaled_dot_product_attention for "
        "training")


attn_fwd.register_autograd(_no_backward, setup_context=_no_backward_setup)
