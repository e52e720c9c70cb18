"""Triton kernels for dense attention forward.

One kernel serves the batched layout ([B, S, H, D], any strides with a contiguous last dim) and the packed
variable-length layout ([total, H, D] with cumulative sequence lengths).

Masking model (ops/common/masking.py). Key j is visible to query i iff
    i + OFF - LEFT <= j <= i + OFF + RIGHT   and   j < Sk
where OFF = Sk - Sq (bottom-right alignment, FlashAttention >= 2.1) or 0 (top-left, torch SDPA), and a bound
is only applied when HAS_LEFT / HAS_RIGHT is set. Causal attention is RIGHT = 0.

The key loop of a query block is split in three ranges of key blocks:
    [lo, full_lo)       masked (left window edge)
    [full_lo, full_hi)  every (i, j) visible: no mask arithmetic, no bounds checks on K/V
    [full_hi, hi)       masked (diagonal / right window edge / ragged end of the keys)
Softmax runs in base 2 with the scale (times log2 e) folded into one multiply; the running max of a row that
has seen no key yet is kept at -inf and neutralised, so a row with nothing visible ends with out = 0 and
lse = -inf, never NaN.

Constexpr options:
    BLOCK_M, BLOCK_N      query / key tile sizes
    BLOCK_D, BLOCK_DV     head dims of Q/K and V rounded up to a power of two (EVEN_D / EVEN_DV: no padding)
    HAS_LEFT, HAS_RIGHT   window bounds present (causal is HAS_RIGHT with RIGHT = 0)
    ALIGN_BOTTOM_RIGHT    OFF = Sk - Sq (else 0)
    HAS_SOFTCAP           scores s -> softcap * tanh(s / softcap)
    IS_VARLEN             sequence bounds come from cu_seqlens_q / cu_seqlens_k
    RETURN_LSE            write the log-sum-exp (natural log)
    HAS_DESCALE           fp8: per-(batch, kv head) descales of q, k, v read from QD / KD / VD
    P_SHIFT               fp8: P is scaled by 2 ** P_SHIFT before its rounding to V's dtype (fp8.py)
    V_PACKED              fp8: V is the view of an fp8.Fp8V (keys reordered within groups of 16: packed_key_pos)
    ROUND_P               fp8 under the interpreter: round P to V's mantissa in float32 first (its own
                          fp32 -> fp8 cast drops the carry of a round-up), so the cast is exact
    USE_TMA               K/V tiles through tensor descriptors (Hopper bulk copies) instead of pointers
    WARP_SPECIALIZE       ask the compiler to warp-specialize the unmasked loop (Hopper/Blackwell only)
    REVERSE_M             schedule the heaviest query blocks first (causal)
    PIPELINE_QK           issue q.k of the next key block before the softmax of this one (unmasked range)
"""
import triton
import triton.language as tl

from ..common.fp8_kernels import packed_key_pos_jit as packed_key_pos
from ..common.masking import key_range, seq_bases, visible
from ..common.softmax import round_mantissa, softmax_probs, tanh


@triton.jit
def _load_kv_tile(src, stride_s, stride_d, i_b, i_h, row0, n0, o_n, o_d, seqlen_k,
                  D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  EVEN_D: tl.constexpr, CHECK_N: tl.constexpr, USE_TMA: tl.constexpr, IS_VARLEN: tl.constexpr,
                  PACKED: tl.constexpr = False):
    """One [BLOCK_N, BLOCK_D] tile of K or V starting at key n0 of this sequence.

    src is a tensor descriptor (USE_TMA) or the pointer to row 0 of this sequence and head (stride_d: 1, or
    the head-dim stride of a sequence-major fp8 V).
    """
    if USE_TMA:
        # out-of-range rows/cols are zero-filled by the copy engine (batched: per sequence, 4D descriptor;
        # varlen: rows of the next sequence may come in, they are masked out of the scores)
        if IS_VARLEN:
            b_x = src.load([row0 + n0, i_h, 0]).reshape(BLOCK_N, BLOCK_D)
        else:
            b_x = src.load([i_b, n0, i_h, 0]).reshape(BLOCK_N, BLOCK_D)
    else:
        if PACKED:  # key j sits at packed_key_pos(j) (fp8.Fp8V; stride_s = 1)
            p_x = src + packed_key_pos(n0 + o_n).to(tl.int64)[:, None] + o_d[None, :] * stride_d
        else:
            p_x = src + (n0 + o_n).to(tl.int64)[:, None] * stride_s + o_d[None, :] * stride_d  # [N, D] tile
        if CHECK_N:
            b_x = tl.load(p_x, mask=((n0 + o_n) < seqlen_k)[:, None] & (o_d < D)[None, :], other=0.0)
        elif EVEN_D:
            b_x = tl.load(p_x)
        else:
            b_x = tl.load(p_x, mask=(o_d < D)[None, :], other=0.0)
    return b_x


@triton.jit
def _scores(b_q, b_k, qk_scale, softcap_scale, softcap_out, HAS_SOFTCAP: tl.constexpr):
    """[BLOCK_M, BLOCK_N] scores in log2 units: q.k * scale * log2e, or the capped form."""
    b_s = tl.dot(b_q, tl.trans(b_k))
    if HAS_SOFTCAP:
        b_s = tanh(b_s * softcap_scale) * softcap_out
    else:
        b_s = b_s * qk_scale
    return b_s


@triton.jit
def _online_softmax_step(b_acc, b_l, b_m, b_s, b_v, SAFE: tl.constexpr, P_SHIFT: tl.constexpr,
                         ROUND_P: tl.constexpr):
    """Fold one block of log2-scores b_s [BLOCK_M, BLOCK_N] and its values b_v into (acc, l, m) (SAFE,
    P_SHIFT: softmax_probs)."""
    b_p, b_alpha, b_l, b_m_new = softmax_probs(b_l, b_m, b_s, SAFE, P_SHIFT)
    b_acc = b_acc * b_alpha[:, None]
    if ROUND_P:
        b_p = round_mantissa(b_p, b_v.dtype.fp_mantissa_width)
    b_acc = tl.dot(b_p.to(b_v.dtype), b_v, b_acc)  # [BLOCK_M, BLOCK_DV]
    return b_acc, b_l, b_m_new


@triton.jit
def _attn_key_range(b_acc, b_l, b_m, b_q, k_src, v_src, stride_ks, stride_vs, stride_vd,
                    i_b, i_hk, k_row0, start_n, end_n, o_m, o_n, o_d, o_dv, seqlen_k, off_diag, left, right,
                    qk_scale, softcap_scale, softcap_out,
                    D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
                    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    HAS_SOFTCAP: tl.constexpr, USE_TMA: tl.constexpr, IS_VARLEN: tl.constexpr,
                    WARP_SPECIALIZE: tl.constexpr, PIPELINE_QK: tl.constexpr, P_SHIFT: tl.constexpr,
                    ROUND_P: tl.constexpr, V_PACKED: tl.constexpr):
    """Online softmax over key blocks [start_n, end_n). MASKED applies the visibility rule per element.

    PIPELINE_QK (unmasked range only): the scores of block n + 1 are issued before the softmax of block n,
    so the tensor cores work on q.k while the exp2 of the previous block runs.
    """
    if PIPELINE_QK and not MASKED:
        if start_n < end_n:
            b_k = _load_kv_tile(k_src, stride_ks, 1, i_b, i_hk, k_row0, start_n, o_n, o_d, seqlen_k,
                                D, BLOCK_N, BLOCK_D, EVEN_D, False, USE_TMA, IS_VARLEN)
            b_s = _scores(b_q, b_k, qk_scale, softcap_scale, softcap_out, HAS_SOFTCAP)
            for n0 in tl.range(start_n, end_n - BLOCK_N, BLOCK_N):
                b_k = _load_kv_tile(k_src, stride_ks, 1, i_b, i_hk, k_row0, n0 + BLOCK_N, o_n, o_d, seqlen_k,
                                    D, BLOCK_N, BLOCK_D, EVEN_D, False, USE_TMA, IS_VARLEN)
                b_s_next = _scores(b_q, b_k, qk_scale, softcap_scale, softcap_out, HAS_SOFTCAP)
                b_v = _load_kv_tile(v_src, stride_vs, stride_vd, i_b, i_hk, k_row0, n0, o_n, o_dv, seqlen_k,
                                    DV, BLOCK_N, BLOCK_DV, EVEN_DV, False, USE_TMA, IS_VARLEN, V_PACKED)
                b_acc, b_l, b_m = _online_softmax_step(b_acc, b_l, b_m, b_s, b_v, False, P_SHIFT, ROUND_P)
                b_s = b_s_next
            b_v = _load_kv_tile(v_src, stride_vs, stride_vd, i_b, i_hk, k_row0, end_n - BLOCK_N, o_n, o_dv, seqlen_k,
                                DV, BLOCK_N, BLOCK_DV, EVEN_DV, False, USE_TMA, IS_VARLEN, V_PACKED)
            b_acc, b_l, b_m = _online_softmax_step(b_acc, b_l, b_m, b_s, b_v, False, P_SHIFT, ROUND_P)
    else:
        for n0 in tl.range(start_n, end_n, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            b_k = _load_kv_tile(k_src, stride_ks, 1, i_b, i_hk, k_row0, n0, o_n, o_d, seqlen_k,
                                D, BLOCK_N, BLOCK_D, EVEN_D, MASKED, USE_TMA, IS_VARLEN)  # [BLOCK_N, BLOCK_D]
            b_s = _scores(b_q, b_k, qk_scale, softcap_scale, softcap_out, HAS_SOFTCAP)  # [BLOCK_M, BLOCK_N]
            if MASKED:
                b_vis = visible(o_m, n0 + o_n, seqlen_k, off_diag, left, right, HAS_LEFT, HAS_RIGHT)
                b_s = tl.where(b_vis, b_s, float("-inf"))
            # [BLOCK_N, BLOCK_DV]
            b_v = _load_kv_tile(v_src, stride_vs, stride_vd, i_b, i_hk, k_row0, n0, o_n, o_dv, seqlen_k,
                                DV, BLOCK_N, BLOCK_DV, EVEN_DV, MASKED, USE_TMA, IS_VARLEN, V_PACKED)
            b_acc, b_l, b_m = _online_softmax_step(b_acc, b_l, b_m, b_s, b_v, MASKED, P_SHIFT, ROUND_P)
    return b_acc, b_l, b_m


@triton.jit
def attn_fwd_kernel(
    Q, K, V, O, LSE, QD, KD, VD,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    cu_seqlens_q, cu_seqlens_k,
    seqlen_q, seqlen_k, num_heads, group_size, num_bh,
    qk_scale, softcap_scale, softcap_out, out_scale, left, right,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, ALIGN_BOTTOM_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, IS_VARLEN: tl.constexpr, RETURN_LSE: tl.constexpr,
    USE_TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, REVERSE_M: tl.constexpr,
    PIPELINE_QK: tl.constexpr, HAS_DESCALE: tl.constexpr, P_SHIFT: tl.constexpr, ROUND_P: tl.constexpr,
    V_PACKED: tl.constexpr,
):
    """Grid: (cdiv(max Sq, BLOCK_M), Y, Z) with Y * Z >= num_bh = B * Hq (the batch-head index is folded over
    two axes, as a grid's y axis stops at 65535). One program computes one [BLOCK_M, DV] tile of the output.

    fp8: out = (P V) * out_scale (times VD[b, kv head] with HAS_DESCALE, as the scores take QD * KD)."""
    EVEN_D: tl.constexpr = BLOCK_D == D
    EVEN_DV: tl.constexpr = BLOCK_DV == DV
    i_m = tl.program_id(0)
    if REVERSE_M:
        i_m = tl.num_programs(0) - 1 - i_m
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    i_hk = i_h // group_size

    seqlen_q, seqlen_k, k_row0, q_base, k_base, v_base, o_base, l_base = seq_bases(
        i_b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, stride_qb, stride_qs, stride_kb, stride_ks,
        stride_vb, stride_vs, stride_ob, stride_os, stride_lb, IS_VARLEN)
    m0 = i_m * BLOCK_M
    if m0 >= seqlen_q:
        return

    o_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M] query positions
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_m = o_m < seqlen_q

    p_q = Q + q_base + i_h.to(tl.int64) * stride_qh + o_m.to(tl.int64)[:, None] * stride_qs + o_d[None, :]
    b_q = tl.load(p_q, mask=m_m[:, None] & (o_d < D)[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]

    # key-block ranges (see module docstring); all bounds clamped to [0, seqlen_k]
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    else:
        off_diag = 0
    lo, hi, full_lo, full_hi = key_range(m0, m0 + BLOCK_M - 1, seqlen_k, off_diag, left, right, BLOCK_N,
                                         HAS_LEFT, HAS_RIGHT)

    if USE_TMA:
        k_src = K
        v_src = V
    else:
        k_src = K + k_base + i_hk.to(tl.int64) * stride_kh
        v_src = V + v_base + i_hk.to(tl.int64) * stride_vh

    if HAS_DESCALE:
        qk_descale = tl.load(QD + i_b * stride_qdb + i_hk * stride_qdh) * tl.load(KD + i_b * stride_kdb +
                                                                                   i_hk * stride_kdh)
        out_scale = out_scale * tl.load(VD + i_b * stride_vdb + i_hk * stride_vdh)
        if HAS_SOFTCAP:
            softcap_scale = softcap_scale * qk_descale
        else:
            qk_scale = qk_scale * qk_descale

    b_m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BLOCK_M], dtype=tl.float32)
    b_acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    b_acc, b_l, b_m = _attn_key_range(
        b_acc, b_l, b_m, b_q, k_src, v_src, stride_ks, stride_vs, stride_vd, i_b, i_hk, k_row0, lo, full_lo,
        o_m, o_n, o_d, o_dv, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
        D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, EVEN_D, EVEN_DV, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
        USE_TMA, IS_VARLEN, False, False, P_SHIFT, ROUND_P, V_PACKED)
    b_acc, b_l, b_m = _attn_key_range(
        b_acc, b_l, b_m, b_q, k_src, v_src, stride_ks, stride_vs, stride_vd, i_b, i_hk, k_row0, full_lo,
        full_hi, o_m, o_n, o_d, o_dv, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
        D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, EVEN_D, EVEN_DV, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
        USE_TMA, IS_VARLEN, WARP_SPECIALIZE, PIPELINE_QK, P_SHIFT, ROUND_P, V_PACKED)
    b_acc, b_l, b_m = _attn_key_range(
        b_acc, b_l, b_m, b_q, k_src, v_src, stride_ks, stride_vs, stride_vd, i_b, i_hk, k_row0, full_hi, hi,
        o_m, o_n, o_d, o_dv, seqlen_k, off_diag, left, right, qk_scale, softcap_scale, softcap_out,
        D, DV, BLOCK_N, BLOCK_D, BLOCK_DV, EVEN_D, EVEN_DV, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
        USE_TMA, IS_VARLEN, False, False, P_SHIFT, ROUND_P, V_PACKED)

    # rows that saw no key: l = 0, acc = 0 -> out 0, lse -inf
    b_seen = b_l > 0.0
    b_out = b_acc * (out_scale / tl.where(b_seen, b_l, 1.0))[:, None]  # [BLOCK_M, BLOCK_DV]
    p_o = O + o_base + i_h.to(tl.int64) * stride_oh + o_m.to(tl.int64)[:, None] * stride_os + o_dv[None, :]
    tl.store(p_o, b_out.to(O.dtype.element_ty), mask=m_m[:, None] & (o_dv < DV)[None, :])
    if RETURN_LSE:
        b_lse = tl.where(b_seen, (b_m + tl.log2(tl.where(b_seen, b_l, 1.0)) - P_SHIFT) * 0.6931471805599453,
                         float("-inf"))  # [BLOCK_M]
        tl.store(LSE + l_base + i_h.to(tl.int64) * stride_lh + o_m, b_lse, mask=m_m)
