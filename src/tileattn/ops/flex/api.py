"""flex_attention: torch's FlexAttention programming model (score_mod, mask_mod, block masks) on tileattn."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

# torch's own, unchanged (tileattn.create_block_mask): the BlockMasks it builds work in both libraries
from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401 - re-exported

from ... import hw, knobs
from ..common.fp8 import FP8_DTYPES, Descale, Fp8V, check_fp8_options
from ..common.tma import tma_ok
from . import dispatch
from .bwd import flex_bwd
from .problem import FlexCall, FlexProblem, check_inputs, mask_tensors, transposed_lists, value_shape
from .trace import compile_mod

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

    from .mods import ScoreMod


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | Fp8V,
                   score_mod: ScoreMod | None = None, block_mask: BlockMask | None = None,
                   scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False, *,
                   q_descale: Descale = None, k_descale: Descale = None, v_descale: Descale = None,
                   out_dtype: torch.dtype | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention with a programmable score modifier and a block-sparse mask, as torch's flex_attention.

    query [B, Hq, Sq, D], key [B, Hkv, Sk, D], value [B, Hkv, Sk, Dv] (float16 / bfloat16, last dim contiguous);
    Hkv = Hq unless enable_gqa (Hq a multiple of Hkv; query head h reads kv head h // (Hq / Hkv)).
    score_mod(score, b, h, q_idx, kv_idx) -> score: plain Python on the scaled score (see trace.py for what
    it may use, captured tensors included; the same function works in torch's flex_attention).
    block_mask: a torch BlockMask (torch.nn.attention.flex_attention.create_block_mask or
    tileattn.create_block_mask): blocks it leaves out are skipped, its partial blocks apply its mask_mod, its
    full blocks do not. None: every key is visible. scale defaults to D ** -0.5.

    fp8 (float8_e4m3fn / e5m2) query, key and value, as tileattn.attention takes them: the real values are the
    stored ones times q_descale / k_descale / v_descale (numbers, or float32 [B, Hkv] per kv head); score_mod
    sees the real (descaled, scaled) scores; value plain [B, Hkv, Sk, Dv] (re-laid out on each call) or
    tileattn.fp8_v_layout(value.transpose(1, 2)) (an Fp8V: no copy); the output is out_dtype (default
    bfloat16). On the Hopper kernel's shapes (see launch_sm90.py) fp8 runs its fp8 path; elsewhere the inputs
    are dequantized to out_dtype first.

    Returns out [B, Hq, Sq, Dv] in query's dtype (fp8: out_dtype), and with return_lse also lse [B, Hq, Sq]
    float32 (natural log). Rows that see no key give 0 (lse -inf).

    Differentiable (float16 / bfloat16) in query, key and value, and through a returned lse: score_mod's
    derivative with respect to the score is generated from its trace (captured tensors get no gradient); GQA
    sums dk / dv over each group; deterministic (no atomics). The block mask must carry its transposed lists
    (q_num_blocks / q_indices, as create_block_mask makes them).
    """
    check_inputs(query, key, value, enable_gqa, scale)
    check_fp8_options(query, key.transpose(1, 2), q_descale, k_descale, v_descale, out_dtype, query.shape[0])
    fp8 = query.dtype in FP8_DTYPES
    if fp8:  # fp8 runs dequantized to out_dtype under the interpreter (no Hopper kernel there)
        hw.check_interpreter_dtype(out_dtype or torch.bfloat16, "out_dtype" if out_dtype is not None else
                                   "out_dtype (default for fp8 inputs)")
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (query, key, value))
    odt = (out_dtype or torch.bfloat16) if fp8 else query.dtype
    # a tracked gradient asks for the lse (the backward recomputes the probabilities from it)
    p, c = _describe(query, key, value, score_mod, block_mask, scale, odt, bool(return_lse or grad))
    c.descales = (q_descale, k_descale, v_descale)
    if grad:
        if fp8:
            raise NotImplementedError("flex_attention: fp8 inputs have no backward pass (detach them, or train in "
                                      "float16 / bfloat16)")
        if p.score_mod is not None:
            p.score_mod.grad_fn()  # an operation without a derivative raises here, before the forward runs
        if block_mask is not None:
            c.tlists = transposed_lists(block_mask, p.batch, p.heads_q, p.seqlen_k, query.device)
        out, lse = _FlexFn.apply(query, key, value, p, c)
        return (out, lse) if return_lse else out
    return _forward(p, c)


def _describe(query, key, value, score_mod, block_mask, scale, out_dtype, return_lse):
    """(FlexProblem, FlexCall) of checked inputs: the mods traced, the block mask's lists checked."""
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    smod = compile_mod(score_mod, "score") if score_mod is not None else None
    if block_mask is None:
        lists, q_block, kv_block, mmod = None, 128, 128, None
    else:
        lists, q_block, kv_block, mask_fn = mask_tensors(block_mask, B, H, Sq, Sk, query.device)
        mmod = compile_mod(mask_fn, "mask") if mask_fn is not None else None
    views = [t.transpose(1, 2) for t in (query, key) + (() if not isinstance(value, torch.Tensor) else (value,))]
    p = FlexProblem(B, H, key.shape[1], Sq, Sk, D, value_shape(value)[3], query.dtype, out_dtype, query.device,
                    D ** -0.5 if scale is None else float(scale), smod, mmod, block_mask is not None, q_block,
                    kv_block, return_lse, tma=all(tma_ok(t) for t in views))
    return p, FlexCall(query, key, value, lists=lists)


class _FlexFn(torch.autograd.Function):
    """flex_attention with its backward (bwd.py); returns (out, lse) so that a returned lse can be
    differentiated too."""

    @staticmethod
    def forward(ctx, query, key, value, p, c):
        out, lse = _forward(p, c)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.p, ctx.lists, ctx.tlists = p, c.lists, c.tlists
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        c = FlexCall(query, key, value, out, lse, ctx.lists, ctx.tlists)
        dq, dk, dv = flex_bwd(ctx.p, c, dout, dlse)
        return dq, dk, dv, None, None


def _forward(p, c):
    """The forward pass of problem p on call c's checked inputs: allocates the outputs, runs the backend
    dispatch.py chooses. Returns (out, lse) with p.return_lse, else out."""
    out = torch.empty(p.batch, p.heads_q, p.seqlen_q, p.head_dim_v, dtype=p.out_dtype, device=p.device)
    lse = torch.empty(p.batch, p.heads_q, p.seqlen_q, dtype=torch.float32, device=p.device) if p.return_lse else out
    if knobs.debug_fill_nan():  # tests: an element the kernel never writes fails the comparison
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    if p.seqlen_q and p.batch * p.heads_q:
        c.out, c.lse = out, lse
        dispatch.select(p)[0].run(p, c)
    return (out, lse) if p.return_lse else out
