"""Launch of dense attention backward (bwd_kernels.py): delta, then dK/dV, then dQ.

Inputs are those of the forward op plus its output, its log-sum-exp (natural log, [B, Hq, Sq] or varlen
[Hq, total_q]), the output gradient and, when the returned lse was used, its gradient. Gradients come in
the dtypes and layouts of q, k, v; deterministic (no atomics: see bwd_kernels.py).
"""
import torch
import triton
import triton.language as tl

from ... import hw
from ...launcher import launch_cached
from .bwd_kernels import bwd_dkdv_kernel, bwd_dq_kernel, bwd_preprocess_kernel
from .kernels import LOG2E
from .launch import MAX_GRID_Y


def _grid(blocks, bh):
    """(blocks, batch * heads folded over y and z: y holds at most 65535)."""
    return (blocks, min(bh, MAX_GRID_Y), triton.cdiv(bh, MAX_GRID_Y))


FORCE = None  # scripts/sweep_bwd.py: ((BLOCK_M, BLOCK_N, warps, stages) of dK/dV, the same of dQ)


def _tiles(d):
    """((BLOCK_M, BLOCK_N, num_warps, num_stages) of the dK/dV kernel, the same of the dQ kernel) for head dim
    d: the interpreter's small tiles; on GPUs 64 x 64 tiles with 4 warps, 32 x 32 past d = 128.
    scripts/sweep_bwd.py on the H100 (fp16, B=4, H=32, N 1K-16K): 3 stages win at D=64 (causal 16K 336 vs
    312 TFLOPS with 2), 2 at D=128 (non-causal 16K 350 vs 325); 8 warps on 64 x 64 (no spills at D=128) lost
    40%, 64 x 128 tiles with 8 warps 35-50%. Earlier (2026-11-21): 128 x 128 / 8 warps 258 vs 357 at D=128."""
    if FORCE is not None:
        return FORCE
    if hw.interpreter_enabled():
        return (16, 16, 4, 1), (16, 16, 4, 1)
    if d <= 64:
        return (64, 64, 4, 3), (64, 64, 4, 3)
    if d <= 128:
        return (64, 64, 4, 2), (64, 64, 4, 2)
    return (32, 32, 4, 1), (32, 32, 4, 1)


def _strides(t, varlen):
    """(batch, sequence, head) strides of a [B, S, H, D] (or varlen [total, H, D]) tensor."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def attn_bwd(do, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap,
             align_bottom_right):
    varlen = cu_q is not None
    if varlen:
        batch, sq, sk = cu_q.shape[0] - 1, int(max_q), int(max_k)
        hq, d = q.shape[1], q.shape[2]
        hkv, dv = k.shape[1], v.shape[2]
    else:
        batch, sq, hq, d = q.shape
        sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
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
    cu_k_arg = cu_k if varlen else lse
    cu_q_arg = cu_q if varlen else lse
    bd, bdv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    (km, kn, kw, ks), (qm, qn, qw, qs) = _tiles(max(d, dv))
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
                  ALIGN_BOTTOM_RIGHT=align_bottom_right, HAS_SOFTCAP=softcap > 0, IS_VARLEN=varlen, NEEDS_MASK=needs_mask,
                  ACC=acc)
    qkv_strides = (*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen))
    tail = (scale, qk_scale, softcap_scale, softcap_out, left, right)
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
