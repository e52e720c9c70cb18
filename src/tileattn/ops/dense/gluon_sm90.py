"""Hopper (sm90) kernel of dense attention forward in Gluon: FlashAttention-3's warp-specialized, persistent
schedule (ops/common/gluon_attn_sm90.py holds the pipeline and describes it).

attn_fwd_sm90_kernel_one_key is the same kernel with seqlen_k left a run-time value when it is 1, for fp8
calls with a single key (see its comment)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.gluon_attn_sm90 import attn_fwd_pipeline


@gluon.jit
def attn_fwd_sm90_kernel(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, qd_ptr, kd_ptr, vd_ptr, stride_lb, stride_lh,
    stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    seqlen_q, seqlen_k, num_heads, group_size, num_bh,
    sm_scale, softcap_scale, softcap_out, out_scale, left, right, order_ptr, order_rounds,
    BLOCK_M: gl.constexpr, Q_SLOTS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, ALIGN_BOTTOM_RIGHT: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr, RETURN_LSE: gl.constexpr, REVERSE_M: gl.constexpr,
    HAS_DESCALE: gl.constexpr, P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr, V_SEQ_MAJOR: gl.constexpr,
    SEPARATE_O: gl.constexpr,
    PINGPONG: gl.constexpr, NUM_CONSUMERS: gl.constexpr, ORDERED: gl.constexpr, EPILOGUE: gl.constexpr,
):
    """Grid: (programs,), any number up to the tile count cdiv(Sq, NUM_CONSUMERS * BLOCK_M) * num_bh (one per SM
    makes it persistent; one per tile is a plain grid); num_warps = 4 (the first consumer warpgroup).

    Descriptors: q/o over [B, Sq, Hq, D] with block [1, BLOCK_M, 1, D], k over [B, Sk, Hkv, D] with block
    [1, BLOCK_N, 1, D], v the same, or over [B, Hkv, D, Sk] with block [1, 1, D, BLOCK_N] (V_SEQ_MAJOR).
    num_bh = B * Hq. sm_scale: scale * log2 e (1 with HAS_SOFTCAP, whose softcap_out already carries log2 e).
    lse [B, Hq, Sq] float32 (natural log) when RETURN_LSE. fp8: descales [B, Hkv] (strides 0 broadcast one
    value) with HAS_DESCALE; out = (P V / l) * out_scale (* v descale) staged in SEPARATE_O buffers. ORDERED: the
    persistent grid walks the int32 tile table order_ptr [order_rounds, programs] (launch_sm90.tile_order), else
    the snake order (order_ptr / order_rounds unread). EPILOGUE ("tma", "deferred", "kstage"): how O leaves
    (gluon_attn_sm90._consume_tile).
    """
    # no block mask: placeholders the dense path never reads
    fx = (lse_ptr, lse_ptr, lse_ptr, lse_ptr, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0)
    attn_fwd_pipeline(
        q_desc, k_desc, v_desc, o_desc, lse_ptr, qd_ptr, kd_ptr, vd_ptr, stride_lb, stride_lh, stride_qdb, stride_qdh,
        stride_kdb, stride_kdh, stride_vdb, stride_vdh, seqlen_q, seqlen_k, num_heads, group_size, num_bh, sm_scale,
        softcap_scale, softcap_out, out_scale, left, right, fx, (), (), BLOCK_M, Q_SLOTS, STAGES, CONSUMER_REGS,
        HAS_LEFT, HAS_RIGHT, ALIGN_BOTTOM_RIGHT, HAS_SOFTCAP, RETURN_LSE, REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA,
        V_SEQ_MAJOR, SEPARATE_O, False, None, None, PINGPONG, NUM_CONSUMERS, (order_ptr, order_rounds), ORDERED,
        EPILOGUE)


# The same kernel, seqlen_k never a compile-time constant. Triton compiles an integer argument equal to 1 as the
# constant 1: with a single key the mask of every key tile is then known when compiling, the masked columns of
# the fp8 P fold to one repeated zero pair, and ptxas 12.8 (triton 3.6) packs that P into the p.v wgmma's A
# operand taking half of some registers from one it never writes (SASS: F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C
# R88, R29, R88, R3 with R3 unwritten). Those stray bytes meet V's zero padding, and an fp8 NaN pattern among
# them turns the row's output into NaN (H100, e4m3, B=2, Sq=64, H=4: 2-38 of the 512 rows in every trial at
# D = 64 and 128; e5m2's SASS has the same read; docs/design/fp8.md). fp16/bf16 (whole 32-bit packs) and
# triton 3.9's ptxas are not affected. launch_sm90.py takes this one for fp8 calls with Sk = 1 only: every
# other call keeps the binary whose speed was measured (do_not_specialize also drops the divisibility-by-16
# hint, which changes the SASS at lengths that are multiples of 16).
attn_fwd_sm90_kernel_one_key = gluon.jit(attn_fwd_sm90_kernel.fn, do_not_specialize=["seqlen_k"])
