"""Hopper (sm90) MLA decode split kernel, "seesaw" pair schedule: 64-token blocks, each block's scores computed once
by one warpgroup, the output split by columns, the blocks taken in pairs so that neither warpgroup's softmax waits
for the other's (MLASm90Config(block_n=64, stages=2, seesaw=True): configs.SM90_PAIR, first for 16-bit caches).

Work items, tiles, the persistent grid and the masking are those of gluon_sm90.py; the exchange of P and of the
row statistics is QK_SHARD's (gluon_sm90_shard.py: read both docstrings first). What differs:
  - blocks of 64 tokens, block i of a tile owned by warpgroup i % 2. The owner computes the block's full
    576-deep S with N = 64 wgmmas (the nope halves of Q from shared memory, its rope part from registers); no score
    is computed twice.
  - warpgroup 0 accumulates O[:, :DC / 2], warpgroup 1 O[:, DC / 2:]; each adds P V of every block for its half,
    its own P from registers, the other's from shared memory.
  - a ring of 2 blocks (Q nope 64 KB + 2 x 72 KB + 16 KB of P fill 227 KB). Each block lands in 9 boxes of 64
    columns (8 of ckv, then kpe), each on its own ready barrier (gluon_sm90_boxes.py), and frees in two halves
    with their own empty barriers: the left (ckv columns :DC / 2, read by warpgroup 0's P V) and the right (the
    other ckv columns and kpe, read by warpgroup 1's P V).
  - a turn (_pair) is a pair of blocks (2k, 2k + 1), owned by warpgroups 0 and 1. Both issue the scores of their
    own block at once, box by box (each box's 4 wgmmas after its own ready wait, the own half first). Each masks
    its scores, publishes their row maxima (`mx_bufs` / `mx_ready`) and with the other's computes the pair's max
    m = max(m_old, max(rowmax S_2k, rowmax S_2k+1)) (the same operands in the same order in both: bit-identical),
    its own P = exp2(scale (S - m)) and alpha = exp2(scale (m_old - m)). It rescales O by alpha (once per pair),
    issues the own P V at once, publishes P and its row sums (`x_bufs`, `r_bufs`, p_ready / p_free), takes the
    other's and issues that P V on its half of the other's block: both P are relative to the same max, so the
    other's needs no rescale. l = (l_old alpha + rowsum P_2k) + rowsum P_2k+1 in both (block order:
    bit-identical), so out = acc / l needs no exchange at the end.
  - a half frees as soon as the last P V reading it is waited on: the own half of the own block after the own P V
    (its wait leaves the other's P V in flight), the own half of the other's block after that one. The loader
    takes a pair's halves in the order they free: the two owners' halves, then the others
    (gluon_producer._load_pairs).
  - a tile of an odd block count ends on a lone block of warpgroup 0's (_lone): nothing to exchange first; its
    owner publishes P, m and the row sums (_publish), warpgroup 1 takes them (_gather).
  - rows of the cache past the sequence (only a tile's last block reaches them) are masked in the scores, and the
    owner of that block zeroes them in both halves of V after its scores, before its own P V and the publish that
    the other's P V waits for (no one else reads the block then). That branch lives in the peeled last pair and
    the lone block, so the step loop has none.
  - the row maxima have their own buffers (512 B), not the lone block's m_bufs: that would be safe only through
    the loader's order (scripts/check_mla_seesaw.py's note). mx_bufs[w] is rewritten at the next pair, which
    warpgroup w reaches only after it took the other's P of this pair, published after the other read the maxima:
    no barrier frees them.
Earlier turn orders (block by block, each warpgroup's softmax waiting for the other's: MLASm90Config.seesaw_order
0-2) measured slower: the best of them, order 2, took 1.06-1.24x this schedule's time on the H200 and trailed
QK_SHARD but for a tie. Their code is on branches mla-seesaw / mla-seesaw-box, the figures in docs/design/mla.md
item 3.
Phases: c0 / c1 count the blocks warpgroup 0 / 1 owned in earlier tiles, as in QK_SHARD; block g (the CTA's count)
is in slot g % 2 with parity (g // 2) & 1. A pair's blocks are the k-th own block of each warpgroup in the tile
(p_ready / p_free phases c_own + k and c_other + k); mx_ready completes once per full pair: c1 + k (c1 also
counts the full pairs of earlier tiles, n // 2 per tile). Barrier protocol: scripts/check_mla_seesaw.py (a model
of this file: 0 deadlocks, aliasing or races over tiles of 0-6 blocks, several per CTA).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common.gluon_compat import thread_barrier
from .gluon_producer import _buf, _loader, _work_item
from .gluon_sm90 import _epilogue, _visible, _zero_tail
from .gluon_sm90_boxes import _other_block, _pv, _ready_barriers, _scores_boxed, _wait_boxes
from .gluon_sm90_shard import _publish, _release


@gluon.jit
def _pair(acc, m_i, l_i, k, kv, c0, c1, start, seqlen, limit, qp_op, s_zero, qn_bufs, c_bufs, p_bufs,
          x_bufs, r_bufs, mx_bufs, ready, empty, p_ready, p_free, mx_ready, sm_scale, WG: gl.constexpr,
          TAIL: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """Pair k of the tile (blocks 2k and 2k + 1, both present) as seen by warpgroup WG: its own block o = 2k + WG,
    the other's o ^ 1. c0 / c1: the blocks warpgroup 0 / 1 owned in earlier tiles (c1: also the full pairs of
    earlier tiles, mx_ready's count). TAIL: the pair may hold the tile's last block (the step loop's pairs do
    not)."""
    OTHER: gl.constexpr = 1 - WG
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    H: gl.constexpr = c_bufs.shape[3] // 64 if c_bufs.shape[3] > 64 else 1
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    c_own = c0 if WG == 0 else c1  # (WG constexpr: chosen at compile time)
    c_other = c1 if WG == 0 else c0
    o = 2 * k + WG
    g = kv + o
    s = g % 2
    go = g - WG + OTHER  # the other's block, in the other slot
    n0 = start + o * BLOCK_N
    z = k >> 30  # (0, from the loop counter: _scores_boxed's qz, and the buffer indices below)
    qk = _scores_boxed(qn_bufs, qp_op, c_bufs, p_bufs, ready, g, s_zero, z, WG)
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
    if TAIL:  # (only a tile's last block can cross the sequence's end)
        if n0 + BLOCK_N > seqlen:  # its owner zeroes V's rows past the end in both halves, before its own P V and
            # the publish that the other's P V waits for (no one else reads the block then)
            _zero_tail(_buf(c_bufs, 2 * s), n0, seqlen)
            _zero_tail(_buf(c_bufs, 2 * s + 1), n0, seqlen)
    # the pair's row maxima: publish this block's, take the other's
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    qk = gl.where((n0 + o_n)[None, :] < limit[:, None], qk, float("-inf"))
    mx = gl.max(qk, 1)
    mx_bufs.index(WG + z).store(mx)
    thread_barrier()  # every thread's stores before the (single-thread) arrive
    mbarrier.arrive(mx_ready.index(WG))
    mbarrier.wait(mx_ready.index(OTHER), (c1 + k) & 1)
    mx_other = mx_bufs.index(OTHER + z).load(s_row)
    if WG == 0:  # (operands in block order: both warpgroups compute the same bits)
        m_new = gl.maximum(m_i, gl.maximum(mx, mx_other))
    else:
        m_new = gl.maximum(m_i, gl.maximum(mx_other, mx))
    shift = gl.where(m_new == float("-inf"), 0.0, m_new) * sm_scale
    p = gl.exp2(qk * sm_scale - shift[:, None])
    alpha = gl.exp2(m_i * sm_scale - shift)
    rs = gl.sum(p, 1)
    p16 = p.to(x_bufs.dtype)
    # the own P V at once (O rescaled once for the pair), then the publish of P and its row sums
    acc = _pv(acc, alpha, gl.convert_layout(p16, p_layout), _buf(c_bufs, 2 * s + WG), o_row)
    mbarrier.wait(p_free.index(WG), ((c_own + k) & 1) ^ 1)
    x_bufs.index(WG + z).store(p16)
    r_bufs.index(WG + z).store(rs)
    fence_async_shared()  # P is read by the other warpgroup's wgmma
    thread_barrier()
    mbarrier.arrive(p_ready.index(WG))
    # the other's P V on this warpgroup's half of its block (relative to the same max: no rescale)
    _wait_boxes(ready, go, WG * H, WG * H + H)
    mbarrier.wait(p_ready.index(OTHER), (c_other + k) & 1)
    rs_other = r_bufs.index(OTHER + z).load(s_row)
    acc = warpgroup_mma(x_bufs.index(OTHER), _buf(c_bufs, 2 * (go % 2) + WG), acc, is_async=True)
    if WG == 0:
        l_i = l_i * alpha + rs + rs_other
    else:
        l_i = l_i * alpha + rs_other + rs
    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))  # the own P V: its half of o frees
    mbarrier.arrive(empty.index(2 * s + WG))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _release(p_free.index(OTHER))
    mbarrier.arrive(empty.index(2 * (go % 2) + WG))
    return acc, m_new, l_i


@gluon.jit
def _lone(acc, m_i, l_i, k, kv, c0, start, seqlen, limit, qp_op, s_zero, qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs,
          r_bufs, ready, empty, p_ready, p_free, sm_scale, WG: gl.constexpr, s_layout: gl.constexpr,
          o_layout: gl.constexpr, p_layout: gl.constexpr):
    """The tile's lone last block 2k (an odd block count; warpgroup 0's): its owner publishes P, m and the row
    sums (_publish), warpgroup 1 takes them (_gather) and adds that P V on its half (_other_block)."""
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    g = kv + 2 * k
    s = g % 2
    if WG == 0:
        n0 = start + 2 * k * BLOCK_N
        qk = _scores_boxed(qn_bufs, qp_op, c_bufs, p_bufs, ready, g, s_zero, 0, 0)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        if n0 + BLOCK_N > seqlen:
            _zero_tail(_buf(c_bufs, 2 * s), n0, seqlen)
            _zero_tail(_buf(c_bufs, 2 * s + 1), n0, seqlen)
        p16, alpha, m_i, l_i = _publish(qk, m_i, l_i, n0, limit, sm_scale, x_bufs.index(0), m_bufs.index(0),
                                        r_bufs.index(0), p_free.index(0), ((c0 + k) & 1) ^ 1, p_ready.index(0),
                                        s_layout)
        acc = _pv(acc, alpha, gl.convert_layout(p16, p_layout), _buf(c_bufs, 2 * s), o_row)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index(2 * s))
    else:
        acc, m_i, l_i = _other_block(acc, m_i, l_i, g, (c0 + k) & 1, x_bufs, m_bufs, r_bufs, c_bufs, ready,
                                     p_ready, sm_scale, 1, s_row, o_row)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        _release(p_free.index(0))
        mbarrier.arrive(empty.index(2 * s + 1))
    return acc, m_i, l_i


@gluon.jit
def _consumer(qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, mx_bufs, q_ready, q_empty, ready, empty, p_ready,
              p_free, mx_ready, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob,
              stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks, sm_scale,
              WG: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr):
    """Consumer warpgroup WG: the tile's full pairs (_pair; the last peeled, TAIL), then a
    lone last block (_lone)."""
    BLOCK_M: gl.constexpr = qn_bufs.shape[2]
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    DH: gl.constexpr = c_bufs.shape[3]
    DR: gl.constexpr = p_bufs.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = q_len * num_heads
    kv_scale = gl.load(KVS)
    sm_scale = sm_scale * kv_scale
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    kv = 0  # blocks consumed so far (the loader's count): ring slot and phase
    j = 0  # tiles done so far: phase of the Q slot
    c0 = 0  # blocks owned by warpgroup 0 / 1 in earlier tiles: phases of p_ready and p_free (c1: full pairs too)
    c1 = 0
    for r in range(gl.cdiv(num_tiles, gl.num_programs(0))):
        b, i_r, start, end, out_slot = _work_item(r, row_blocks, num_tiles, WORK)
        if b >= 0:
            seqlen = gl.load(SEQLENS + b)
            n_blocks = gl.cdiv(end - start, BLOCK_N)
            n_pairs = n_blocks // 2
            r0 = i_r * BLOCK_M
            limit, _ = _visible(seqlen, end, r0, q_len, num_heads, BLOCK_M, CAUSAL, s_row)
            qm = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
            qc = gl.arange(0, DR, layout=gl.SliceLayout(0, q_layout))
            qp_op = gl.load(QP + b.to(gl.int64) * stride_qpb + (qm.to(gl.int64) * stride_qpr)[:, None] + qc[None, :],
                            mask=(qm < rows)[:, None], other=0.0)
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=s_row)
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_row)
            acc = gl.zeros([BLOCK_M, DH], gl.float32, layout=o_layout)
            mbarrier.wait(q_ready.index(0), j & 1)
            for k in range(0, n_pairs - 1):
                acc, m_i, l_i = _pair(acc, m_i, l_i, k, kv, c0, c1, start, seqlen, limit, qp_op, s_zero,
                                      qn_bufs, c_bufs, p_bufs, x_bufs, r_bufs, mx_bufs, ready, empty, p_ready,
                                      p_free, mx_ready, sm_scale, WG, False, s_layout, o_layout, p_layout)
            if n_pairs > 0:
                acc, m_i, l_i = _pair(acc, m_i, l_i, n_pairs - 1, kv, c0, c1, start, seqlen, limit, qp_op,
                                      s_zero, qn_bufs, c_bufs, p_bufs, x_bufs, r_bufs, mx_bufs, ready, empty,
                                      p_ready, p_free, mx_ready, sm_scale, WG, True, s_layout, o_layout, p_layout)
            if WG == 1:
                mbarrier.arrive(q_empty.index(0))  # every score wgmma of this warpgroup's was waited on
            if n_blocks % 2 == 1:
                acc, m_i, l_i = _lone(acc, m_i, l_i, n_pairs, kv, c0, start, seqlen, limit, qp_op, s_zero, qn_bufs,
                                      c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, ready, empty, p_ready, p_free,
                                      sm_scale, WG, s_layout, o_layout, p_layout)
            if WG == 0:
                mbarrier.arrive(q_empty.index(0))
            _epilogue(acc, m_i, l_i, kv_scale, sm_scale, b, r0, out_slot, O, LSE, OP, LSEP, stride_ob, stride_os,
                      stride_oh, stride_lb, stride_lh, num_heads, rows, WG, RETURN_LSE, o_layout)
            j += 1
            kv += n_blocks
            c0 += (n_blocks + 1) // 2
            c1 += n_pairs


@gluon.jit
def mla_split_sm90_seesaw_kernel(
    qn_desc, ckv_desc, kpe_desc, QP, BT, SEQLENS, WORK, O, LSE, OP, LSEP, KVS,
    stride_qpb, stride_qpr, stride_bt, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, q_len, num_pages, num_tiles, row_blocks, sm_scale,
    PAGE: gl.constexpr, CONSUMER_REGS: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
):
    """Grid: (programs,), up to num_tiles = row_blocks * work items; num_warps = 4 (the first consumer).
    Arguments as gluon_sm90_shard.mla_split_sm90_shard_kernel's (16-bit caches only; kpe boxes of 64 tokens), but
    ckv_desc's box is one 64-column box of a half (min(64, Dc / 2) columns: the 128-byte swizzle's width), each
    with its own ready barrier."""
    BLOCK_M: gl.constexpr = qn_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[1]
    DH: gl.constexpr = qn_desc.block_type.shape[2]
    gl.static_assert(BLOCK_N == 64, "the seesaw kernel takes 64-token blocks")
    gl.static_assert(ckv_desc.block_type.shape[2] == (64 if DH > 64 else DH), "ckv boxes of min(64, Dc / 2) columns")
    # the Q slot (nope halves), 2 blocks (ckv halves + kpe), the two P tiles and their row statistics
    qn_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2] + qn_desc.block_type.shape, qn_desc.layout)
    c_bufs = gl.allocate_shared_memory(ckv_desc.dtype, [4, 1, BLOCK_N, DH], ckv_desc.layout)
    p_bufs = gl.allocate_shared_memory(kpe_desc.dtype, [2] + kpe_desc.block_type.shape, kpe_desc.layout)
    x_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    x_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2, BLOCK_M, BLOCK_N], x_layout)
    st_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    m_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], st_layout)
    r_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], st_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    # ready: box c of slot s at ready[c].index(s) (ckv's in column order, then kpe); empty: per half of slot s, 2s
    # the left (ckv columns :DC / 2), 2s + 1 the right half and kpe
    ready = _ready_barriers()
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=1)
    mbarrier.init(q_empty.index(0), count=2)
    for i in gl.static_range(4):
        mbarrier.init(empty.index(i), count=1)  # one warpgroup's P V reads each half
    for w in gl.static_range(2):
        mbarrier.init(p_ready.index(w), count=1)
        mbarrier.init(p_free.index(w), count=1)
    # the pair's row maxima and their barriers
    mx_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], st_layout)
    mx_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(mx_ready.index(w), count=1)

    gl.warp_specialize([
        (_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, mx_bufs, q_ready, q_empty, ready, empty,
                     p_ready, p_free, mx_ready, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr,
                     stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks,
                     sm_scale, 0, CAUSAL, RETURN_LSE)),
        (_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, mx_bufs, q_ready, q_empty, ready, empty,
                     p_ready, p_free, mx_ready, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr,
                     stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks,
                     sm_scale, 1, CAUSAL, RETURN_LSE)),
        (_loader, (qn_desc, qn_desc, ckv_desc, kpe_desc, qn_bufs, qn_bufs, c_bufs, p_bufs, q_ready, q_empty,
                   ready, empty, WORK, BT, stride_bt, num_pages, num_tiles, row_blocks, PAGE, 2, False, True)),
    ], [4, 1], [CONSUMER_REGS, 24])
