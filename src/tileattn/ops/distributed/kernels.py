"""The merge of one block's partial attention into the running output, through the log-sum-exp, in float32.

With (o_a, lse_a) the running output and log-sum-exp of a query row and (o_b, lse_b) the block's:
    lse = log(exp(lse_a) + exp(lse_b)),  o = o_a * exp(lse_a - lse) + o_b * exp(lse_b - lse)
computed about m = max(lse_a, lse_b) so nothing overflows. A row that has seen no key on either side
(lse_a = lse_b = -inf) stays (0, -inf), never NaN.
"""
import triton
import triton.language as tl


@triton.jit
def merge_kernel(ACC, LSE_ACC, O, LSE, stride_ab, stride_as, stride_ah, stride_ob, stride_os, stride_oh,
                 stride_lab, stride_lah, stride_lb, stride_lh, seqlen, num_heads,
                 DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid (B * H, query blocks). ACC [B, S, H, DV] float32 and LSE_ACC [B, H, S] float32 (the running state,
    updated in place; pointers at the block's first row), O [B, S, H, DV] (any float dtype) and LSE [B, H, S]
    float32 (the block's). Sequence strides of LSE_ACC and LSE are 1."""
    i_bh = tl.program_id(0)
    i_m = tl.program_id(1)
    i_b = (i_bh // num_heads).to(tl.int64)
    i_h = (i_bh % num_heads).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    o_d = tl.arange(0, BLOCK_DV)  # [BLOCK_DV]
    m_m = o_m < seqlen
    m_md = m_m[:, None] & (o_d[None, :] < DV)  # [BLOCK_M, BLOCK_DV]
    p_la = LSE_ACC + i_b * stride_lab + i_h * stride_lah + o_m
    p_lb = LSE + i_b * stride_lb + i_h * stride_lh + o_m
    b_la = tl.load(p_la, mask=m_m, other=float("-inf"))  # [BLOCK_M]
    b_lb = tl.load(p_lb, mask=m_m, other=float("-inf"))  # [BLOCK_M]
    b_mx = tl.maximum(b_la, b_lb)
    b_mx = tl.where(b_mx == float("-inf"), 0.0, b_mx)  # both -inf: weights exp(-inf) = 0, no NaN
    b_wa = tl.exp(b_la - b_mx)  # [BLOCK_M]
    b_wb = tl.exp(b_lb - b_mx)
    b_sum = b_wa + b_wb
    b_seen = b_sum > 0
    b_sum = tl.where(b_seen, b_sum, 1.0)
    b_lse = tl.where(b_seen, b_mx + tl.log(b_sum), float("-inf"))
    b_wa = b_wa / b_sum
    b_wb = b_wb / b_sum
    rows = o_m[:, None].to(tl.int64)
    p_a = ACC + i_b * stride_ab + i_h * stride_ah + rows * stride_as + o_d[None, :]
    p_o = O + i_b * stride_ob + i_h * stride_oh + rows * stride_os + o_d[None, :]
    b_a = tl.load(p_a, mask=m_md, other=0.0)  # [BLOCK_M, BLOCK_DV] float32
    b_o = tl.load(p_o, mask=m_md, other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_DV]
    b_a = b_a * b_wa[:, None] + b_o * b_wb[:, None]
    tl.store(p_a, b_a, mask=m_md)
    tl.store(p_la, b_lse, mask=m_m)
