"""Hopper (sm90) MLA decode split kernel, "seesaw" schedule: 64-token blocks, each block's scores computed once by
one warpgroup, the output split by columns (MLASm90Config(block_n=64, stages=2, seesaw=True); the table takes its
pair schedule, seesaw_order 3: gluon_sm90_pair.py).

Work items, tiles, the persistent grid and the masking are those of gluon_sm90.py; the exchange of P and of the
row statistics is QK_SHARD's (gluon_sm90_shard.py: read both docstrings first). What differs:
  - blocks of 64 tokens, block i of a tile owned by warpgroup i % 2. The owner computes the block's full
    576-deep S with N = 64 wgmmas (the nope halves of Q from shared memory, its rope part from registers); no score
    is computed twice. Its softmax starts from the running max, which includes the other warpgroup's block i - 1
    (gathered first), so both warpgroups keep bit-identical m and l and out = acc / l needs no exchange.
  - warpgroup 0 accumulates O[:, :DC / 2], warpgroup 1 O[:, DC / 2:]; each adds P V of every block for its half,
    its own P from registers, the other's from shared memory.
  - a ring of 2 blocks (Q nope 64 KB + 2 x 72 KB + 16 KB of P fill 227 KB). Each block lands in 9 boxes of 64
    columns (8 of ckv, then kpe), each on its own ready barrier, and frees in two halves with their own empty
    barriers: the left (ckv columns :DC / 2, read by warpgroup 0's P V) and the right (the other ckv columns and
    kpe, read by warpgroup 1's P V). A warpgroup frees its half once its P V of the block is waited on; the owner's
    scores read both halves, but they end before it publishes P, which the other's P V waits for, so one arrive
    per half suffices. The loader refills a half as soon as it frees, the owner's half of a block first.
  - a warpgroup's turn at its block o (seesaw_order 2, the default; _turn has the earlier forms): gather the
    other's block o - 1 (P, m, row sums) and issue that P V (its data is in: it fills the tensor pipe while o
    lands); issue the scores of o box by box, each box's 4 wgmmas after its own ready wait, its own half first
    (freed at the end of its turn before, so loaded first); wait for both, free the other's P and this
    warpgroup's half of o - 1; softmax, publish P of o; issue and wait the own P V of o, free the half. A wgmma
    result may not cross a loop iteration in flight, and the next own block reuses the slot of o (2 slots), so
    the own P V of o ends within the turn; the other warpgroup's scores and P V fill the tensor pipe meanwhile.
  - rows of the cache past the sequence (only a tile's last block reaches them) are masked in the scores, and the
    owner of that block zeroes them in both halves of V after its scores, before its publish (no one else reads
    the block then). That branch lives in the peeled last turn, so the step loop has none.
  - seesaw_order 3, the pair schedule: other consumers (gluon_sm90_pair.py), the same ring, buffers and loader
    (which takes a pair's halves in the order they free), plus the pair's row maxima and their barriers.
Barrier protocol: scripts/check_mla_seesaw.py (a model of this file: 0 deadlocks, aliasing or races over tiles of
0-6 blocks, several per CTA). Phases: c0 / c1 count the blocks warpgroup 0 / 1 owned in earlier tiles, as in
QK_SHARD; block g (the CTA's count) is in slot g % 2 with parity (g // 2) & 1.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait

from .gluon_producer import _buf, _loader, _work_item
from .gluon_sm90 import _epilogue, _visible, _zero_tail
from .gluon_sm90_boxes import _other_block, _pv, _ready_barriers, _scores_boxed
from .gluon_sm90_pair import _pair_consumer
from .gluon_sm90_shard import _publish, _release


@gluon.jit
def _turn(acc, m_i, l_i, k, kv, c_own, c_other, start, seqlen, limit, qp_op, s_zero, qn_bufs, c_bufs, p_bufs,
          x_bufs, m_bufs, r_bufs, ready, empty, p_ready, p_free, sm_scale, WG: gl.constexpr, HAS_OTHER: gl.constexpr,
          TAIL: gl.constexpr, ORDER: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
          p_layout: gl.constexpr):
    """This warpgroup's k-th block of the tile (o = 2k + WG) and, HAS_OTHER, the other's block o - 1 in it.
    TAIL: o may be the tile's last block (the turns of the step loop are not: it has no branch on the tail, whose
    registers cost 1-3 local-memory accesses per turn there under triton 3.6). ORDER (MLASm90Config.seesaw_order):
    0 / 1 the scores of o first, then the other's P V of o - 1 under them, waiting for o whole / box by box;
    2 the other's P V of o - 1 first (its data is in: it fills the tensor pipe while o's boxes land), then the
    scores box by box, its own half first (freed a turn before, when the other frees its half only after its next
    scores: that one lands last), and the other's half of o - 1 freed before the softmax."""
    OTHER: gl.constexpr = 1 - WG
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    o = 2 * k + WG
    g = kv + o
    s = g % 2
    n0 = start + o * BLOCK_N
    z = k >> 30  # (0: _scores_boxed's qz)
    if ORDER == 2:
        if HAS_OTHER:
            acc, m_i, l_i = _other_block(acc, m_i, l_i, g - 1, (c_other + k - 1 + WG) & 1,
                                         x_bufs, m_bufs, r_bufs, c_bufs, ready, p_ready, sm_scale, WG, s_row, o_row)
        qk = _scores_boxed(qn_bufs, qp_op, c_bufs, p_bufs, ready, g, s_zero, z, WG, True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        if HAS_OTHER:  # (done: the scores were issued after it)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            _release(p_free.index(OTHER))
            mbarrier.arrive(empty.index(2 * ((g - 1) % 2) + WG))
    else:
        qk = _scores_boxed(qn_bufs, qp_op, c_bufs, p_bufs, ready, g, s_zero, z, 0, ORDER == 1)
        if HAS_OTHER:  # under the scores
            acc, m_i, l_i = _other_block(acc, m_i, l_i, g - 1, (c_other + k - 1 + WG) & 1,
                                         x_bufs, m_bufs, r_bufs, c_bufs, ready, p_ready, sm_scale, WG, s_row, o_row)
            qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
        else:
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
    if TAIL:  # (only a tile's last block can cross the sequence's end)
        if n0 + BLOCK_N > seqlen:  # its owner zeroes V's rows past the end in both halves (0 * NaN would poison
            # the accumulators), after its scores and before the publish that the other's P V of o waits for
            _zero_tail(_buf(c_bufs, 2 * s), n0, seqlen)
            _zero_tail(_buf(c_bufs, 2 * s + 1), n0, seqlen)
    # the softmax of o (under the other's P V), from the max that includes o - 1
    # (buffer WG + z = WG: its store addresses computed here, not hoisted out of the loop and spilled)
    p16, alpha, m_i, l_i = _publish(qk, m_i, l_i, n0, limit, sm_scale, x_bufs.index(WG + z), m_bufs.index(WG + z),
                                    r_bufs.index(WG + z), p_free.index(WG), ((c_own + k) & 1) ^ 1, p_ready.index(WG),
                                    s_layout)
    if HAS_OTHER and ORDER != 2:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        _release(p_free.index(OTHER))
        mbarrier.arrive(empty.index(2 * ((g - 1) % 2) + WG))
    acc = _pv(acc, alpha, gl.convert_layout(p16, p_layout), _buf(c_bufs, 2 * s + WG), o_row)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    mbarrier.arrive(empty.index(2 * s + WG))
    return acc, m_i, l_i


@gluon.jit
def _consumer(qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, q_ready, q_empty, ready, empty, p_ready, p_free,
              WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob, stride_os, stride_oh,
              stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks, sm_scale,
              WG: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr, ORDER: gl.constexpr):
    BLOCK_M: gl.constexpr = qn_bufs.shape[2]
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    DH: gl.constexpr = c_bufs.shape[3]
    DR: gl.constexpr = p_bufs.shape[3]
    OTHER: gl.constexpr = 1 - WG
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    q_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    rows = q_len * num_heads
    kv_scale = gl.load(KVS)
    sm_scale = sm_scale * kv_scale
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    kv = 0  # blocks consumed so far (the loader's count): ring slot and phase
    j = 0  # tiles done so far: phase of the Q slot
    c0 = 0  # blocks owned by warpgroup 0 / 1 in earlier tiles: phases of p_ready and p_free
    c1 = 0
    for r in range(gl.cdiv(num_tiles, gl.num_programs(0))):
        b, i_r, start, end, out_slot = _work_item(r, row_blocks, num_tiles, WORK)
        if b >= 0:
            seqlen = gl.load(SEQLENS + b)
            n_blocks = gl.cdiv(end - start, BLOCK_N)
            r0 = i_r * BLOCK_M
            limit, _ = _visible(seqlen, end, r0, q_len, num_heads, BLOCK_M, CAUSAL, s_row)
            qm = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
            qc = gl.arange(0, DR, layout=gl.SliceLayout(0, q_layout))
            qp_op = gl.load(QP + b.to(gl.int64) * stride_qpb + (qm.to(gl.int64) * stride_qpr)[:, None] + qc[None, :],
                            mask=(qm < rows)[:, None], other=0.0)
            if WG == 0:
                c_own = c0
                c_other = c1
            else:
                c_own = c1
                c_other = c0
            n_own = (n_blocks + 1 - WG) // 2
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=s_row)
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_row)
            acc = gl.zeros([BLOCK_M, DH], gl.float32, layout=o_layout)
            mbarrier.wait(q_ready.index(0), j & 1)
            if WG == 0:  # block 0: nothing of the other's before it
                if n_own > 0:
                    acc, m_i, l_i = _turn(acc, m_i, l_i, 0, kv, c_own, c_other, start, seqlen, limit, qp_op, s_zero,
                                          qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, ready, empty, p_ready,
                                          p_free, sm_scale, WG, False, True, ORDER, s_layout, o_layout, p_layout)
            for k in range(1 - WG, n_own - 1):  # blocks before the tile's last two
                acc, m_i, l_i = _turn(acc, m_i, l_i, k, kv, c_own, c_other, start, seqlen, limit, qp_op, s_zero,
                                      qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, ready, empty, p_ready, p_free,
                                      sm_scale, WG, True, False, ORDER, s_layout, o_layout, p_layout)
            if n_own - 1 >= 1 - WG:  # the last own block (the tile's last, or the one before it)
                acc, m_i, l_i = _turn(acc, m_i, l_i, n_own - 1, kv, c_own, c_other, start, seqlen, limit, qp_op,
                                      s_zero, qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, ready, empty, p_ready,
                                      p_free, sm_scale, WG, True, True, ORDER, s_layout, o_layout, p_layout)
            mbarrier.arrive(q_empty.index(0))  # every score wgmma of this warpgroup's was waited on
            last = n_blocks - 1
            if (n_blocks > 0) & (last % 2 == OTHER):  # the tile ends on the other's block
                g = kv + last
                acc, m_i, l_i = _other_block(acc, m_i, l_i, g, (c_other + (last - OTHER) // 2) & 1, x_bufs, m_bufs,
                                             r_bufs, c_bufs, ready, p_ready, sm_scale, WG, s_row, o_row)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                _release(p_free.index(OTHER))
                mbarrier.arrive(empty.index(2 * (g % 2) + WG))
            _epilogue(acc, m_i, l_i, kv_scale, sm_scale, b, r0, out_slot, O, LSE, OP, LSEP, stride_ob, stride_os,
                      stride_oh, stride_lb, stride_lh, num_heads, rows, WG, RETURN_LSE, o_layout)
            j += 1
            kv += n_blocks
            c0 += (n_blocks + 1) // 2
            c1 += n_blocks // 2


@gluon.jit
def mla_split_sm90_seesaw_kernel(
    qn_desc, ckv_desc, kpe_desc, QP, BT, SEQLENS, WORK, O, LSE, OP, LSEP, KVS,
    stride_qpb, stride_qpr, stride_bt, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, q_len, num_pages, num_tiles, row_blocks, sm_scale,
    PAGE: gl.constexpr, CONSUMER_REGS: gl.constexpr, CAUSAL: gl.constexpr, RETURN_LSE: gl.constexpr,
    ORDER: gl.constexpr = 2,
):
    """Grid: (programs,), up to num_tiles = row_blocks * work items; num_warps = 4 (the first consumer).
    Arguments as gluon_sm90_shard.mla_split_sm90_shard_kernel's (16-bit caches only; kpe boxes of 64 tokens), but
    ckv_desc's box is one 64-column box of a half (min(64, Dc / 2) columns: the 128-byte swizzle's width), each
    with its own ready barrier. ORDER: MLASm90Config.seesaw_order (0-2: _turn; 3: the pair schedule,
    gluon_sm90_pair.py)."""
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

    if ORDER == 3:  # the pair schedule (gluon_sm90_pair.py): the pair's row maxima have their own buffers
        mx_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], st_layout)
        mx_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for w in gl.static_range(2):
            mbarrier.init(mx_ready.index(w), count=1)
        gl.warp_specialize([
            (_pair_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, mx_bufs, q_ready, q_empty, ready,
                              empty, p_ready, p_free, mx_ready, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb,
                              stride_qpr, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len,
                              num_tiles, row_blocks, sm_scale, 0, CAUSAL, RETURN_LSE)),
            (_pair_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, mx_bufs, q_ready, q_empty, ready,
                              empty, p_ready, p_free, mx_ready, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb,
                              stride_qpr, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len,
                              num_tiles, row_blocks, sm_scale, 1, CAUSAL, RETURN_LSE)),
            (_loader, (qn_desc, qn_desc, ckv_desc, kpe_desc, qn_bufs, qn_bufs, c_bufs, p_bufs, q_ready, q_empty,
                       ready, empty, WORK, BT, stride_bt, num_pages, num_tiles, row_blocks, PAGE, 2, False, 3)),
        ], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, q_ready, q_empty, ready, empty, p_ready,
                         p_free, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob,
                         stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks,
                         sm_scale, 0, CAUSAL, RETURN_LSE, ORDER)),
            (_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, q_ready, q_empty, ready, empty, p_ready,
                         p_free, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob,
                         stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks,
                         sm_scale, 1, CAUSAL, RETURN_LSE, ORDER)),
            (_loader, (qn_desc, qn_desc, ckv_desc, kpe_desc, qn_bufs, qn_bufs, c_bufs, p_bufs, q_ready, q_empty,
                       ready, empty, WORK, BT, stride_bt, num_pages, num_tiles, row_blocks, PAGE, 2, False,
                       1 + (ORDER == 2))),
        ], [4, 1], [CONSUMER_REGS, 24])
