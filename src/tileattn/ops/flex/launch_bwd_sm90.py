"""Launch of the flex Hopper backward kernel (gluon_bwd_sm90.py, flex_bwd_sm90_kernel; the dense backward's
pipeline, ops/common/gluon_bwd_sm90.py, over a block mask): which problems it takes and its arguments.

It serves what the flex Hopper forward serves in 16 bits (fp16 / bf16, D = Dv in {64, 128}, 128 x 128 mask
blocks, any lengths, tensors fit for tensor descriptors) on an H100/H200 with a Gluon-verified
triton; by default when both sequences have at least MIN_SEQLEN tokens (TILEATTN_SM90_BWD=1: wherever it
serves, =0: never, as for dense). bwd.py sends the rest to the Triton kernels.
"""
import torch
import triton

from ...launcher import launch_args, launch_built, launch_cached
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
    """The kernel's int32 counter buffer for problem p (pipeline.counter_count), then one element for its head
    group, not zeroed: the preprocess zeroes the counters and writes the head group (pipeline.zero_args with
    chain_args)."""
    n = pipeline.counter_count(p.batch, p.heads_q, p.heads_kv, _q_blocks(p))[1]
    return torch.empty(n + 1, dtype=torch.int32, device=p.device)


def chain_args(p, c):
    """bwd_kernels.chain_group's arguments for call c: the transposed lists (batch 0, head 0 at their base), their
    strides along the key blocks, the key blocks, and the head group to take where the walks start in ties."""
    nq, nk = triton.cdiv(p.seqlen_q, BLOCK), triton.cdiv(p.seqlen_k, BLOCK)
    num, idx, fnum, fidx = mask_lists(c.tlists, nq, nk, p.device)
    return (num, idx, fnum, fidx, mask_strides(num)[2], mask_strides(idx)[2], mask_strides(fnum)[2],
            mask_strides(fidx)[2], nk, pipeline.FLEX_HEAD_GROUP)


def flex_bwd_sm90(p, c, dout, delta, grads, counters, kept=None):
    """Launches the kernel and the dQ conversion: gradients into grads = (dq, dk, dv) ([B, H, S, D] like the
    inputs) for call c (its lse, lists and transposed lists), dout and delta ([B, Hq, Sq] float32, lse's
    strides); counters: alloc_counters(p), zeroed by the preprocess. kept: a plan's dict (plans.Plan.backward)
    in which both launches are kept and replayed; None: launcher.launch_cached."""
    from .gluon_bwd_sm90 import flex_bwd_sm90_kernel
    dq, dk, dv = grads
    d = p.head_dim
    nq, nk = triton.cdiv(p.seqlen_q, BLOCK), triton.cdiv(p.seqlen_k, BLOCK)
    lk = mask_lists(c.lists, nk, nq, p.device)
    lq = mask_lists(c.tlists, nq, nk, p.device)
    mb = _q_blocks(p)
    # every query block's sums are written (stored by its first key block, or never: rows that saw no key,
    # which the conversion zeroes by their lse), so no zero fill
    acc = torch.empty(p.batch * p.heads_q * _sum_rows(p), d, dtype=torch.float32, device=p.device)
    lse = c.lse
    captures = mod_captures(p, c)
    # the kernel's tensors in argument order: the descriptors' bases are the [B, H, S, D] tensors themselves
    tensors = [c.query, c.key, c.value, dout, lse, delta, dk, dv, acc, counters, *lq, *lk,
               *(t for caps in captures for t in caps)]
    def build():
        grid, items, _ = pipeline.grid(d, nk, p.batch * p.heads_kv, p.device, pipeline.PLAIN)
        return (flex_bwd_sm90_kernel, grid,
                *_arguments(p, c, (dout, delta, dk, dv, acc, counters), (lq, lk), captures, items))
    if kept is None:
        launch_cached(*build())
    else:
        launch_built(kept, "sm90", tensors, build)
    pipeline.convert(lambda *a: launch_args(kept, "convert", *a), acc, counters, dq.transpose(1, 2), lse,
                     (p.heads_kv, nk, mb), p.scale, True)


def _arguments(p, c, tensors, lists, captures, items):
    """(args, kwargs) of flex_bwd_sm90_kernel: tensors = (dout, delta, dk, dv, acc, counters), lists = (the
    transposed lists, the forward lists) as mask_lists gives them."""
    dout, delta, dk, dv, acc, counters = tensors
    d, bm = p.head_dim, pipeline.block_m(p.head_dim)
    meta = pipeline.meta(d)
    bshd = (0, 2, 1, 3)  # [B, H, S, D] tensors seen as [B, S, H, D]
    smod, mmod = p.score_mod, p.mask_mod
    lse = c.lse
    args = (
        gluon_desc(c.query, [1, bm, 1, d], bshd), gluon_desc(c.key, [1, BLOCK_N, 1, d], bshd),
        gluon_desc(c.value, [1, BLOCK_N, 1, d], bshd), gluon_desc(dout, [1, bm, 1, d], bshd), lse, delta, dk, dv,
        gluon_desc(acc, pipeline.dq_half(d)) if meta["TMA_DQ"] else acc, counters, lse.stride(0), lse.stride(1),
        dk.stride(0), dk.stride(2), dk.stride(1), dv.stride(0), dv.stride(2), dv.stride(1), p.seqlen_q,
        p.seqlen_k, p.heads_kv, p.group, _q_blocks(p), triton.cdiv(p.seqlen_k, BLOCK), items, float(p.scale),
        float(p.scale * LOG2E), _fx(lists[0]), _fx(lists[1]), *(capture_args(t) for t in captures))
    kwargs = dict(SCORE_GRAD=smod.grad_fn(gluon=True) if smod else None, MASK_MOD=mmod.gluon_fn() if mmod else None,
                  FLEX=flex_mode(p.seqlen_q, p.seqlen_k), **meta)
    return args, kwargs
