"""The Hopper (sm90) attention forward pipeline in Gluon, with FlashAttention-3's warp-specialized schedule:
`attn_fwd_pipeline`, the body of the dense kernel (ops/dense/gluon_sm90.py, attn_fwd_sm90_kernel) and of the
flex kernel (ops/flex/gluon_sm90.py, flex_fwd_sm90_kernel, FLEX mode: key blocks from a block mask, traced
score / mask mods).

A tile is NUM_CONSUMERS * BLOCK_M query rows of one (batch, query head). The grid may be persistent: each
CTA walks one tile per round (`tile_of`: heaviest causal query blocks first, dealt out in a snake), and its
partitions keep their barrier phases running across tiles:
  - a loader partition (one warp; gluon_sm90_loader.py) loads a tile's Q into one of Q_SLOTS Q slots (with
    two, the next tile's Q arrives while the current tile runs; D = 256 has room for one), then streams its K
    and V tiles through a ring of STAGES shared-memory buffers with TMA, signalling `k_ready` / `v_ready`
    barriers per buffer;
  - NUM_CONSUMERS consumer warpgroups (4 warps each; gluon_sm90_consumer.py) own BLOCK_M rows each: S = Q K^T
    by wgmma from shared memory, the online softmax in registers, O += P V with P from registers. They read the
    same K/V buffers; a buffer is handed back to the loader when every consumer has arrived on its `empty`
    barrier. O is staged for its TMA store in the tile's own Q slot, which is handed back (`q_empty`) once the
    store has read it (Sm90Config.epilogue "tma"; "deferred" waits for the store in the next tile).
Epilogue "kstage" (16-bit, a tile's O rows within one K tile): O is staged in the K buffer of the stage L that holds
the tile's last key block instead, so the single Q slot of D = 128 is free before the epilogue. Per tile, each
consumer warpgroup, in this order:
  1. every q.k of the tile waited on (the last in the last steady step, or block 0's when it is the only one): it
     arrives on `q_empty` of its slot, before issuing the last p.v. When every warpgroup has, the loader may load
     the next tile's Q into the slot (its first STAGES - 1 K/V blocks went first: their stages were freed in the
     loop; the block that reuses L goes after Q);
  2. the last p.v (V of L) waited on: L's `kv_empty` is NOT arrived on (the other stages were, in the loop);
  3. it waits for `q_empty`'s phase of this tile: every warpgroup is past its last q.k, so no one reads K of L,
     and the loader, which waits the ring in order, cannot refill L before step 5;
  4. it writes its BLOCK_M rows of O into its own 16 KB of K of L (the K ring seen as O tiles: one 128-byte swizzle;
     at D = 128 a K tile is two column slabs of 64, so warpgroup w's O lands in slab w),
     fences (generic -> async proxy) and issues the TMA store (the lse goes out by plain stores meanwhile);
  5. it waits for the store to have read the buffer and arrives on L's `kv_empty`.
A tile without key blocks (a window or Sq > Sk bottom-right) has the loader bring one block all the same, not
computed: its warpgroups arrive on `q_empty` and wait for that block's K and V to land instead of step 1-2, then
go on from step 3 (one store site, so the key loops compile as with "tma"). With PINGPONG the turns are
untouched: step 3 waits only for the other warpgroup's step 1, which needs no turn of this one's after its last p.v.
The consumers are independent warpgroups, so the softmax of one overlaps the wgmma of the other, and the loader
runs STAGES tiles ahead. PINGPONG (Sm90Config.pingpong) makes that order strict, as FlashAttention-3's warp
scheduler barrier does: the consumers issue their wgmmas in turns (`turns` barriers, the consumer's _turn_wait /
_turn_pass), so one warpgroup's softmax always runs under the other's wgmmas instead of both softmaxes at once.

Masking model and key-block ranges are those of masking.py: key j is visible to query i
iff i + OFF - LEFT <= j <= i + OFF + RIGHT and j < Sk. Every consumer walks the CTA's key blocks in the same
order (the loader's order) and splits them by its own rows into masked / unmasked / masked ranges (a block
none of its rows can see is computed fully masked: p = 0, at most one such block per CTA for causal).

Tensors are [B, S, H, D] with any strides whose bytes are 16-byte aligned (TMA); rows beyond a sequence are
zero-filled on load and clipped on store by the copy engine. Scores are kept raw (q.k) and the scale (times
log2 e) is folded into the exp2 argument, one FFMA per element.

fp8 (fp8.py): q, k, v in one fp8 dtype; V_SEQ_MAJOR: V's descriptor is over the packed layout
[B, Hkv, D, Sk'] of fp8.Fp8V (fp8 wgmma operands must be K-major, and the P V product's K is the key index;
keys in the order P's registers hold them, see gluon_sm90_consumer.p_operand); P is rounded
to V's dtype after a scaling by 2 ** P_SHIFT folded into exp2's argument; HAS_DESCALE reads per-(batch, kv
head) descales; the output (another dtype) is staged in its own buffers instead of the Q slot.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .gluon_sm90_consumer import consumer
from .gluon_sm90_loader import loader


@gluon.jit
def attn_fwd_pipeline(
    q_desc, k_desc, v_desc, o_desc, lse_ptr, qd_ptr, kd_ptr, vd_ptr, stride_lb, stride_lh,
    stride_qdb, stride_qdh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    seqlen_q, seqlen_k, num_heads, group_size, num_bh,
    sm_scale, softcap_scale, softcap_out, out_scale, left, right, fx, caps_s, caps_m,
    BLOCK_M: gl.constexpr, Q_SLOTS: gl.constexpr, STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
    HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, ALIGN_BOTTOM_RIGHT: gl.constexpr,
    HAS_SOFTCAP: gl.constexpr, RETURN_LSE: gl.constexpr, REVERSE_M: gl.constexpr,
    HAS_DESCALE: gl.constexpr, P_SHIFT: gl.constexpr, EXP2_FMA: gl.constexpr, V_SEQ_MAJOR: gl.constexpr,
    SEPARATE_O: gl.constexpr,
    FLEX: gl.constexpr, SCORE_MOD: gl.constexpr, MASK_MOD: gl.constexpr, PINGPONG: gl.constexpr,
    NUM_CONSUMERS: gl.constexpr, order, ORDERED: gl.constexpr, EPILOGUE: gl.constexpr,
):
    """The whole forward: shared memory, barriers, and the loader and NUM_CONSUMERS (2 or 3) consumer partitions.
    order = (an int32 table, its rounds): with ORDERED the persistent grid takes its tiles from it (tile_of), else
    (any placeholders) the snake order. EPILOGUE: the consumer's _consume_tile's.
    The dense and flex kernels' docstrings say what their arguments hold; fx, caps_s / caps_m, SCORE_MOD /
    MASK_MOD are the flex mode's block mask and mods (placeholders for dense). Three consumers (tiles of 3 *
    BLOCK_M rows, 16 warps: at most 160 registers each) take no PINGPONG (its turns alternate two)."""
    gl.static_assert(NUM_CONSUMERS == 2 or (NUM_CONSUMERS == 3 and not PINGPONG),
                     "2 consumer warpgroups, or 3 without pingpong")
    num_m = gl.cdiv(seqlen_q, NUM_CONSUMERS * BLOCK_M)
    num_tiles = num_m * num_bh
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    else:
        off_diag = 0

    # Q_SLOTS Q slots of one tile per consumer (slot-major), STAGES K/V buffers, one O buffer per consumer
    # when O has its own dtype
    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [Q_SLOTS * NUM_CONSUMERS] + q_desc.block_type.shape,
                                       q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    if SEPARATE_O:
        o_bufs = gl.allocate_shared_memory(o_desc.dtype, [NUM_CONSUMERS] + o_desc.block_type.shape, o_desc.layout)
    else:
        o_bufs = q_bufs
    q_ready = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [Q_SLOTS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())  # PINGPONG
    for s in gl.static_range(Q_SLOTS):
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(q_empty.index(s), count=NUM_CONSUMERS)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=NUM_CONSUMERS)
    if PINGPONG:
        for w in gl.static_range(NUM_CONSUMERS):
            mbarrier.init(turns.index(w), count=1)

    # each partition's run-time arguments in one tuple (the constexprs stay literal elements of its partition's
    # tuple: a tuple built by concatenation, or held in a variable, does not keep its elements constexpr)
    c_args = (o_desc, q_bufs, o_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, lse_ptr,
              stride_lb, stride_lh, qd_ptr, kd_ptr, vd_ptr, stride_qdb, stride_qdh, stride_kdb, stride_kdh,
              stride_vdb, stride_vdh, num_tiles, num_m, num_heads, group_size, seqlen_q, seqlen_k, off_diag, left,
              right, sm_scale, softcap_scale, softcap_out, out_scale, fx, caps_s, caps_m, order)
    l_args = (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
              num_tiles, num_m, num_heads, group_size, seqlen_q, seqlen_k, off_diag, left, right, fx, order)
    if NUM_CONSUMERS == 2:
        gl.warp_specialize([
            (consumer, (c_args, 0, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, RETURN_LSE,
                         REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, SEPARATE_O, FLEX, SCORE_MOD,
                         MASK_MOD, PINGPONG, ORDERED, EPILOGUE)),
            (consumer, (c_args, 1, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, RETURN_LSE,
                         REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, SEPARATE_O, FLEX, SCORE_MOD,
                         MASK_MOD, PINGPONG, ORDERED, EPILOGUE)),
            (loader, (l_args, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, REVERSE_M, V_SEQ_MAJOR, FLEX,
                      ORDERED, EPILOGUE)),
        ], [4, 1], [CONSUMER_REGS, 24])
    else:  # the first partition, two more consumer warpgroups, the loader
        gl.warp_specialize([
            (consumer, (c_args, 0, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, RETURN_LSE,
                         REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, SEPARATE_O, FLEX, SCORE_MOD,
                         MASK_MOD, PINGPONG, ORDERED, EPILOGUE)),
            (consumer, (c_args, 1, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, RETURN_LSE,
                         REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, SEPARATE_O, FLEX, SCORE_MOD,
                         MASK_MOD, PINGPONG, ORDERED, EPILOGUE)),
            (consumer, (c_args, 2, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, RETURN_LSE,
                         REVERSE_M, HAS_DESCALE, P_SHIFT, EXP2_FMA, V_SEQ_MAJOR, SEPARATE_O, FLEX, SCORE_MOD,
                         MASK_MOD, PINGPONG, ORDERED, EPILOGUE)),
            (loader, (l_args, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, REVERSE_M, V_SEQ_MAJOR, FLEX,
                      ORDERED, EPILOGUE)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])
