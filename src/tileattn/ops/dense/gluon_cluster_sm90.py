"""The dense attention forward on Hopper as a 2-CTA cluster whose CTAs share every K/V tile through TMA multicast.
Triton 3.9 Gluon only (num_ctas=2). Backend dense.sm90_cluster (launch_cluster_sm90.py).

Work split
----------
One program is one cluster of two CTAs (Gluon has no CTA rank: `gl.program_id(0)` counts clusters, and every
tensor's layout carries a `cga_layout` that says how its elements fall on the two CTAs). A program takes a *pair
tile* of PAIR_ROWS = 2 * NUM_CONSUMERS * BLOCK_M = 256 query rows of one (batch, query head) and walks the pair's
key blocks (non-causal: all of them; causal, top-left: up to the pair's last row). Each CTA owns 128 of those
rows and has its own loader warp and two consumer warpgroups, as the 1-CTA kernel (gluon_attn_sm90.py):

    consumer WG (0 or 1) of the program computes the 2 * BLOCK_M logical rows  m0 + WG * 2 * BLOCK_M + [0, 128),
    split by the `cga_layout` [[1, 0]] of its registers: rows [0, 64) of that block in CTA 0, [64, 128) in CTA 1.

So CTA 0 owns the 64-row blocks 0 and 2 of the pair tile, CTA 1 the blocks 1 and 3 (the interleave keeps a
warpgroup's logical rows contiguous: one TMA box [1, 128, 1, D] per warpgroup for Q and for O, each CTA copying its
own 64 rows, and one mask range per warpgroup). Q / O descriptors: block [1, 2 * BLOCK_M, 1, D] with
cga_layout [[0, 1, 0, 0]] (split by rows); K / V: block [1, BLOCK_N, 1, D] with cga_layout [[0, 0, 0, 0]]
(broadcast: both CTAs hold the same tile). The wgmmas are per CTA (Hopper has no 2-CTA wgmma): S = Q K^T with Q
split, K broadcast, S split; O += P V with P in registers (split), V broadcast. The row reductions of the
softmax run along the keys, which are not split, so no operation crosses the CTAs (a cross-CTA reduce or convert
would put a cluster barrier inside warp_specialize, which is not allowed).

Both CTAs run the same control flow (scalars are the program's): the same key blocks, the same masked /
unmasked split per warpgroup (computed on the warpgroup's 128 logical rows). A row that sees no key of a block
keeps m = -inf and exp2 gets a zero shift (no NaN).

K/V multicast: who loads
------------------------
`tma.async_load(desc, coord, bar, smem, multicast=True)` into a broadcast smem layout is lowered (3.9, sm90) to
`cp.async.bulk.tensor...multicast::cluster` with ctaMask 0b11, *issued by CTA 0 (the lead) only* (the predicate
is `%cluster_ctarank == 0`); the copy engine writes the tile into the same smem offset of both CTAs and signals
the barrier at the same offset in both. Gluon 3.9 offers no "each CTA loads half and multicasts" form for a
broadcast layout (the layout decides the issuing CTA, and a split-by-rows K layout would give each CTA half of
the keys, not a shared tile), so the lead loads whole tiles; the L2 -> SM traffic per pair is one K and one V
tile per key block instead of two.

Barrier protocol
----------------
Allocation and init (top level, before warp_specialize; every allocation through mbarrier.allocate_mbarrier so
that its layout has the cluster's CTA dimension):

    q_ready           per CTA, count 1           the loader's expect(Q bytes of this CTA) + Q's TMA bytes
    k_ready[s]        per CTA, count 1           this CTA's loader's expect(K bytes per CTA) + the lead's
    v_ready[s]        per CTA, count 1             multicast bytes (complete_tx lands in both CTAs)
    kv_empty[s]       per CTA, count NUM_CONSUMERS   this CTA's consumers are done reading stage s
    kv_pair[s]        two-CTA (allocate_mbarrier(two_ctas=True)): one barrier in the lead's smem, init count
                      NUM_CONSUMERS (the compiler multiplies it by 2); consumers of both CTAs arrive on it
                      (a remote `mbarrier.arrive.shared::cluster` from the peer); its wait runs in the lead only
                      (the peer skips it)

The compiler emits, after the init sequence, `fence.mbarrier_init.release.cluster` and a relaxed cluster
barrier (arrive.relaxed + wait), so no CTA arrives on or multicasts into a barrier of the other before it is
initialized. That is why every init stays at the top level: a cluster barrier cannot run inside
warp_specialize.

Stage s, use u (phase ph = u & 1), key block it = u * STAGES + s:
    loader (both CTAs):
        wait kv_empty[s] (parity ph ^ 1)     this CTA's consumers released use u - 1 (fresh barrier: passes)
        wait kv_pair[s]  (parity ph ^ 1)     lead only: the consumers of BOTH CTAs released use u - 1, so the
                                             multicast cannot overwrite a stage the peer still reads
        expect k_ready[s], K bytes per CTA   every CTA arms its own ready barrier
        multicast K (lead issues, both CTAs receive); the same for V on v_ready[s]
    consumer warpgroup (both CTAs):
        wait k_ready[s] (ph); q.k; wait v_ready of the previous block; p.v ...
        after the wgmma reading V of stage s has completed: arrive kv_empty[s] (own CTA) and kv_pair[s] (lead)

Why both empty barriers: kv_pair alone protects the peer's *data* (the lead waits for the peer's consumers
before writing into it) but the peer's loader does not wait on it (a two-CTA wait runs in the lead only), so
without kv_empty the peer's loader would run ahead and arm k_ready[s] for use u + 1 while use u is still pending
(its expect would be counted into the wrong phase). With kv_empty the peer re-arms stage s only after its own
consumers finished use u, i.e. after use u's phase completed. The lead's multicast bytes for use u + 1 may reach
the peer's k_ready[s] before the peer's expect: the transaction count goes negative until the expect, but the
phase cannot complete while the expect's arrival is pending, so the order does not matter.

Exit: the compiler ends the kernel with a full cluster barrier (barrier.cluster.arrive + wait, after the
warp_specialize region), so neither CTA exits while the other may still arrive on its barriers (the peer's last
kv_pair arrivals) or receive multicast bytes into its smem.

O is staged in the warpgroup's own Q buffer after its last wgmma (never a multicast destination) and stored by
TMA, each CTA its 64 rows (rows past Sq are clipped by the copy engine). With RETURN_LSE the lse (natural log, as
the 1-CTA kernel's) is stored from registers: the row vector has the accumulator's row split, so each CTA stores
the 64 logical rows it holds (warpgroup row m0 + CTA * 64 + the thread's row), rows past Sq masked.

Status (scripts/compile_cluster.py, triton 3.9.0, sm_90a, fp16 / bf16, causal or not): 168 registers at launch
(setmaxnreg 240 consumers / 24 loader), 229,744 bytes of shared memory per CTA (229,760 with RETURN_LSE: the
partitions' captured lse pointer and strides), no spills, wgmmas not serialized, 4 UTMALDG.MULTICAST sites (K
and V, two 64-column messages each). Per key step the SASS has one warpgroup BAR.SYNC more than the 1-CTA kernel
(Triton puts one before each mbarrier.arrive: two arrives now) and a remote arrive (SYNCS.ARRIVE.TRANS64.RED) to
the lead. Causal: warpgroup 0 walks one fully masked block per pair (the pair's range is warpgroup 1's). Run on
an H200 (tests/dense/test_cluster_sm90.py passes); its speed against the 1-CTA kernel: configs.CLUSTER_FROM.
RETURN_LSE (run on an H200 under 3.9: the cluster tests' lse cases and the training step's gradients): 2 STG per
consumer warpgroup more (4 in all), the same registers;
with RETURN_LSE=False the SASS is the one before the lse existed, but for the kernel parameters' constant-bank
offsets (+16 bytes).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..common import masking
from ..common.gluon_sm90_consumer import LN2, p_operand, softmax_block

_key_range = gluon.jit(masking.key_range.fn)

# the registers' split over the two CTAs: rows (dimension 0) by CTA
ROW_SPLIT = gl.constexpr([[1, 0]])


@gluon.jit
def _pair_of(num_pairs, REVERSE_M: gl.constexpr):
    """(pair tile, batch * head) of this program (one cluster): pair tiles are the fast index; REVERSE_M (causal)
    takes a head's heaviest pair first."""
    pid = gl.program_id(0)
    i_pair = pid % num_pairs
    if REVERSE_M:
        i_pair = num_pairs - 1 - i_pair
    return i_pair, pid // num_pairs


@gluon.jit
def _pair_keys(i_pair, seqlen_q, seqlen_k, off_diag, PAIR_ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
               HAS_RIGHT: gl.constexpr):
    """(first query row, first key, key blocks) of a pair tile: loader and consumers must agree on the count."""
    m0 = i_pair * PAIR_ROWS
    m_last = gl.minimum(m0 + PAIR_ROWS, seqlen_q) - 1
    lo, hi, _, _ = _key_range(m0, m_last, seqlen_k, off_diag, 0, 0, BLOCK_N, False, HAS_RIGHT)
    return m0, lo, gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)


@gluon.jit
def _release(kv_empty, kv_pair, s):
    """This warpgroup is done with K/V stage s: tell this CTA's loader and the lead's (the pair barrier)."""
    mbarrier.arrive(kv_empty.index(s))
    mbarrier.arrive(kv_pair.index(s))


@gluon.jit
def loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, kv_pair,
           num_pairs, num_heads, group_size, seqlen_q, seqlen_k, off_diag, BLOCK_M: gl.constexpr,
           STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, HAS_RIGHT: gl.constexpr, REVERSE_M: gl.constexpr):
    """The loader warp of each CTA: its own Q rows, then the pair's K/V blocks through the ring (multicast by the
    lead; every CTA arms its own ready barriers)."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    PAIR_ROWS: gl.constexpr = 2 * NUM_CONSUMERS * BLOCK_M
    WG_ROWS: gl.constexpr = 2 * BLOCK_M
    i_pair, i_bh = _pair_of(num_pairs, REVERSE_M)
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    i_hk = i_h // group_size
    m0, n_lo, n_blocks = _pair_keys(i_pair, seqlen_q, seqlen_k, off_diag, PAIR_ROWS, BLOCK_N, HAS_RIGHT)
    # Q: each CTA copies its own BLOCK_M rows of each warpgroup's box (split layout: no multicast)
    mbarrier.expect(q_ready, NUM_CONSUMERS * q_desc.nbytes_per_cta)
    for c in gl.static_range(NUM_CONSUMERS):
        tma.async_load(q_desc, [i_b, m0 + c * WG_ROWS, i_h, 0], q_ready, q_bufs.index(c))
    for it in range(n_blocks):
        s = it % STAGES
        ph = (it // STAGES) & 1
        n0 = n_lo + it * BLOCK_N
        mbarrier.wait(kv_empty.index(s), ph ^ 1)
        mbarrier.wait(kv_pair.index(s), ph ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.nbytes_per_cta)
        tma.async_load(k_desc, [i_b, n0, i_hk, 0], k_ready.index(s), k_bufs.index(s), multicast=True)
        mbarrier.expect(v_ready.index(s), v_desc.nbytes_per_cta)
        tma.async_load(v_desc, [i_b, n0, i_hk, 0], v_ready.index(s), v_bufs.index(s), multicast=True)


@gluon.jit
def _steps(acc, m_i, l_i, p_op, n_lo, b_start, b_end, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty,
           kv_pair, seqlen_k, off_diag, sm_scale, MASKED: gl.constexpr, HAS_RIGHT: gl.constexpr,
           STAGES: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """Steady-state blocks [b_start, b_end): q.k of block b and p.v of block b - 1 in flight together, as
    gluon_sm90_consumer._pipelined_steps (no pingpong, no flex, 16-bit inputs); block b in stage b % STAGES."""
    BLOCK_M2: gl.constexpr = q_smem.shape[0]
    D: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    DV: gl.constexpr = v_bufs.shape[4]
    dtype: gl.constexpr = v_bufs.dtype
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_zero = gl.zeros([BLOCK_M2, BLOCK_N], gl.float32, s_layout)
    for it in range(b_start, b_end):
        s = it % STAGES
        sp = (it - 1) % STAGES
        mbarrier.wait(k_ready.index(s), (it // STAGES) & 1)
        qk = warpgroup_mma(q_smem, k_bufs.index(s).reshape([BLOCK_N, D]).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        mbarrier.wait(v_ready.index(sp), ((it - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_bufs.index(sp).reshape([BLOCK_N, DV]), acc, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
        p, alpha, m_i, l_i = softmax_block(qk, m_i, l_i, n_lo + it * BLOCK_N, o_m, o_n, MASKED, seqlen_k, off_diag,
                                            0, 0, sm_scale, 1.0, 1.0, (0, 0, 1.0), (), (), False, HAS_RIGHT, False,
                                            0, 0, False, None, None)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        _release(kv_empty, kv_pair, sp)
        p_op = p_operand(p, dtype, p_layout, False)
        acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return acc, m_i, l_i, p_op


@gluon.jit
def consumer(o_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, kv_pair, lse_ptr, stride_lb,
             stride_lh, num_pairs, num_heads, seqlen_q, seqlen_k, off_diag, sm_scale, WG: gl.constexpr,
             BLOCK_M: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr, HAS_RIGHT: gl.constexpr,
             REVERSE_M: gl.constexpr, RETURN_LSE: gl.constexpr):
    """Consumer warpgroup WG of each CTA: its 2 * BLOCK_M logical rows (BLOCK_M in each CTA) of the pair tile."""
    WG_ROWS: gl.constexpr = 2 * BLOCK_M
    PAIR_ROWS: gl.constexpr = NUM_CONSUMERS * WG_ROWS
    D: gl.constexpr = q_bufs.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    DV: gl.constexpr = o_desc.block_type.shape[3]
    dtype: gl.constexpr = q_bufs.dtype
    INSTR_K: gl.constexpr = 256 // dtype.primitive_bitwidth
    gl.static_assert(DV == D, "O is staged in the Q buffer: Dv must equal D")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, INSTR_K], cga_layout=ROW_SPLIT)
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DV, INSTR_K], cga_layout=ROW_SPLIT)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                 k_width=32 // dtype.primitive_bitwidth)
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)

    i_pair, i_bh = _pair_of(num_pairs, REVERSE_M)
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    m0_pair, n_lo, n_blocks = _pair_keys(i_pair, seqlen_q, seqlen_k, off_diag, PAIR_ROWS, BLOCK_N, HAS_RIGHT)
    m0 = m0_pair + WG * WG_ROWS
    m_last = gl.minimum(m0 + WG_ROWS, seqlen_q) - 1
    _, _, full_lo, full_hi = _key_range(m0, m_last, seqlen_k, off_diag, 0, 0, BLOCK_N, False, HAS_RIGHT)
    # the pair's blocks split by this warpgroup's logical rows: masked [0, b1), unmasked [b1, b2), masked [b2, n)
    b_full_lo = gl.minimum(gl.maximum(gl.cdiv(full_lo - n_lo, BLOCK_N), 0), n_blocks)
    b_full_hi = gl.minimum(gl.maximum((full_hi - n_lo) // BLOCK_N, b_full_lo), n_blocks)
    if m0 >= seqlen_q:  # no row of this warpgroup exists: mask every block (nothing is stored)
        b_full_lo = 0
        b_full_hi = 0

    q_smem = q_bufs.index(WG).reshape([WG_ROWS, D])
    o_m = m0 + gl.arange(0, WG_ROWS, layout=s_row)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([WG_ROWS], float("-inf"), gl.float32, layout=s_row)
    l_i = gl.zeros([WG_ROWS], gl.float32, layout=s_row)
    acc = gl.zeros([WG_ROWS, DV], gl.float32, layout=o_layout)
    p_op = p_operand(gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout), dtype, p_layout, False)
    mbarrier.wait(q_ready, 0)
    if n_blocks > 0:  # block 0: its scores alone (masked whichever range it is in)
        mbarrier.wait(k_ready.index(0), 0)
        qk = warpgroup_mma(q_smem, k_bufs.index(0).reshape([BLOCK_N, D]).permute((1, 0)),
                           gl.zeros([WG_ROWS, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        p, _alpha0, m_i, l_i = softmax_block(qk, m_i, l_i, n_lo, o_m, o_n, True, seqlen_k, off_diag, 0, 0, sm_scale,
                                              1.0, 1.0, (0, 0, 1.0), (), (), False, HAS_RIGHT, False, 0, 0, False,
                                              None, None)
        p_op = p_operand(p, dtype, p_layout, False)
    b1 = gl.maximum(b_full_lo, 1)
    b2 = gl.maximum(b_full_hi, b1)
    acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, n_lo, 1, b1, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready,
                                 v_ready, kv_empty, kv_pair, seqlen_k, off_diag, sm_scale, True, HAS_RIGHT, STAGES,
                                 s_layout, o_layout, p_layout)
    acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, n_lo, b1, b2, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready,
                                 v_ready, kv_empty, kv_pair, seqlen_k, off_diag, sm_scale, False, HAS_RIGHT, STAGES,
                                 s_layout, o_layout, p_layout)
    acc, m_i, l_i, p_op = _steps(acc, m_i, l_i, p_op, n_lo, b2, n_blocks, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready,
                                 v_ready, kv_empty, kv_pair, seqlen_k, off_diag, sm_scale, True, HAS_RIGHT, STAGES,
                                 s_layout, o_layout, p_layout)
    if n_blocks > 0:  # the last block's p.v
        sp = (n_blocks - 1) % STAGES
        mbarrier.wait(v_ready.index(sp), ((n_blocks - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_bufs.index(sp).reshape([BLOCK_N, DV]), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        _release(kv_empty, kv_pair, sp)

    # rows that saw no key: l = 0, acc = 0 -> out 0, lse -inf
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    out = acc / gl.convert_layout(l_safe, o_row)[:, None]
    o_buf = q_bufs.index(WG)  # this warpgroup's Q is no longer read (its last wgmma was waited on)
    o_buf.reshape([WG_ROWS, DV]).store(out.to(o_desc.dtype))
    fence_async_shared()
    tma.async_store(o_desc, [i_b, m0, i_h, 0], o_buf)
    if RETURN_LSE:  # natural log, as the 1-CTA kernel's. o_m holds the warpgroup's logical rows: split by the
        # layout's cga_layout, each CTA stores its own 64 (rows past Sq masked)
        lse = gl.where(seen, (m_i * sm_scale + gl.log2(l_safe)) * LN2, float("-inf"))
        gl.store(lse_ptr + i_b.to(gl.int64) * stride_lb + i_h.to(gl.int64) * stride_lh + o_m, lse,
                 mask=o_m < seqlen_q)
    tma.store_wait(pendings=0)


@gluon.jit
def attn_fwd_cluster_sm90_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, stride_lb, stride_lh, seqlen_q, seqlen_k,
                                 num_heads, group_size, sm_scale, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                                 CONSUMER_REGS: gl.constexpr, HAS_RIGHT: gl.constexpr, REVERSE_M: gl.constexpr,
                                 RETURN_LSE: gl.constexpr):
    """Grid: (cdiv(Sq, 4 * BLOCK_M) * B * Hq,) clusters; num_warps = 4, num_ctas = 2.

    q/o over [B, Sq, Hq, D] with block [1, 2 * BLOCK_M, 1, D] and cga_layout [[0, 1, 0, 0]]; k/v over
    [B, Sk, Hkv, D] with block [1, BLOCK_N, 1, D] and cga_layout [[0, 0, 0, 0]]. sm_scale: scale * log2 e.
    HAS_RIGHT: causal, top-left aligned (query i sees key j <= i). group_size = Hq // Hkv. RETURN_LSE: lse
    [B, Hq, Sq] float32 (natural log; strides stride_lb, stride_lh, 1) is written, else lse_ptr is not read."""
    gl.static_assert(gl.num_ctas() == 2, "a cluster of two CTAs")
    gl.static_assert(STAGES >= 2, "a warpgroup releases block b after waiting for block b + 1: two stages at least")
    NUM_CONSUMERS: gl.constexpr = 2
    num_pairs = gl.cdiv(seqlen_q, 2 * NUM_CONSUMERS * BLOCK_M)
    off_diag = 0  # top-left alignment

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [NUM_CONSUMERS] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = mbarrier.allocate_mbarrier()
    k_ready = mbarrier.allocate_mbarrier(batch=STAGES)
    v_ready = mbarrier.allocate_mbarrier(batch=STAGES)
    kv_empty = mbarrier.allocate_mbarrier(batch=STAGES)
    kv_pair = mbarrier.allocate_mbarrier(batch=STAGES, two_ctas=True)
    mbarrier.init(q_ready, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=NUM_CONSUMERS)
        mbarrier.init(kv_pair.index(s), count=NUM_CONSUMERS)  # per CTA: the lead's barrier counts 2 * this

    gl.warp_specialize([
        (consumer, (o_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, kv_pair, lse_ptr,
                    stride_lb, stride_lh, num_pairs, num_heads, seqlen_q, seqlen_k, off_diag, sm_scale, 0, BLOCK_M,
                    STAGES, NUM_CONSUMERS, HAS_RIGHT, REVERSE_M, RETURN_LSE)),
        (consumer, (o_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, kv_pair, lse_ptr,
                    stride_lb, stride_lh, num_pairs, num_heads, seqlen_q, seqlen_k, off_diag, sm_scale, 1, BLOCK_M,
                    STAGES, NUM_CONSUMERS, HAS_RIGHT, REVERSE_M, RETURN_LSE)),
        (loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, kv_pair,
                  num_pairs, num_heads, group_size, seqlen_q, seqlen_k, off_diag, BLOCK_M, STAGES, NUM_CONSUMERS,
                  HAS_RIGHT, REVERSE_M)),
    ], [4, 1], [CONSUMER_REGS, 24])
