"""Launch of the Hopper backward kernel (gluon_bwd_sm90.py): which problems it serves and its arguments.

It serves fp16 / bf16 batched (not varlen) problems with D = Dv in {64, 128} and tensors that suit tensor
descriptors, on an H100/H200 with a Gluon-verified triton (ops/common/tma.py); bwd.py sends the rest to the
Triton kernels. It is opt-in (TILEATTN_SM90_BWD=1) until it beats the Triton backward: on the H100 it does at
D=128 non-causal, N >= 4K (+5-8%), and not yet elsewhere (docs/design/backward.md).
"""
import torch
import triton

from ... import knobs
from ...launcher import launch_cached
from ..common.tma import gluon_desc, gluon_sm90_reason, tma_ok
from .kernels_bwd import bwd_dq_convert_kernel

BLOCK_M, BLOCK_N = 64, 128
# per head dim: (Q / dO stages, dQ staging buffers, registers per consumer thread, per loader / writer thread,
# rows the writer moves per chunk). Shared memory at D=128: 224 KB of the H100's 227. H100 A/B runs
# (2026-11-24, docs/design/backward.md): at D=128 workers with 24 registers and 2-row chunks (both consumer
# warpgroups get 240; D=128 non-causal 4K 365 vs 350 TFLOPS with 40 / 4); at D=64 that writer is too slow
# (144 vs 305): 40 registers and 4-row chunks.
CONFIGS = {64: (2, 2, 240, 40, 4), 128: (2, 2, 240, 24, 2)}


def reason(p, q, k, v, do):
    """Why the Hopper backward cannot serve problem p ("" when it can)."""
    if not knobs.sm90_bwd():
        return "opt-in (TILEATTN_SM90_BWD=1): not yet faster than the Triton backward"
    why = gluon_sm90_reason(q.device)
    if why:
        return why
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype}"
    if p.varlen:
        return "packed (varlen) inputs"
    if p.head_dim != p.head_dim_v or p.head_dim not in CONFIGS:
        return f"head dims D={p.head_dim}, Dv={p.head_dim_v}: it serves D = Dv in {sorted(CONFIGS)}"
    if p.batch * p.heads_kv > 65535:
        return "more than 65535 (batch, kv head) pairs"
    if not all(tma_ok(t) for t in (q, k, v, do)):
        return "q, k, v or the output gradient is not aligned for tensor descriptors"
    return ""


def attn_bwd_sm90(p, c, do, delta, grads, tail):
    """Launches the kernel: gradients into grads = (dq, dk, dv) (tail: scale, qk_scale, softcap_scale,
    softcap_out, left, right as bwd.py computes them, the window bounds clamped)."""
    from .gluon_bwd_sm90 import attn_bwd_sm90_kernel
    q, k, v, lse = c.q, c.k, c.v, c.lse
    dq, dk, dv = grads
    scale, qk_scale, softcap_scale, softcap_out, left, right = tail
    d = p.head_dim
    stages, dq_bufs, regs, worker_regs, rows = CONFIGS[d]
    mb = triton.cdiv(p.seqlen_q, BLOCK_M)
    # query blocks that no key block sees get no dQ part: their sums must start at zero
    off = p.seqlen_k - p.seqlen_q if p.opts.bottom_right else 0
    empty_blocks = left >= 0 or (right >= 0 and off + right < 0)
    acc = (torch.zeros if empty_blocks else torch.empty)(p.batch * p.heads_q * mb * BLOCK_M * d, dtype=torch.float32,
                                                          device=q.device)
    turns = torch.zeros(p.batch * p.heads_q * mb, dtype=torch.int32, device=q.device)
    # no masked step at all where no tile can need one (no window or causal rule, whole tiles)
    needs_mask = left >= 0 or right >= 0 or p.seqlen_q % BLOCK_M or p.seqlen_k % BLOCK_N
    grid = (triton.cdiv(p.seqlen_k, BLOCK_N), p.batch * p.heads_kv)
    attn_bwd_sm90_kernel[grid](
        gluon_desc(q, [1, BLOCK_M, 1, d]), gluon_desc(k, [1, BLOCK_N, 1, d]), gluon_desc(v, [1, BLOCK_N, 1, d]),
        gluon_desc(do, [1, BLOCK_M, 1, d]), lse, delta, dk, dv, acc, turns, lse.stride(0), lse.stride(1),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), p.seqlen_q, p.seqlen_k,
        p.heads_kv, p.heads_q // p.heads_kv, mb, scale, qk_scale, softcap_scale, softcap_out, left, right,
        STAGES=stages, DQ_BUFS=dq_bufs, CONSUMER_REGS=regs, WORKER_REGS=worker_regs, WRITER_ROWS=rows,
        HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right,
        HAS_SOFTCAP=p.opts.softcap > 0, NEEDS_MASK=bool(needs_mask), num_warps=4)
    launch_cached(bwd_dq_convert_kernel, (triton.cdiv(p.seqlen_q, 64), p.batch * p.heads_q), (
        acc, dq, dq.stride(0), dq.stride(1), dq.stride(2), p.seqlen_q, p.heads_q, mb * BLOCK_M, scale),
        dict(D=d, BLOCK_M=64, num_warps=4))
