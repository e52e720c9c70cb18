"""Hopper (sm90) MLA decode split kernel in Gluon: warp-specialized, the 512-wide output split over two
warpgroups.

The work items and the masking model are those of kernels.py (see its docstring); this kernel computes the
same partial (or final) outputs, for the plans whose pages hold whole BLOCK_N-token steps (page_size a
multiple of BLOCK_N), so that a step of the cache is one TMA box per operand.

A tile is 64 query rows (r = t * Hq + h) of one work item. The grid is persistent: CTA p takes tiles p,
p + nprog, ... (the plan sorts items longest first; the row tiles of one item are neighbours, so they read
its cache from L2 together). Partitions:
  - a loader (one warp) loads a tile's Q (the nope part in two DC / 2 halves, and the rope part) into one Q
    slot, then streams the item's cache steps through a ring of STAGES buffers with TMA: ckv in two halves
    and kpe, one `kv_ready` barrier per buffer. A step's page id comes from the block table; the next one is
    read while the loader waits for a free buffer.
  - two consumer warpgroups, each owning DC / 2 output columns (a 64 x 256 float32 accumulator at DC = 512:
    one warpgroup cannot hold all 512). Each computes the full scores S = Q K^T by wgmma from shared memory
    (the 1.5x recompute of Q K^T buys independent warpgroups: no exchange of S between them, and the
    softmax of one overlaps the other's wgmma), keeps the online softmax in registers (both get the same
    S, so the same P and row sums), and O += P V with P from registers and V = its half of the ckv buffer.
    Within a warpgroup, the scores of step i and the P V of step i - 1 go to the tensor cores together
    (FlashAttention-3's intra-warpgroup pipeline).
  - fp8 (e4m3) caches (F_STAGES > 0): the loader streams the steps into an fp8 ring instead, and each consumer
    widens its share of step i + 1 into the 16-bit ring while the wgmmas of step i run (gluon_producer.py).
(The loader and the work-item helpers are in gluon_producer.py.)

Rows of the cache past a sequence's end (the tail of its last page) may hold anything, NaN included: the
scores are masked with a select, and before the P V of a step that crosses the end each warpgroup zeroes
those rows of its half of V in shared memory (0 * NaN would poison the accumulator).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common import softmax
from ..common.gluon_compat import thread_barrier
from .gluon_producer import _buf, _fp8_rings, _loader, _widen_step, _widened, _work_item

LN2 = gl.constexpr(0.6931471805599453)

# the online softmax step, written once as a Triton function and compiled here as Gluon
_online_softmax = gluon.jit(softmax.online_softmax.fn)


@gluon.jit
def _visible(seqlen, end, r0, q_len, num_heads, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr,
             s_row: gl.constexpr):
    """(limit, full_end) of the tile of rows r0..r0 + BLOCK_M: tokens < limit[row] are visible to the row (causal:
    query token t sees the first seqlen - q_len + t + 1; never past the item's end), tokens < full_end to every
    row (the tile's first query token sees the fewest)."""
    if CAUSAL:
        o_m = r0 + gl.arange(0, BLOCK_M, layout=s_row)
        limit = gl.minimum(seqlen - q_len + o_m // num_heads + 1, end)
        full_end = gl.minimum(seqlen - q_len + r0 // num_heads + 1, end)
    else:
        limit = gl.zeros([BLOCK_M], gl.int32, s_row) + end
        full_end = end
    return limit, full_end


@gluon.jit
def _scores(qn_bufs, qp_buf, c_bufs, p_bufs, s, zero):
    """S = Q K^T of ring buffer s, issued asynchronously (two nope halves, then the rope part); zero: a float32
    tile in the scores' layout (not accumulated into)."""
    qk = warpgroup_mma(_buf(qn_bufs, 0), _buf(c_bufs, 2 * s).permute((1, 0)), zero, use_acc=False, is_async=True)
    qk = warpgroup_mma(_buf(qn_bufs, 1), _buf(c_bufs, 2 * s + 1).permute((1, 0)), qk, is_async=True)
    return warpgroup_mma(_buf(qp_buf, 0), _buf(p_bufs, s).permute((1, 0)), qk, is_async=True)


@gluon.jit
def _zero_tail(v_smem, n0, seqlen):
    """Zero the rows of a [BLOCK_N, DH] V buffer at tokens >= seqlen (whatever the cache holds there), for
    this warpgroup's wgmma to read next."""
    BLOCK_N: gl.constexpr = v_smem.shape[0]
    DH: gl.constexpr = v_smem.shape[1]
    CHUNK: gl.constexpr = 32 if BLOCK_N > 32 else BLOCK_N  # rows per pass (bounds the registers it takes)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    for c in gl.static_range(BLOCK_N // CHUNK):
        part = v_smem.slice(c * CHUNK, CHUNK, dim=0)
        rows = n0 + c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        x = part.load(layout)
        part.store(gl.where((rows < seqlen)[:, None], x, gl.zeros([CHUNK, DH], x.dtype, layout)))
    fence_async_shared()
    thread_barrier()


@gluon.jit
def _steps(acc, m_i, l_i, p_op, kv, start, seqlen, limit, b_start, b_end, qn_bufs, qp_buf, c_bufs, p_bufs,
           kv_ready, kv_empty, fp8, sm_scale, WG: gl.constexpr, MASKED: gl.constexpr, STAGES: gl.constexpr,
           F_STAGES: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr,
           ONCE: gl.constexpr = False, LATE: gl.constexpr = False):
    """Steps b in [b_start, b_end): S of step b and P V of step b - 1 go to the tensor cores together; p_op
    holds P of step b - 1. MASKED: scores at tokens >= limit (per row) are masked and V rows past the sequence
    zeroed. The branch for the latter sits where no wgmma is in flight. F_STAGES > 0 (fp8 caches): under the
    two products the warpgroup widens its share of step b + 1 (the caller keeps b + 1 within the tile); ONCE and
    LATE: _widen_step's (LATE: its fence, barrier and arrives once both products are done, no wgmma in flight)."""
    BLOCK_M: gl.constexpr = qp_buf.shape[2]
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for it in range(b_start, b_end):
        s = (kv + it) % STAGES
        sp = (kv + it - 1) % STAGES
        n0 = start + it * BLOCK_N
        mbarrier.wait(kv_ready.index(s), ((kv + it) // STAGES) & 1)
        if MASKED:
            if n0 + BLOCK_N > seqlen:
                _zero_tail(_buf(c_bufs, 2 * s + WG), n0, seqlen)
        qk = _scores(qn_bufs, qp_buf, c_bufs, p_bufs, s, s_zero)
        acc = warpgroup_mma(p_op, _buf(c_bufs, 2 * sp + WG), acc, is_async=True)
        if F_STAGES > 0:
            _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv + it + 1, WG, F_STAGES, STAGES, ONCE, LATE)
        qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
        if MASKED:
            qk = gl.where((n0 + o_n)[None, :] < limit[:, None], qk, float("-inf"))
        p, alpha, m_i, l_i = _online_softmax(qk, m_i, l_i, sm_scale)
        # P of this step overwrites the registers the P V wgmma in flight reads: convert after its wait
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if F_STAGES > 0:
            if LATE:
                _widened(fp8, kv_ready, kv + it + 1, F_STAGES, STAGES)
        mbarrier.arrive(kv_empty.index(sp))
        p_op = gl.convert_layout(p.to(c_bufs.dtype), p_layout)
        acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return acc, m_i, l_i, p_op


@gluon.jit
def _consumer(qn_bufs, qp_buf, c_bufs, p_bufs, q_ready, q_empty, kv_ready, kv_empty, fp8, WORK, SEQLENS, O, LSE, OP,
              LSEP, KVS, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len, num_tiles, row_blocks,
              sm_scale, WG: gl.constexpr, STAGES: gl.constexpr, F_STAGES: gl.constexpr, CAUSAL: gl.constexpr,
              RETURN_LSE: gl.constexpr, ONCE: gl.constexpr, LATE: gl.constexpr):
    """ONCE, LATE (fp8 caches): the widening's switches (_steps)."""
    BLOCK_M: gl.constexpr = qp_buf.shape[2]
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    DH: gl.constexpr = c_bufs.shape[3]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DH, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows = q_len * num_heads
    kv_scale = gl.load(KVS)
    sm_scale = sm_scale * kv_scale
    kv = 0  # cache steps consumed so far (the loader's count): ring slot and phase
    j = 0  # tiles done so far: phase of the Q slot
    for r in range(gl.cdiv(num_tiles, gl.num_programs(0))):
        b, i_r, start, end, out_slot = _work_item(r, row_blocks, num_tiles, WORK)
        if b >= 0:
            seqlen = gl.load(SEQLENS + b)
            n_blocks = gl.cdiv(end - start, BLOCK_N)
            r0 = i_r * BLOCK_M
            limit, full_end = _visible(seqlen, end, r0, q_len, num_heads, BLOCK_M, CAUSAL, s_row)
            # steps [0, b_full) need no mask, steps [b_full, n_blocks) do (at least the last one, which may
            # cross the sequence's end)
            b_full = gl.minimum(gl.maximum((full_end - start) // BLOCK_N, 0), n_blocks - 1)
            m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=s_row)
            l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_row)
            acc = gl.zeros([BLOCK_M, DH], gl.float32, layout=o_layout)
            if F_STAGES > 0:
                _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv, WG, F_STAGES, STAGES, ONCE)
            mbarrier.wait(q_ready.index(0), j & 1)
            acc, m_i, l_i, p_op = _first_step(acc, m_i, l_i, kv, start, seqlen, limit, n_blocks, qn_bufs, qp_buf,
                                              c_bufs, p_bufs, kv_ready, kv_empty, fp8, sm_scale, WG, STAGES, F_STAGES,
                                              s_layout, o_layout, p_layout, ONCE)
            acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, kv, start, seqlen, limit, 1, b_full, qn_bufs,
                                         qp_buf, c_bufs, p_bufs, kv_ready, kv_empty, fp8, sm_scale, WG, False, STAGES,
                                         F_STAGES, s_layout, o_layout, p_layout, ONCE, LATE)
            if F_STAGES > 0:  # the tile's last step has no next one to widen
                acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, kv, start, seqlen, limit, gl.maximum(b_full, 1),
                                             n_blocks - 1, qn_bufs, qp_buf, c_bufs, p_bufs, kv_ready, kv_empty, fp8,
                                             sm_scale, WG, True, STAGES, F_STAGES, s_layout, o_layout, p_layout, ONCE,
                                             LATE)
                acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, kv, start, seqlen, limit,
                                             gl.maximum(gl.maximum(b_full, 1), n_blocks - 1), n_blocks, qn_bufs,
                                             qp_buf, c_bufs, p_bufs, kv_ready, kv_empty, fp8, sm_scale, WG, True,
                                             STAGES, 0, s_layout, o_layout, p_layout)
            else:
                acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, kv, start, seqlen, limit, gl.maximum(b_full, 1),
                                             n_blocks, qn_bufs, qp_buf, c_bufs, p_bufs, kv_ready, kv_empty, fp8,
                                             sm_scale, WG, True, STAGES, 0, s_layout, o_layout, p_layout)
            mbarrier.arrive(q_empty.index(0))  # every S wgmma of the tile was waited on
            sp = (kv + n_blocks - 1) % STAGES
            acc = warpgroup_mma(p_op, _buf(c_bufs, 2 * sp + WG), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(kv_empty.index(sp))

            _epilogue(acc, m_i, l_i, kv_scale, sm_scale, b, r0, out_slot, O, LSE, OP, LSEP, stride_ob, stride_os,
                      stride_oh, stride_lb, stride_lh, num_heads, rows, WG, RETURN_LSE, o_layout)
            j += 1
            kv += n_blocks


@gluon.jit
def _epilogue(acc, m_i, l_i, kv_scale, sm_scale, b, r0, out_slot, O, LSE, OP, LSEP, stride_ob, stride_os, stride_oh,
              stride_lb, stride_lh, num_heads, rows, WG: gl.constexpr, RETURN_LSE: gl.constexpr,
              o_layout: gl.constexpr):
    """A warpgroup's DH output columns of a tile (rows r0..) to O (and LSE, natural log) or, for a split item,
    to slot out_slot of OP / LSEP (log2); rows that saw no token (l = 0, acc = 0) give out 0, lse -inf. Shared
    with gluon_sm90_shard.py."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    DH: gl.constexpr = acc.shape[1]
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_row: gl.constexpr = m_i.type.layout
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    out = acc * gl.convert_layout(kv_scale / l_safe, o_row)[:, None]
    om = r0 + gl.arange(0, BLOCK_M, layout=o_row)
    o_m = r0 + gl.arange(0, BLOCK_M, layout=s_row)
    oc = WG * DH + gl.arange(0, DH, layout=gl.SliceLayout(0, o_layout))
    row_ok = (om < rows)[:, None]
    b64 = b.to(gl.int64)
    lse2 = gl.where(seen, m_i * sm_scale + gl.log2(l_safe), float("-inf"))
    if out_slot < 0:
        t = om // num_heads
        h = om % num_heads
        o_ptr = O + b64 * stride_ob + t.to(gl.int64) * stride_os + h.to(gl.int64) * stride_oh
        gl.store(o_ptr[:, None] + oc[None, :], out.to(O.dtype.element_ty), mask=row_ok)
        if RETURN_LSE and WG == 0:
            gl.store(LSE + b64 * stride_lb + (o_m % num_heads).to(gl.int64) * stride_lh + o_m // num_heads,
                     lse2 * LN2, mask=o_m < rows)
    else:
        base = out_slot.to(gl.int64) * rows
        gl.store(OP + ((base + om) * (2 * DH))[:, None] + oc[None, :], out, mask=row_ok)
        if WG == 0:
            gl.store(LSEP + base + o_m, lse2, mask=o_m < rows)


@gluon.jit
def _first_step(acc, m_i, l_i, kv, start, seqlen, limit, n_blocks, qn_bufs, qp_buf, c_bufs, p_bufs, kv_ready,
                kv_empty, fp8, sm_scale, WG: gl.constexpr, STAGES: gl.constexpr, F_STAGES: gl.constexpr,
                s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr, ONCE: gl.constexpr = False):
    """Step 0 of a tile: its scores and softmax (masked: the rule holds trivially on a fully visible step), no
    P V yet (the pipelined steps issue it with step 1's scores). F_STAGES > 0: the warpgroup has widened its
    share of step 0 (the caller) and widens that of step 1 here (ONCE: _widen_step's; no wgmma in flight)."""
    BLOCK_M: gl.constexpr = qp_buf.shape[2]
    BLOCK_N: gl.constexpr = c_bufs.shape[2]
    s = kv % STAGES
    mbarrier.wait(kv_ready.index(s), (kv // STAGES) & 1)
    if start + BLOCK_N > seqlen:
        _zero_tail(_buf(c_bufs, 2 * s + WG), start, seqlen)
    qk = _scores(qn_bufs, qp_buf, c_bufs, p_bufs, s, gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout))
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
    if F_STAGES > 0:
        if n_blocks > 1:
            _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, kv + 1, WG, F_STAGES, STAGES, ONCE)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    qk = gl.where((start + o_n)[None, :] < limit[:, None], qk, float("-inf"))
    p, _, m_i, l_i = _online_softmax(qk, m_i, l_i, sm_scale)
    return acc, m_i, l_i, gl.convert_layout(p.to(c_bufs.dtype), p_layout)


@gluon.jit
def mla_split_sm90_kernel(
    qn_desc, qp_desc, ckv_desc, kpe_desc, BT, SEQLENS, WORK, O, LSE, OP, LSEP, KVS,
    stride_bt, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, q_len, num_pages, num_tiles, row_blocks, sm_scale,
    PAGE: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr, CAUSAL: gl.constexpr,
    RETURN_LSE: gl.constexpr, F_STAGES: gl.constexpr = 0, C_LAYOUT: gl.constexpr = None,
    P_LAYOUT: gl.constexpr = None, WIDEN_ONCE: gl.constexpr = False, FENCE_LATE: gl.constexpr = False,
):
    """Grid: (programs,), up to num_tiles = row_blocks * work items; num_warps = 4 (the first consumer).

    Descriptors: qn over q_nope as [B, Sq * Hq, DC] with block [1, 64, DC / 2]; qp over q_pe as [B, Sq * Hq, DR]
    with block [1, 64, DR]; ckv over [num_pages, page_size, DC] with block [1, BLOCK_N, DC / 2]; kpe over
    [num_pages, page_size, DR] with block [1, BLOCK_N, DR]. WORK, O, LSE, OP, LSEP, KVS and sm_scale as in
    kernels.mla_split_kernel. F_STAGES > 0: fp8 caches, streamed through F_STAGES fp8 steps and widened into
    the STAGES 16-bit ones (C_LAYOUT / P_LAYOUT: their shared layouts, those of 16-bit descriptors; gluon_producer.py;
    WIDEN_ONCE / FENCE_LATE: MLASm90Config.widen_once / fence_late).
    """
    # one Q slot (nope halves + rope), STAGES cache steps (ckv halves + kpe), in the descriptors' block shapes
    qn_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2] + qn_desc.block_type.shape, qn_desc.layout)
    qp_buf = gl.allocate_shared_memory(qp_desc.dtype, [1] + qp_desc.block_type.shape, qp_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=1)
    mbarrier.init(q_empty.index(0), count=2)
    for s in gl.static_range(STAGES):
        # fp8 caches: a step is ready when both warpgroups widened their shares
        mbarrier.init(kv_ready.index(s), count=2 if F_STAGES > 0 else 1)
        mbarrier.init(kv_empty.index(s), count=2)
    if F_STAGES > 0:
        c_bufs = gl.allocate_shared_memory(qn_desc.dtype, [2 * STAGES] + ckv_desc.block_type.shape, C_LAYOUT)
        p_bufs = gl.allocate_shared_memory(qn_desc.dtype, [STAGES] + kpe_desc.block_type.shape, P_LAYOUT)
        fp8 = _fp8_rings(ckv_desc, kpe_desc, F_STAGES)
        l_c, l_p, l_ready, l_empty = fp8  # what the loader fills
        l_stages = F_STAGES
    else:
        c_bufs = gl.allocate_shared_memory(ckv_desc.dtype, [2 * STAGES] + ckv_desc.block_type.shape,
                                           ckv_desc.layout)
        p_bufs = gl.allocate_shared_memory(kpe_desc.dtype, [STAGES] + kpe_desc.block_type.shape, kpe_desc.layout)
        fp8 = (c_bufs, p_bufs, kv_ready, kv_empty)  # unused
        l_c, l_p, l_ready, l_empty, l_stages = c_bufs, p_bufs, kv_ready, kv_empty, STAGES

    gl.warp_specialize([
        (_consumer, (qn_bufs, qp_buf, c_bufs, p_bufs, q_ready, q_empty, kv_ready, kv_empty, fp8, WORK, SEQLENS, O,
                     LSE, OP, LSEP, KVS, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len,
                     num_tiles, row_blocks, sm_scale, 0, STAGES, F_STAGES, CAUSAL, RETURN_LSE, WIDEN_ONCE, FENCE_LATE)),
        (_consumer, (qn_bufs, qp_buf, c_bufs, p_bufs, q_ready, q_empty, kv_ready, kv_empty, fp8, WORK, SEQLENS, O,
                     LSE, OP, LSEP, KVS, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_heads, q_len,
                     num_tiles, row_blocks, sm_scale, 1, STAGES, F_STAGES, CAUSAL, RETURN_LSE, WIDEN_ONCE, FENCE_LATE)),
        (_loader, (qn_desc, qp_desc, ckv_desc, kpe_desc, qn_bufs, qp_buf, l_c, l_p, q_ready, q_empty, l_ready,
                   l_empty, WORK, BT, stride_bt, num_pages, num_tiles, row_blocks, PAGE, l_stages)),
    ], [4, 1], [CONSUMER_REGS, 24])
