"""Portable Triton kernels of flex attention backward: the dense backward's algorithm (ops/dense/kernels_bwd.py)
over a block mask, with the score_mod's derivative inlined. Deterministic (no atomics).

With the forward's lse (natural log), per tile of scaled scores s = scale * q.k:
    z, z' = SCORE_GRAD(s, b, h, q_idx, kv_idx)   (score_mod's value and d z / d s; z = s, z' = 1 without one)
    P = exp(z - lse) where visible (0 elsewhere), dV += P^T dO, dS = P * (dO V^T - delta) * z'
    dK += scale * dS^T Q,  dQ += scale * dS K        (delta = rowsum(dO * O) - dlse: ops/dense's preprocess)
`flex_bwd_dkdv_kernel`: one program per (BLOCK_N keys, batch * kv head) walks the query blocks of the block
mask's transposed lists (torch's BlockMask q_num_blocks / q_indices: partial blocks, mask_mod applied;
full_q_num_blocks / full_q_indices: full blocks) for every query head of its group (GQA: dK, dV summed in the
program). `flex_bwd_dq_kernel`: one program per (BLOCK_M queries, batch * query head) walks the forward lists.
Layouts are the forward's (kernels.py): q / dq [B, Hq, Sq, D], k / dk [B, Hkv, Sk, D], v / dv [B, Hkv, Sk, Dv],
lse / delta [B, Hq, Sq] float32. EVEN (Sq, Sk multiples of the mask's blocks): full tiles need no bounds mask;
LOAD_EVEN (EVEN and head dims powers of two): no load needs a mask. ROW64: row offsets in int64 (the launcher
found S * row stride >= 2^31), else int32.
"""
import triton
import triton.language as tl

from ..common.bwd_kernels import k_axis, load_rows, q_axis, row_index, row_stats

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _dscores(q, k, do, v, lse, delta, b, h, o_m, o_n, m_ok, n_ok, scale, caps_s, caps_m, SCORE_GRAD: tl.constexpr,
             MASK_MOD: tl.constexpr, APPLY_MASK: tl.constexpr, EVEN: tl.constexpr, TRANS: tl.constexpr):
    """(P, dS) of one [BLOCK_M, BLOCK_N] tile, float32 (dS: the gradient of the scaled scores); TRANS: both
    transposed, [BLOCK_N, BLOCK_M] (the dK/dV kernel's orientation, see ops/dense/bwd_kernels._probs)."""
    qi, ki = q_axis(o_m, TRANS), k_axis(o_n, TRANS)
    qf, kf = q_axis(o_m.to(tl.float32), TRANS), k_axis(o_n.to(tl.float32), TRANS)  # (lowering.py: FloatIndex)
    if TRANS:
        s = tl.dot(k, tl.trans(q)) * scale
    else:
        s = tl.dot(q, tl.trans(k)) * scale
    if SCORE_GRAD is not None:
        z, dz = SCORE_GRAD(s, b, h, qi, ki, qf, kf, caps_s)
    else:
        z = s
        dz = 1.0
    # a row that saw nothing has lse -inf: use 0 so its scores (-inf wherever it is not masked) give P = 0
    p = tl.exp2((z - q_axis(tl.where(lse == float("-inf"), 0.0, lse), TRANS)) * LOG2E)
    if APPLY_MASK or not EVEN:
        keep = q_axis(m_ok, TRANS) & k_axis(n_ok, TRANS)
        if APPLY_MASK and MASK_MOD is not None:
            keep = keep & MASK_MOD(b, h, qi, ki, qf, kf, caps_m)
        p = tl.where(keep, p, 0.0)
    if TRANS:
        dp = tl.dot(v, tl.trans(do))
    else:
        dp = tl.dot(do, tl.trans(v))
    ds = p * (dp - q_axis(delta, TRANS)) * dz
    if SCORE_GRAD is not None and (APPLY_MASK or not EVEN):  # a derivative that is not finite where hidden
        ds = tl.where(keep, ds, 0.0)
    return p, ds


@triton.jit
def _dkdv_tile(dk, dv, k, v, o_m, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, b, h, o_n, n_ok, o_d, o_dv,
               seqlen_q, head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD: tl.constexpr,
               MASK_MOD: tl.constexpr, APPLY_MASK: tl.constexpr, EVEN: tl.constexpr, LOAD_EVEN: tl.constexpr,
               ROW64: tl.constexpr):
    """dK, dV plus the contribution of query rows o_m."""
    m_ok = o_m < seqlen_q
    rows = row_index(o_m, ROW64)
    q = load_rows(hq, rows, stride_qs, m_ok, o_d, head_dim, LOAD_EVEN)
    do = load_rows(hdo, rows, stride_ds, m_ok, o_dv, head_dim_v, LOAD_EVEN)
    lse, delta = row_stats(LSE, DELTA, hl, o_m, m_ok)
    pt, dst = _dscores(q, k, do, v, lse, delta, b, h, o_m, o_n, m_ok, n_ok, scale, caps_s, caps_m, SCORE_GRAD,
                       MASK_MOD, APPLY_MASK, EVEN, True)
    dv += tl.dot(pt.to(do.dtype), do)
    dk += tl.dot(dst.to(q.dtype), q)
    return dk, dv


@triton.jit
def _dkdv_blocks(dk, dv, k, v, NUM, IDX, num_off, idx_off, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, b, h,
                 o_n, n_ok, o_d, o_dv, seqlen_q, head_dim, head_dim_v, scale, caps_s, caps_m,
                 SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr, APPLY_MASK: tl.constexpr, EVEN: tl.constexpr,
                 LOAD_EVEN: tl.constexpr, ROW64: tl.constexpr, Q_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr):
    """dK, dV plus the contributions of the query blocks listed in IDX (NUM of them)."""
    PER: tl.constexpr = Q_BLOCK // BLOCK_M
    for i in range(0, tl.load(NUM + num_off) * PER):  # one flat loop over tiles (it pipelines, a nested one not)
        o_m = tl.load(IDX + idx_off + i // PER) * Q_BLOCK + (i % PER) * BLOCK_M + tl.arange(0, BLOCK_M)
        dk, dv = _dkdv_tile(dk, dv, k, v, o_m, hq, hdo, LSE, DELTA, hl, stride_qs, stride_ds, b, h, o_n, n_ok, o_d,
                            o_dv, seqlen_q, head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD, MASK_MOD,
                            APPLY_MASK, EVEN, LOAD_EVEN, ROW64)
    return dk, dv


@triton.jit
def flex_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, Q_NUM, Q_IDX, FULL_NUM, FULL_IDX, caps_s, caps_m,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm, stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    stride_lb, stride_lh, stride_nb, stride_nh, stride_nm, stride_ib, stride_ih, stride_im,
    stride_fnb, stride_fnh, stride_fnm, stride_fib, stride_fih, stride_fim,
    num_kv_heads, group_size, seqlen_q, seqlen_k, head_dim, head_dim_v, scale,
    SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr, DENSE: tl.constexpr, HAS_FULL: tl.constexpr,
    EVEN: tl.constexpr, LOAD_EVEN: tl.constexpr, ROW64: tl.constexpr, Q_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Grid (cdiv(Sk, BLOCK_N), B * Hkv). Block-mask tensors [Bm, Hm, KV blocks(, Q blocks)] (stride 0 on a
    broadcast dim); BLOCK_N divides KV_BLOCK, BLOCK_M divides Q_BLOCK. Without a block mask (DENSE) every
    query block is full (walked in Q_BLOCK steps)."""
    i_n = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // num_kv_heads
    hk = i_bh % num_kv_heads
    b64 = b.to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    n_ok = o_n < seqlen_k
    rows = o_n.to(tl.int64)
    k = load_rows(K + b64 * stride_kb + hk.to(tl.int64) * stride_kh, rows, stride_kn, n_ok, o_d, head_dim)
    v = load_rows(V + b64 * stride_vb + hk.to(tl.int64) * stride_vh, rows, stride_vn, n_ok, o_dv, head_dim_v)
    kvb = (i_n * BLOCK_N) // KV_BLOCK
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    for g in range(0, group_size):
        h = hk * group_size + g
        h64 = h.to(tl.int64)
        hq = Q + b64 * stride_qb + h64 * stride_qh
        hdo = DO + b64 * stride_db + h64 * stride_dh
        hl = b64 * stride_lb + h64 * stride_lh
        if DENSE:
            for m0 in range(0, seqlen_q, BLOCK_M):
                dk, dv = _dkdv_tile(dk, dv, k, v, m0 + tl.arange(0, BLOCK_M), hq, hdo, LSE, DELTA, hl, stride_qm,
                                    stride_dm, b, h, o_n, n_ok, o_d, o_dv, seqlen_q, head_dim, head_dim_v, scale,
                                    caps_s, caps_m, SCORE_GRAD, MASK_MOD, False, EVEN, LOAD_EVEN, ROW64)
        else:
            dk, dv = _dkdv_blocks(dk, dv, k, v, Q_NUM, Q_IDX, b * stride_nb + h * stride_nh + kvb * stride_nm,
                                  b * stride_ib + h * stride_ih + kvb * stride_im, hq, hdo, LSE, DELTA, hl,
                                  stride_qm, stride_dm, b, h, o_n, n_ok, o_d, o_dv, seqlen_q, head_dim, head_dim_v,
                                  scale, caps_s, caps_m, SCORE_GRAD, MASK_MOD, True, EVEN, LOAD_EVEN, ROW64, Q_BLOCK,
                                  BLOCK_M)
            if HAS_FULL:
                dk, dv = _dkdv_blocks(dk, dv, k, v, FULL_NUM, FULL_IDX,
                                      b * stride_fnb + h * stride_fnh + kvb * stride_fnm,
                                      b * stride_fib + h * stride_fih + kvb * stride_fim, hq, hdo, LSE, DELTA, hl,
                                      stride_qm, stride_dm, b, h, o_n, n_ok, o_d, o_dv, seqlen_q, head_dim,
                                      head_dim_v, scale, caps_s, caps_m, SCORE_GRAD, MASK_MOD, False, EVEN, LOAD_EVEN,
                                      ROW64, Q_BLOCK, BLOCK_M)
    tl.store(DK + b64 * stride_dkb + hk.to(tl.int64) * stride_dkh + rows[:, None] * stride_dkn + o_d[None, :],
             (dk * scale).to(DK.dtype.element_ty), mask=n_ok[:, None] & (o_d < head_dim)[None, :])
    tl.store(DV + b64 * stride_dvb + hk.to(tl.int64) * stride_dvh + rows[:, None] * stride_dvn + o_dv[None, :],
             dv.to(DV.dtype.element_ty), mask=n_ok[:, None] & (o_dv < head_dim_v)[None, :])


@triton.jit
def _dq_tile(dq, q, do, lse, delta, o_n, hk, hv, stride_kn, stride_vn, b, h, o_m, m_ok, o_d, o_dv, seqlen_k,
             head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr,
             APPLY_MASK: tl.constexpr, EVEN: tl.constexpr, LOAD_EVEN: tl.constexpr, ROW64: tl.constexpr):
    """dQ plus the contribution of keys o_n."""
    n_ok = o_n < seqlen_k
    k = load_rows(hk, row_index(o_n, ROW64), stride_kn, n_ok, o_d, head_dim, LOAD_EVEN)
    v = load_rows(hv, row_index(o_n, ROW64), stride_vn, n_ok, o_dv, head_dim_v, LOAD_EVEN)
    _, ds = _dscores(q, k, do, v, lse, delta, b, h, o_m, o_n, m_ok, n_ok, scale, caps_s, caps_m, SCORE_GRAD,
                     MASK_MOD, APPLY_MASK, EVEN, False)
    return dq + tl.dot(ds.to(k.dtype), k)


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, NUM, IDX, num_off, idx_off, hk, hv, stride_kn, stride_vn, b, h, o_m, m_ok,
               o_d, o_dv, seqlen_k, head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD: tl.constexpr,
               MASK_MOD: tl.constexpr, APPLY_MASK: tl.constexpr, EVEN: tl.constexpr, LOAD_EVEN: tl.constexpr,
               ROW64: tl.constexpr, KV_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ plus the contributions of the key blocks listed in IDX (NUM of them)."""
    PER: tl.constexpr = KV_BLOCK // BLOCK_N
    for i in range(0, tl.load(NUM + num_off) * PER):  # one flat loop over tiles (it pipelines, a nested one not)
        o_n = tl.load(IDX + idx_off + i // PER) * KV_BLOCK + (i % PER) * BLOCK_N + tl.arange(0, BLOCK_N)
        dq = _dq_tile(dq, q, do, lse, delta, o_n, hk, hv, stride_kn, stride_vn, b, h, o_m, m_ok, o_d, o_dv, seqlen_k,
                      head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD, MASK_MOD, APPLY_MASK, EVEN, LOAD_EVEN,
                      ROW64)
    return dq


@triton.jit
def flex_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, caps_s, caps_m,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_db, stride_dh, stride_dm, stride_dqb, stride_dqh, stride_dqm, stride_lb, stride_lh,
    stride_nb, stride_nh, stride_nm, stride_ib, stride_ih, stride_im,
    stride_fnb, stride_fnh, stride_fnm, stride_fib, stride_fih, stride_fim,
    num_heads, group_size, seqlen_q, seqlen_k, head_dim, head_dim_v, scale,
    SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr, DENSE: tl.constexpr, HAS_FULL: tl.constexpr,
    EVEN: tl.constexpr, LOAD_EVEN: tl.constexpr, ROW64: tl.constexpr, Q_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Grid (cdiv(Sq, BLOCK_M), B * Hq). The forward's block lists [Bm, Hm, Q blocks(, KV blocks)]."""
    i_m = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // num_heads
    h = i_bh % num_heads
    hk = h // group_size
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_ok = o_m < seqlen_q
    rows = o_m.to(tl.int64)
    q = load_rows(Q + b64 * stride_qb + h64 * stride_qh, rows, stride_qm, m_ok, o_d, head_dim)
    do = load_rows(DO + b64 * stride_db + h64 * stride_dh, rows, stride_dm, m_ok, o_dv, head_dim_v)
    lse, delta = row_stats(LSE, DELTA, b64 * stride_lb + h64 * stride_lh, o_m, m_ok)
    hk_ = K + b64 * stride_kb + hk.to(tl.int64) * stride_kh
    hv = V + b64 * stride_vb + hk.to(tl.int64) * stride_vh
    qb = (i_m * BLOCK_M) // Q_BLOCK
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if DENSE:
        for n0 in range(0, seqlen_k, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse, delta, n0 + tl.arange(0, BLOCK_N), hk_, hv, stride_kn, stride_vn, b, h, o_m,
                          m_ok, o_d, o_dv, seqlen_k, head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD,
                          MASK_MOD, False, EVEN, LOAD_EVEN, ROW64)
    else:
        dq = _dq_blocks(dq, q, do, lse, delta, KV_NUM, KV_IDX, b * stride_nb + h * stride_nh + qb * stride_nm,
                        b * stride_ib + h * stride_ih + qb * stride_im, hk_, hv, stride_kn, stride_vn, b, h, o_m,
                        m_ok, o_d, o_dv, seqlen_k, head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD,
                        MASK_MOD, True, EVEN, LOAD_EVEN, ROW64, KV_BLOCK, BLOCK_N)
        if HAS_FULL:
            dq = _dq_blocks(dq, q, do, lse, delta, FULL_NUM, FULL_IDX,
                            b * stride_fnb + h * stride_fnh + qb * stride_fnm,
                            b * stride_fib + h * stride_fih + qb * stride_fim, hk_, hv, stride_kn, stride_vn, b, h,
                            o_m, m_ok, o_d, o_dv, seqlen_k, head_dim, head_dim_v, scale, caps_s, caps_m, SCORE_GRAD,
                            MASK_MOD, False, EVEN, LOAD_EVEN, ROW64, KV_BLOCK, BLOCK_N)
    tl.store(DQ + b64 * stride_dqb + h64 * stride_dqh + rows[:, None] * stride_dqm + o_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & (o_d < head_dim)[None, :])
