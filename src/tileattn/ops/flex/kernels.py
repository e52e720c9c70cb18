"""Portable Triton kernel of flex attention forward: block-sparse, with a traced score_mod / mask_mod inlined.

Program (query block of BLOCK_M rows, batch * query head). Its key blocks come from the block mask's row for
the query block (torch's BlockMask: kv_num_blocks / kv_indices are the partial blocks, where mask_mod runs;
full_kv_num_blocks / full_kv_indices the blocks fully inside the mask, where it does not); without a block
mask (DENSE) every key block is full. A mask block of KV_BLOCK keys is walked in BLOCK_N-key tiles.

Per tile: s = scale * q.k (float32), s = score_mod(s, b, h, q_idx, kv_idx), masked to -inf where mask_mod is
false (partial blocks) or kv_idx >= Sk; the online softmax runs in base 2 (s times log2 e). Rows that see no
key end with out = 0 and lse = -inf. SCORE_MOD / MASK_MOD are @triton.jit functions made by trace.py; CAPS_S /
CAPS_M their captured tensors (pointer, sizes, strides).
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, offs_m, offs_n, d_ok, dv_ok, b, h, seqlen_k, stride_kn, stride_vn,
          scale, caps_s, caps_m, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, APPLY_MASK: tl.constexpr):
    kv_idx = n0 + offs_n
    n_ok = kv_idx < seqlen_k
    k = tl.load(k_ptrs + n0 * stride_kn, mask=n_ok[None, :] & d_ok[:, None], other=0.0)
    s = tl.dot(q, k) * scale
    if SCORE_MOD is not None:
        s = SCORE_MOD(s, b, h, offs_m[:, None], kv_idx[None, :], offs_m.to(tl.float32)[:, None],
                      kv_idx.to(tl.float32)[None, :], caps_s)
    keep = n_ok[None, :]
    if APPLY_MASK:
        if MASK_MOD is not None:
            keep = keep & MASK_MOD(b, h, offs_m[:, None], kv_idx[None, :], offs_m.to(tl.float32)[:, None],
                                   kv_idx.to(tl.float32)[None, :], caps_m)
    s = tl.where(keep, s * LOG2E, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptrs + n0 * stride_vn, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _blocks(acc, m_i, l_i, q, k_ptrs, v_ptrs, NUM, IDX, num_off, idx_off, offs_m, offs_n, d_ok, dv_ok, b, h,
            seqlen_k, stride_kn, stride_vn, scale, caps_s, caps_m, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
            APPLY_MASK: tl.constexpr, KV_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    """The mask blocks listed in IDX (NUM of them) for this program's query block."""
    count = tl.load(NUM + num_off)
    for i in range(0, count):
        blk = tl.load(IDX + idx_off + i)
        for j in range(0, KV_BLOCK // BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, blk * KV_BLOCK + j * BLOCK_N, offs_m, offs_n,
                                  d_ok, dv_ok, b, h, seqlen_k, stride_kn, stride_vn, scale, caps_s, caps_m,
                                  SCORE_MOD, MASK_MOD, APPLY_MASK)
    return acc, m_i, l_i


@triton.jit
def flex_fwd_kernel(
    Q, K, V, O, LSE, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, caps_s, caps_m,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
    stride_nb, stride_nh, stride_nm, stride_ib, stride_ih, stride_im,
    stride_fnb, stride_fnh, stride_fnm, stride_fib, stride_fih, stride_fim,
    num_heads, group_size, seqlen_q, seqlen_k, head_dim, head_dim_v, scale,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, DENSE: tl.constexpr, HAS_FULL: tl.constexpr,
    Q_BLOCK: tl.constexpr, KV_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """Grid (cdiv(Sq, BLOCK_M), B * Hq). q [B, Hq, Sq, D], k [B, Hkv, Sk, D], v [B, Hkv, Sk, Dv], o like q with
    Dv, lse [B, Hq, Sq] float32 (natural log). Block-mask tensors [Bm, Hm, Q blocks(, KV blocks)] with stride 0
    on a broadcast dim. BLOCK_M divides Q_BLOCK and BLOCK_N divides KV_BLOCK."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    h_kv = h // group_size
    b64 = b.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < head_dim_v
    m_ok = offs_m < seqlen_q
    q = tl.load(Q + b64 * stride_qb + h.to(tl.int64) * stride_qh + offs_m[:, None].to(tl.int64) * stride_qm
                + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    k_ptrs = K + b64 * stride_kb + h_kv.to(tl.int64) * stride_kh + offs_n[None, :].to(tl.int64) * stride_kn \
        + offs_d[:, None]
    v_ptrs = V + b64 * stride_vb + h_kv.to(tl.int64) * stride_vh + offs_n[:, None].to(tl.int64) * stride_vn \
        + offs_dv[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if DENSE:
        for n0 in range(0, seqlen_k, BLOCK_N):
            acc, m_i, l_i = _tile(acc, m_i, l_i, q, k_ptrs, v_ptrs, n0, offs_m, offs_n, d_ok, dv_ok, b, h, seqlen_k,
                                  stride_kn, stride_vn, scale, caps_s, caps_m, SCORE_MOD, MASK_MOD, False)
    else:
        qb = (pid_m * BLOCK_M) // Q_BLOCK
        acc, m_i, l_i = _blocks(acc, m_i, l_i, q, k_ptrs, v_ptrs, KV_NUM, KV_IDX,
                                b * stride_nb + h * stride_nh + qb * stride_nm,
                                b * stride_ib + h * stride_ih + qb * stride_im, offs_m, offs_n, d_ok, dv_ok, b, h,
                                seqlen_k, stride_kn, stride_vn, scale, caps_s, caps_m, SCORE_MOD, MASK_MOD, True,
                                KV_BLOCK, BLOCK_N)
        if HAS_FULL:
            acc, m_i, l_i = _blocks(acc, m_i, l_i, q, k_ptrs, v_ptrs, FULL_NUM, FULL_IDX,
                                    b * stride_fnb + h * stride_fnh + qb * stride_fnm,
                                    b * stride_fib + h * stride_fih + qb * stride_fim, offs_m, offs_n, d_ok, dv_ok,
                                    b, h, seqlen_k, stride_kn, stride_vn, scale, caps_s, caps_m, SCORE_MOD,
                                    MASK_MOD, False, KV_BLOCK, BLOCK_N)

    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    tl.store(O + b64 * stride_ob + h.to(tl.int64) * stride_oh + offs_m[:, None].to(tl.int64) * stride_om
             + offs_dv[None, :], out.to(O.dtype.element_ty), mask=m_ok[:, None] & dv_ok[None, :])
    if RETURN_LSE:
        lse = tl.where(seen, (m_i + tl.log2(l_safe)) * LN2, float("-inf"))
        tl.store(LSE + b64 * stride_lb + h.to(tl.int64) * stride_lh + offs_m, lse, mask=m_ok)
