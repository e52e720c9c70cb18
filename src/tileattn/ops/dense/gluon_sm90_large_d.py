"""Hopper (sm90) Gluon kernel of dense attention forward for large head dims: the schedule of
kernels_large_d.py (S summed over head-dim chunks, the output cut into 256-column slices, one slice per CTA)
with warp specialization, TMA and no register spills.

Why (Nsight Compute on the H100, B=1, H=48, N=8K, D=1024 causal, `gpu_check.sh ncu-fwd`, 2026-11-21): the
Triton kernel keeps its V tile in registers while the Q K^T steps run (64 registers per thread), spills (local
memory requests add 102% to its memory requests), stores V to shared memory with 4.9-way bank conflicts and
issues from 8 warps at 14.8% of its issue slots; the tensor pipe is busy 57% of the time and L2 60%.

A CTA computes 2 * 64 query rows of one (batch, head) and one slice of DVS output columns. Partitions:
  - a loader (one warp) streams, per key block, the head dim in chunks of BLOCK_K columns through a ring of
    STAGES buffers: each holds the two 64-row halves of the Q chunk and the K chunk ([BLOCK_N, BLOCK_K]),
    one `ready` / `empty` barrier pair per buffer. The key block's V slice ([BLOCK_N, DVS]) goes to its own
    buffer after the block's first STAGES chunks (V of block b may only overwrite V of block b - 1 once the
    consumers' P V of b - 1 is done, which they wait for before the first chunk of block b). With Q_RESIDENT
    (D <= 384) the whole Q tile is loaded once and the ring holds K chunks only.
  - two consumer warpgroups, 64 rows each: S = sum over chunks of Q_c K_c^T by wgmma from shared memory (a
    chunk's buffer is handed back once the next chunk's wgmma is issued and the previous one waited on), the
    online softmax in registers (raw scores, the scale folded into exp2), O += P V with P from registers,
    issued at the start of the next block and waited on before its first chunk. The two never overlap in one
    warpgroup: with a 64x256 and a 64x128 float32 accumulator both in flight ptxas finds too few registers for
    its wgmma pipeline and serializes every wgmma of the kernel (C7512 "insufficient register resources"),
    which cost 11-15% (docs/design/large_d.md). The two warpgroups keep the tensor cores busy between them.
The masking model is that of kernels.py for causal problems and key-length bounds: key j is visible to query i
iff j <= i + OFF (causal) and j < Sk. Tensors are [B, S, H, D] with 16-byte aligned strides (TMA); rows and
columns past a tensor's end are zero-filled on load, and the store is masked.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from ..common import softmax
from ..common.gluon_compat import tma_load

LN2 = gl.constexpr(0.6931471805599453)
WG_ROWS = gl.constexpr(64)  # query rows per consumer warpgroup

# the base-2 online softmax step (raw scores, scale inside exp2; rows that saw nothing stay finite)
_online_softmax = gluon.jit(softmax.online_softmax.fn)


@gluon.jit
def _tile(seqlen_q, seqlen_k, off_diag, NUM_SLICES: gl.constexpr, CAUSAL: gl.constexpr,
          REVERSE_M: gl.constexpr):
    """(batch, head, first query row, first output column, key blocks) of this CTA; loader and consumers
    agree on them."""
    ROWS: gl.constexpr = 2 * WG_ROWS
    num_m = gl.cdiv(seqlen_q, ROWS)
    i_m = gl.program_id(0) // NUM_SLICES
    i_c = gl.program_id(0) % NUM_SLICES
    if REVERSE_M:
        i_m = num_m - 1 - i_m
    m0 = i_m * ROWS
    hi = seqlen_k
    if CAUSAL:
        hi = gl.minimum(hi, gl.minimum(m0 + ROWS, seqlen_q) - 1 + off_diag + 1)
    return m0, i_c, gl.maximum(hi, 0)


@gluon.jit
def _v_tile(v_buf, v_ready, j):
    """V of key block j, once loaded, as the [BLOCK_N, DVS] operand of P V."""
    mbarrier.wait(v_ready.index(0), j & 1)
    return v_buf.index(0).reshape([v_buf.shape[2], v_buf.shape[4]])


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_buf, ready, empty, v_ready, v_empty, q_ready, i_b, i_h,
            i_hk, m0, c0, n_blocks, D: gl.constexpr, STAGES: gl.constexpr, Q_RESIDENT: gl.constexpr):
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = k_desc.block_type.shape[3]
    num_k: gl.constexpr = (D + BLOCK_K - 1) // BLOCK_K
    # V of a block is issued before this chunk (after all of them when num_k <= STAGES)
    v_at: gl.constexpr = STAGES if STAGES < num_k else num_k
    nbytes: gl.constexpr = k_desc.block_type.nbytes + (0 if Q_RESIDENT else 2 * q_desc.block_type.nbytes)
    if Q_RESIDENT and n_blocks > 0:  # the whole Q tile once (never left in flight by a CTA with no key block)
        mbarrier.expect(q_ready.index(0), 2 * num_k * q_desc.block_type.nbytes)
        for cq in gl.static_range(num_k):
            for h in gl.static_range(2):
                tma_load(q_desc, [i_b, m0 + h * WG_ROWS, i_h, cq * BLOCK_K], q_ready.index(0),
                                                q_bufs.index(2 * cq + h))
    for b in range(n_blocks):
        n0 = b * BLOCK_N
        for c in range(num_k + 1):
            if c == v_at:
                mbarrier.wait(v_empty.index(0), (b & 1) ^ 1)
                mbarrier.expect(v_ready.index(0), v_desc.block_type.nbytes)
                tma_load(v_desc, [i_b, n0, i_hk, c0], v_ready.index(0), v_buf.index(0))
            if c < num_k:
                it = b * num_k + c
                s = it % STAGES
                mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                if not Q_RESIDENT:
                    for h in gl.static_range(2):
                        tma_load(q_desc, [i_b, m0 + h * WG_ROWS, i_h, c * BLOCK_K],
                                                        ready.index(s), q_bufs.index(2 * s + h))
                tma_load(k_desc, [i_b, n0, i_hk, c * BLOCK_K], ready.index(s),
                                                k_bufs.index(s))


@gluon.jit
def _chunk(q_bufs, k_bufs, s, c, qk, WG: gl.constexpr, FIRST: gl.constexpr, Q_RESIDENT: gl.constexpr):
    """S (+)= Q_c K_c^T of chunk c (in ring buffer s) for this warpgroup's rows, issued asynchronously."""
    BLOCK_N: gl.constexpr = k_bufs.shape[2]  # buffers in the descriptors' [1, rows, 1, cols] block shapes
    BLOCK_K: gl.constexpr = k_bufs.shape[4]
    a = q_bufs.index(2 * (c if Q_RESIDENT else s) + WG).reshape([WG_ROWS, BLOCK_K])
    b = k_bufs.index(s).reshape([BLOCK_N, BLOCK_K]).permute((1, 0))
    return warpgroup_mma(a, b, qk, use_acc=not FIRST, is_async=True)


@gluon.jit
def _mask(qk, b, limit, mask_from, o_n):
    """Scores of key block b with the keys a row may not see at -inf (keys >= limit); blocks wholly below
    mask_from (the smallest limit of the warpgroup's rows) are left as they are."""
    BLOCK_N: gl.constexpr = qk.shape[1]
    if (b + 1) * BLOCK_N > mask_from:
        qk = gl.where((b * BLOCK_N + o_n)[None, :] < limit[:, None], qk, float("-inf"))
    return qk


@gluon.jit
def _block(acc, p_op, m_i, l_i, b, limit, mask_from, o_n, s_zero, q_bufs, k_bufs, v_buf, ready, empty, v_ready,
           v_empty, sm_scale, NUM_K: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr, WITH_PV: gl.constexpr,
           Q_RESIDENT: gl.constexpr):
    """Key block b: its scores over the NUM_K chunks and its softmax; WITH_PV: the P V of block b - 1 (p_op)
    goes to the tensor cores first and is waited on before the first chunk. Returns (acc, P of block b, m, l),
    acc rescaled for block b."""
    o_row: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    it0 = b * NUM_K
    s = it0 % STAGES
    if WITH_PV:
        # waited on before the scores' wgmmas: with the P V's accumulator and the scores' both in flight, ptxas
        # finds too few registers and serializes every wgmma of the kernel (C7512)
        acc = warpgroup_mma(p_op, _v_tile(v_buf, v_ready, b - 1), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        mbarrier.arrive(v_empty.index(0))
    mbarrier.wait(ready.index(s), (it0 // STAGES) & 1)
    qk = _chunk(q_bufs, k_bufs, s, 0, s_zero, WG, True, Q_RESIDENT)
    qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
    for c in range(1, NUM_K):
        it = it0 + c
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        qk = _chunk(q_bufs, k_bufs, s, c, qk, WG, False, Q_RESIDENT)
        qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
        mbarrier.arrive(empty.index((it - 1) % STAGES))
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
    mbarrier.arrive(empty.index((it0 + NUM_K - 1) % STAGES))
    qk = _mask(qk, b, limit, mask_from, o_n)
    p, alpha, m_i, l_i = _online_softmax(qk, m_i, l_i, sm_scale)
    acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return acc, gl.convert_layout(p.to(v_buf.dtype), p_op.type.layout), m_i, l_i


@gluon.jit
def _consumer(q_bufs, k_bufs, v_buf, ready, empty, v_ready, v_empty, q_ready, O, LSE, stride_ob, stride_os, stride_oh,
              stride_lb, stride_lh, i_b, i_h, m0, c0, n_blocks, seqlen_q, seqlen_k, off_diag, sm_scale,
              D: gl.constexpr, DV: gl.constexpr, WG: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              RETURN_LSE: gl.constexpr, Q_RESIDENT: gl.constexpr):
    BLOCK_N: gl.constexpr = k_bufs.shape[2]  # buffers in the descriptors' [1, rows, 1, cols] block shapes
    BLOCK_K: gl.constexpr = k_bufs.shape[4]
    DVS: gl.constexpr = v_buf.shape[4]
    NUM_K: gl.constexpr = (D + BLOCK_K - 1) // BLOCK_K
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DVS, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    r0 = m0 + WG * WG_ROWS
    o_m = r0 + gl.arange(0, WG_ROWS, layout=s_row)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    limit = gl.zeros([WG_ROWS], gl.int32, s_row) + seqlen_k  # keys < limit are visible to the row
    mask_from = seqlen_k  # the smallest limit of these rows
    if CAUSAL:
        limit = gl.minimum(limit, o_m + off_diag + 1)
        mask_from = gl.minimum(mask_from, r0 + off_diag + 1)
    s_zero = gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, layout=s_row)
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=s_row)
    acc = gl.zeros([WG_ROWS, DVS], gl.float32, layout=o_layout)
    p_op = gl.zeros([WG_ROWS, BLOCK_N], v_buf.dtype, layout=p_layout)
    if Q_RESIDENT and n_blocks > 0:
        mbarrier.wait(q_ready.index(0), 0)
    if n_blocks > 0:
        acc, p_op, m_i, l_i = _block(acc, p_op, m_i, l_i, 0, limit, mask_from, o_n, s_zero, q_bufs, k_bufs,
                                     v_buf, ready, empty, v_ready, v_empty, sm_scale, NUM_K, WG, STAGES, False,
                                     Q_RESIDENT)
    for b in range(1, n_blocks):
        acc, p_op, m_i, l_i = _block(acc, p_op, m_i, l_i, b, limit, mask_from, o_n, s_zero, q_bufs, k_bufs,
                                     v_buf, ready, empty, v_ready, v_empty, sm_scale, NUM_K, WG, STAGES, True,
                                     Q_RESIDENT)
    if n_blocks > 0:  # the last block's P V
        acc = warpgroup_mma(p_op, _v_tile(v_buf, v_ready, n_blocks - 1), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))

    # rows that saw no key: l = 0, acc = 0 -> out 0, lse -inf
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    out = acc * gl.convert_layout(1.0 / l_safe, o_row)[:, None]
    om = r0 + gl.arange(0, WG_ROWS, layout=o_row)
    oc = c0 + gl.arange(0, DVS, layout=gl.SliceLayout(0, o_layout))
    o_ptr = O + i_b.to(gl.int64) * stride_ob + i_h.to(gl.int64) * stride_oh + om.to(gl.int64) * stride_os
    gl.store(o_ptr[:, None] + oc[None, :], out.to(O.dtype.element_ty),
             mask=(om < seqlen_q)[:, None] & (oc < DV)[None, :])
    if RETURN_LSE:
        if c0 == 0:
            lse = gl.where(seen, (m_i * sm_scale + gl.log2(l_safe)) * LN2, float("-inf"))
            gl.store(LSE + i_b.to(gl.int64) * stride_lb + i_h.to(gl.int64) * stride_lh + o_m, lse,
                     mask=o_m < seqlen_q)


@gluon.jit
def attn_fwd_large_d_sm90_kernel(
    q_desc, k_desc, v_desc, O, LSE,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    seqlen_q, seqlen_k, num_heads, group_size, sm_scale,
    D: gl.constexpr, DV: gl.constexpr, NUM_SLICES: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    CAUSAL: gl.constexpr, ALIGN_BOTTOM_RIGHT: gl.constexpr, RETURN_LSE: gl.constexpr, REVERSE_M: gl.constexpr,
    Q_RESIDENT: gl.constexpr,
):
    """Grid: (cdiv(Sq, 128) * NUM_SLICES, B * Hq); num_warps = 4 (the first consumer).

    Descriptors over [B, S, H, D] tensors: q with block [1, 64, 1, BLOCK_K], k with [1, BLOCK_N, 1, BLOCK_K],
    v with [1, BLOCK_N, 1, DVS]. O [B, Sq, Hq, Dv] (the slices cover Dv: NUM_SLICES * DVS >= Dv); LSE
    [B, Hq, Sq] float32, natural log, written by the first slice when RETURN_LSE. sm_scale: scale * log2 e.
    """
    i_bh = gl.program_id(1)
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    i_hk = i_h // group_size
    off_diag = 0
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    m0, i_c, hi = _tile(seqlen_q, seqlen_k, off_diag, NUM_SLICES, CAUSAL, REVERSE_M)
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    DVS: gl.constexpr = v_desc.block_type.shape[3]
    n_blocks = gl.cdiv(hi, BLOCK_N)
    c0 = i_c * DVS

    NUM_K: gl.constexpr = (D + q_desc.block_type.shape[3] - 1) // q_desc.block_type.shape[3]
    Q_BUFS: gl.constexpr = 2 * NUM_K if Q_RESIDENT else 2 * STAGES
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [Q_BUFS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_buf = gl.allocate_shared_memory(v_desc.dtype, [1] + v_desc.block_type.shape, v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    mbarrier.init(v_ready.index(0), count=1)
    mbarrier.init(v_empty.index(0), count=2)
    mbarrier.init(q_ready.index(0), count=1)

    gl.warp_specialize([
        (_consumer, (q_bufs, k_bufs, v_buf, ready, empty, v_ready, v_empty, q_ready, O, LSE, stride_ob, stride_os,
                     stride_oh, stride_lb, stride_lh, i_b, i_h, m0, c0, n_blocks, seqlen_q, seqlen_k, off_diag,
                     sm_scale, D, DV, 0, STAGES, CAUSAL, RETURN_LSE, Q_RESIDENT)),
        (_consumer, (q_bufs, k_bufs, v_buf, ready, empty, v_ready, v_empty, q_ready, O, LSE, stride_ob, stride_os,
                     stride_oh, stride_lb, stride_lh, i_b, i_h, m0, c0, n_blocks, seqlen_q, seqlen_k, off_diag,
                     sm_scale, D, DV, 1, STAGES, CAUSAL, RETURN_LSE, Q_RESIDENT)),
        (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_buf, ready, empty, v_ready, v_empty, q_ready, i_b, i_h,
                   i_hk, m0, c0, n_blocks, D, STAGES, Q_RESIDENT)),
    ], [4, 1], [CONSUMER_REGS, 24])
