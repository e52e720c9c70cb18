"""Launch of dense attention backward (kernels_bwd.py): delta, then dK/dV, then dQ.

Inputs: the forward's problem and call (its tensors, its output and its log-sum-exp: natural log,
[B, Hq, Sq] or varlen [Hq, total_q]), the output gradient and, when the returned lse was used, its gradient.
Gradients come in the dtypes and layouts of q, k, v; deterministic (no atomics: see kernels_bwd.py). Tiles:
ops/common/configs.py (BwdConfig, forced with tileattn.force_backend(config=BwdConfig(...))).
"""
import torch
import triton
import triton.language as tl

from ... import hw
from ...launcher import launch_cached
from ..common.bwd_kernels import bwd_preprocess_kernel
from ..common.configs import bwd_config
from ..common.softmax import LOG2E
from . import launch_bwd_sm90
from .kernels_bwd import bwd_dkdv_kernel, bwd_dq_kernel
from .launch_triton import MAX_GRID_Y


def _grid(blocks, bh):
    """(blocks, batch * heads folded over y and z: y holds at most 65535)."""
    return (blocks, min(bh, MAX_GRID_Y), triton.cdiv(bh, MAX_GRID_Y))


def _strides(t, varlen):
    """(batch, sequence, head) strides of a [B, S, H, D] (or varlen [total, H, D]) tensor."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def attn_bwd(p, c, do, dlse):
    """(dq, dk, dv) of problem p (problem.AttnProblem) for the forward call c (problem.Call: q, k, v, out, lse,
    cu_seqlens), the output gradient do and the lse's gradient dlse (or None)."""
    q, k, v, out, lse, cu_q = c.q, c.k, c.v, c.out, c.lse, c.cu_q
    # bfloat16 under the interpreter (wrong dots): the forward refuses it already, but tileattn::attn_bwd can be
    # called on its own
    hw.check_interpreter_dtype(q.dtype, "q")
    hw.check_interpreter_dtype(do.dtype, "grad_out")
    varlen = p.varlen
    batch, sq, sk, hq, hkv, d, dv = p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v
    left, right = p.opts.window
    scale, softcap = p.opts.scale, p.opts.softcap
    # varlen: rows past cu_seqlens[-1] (padding) belong to no sequence and get zero gradients
    alloc = torch.zeros_like if varlen else torch.empty_like
    dq, dk, dvv = alloc(q), alloc(k), alloc(v)
    if q.numel() == 0 or k.numel() == 0 or batch == 0:
        return dq.zero_(), dk.zero_(), dvv.zero_()
    if not do.stride(-1) == 1:
        do = do.contiguous()
    if dlse is not None:  # autograd may hand in expanded (stride 0) or transposed gradients
        dlse = dlse.contiguous()
    # window bounds past Sq + Sk never bind: clamp them so the kernels' int32 index arithmetic cannot overflow
    span = sq + sk
    left = min(left, span) if left >= 0 else left
    right = min(right, span) if right >= 0 else right
    # float64 (the CPU suite's gradcheck calls attn_bwd directly; the public API takes 16-bit inputs):
    # float64 accumulation and delta
    acc = tl.float64 if q.dtype == torch.float64 else tl.float32
    delta = torch.empty_like(lse, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    ls = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    gls = ((0, dlse.stride(0)) if varlen else (dlse.stride(0), dlse.stride(1))) if dlse is not None else (0, 0)
    cu_k_arg = c.cu_k if varlen else lse
    cu_q_arg = cu_q if varlen else lse
    bd, bdv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    cfg = bwd_config(max(d, dv))
    (km, kn, kw, ks), (qm, qn, qw, qs) = cfg.dkdv, cfg.dq
    pm = 64 if bdv <= 128 else 32
    launch_cached(bwd_preprocess_kernel, _grid(triton.cdiv(sq, pm), batch * hq), (
        out, do, dlse if dlse is not None else lse, delta, *_strides(out, varlen), *_strides(do, varlen), *ls,
        *gls, cu_q_arg, sq, hq, batch * hq), dict(DV=dv, BLOCK_M=pm, BLOCK_DV=bdv, IS_VARLEN=varlen,
                                                  HAS_DLSE=dlse is not None, ACC=acc, num_warps=4))
    if softcap > 0:
        qk_scale, softcap_scale, softcap_out = 1.0, scale / softcap, softcap * LOG2E
    else:
        qk_scale, softcap_scale, softcap_out = scale * LOG2E, 1.0, 1.0
    # no mask code at all where no tile can need it (no window or causal rule, whole tiles); else only the
    # tiles the rule cuts run masked
    ragged = varlen or sq % km or sk % kn or sq % qm or sk % qn
    needs_mask = bool(left >= 0 or right >= 0 or ragged)
    common = dict(D=d, DV_=dv, BLOCK_D=bd, BLOCK_DV=bdv, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
                  ALIGN_BOTTOM_RIGHT=p.opts.bottom_right, HAS_SOFTCAP=softcap > 0, IS_VARLEN=varlen,
                  NEEDS_MASK=needs_mask, ACC=acc)
    qkv_strides = (*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen))
    tail = (scale, qk_scale, softcap_scale, softcap_out, left, right)
    if not launch_bwd_sm90.reason(p, q, k, v, do):
        launch_bwd_sm90.attn_bwd_sm90(p, c, do, delta, (dq, dk, dvv), tail)
        return dq, dk, dvv
    # launch_cached: the normal kernel[grid](...) path costs ~100 us of host time per launch, more than the
    # whole backward of small problems (the GPU would wait on the host)
    launch_cached(bwd_dkdv_kernel, _grid(triton.cdiv(sk, kn), batch * hkv), (
        q, k, v, do, lse, delta, dk, dvv, *qkv_strides, *_strides(dk, varlen), *_strides(dvv, varlen), *ls,
        cu_q_arg, cu_k_arg, sq, sk, hkv, hq // hkv, batch * hkv, *tail),
        dict(BLOCK_M=km, BLOCK_N=kn, num_warps=kw, num_stages=ks, **common))
    launch_cached(bwd_dq_kernel, _grid(triton.cdiv(sq, qm), batch * hq), (
        q, k, v, do, lse, delta, dq, *qkv_strides, *_strides(dq, varlen), *ls, cu_q_arg, cu_k_arg, sq, sk, hq,
        hq // hkv, batch * hq, *tail), dict(BLOCK_M=qm, BLOCK_N=qn, num_warps=qw, num_stages=qs, **common))
    return dq, dk, dvv
