"""torch.library registrations of flex attention, so torch.compile traces flex_attention without graph breaks.

    tileattn::flex_fwd(query, key, value, tensors, options) -> (out, lse)          float16 / bfloat16
    tileattn::flex_bwd(grad_out, grad_lse, saved, options) -> (dq, dk, dv)

`options` is problem.FlexOptions.encode(): the traced mods by their source digests (trace.spec_of), the block
mask's block sizes, the scale, whether the lse is returned. `tensors` is the mods' captured tensors and the
block mask's lists (FlexOptions says which): graph inputs, so a compiled graph reads their current values.
api.py calls flex_fwd where Dynamo traces flex_attention (captures.py: how the mods get there); eager calls
keep their direct path (api._FlexFn), with no op dispatch. The fake implementations give outputs of the right
shape, dtype and strides without touching data; flex_fwd's autograd formula is flex_bwd (bwd.py), which needs
the forward's lse: api.py asks for it whenever a gradient is tracked. Captured tensors get no gradient.
"""
import torch

from . import bwd, dispatch
from .problem import FlexCall, FlexOptions, FlexProblem
from .trace import spec_of


def _problem(query, key, value, tensors, opts):
    """(FlexProblem, FlexCall) of a registered op's arguments (FlexOptions opts)."""
    score = spec_of(opts.score) if opts.score else None
    mask = spec_of(opts.mask) if opts.mask else None
    n = opts.n_score + opts.n_mask
    rest = iter(tensors[n:])
    lists = [next(rest) if bit == "1" else None for bit in opts.lists]
    blocks = (opts.q_block, opts.kv_block) if opts.lists else None
    p = FlexProblem.of(query, key, value, (score, mask), blocks, opts.scale, query.dtype, opts.return_lse)
    c = FlexCall(query, key, value, lists=tuple(lists[:4]) if lists else None,
                 tlists=tuple(lists[4:]) if len(lists) > 4 else None,
                 captures=(tuple(tensors[:opts.n_score]), tuple(tensors[opts.n_score:n])))
    return p, c


def _fake_fwd(query, value, options):
    opts = FlexOptions.decode(options)
    B, H, Sq, _ = query.shape
    out = query.new_empty(B, H, Sq, value.shape[3])
    return out, query.new_empty((B, H, Sq) if opts.return_lse else (0,), dtype=torch.float32)


@torch.library.custom_op("tileattn::flex_fwd", mutates_args=())
def flex_fwd(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tensors: list[torch.Tensor],
             options: str) -> tuple[torch.Tensor, torch.Tensor]:
    p, c = _problem(query, key, value, tensors, FlexOptions.decode(options))
    if p.return_lse:
        return dispatch.forward(p, c)
    return dispatch.forward(p, c), query.new_empty(0, dtype=torch.float32)


@flex_fwd.register_fake
def _(query, key, value, tensors, options):
    return _fake_fwd(query, value, options)


@torch.library.custom_op("tileattn::flex_bwd", mutates_args=())
def flex_bwd(grad_out: torch.Tensor, grad_lse: torch.Tensor | None, saved: list[torch.Tensor],
             options: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """saved: the forward's query, key, value, out, lse, then its tensors."""
    query, key, value, out, lse, *tensors = saved
    p, c = _problem(query, key, value, tensors, FlexOptions.decode(options))
    c.out, c.lse = out, lse
    return bwd.flex_bwd(p, c, grad_out, grad_lse)


@flex_bwd.register_fake
def _(grad_out, grad_lse, saved, options):
    query, key, value = saved[:3]
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_context(ctx, inputs, output):
    query, key, value, tensors, options = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None (no zero tensor made or read)
    ctx.options, ctx.n_tensors = options, len(tensors)
    ctx.has_lse = FlexOptions.decode(options).return_lse
    if ctx.has_lse:
        ctx.save_for_backward(query, key, value, out, lse, *tensors)


def _backward(ctx, grad_out, grad_lse):
    if not ctx.has_lse:
        raise RuntimeError("tileattn::flex_fwd: a gradient needs the forward's lse (FlexOptions.return_lse; "
                           "tileattn.flex_attention asks for it whenever a gradient is tracked)")
    saved = list(ctx.saved_tensors)
    if grad_out is None:  # only the lse was used
        grad_out = torch.zeros_like(saved[3])
    dq, dk, dv = flex_bwd(grad_out, grad_lse, saved, ctx.options)
    return dq, dk, dv, [None] * ctx.n_tensors, None  # captured tensors get no gradient


flex_fwd.register_autograd(_backward, setup_context=_setup_context)
