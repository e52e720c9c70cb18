"""The consumer side of the Hopper forward pipeline (gluon_attn_sm90.py, which describes the schedule): the
partition of one consumer warpgroup. Per tile: its rows' key blocks in the loader's order, software-pipelined
(FlashAttention-3's intra-warpgroup overlap: a block's scores are issued before the previous block's P V), the
online softmax of a block in registers (masking.py's rule, softmax.py's steps; part of the exp2 on the FMA pipe
with EXP2_FMA), P handed to the P V wgmma from registers (fp8: in the packed key order of fp8.Fp8V), the wgmma
turns of PINGPONG, and the epilogue (O normalised, staged, stored by TMA; the lse)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import masking, softmax
from .gluon_compat import smem_reinterpret, tma_store
from .gluon_sm90_loader import block_start, rounds, tile_blocks, tile_of

LN2 = gl.constexpr(0.6931471805599453)


def _exp2_asm(on_fma):
    """PTX for exp2 of 4 float32 values: the first 4 - on_fma on the MUFU (ex2.approx.ftz), the last on_fma on
    the FMA pipe. There x is clamped at -127 and split as j + f with j = round(x) (the 1.5 * 2^23 shifter) and
    f in [-0.5, 0.5]; 2^f is a degree-3 polynomial with p(0) = 1 exactly (relative error 1.01e-4 over the
    range, against 4.9e-4 for rounding P to fp16), and j goes into the exponent with an integer add. -inf
    (masked scores) gives +0 exactly; results below 2^-126 are denormal or 0, never negative."""
    mufu = "".join(f"ex2.approx.ftz.f32 ${i}, ${i + 4}; " for i in range(4 - on_fma))
    fma = "".join(
        f"max.ftz.f32 x, ${i + 4}, 0fC2FE0000; add.rn.ftz.f32 t, x, 0f4B400000; sub.rn.ftz.f32 j, t, 0f4B400000; "
        f"sub.rn.ftz.f32 f, x, j; fma.rn.ftz.f32 p, f, 0f3D6150E3, 0f3E78061E; fma.rn.ftz.f32 p, p, f, 0f3F317AFD; "
        f"fma.rn.ftz.f32 p, p, f, 0f3F800000; mov.b32 ti, t; shl.b32 ti, ti, 23; mov.b32 pi, p; "
        f"add.s32 pi, pi, ti; mov.b32 ${i}, pi; " for i in range(4 - on_fma, 4))
    return "{ .reg .f32 x, t, j, f, p; .reg .b32 ti, pi; " + mufu + fma + "}"


_EXP2_ASM = gl.constexpr((None, _exp2_asm(1), _exp2_asm(2)))  # by the number of values on the FMA pipe


@gluon.jit
def _exp2_fma(x, EXP2_FMA: gl.constexpr):
    """exp2 of a float32 block with EXP2_FMA (1 or 2) of every 4 values computed on the FMA pipe instead of the
    MUFU (_exp2_asm): the MUFU's 16 exp2 per cycle and SM match the tensor cores' rate on a D=64 16-bit or a
    D=128 fp8 block, so taking a share off it lets the softmax keep pace (FlashAttention-4's lever)."""
    gl.static_assert(EXP2_FMA == 1 or EXP2_FMA == 2, "EXP2_FMA: 1 or 2 of every 4 values")
    return gl.inline_asm_elementwise(_EXP2_ASM[EXP2_FMA], "=f,=f,=f,=f,f,f,f,f", [x], dtype=gl.float32,
                                     is_pure=True, pack=4)


# the masking model's helpers, written once as Triton functions and compiled here as Gluon
_tanh = gluon.jit(softmax.tanh.fn)
FLEX_TAIL = gl.constexpr(masking.FLEX_TAIL)
_key_range = gluon.jit(masking.key_range.fn)
_visible = gluon.jit(masking.visible.fn)


@gluon.jit
def softmax_block(qk, m_i, l_i, n0, o_m, o_n, MASKED: gl.constexpr, seqlen_k, off_diag, left, right, sm_scale,
                   softcap_scale, softcap_out, fm, caps_s, caps_m, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                   HAS_SOFTCAP: gl.constexpr, P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr, FLEX: gl.constexpr,
                   SCORE_MOD: gl.constexpr,
                   MASK_MOD: gl.constexpr):
    """One block of the online softmax: returns (p, alpha, m, l) for raw scores qk [BLOCK_M, BLOCK_N]. p and l
    carry a factor 2 ** P_SHIFT (fp8), which out = acc / l cancels. Flex: fm = (batch, head, scale); with a
    SCORE_MOD (captures caps_s) the scores are scaled and modified and sm_scale is log2 e, without one sm_scale
    is scale * log2 e as in dense; then (MASKED) MASK_MOD (caps_m)."""
    if HAS_SOFTCAP:
        qk = _tanh(qk * softcap_scale) * softcap_out
    if FLEX:
        # the positions also as float32 (exact below 2^24; ops/flex/lowering.py): the block's from its first key
        # and the hoisted column offsets, one add per column instead of a conversion
        q_f = o_m.to(gl.float32)[:, None]
        kv_f = (n0.to(gl.float32) + o_n.to(gl.float32))[None, :]
        if SCORE_MOD is not None:  # (without one the scale is folded into sm_scale: _consumer)
            qk = SCORE_MOD(qk * fm[2], fm[0], fm[1], o_m[:, None], (n0 + o_n)[None, :], q_f, kv_f, caps_s)
    if MASKED:
        if FLEX:  # mask_mod decides; FLEX_TAIL (Sk not a multiple of the mask's blocks): the keys past Sk too
            # (zero-filled by the copy engine; the ragged last block is always walked masked: tile_blocks)
            if MASK_MOD is not None:
                keep = MASK_MOD(fm[0], fm[1], o_m[:, None], (n0 + o_n)[None, :], q_f, kv_f, caps_m)
                if FLEX == FLEX_TAIL:
                    keep = keep & (n0 + o_n < seqlen_k)[None, :]
                qk = gl.where(keep, qk, float("-inf"))
            elif FLEX == FLEX_TAIL:
                qk = gl.where((n0 + o_n < seqlen_k)[None, :], qk, float("-inf"))
        else:
            keep = _visible(o_m, n0 + o_n, seqlen_k, off_diag, left, right, HAS_LEFT, HAS_RIGHT)
            qk = gl.where(keep, qk, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(qk, 1))
    # a row that has seen nothing keeps m = -inf: shift it by 0 so exp2 gives 0, not NaN
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new) * sm_scale
    if P_SHIFT != 0:
        x = qk * sm_scale - (m_shift - P_SHIFT)[:, None]
    else:
        x = qk * sm_scale - m_shift[:, None]
    if EXP2_FMA == 0:
        p = gl.exp2(x)
    else:
        p = _exp2_fma(x, EXP2_FMA)
    alpha = gl.exp2(m_i * sm_scale - m_shift)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def p_operand(p, dtype: gl.constexpr, p_layout: gl.constexpr, PACKED_KEYS: gl.constexpr):
    """P [BLOCK_M, BLOCK_N] as the A operand of the p.v wgmma. PACKED_KEYS (fp8): in each group of 16 columns,
    column 8g + 2c + b goes to 4c + 2g + b, which is where the accumulator layout has it in the operand's
    register order (no exchange between threads); V's keys are stored in that order (fp8.Fp8V)."""
    if PACKED_KEYS:
        M: gl.constexpr = p.shape[0]
        N: gl.constexpr = p.shape[1]
        p = gl.reshape(gl.permute(gl.reshape(p, [M, N // 16, 2, 4, 2]), (0, 1, 3, 2, 4)), [M, N])
    return gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _p_carry(p, dtype: gl.constexpr, p_layout: gl.constexpr, PACKED_KEYS: gl.constexpr):
    """P as the pipelined loop carries it to the next iteration's p.v: float32 for fp8 (converted in the block
    that issues the wgmma, _p_from_carry), else the 16-bit operand itself. An fp8 operand carried around the
    loop is one byte per register across the back edge, and packing those bytes for the wgmma cost ~100 PRMT
    per thread and block (docs/design/fp8.md); 16-bit operands carried as they are measured ~1% faster than float32
    (an A/B run, 2026-11-21)."""
    if dtype.primitive_bitwidth == 8:
        return p
    else:
        return p_operand(p, dtype, p_layout, PACKED_KEYS)


@gluon.jit
def _p_from_carry(p_carry, dtype: gl.constexpr, p_layout: gl.constexpr, PACKED_KEYS: gl.constexpr):
    """The p.v A operand from what _p_carry returned."""
    if dtype.primitive_bitwidth == 8:
        return p_operand(p_carry, dtype, p_layout, PACKED_KEYS)
    else:
        return p_carry


@gluon.jit
def _v_operand(v_bufs, s, V_SEQ_MAJOR: gl.constexpr):
    """Ring buffer s of V as the [BLOCK_N, DV] B operand of p.v (a transposed view of a sequence-major tile)."""
    if V_SEQ_MAJOR:
        return v_bufs.index(s).reshape([v_bufs.shape[3], v_bufs.shape[4]]).permute((1, 0))
    else:
        return v_bufs.index(s).reshape([v_bufs.shape[2], v_bufs.shape[4]])


@gluon.jit
def _turn_wait(turns, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """PINGPONG: wait for this warpgroup's turn t to issue wgmmas. The consumers take turns strictly (WG 0's
    turn t, WG 1's turn t, WG 0's turn t + 1, ...): WG 0's first wait passes (parity 1 of a fresh barrier),
    every other waits for the other warpgroup's _turn_pass. Both warpgroups take one turn per issue group
    (prologue, each steady step, epilogue) of the same key blocks, so their counts stay equal."""
    if PINGPONG:
        mbarrier.wait(turns.index(WG), (t & 1) ^ (1 - WG))


@gluon.jit
def _turn_pass(turns, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """PINGPONG: this warpgroup's wgmmas of turn t are issued: the other warpgroup's turn. Returns t + 1."""
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - WG))
    return t + 1


@gluon.jit
def _pipelined_steps(acc, m_i, l_i, p_carry, kv, n_lo, lst, base, tail, b_start, b_end, o_m, o_n, q_smem, k_bufs,
                     v_bufs,
                     k_ready, v_ready, kv_empty, seqlen_k, off_diag, left, right, sm_scale, softcap_scale,
                     softcap_out, fm, caps_s, caps_m, turns, t, WG: gl.constexpr, PINGPONG: gl.constexpr,
                     MASKED: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                     HAS_SOFTCAP: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr,
                     o_layout: gl.constexpr, p_layout: gl.constexpr, P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr,
                     V_SEQ_MAJOR: gl.constexpr, FLEX: gl.constexpr, SCORE_MOD: gl.constexpr,
                     MASK_MOD: gl.constexpr):
    """Steady-state iterations b in [b_start, b_end): q.k of block b and p.v of block b - 1 go to the tensor
    cores together; the softmax of b waits only for the first. p_carry holds P of block b - 1 (_p_carry);
    block b sits in ring buffer (kv + b) % STAGES. PINGPONG: both wgmmas of a step are issued in this warpgroup's
    turn t (returned advanced), so the other warpgroup's softmax runs under them.

    No data-dependent branch inside the loop (MASKED is a constexpr): the assembler keeps a wgmma in flight
    only across straight-line code, and waits for all of them at a join."""
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    D: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    dtype: gl.constexpr = v_bufs.dtype
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for it in range(b_start, b_end):
        s = (kv + it) % STAGES
        sp = (kv + it - 1) % STAGES
        mbarrier.wait(k_ready.index(s), ((kv + it) // STAGES) & 1)
        _turn_wait(turns, t, WG, PINGPONG)
        qk = warpgroup_mma(q_smem, k_bufs.index(s).reshape([BLOCK_N, D]).permute((1, 0)), s_zero, use_acc=False,
                           is_async=True)
        p_op = _p_from_carry(p_carry, dtype, p_layout, V_SEQ_MAJOR)
        mbarrier.wait(v_ready.index(sp), ((kv + it - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, _v_operand(v_bufs, sp, V_SEQ_MAJOR), acc, is_async=True)
        t = _turn_pass(turns, t, WG, PINGPONG)
        qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk, ))
        p, alpha, m_i, l_i = softmax_block(qk, m_i, l_i, block_start(it, n_lo, lst, base, tail, BLOCK_N, FLEX), o_m,
                                            o_n, MASKED, seqlen_k, off_diag, left, right, sm_scale, softcap_scale,
                                            softcap_out, fm, caps_s, caps_m, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP,
                                            P_SHIFT, EXP2_FMA, FLEX, SCORE_MOD, MASK_MOD)
        # a 16-bit P of this block overwrites the registers the p.v wgmma in flight reads: convert only after its
        # wait. (ptxas 12.x still schedules this wait ahead of most of the softmax; see docs/design/dense.md.)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(kv_empty.index(sp))
        p_carry = _p_carry(p, dtype, p_layout, V_SEQ_MAJOR)
        acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return acc, m_i, l_i, p_carry, t


@gluon.jit
def _consume_pipelined(acc, m_i, l_i, kv, n_lo, n_blocks, b_full_lo, b_full_hi, o_m, q_smem, k_bufs, v_bufs,
                       k_ready, v_ready, kv_empty, seqlen_k, off_diag, left, right, sm_scale, softcap_scale,
                       softcap_out, n_part, tail, fm, caps_s, caps_m, turns, t, WG: gl.constexpr,
                       PINGPONG: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
                       HAS_SOFTCAP: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr,
                       o_layout: gl.constexpr,
                       P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr, V_SEQ_MAJOR: gl.constexpr, FLEX: gl.constexpr,
                       SCORE_MOD: gl.constexpr, MASK_MOD: gl.constexpr, q_free, KSTAGE: gl.constexpr):
    """All the CTA's key blocks, software-pipelined (FlashAttention-3's intra-warpgroup overlap): block 0's
    scores, then masked / unmasked / masked steady-state ranges, then the p.v of the last block. Flex: the
    masked range is the block mask's partial list (b_full_lo = n_part; FLEX_TAIL: and a ragged full block first),
    the unmasked one its full list. KSTAGE (epilogue "kstage"), with blocks: the Q slot's `empty` barrier q_free
    is arrived on once every q.k is waited on (before the last p.v), and the last block's stage is not handed
    back here (its K buffer stages O: _consume_tile hands it back after the store)."""
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    D: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    dtype: gl.constexpr = v_bufs.dtype
    # P in registers as the A operand of the p.v wgmma: 32 bits of k per thread (2 fp16 or 4 fp8 values)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                 k_width=32 // dtype.primitive_bitwidth)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    p_carry = _p_carry(gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), dtype, p_layout, V_SEQ_MAJOR)
    if n_blocks > 0:
        if n_part > 0:
            n_first = block_start(0, n_lo, tail[1], 0, tail, BLOCK_N, FLEX)
        else:
            n_first = block_start(0, n_lo, tail[2], 0, tail, BLOCK_N, FLEX)
        mbarrier.wait(k_ready.index(kv % STAGES), (kv // STAGES) & 1)
        _turn_wait(turns, t, WG, PINGPONG)
        qk = warpgroup_mma(q_smem, k_bufs.index(kv % STAGES).reshape([BLOCK_N, D]).permute((1, 0)),
                           gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout), use_acc=False, is_async=True)
        t = _turn_pass(turns, t, WG, PINGPONG)
        qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk, ))
        # block 0 is masked whichever range it is in (the rule holds trivially on a fully visible block)
        p, alpha, m_i, l_i = softmax_block(qk, m_i, l_i, n_first, o_m, o_n, True, seqlen_k, off_diag, left,
                                            right, sm_scale, softcap_scale, softcap_out, fm, caps_s, caps_m,
                                            HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, P_SHIFT, EXP2_FMA, FLEX, SCORE_MOD,
                                            MASK_MOD)
        p_carry = _p_carry(p, dtype, p_layout, V_SEQ_MAJOR)
    b1 = gl.maximum(b_full_lo, 1)
    b2 = gl.maximum(b_full_hi, b1)
    # masked blocks [1, b1), unmasked [b1, b2), masked [b2, n_blocks) (flex: b2 = n_blocks, the full list last)
    acc, m_i, l_i, p_carry, t = _pipelined_steps(
        acc, m_i, l_i, p_carry, kv, n_lo, tail[1], 0, tail, 1, b1, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready, v_ready,
        kv_empty, seqlen_k, off_diag, left, right, sm_scale, softcap_scale, softcap_out, fm, caps_s, caps_m, turns,
        t, WG, PINGPONG, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, STAGES, s_layout, o_layout, p_layout, P_SHIFT,
        EXP2_FMA, V_SEQ_MAJOR, FLEX, SCORE_MOD, MASK_MOD)
    acc, m_i, l_i, p_carry, t = _pipelined_steps(
        acc, m_i, l_i, p_carry, kv, n_lo, tail[2], n_part, tail, b1, b2, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready,
        v_ready, kv_empty, seqlen_k, off_diag, left, right, sm_scale, softcap_scale, softcap_out, fm, caps_s, caps_m,
        turns, t, WG, PINGPONG, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, STAGES, s_layout, o_layout, p_layout, P_SHIFT,
        EXP2_FMA, V_SEQ_MAJOR, FLEX, SCORE_MOD, MASK_MOD)
    acc, m_i, l_i, p_carry, t = _pipelined_steps(
        acc, m_i, l_i, p_carry, kv, n_lo, tail[1], 0, tail, b2, n_blocks, o_m, o_n, q_smem, k_bufs, v_bufs, k_ready,
        v_ready, kv_empty, seqlen_k, off_diag, left, right, sm_scale, softcap_scale, softcap_out, fm, caps_s,
        caps_m, turns, t, WG, PINGPONG, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, STAGES, s_layout, o_layout,
        p_layout, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, FLEX, SCORE_MOD, MASK_MOD)
    if n_blocks > 0:
        if KSTAGE:  # this warpgroup reads Q no more: the loader may load the next tile's
            mbarrier.arrive(q_free)
        sp = (kv + n_blocks - 1) % STAGES
        mbarrier.wait(v_ready.index(sp), ((kv + n_blocks - 1) // STAGES) & 1)
        p_op = _p_from_carry(p_carry, dtype, p_layout, V_SEQ_MAJOR)
        _turn_wait(turns, t, WG, PINGPONG)
        acc = warpgroup_mma(p_op, _v_operand(v_bufs, sp, V_SEQ_MAJOR), acc, is_async=True)
        t = _turn_pass(turns, t, WG, PINGPONG)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if not KSTAGE:
            mbarrier.arrive(kv_empty.index(sp))
    return acc, m_i, l_i, t


@gluon.jit
def consumer(args, WG: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
              HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
              RETURN_LSE: gl.constexpr, REVERSE_M: gl.constexpr, HAS_DESCALE: gl.constexpr, P_SHIFT: gl.constexpr,
              EXP2_FMA: gl.constexpr, V_SEQ_MAJOR: gl.constexpr, SEPARATE_O: gl.constexpr, FLEX: gl.constexpr,
              SCORE_MOD: gl.constexpr, MASK_MOD: gl.constexpr, PINGPONG: gl.constexpr, ORDERED: gl.constexpr,
              EPILOGUE: gl.constexpr):
    """Consumer warpgroup WG; args: the run-time arguments every consumer shares (attn_fwd_pipeline's c_args)."""
    (o_desc, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, lse_ptr,
     stride_lb, stride_lh, qd_ptr, kd_ptr, vd_ptr, stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb,
     stride_vdh, num_tiles, num_m, num_heads, group_size, seqlen_q, seqlen_k, off_diag, left, right, sm_scale,
     softcap_scale, softcap_out, out_scale, fx, caps_s, caps_m, order) = args
    j = 0  # tiles done so far: Q slot and phase
    kv = 0  # K/V tiles consumed so far (the loader's count): ring slot and phase
    t = 0  # wgmma turns taken so far (PINGPONG)
    for r in range(rounds(num_tiles, order, ORDERED)):
        valid, i_m, i_bh = tile_of(r, num_m, num_tiles, REVERSE_M, order, ORDERED)
        if valid:
            i_b = i_bh // num_heads
            i_hk = (i_bh % num_heads) // group_size
            tile_scale = sm_scale
            tile_cap_scale = softcap_scale
            tile_out_scale = out_scale
            flex_scale = fx[16]
            if HAS_DESCALE:  # fp8: the scores carry q_descale * k_descale, the output v_descale
                qk_descale = gl.load(qd_ptr + i_b * stride_qdb + i_hk * stride_qdh) * gl.load(
                    kd_ptr + i_b * stride_kdb + i_hk * stride_kdh)
                tile_out_scale = out_scale * gl.load(vd_ptr + i_b * stride_vdb + i_hk * stride_vdh)
                if FLEX:  # the descales go in before score_mod
                    flex_scale = flex_scale * qk_descale
                elif HAS_SOFTCAP:
                    tile_cap_scale = softcap_scale * qk_descale
                else:
                    tile_scale = sm_scale * qk_descale
            if FLEX and SCORE_MOD is None:
                # no score_mod: the (positive) scale goes into exp2's argument after the row max, as in dense,
                # instead of one multiply per score (~14% of the unmasked loop's instructions at D=128)
                tile_scale = tile_scale * flex_scale
            j, kv, t = _consume_tile(
                o_desc, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, lse_ptr,
                stride_lb, stride_lh, j, kv, t, i_m, i_bh, num_heads, seqlen_q, seqlen_k, off_diag, left, right,
                tile_scale, tile_cap_scale, softcap_out, tile_out_scale, fx, flex_scale, caps_s, caps_m, WG, BLOCK_M,
                STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, RETURN_LSE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR,
                SEPARATE_O, FLEX, SCORE_MOD, MASK_MOD, PINGPONG, EPILOGUE)
    if EPILOGUE == "deferred":  # the last tile's store must have read its buffer before the CTA's shared memory goes
        tma.store_wait(pendings=0)


@gluon.jit
def _consume_tile(o_desc, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
                  lse_ptr, stride_lb, stride_lh, j, kv, t, i_m, i_bh, num_heads, seqlen_q, seqlen_k, off_diag, left,
                  right, sm_scale, softcap_scale, softcap_out, out_scale, fx, flex_scale, caps_s, caps_m,
                  WG: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
                  HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                  RETURN_LSE: gl.constexpr, P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr, V_SEQ_MAJOR: gl.constexpr,
                  SEPARATE_O: gl.constexpr, FLEX: gl.constexpr, SCORE_MOD: gl.constexpr, MASK_MOD: gl.constexpr,
                  PINGPONG: gl.constexpr, EPILOGUE: gl.constexpr):
    """This warpgroup's rows of one tile: Q from slot j % Q_SLOTS, K/V blocks from ring position kv, wgmma turns
    from t (PINGPONG). EPILOGUE (Sm90Config.epilogue), how O leaves:
    - "tma": staged in the Q slot (then handed back to the loader) or in this warpgroup's O buffer (SEPARATE_O),
      stored by TMA, and the store waited for before the tile ends;
    - "deferred": the same, with the wait moved to the next tile, where the buffer is needed again: before staging
      the next O (SEPARATE_O), or once the next tile's Q has landed (the Q slot goes back to the loader then; needs
      Q_SLOTS >= 2, else the next Q would wait for the slot this wait releases);
    - "kstage": staged in the K buffer of the stage of the tile's last block, the Q slot handed back before the last
      p.v and that stage after the store (gluon_attn_sm90.py gives the order of the barriers).
    Returns the three counts advanced."""
    D: gl.constexpr = q_bufs.shape[4]
    BLOCK_N: gl.constexpr = k_bufs.shape[2]
    DV: gl.constexpr = o_desc.block_type.shape[3]
    dtype: gl.constexpr = q_bufs.dtype
    # the K of one wgmma instruction: 256 bits of each operand row (16 fp16 or 32 fp8 values)
    INSTR_K: gl.constexpr = 256 // dtype.primitive_bitwidth
    if not SEPARATE_O:
        gl.static_assert(DV == D, "O is staged in the Q slot: Dv must equal D")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, INSTR_K])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DV, INSTR_K])
    s_row: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_row: gl.constexpr = gl.SliceLayout(1, o_layout)
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    m0_cta, n_lo, n_blocks, n_part, tail = tile_blocks(fx, i_b, i_h, i_m, seqlen_q, seqlen_k, off_diag, left,
                                                        right, NUM_CONSUMERS * BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                                                        FLEX, 4)
    m0 = m0_cta + WG * BLOCK_M
    m_last = gl.minimum(m0 + BLOCK_M, seqlen_q) - 1
    if FLEX:  # the block mask's partial blocks (masked), then its full ones (FLEX_TAIL: a ragged full block first,
        # masked; rows past Sq are computed, not stored)
        b_full_lo = n_part + tail[4].to(gl.int32)
        b_full_hi = n_blocks
    else:
        _, _, full_lo, full_hi = _key_range(m0, m_last, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT,
                                            HAS_RIGHT)
        # split the tile's n_blocks key blocks (from n_lo) by this warpgroup's rows, in block indices so that
        # the three ranges always add up to the loader's count: a partial block at either end is masked
        b_full_lo = gl.minimum(gl.maximum(gl.cdiv(full_lo - n_lo, BLOCK_N), 0), n_blocks)
        b_full_hi = gl.minimum(gl.maximum((full_hi - n_lo) // BLOCK_N, b_full_lo), n_blocks)
        if m0 >= seqlen_q:  # no row of this warpgroup exists (nothing is stored): mask every block
            b_full_lo = 0
            b_full_hi = 0

    Q_SLOTS: gl.constexpr = q_ready.shape[0]
    slot = j % Q_SLOTS
    q_smem = q_bufs.index(slot * NUM_CONSUMERS + WG).reshape([BLOCK_M, D])
    o_m = m0 + gl.arange(0, BLOCK_M, layout=s_row)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=s_row)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_row)
    acc = gl.zeros([BLOCK_M, DV], gl.float32, layout=o_layout)
    mbarrier.wait(q_ready.index(slot), (j // Q_SLOTS) & 1)
    if EPILOGUE == "deferred" and not SEPARATE_O:
        gl.static_assert(Q_SLOTS >= 2, "a deferred store of O staged in the Q slot needs two Q slots")
        if j > 0:  # the previous tile's O, staged in its Q slot, is read by now: the slot goes back to the loader
            tma.store_wait(pendings=0)
            mbarrier.arrive(q_empty.index((j - 1) % Q_SLOTS))
    acc, m_i, l_i, t = _consume_pipelined(acc, m_i, l_i, kv, n_lo, n_blocks, b_full_lo, b_full_hi, o_m, q_smem,
                                          k_bufs, v_bufs, k_ready, v_ready, kv_empty, seqlen_k, off_diag, left,
                                          right, sm_scale, softcap_scale, softcap_out, n_part, tail,
                                          (i_b, i_h, flex_scale), caps_s, caps_m, turns, t, WG, PINGPONG,
                                          HAS_LEFT, HAS_RIGHT,
                                       HAS_SOFTCAP, STAGES, s_layout, o_layout, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, FLEX,
                                       SCORE_MOD, MASK_MOD, q_empty.index(slot), EPILOGUE == "kstage")

    # rows that saw no key: l = 0, acc = 0 -> out 0, lse -inf
    seen = l_i > 0.0
    l_safe = gl.where(seen, l_i, 1.0)
    n_ring = n_blocks  # K/V blocks this tile takes from the ring
    if EPILOGUE == "kstage":
        gl.static_assert(not SEPARATE_O, "epilogue 'kstage' stages O in a K buffer of the input dtype")
        gl.static_assert(NUM_CONSUMERS * BLOCK_M <= BLOCK_N, "epilogue 'kstage': the tile's O rows fit one K buffer")
        # O is staged in the K buffer of the last block's stage. A tile without keys (a window, Sq > Sk
        # bottom-right: out 0, lse -inf) has the loader bring one block all the same (_load_tile), only for that
        # stage: it is not computed (so the key loops are those of "tma"), but its loads are waited for before
        # the stage is written or handed back, and the Q slot is handed back here instead of before a last p.v
        if n_blocks == 0:
            mbarrier.arrive(q_empty.index(slot))
            mbarrier.wait(k_ready.index(kv % STAGES), (kv // STAGES) & 1)
            mbarrier.wait(v_ready.index(kv % STAGES), (kv // STAGES) & 1)
        n_ring = gl.maximum(n_blocks, 1)
        last = (kv + n_ring - 1) % STAGES
        out = acc / gl.convert_layout(l_safe, o_row)[:, None]
        # q_empty's phase of this tile completes when every warpgroup has waited on its last q.k
        # (_consume_pipelined): no one reads the last stage's K any more, and the loader cannot refill it before
        # this warpgroup hands it back below
        mbarrier.wait(q_empty.index(slot), (j // Q_SLOTS) & 1)
        # the K ring seen as O tiles: [BLOCK_N, D] and [BLOCK_M, D] tiles of one dtype share the 128-byte swizzle,
        # so stage s holds BLOCK_N // BLOCK_M O tiles, disjoint (at D = 128, K's two 64-column slabs); BLOCK_N is a
        # multiple of BLOCK_M (both powers of two, BLOCK_M <= BLOCK_N: Sm90Config)
        PER: gl.constexpr = BLOCK_N // BLOCK_M
        o_view = smem_reinterpret(k_bufs, o_desc.dtype, [k_bufs.shape[0] * PER] + o_desc.block_type.shape,
                                  o_desc.layout)
        o_buf = o_view.index(last * PER + WG)
        o_buf.reshape([BLOCK_M, DV]).store(out.to(o_desc.dtype))
        fence_async_shared()
        tma_store(o_desc, [i_b, m0, i_h, 0], o_buf)
    else:
        if SEPARATE_O:
            mbarrier.arrive(q_empty.index(slot))  # the Q tile's last wgmma was waited on: the loader may refill it
            out = acc * gl.convert_layout(out_scale / l_safe, o_row)[:, None]
            o_buf = o_bufs.index(WG)
        else:
            out = acc / gl.convert_layout(l_safe, o_row)[:, None]
            o_buf = q_bufs.index(slot * NUM_CONSUMERS + WG)  # the Q tile is no longer read: stage O there
        if EPILOGUE == "deferred" and SEPARATE_O:
            tma.store_wait(pendings=0)  # the previous tile's store has read this O buffer
        o_buf.reshape([BLOCK_M, DV]).store(out.to(o_desc.dtype))
        fence_async_shared()
        tma_store(o_desc, [i_b, m0, i_h, 0], o_buf)
    if RETURN_LSE:
        lse = gl.where(seen, (m_i * sm_scale + gl.log2(l_safe) - P_SHIFT) * LN2, float("-inf"))
        gl.store(lse_ptr + i_b.to(gl.int64) * stride_lb + i_h.to(gl.int64) * stride_lh + o_m, lse,
                 mask=o_m < seqlen_q)
    if EPILOGUE == "tma":
        tma.store_wait(pendings=0)  # the store has read the buffer: it may be written again
        if not SEPARATE_O:
            mbarrier.arrive(q_empty.index(slot))
    elif EPILOGUE == "kstage":
        tma.store_wait(pendings=0)
        mbarrier.arrive(kv_empty.index(last))  # the last stage goes back to the loader (the Q slot went before)
    return j + 1, kv + n_ring, t
