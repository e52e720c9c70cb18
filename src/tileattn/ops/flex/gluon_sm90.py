"""Hopper (sm90) kernel of flex attention forward in Gluon: the dense kernel's FlashAttention-3 schedule over a
block mask, with the traced mods inlined (ops/common/gluon_attn_sm90.py holds the pipeline and describes it)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.gluon_attn_sm90 import attn_fwd_pipeline


@gluon.jit
def flex_fwd_sm90_kernel(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, qd_ptr, kd_ptr, vd_ptr, stride_lb, stride_lh,
    stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    seqlen_q, seqlen_k, num_heads, group_size, num_bh, out_scale, fx, caps_s, caps_m,
    BLOCK_M: gl.constexpr, Q_SLOTS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    RETURN_LSE: gl.constexpr, HAS_DESCALE: gl.constexpr, P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr,
    V_SEQ_MAJOR: gl.constexpr,
    SEPARATE_O: gl.constexpr, SCORE_MOD: gl.constexpr, MASK_MOD: gl.constexpr, PINGPONG: gl.constexpr,
    REVERSE_M: gl.constexpr, FLEX: gl.constexpr,
):
    """Flex attention (ops/flex): the dense kernel's schedule over a block mask. As attn_fwd_sm90_kernel, plus
    fx = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, their (batch, head, query block)
    strides (12 ints, 0 on broadcast dims), scale); SCORE_MOD / MASK_MOD the traced mods (ops/flex/trace.py,
    Gluon flavour) reading caps_s / caps_m. Tiles of 2 * BLOCK_M query rows are the mask's query blocks and
    K/V tiles its key blocks; FLEX: FLEX_WHOLE where Sk is a multiple of them, else FLEX_TAIL
    (ops/common/masking.py). REVERSE_M: the persistent grid deals the last query blocks first (the heaviest under
    causal-like masks)."""
    attn_fwd_pipeline(
        q_desc, k_desc, v_desc, o_desc, lse_ptr, qd_ptr, kd_ptr, vd_ptr, stride_lb, stride_lh, stride_qdb, stride_qdh,
        stride_kdb, stride_kdh, stride_vdb, stride_vdh, seqlen_q, seqlen_k, num_heads, group_size, num_bh,
        1.4426950408889634, 1.0, 1.0, out_scale, 0, 0, fx, caps_s, caps_m, BLOCK_M, Q_SLOTS, STAGES, CONSUMER_REGS,
        False, False, False, False, RETURN_LSE, REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, SEPARATE_O,
        FLEX, SCORE_MOD, MASK_MOD, PINGPONG, 2, (lse_ptr, 0), False, "tma")
