"""flex_attention: torch's FlexAttention programming model (score_mod, mask_mod, block masks) on tileattn."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

# torch's own, unchanged (tileattn.create_block_mask): the BlockMasks it builds work in both libraries
from torch.nn.attention.flex_attention import create_block_mask  # noqa: F401 - re-exported

from ... import hw
from ..common.args import check_bool
from ..common.fp8 import FP8_DTYPES, Descale, Fp8V, check_fp8_options
from . import custom_ops, dispatch, plans
from .bwd import flex_bwd
from .captures import traced_mod
from .problem import (
    DTYPES,
    FlexCall,
    FlexOptions,
    FlexProblem,
    check_inputs,
    mask_tensors,
    transposed_lists,
)
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

    Under torch.compile (fullgraph too; 16-bit inputs) the call is a registered op (custom_ops.py) whose
    graph inputs include the mods' captured tensors and the block mask's lists, so new values (or new tensors
    of the same shapes) need no recompile; the mods must be made outside the compiled function (captures.py).
    """
    check_bool("enable_gqa", enable_gqa)
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (query, key, value))
    eager = isinstance(query, torch.Tensor) and not torch.compiler.is_compiling()
    if eager and query.dtype in FP8_DTYPES and not grad:  # checked, described and planned once (plans.py)
        p, c, plan = plans.lookup((query, key, value), score_mod, block_mask, scale, enable_gqa, bool(return_lse),
                                  False, (q_descale, k_descale, v_descale, out_dtype))
        return dispatch.forward(p, c, plan)
    if (eager and query.dtype in DTYPES and q_descale is None and k_descale is None and v_descale is None
            and out_dtype is None):
        p, c, plan = plans.lookup((query, key, value), score_mod, block_mask, scale, enable_gqa,
                                  bool(return_lse or grad), grad)
        if grad:
            out, lse = _FlexFn.apply(query, key, value, p, c, plan)
            return (out, lse) if return_lse else out
        return dispatch.forward(p, c, plan)
    check_inputs(query, key, value, enable_gqa, scale)
    check_fp8_options(query, key.transpose(1, 2), q_descale, k_descale, v_descale, out_dtype, query.shape[0])
    fp8 = query.dtype in FP8_DTYPES
    if fp8:  # fp8 runs dequantized to out_dtype under the interpreter (no Hopper kernel there)
        hw.check_interpreter_dtype(out_dtype or torch.bfloat16, "out_dtype" if out_dtype is not None else
                                   "out_dtype (default for fp8 inputs)")
    odt = (out_dtype or torch.bfloat16) if fp8 else query.dtype
    if torch.compiler.is_compiling():
        if fp8:
            raise NotImplementedError("flex_attention: fp8 inputs under torch.compile are not supported (call it "
                                      "outside the compiled function, or with float16 / bfloat16 inputs)")
        return _traced(query, key, value, score_mod, block_mask, scale, bool(return_lse), grad)
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
    return dispatch.forward(p, c)


def _describe(query, key, value, score_mod, block_mask, scale, out_dtype, return_lse):
    """(FlexProblem, FlexCall) of checked inputs: the mods traced, the block mask's lists checked."""
    B, H, Sq, _ = query.shape
    smod = compile_mod(score_mod, "score") if score_mod is not None else None
    lists, blocks, mmod = None, None, None
    if block_mask is not None:
        lists, q_block, kv_block, mask_fn = mask_tensors(block_mask, B, H, Sq, key.shape[2], query.device)
        blocks = (q_block, kv_block)
        mmod = compile_mod(mask_fn, "mask") if mask_fn is not None else None
    p = FlexProblem.of(query, key, value, (smod, mmod), blocks, scale, out_dtype, return_lse)
    return p, FlexCall(query, key, value, lists=lists)


def _traced(query, key, value, score_mod, block_mask, scale, return_lse, grad):
    """flex_attention as Dynamo traces it (checked 16-bit inputs): the mods' host halves run once per compile
    (captures.py), the call is the registered op (custom_ops.py) on query, key, value and a list of the call's
    other tensors: the mods' captures, then the block mask's lists (the transposed ones too for a gradient)."""
    B, H, Sq, _ = query.shape
    score, tensors = traced_mod(score_mod, "score", grad) if score_mod is not None else ("", [])
    n_score = len(tensors)
    mask, lists, blocks = "", (), (128, 128)
    if block_mask is not None:
        lists, q_block, kv_block, mask_fn = mask_tensors(block_mask, B, H, Sq, key.shape[2], query.device)
        blocks = (q_block, kv_block)
        if mask_fn is not None:
            mask, caps = traced_mod(mask_fn, "mask", grad)
            tensors = tensors + caps
        if grad:
            lists = lists + transposed_lists(block_mask, B, H, key.shape[2], query.device)
    opts = FlexOptions(score, n_score, mask, len(tensors) - n_score, _constant(blocks[0]), _constant(blocks[1]),
                       "".join("0" if t is None else "1" for t in lists),
                       None if scale is None else _constant(float(scale)), return_lse or grad)
    out, lse = custom_ops.flex_fwd(query, key, value, tensors + [t for t in lists if t is not None], opts.encode())
    return (out, lse) if return_lse else out


def _constant(x):
    """x as a plain Python number where Dynamo may trace it as a symbol (dynamic=True makes the block mask's
    BLOCK_SIZE one; Dynamo shows a symbol to the traced code as an int): a guard on its value. The registered
    op takes its options as a string."""
    from torch.fx.experimental.symbolic_shapes import guard_scalar  # imported by Dynamo already
    return guard_scalar(x)


class _FlexFn(torch.autograd.Function):
    """flex_attention with its backward (bwd.py); returns (out, lse) so that a returned lse can be
    differentiated too."""

    @staticmethod
    def forward(ctx, query, key, value, p, c, plan=None):
        out, lse = dispatch.forward(p, c, plan)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.p, ctx.lists, ctx.tlists, ctx.captures, ctx.plan = p, c.lists, c.tlists, c.captures, plan
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        c = FlexCall(query, key, value, out, lse, ctx.lists, ctx.tlists, captures=ctx.captures)
        dq, dk, dv = flex_bwd(ctx.p, c, dout, dlse, ctx.plan)
        return dq, dk, dv, None, None, None
