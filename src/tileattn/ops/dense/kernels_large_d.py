"""Triton kernel of dense attention forward for large head dims (D or Dv above 256, up to 1024).

Shared memory does not grow with the head dim:
  - the scores S = Q K^T of a [BLOCK_M, BLOCK_N] tile are summed over chunks of BLOCK_K head-dim columns;
    each step loads one Q chunk and one K chunk (Q is read again for every key block, mostly from L2), and
    only those chunks are in flight (num_stages of them);
  - the output head dim is cut into slices of BLOCK_DV columns, one slice per program, so the float32
    accumulator [BLOCK_M, BLOCK_DV] stays in registers. Grid axis 0 enumerates (query block, slice) with the
    slices of one query block adjacent: they read the same Q and K rows from L2 at about the same time. Every
    slice recomputes S: a split into n slices costs n - 1 extra Q K^T products (launch_large_d.slices weighs this).
The masking model, the three key ranges (masked / unmasked / masked) and the online softmax are those of
kernels.py, whose helpers this kernel calls.

Loads are pointer loads with the rows clamped into the sequence instead of masked (a clamped key row is a
real, finite key whose score is masked and whose probability is 0). Tensor-descriptor (TMA) loads were
measured too and dropped: several configs gave wrong outputs on the H100 with triton 3.6 (docs/design/large_d.md).

Constexpr options beyond kernels.py's:
    BLOCK_K      head-dim columns of one Q K^T step (EVEN_K: D is a multiple)
    DV_START     first output column of this launch's slices (a second launch may take the last slice)
    BLOCK_DV     output columns of one program (a power of two; EVEN_DV: Dv - DV_START is a multiple)
    BLOCK_DV2    0, or the width of a second, narrower accumulator that takes the columns just after the
                 program's BLOCK_DV (the last slice of Dv = 320 is 256 + 64 columns: one Q K^T for all 320)
    NUM_SLICES   slices of this launch: columns [DV_START, DV_START + NUM_SLICES * (BLOCK_DV + BLOCK_DV2))
"""
import triton
import triton.language as tl

from ..common.masking import key_range, seq_bases, visible
from ..common.softmax import softmax_probs, tanh


@triton.jit
def _tile(src, row_off, cols, c0, ncols, EVEN: tl.constexpr):
    """Tile of Q, K or V: the rows at offsets row_off, head-dim columns c0 + cols (< ncols unless EVEN)."""
    p = src + row_off[:, None] + (c0 + cols)[None, :]
    if EVEN:
        return tl.load(p)
    return tl.load(p, mask=(c0 + cols < ncols)[None, :], other=0.0)


@triton.jit
def _softmax_pv(b_acc, b_acc2, b_l, b_m, b_s, b_v, b_v2, SAFE: tl.constexpr, HAS_DV2: tl.constexpr):
    """kernels._online_softmax_step with a second accumulator (HAS_DV2; b_acc2 and b_v2 unused otherwise)."""
    b_p, b_alpha, b_l, b_m = softmax_probs(b_l, b_m, b_s, SAFE, 0)
    b_p = b_p.to(b_v.dtype)
    b_acc = tl.dot(b_p, b_v, b_acc * b_alpha[:, None])
    if HAS_DV2:
        b_acc2 = tl.dot(b_p, b_v2, b_acc2 * b_alpha[:, None])
    return b_acc, b_acc2, b_l, b_m


@triton.jit
def _key_blocks(b_acc, b_acc2, b_l, b_m, q_src, q_off, k_src, v_src, stride_ks, stride_vs, c0, start_n, end_n,
                o_m, o_n, o_k, o_dv, o_dv2, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
                D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DV2: tl.constexpr, EVEN_K: tl.constexpr,
                EVEN_DV: tl.constexpr, MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                HAS_SOFTCAP: tl.constexpr):
    """Online softmax over the key blocks [start_n, end_n); MASKED applies the visibility rule per element."""
    for n0 in tl.range(start_n, end_n, BLOCK_N):
        rows = n0 + o_n
        if MASKED:
            rows = tl.minimum(rows, seqlen_k - 1)
        k_off = rows.to(tl.int64) * stride_ks
        v_off = rows.to(tl.int64) * stride_vs
        # this slice of V is issued first, its load overlapping the Q K^T steps (loading it after them was
        # slower on the H100, docs/design/large_d.md)
        b_v = _tile(v_src, v_off, o_dv, c0, DV, EVEN_DV)  # [BLOCK_N, BLOCK_DV]
        b_v2 = b_v
        if BLOCK_DV2 > 0:
            b_v2 = _tile(v_src, v_off, o_dv2, c0 + BLOCK_DV, DV, EVEN_DV)  # [BLOCK_N, BLOCK_DV2]
        b_s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for d0 in tl.range(0, D, BLOCK_K):
            b_q = _tile(q_src, q_off, o_k, d0, D, EVEN_K)  # [BLOCK_M, BLOCK_K]
            b_k = _tile(k_src, k_off, o_k, d0, D, EVEN_K)  # [BLOCK_N, BLOCK_K]
            b_s = tl.dot(b_q, tl.trans(b_k), b_s)
        if HAS_SOFTCAP:
            b_s = tanh(b_s * softcap_scale) * softcap_out
        else:
            b_s = b_s * qk_scale
        if MASKED:
            b_s = tl.where(visible(o_m, n0 + o_n, seqlen_k, off_diag, left, right, HAS_LEFT, HAS_RIGHT), b_s,
                           float("-inf"))
        b_acc, b_acc2, b_l, b_m = _softmax_pv(b_acc, b_acc2, b_l, b_m, b_s, b_v, b_v2, MASKED, BLOCK_DV2 > 0)
    return b_acc, b_acc2, b_l, b_m


@triton.jit
def attn_fwd_large_d_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    cu_seqlens_q, cu_seqlens_k,
    seqlen_q, seqlen_k, num_heads, group_size, num_bh,
    qk_scale, softcap_scale, softcap_out, left, right,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DV_START: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_DV2: tl.constexpr, NUM_SLICES: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIGN_BOTTOM_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr, RETURN_LSE: tl.constexpr, REVERSE_M: tl.constexpr,
):
    """Grid: (cdiv(max Sq, BLOCK_M) * NUM_SLICES, Y, Z) with Y * Z >= num_bh = B * Hq. One program computes the
    output tile of one query block and one slice of Dv (BLOCK_DV + BLOCK_DV2 columns); the first slice also
    writes the lse (RETURN_LSE is only set on the launch with DV_START = 0)."""
    EVEN_K: tl.constexpr = D % BLOCK_K == 0
    SLICE: tl.constexpr = BLOCK_DV + BLOCK_DV2
    EVEN_DV: tl.constexpr = (DV - DV_START) % SLICE == 0
    DV2_TILE: tl.constexpr = BLOCK_DV2 if BLOCK_DV2 > 0 else 16  # the unused second accumulator's shape
    i_m = tl.program_id(0) // NUM_SLICES
    i_c = tl.program_id(0) % NUM_SLICES
    if REVERSE_M:
        i_m = tl.num_programs(0) // NUM_SLICES - 1 - i_m
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    i_hk = i_h // group_size

    seqlen_q, seqlen_k, _, q_base, k_base, v_base, o_base, l_base = seq_bases(
        i_b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, stride_qb, stride_qs, stride_kb, stride_ks,
        stride_vb, stride_vs, stride_ob, stride_os, stride_lb, IS_VARLEN)
    m0 = i_m * BLOCK_M
    if m0 >= seqlen_q:
        return
    c0 = DV_START + i_c * SLICE

    o_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] query positions
    o_n = tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    o_dv = tl.arange(0, BLOCK_DV)
    o_dv2 = tl.arange(0, DV2_TILE)
    m_m = o_m < seqlen_q
    # rows past the sequence read its last row (their outputs are not stored)
    q_off = tl.minimum(o_m, seqlen_q - 1).to(tl.int64) * stride_qs

    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    else:
        off_diag = 0
    lo, hi, full_lo, full_hi = key_range(m0, m0 + BLOCK_M - 1, seqlen_k, off_diag, left, right, BLOCK_N,
                                         HAS_LEFT, HAS_RIGHT)
    q_src = Q + q_base + i_h.to(tl.int64) * stride_qh
    k_src = K + k_base + i_hk.to(tl.int64) * stride_kh
    v_src = V + v_base + i_hk.to(tl.int64) * stride_vh

    b_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    b_acc2 = tl.zeros([BLOCK_M, DV2_TILE], dtype=tl.float32)  # unused without BLOCK_DV2
    for part in tl.static_range(3):  # masked, unmasked, masked
        if part == 0:
            start_n = lo
            end_n = full_lo
        elif part == 1:
            start_n = full_lo
            end_n = full_hi
        else:
            start_n = full_hi
            end_n = hi
        b_acc, b_acc2, b_l, b_m = _key_blocks(
            b_acc, b_acc2, b_l, b_m, q_src, q_off, k_src, v_src, stride_ks, stride_vs, c0, start_n, end_n, o_m,
            o_n, o_k, o_dv, o_dv2, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out, D, DV,
            BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_DV, BLOCK_DV2, EVEN_K, EVEN_DV, part != 1, HAS_LEFT, HAS_RIGHT,
            HAS_SOFTCAP)

    # rows that saw no key: l = 0, acc = 0 -> out 0, lse -inf
    b_seen = b_l > 0.0
    b_inv = 1.0 / tl.where(b_seen, b_l, 1.0)
    p_o = O + o_base + i_h.to(tl.int64) * stride_oh + o_m.to(tl.int64)[:, None] * stride_os
    _store(p_o, b_acc * b_inv[:, None], o_dv, c0, DV, m_m, EVEN_DV)
    if BLOCK_DV2 > 0:
        _store(p_o, b_acc2 * b_inv[:, None], o_dv2, c0 + BLOCK_DV, DV, m_m, EVEN_DV)
    if RETURN_LSE:
        if i_c == 0:
            b_lse = tl.where(b_seen, (b_m + tl.log2(tl.where(b_seen, b_l, 1.0))) * 0.6931471805599453,
                             float("-inf"))
            tl.store(LSE + l_base + i_h.to(tl.int64) * stride_lh + o_m, b_lse, mask=m_m)


@triton.jit
def _store(p_rows, x, cols, c0, ncols, row_ok, EVEN: tl.constexpr):
    p = p_rows + (c0 + cols)[None, :]
    if EVEN:
        tl.store(p, x.to(p_rows.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(p, x.to(p_rows.dtype.element_ty), mask=row_ok[:, None] & (c0 + cols < ncols)[None, :])
