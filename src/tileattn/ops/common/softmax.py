"""Base-2 online softmax pieces shared by the forward kernels (Triton jit; Gluon kernels wrap them with
`gluon.jit(fn.fn)`).

Scores are kept in log2 units or raw with the scale folded into exp2's argument; a row that has seen no key
keeps its running max at -inf and is shifted by 0, so exp2 gives 0 and the row ends with out = 0,
lse = -inf, never NaN.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # host side: launches fold it into the kernels' scales
LN2 = 0.6931471805599453


@triton.jit
def tanh(x):
    # tanh through exp2 (no tanh in core triton.language): 1 - 2 / (exp(2x) + 1); saturates cleanly at +-1.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)


@triton.jit
def round_mantissa(x, BITS: tl.constexpr):
    """x rounded to nearest (ties to even) with BITS explicit mantissa bits, in float32 arithmetic (Veltkamp's
    split: x * (2^(23 - BITS) + 1) - (that - x)). Exact for normal results; x * 2^(24 - BITS) must not
    overflow."""
    c = x * (2.0 ** (23 - BITS) + 1.0)
    return c - (c - x)


@triton.jit
def softmax_probs(b_l, b_m, b_s, SAFE: tl.constexpr, P_SHIFT: tl.constexpr):
    """The online-softmax update of one block of log2-scores b_s [BLOCK_M, BLOCK_N]: returns (p, alpha, l, m),
    p the block's probabilities and alpha the factor that rescales what was accumulated before.

    SAFE: rows may have seen nothing yet (m = -inf after masking); shift them by 0 so exp2 gives 0, not NaN.
    P_SHIFT: p (and so l) carries a factor 2 ** P_SHIFT, which out = acc / l cancels.
    """
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))  # [BLOCK_M]
    if SAFE:
        b_shift = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    else:
        b_shift = b_m_new
    if P_SHIFT != 0:
        b_p = tl.exp2(b_s - (b_shift - P_SHIFT)[:, None])  # [BLOCK_M, BLOCK_N]
    else:
        b_p = tl.exp2(b_s - b_shift[:, None])
    b_alpha = tl.exp2(b_m - b_shift)  # [BLOCK_M]
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    return b_p, b_alpha, b_l, b_m_new


@triton.jit
def online_softmax(s, m_i, l_i, sm_scale):
    """One step of the base-2 online softmax over raw scores s (masked entries -inf), the scale (times log2 e)
    folded into exp2: (p, alpha, m, l). A row that has seen nothing keeps m = -inf and is shifted by 0, so exp2
    gives 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new) * sm_scale
    p = tl.exp2(s * sm_scale - m_shift[:, None])
    alpha = tl.exp2(m_i * sm_scale - m_shift)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)
