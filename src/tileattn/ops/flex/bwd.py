"""Flex attention backward: delta (ops/common's preprocess), then dK, dV and dQ on the Hopper kernel
(launch_bwd_sm90.py, where it serves) or the Triton kernels (bwd_kernels.py).

Gradients come in the dtypes and layouts ([B, H, S, D]) of query, key and value; deterministic. Launches are kept
in the forward's plan (plans.py) and replayed, or go through launcher.launch_cached (the normal kernel[grid](...)
path costs ~100 us of host time per launch). Triton
tiles: the shared backward table (ops/common/configs.py, BwdConfig) kept within the mask's blocks.
"""
import torch
import triton

from ...launcher import launch_args
from ..common.bwd_kernels import bwd_preprocess_kernel
from ..common.configs import bwd_config
from ..common.launch_bwd_sm90 import zero_args
from . import launch_bwd_sm90
from .bwd_kernels import flex_bwd_dkdv_kernel, flex_bwd_dq_kernel
from .problem import mask_strides, mod_captures
from .trace import capture_args


def _tiles(d, q_block, kv_block):
    """(dK/dV tiles, dQ tiles), each (BLOCK_M, BLOCK_N, num_warps, num_stages), within the mask's blocks."""
    cfg = bwd_config(d)
    return tuple((min(bm, q_block), min(bn, kv_block), w, st) for bm, bn, w, st in (cfg.dkdv, cfg.dq))


def _pick(lists, i, dummy):
    return lists[i] if lists is not None and lists[i] is not None else dummy


def flex_bwd(p, c, dout, dlse, plan=None):
    """(dq, dk, dv) of problem p (problem.FlexProblem) for the forward call c (problem.FlexCall: query, key,
    value, out, lse, the block mask's lists and transposed lists, None without a block mask), the output
    gradient dout and the lse's gradient dlse (or None). plan: the forward's plans.Plan, whose kept backward
    launches (per layout of dout and dlse) are replayed; None: every launch through launch_cached."""
    query, key, value, out, lse, lists, tlists = c.query, c.key, c.value, c.out, c.lse, c.lists, c.tlists
    B, H, Sq, D = query.shape
    Hkv, Sk, Dv = key.shape[1], key.shape[2], value.shape[3]
    dq, dk, dv = torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)
    if Sq == 0 or Sk == 0 or B * H == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    if dlse is not None:
        dlse = dlse.contiguous()
    kept = plan.backward(dout, dlse) if plan is not None else None
    delta = torch.empty(B, H, Sq, dtype=torch.float32, device=query.device)
    bdv = triton.next_power_of_2(Dv)
    pm = 64 if bdv <= 128 else 32
    sm90 = not launch_bwd_sm90.reason(p, dout) and lse.stride() == delta.stride()
    counters = launch_bwd_sm90.alloc_counters(p) if sm90 else None  # (zeroed by the preprocess)
    chain = launch_bwd_sm90.chain_args(p, c) if sm90 else None
    zero, zero_kw = zero_args(counters, triton.cdiv(Sq, pm) * B * H, delta, chain)
    # the preprocess reads (batch, sequence, head) strides
    launch_args(kept, "preprocess sm90" if sm90 else "preprocess", bwd_preprocess_kernel,
                (triton.cdiv(Sq, pm), B * H, 1), (
        out, dout, dlse if dlse is not None else lse, delta, out.stride(0), out.stride(2), out.stride(1),
        dout.stride(0), dout.stride(2), dout.stride(1), lse.stride(0), lse.stride(1),
        *((dlse.stride(0), dlse.stride(1)) if dlse is not None else (0, 0)), lse, Sq, H, B * H, *zero),
        dict(DV=Dv, BLOCK_M=pm, BLOCK_DV=bdv, IS_VARLEN=False, HAS_DLSE=dlse is not None, num_warps=4, **zero_kw))
    if sm90:
        launch_bwd_sm90.flex_bwd_sm90(p, c, dout, delta, (dq, dk, dv), counters, kept)
        return dq, dk, dv
    dense = lists is None
    (km, kn, kw, ks), (qm, qn, qw, qs) = _tiles(max(D, Dv), p.q_block, p.kv_block)
    # whole tiles only (the tiles are powers of two, so the larger one dividing means both do)
    q_tile, kv_tile = (max(km, qm), max(kn, qn)) if dense else (p.q_block, p.kv_block)
    even = Sq % q_tile == 0 and Sk % kv_tile == 0
    load_even = even and D == triton.next_power_of_2(D) and Dv == bdv
    row_stride = max(query.stride(2), key.stride(2), value.stride(2), dout.stride(2))
    row64 = (max(Sq, Sk) + 1) * row_stride >= 2 ** 31
    smod, mmod = p.score_mod, p.mask_mod
    caps = tuple(capture_args(t) for t in mod_captures(p, c))
    meta = dict(SCORE_GRAD=smod.grad_fn() if smod else None, MASK_MOD=mmod.fn if mmod else None, DENSE=dense,
                EVEN=even, LOAD_EVEN=load_even, ROW64=row64, Q_BLOCK=p.q_block, KV_BLOCK=p.kv_block,
                BLOCK_D=triton.next_power_of_2(D), BLOCK_DV=bdv)
    qkv = (query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
           value.stride(0), value.stride(1), value.stride(2), dout.stride(0), dout.stride(1), dout.stride(2))
    tail = (H // Hkv, Sq, Sk, D, Dv, p.scale)
    dummy = lse  # never read where a block-mask tensor is absent
    tl_ = [_pick(tlists, i, dummy) for i in range(4)]
    launch_args(kept, "dkdv", flex_bwd_dkdv_kernel, (triton.cdiv(Sk, kn), B * Hkv), (
        query, key, value, dout, lse, delta, dk, dv, *tl_, *caps, *qkv,
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), lse.stride(0),
        lse.stride(1), *(s for t in (tlists or (None,) * 4) for s in mask_strides(t)), Hkv, *tail),
        dict(HAS_FULL=tlists is not None and tlists[2] is not None, BLOCK_M=km, BLOCK_N=kn, num_warps=kw,
             num_stages=ks, **meta))
    fl = [_pick(lists, i, dummy) for i in range(4)]
    launch_args(kept, "dq", flex_bwd_dq_kernel, (triton.cdiv(Sq, qm), B * H), (
        query, key, value, dout, lse, delta, dq, *fl, *caps, *qkv, dq.stride(0), dq.stride(1), dq.stride(2),
        lse.stride(0), lse.stride(1), *(s for t in (lists or (None,) * 4) for s in mask_strides(t)), H, *tail),
        dict(HAS_FULL=lists is not None and lists[2] is not None, BLOCK_M=qm, BLOCK_N=qn, num_warps=qw,
             num_stages=qs, **meta))
    return dq, dk, dv
