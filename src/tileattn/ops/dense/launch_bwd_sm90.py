"""Launch of the Hopper backward kernel (gluon_bwd_sm90.py): which problems it takes and its arguments.

It serves fp16 / bf16 batched (not varlen) problems with D = Dv in {64, 128} and tensors that suit tensor
descriptors, on an H100/H200 with a Gluon-verified triton (ops/common/tma.py). By default it takes them when
both sequences have at least MIN_SEQLEN tokens; TILEATTN_SM90_BWD=1 sends it everything it serves, =0 nothing.
bwd.py sends the rest to the Triton kernels.
"""
import torch
import triton

from ... import knobs
from ..common.tma import gluon_desc, gluon_sm90_reason, tma_ok
from .kernels_bwd import bwd_dq_convert_kernel

BLOCK_M, BLOCK_N = 64, 128
# per head dim: (Q / dO stages, dQ staging buffers, registers per consumer thread, per loader / writer thread,
# rows a writer moves per chunk, TMA reduce-adds for dQ where triton has them). Shared memory at D=128: 226 KB of
# the H100's 227. Chosen on the H100 (2026-11-24, `scripts/sweep.py bwd --sm90-cfgs ...` and `gpu_check.sh
# ab-bwd`, docs/design/backward.md): at D=128 232 / 40 registers beat 240 / 24 (N=16K non-causal 489 vs 422
# TFLOPS, 4K 411 vs 392: the dQ writers are the bottleneck and 24 registers spill their loop state; the
# consumers do not spill at 232); at D=64, 4 dQ buffers, 3 stages or 8-row chunks were within 2%. TMA
# reduce-adds (triton 3.9) against vector atomics: D=128 +3-9% on every row (N 2K-16K, causal and not), D=64
# -9-10% at N 2K-4K non-causal and even elsewhere, so D=128 only.
CONFIGS = {64: (2, 2, 240, 40, 4, False), 128: (2, 2, 232, 40, 2, True)}
# the default takes problems whose sequences both have at least this many tokens: below, the Triton kernels
# measured faster or as fast (H100, B=4, H=32, fp16: at N=1K causal 187-215 vs 132-157 TFLOPS at D=128, 80-90 vs
# 47-136 at D=64: a few steps per program and the dQ turn chain; at N=2K the Hopper kernel is ahead by 2-16%
# except D=64 causal, 5% behind; at N >= 4K it is ahead on every row, by 4-46%)
MIN_SEQLEN = 2048


def reason(p, q, k, v, do):
    """Why the Hopper backward does not take problem p ("" when it does)."""
    mode = knobs.sm90_bwd()
    if mode == "off":
        return "TILEATTN_SM90_BWD=0"
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
    if p.batch * p.heads_q * triton.cdiv(p.seqlen_q, BLOCK_M) * BLOCK_M >= 2 ** 31:
        return "2^31 or more rows of dQ sums (int32 coordinates)"
    if mode == "auto" and min(p.seqlen_q, p.seqlen_k) < MIN_SEQLEN:
        return f"a sequence shorter than {MIN_SEQLEN}: the Triton kernels measured faster there"
    return ""


def alloc_sums(p, left, right, device):
    """(acc, turns): the float32 dQ sums [B * Hq * query blocks * BLOCK_M, D] and the per-(head, query block)
    turn counters of problem p (left, right: its window bounds as bwd.py clamps them)."""
    mb = triton.cdiv(p.seqlen_q, BLOCK_M)
    # query blocks that no key block sees get no dQ part: their sums must start at zero
    off = p.seqlen_k - p.seqlen_q if p.opts.bottom_right else 0
    empty_blocks = left >= 0 or (right >= 0 and off + right < 0)
    acc = (torch.zeros if empty_blocks else torch.empty)(p.batch * p.heads_q * mb * BLOCK_M, p.head_dim,
                                                          dtype=torch.float32, device=device)
    return acc, torch.zeros(p.batch * p.heads_q * mb, dtype=torch.int32, device=device)


def attn_bwd_sm90(p, c, do, delta, grads, sums, tail, launch):
    """Launches the kernel: gradients into grads = (dq, dk, dv), through the sums = alloc_sums(...) (tail:
    scale, qk_scale, softcap_scale, softcap_out, left, right as bwd.py computes them, the window bounds
    clamped; launch: bwd.Launches)."""
    from ..common.gluon_compat import TMA_REDUCE
    from .gluon_bwd_sm90 import attn_bwd_sm90_kernel
    q, k, v, lse = c.q, c.k, c.v, c.lse
    dq, dk, dv = grads
    acc, turns = sums
    scale, qk_scale, softcap_scale, softcap_out, left, right = tail
    d = p.head_dim
    stages, dq_bufs, regs, worker_regs, rows, tma_dq = CONFIGS[d]
    tma_dq = bool(tma_dq) and TMA_REDUCE
    mb = triton.cdiv(p.seqlen_q, BLOCK_M)
    # no masked step at all where no tile can need one (no window or causal rule, whole tiles)
    needs_mask = left >= 0 or right >= 0 or p.seqlen_q % BLOCK_M or p.seqlen_k % BLOCK_N
    grid = (triton.cdiv(p.seqlen_k, BLOCK_N), p.batch * p.heads_kv)
    # launch_cached: kernel[grid](...) encodes four tensor maps and binds ~40 arguments per call (~100 us of
    # host time, more than the whole backward at N=1K)
    launch(attn_bwd_sm90_kernel, grid, (
        gluon_desc(q, [1, BLOCK_M, 1, d]), gluon_desc(k, [1, BLOCK_N, 1, d]), gluon_desc(v, [1, BLOCK_N, 1, d]),
        gluon_desc(do, [1, BLOCK_M, 1, d]), lse, delta, dk, dv,
        gluon_desc(acc, [BLOCK_M, d // 2]) if tma_dq else acc, turns, lse.stride(0), lse.stride(1),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), p.seqlen_q, p.seqlen_k,
        p.heads_kv, p.heads_q // p.heads_kv, mb, scale, qk_scale, softcap_scale, softcap_out, left, right),
        dict(STAGES=stages, DQ_BUFS=dq_bufs, CONSUMER_REGS=regs, WORKER_REGS=worker_regs, WRITER_ROWS=rows,
             HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right,
             HAS_SOFTCAP=p.opts.softcap > 0, NEEDS_MASK=bool(needs_mask), TMA_DQ=tma_dq, num_warps=4))
    launch(bwd_dq_convert_kernel, (triton.cdiv(p.seqlen_q, 64), p.batch * p.heads_q), (
        acc, dq, dq.stride(0), dq.stride(1), dq.stride(2), p.seqlen_q, p.heads_q, mb * BLOCK_M, scale),
        dict(D=d, BLOCK_M=64, num_warps=4))
