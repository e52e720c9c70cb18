"""Hopper (sm90) score kernel of the split backward (launch_bwd_large_d.py) in Gluon: P and dZ' * scale of a
chunk, as kernels_bwd_large_d.bwd_scores_kernel computes them, with the operands kept where the work needs them.

Why a second kernel: at D = 256 the Triton score kernel re-reads its Q and dO rows from L2 for every key tile
(128 x 64 tiles over 64-column chunks of the head dim: 44 FLOPs per byte read), which holds it near 270
TFLOPS-equivalent; and it writes each tile from registers while its next products wait. Here a CTA owns 128 query
rows of one (batch, query head): each consumer warpgroup holds its 64 rows of Q and dO in registers (the wgmmas' A
operands, 128 registers per thread at D = 256), so only K and V stream through shared memory (64-key tiles, 128
FLOPs per byte, as the forward's D = 256 kernel), in a ring of SLOTS [64, D] slots deep enough to hide the loads.
P and dZ' leave through TMA stores that overlap the next tile's products. Partitions:
  - loader (1 warp): ring positions 0-3 are the CTA's Q and dO (two 64-row halves each), then K and V of each key
    tile the rows can see (ready barriers; a slot is refilled once both consumers have arrived on its empty one);
  - two consumer warpgroups, 64 rows each: Q and dO from the ring into registers, then per key tile
    S = Q K^T and dP = dO V^T by wgmma (K = the whole head dim), and
        P = exp2(S * scale * log2 e - lse * log2 e),   dZ' * scale = P (dP - delta) scale
    (a softcap: S -> tanh(S * scale / cap) * cap, and P times 1 - tanh^2 in dZ'), masked by the rule where a tile is cut
    by it; each result is staged in the warpgroup's own buffer and stored by TMA, and the buffer is written again
    only once that store has read it (store_wait with one store left in flight: P's and dZ''s alternate).
  - Key tiles the rows cannot see are stored as zeros where a GEMM piece of the chunk reads them (the rule both
    score kernels share: kernels_bwd_large_d.hidden_tile_read), without products.
Under triton 3.9 (DO_SHARED below), in masked kernels only (causal, windows: launch_bwd_large_d._scores), dO
stays in two slots for the whole CTA as dP's A operand from shared memory and the ring has the other four: 3.9
copies a register A operand before each wgmma, and with Q and dO both held in registers its ptxas spilled in the
step loop (unmasked kernels keep dO in registers and their 124 bytes of spills: measured faster).
Workspaces [units, rows, group, cols] in q's dtype (launch_bwd_large_d._scores; the column pitch a multiple of 8
for TMA), their descriptors clip rows and columns past the chunk; rows past Sq get p = 0 (lse read as +inf), as
do rows that saw no key (lse = -inf). Masking model: masking.py.
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

from ..common import masking, softmax
from ..common.gluon_compat import RS_OPERAND_COPIES, tma_load, tma_store
from .kernels_bwd_large_d import hidden_tile_read

LOG2E = gl.constexpr(softmax.LOG2E)
_tanh = gluon.jit(softmax.tanh.fn)
_key_range = gluon.jit(masking.key_range.fn)
_hidden_tile_read = gluon.jit(hidden_tile_read.fn)
# dO as dP's A operand from shared memory (the kernel's DO_SHARED) where the triton copies a wgmma's register A
# operand before it (RS_OPERAND_COPIES: triton 3.9). With Q and dO in registers, ptxas 13.4 (3.9's for sm90)
# spilled 124 bytes (468 causal) in the step loop, ptxas 13.0 and 12.8 none; with dO in shared memory none.
# The ring's K / V tiles in flight go from three to two (dO's slots are kept). Measured on an H200 under 3.9 with
# ptxas 13.4 (2026-11-28, `scripts/sweep.py bwd-large-d --dims 256 --seqlens 4096,8192`, ms, registers / shared):
# causal 4K 7.09 / 6.76, 8K 26.75 / 25.53 (+5%); non-causal 4K 9.98 / 10.33, 8K 39.42 / 40.17 (-2..-3%, the
# fewer tiles in flight cost more than the 124 bytes of spills). So launch_bwd_large_d takes it for masked
# kernels only (causal, windows: the larger spills).
DO_SHARED = RS_OPERAND_COPIES


@gluon.jit
def _cta(num_m, heads_chunk, group_size, b0, hq0, REVERSE_M: gl.constexpr):
    """(row tile, batch, query head, unit, head of the group) of this CTA: row tiles are the fast index (the CTAs
    in flight share a unit's K and V in L2), the heaviest first under a causal rule (REVERSE_M)."""
    pid = gl.program_id(0)
    i_m = pid % num_m
    if REVERSE_M:
        i_m = num_m - 1 - i_m
    i_bh = pid // num_m
    return i_m, b0 + i_bh // heads_chunk, hq0 + i_bh % heads_chunk, i_bh // group_size, i_bh % group_size


@gluon.jit
def _tiles(r0, m0, n0, cols, seqlen_k, off_diag, left, right, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr,
           HAS_RIGHT: gl.constexpr):
    """(first column, tiles) of the key tiles (chunk columns, BLOCK_N wide from column 0) that rows m0 + r0 ..
    m0 + r0 + 127 can see: loader and consumers must agree on them."""
    lo, hi, _, _ = _key_range(m0 + r0, m0 + r0 + 127, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    c_lo = (gl.maximum(lo - n0, 0) // BLOCK_N) * BLOCK_N
    c_hi = gl.minimum(hi - n0, cols)
    return c_lo, gl.cdiv(gl.maximum(c_hi - c_lo, 0), BLOCK_N)


@gluon.jit
def _slot(pos, NS: gl.constexpr, PIN: gl.constexpr):
    """(slot, earlier tiles of that slot) of ring position pos: the ring cycles through slots PIN .. NS - 1 (slots
    below PIN hold dO for the whole CTA: DO_SHARED)."""
    if PIN == 0:
        return pos % NS, pos // NS
    else:
        return PIN + pos % (NS - PIN), pos // (NS - PIN)


@gluon.jit
def _load(desc, coord, bufs, ready, empty, pos, PIN: gl.constexpr):
    """One tile into ring position pos (_slot) once the consumers have handed that slot back."""
    NS: gl.constexpr = bufs.shape[0]
    s, use = _slot(pos, NS, PIN)
    mbarrier.wait(empty.index(s), (use & 1) ^ 1)  # fresh slots pass
    mbarrier.expect(ready.index(s), desc.block_type.nbytes)
    tma_load(desc, coord, ready.index(s), bufs.index(s))


@gluon.jit
def _loader(q_desc, k_desc, v_desc, do_desc, bufs, ready, empty, num_m, heads_chunk, group_size, b0, hq0, m0, n0,
            cols, seqlen_k, off_diag, left, right, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
            REVERSE_M: gl.constexpr, DO_SHARED: gl.constexpr):
    """Ring positions 0-3: the two 64-row halves of Q, then of dO; then K and V of each key tile the CTA's rows
    can see, K at 4 + 2 * tile, V after it. DO_SHARED: dO's halves in slots 0 and 1 for good, the ring (Q at
    positions 0-1, K and V from 2) in the other slots."""
    PIN: gl.constexpr = 2 if DO_SHARED else 0
    KV0: gl.constexpr = 2 if DO_SHARED else 4
    DO0: gl.constexpr = 0 if DO_SHARED else 2
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    i_m, i_b, i_h, _, _ = _cta(num_m, heads_chunk, group_size, b0, hq0, REVERSE_M)
    i_hk = i_h // group_size
    r0 = i_m * 128
    for w in gl.static_range(2):
        _load(q_desc, [i_b, m0 + r0 + w * 64, i_h, 0], bufs, ready, empty, w, PIN)
    for w in gl.static_range(2):
        _load(do_desc, [i_b, m0 + r0 + w * 64, i_h, 0], bufs, ready, empty, DO0 + w, 0)
    c_lo, n_it = _tiles(r0, m0, n0, cols, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    for it in range(n_it):
        key = n0 + c_lo + it * BLOCK_N
        _load(k_desc, [i_b, key, i_hk, 0], bufs, ready, empty, KV0 + 2 * it, PIN)
        _load(v_desc, [i_b, key, i_hk, 0], bufs, ready, empty, KV0 + 1 + 2 * it, PIN)


@gluon.jit
def _stage_store(desc, buf, x, coord):
    """x into this warpgroup's staging buffer once its last store has read it (the other buffer's store may still
    be in flight), then its TMA store."""
    tma.store_wait(pendings=1)
    buf.reshape([x.shape[0], x.shape[1]]).store(x.to(desc.dtype))
    fence_async_shared()
    tma_store(desc, coord, buf)


@gluon.jit
def _wait(bufs, ready, pos, PIN: gl.constexpr):
    """The slot of ring position pos (_slot) once its tile has landed, as a [rows, D] matrix."""
    NS: gl.constexpr = bufs.shape[0]
    s, use = _slot(pos, NS, PIN)
    mbarrier.wait(ready.index(s), use & 1)
    return bufs.index(s).reshape([bufs.shape[2], bufs.shape[4]])


@gluon.jit
def _consumer(p_desc, ds_desc, bufs, p_bufs, ds_bufs, ready, empty, lse_ptr, delta_ptr, stride_lb, stride_lh, num_m,
              heads_chunk, group_size, b0, hq0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q, seqlen_k, off_diag,
              left, right, scale, qk_scale, softcap_scale, softcap_out, WG: gl.constexpr, HAS_LEFT: gl.constexpr,
              HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, NEEDS_MASK: gl.constexpr, REVERSE_M: gl.constexpr,
              DO_SHARED: gl.constexpr):
    """This warpgroup's 64 rows: every visible key tile's P and dZ' * scale, then zeros where a hidden tile is read.
    DO_SHARED: dO stays in its slot, the A operand of dP from shared memory (_loader)."""
    BLOCK_N: gl.constexpr = bufs.shape[2]
    NS: gl.constexpr = bufs.shape[0]
    PIN: gl.constexpr = 2 if DO_SHARED else 0
    KV0: gl.constexpr = 2 if DO_SHARED else 4
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    i_m, i_b, i_h, i_u, i_g = _cta(num_m, heads_chunk, group_size, b0, hq0, REVERSE_M)
    r0 = i_m * 128
    rw = r0 + WG * 64  # this warpgroup's first row, chunk-relative
    o_m = m0 + rw + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
    m_ok = o_m < seqlen_q
    off = i_b.to(gl.int64) * stride_lb + i_h.to(gl.int64) * stride_lh
    lse = gl.load(lse_ptr + off + o_m, mask=m_ok, other=float("inf"))
    lse = gl.where(lse == float("-inf"), float("inf"), lse * LOG2E)  # p = 0 past Sq and where no key is seen
    delta = gl.load(delta_ptr + off + o_m, mask=m_ok, other=0.0)
    c_lo, n_it = _tiles(r0, m0, n0, cols, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    full_lo = 0
    full_hi = 0
    if NEEDS_MASK:  # the tiles this warpgroup's rows see whole (absolute keys)
        _, _, full_lo, full_hi = _key_range(m0 + rw, m0 + rw + 63, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT,
                                            HAS_RIGHT)
    # Q and dO of this warpgroup's rows into registers (the wgmmas' A operands: shared memory then carries only
    # the B operands, and the four slots go back to the ring); every warpgroup hands back all four slots.
    # DO_SHARED: dO stays in its slot as dP's A operand, Q's two slots go back
    q = _wait(bufs, ready, WG, PIN).load(a_layout)
    # the slots this warpgroup does not read are waited on too: a ready barrier's parity wait tells its phases
    # apart only if each waiter sees every one (skipped, the wait for the slot's next tile could pass on this one's
    # phase while it is still loading: wrong tiles in 1 of ~3 runs on the H100)
    if DO_SHARED:  # (dO's slots are never handed back)
        do = _wait(bufs, ready, WG, 0)
        for i in gl.static_range(2):
            _wait(bufs, ready, i, PIN)
            mbarrier.arrive(empty.index(PIN + i))
            _wait(bufs, ready, i, 0)
    else:
        do = _wait(bufs, ready, 2 + WG, 0).load(a_layout)
        for i in gl.static_range(4):
            _wait(bufs, ready, i, 0)
            mbarrier.arrive(empty.index(i % NS))
    p_buf = p_bufs.index(WG)
    ds_buf = ds_bufs.index(WG)
    zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
    for it in range(n_it):
        c = c_lo + it * BLOCK_N
        pos = KV0 + 2 * it
        sc = warpgroup_mma(q, _wait(bufs, ready, pos, PIN).permute((1, 0)), zero, use_acc=False, is_async=True)
        if not HAS_SOFTCAP:  # dP under the softmax (with a softcap its accumulator, tanh's and P's tiles spilled
            # registers; it is issued once P is stored)
            dp = warpgroup_mma(do, _wait(bufs, ready, pos + 1, PIN).permute((1, 0)), zero, use_acc=False,
                               is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=1, deps=(sc, ))
        else:
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc, ))
        mbarrier.arrive(empty.index(_slot(pos, NS, PIN)[0]))
        if HAS_SOFTCAP:
            th = _tanh(sc * softcap_scale)
            p = gl.exp2(th * softcap_out - lse[:, None])
        else:
            p = gl.exp2(sc * qk_scale - lse[:, None])
        if NEEDS_MASK:
            if (n0 + c < full_lo) | (n0 + c + BLOCK_N > full_hi):  # a tile the rule cuts
                o_n = n0 + c + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
                vis = (o_n < seqlen_k)[None, :] & m_ok[:, None]
                if HAS_RIGHT:
                    vis = vis & (o_n[None, :] <= (o_m + off_diag + right)[:, None])
                if HAS_LEFT:
                    vis = vis & (o_n[None, :] >= (o_m + off_diag - left)[:, None])
                p = gl.where(vis, p, 0.0)
        coord = [i_u, rw, i_g, c]
        _stage_store(p_desc, p_buf, p, coord)
        if HAS_SOFTCAP:
            p = p * (1.0 - th * th)  # (one tile across the dP wait instead of two)
            dp = warpgroup_mma(do, _wait(bufs, ready, pos + 1, PIN).permute((1, 0)), zero, use_acc=False,
                               is_async=True)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        mbarrier.arrive(empty.index(_slot(pos + 1, NS, PIN)[0]))
        _stage_store(ds_desc, ds_buf, p * (dp - delta[:, None]) * scale, coord)
    if NEEDS_MASK:  # hidden tiles a GEMM piece reads: zeros from the P buffer (no products)
        tma.store_wait(pendings=0)
        p_buf.reshape([64, BLOCK_N]).store(gl.zeros([64, BLOCK_N], p_desc.dtype, s_layout))
        fence_async_shared()
        for t in range(gl.cdiv(cols, BLOCK_N)):
            c = t * BLOCK_N
            hidden = (c < c_lo) | (c >= c_lo + n_it * BLOCK_N)
            if hidden:
                if _hidden_tile_read(r0, c, m0, n0, rows, cols, row_piece, key_piece, seqlen_q, seqlen_k,
                                     off_diag, left, right, _key_range, 128, BLOCK_N, HAS_LEFT, HAS_RIGHT):
                    tma_store(p_desc, [i_u, rw, i_g, c], p_buf)
                    tma_store(ds_desc, [i_u, rw, i_g, c], p_buf)
    tma.store_wait(pendings=0)


@gluon.jit
def bwd_scores_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, p_desc, ds_desc, lse_ptr, delta_ptr, stride_lb, stride_lh,
    b0, hq0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q, seqlen_k, heads_chunk, group_size, num_m,
    scale, qk_scale, softcap_scale, softcap_out, left, right,
    SLOTS: gl.constexpr, CONSUMER_REGS: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
    ALIGN_BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, NEEDS_MASK: gl.constexpr,
    DO_SHARED: gl.constexpr = False,
):
    """Grid (num_m * units * group_size,): num_m = cdiv(rows, 128) row tiles of query rows [m0, m0 + rows) for each
    (unit, head of the group) of the chunk (batches from b0, query heads from hq0, heads_chunk query heads per
    batch); keys [n0, n0 + cols). num_warps = 4 (the first consumer warpgroup).

    Descriptors: q, do over [B, Sq, Hq, D] with block [1, 64, 1, D]; k, v over [B, Sk, Hkv, D] with block
    [1, BLOCK_N, 1, D], BLOCK_N = 64 (the ring's SLOTS slots take either); p, ds over the workspaces
    [units, rows, group_size, cols] with block [1, 64, 1, BLOCK_N]. lse, delta [B, Hq, Sq] float32 (same
    strides). row_piece, key_piece: the GEMM pieces (multiples of 128 counted from m0 and n0). scale, qk_scale,
    softcap_scale, softcap_out: as bwd.py passes them (qk_scale = scale * log2 e,
    or 1 with a softcap, whose softcap_out carries log2 e)."""
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    else:
        off_diag = 0
    dtype: gl.constexpr = q_desc.dtype
    REVERSE_M: gl.constexpr = HAS_RIGHT  # later rows see more keys: start them first
    gl.static_assert(q_desc.block_type.shape == k_desc.block_type.shape, "Q / dO halves and K / V tiles share slots")
    gl.static_assert(SLOTS >= 4, "Q and dO take four slots at once")
    bufs = gl.allocate_shared_memory(dtype, [SLOTS] + k_desc.block_type.shape, k_desc.layout)
    p_bufs = gl.allocate_shared_memory(dtype, [2] + p_desc.block_type.shape, p_desc.layout)
    ds_bufs = gl.allocate_shared_memory(dtype, [2] + ds_desc.block_type.shape, ds_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(SLOTS):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # both consumer warpgroups
    gl.warp_specialize([
        (_consumer, (p_desc, ds_desc, bufs, p_bufs, ds_bufs, ready, empty, lse_ptr, delta_ptr, stride_lb, stride_lh,
                     num_m, heads_chunk, group_size, b0, hq0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q,
                     seqlen_k, off_diag, left, right, scale, qk_scale, softcap_scale, softcap_out, 0, HAS_LEFT,
                     HAS_RIGHT, HAS_SOFTCAP, NEEDS_MASK, REVERSE_M, DO_SHARED)),
        (_consumer, (p_desc, ds_desc, bufs, p_bufs, ds_bufs, ready, empty, lse_ptr, delta_ptr, stride_lb, stride_lh,
                     num_m, heads_chunk, group_size, b0, hq0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q,
                     seqlen_k, off_diag, left, right, scale, qk_scale, softcap_scale, softcap_out, 1, HAS_LEFT,
                     HAS_RIGHT, HAS_SOFTCAP, NEEDS_MASK, REVERSE_M, DO_SHARED)),
        (_loader, (q_desc, k_desc, v_desc, do_desc, bufs, ready, empty, num_m, heads_chunk, group_size, b0, hq0, m0,
                   n0, cols, seqlen_k, off_diag, left, right, HAS_LEFT, HAS_RIGHT, REVERSE_M, DO_SHARED)),
    ], [4, 1], [CONSUMER_REGS, 24])
