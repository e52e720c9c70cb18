"""Hopper (sm90) kernel of flex attention backward in Gluon: the dense backward's FlashAttention-3 schedule over a
block mask, with the traced mods' derivatives inlined (ops/common/gluon_bwd_sm90.py holds the pipeline and
describes it)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..common.gluon_bwd_sm90 import attn_bwd_pipeline
from ..common.gluon_bwd_sm90_walk import PLAIN


@gluon.jit
def flex_bwd_sm90_kernel(
    q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, acc, sem_ptr,
    stride_lb, stride_lh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    seqlen_q, seqlen_k, num_kv_heads, group_size, num_q_blocks, num_kv_blocks, num_items, scale, qk_scale, fx, fk,
    caps_s, caps_m,
    STAGES: gl.constexpr, DQ_BUFS: gl.constexpr, CONSUMER_REGS: gl.constexpr, WORKER_REGS: gl.constexpr,
    WRITER_ROWS: gl.constexpr, TMA_DQ: gl.constexpr, SCORE_GRAD: gl.constexpr, MASK_MOD: gl.constexpr,
    FLEX: gl.constexpr,
):
    """Flex attention backward (ops/flex): the dense kernel's schedule over a block mask. As attn_bwd_sm90_kernel
    (ops/dense/gluon_bwd_sm90.py; no window, no softcap: those are mods here), plus fx = the block mask's
    transposed lists (q_num_blocks, q_indices, full_q_num_blocks, full_q_indices, then their (batch, head, key
    block) strides, 12 ints, 0 on broadcast dims), fk = its forward lists in the same form; SCORE_GRAD the
    score mod's value and derivative (ops/flex/trace.py, Gluon flavour) reading caps_s, MASK_MOD reading
    caps_m. The mask's blocks are 128 x 128; FLEX: FLEX_WHOLE where Sq and Sk are multiples of 128, else FLEX_TAIL
    (the padding rows and keys masked; ops/common/gluon_bwd_sm90.py); num_q_blocks counts the steps' query blocks
    of every mask block, the last one's included; sem holds the head group after the counters. scale: the flex
    scale (positive), qk_scale = scale * log2 e (used without a score mod)."""
    # where the preprocess wrote the work items' head group: after the counters (bwd_kernels.chain_group; each
    # partition reads it where it places an item, walk.work_item)
    head_group_ptr = sem_ptr + num_items // num_kv_blocks * (group_size * num_q_blocks + 1)
    attn_bwd_pipeline(
        q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, acc, sem_ptr, stride_lb, stride_lh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, seqlen_q, seqlen_k, num_kv_heads,
        group_size, num_q_blocks, num_kv_blocks, num_items, head_group_ptr, scale, qk_scale, 1.0, 1.0, 0, 0, fx, fk,
        caps_s, caps_m,
        STAGES, DQ_BUFS, CONSUMER_REGS, WORKER_REGS, WRITER_ROWS, False, False, False, False, True, TMA_DQ, FLEX, 128,
        SCORE_GRAD, MASK_MOD, PLAIN, False)
