"""torch.library registrations of dense attention, so torch.compile traces tileattn calls without graph breaks.

    tileattn::attn_fwd(q, k, v, cu_seqlens, descales, options) -> (out, lse)
    tileattn::attn_bwd(grad_out, grad_lse, saved, options) -> (dq, dk, dv)

`options` is problem.AttnOptions.encode() (the call's non-tensor arguments as one string); cu_seqlens is [] or
[cu_seqlens_q, cu_seqlens_k], descales [] or fp8's three descale tensors. Each op has a fake (meta)
implementation that produces outputs of the right shape, dtype and strides without touching data. attn_fwd's
autograd formula is attn_bwd (bwd.py): it needs the forward's lse, which api.py requests whenever a gradient
is tracked; fp8 inputs have no backward (a clear error).
"""
from typing import Optional

import torch

from ..common.fp8 import is_fp8
from . import bwd, plans
from .problem import AttnOptions, AttnProblem, Call, alloc_lse, alloc_out


@torch.library.custom_op("tileattn::attn_fwd", mutates_args=())
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: list[torch.Tensor],
             descales: list[torch.Tensor], options: str) -> tuple[torch.Tensor, torch.Tensor]:
    return plans.attn_fwd(q, k, v, tuple(cu_seqlens), tuple(descales) or None, AttnOptions.decode(options))


@attn_fwd.register_fake
def _(q, k, v, cu_seqlens, descales, options):
    opts = AttnOptions.decode(options)
    varlen = bool(cu_seqlens)
    return alloc_out(q, v.shape[-1], varlen, opts.out_dtype), alloc_lse(q, varlen, opts.return_lse)


@torch.library.custom_op("tileattn::attn_bwd", mutates_args=())
def attn_bwd(grad_out: torch.Tensor, grad_lse: Optional[torch.Tensor], saved: list[torch.Tensor],
             options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """saved: the forward's q, k, v, out, lse (and cu_seqlens_q, cu_seqlens_k for varlen)."""
    q, k, v, out, lse, *cu = saved
    opts = AttnOptions.decode(options)
    c = Call(q, k, v, out, lse, cu[0] if cu else None, cu[1] if cu else None, None, opts.scale, opts.softcap, 1.0)
    return bwd.attn_bwd(AttnProblem.of(c, opts), c, grad_out, grad_lse)


@attn_bwd.register_fake
def _(grad_out, grad_lse, saved, options):
    q, k, v = saved[:3]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens, descales, options = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zero tensor made or read)
    ctx.fp8 = is_fp8(q.dtype)
    ctx.options = options
    ctx.list_lens = (len(cu_seqlens), len(descales))  # the backward returns lists of their structure
    ctx.has_lse = AttnOptions.decode(options).return_lse
    if ctx.has_lse and not ctx.fp8:
        ctx.save_for_backward(q, k, v, out, lse, *cu_seqlens)


def _backward(ctx, grad_out, grad_lse):
    if ctx.fp8:
        raise NotImplementedError("tileattn: fp8 attention has no backward pass (train in fp16 / bf16)")
    if not ctx.has_lse:
        raise RuntimeError("tileattn::attn_fwd: a gradient needs the forward's lse (call it with return_lse=True; "
                           "tileattn.attention does)")
    saved = list(ctx.saved_tensors)
    if grad_out is None:  # only the lse was used
        grad_out = torch.zeros_like(saved[3])
    dq, dk, dv = attn_bwd(grad_out.contiguous() if grad_out.stride(-1) != 1 else grad_out, grad_lse, saved,
                          ctx.options)
    return dq, dk, dv, [None] * ctx.list_lens[0], [None] * ctx.list_lens[1], None


attn_fwd.register_autograd(_backward, setup_context=_setup_context)
