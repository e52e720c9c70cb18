"""Triton kernels of dense attention backward (FlashAttention-2's algorithm), deterministic by construction.

With the forward's log-sum-exp (natural log) the probabilities are recomputed block by block:
    P = exp(Z - lse),  Z = scale * Q K^T  (or cap * tanh(scale * Q K^T / cap) with a softcap)
    dV = P^T dO,  dP = dO V^T,  dZ = P * (dP - delta),  delta = rowsum(dO * O) - dlse
    dQ = scale * (dZ * Z') K,  dK = scale * (dZ * Z')^T Q   (Z' = 1 - tanh^2 with a softcap, else 1)
`bwd_preprocess_kernel` (ops/common/bwd_kernels.py) computes delta (dlse: the gradient reaching the returned lse, if
any).
`bwd_dkdv_kernel`: one program per (key block, batch * kv head) walks the query blocks that see its keys, for
every query head of its group (GQA/MQA: dK and dV summed over the group inside the program, no atomics).
`bwd_dq_kernel`: one program per (query block, batch * query head) walks its key blocks.
No atomic adds anywhere, so gradients are bit-identical from run to run.

Masking model, layouts and the varlen convention are those of the forward (ops/common/masking.py) (key j visible to
query i iff i + OFF - LEFT <= j <= i + OFF + RIGHT and j < Sk); lse / delta are [B, Hq, Sq] (varlen [Hq, total_q]).
"""
import triton
import triton.language as tl

from ..common.bwd_kernels import k_axis, key_steps, load_rows, masked_step, q_axis, query_steps, row_stats, seq_rows
from ..common.softmax import tanh

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def dscores_of(p, t, dp, delta, HAS_SOFTCAP: tl.constexpr, TRANS: tl.constexpr):
    """dZ' = P * (dP - delta) (* (1 - tanh^2) with a softcap) from dP = dO V^T (TRANS: of a transposed tile,
    [keys, queries])."""
    dz = p * (dp - q_axis(delta, TRANS))
    if HAS_SOFTCAP:
        dz = dz * (1.0 - t * t)
    return dz


@triton.jit
def _dscores(p, t, do, v, delta, HAS_SOFTCAP: tl.constexpr, TRANS: tl.constexpr, ACC: tl.constexpr):
    """dZ' = P * (dO V^T - delta) (* (1 - tanh^2) with a softcap): the gradient of the raw scores / scale
    (TRANS: of a transposed tile, [keys, queries])."""
    if TRANS:
        dp = tl.dot(v, tl.trans(do), out_dtype=ACC)
    else:
        dp = tl.dot(do, tl.trans(v), out_dtype=ACC)
    return dscores_of(p, t, dp, delta, HAS_SOFTCAP, TRANS)


@triton.jit
def _probs(q, k, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
           HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, MASKED: tl.constexpr,
           TRANS: tl.constexpr, ACC: tl.constexpr):
    """(P [BLOCK_M, BLOCK_N] float32, tanh term): recomputed probabilities. MASKED: 0 where the rule hides a key
    or for rows that saw nothing (lse = -inf); else the caller knows every (row, key) of the tile is visible.
    TRANS: P^T [BLOCK_N, BLOCK_M] (the dK/dV kernel's orientation: its dots then take P^T and dZ^T from
    registers as they are, where P would need a transpose through shared memory)."""
    if TRANS:
        s = tl.dot(k, tl.trans(q), out_dtype=ACC)
    else:
        s = tl.dot(q, tl.trans(k), out_dtype=ACC)
    return probs_of(s, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
                    HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, MASKED, TRANS)


@triton.jit
def probs_of(s, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
             HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, MASKED: tl.constexpr,
             TRANS: tl.constexpr):
    """_probs from the raw scores s = Q K^T (TRANS: K Q^T)."""
    if HAS_SOFTCAP:
        t = tanh(s * softcap_scale)
        z2 = t * softcap_out
    else:
        t = s
        z2 = s * qk_scale
    if MASKED:
        # the visibility rule of kernels.visible, in either orientation
        vis = k_axis(o_n < seqlen_k, TRANS) & q_axis(m_ok & (lse > float("-inf")), TRANS)
        if HAS_RIGHT:
            vis = vis & (k_axis(o_n, TRANS) <= q_axis(o_m + off_diag + right, TRANS))
        if HAS_LEFT:
            vis = vis & (k_axis(o_n, TRANS) >= q_axis(o_m + off_diag - left, TRANS))
        p = tl.where(vis, tl.exp2(z2 - q_axis(lse * LOG2E, TRANS)), 0.0)
    else:
        p = tl.exp2(z2 - q_axis(lse * LOG2E, TRANS))
    return p, t


@triton.jit
def _dkdv_step(dk, dv, k, v, m0, q0, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, o_n, o_d, o_dv, seqlen_q,
               seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out, D: tl.constexpr,
               DV_: tl.constexpr, BLOCK_M: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
               HAS_SOFTCAP: tl.constexpr, MASKED: tl.constexpr, ACC: tl.constexpr):
    """(dK, dV) plus query block m0's contribution (hq, hdo: the head's q / dO; hl: its lse / delta offset)."""
    o_m = m0 + tl.arange(0, BLOCK_M)
    m_ok = o_m < seqlen_q
    qrows = (q0 + o_m).to(tl.int64)
    q = load_rows(hq, qrows, stride_qs, m_ok, o_d, D)
    do = load_rows(hdo, qrows, stride_ds, m_ok, o_dv, DV_)
    lse, delta = row_stats(LSE, DELTA, hl, o_m, m_ok)
    pt, t = _probs(q, k, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale,
                   softcap_out, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, MASKED, True, ACC)
    dv = tl.dot(pt.to(do.dtype), do, dv, out_dtype=ACC)
    dk = tl.dot(_dscores(pt, t, do, v, delta, HAS_SOFTCAP, True, ACC).to(q.dtype), q, dk, out_dtype=ACC)
    return dk, dv


@triton.jit
def bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_db, stride_ds, stride_dh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    stride_lb, stride_lh, cu_q, cu_k, seqlen_q, seqlen_k, num_kv_heads, group_size, num_bh,
    scale, qk_scale, softcap_scale, softcap_out, left, right,
    D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIGN_BOTTOM_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr, NEEDS_MASK: tl.constexpr, ACC: tl.constexpr = tl.float32,
):
    """Grid (key blocks, B * Hkv folded over y and z). dK, dV of one key block, summed over the kv head's query
    heads. Tiles inside the visibility rule run unmasked; NEEDS_MASK (the launcher: a rule or partial tiles)
    adds the loop over the tiles it cuts, masked."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    i_b = i_bh // num_kv_heads
    i_hk = (i_bh % num_kv_heads).to(tl.int64)
    q0, k0, seqlen_q, seqlen_k = seq_rows(i_b, cu_q, cu_k, seqlen_q, seqlen_k, IS_VARLEN)
    n0 = i_n * BLOCK_N
    if n0 >= seqlen_k:
        return
    if IS_VARLEN:
        qb, kb, vb, db, dkb, dvb, lb = 0, 0, 0, 0, 0, 0, q0.to(tl.int64)
    else:
        b64 = i_b.to(tl.int64)
        qb, kb, vb, db = b64 * stride_qb, b64 * stride_kb, b64 * stride_vb, b64 * stride_db
        dkb, dvb, lb = b64 * stride_dkb, b64 * stride_dvb, b64 * stride_lb
    off_diag = 0
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    o_n = n0 + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    n_ok = o_n < seqlen_k
    krows = (k0 + o_n).to(tl.int64)
    k = load_rows(K + kb + i_hk * stride_kh, krows, stride_ks, n_ok, o_d, D)
    v = load_rows(V + vb + i_hk * stride_vh, krows, stride_vs, n_ok, o_dv, DV_)
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], ACC)
    # the query blocks that see these keys, [m_lo, m_hi), and the unmasked ones [f_lo, f_hi); the rest
    # ([m_lo, f_lo) and [f_hi, m_hi)) runs masked
    m_lo, f_lo, f_hi, n_before, n_masked = query_steps(n0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M,
                                                       BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK)
    for g in range(0, group_size):
        i_h = i_hk * group_size + g  # int64 (i_hk is): head offsets of head-major layouts can pass 2^31
        hq, hdo, hl = Q + qb + i_h * stride_qh, DO + db + i_h * stride_dh, lb + i_h * stride_lh
        for m0 in range(f_lo, f_hi, BLOCK_M):
            dk, dv = _dkdv_step(dk, dv, k, v, m0, q0, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, o_n, o_d, o_dv,
                                seqlen_q, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out, D,
                                DV_, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, False, ACC)
        if NEEDS_MASK:
            for i in range(0, n_masked):
                m0 = masked_step(i, m_lo, f_hi, n_before, BLOCK_M)
                dk, dv = _dkdv_step(dk, dv, k, v, m0, q0, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, o_n, o_d,
                                    o_dv, seqlen_q, seqlen_k, off_diag, left, right, qk_scale, softcap_scale,
                                    softcap_out, D, DV_, BLOCK_M, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, True, ACC)
    tl.store(DK + dkb + i_hk * stride_dkh + krows[:, None] * stride_dks + o_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=n_ok[:, None] & (o_d < D)[None, :])
    tl.store(DV + dvb + i_hk * stride_dvh + krows[:, None] * stride_dvs + o_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=n_ok[:, None] & (o_dv < DV_)[None, :])


@triton.jit
def _dq_step(dq, q, do, lse, delta, n0, k0, hk, hv, stride_ks, stride_vs, o_m, m_ok, o_d, o_dv, seqlen_k, off_diag,
             left, right, qk_scale, softcap_scale, softcap_out, D: tl.constexpr, DV_: tl.constexpr,
             BLOCK_N: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
             MASKED: tl.constexpr, ACC: tl.constexpr):
    """dQ plus key block n0's contribution (hk, hv: the kv head's K / V)."""
    o_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = o_n < seqlen_k
    krows = (k0 + o_n).to(tl.int64)
    k = load_rows(hk, krows, stride_ks, n_ok, o_d, D)
    v = load_rows(hv, krows, stride_vs, n_ok, o_dv, DV_)
    p, t = _probs(q, k, lse, o_m, o_n, m_ok, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
                  HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, MASKED, False, ACC)
    return tl.dot(_dscores(p, t, do, v, delta, HAS_SOFTCAP, False, ACC).to(k.dtype), k, dq, out_dtype=ACC)


@triton.jit
def bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_db, stride_ds, stride_dh, stride_dqb, stride_dqs, stride_dqh,
    stride_lb, stride_lh, cu_q, cu_k, seqlen_q, seqlen_k, num_heads, group_size, num_bh,
    scale, qk_scale, softcap_scale, softcap_out, left, right,
    D: tl.constexpr, DV_: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIGN_BOTTOM_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr, NEEDS_MASK: tl.constexpr, ACC: tl.constexpr = tl.float32,
):
    """Grid (query blocks, B * Hq folded over y and z). dQ of one query block (NEEDS_MASK as bwd_dkdv_kernel)."""
    i_m = tl.program_id(0)
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
    if IS_VARLEN:
        qb, kb, vb, db, dqb, lb = 0, 0, 0, 0, 0, q0.to(tl.int64)
    else:
        b64 = i_b.to(tl.int64)
        qb, kb, vb, db = b64 * stride_qb, b64 * stride_kb, b64 * stride_vb, b64 * stride_db
        dqb, lb = b64 * stride_dqb, b64 * stride_lb
    off_diag = 0
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    o_m = m0 + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_ok = o_m < seqlen_q
    qrows = (q0 + o_m).to(tl.int64)
    q = load_rows(Q + qb + i_h * stride_qh, qrows, stride_qs, m_ok, o_d, D)
    do = load_rows(DO + db + i_h * stride_dh, qrows, stride_ds, m_ok, o_dv, DV_)
    lse, delta = row_stats(LSE, DELTA, lb + i_h * stride_lh, o_m, m_ok)
    lo, full_lo, full_hi, n_before, n_masked = key_steps(m0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M,
                                                         BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK)
    hk, hv = K + kb + i_hk * stride_kh, V + vb + i_hk * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    for n0 in range(full_lo, full_hi, BLOCK_N):
        dq = _dq_step(dq, q, do, lse, delta, n0, k0, hk, hv, stride_ks, stride_vs, o_m, m_ok, o_d, o_dv, seqlen_k,
                      off_diag, left, right, qk_scale, softcap_scale, softcap_out, D, DV_, BLOCK_N, HAS_LEFT,
                      HAS_RIGHT, HAS_SOFTCAP, False, ACC)
    if NEEDS_MASK:
        for i in range(0, n_masked):
            n0 = masked_step(i, lo, full_hi, n_before, BLOCK_N)
            dq = _dq_step(dq, q, do, lse, delta, n0, k0, hk, hv, stride_ks, stride_vs, o_m, m_ok, o_d, o_dv,
                          seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out, D, DV_, BLOCK_N,
                          HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, True, ACC)
    tl.store(DQ + dqb + i_h * stride_dqh + qrows[:, None] * stride_dqs + o_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & (o_d < D)[None, :])
