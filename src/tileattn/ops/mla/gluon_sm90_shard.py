"""Hopper (sm90) MLA decode split kernel with QK_SHARD: the two consumer warpgroups take turns computing a cache
step's scores and share the probabilities through shared memory.

Work items, tiles, the persistent grid, the loader and the masking model are those of gluon_sm90.py (read its
docstring first). What differs is who computes the scores. There, both warpgroups compute every step's
S = Q K^T, so the 576-deep product is done twice: 1.5x the FLOPs of 2 * rows * tokens * (576 + 512), which
makes the kernel compute-bound from 64 query rows up. Here (FlashMLA's alternation of KV blocks; FlashInfer
calls the switch QK_SHARD):
  - step i of a tile (BLOCK_N tokens, 32 in the table) is owned by warpgroup i % 2. The owner computes S_i, the
    running max m_i = max(m_{i-1}, rowmax S_i), P_i = exp2(scale * (S_i - m_i)) and its row sums, and publishes
    m_i, the row sums and P_i (16-bit) in shared memory (`p_ready[owner]`).
  - both warpgroups add P_i V_i for their own DC / 2 output columns: the owner with P from registers, the other
    with P from shared memory. The other takes m_i and the row sums from shared memory too, so both keep
    bit-identical m and l (out = acc / l needs no exchange at the end). It arrives on `p_free[owner]` once its
    product has read P_i; the owner waits for that before it writes P_{i+2}.
  - a warpgroup's turn at its step i: issue P_{i-2} V_{i-2} (its previous step's) and the scores S_i; take the
    other's step i - 1 and issue P_{i-1} V_{i-1} once the first product is done; then the softmax of S_i under
    that product, and publish. The warpgroups run a step apart, so one's softmax overlaps the other's wgmma.
    (A wgmma result may not cross a loop iteration in flight, hence P_i V_i waits for the next turn.)
  - a ring slot is freed once both warpgroups' products read it; step i's slot is that of step i - STAGES, and a
    warpgroup issues P_{i-2} V_{i-2} only at its turn for step i: so STAGES >= 3 (the table's 4 x 32 tokens).
Every step applies the mask (a select on 64 x BLOCK_N scores per warpgroup: cheap next to the 576-deep product).
The rope part of Q (64 x DR) lives in registers, the A operand of the scores' last wgmma: the shared memory it
frees holds the two P tiles (at DC = 512, DR = 64, 32-token steps: Q 64 KB + four 36 KB steps + 8 KB of P).

Barrier phases: `c0` / `c1` count the steps warpgroup 0 / 1 owned in earlier tiles (ceil(n / 2) / floor(n / 2)
of a tile of n steps); the j-th step a warpgroup owns completes phase j of its p_ready and, once consumed, of
its p_free. An owner waits for p_free before it publishes, so neither barrier can run two phases ahead of its
waiter.
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
from .gluon_producer import _buf, _fp8_rings, _loader, _widen_arrive, _widen_step, _work_item
from .gluon_sm90 import _epilogue, _visible, _zero_tail


@gluon.jit
def _scores(qn_bufs, qp_op, c_bufs, p_bufs, s, zero, qz=0):
    """S = Q K^T of ring buffer s, issued asynchronously: the two nope halves from shared memory, then the rope
    part with Q's from registers (qp_op); zero: a float32 tile in the scores' layout (not accumulated into).
    qz: 0; the step loop computes it from its counter so that the Q halves' wgmma descriptors are not hoisted out
    of the loop (hoisted, ptxas kept them in registers it spilled, and warpgroup 0 reloaded them with LDL.64 at
    the head of every step's score group: triton 3.6 SASS, docs/design/mla.md)."""
    qk = warpgroup_mma(_buf(qn_bufs, qz), _buf(c_bufs, 2 * s).permute((1, 0)), zero, use_acc=False, is_async=True)
    qk = warpgroup_mma(_buf(qn_bufs, qz + 1), _buf(c_bufs, 2 * s + 1).permute((1, 0)), qk, is_async=True)
    return warpgroup_mma(qp_op, _buf(p_bufs, s).permute((1, 0)), qk, is_async=True)


@gluon.jit
def _publish(qk, m_i, l_i, n0, limit, sm_scale, x_buf, m_buf, r_buf, p_free, free_phase, p_ready,
             s_layout: gl.constexpr, ARRIVE: gl.constexpr = True):
    """The owner's online-softmax step on its scores (tokens >= limit masked): (P 16-bit, alpha, m, l). P, m and
    the row sums go to shared memory for the other warpgroup once it has freed the P buffer. ARRIVE=False: the
    stores only (the caller fences, synchronizes and arrives on p_ready)."""
    BLOCK_N: gl.constexpr = x_buf.shape[1]
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    qk = gl.where((n0 + o_n)[None, :] < limit[:, None], qk, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(qk, 1))
    shift = gl.where(m_new == float("-inf"), 0.0, m_new) * sm_scale
    p = gl.exp2(qk * sm_scale - shift[:, None])
    alpha = gl.exp2(m_i * sm_scale - shift)
    rs = gl.sum(p, 1)
    p16 = p.to(x_buf.dtype)
    mbarrier.wait(p_free, free_phase)
    x_buf.store(p16)
    m_buf.store(m_new)
    r_buf.store(rs)
    if ARRIVE:
        fence_async_shared()  # P is read by the other warpgroup's wgmma
        thread_barrier()  # every thread's stores before the (single-thread) arrive
        mbarrier.arrive(p_ready)
    return p16, alpha, m_new, l_i * alpha + rs


@gluon.jit
def _gather(m_i, l_i, m_buf, r_buf, p_ready, ready_phase, sm_scale, row_layout: gl.constexpr):
    """The other warpgroup's step as seen by this one: waits for its P, takes its m and row sums; (alpha, m, l),
    computed exactly as the owner computed them."""
    mbarrier.wait(p_ready, ready_phase)
    m_new = m_buf.load(row_layout)
    rs = r_buf.load(row_layout)
    shift = gl.where(m_new == float("-inf"), 0.0, m_new) * sm_scale
    alpha = gl.exp2(m_i * sm_scale - shift)
    return alpha, m_new, l_i * alpha + rs


@gluon.jit
def _release(p_free):
    """Frees the other warpgroup's P buffer, m and row sums: every thread's reads of them (_gather's loads by all
    four warps) come before the single-thread arrive."""
    thread_barrier()
    mbarrier.arrive(p_free)


@gluon.jit
def _other_pv(acc, alpha, x_buf, v_smem, n0, seqlen, o_row: gl.constexpr):
    """Rescale acc (no product of it in flight) and issue acc += P V of the other warpgroup's step starting at
    token n0, P from shared memory; V rows past the sequence zeroed first."""
    if n0 + v_smem.shape[0] > seqlen:
        _zero_tail(v_smem, n0, seqlen)
    acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return warpgroup_mma(x_buf, v_smem, acc, is_async=True)


@gluon.jit
def _own_pv(acc, alpha, p16, v_smem, n0, seqlen, o_row: gl.constexpr, p_layout: gl.constexpr):
    """Rescale acc (no product of it in flight) and issue acc += P V of this warpgroup's step starting at token
    n0, P from registers; V rows past the sequence zeroed first."""
    if n0 + v_smem.shape[0] > seqlen:
        _zero_tail(v_smem, n0, seqlen)
    acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return warpgroup_mma(gl.convert_layout(p16, p_layout), v_smem, acc, is_async=True)


@gluon.jit
def _consumer(qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, q_ready, q_empty, kv_ready, kv_empty, p_ready,
              p_free, fp8, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob, stride_os,
              stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks, sm_scale,
              WG: gl.constexpr, STAGES: gl.constexpr, F_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              RETURN_LSE: gl.constexpr, ONCE: gl.constexpr, LATE: gl.constexpr):
    """F_STAGES > 0 (fp8 caches): each warpgroup widens its share of every step of the tile (gluon_producer's
    _widen_step; step g is ready when both have): warpgroup 0 steps 0 and 1 before the tile and at its turn k
    (own step o = 2k) steps o and o + 1, warpgroup 1 steps 0, 1 and 2 before the tile and at its turn k (o = 2k +
    1) steps o + 0 and o + 1: step o's share before its scores are waited for (under the own P V just issued),
    step o + 1's once step o - 2 is freed (under the scores). Each wait there is on the other warpgroup's earlier
    progress (its P, its freeing of step g - STAGES, its widening of g - F_STAGES), so with STAGES = 3 and
    F_STAGES = 2 no cycle can form (docs/design/mla.md).
    ONCE (MLASm90Config.widen_once): _widen_step's. LATE (MLASm90Config.fence_late, fp8 only): at a turn, the share
    of step o + 1 and P of step o are published together, behind one fence and barrier placed after the P V wait
    (no wgmma in flight); the other warpgroup's scores of o + 1 then wait for that publish (order model:
    scripts/check_mla_shard_fp8_order.py 3 2 late)."""
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
    kv = 0  # cache steps consumed so far (the loader's count): ring slot and phase
    j = 0  # tiles done so far: phase of the Q slot
    c0 = 0  # steps owned by warpgroup 0 / 1 in earlier tiles: phases of p_ready and p_free
    c1 = 0
    for r in range(gl.cdiv(num_tiles, gl.num_programs(0))):
        b, i_r, start, end, out_slot = _work_item(r, row_blocks, num_tiles, WORK)
        if b >= 0:
            seqlen = gl.load(SEQLENS + b)
            n_blocks = gl.cdiv(end - start, BLOCK_N)
            r0 = i_r * BLOCK_M
            limit, _ = _visible(seqlen, end, r0, q_len, num_heads, BLOCK_M, CAUSAL, s_row)
            b64 = b.to(gl.int64)
            qm = r0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
            qc = gl.arange(0, DR, layout=gl.SliceLayout(0, q_layout))
            qp_op = gl.load(QP + b64 * stride_qpb + (qm.to(gl.int64) * stride_qpr)[:, None] + qc[None, :],
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
            # P and alpha of this warpgroup's latest step, whose P V is issued at the next turn
            p16 = gl.zeros([BLOCK_M, BLOCK_N], x_bufs.dtype, s_layout)
            alpha = gl.zeros([BLOCK_M], gl.float32, s_row)
            if F_STAGES > 0:  # this warpgroup's shares of the steps before its first turn
                _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv, WG, F_STAGES, STAGES, ONCE)
                if n_blocks > 1:
                    _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv + 1, WG, F_STAGES, STAGES, ONCE)
                if WG == 1:
                    if n_blocks > 2:
                        _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv + 2, WG, F_STAGES, STAGES, ONCE)
            mbarrier.wait(q_ready.index(0), j & 1)
            if WG == 0:  # step 0: the tile's first, no step of the other's before it
                s = kv % STAGES
                mbarrier.wait(kv_ready.index(s), (kv // STAGES) & 1)
                qk = _scores(qn_bufs, qp_op, c_bufs, p_bufs, s, s_zero)
                qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
                p16, alpha, m_i, l_i = _publish(qk, m_i, l_i, start, limit, sm_scale, x_bufs.index(0),
                                                m_bufs.index(0), r_bufs.index(0), p_free.index(0),
                                                (c_own & 1) ^ 1, p_ready.index(0), s_layout)
            else:
                if n_own > 0:  # step 1, after the other's step 0
                    s = (kv + 1) % STAGES
                    sp = kv % STAGES
                    mbarrier.wait(kv_ready.index(s), ((kv + 1) // STAGES) & 1)
                    qk = _scores(qn_bufs, qp_op, c_bufs, p_bufs, s, s_zero)
                    mbarrier.wait(kv_ready.index(sp), (kv // STAGES) & 1)
                    alpha, m_i, l_i = _gather(m_i, l_i, m_bufs.index(0), r_bufs.index(0), p_ready.index(0),
                                              c_other & 1, sm_scale, s_row)
                    acc = _other_pv(acc, alpha, x_bufs.index(0), _buf(c_bufs, 2 * sp + 1), start, seqlen, o_row)
                    qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
                    p16, alpha, m_i, l_i = _publish(qk, m_i, l_i, start + BLOCK_N, limit, sm_scale, x_bufs.index(1),
                                                    m_bufs.index(1), r_bufs.index(1), p_free.index(1),
                                                    (c_own & 1) ^ 1, p_ready.index(1), s_layout)
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                    _release(p_free.index(0))
                    mbarrier.arrive(kv_empty.index(sp))
            for k in range(1, n_own):
                o = 2 * k + WG  # this warpgroup's step; o - 1 is the other's, o - 2 this one's previous
                s = (kv + o) % STAGES
                sp = (kv + o - 1) % STAGES
                spp = (kv + o - 2) % STAGES
                n0 = start + o * BLOCK_N
                acc = _own_pv(acc, alpha, p16, _buf(c_bufs, 2 * spp + WG), n0 - 2 * BLOCK_N, seqlen, o_row,
                              p_layout)
                if F_STAGES > 0:
                    _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv + o, WG, F_STAGES, STAGES, ONCE)
                mbarrier.wait(kv_ready.index(s), ((kv + o) // STAGES) & 1)
                qk = _scores(qn_bufs, qp_op, c_bufs, p_bufs, s, s_zero, k >> 30)  # 0 (k < 2^30), not loop-invariant
                # the other's step o - 1 while the scores run: its P, m and row sums, then its P V
                mbarrier.wait(kv_ready.index(sp), ((kv + o - 1) // STAGES) & 1)
                alpha, m_i, l_i = _gather(m_i, l_i, m_bufs.index(OTHER), r_bufs.index(OTHER), p_ready.index(OTHER),
                                          (c_other + k - 1 + WG) & 1, sm_scale, s_row)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))  # step o - 2's P V is done
                mbarrier.arrive(kv_empty.index(spp))
                if F_STAGES > 0:
                    if o + 1 < n_blocks:
                        _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv + o + 1, WG, F_STAGES, STAGES, ONCE,
                                    LATE)
                acc = _other_pv(acc, alpha, x_bufs.index(OTHER), _buf(c_bufs, 2 * sp + WG), n0 - BLOCK_N, seqlen,
                                o_row)
                # this warpgroup's step o: the softmax under the other's P V
                qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
                p16, alpha, m_i, l_i = _publish(qk, m_i, l_i, n0, limit, sm_scale, x_bufs.index(WG),
                                                m_bufs.index(WG), r_bufs.index(WG), p_free.index(WG),
                                                ((c_own + k) & 1) ^ 1, p_ready.index(WG), s_layout, not LATE)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                if LATE:  # P of step o and the share of o + 1 (widened above) behind one fence
                    fence_async_shared()
                    thread_barrier()
                    mbarrier.arrive(p_ready.index(WG))
                    if F_STAGES > 0:
                        if o + 1 < n_blocks:
                            _widen_arrive(fp8, kv_ready, kv + o + 1, F_STAGES, STAGES)
                _release(p_free.index(OTHER))
                mbarrier.arrive(kv_empty.index(sp))
            if n_own > 0:  # the P V of this warpgroup's last step
                o = 2 * n_own - 2 + WG
                s = (kv + o) % STAGES
                acc = _own_pv(acc, alpha, p16, _buf(c_bufs, 2 * s + WG), start + o * BLOCK_N, seqlen, o_row,
                              p_layout)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                mbarrier.arrive(kv_empty.index(s))
            mbarrier.arrive(q_empty.index(0))  # every score wgmma of this warpgroup's was waited on
            last = n_blocks - 1
            if last % 2 == OTHER:  # the tile ends on the other's step
                sl = (kv + last) % STAGES
                mbarrier.wait(kv_ready.index(sl), ((kv + last) // STAGES) & 1)
                alpha, m_i, l_i = _gather(m_i, l_i, m_bufs.index(OTHER), r_bufs.index(OTHER), p_ready.index(OTHER),
                                          (c_other + (last - OTHER) // 2) & 1, sm_scale, s_row)
                acc = _other_pv(acc, alpha, x_bufs.index(OTHER), _buf(c_bufs, 2 * sl + WG), start + last * BLOCK_N,
                                seqlen, o_row)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                _release(p_free.index(OTHER))
                mbarrier.arrive(kv_empty.index(sl))

            _epilogue(acc, m_i, l_i, kv_scale, sm_scale, b, r0, out_slot, O, LSE, OP, LSEP, stride_ob, stride_os,
                      stride_oh, stride_lb, stride_lh, num_heads, rows, WG, RETURN_LSE, o_layout)
            j += 1
            kv += n_blocks
            c0 += (n_blocks + 1) // 2
            c1 += n_blocks // 2


@gluon.jit
def mla_split_sm90_shard_kernel(
    qn_desc, ckv_desc, kpe_desc, QP, BT, SEQLENS, WORK, O, LSE, OP, LSEP, KVS,
    stride_qpb, stride_qpr, stride_bt, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, q_len, num_pages, num_tiles, row_blocks, sm_scale,
    PAGE: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, CAUSAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, F_STAGES: gl.constexpr = 0, C_LAYOUT: gl.constexpr = None,
    P_LAYOUT: gl.constexpr = None, WIDEN_ONCE: gl.constexpr = False, FENCE_LATE: gl.constexpr = False,
):
    """Grid: (programs,), up to num_tiles = row_blocks * work items; num_warps = 4 (the first consumer).

    Descriptors as in gluon_sm90.mla_split_sm90_kernel (no q_pe descriptor: QP is q_pe as [B, Sq * Hq, DR] with
    strides stride_qpb, stride_qpr and unit columns, read into registers). F_STAGES > 0: fp8 caches, as there
    (STAGES = 3 with F_STAGES = 2: _consumer's widening order needs no more; with two 16-bit stages it deadlocks, and
    the plan asks for 2 fp8 stages though the order model, scripts/check_mla_shard_fp8_order.py, finds none at 3 / 1).
    WIDEN_ONCE / FENCE_LATE: MLASm90Config.widen_once / fence_late (_consumer's ONCE / LATE).
    """
    BLOCK_M: gl.constexpr = qn_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[1]
    # one Q slot (nope halves), STAGES cache steps (ckv halves + kpe), the two P tiles and their row statistics
    qn_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2] + qn_desc.block_type.shape, qn_desc.layout)
    if F_STAGES > 0:
        gl.static_assert(STAGES >= 3 and F_STAGES >= 2, "fp8 QK_SHARD: at least 3 16-bit and 2 fp8 steps")
        c_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2 * STAGES] + ckv_desc.block_type.shape, C_LAYOUT)
        p_bufs = gl.allocate_shared_memory(qn_desc.dtype, [STAGES] + kpe_desc.block_type.shape, P_LAYOUT)
    else:
        c_bufs = gl.allocate_shared_memory(ckv_desc.dtype, [2 * STAGES] + ckv_desc.block_type.shape,
                                           ckv_desc.layout)
        p_bufs = gl.allocate_shared_memory(kpe_desc.dtype, [STAGES] + kpe_desc.block_type.shape, kpe_desc.layout)
    x_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128 if BLOCK_N >= 64 else 2 * BLOCK_N,
                                                  element_bitwidth=16, rank=2)
    x_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2, BLOCK_M, BLOCK_N], x_layout)
    st_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
    m_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], st_layout)
    r_bufs = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], st_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=1)
    mbarrier.init(q_empty.index(0), count=2)
    for s in gl.static_range(STAGES):
        # fp8 caches: a step is ready when both warpgroups widened their shares
        mbarrier.init(kv_ready.index(s), count=2 if F_STAGES > 0 else 1)
        mbarrier.init(kv_empty.index(s), count=2)
    for w in gl.static_range(2):
        mbarrier.init(p_ready.index(w), count=1)
        mbarrier.init(p_free.index(w), count=1)
    if F_STAGES > 0:
        fp8 = _fp8_rings(ckv_desc, kpe_desc, F_STAGES)
        l_c, l_p, l_ready, l_empty = fp8  # what the loader fills
        l_stages = F_STAGES
    else:
        fp8 = (c_bufs, p_bufs, kv_ready, kv_empty)  # unused
        l_c, l_p, l_ready, l_empty, l_stages = c_bufs, p_bufs, kv_ready, kv_empty, STAGES

    gl.warp_specialize([
        (_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, q_ready, q_empty, kv_ready, kv_empty, p_ready,
                     p_free, fp8, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob,
                     stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks, sm_scale, 0,
                     STAGES, F_STAGES, CAUSAL, RETURN_LSE, WIDEN_ONCE, FENCE_LATE)),
        (_consumer, (qn_bufs, c_bufs, p_bufs, x_bufs, m_bufs, r_bufs, q_ready, q_empty, kv_ready, kv_empty, p_ready,
                     p_free, fp8, WORK, SEQLENS, QP, O, LSE, OP, LSEP, KVS, stride_qpb, stride_qpr, stride_ob,
                     stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks, sm_scale, 1,
                     STAGES, F_STAGES, CAUSAL, RETURN_LSE, WIDEN_ONCE, FENCE_LATE)),
        (_loader, (qn_desc, qn_desc, ckv_desc, kpe_desc, qn_bufs, qn_bufs, l_c, l_p, q_ready, q_empty,
                   l_ready, l_empty, WORK, BT, stride_bt, num_pages, num_tiles, row_blocks, PAGE, l_stages, False)),
    ], [4, 1], [CONSUMER_REGS, 24])
