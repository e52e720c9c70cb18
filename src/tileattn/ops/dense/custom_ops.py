"""torch.library registrations of dense attention, so torch.compile traces tileattn calls without graph breaks.

    tileattn::attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, options) -> (out, lse)        float16 / bfloat16
    tileattn::attn_fwd_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, descales, options) -> (out, lse)
    tileattn::attn_bwd(grad_out, grad_lse, saved, options) -> (dq, dk, dv)

`options` is problem.AttnOptions.encode() (the call's non-tensor arguments as one string); descales is [] or
fp8's three descale tensors. Each op has a fake (meta) implementation that produces outputs of the right shape,
dtype and strides without touching data. attn_fwd's autograd formula is attn_bwd (bwd.py): it needs the
forward's lse, which api.py requests whenever a gradient is tracked; fp8 inputs have no backward (a clear
error). The 16-bit forward takes no list argument: the autograd wrapper of an op with one walks its inputs as
a pytree on every backward (~35 us of host time).
"""
import torch

from . import bwd, plans
from .problem import AttnOptions, AttnProblem, Call, alloc_lse, alloc_out


def _cu(cu_seqlens_q, cu_seqlens_k):
    return () if cu_seqlens_q is None else (cu_seqlens_q, cu_seqlens_k)


def _fake_fwd(q, v, cu_seqlens_q, options):
    opts = AttnOptions.decode(options)
    varlen = cu_seqlens_q is not None
    return alloc_out(q, v.shape[-1], varlen, opts.out_dtype), alloc_lse(q, varlen, opts.return_lse)


@torch.library.custom_op("tileattn::attn_fwd", mutates_args=())
def attn_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor | None,
             cu_seqlens_k: torch.Tensor | None, options: str) -> tuple[torch.Tensor, torch.Tensor]:
    return plans.attn_fwd(q, k, v, _cu(cu_seqlens_q, cu_seqlens_k), None, AttnOptions.decode(options))


@attn_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, options):
    return _fake_fwd(q, v, cu_seqlens_q, options)


@torch.library.custom_op("tileattn::attn_fwd_fp8", mutates_args=())
def attn_fwd_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor | None,
                 cu_seqlens_k: torch.Tensor | None, descales: list[torch.Tensor],
                 options: str) -> tuple[torch.Tensor, torch.Tensor]:
    return plans.attn_fwd(q, k, v, _cu(cu_seqlens_q, cu_seqlens_k), tuple(descales) or None,
                          AttnOptions.decode(options))


@attn_fwd_fp8.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, descales, options):
    return _fake_fwd(q, v, cu_seqlens_q, options)


def _fp8_backward(ctx, grad_out, grad_lse):
    raise NotImplementedError("tileattn: fp8 attention has no backward pass (train in fp16 / bf16)")


attn_fwd_fp8.register_autograd(_fp8_backward)


def _attn_bwd(grad_out, grad_lse, saved, options):
    """saved: the forward's q, k, v, out, lse (and cu_seqlens_q, cu_seqlens_k for varlen). Batched calls go
    through the backward's launch plans (bwd.attn_bwd_planned)."""
    if len(saved) == 5 and grad_out.stride(-1) == 1:  # (varlen calls save cu_seqlens too)
        return bwd.attn_bwd_planned(saved, grad_out, grad_lse, options)
    q, k, v, out, lse, *cu = saved
    opts = AttnOptions.decode(options)
    c = Call(q, k, v, out, lse, cu[0] if cu else None, cu[1] if cu else None, None, opts.scale, opts.softcap, 1.0)
    return bwd.attn_bwd(AttnProblem.of(c, opts), c, grad_out, grad_lse)


@torch.library.custom_op("tileattn::attn_bwd", mutates_args=())
def attn_bwd(grad_out: torch.Tensor, grad_lse: torch.Tensor | None, saved: list[torch.Tensor],
             options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _attn_bwd(grad_out, grad_lse, saved, options)


@attn_bwd.register_fake
def _(grad_out, grad_lse, saved, options):
    q, k, v = saved[:3]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, options = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zero tensor made or read)
    ctx.options = options
    ctx.has_lse = AttnOptions.decode(options).return_lse
    if ctx.has_lse:
        ctx.save_for_backward(q, k, v, out, lse, *_cu(cu_seqlens_q, cu_seqlens_k))


def _backward(ctx, grad_out, grad_lse):
    if not ctx.has_lse:
        raise RuntimeError("tileattn::attn_fwd: a gradient needs the forward's lse (call it with return_lse=True; "
                           "tileattn.attention does)")
    saved = list(ctx.saved_tensors)
    if grad_out is None:  # only the lse was used
        grad_out = torch.zeros_like(saved[3])
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    # Eager autograd on plain tensors calls the backward directly: the registered op's dispatch costs 0.1-0.5 ms
    # of host time per call on the H100's host (.diag profile, 2026-11-23), as much as the whole backward at
    # N = 1K. What torch.compile traces (fake / functional tensors) goes through the registered op.
    if type(grad_out) is torch.Tensor and type(saved[0]) is torch.Tensor and not torch.compiler.is_compiling():
        dq, dk, dv = _attn_bwd(grad_out, grad_lse, saved, ctx.options)
    else:
        dq, dk, dv = attn_bwd(grad_out, grad_lse, saved, ctx.options)
    return dq, dk, dv, None, None, None


attn_fwd.register_autograd(_backward, setup_context=_setup_context)


class EagerAttn(torch.autograd.Function):
    """attn_fwd with its autograd formula for plain eager tensors that track a gradient (api.py picks it; what
    torch.compile traces, tensor subclasses and torch.func transforms take the registered op). Same forward,
    same backward, without the registered op's dispatch and autograd wrapper: those cost ~90 us of host time
    per forward on the H100's host (scripts/profile_kernels.py host, 2026-11-24: 118 us to issue a forward
    that tracks a gradient against 26 us for one that does not), more than the kernel at N = 1K."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, options):
        out, lse = plans.attn_fwd(q, k, v, _cu(cu_seqlens_q, cu_seqlens_k), None, AttnOptions.decode(options))
        _setup_context(ctx, (q, k, v, cu_seqlens_q, cu_seqlens_k, options), (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        # once_differentiable's wrapper only where it matters (create_graph: grad mode on); the usual backward
        # goes straight to _backward, whose routing (plain tensors to the launch plans, the rest to the op) is the
        # registered op's: each wrapper layer costs host time, which bounds the N = 1K backward
        # (docs/design/backward.md, the eighth round)
        if torch.is_grad_enabled():
            return _once_differentiable_backward(ctx, grad_out, grad_lse)
        return _backward(ctx, grad_out, grad_lse)


# no double backward: a clear error, as the registered op gives (create_graph=True runs the backward with grad mode
# on; the outputs are then marked so that differentiating them raises)
_once_differentiable_backward = torch.autograd.function.once_differentiable(_backward)
