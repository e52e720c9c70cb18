"""Launch of the flex Hopper backward kernel (gluon_bwd_sm90.py, flex_bwd_sm90_kernel; the dense backward's
pipeline, ops/common/gluon_bwd_sm90.py, over a block mask): which problems it takes and its arguments.

It serves what the flex Hopper forward serves in 16 bits (fp16 / bf16, D = Dv in {64, 128}, 128 x 128 mask
blocks, any lengths, tensors fit for tensor descriptors) on an H100/H200 with a Gluon-verified
triton; by default when both sequences have at least MIN_SEQLEN tokens (TILEATTN_SM90_BWD=1: wherever it
serves, =0: never, as for dense). bwd.py sends the rest to the Triton kernels.
"""
import torch
import triton

from ...launcher import launch_cached
from ..common import launch_bwd_sm90 as pipeline
from ..common.launch_bwd_sm90 import BLOCK_N
from ..common.softmax import LOG2E
from ..common.tma import gluon_desc
from .launch_sm90 import BLOCK, flex_mode, mask_lists
from .problem import mask_strides, mod_captures
from .trace import capture_args


def reason(p, dout):
    """Why the Hopper backward does not take problem p with output gradient dout ("" when it does)."""
    if not p.tma:
        return "query, key or value is not aligned for tensor descriptors (16-byte base and strides)"
    if (p.q_block, p.kv_block) != (BLOCK, BLOCK):
        return f"mask blocks {p.q_block} x {p.kv_block}: it serves {BLOCK} x {BLOCK} blocks"
    rows = p.batch * p.heads_q * _sum_rows(p)
    items = triton.cdiv(p.seqlen_k, BLOCK) * p.batch * p.heads_kv
    return pipeline.reason(p.device, p.dtype, p.head_dim, p.head_dim_v, (dout.transpose(1, 2),), (rows, items),
                           min(p.seqlen_q, p.seqlen_k))


def _sum_rows(p):
    """The dQ sums' rows per query head: whole mask blocks, the last one's padding rows too when it ends past Sq
    (the kernel walks its steps and adds to those rows; the conversion never reads them)."""
    return triton.cdiv(p.seqlen_q, BLOCK) * BLOCK


def _q_blocks(p):
    """The kernel's query blocks (of block_m rows) per head (the turn counters' count)."""
    return _sum_rows(p) // pipeline.block_m(p.head_dim)


def _fx(lists):
    return (*lists, *(s for t in lists for s in mask_strides(t)))


def alloc_counters(p):
    """The kernel's int32 counter buffer for problem p (pipeline.counter_count), not zeroed: the preprocess
    zeroes it (pipeline.zero_args)."""
    n = pipeline.counter_count(p.batch, p.heads_q, p.heads_kv, _q_blocks(p))[1]
    return torch.empty(n, dtype=torch.int32, device=p.device)


def flex_bwd_sm90(p, c, dout, delta, grads, counters):
    """Launches the kernel and the dQ conversion: gradients into grads = (dq, dk, dv) ([B, H, S, D] like the
    inputs) for call c (its lse, lists and transposed lists), dout and delta ([B, Hq, Sq] float32, lse's
    strides); counters: alloc_counters(p), zeroed by the preprocess."""
    from .gluon_bwd_sm90 import flex_bwd_sm90_kernel
    dq, dk, dv = grads
    d = p.head_dim
    nq, nk = triton.cdiv(p.seqlen_q, BLOCK), triton.cdiv(p.seqlen_k, BLOCK)
    fk = _fx(mask_lists(c.lists, nk, nq, p.device))
    fx = _fx(mask_lists(c.tlists, nq, nk, p.device))
    q, k, v, do, dk_, dv_ = (t.transpose(1, 2) for t in (c.query, c.key, c.value, dout, dk, dv))  # [B, S, H, D]
    bm = pipeline.block_m(d)
    mb = _q_blocks(p)
    meta = pipeline.meta(d)
    # every query block's sums are written (stored by its first key block, or never: rows that saw no key,
    # which the conversion zeroes by their lse), so no zero fill
    acc = torch.empty(p.batch * p.heads_q * _sum_rows(p), d, dtype=torch.float32, device=p.device)
    lse = c.lse
    smod, mmod = p.score_mod, p.mask_mod
    grid, items, _ = pipeline.grid(d, nk, p.batch * p.heads_kv, p.device, False)  # (no rotated walks: one per item)
    launch_cached(flex_bwd_sm90_kernel, grid, (
        gluon_desc(q, [1, bm, 1, d]), gluon_desc(k, [1, BLOCK_N, 1, d]), gluon_desc(v, [1, BLOCK_N, 1, d]),
        gluon_desc(do, [1, bm, 1, d]), lse, delta, dk_, dv_,
        gluon_desc(acc, pipeline.dq_half(d)) if meta["TMA_DQ"] else acc, counters, lse.stride(0), lse.stride(1),
        dk_.stride(0), dk_.stride(1), dk_.stride(2), dv_.stride(0), dv_.stride(1), dv_.stride(2), p.seqlen_q,
        p.seqlen_k, p.heads_kv, p.group, mb, nk, items, float(p.scale), float(p.scale * LOG2E), fx, fk,
        *(capture_args(t) for t in mod_captures(p, c))),
        dict(SCORE_GRAD=smod.grad_fn(gluon=True) if smod else None, MASK_MOD=mmod.gluon_fn() if mmod else None,
             FLEX=flex_mode(p.seqlen_q, p.seqlen_k), **meta))
    pipeline.convert(launch_cached, acc, counters, dq.transpose(1, 2), lse, (p.heads_kv, nk, mb), p.scale, True)
