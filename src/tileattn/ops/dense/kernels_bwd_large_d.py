"""Triton kernels of dense attention backward for large head dims: the split backward's score kernel
(bwd_scores_kernel, at the end; launch_bwd_large_d.py) and the fused slice kernels that serve varlen problems
with D or Dv above 256, up to 512 (described here).

kernels_bwd.py's algorithm and schedule (FlashAttention-2's, deterministic, no atomics) with the head dim cut
as the large-D forward cuts it (kernels_large_d.py), so that no tile grows with the head dim:
  - the scores S = Q K^T and dP = dO V^T of a [BLOCK_M, BLOCK_N] tile are summed over chunks of BLOCK_K
    head-dim columns (Q, K, dO and V chunks are loaded per step, mostly from L2);
  - the gradients' head dim is cut into slices of BLOCK_S columns, one slice per program: a dK/dV program
    holds dK[:, slice] and dV[:, slice] (a slice past D or Dv stores nothing of that one), a dQ program holds
    dQ[:, slice]. Grid axis 0 enumerates (block, slice) with the slices of one block adjacent: they read the
    same rows from L2 at about the same time. Every slice recomputes S and dP: n slices cost n - 1 extra
    pairs of products over the whole head dim.
Masking, GQA and varlen are kernels_bwd.py's (its helpers compute the probabilities and dZ from the scores; the
programs' walks over their blocks are common/bwd_kernels.py's query_steps / key_steps, as kernels_bwd.py's).
"""
import triton
import triton.language as tl

from ..common.bwd_kernels import (
    batch_base,
    batch_bases,
    key_steps,
    load_rows,
    masked_step,
    query_steps,
    row_stats,
    seq_rows,
)
from ..common.masking import key_range
from .kernels_bwd import dscores_of, probs_of


@triton.jit
def _chunked_dot(a_base, a_rows, a_stride, a_ok, b_base, b_rows, b_stride, b_ok, ncols: tl.constexpr,
                 BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    """A B^T [BLOCK_A, BLOCK_B] float32 for row-major A and B of ncols columns, summed over BLOCK_K chunks."""
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_A, BLOCK_B], ACC)
    for c0 in range(0, ncols, BLOCK_K):
        a = load_rows(a_base, a_rows, a_stride, a_ok, c0 + o_k, ncols)
        b = load_rows(b_base, b_rows, b_stride, b_ok, c0 + o_k, ncols)
        acc = tl.dot(a, tl.trans(b), acc, out_dtype=ACC)
    return acc


@triton.jit
def _dkdv_step(dk, dv, hk, hv, krows, n_ok, m0, q0, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, stride_ks,
               stride_vs, o_n, o_s, s0, seqlen_q, seqlen_k, off_diag, left, right, qk_scale, softcap_scale,
               softcap_out, D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               MASKED: tl.constexpr, ACC: tl.constexpr):
    """(dK, dV)[:, slice] plus query block m0's contribution."""
    o_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = o_m < seqlen_q
    qrows = (q0 + o_m).to(tl.int64)
    lse, delta = row_stats(LSE, DELTA, hl, o_m, m_ok)
    st = _chunked_dot(hk, krows, stride_ks, n_ok, hq, qrows, stride_qs, m_ok, D, BLOCK_N, BLOCK_M, BLOCK_K, ACC)
    pt, t = probs_of(st, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
                     HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, MASKED, True)
    dpt = _chunked_dot(hv, krows, stride_vs, n_ok, hdo, qrows, stride_ds, m_ok, DV_, BLOCK_N, BLOCK_M, BLOCK_K, ACC)
    dzt = dscores_of(pt, t, dpt, delta, HAS_SOFTCAP, True)
    do_s = load_rows(hdo, qrows, stride_ds, m_ok, s0 + o_s, DV_)
    q_s = load_rows(hq, qrows, stride_qs, m_ok, s0 + o_s, D)
    dv = tl.dot(pt.to(do_s.dtype), do_s, dv, out_dtype=ACC)
    dk = tl.dot(dzt.to(q_s.dtype), q_s, dk, out_dtype=ACC)
    return dk, dv


@triton.jit
def bwd_dkdv_large_d_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_db, stride_ds, stride_dh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh, cu_q, cu_k, seqlen_q, seqlen_k, num_kv_heads, group_size, num_bh,
    scale, qk_scale, softcap_scale, softcap_out, left, right,
    D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr, NUM_SLICES: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    ALIGN_BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr, NEEDS_MASK: tl.constexpr,
    ACC: tl.constexpr = tl.float32,
):
    """Grid (key blocks * NUM_SLICES, B * Hkv folded over y and z). dK and dV columns [s0, s0 + BLOCK_S) of one
    key block, summed over the kv head's query heads (kernels_bwd.bwd_dkdv_kernel's schedule)."""
    i_n = tl.program_id(0) // NUM_SLICES
    s0 = (tl.program_id(0) % NUM_SLICES) * BLOCK_S
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    i_b = i_bh // num_kv_heads
    i_hk = (i_bh % num_kv_heads).to(tl.int64)
    q0, k0, seqlen_q, seqlen_k = seq_rows(i_b, cu_q, cu_k, seqlen_q, seqlen_k, IS_VARLEN)
    n0 = i_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    qb, kb, vb, db, lb = batch_bases(i_b, q0, stride_qb, stride_kb, stride_vb, stride_db, stride_lb, IS_VARLEN)
    dkb, dvb = batch_base(i_b, stride_dkb, IS_VARLEN), batch_base(i_b, stride_dvb, IS_VARLEN)
    off_diag = 0
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    o_n = n0 + tl.arange(0, BLOCK_N)
    o_s = tl.arange(0, BLOCK_S)
    n_ok = o_n < seqlen_k
    krows = (k0 + o_n).to(tl.int64)
    hk, hv = K + kb + i_hk * stride_kh, V + vb + i_hk * stride_vh
    dk = tl.zeros([BLOCK_N, BLOCK_S], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_S], ACC)
    m_lo, f_lo, f_hi, n_before, n_masked = query_steps(n0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M,
                                                       BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK)
    for g in range(0, group_size):
        i_h = i_hk * group_size + g
        hq, hdo, hl = Q + qb + i_h * stride_qh, DO + db + i_h * stride_dh, lb + i_h * stride_lh
        for m0 in range(f_lo, f_hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, hk, hv, krows, n_ok, m0, q0, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds,
                                stride_ks, stride_vs, o_n, o_s, s0, seqlen_q, seqlen_k, off_diag, left, right,
                                qk_scale, softcap_scale, softcap_out, D, DV_, BLOCK_M, BLOCK_N, BLOCK_K, HAS_LEFT,
                                HAS_RIGHT, HAS_SOFTCAP, False, ACC)
        if NEEDS_MASK:
            for i in range(0, n_masked):
                m0 = masked_step(i, m_lo, f_hi, n_before, BLOCK_M)
                dk, dv = _dkdv_step(dk, dv, hk, hv, krows, n_ok, m0, q0, hq, hdo, LSE, DELTA, hl, stride_qs,
                                    stride_ds, stride_ks, stride_vs, o_n, o_s, s0, seqlen_q, seqlen_k, off_diag, left,
                                    right, qk_scale, softcap_scale, softcap_out, D, DV_, BLOCK_M, BLOCK_N, BLOCK_K,
                                    HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, True, ACC)
    cols = s0 + o_s
    tl.store(DK + dkb + i_hk * stride_dkh + krows[:, None] * stride_dks + cols[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=n_ok[:, None] & (cols < D)[None, :])
    tl.store(DV + dvb + i_hk * stride_dvh + krows[:, None] * stride_dvs + cols[None, :],
             dv.to(DV.dtype.element_ty), mask=n_ok[:, None] & (cols < DV_)[None, :])


@triton.jit
def _dq_step(dq, hq, qrows, m_ok, hdo, lse, delta, n0, k0, hk, hv, stride_qs, stride_ds, stride_ks, stride_vs, o_m,
             o_s, s0, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out, D: tl.constexpr,
             DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, MASKED: tl.constexpr,
             ACC: tl.constexpr):
    """dQ[:, slice] plus key block n0's contribution."""
    o_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = o_n < seqlen_k
    krows = (k0 + o_n).to(tl.int64)
    s = _chunked_dot(hq, qrows, stride_qs, m_ok, hk, krows, stride_ks, n_ok, D, BLOCK_M, BLOCK_N, BLOCK_K, ACC)
    p, t = probs_of(s, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
                    HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, MASKED, False)
    dp = _chunked_dot(hdo, qrows, stride_ds, m_ok, hv, krows, stride_vs, n_ok, DV_, BLOCK_M, BLOCK_N, BLOCK_K, ACC)
    k_s = load_rows(hk, krows, stride_ks, n_ok, s0 + o_s, D)
    return tl.dot(dscores_of(p, t, dp, delta, HAS_SOFTCAP, False).to(k_s.dtype), k_s, dq, out_dtype=ACC)


@triton.jit
def bwd_dq_large_d_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_db, stride_ds, stride_dh, stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh, cu_q, cu_k, seqlen_q, seqlen_k, num_heads, group_size, num_bh,
    scale, qk_scale, softcap_scale, softcap_out, left, right,
    D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr, NUM_SLICES: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    ALIGN_BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr, NEEDS_MASK: tl.constexpr,
    ACC: tl.constexpr = tl.float32,
):
    """Grid (query blocks * NUM_SLICES, B * Hq folded over y and z). dQ columns [s0, s0 + BLOCK_S) of one query
    block (kernels_bwd.bwd_dq_kernel's schedule)."""
    i_m = tl.program_id(0) // NUM_SLICES
    s0 = (tl.program_id(0) % NUM_SLICES) * BLOCK_S
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    i_b = i_bh // num_heads
    i_h = (i_bh % num_heads).to(tl.int64)
    i_hk = i_h // group_size
    q0, k0, seqlen_q, seqlen_k = seq_rows(i_b, cu_q, cu_k, seqlen_q, seqlen_k, IS_VARLEN)
    m0 = i_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    qb, kb, vb, db, lb = batch_bases(i_b, q0, stride_qb, stride_kb, stride_vb, stride_db, stride_lb, IS_VARLEN)
    dqb = batch_base(i_b, stride_dqb, IS_VARLEN)
    off_diag = 0
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    o_m = m0 + tl.arange(0, BLOCK_M)
    o_s = tl.arange(0, BLOCK_S)
    m_ok = o_m < seqlen_q
    qrows = (q0 + o_m).to(tl.int64)
    hq, hdo = Q + qb + i_h * stride_qh, DO + db + i_h * stride_dh
    lse, delta = row_stats(LSE, DELTA, lb + i_h * stride_lh, o_m, m_ok)
    lo, full_lo, full_hi, n_before, n_masked = key_steps(m0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M,
                                                         BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK)
    hk, hv = K + kb + i_hk * stride_kh, V + vb + i_hk * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_S], ACC)
    for n0 in range(full_lo, full_hi, BLOCK_N):
        dq = _dq_step(dq, hq, qrows, m_ok, hdo, lse, delta, n0, k0, hk, hv, stride_qs, stride_ds, stride_ks,
                      stride_vs, o_m, o_s, s0, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
                      D, DV_, BLOCK_M, BLOCK_N, BLOCK_K, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, False, ACC)
    if NEEDS_MASK:
        for i in range(0, n_masked):
            n0 = masked_step(i, lo, full_hi, n_before, BLOCK_N)
            dq = _dq_step(dq, hq, qrows, m_ok, hdo, lse, delta, n0, k0, hk, hv, stride_qs, stride_ds, stride_ks,
                          stride_vs, o_m, o_s, s0, seqlen_k, off_diag, left, right, qk_scale, softcap_scale,
                          softcap_out, D, DV_, BLOCK_M, BLOCK_N, BLOCK_K, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, True, ACC)
    cols = s0 + o_s
    tl.store(DQ + dqb + i_h * stride_dqh + qrows[:, None] * stride_dqs + cols[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & (cols < D)[None, :])


@triton.jit
def hidden_tile_read(r0, c0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q, seqlen_k, off_diag, left, right,
                     KEY_RANGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr,
                     HAS_RIGHT: tl.constexpr):
    """Whether a GEMM piece of the split backward reads the tile of rows m0 + r0 + [0, BLOCK_M) and keys
    n0 + c0 + [0, BLOCK_N) that the rule hides (a score kernel then stores zeros there): the dQ piece of its rows
    (row_piece rows counted from m0, against the keys they see) or the dK / dV piece of its keys (key_piece keys
    counted from n0, against the rows that see them). KEY_RANGE: masking.key_range (the Gluon score kernel passes
    its Gluon copy; both score kernels share this rule with launch_bwd_large_d's pieces)."""
    pa = m0 + (r0 // row_piece) * row_piece  # the tile's dQ piece: rows [pa, pb), and the keys they see
    pb = tl.minimum(pa + row_piece, m0 + rows)
    lo, hi, _, _ = KEY_RANGE(pa, pb - 1, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    needed = (n0 + c0 < hi) & (n0 + c0 + BLOCK_N > lo)
    ka = n0 + (c0 // key_piece) * key_piece  # its dK / dV piece: keys [ka, kb), and the rows that see them
    kb = tl.minimum(ka + key_piece, n0 + cols)
    r_lo = 0
    r_hi = seqlen_q
    if HAS_RIGHT:
        r_lo = ka - off_diag - right
    if HAS_LEFT:
        r_hi = kb - off_diag + left
    return needed | ((m0 + r0 < r_hi) & (m0 + r0 + BLOCK_M > r_lo))


@triton.jit
def bwd_scores_kernel(
    Q, K, V, DO, LSE, DELTA, P, DS,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_db, stride_ds, stride_dh, stride_lb, stride_lh,
    b0, hq0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q, seqlen_k, heads_chunk, group_size, num_bh,
    scale, qk_scale, softcap_scale, softcap_out, left, right,
    D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIGN_BOTTOM_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    NEEDS_MASK: tl.constexpr, ACC: tl.constexpr = tl.float32,
):
    """The split backward's first step (launch_bwd_large_d.py): P and dZ' * scale of one chunk, written to the
    workspaces P and DS ([chunk batches * chunk kv heads, rows, group_size, cols], contiguous) for query rows
    [m0, m0 + rows) and keys [n0, n0 + cols) of batches from b0 and query heads from hq0. Grid (row tiles * key
    tiles, chunk batches * chunk query heads folded over y and z). S = Q K^T and dP = dO V^T are summed over
    BLOCK_K head-dim columns. Tiles the rule hides entirely store zeros without a product, and only where a
    GEMM piece reads them (dQ's pieces: row_piece rows against the keys they see; dK's and dV's: key_piece keys
    against the rows that see them; both multiples of the tiles, counted from m0 and n0)."""
    tiles_n = tl.cdiv(cols, BLOCK_N)
    i_m = tl.program_id(0) // tiles_n
    i_n = tl.program_id(0) % tiles_n
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    i_b = (b0 + i_bh // heads_chunk).to(tl.int64)
    i_h = (hq0 + i_bh % heads_chunk).to(tl.int64)
    i_hk = i_h // group_size
    off_diag = 0
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    r0 = i_m * BLOCK_M
    c0 = i_n * BLOCK_N
    o_m = m0 + r0 + tl.arange(0, BLOCK_M)
    o_n = n0 + c0 + tl.arange(0, BLOCK_N)
    m_ok = o_m < m0 + rows
    n_ok = o_n < n0 + cols
    # [unit, row, head of the group, key]: a unit's rows of its g query heads interleaved, as q's [S, H] rows
    i_u, i_g = i_bh // group_size, i_bh % group_size
    ws = ((i_u.to(tl.int64) * rows + (o_m - m0).to(tl.int64)[:, None]) * group_size + i_g) * cols + (o_n - n0)[None, :]
    ws_ok = m_ok[:, None] & n_ok[None, :]
    visible = True
    if NEEDS_MASK:  # the keys the tile's rows see at all (key_range's bounds, rounded to BLOCK_N multiples)
        lo, hi, _, _ = key_range(m0 + r0, m0 + r0 + BLOCK_M - 1, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT,
                                 HAS_RIGHT)
        visible = (n0 + c0 < hi) & (n0 + c0 + BLOCK_N > lo)
    if visible:
        lse, delta = row_stats(LSE, DELTA, i_b * stride_lb + i_h * stride_lh, o_m, m_ok)
        if not NEEDS_MASK:  # rows past the chunk (never stored) get finite values instead of inf * 0
            lse = tl.where(m_ok, lse, 0.0)
        qrows, krows = o_m.to(tl.int64), o_n.to(tl.int64)
        hq, hdo = Q + i_b * stride_qb + i_h * stride_qh, DO + i_b * stride_db + i_h * stride_dh
        hk, hv = K + i_b * stride_kb + i_hk * stride_kh, V + i_b * stride_vb + i_hk * stride_vh
        s = _chunked_dot(hq, qrows, stride_qs, m_ok, hk, krows, stride_ks, n_ok, D, BLOCK_M, BLOCK_N, BLOCK_K, ACC)
        p, t = probs_of(s, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale,
                        softcap_out, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, NEEDS_MASK, False)
        tl.store(P + ws, p.to(P.dtype.element_ty), mask=ws_ok)
        dp = _chunked_dot(hdo, qrows, stride_ds, m_ok, hv, krows, stride_vs, n_ok, DV_, BLOCK_M, BLOCK_N, BLOCK_K,
                          ACC)
        tl.store(DS + ws, (dscores_of(p, t, dp, delta, HAS_SOFTCAP, False) * scale).to(DS.dtype.element_ty),
                 mask=ws_ok)
    else:
        if hidden_tile_read(r0, c0, m0, n0, rows, cols, row_piece, key_piece, seqlen_q, seqlen_k, off_diag, left,
                            right, key_range, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT):
            zero = tl.zeros([BLOCK_M, BLOCK_N], P.dtype.element_ty)
            tl.store(P + ws, zero, mask=ws_ok)
            tl.store(DS + ws, zero, mask=ws_ok)
