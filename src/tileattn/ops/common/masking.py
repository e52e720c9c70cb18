"""The visibility rule of dense attention and where a sequence's rows are (Triton jit; the Gluon kernels wrap
these with `gluon.jit(fn.fn)`).

Key j is visible to query i iff
    i + OFF - LEFT <= j <= i + OFF + RIGHT   and   j < Sk
where OFF = Sk - Sq (bottom-right alignment, FlashAttention >= 2.1) or 0 (top-left, torch SDPA), and a bound
is only applied when HAS_LEFT / HAS_RIGHT is set. Causal attention is RIGHT = 0.
"""
import triton
import triton.language as tl

# A window bound from here up reaches past any sequence the kernels serve: it means unbounded, as -1 does. The
# kernels compute window limits in int32 (position + offset + bound), which a bound near 2^31 overflows, and Triton
# passes an int from 2^63 up as uint64: passed on, such bounds gave wrong (or all-zero) results. The APIs map them
# to -1 (dense: effective_window; decode: KVCachePlan).
UNBOUNDED_WINDOW = 2 ** 30

def key_span(m0, m1, seqlen_k, off_diag, left, right):
    """Host side: keys [lo, hi) that query rows [m0, m1) see (query i sees key j iff i + off_diag - left <= j <=
    i + off_diag + right; -1: unbounded)."""
    lo = max(m0 + off_diag - left, 0) if left >= 0 else 0
    hi = min(max(m1 - 1 + off_diag + right + 1, 0), seqlen_k) if right >= 0 else seqlen_k
    return lo, max(hi, lo)


# The Hopper pipelines' FLEX modes (a constexpr; 0 / False: dense): whole mask blocks, or a last block that ends
# past the sequence (forward: Sk, whose padding keys it hides; backward: Sq or Sk, whose padding rows and keys it
# hides), in full blocks too
FLEX_WHOLE = 1
FLEX_TAIL = 2


@triton.jit
def key_range(m_first, m_last, seqlen_k, off_diag, left, right, BLOCK_N: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Key range [lo, hi) seen by query rows [m_first, m_last], and its unmasked part [full_lo, full_hi):
    multiples of BLOCK_N except an end clamped to seqlen_k."""
    lo = 0
    full_lo = 0
    hi = seqlen_k
    full_hi = (seqlen_k // BLOCK_N) * BLOCK_N
    if HAS_LEFT:
        lo = tl.maximum(m_first + off_diag - left, 0)
        lo = (lo // BLOCK_N) * BLOCK_N
        full_lo = tl.maximum(m_last + off_diag - left, 0)
        full_lo = ((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(tl.maximum(m_last + off_diag + right + 1, 0), seqlen_k)
        full_hi = tl.minimum(full_hi, (tl.maximum(m_first + off_diag + right + 1, 0) // BLOCK_N) * BLOCK_N)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, hi, full_lo, full_hi


@triton.jit
def query_range(n0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, NEEDS_MASK: tl.constexpr):
    """The rule seen from key block [n0, n0 + BLOCK_N) (the backward's dK/dV programs): (m_lo, f_lo, f_hi, m_hi),
    the query rows [m_lo, m_hi) that see any of its keys (query i sees key j iff j - OFF - RIGHT <= i <=
    j - OFF + LEFT) and, inside, [f_lo, f_hi): whole BLOCK_M blocks inside the sequence that see every key of a
    key block inside its own (unmasked). m_lo is a multiple of BLOCK_M; f_lo, f_hi are multiples or m_hi.
    Without NEEDS_MASK (no rule, whole tiles) the whole range is unmasked. A query block m0 is in [m_lo, m_hi)
    iff key_range(m0, m0 + BLOCK_M - 1, ...) holds n0."""
    m_lo = 0
    m_hi = seqlen_q
    if HAS_RIGHT:
        m_lo = (tl.maximum(n0 - off_diag - right, 0) // BLOCK_M) * BLOCK_M
    if HAS_LEFT:
        m_hi = tl.minimum(tl.maximum(n0 + BLOCK_N - 1 - off_diag + left + 1, 0), seqlen_q)
    f_lo = m_lo
    f_hi = m_hi
    if NEEDS_MASK:
        f_hi = (seqlen_q // BLOCK_M) * BLOCK_M
        if HAS_RIGHT:
            f_lo = tl.maximum(n0 + BLOCK_N - 1 - off_diag - right, 0)
            f_lo = ((f_lo + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        if HAS_LEFT:
            f_hi = tl.minimum(f_hi, (tl.maximum(n0 - off_diag + left + 1, 0) // BLOCK_M) * BLOCK_M)
        if n0 + BLOCK_N > seqlen_k:
            f_hi = 0
        f_lo = tl.minimum(tl.maximum(f_lo, m_lo), m_hi)
        f_hi = tl.minimum(tl.maximum(f_hi, f_lo), m_hi)
    return m_lo, f_lo, f_hi, m_hi


@triton.jit
def visible(o_m, o_j, seqlen_k, off_diag, left, right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """[rows, keys] mask of the visibility rule for query positions o_m and key positions o_j."""
    vis = (o_j < seqlen_k)[None, :]
    if HAS_RIGHT:
        vis = vis & (o_j[None, :] <= (o_m + off_diag + right)[:, None])
    if HAS_LEFT:
        vis = vis & (o_j[None, :] >= (o_m + off_diag - left)[:, None])
    return vis


@triton.jit
def seq_bases(i_b, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, stride_qb, stride_qs, stride_kb, stride_ks,
              stride_vb, stride_vs, stride_ob, stride_os, stride_lb, IS_VARLEN: tl.constexpr):
    """Sequence b's (seqlen_q, seqlen_k, first key row, int64 element offsets of its Q, K, V, O and lse):
    from cu_seqlens (varlen: packed rows, lse [Hq, total_q]) or from the batch strides."""
    if IS_VARLEN:
        q_row0 = tl.load(cu_seqlens_q + i_b)
        seqlen_q = tl.load(cu_seqlens_q + i_b + 1) - q_row0
        k_row0 = tl.load(cu_seqlens_k + i_b)  # int32: also a tensor-descriptor coordinate
        seqlen_k = tl.load(cu_seqlens_k + i_b + 1) - k_row0
        q_base = q_row0.to(tl.int64) * stride_qs
        k_base = k_row0.to(tl.int64) * stride_ks
        v_base = k_row0.to(tl.int64) * stride_vs
        o_base = q_row0.to(tl.int64) * stride_os
        l_base = q_row0.to(tl.int64)  # varlen lse is [Hq, total_q]
    else:
        k_row0 = 0
        q_base = i_b.to(tl.int64) * stride_qb
        k_base = i_b.to(tl.int64) * stride_kb
        v_base = i_b.to(tl.int64) * stride_vb
        o_base = i_b.to(tl.int64) * stride_ob
        l_base = i_b.to(tl.int64) * stride_lb
    return seqlen_q, seqlen_k, k_row0, q_base, k_base, v_base, o_base, l_base
