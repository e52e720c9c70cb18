"""Hopper (sm90) kernel of dense attention backward in Gluon: FlashAttention-3's backward schedule, deterministic
(ops/common/gluon_bwd_sm90.py holds the pipeline and describes it)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.gluon_bwd_sm90 import attn_bwd_pipeline


@gluon.jit
def attn_bwd_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, acc, sem_ptr,
    stride_lb, stride_lh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, seqlen_q, seqlen_k, num_kv_heads, group_size, num_q_blocks, num_kv_blocks,
    num_items, scale, qk_scale, softcap_scale, softcap_out, left, right,
    STAGES: gl.constexpr, DQ_BUFS: gl.constexpr, CONSUMER_REGS: gl.constexpr, WORKER_REGS: gl.constexpr,
    WRITER_ROWS: gl.constexpr, HAS_LEFT: gl.constexpr,
    HAS_RIGHT: gl.constexpr, ALIGN_BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, NEEDS_MASK: gl.constexpr,
    TMA_DQ: gl.constexpr, SCHED: gl.constexpr,
):
    """Grid (programs,): num_items = num_kv_blocks * B * Hkv work items (num_kv_blocks = cdiv(Sk, BLOCK_N)), one
    per program (SCHED = walk.PLAIN); or ROTATED (only where every key block sees every query block: whole tiles,
    no window): a multiple of num_kv_blocks programs, launched cooperatively, each walking items pid, pid +
    programs, ... with rotated walks; or PAIRED (square causal problems of whole tiles, an even num_kv_blocks, no
    GQA): a multiple of num_kv_blocks / 2 programs, launched cooperatively, each walking pairs of items
    (gluon_bwd_sm90_walk.py); num_warps = 4 (the first consumer warpgroup).

    Descriptors over [B, S, H, D] tensors: q and do with block [1, BLOCK_M, 1, D] (BLOCK_M 64 or 128: the
    config's query rows per step), k and v [1, BLOCK_N, 1, D]. lse, delta [B, Hq, Sq] float32 (same strides); dk,
    dv in k's and v's strides; acc [B * Hq, num_q_blocks * BLOCK_M, D] float32, the dQ sums (zeros where a query
    block may see no key block, else any values): with TMA_DQ a descriptor over it as
    [B * Hq * num_q_blocks * BLOCK_M, D] with the staged half's block ([64, D / 2], or [64, D] with BLOCK_M =
    128), else its pointer; sem [B * Hq, num_q_blocks] int32 zeros. qk_scale: scale * log2 e (1
    with a softcap, whose softcap_out carries log2 e). Launched with programmatic dependent launch after the
    preprocess (bwd_kernels.bwd_preprocess_kernel with PDL_TRIGGER), which writes delta and zeroes sem: the
    programs may start while it ends and wait for it where they first read either (the pipeline's PDL)."""
    # no block mask: placeholders the dense path never reads
    fx = (lse_ptr, lse_ptr, lse_ptr, lse_ptr, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    attn_bwd_pipeline(
        q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, acc, sem_ptr, stride_lb, stride_lh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, seqlen_q, seqlen_k, num_kv_heads,
        group_size, num_q_blocks, num_kv_blocks, num_items, 0, scale, qk_scale, softcap_scale, softcap_out, left,
        right, fx, fx, (), (), STAGES, DQ_BUFS, CONSUMER_REGS, WORKER_REGS, WRITER_ROWS, HAS_LEFT, HAS_RIGHT,
        ALIGN_BOTTOM_RIGHT, HAS_SOFTCAP, NEEDS_MASK, TMA_DQ, False, 128, None, None, SCHED, True)
