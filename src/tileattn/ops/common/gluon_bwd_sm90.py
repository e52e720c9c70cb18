"""The Hopper (sm90) attention backward pipeline in Gluon: dK, dV and dQ in one kernel, 5 matmuls per tile
(FlashAttention-3's backward schedule), deterministic. `attn_bwd_pipeline` is the body of the dense kernel
(ops/dense/gluon_bwd_sm90.py, attn_bwd_sm90_kernel) and of the flex kernel (ops/flex/gluon_bwd_sm90.py,
flex_bwd_sm90_kernel, FLEX mode: query blocks from a block mask's lists, traced score / mask mods).

Work items are (key block of BLOCK_N = 128 keys, batch * kv head) pairs, (batch, kv head)-major with the highest key
block first (PAIRED: key blocks n and K - 1 - n of a head one after the other), or with the key blocks of a group of
heads interleaved (walk.work_item; flex where its mask's walks
start in ties: bwd_kernels.chain_group). One CTA per item (SCHED = walk.PLAIN), or (ROTATED, PAIRED) a persistent,
cooperatively launched grid whose programs walk items pid, pid + programs, ... (PAIRED: pairs of items) with K and
V reloaded per item behind a kv_empty barrier. An item walks the query blocks (BLOCK_M = 64 or 128 rows:
launch_bwd_sm90.CONFIGS) that see its keys, for every query head of the kv head's group, in ascending order (masked
blocks below the unmasked range, the unmasked range, masked blocks above; flex: the block mask's transposed lists,
its partial blocks (masked by mask_mod) then its full ones), or in descending order (PAIRED's second items).
Partitions:
  - loader (1 warp; gluon_bwd_sm90_loader.py): K and V once, then each step's Q and dO tiles into a ring of
    STAGES slots (TMA), with the rows' lse and delta beside them (through registers: the consumers read them from
    shared memory where they use them instead of holding 32 registers across the wgmma waits);
  - two consumer warpgroups, each owning 64 of the keys (rows of the transposed tiles):
        S^T = K Q^T,  P^T = exp2(S^T * scale * log2 e - lse * log2 e),  dP^T = V dO^T,
        dS^T = P^T (dP^T - delta)  (times 1 - tanh^2 with a softcap; flex: z, z' = score_mod's value and
        derivative at scale * S^T, P^T = exp2(z * log2 e - lse * log2 e), dS^T times z'),
        dV += P^T dO,  dK += dS^T Q  (P^T, dS^T from registers),
    then both write dS^T into shared memory, and each computes half of dQ = dS K from it (wgmma with both
    operands in shared memory: half the head dim, or with BLOCK_M = 128 half the rows), staged as float32 for
    the writer (dense, except under a right bound with 128-row steps: dQ goes before dK and is staged while dK
    runs);
  - two dQ writers (1 warp each, even and odd steps): add each step's dQ tile to the query block's float32 sum in global
    memory, in a fixed order of the key blocks (PLAIN: descending; ROTATED, PAIRED: below): a counter per (query head,
    query block) (zeroed by the backward's preprocess, launch_bwd_sm90.zero_args) says how many key blocks have
    added; the writer spins until it is its turn (one lane polls), adds (the first key block of a query block stores
    instead) and passes the turn on with a release, which orders its adds before the next block's. Adds are vector
    atomics, or at D=128 one TMA reduce-add per half (TMA_DQ; launch_bwd_sm90.CONFIGS). Waiting happens in the writers
    only: the consumers go on with the next tiles while they wait, and two writers keep two query blocks in flight. The
    turn of a key block is (PLAIN) the number of higher key blocks that see the query block: from the masking rule
    (dense) or by counting them in the query block's forward lists (flex; those lists and the transposed ones must
    describe the same mask, as torch's BlockMask constructors make them).
    After an item's last add is written, each writer counts once on the (batch, kv head)'s done counter.
    bwd_kernels.bwd_dq_convert_kernel then writes dQ = scale * sum in dQ's dtype. It is launched with
    programmatic dependent launch, and the loader lets it start as soon as every program of the grid runs: its
    programs fill the SMs the grid's tail frees, each waiting for its head's done count (on the plain grid a
    head's longest items come last under a causal rule: launch_bwd_sm90.convert).
ROTATED (dense problems where every key block sees every query block: whole tiles, no window): key block n starts
its walk at query block rot(n) = n * query blocks // key blocks and wraps around, and the adds to a query block go
in the order the walks reach it (_turn), so in the steady state no add waits for another (the plain order had
every key block reach a query block at the same step). That order is cyclic, so it is free of deadlock only with
every key block of a head running: the host takes it only with a cooperative grid holding whole heads per round
(launch_bwd_sm90.grid). Measured +10-23% at N 1K-4K non-causal (docs/design/backward.md).
Why this order: under a causal rule (or a window with a right bound) a lower key block's walk starts at a
lower query block (no rule or a left bound only: all start at block 0, the chain has no slack), so it
reaches each query block BLOCK_N / BLOCK_M steps after the key block above it, whose add is then long done (the
walk from the top down with ascending turns made every CTA wait for the chain of all lower key blocks on its
first query block; the new order measured causal +6-24% on the H100). Programs wait only on programs of the
same head with a higher key block, which have lower ids: they were dispatched first and are resident or done,
so the order cannot deadlock. PAIRED (square causal problems of whole tiles, MHA: walk.py): a program walks key
block n upwards, then key block K - 1 - n downwards, so that every program of a round does the same number of steps
(the plain grid ends on the heaviest items of its last heads), and the adds to a query block go in the order the
walks reach it (walk.paired_turn; cooperative grid, whole heads per round). Every float32 sum is formed in the
same order on every run: the same inputs give bit-identical gradients.

delta = rowsum(dO * O) - dlse comes from bwd_kernels.py's preprocess kernel. Masking model as masking.py (key j
visible to query i iff i + OFF - LEFT <= j <= i + OFF + RIGHT and j < Sk); rows past Sq are zero-filled by TMA
and get lse = +inf (p = 0), as do rows that saw no key (lse = -inf). Flex tiles are whole blocks of the mask
(Sq, Sk multiples of 128; FLEX_WHOLE): mask_mod alone masks. Otherwise (FLEX_TAIL) the rows and keys past Sq and
Sk are masked in every step as well, full blocks included.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import masking, softmax
from .gluon_bwd_sm90_dq import dq_writer
from .gluon_bwd_sm90_loader import loader
from .gluon_bwd_sm90_walk import (
    PAIRED,
    PLAIN,
    ROTATED,
    head_walk,
    program_item,
    program_items,
    step_counts,
    walk_m0,
    walk_next,
    work_item,
)
from .gluon_compat import thread_barrier

LOG2E = gl.constexpr(softmax.LOG2E)
FLEX_TAIL = gl.constexpr(masking.FLEX_TAIL)
_tanh = gluon.jit(softmax.tanh.fn)


# ---- consumers -----------------------------------------------------------------------------------------------
@gluon.jit
def _kv_views(k_bufs, v_bufs, i, WG: gl.constexpr, BUFS: gl.constexpr):
    """(this warpgroup's K rows, its V rows, the whole K tile): of buffer i of k_bufs / v_bufs ([1, 1, BLOCK_N, 1, D];
    i is 0, but may be computed at run time: _step's KV_FRESH) where BUFS, else of the [1, BLOCK_N, 1, D] tiles
    k_bufs / v_bufs themselves."""
    BLOCK_N: gl.constexpr = k_bufs.shape[-3]
    D: gl.constexpr = k_bufs.shape[-1]
    DV: gl.constexpr = v_bufs.shape[-1]
    if BUFS:
        k_tile = k_bufs.index(i)
        v_tile = v_bufs.index(i)
    else:
        k_tile = k_bufs
        v_tile = v_bufs
    k_full = k_tile.reshape([BLOCK_N, D])
    v_half = v_tile.reshape([BLOCK_N, DV]).slice(WG * (BLOCK_N // 2), BLOCK_N // 2, dim=0)
    return k_full.slice(WG * (BLOCK_N // 2), BLOCK_N // 2, dim=0), v_half, k_full


@gluon.jit
def _step(dk, dv, step, m0, n0, q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, q_ready, q_empty,
          ds_ready, dq_full, dq_empty, seqlen_q, seqlen_k, off_diag, left, right, qk_scale, softcap_scale,
          softcap_out, fm, full, caps_s, caps_m, WG: gl.constexpr, MASKED: gl.constexpr, HAS_LEFT: gl.constexpr,
          HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, STAGES: gl.constexpr, DQ_BUFS: gl.constexpr,
          FLEX: gl.constexpr, SCORE_GRAD: gl.constexpr, MASK_MOD: gl.constexpr, KV_FRESH: gl.constexpr):
    """One query block of this warpgroup's 64 keys: returns (dK, dV) plus its contribution; stages its half of
    the block's dQ part for the writer. Flex: fm = (batch, query head, scale) for the mods; full: a block of the
    mask's full list (mask_mod does not apply). K / V: k_bufs / v_bufs as _kv_views takes them. KV_FRESH (they are
    one-buffer arrays): the index is computed from the step (always 0), so that K's and V's wgmma descriptors
    are not loop-invariant: hoisted out of the step loops, ptxas spilled them and reloaded them with LDL.64 inside
    the S^T and dQ wgmma issue (triton 3.6 SASS of the causal plain-grid kernel, docs/design/backward.md,
    seventeenth and eighteenth rounds)."""
    if KV_FRESH:
        k_half, v_half, k_smem = _kv_views(k_bufs, v_bufs, step >> 30, WG, True)  # step < 2^30: index 0
    else:
        k_half, v_half, k_smem = _kv_views(k_bufs, v_bufs, 0, WG, False)
    BLOCK_M: gl.constexpr = q_bufs.shape[2]
    D: gl.constexpr = q_bufs.shape[4]
    DV: gl.constexpr = do_bufs.shape[4]
    HALF_N: gl.constexpr = k_half.shape[0]
    dtype: gl.constexpr = q_bufs.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    k_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    v_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DV, 16])
    DQ_C: gl.constexpr = dq_bufs.shape[2]  # the dQ part's columns: D // 2, or D where BLOCK_M = 128 splits rows
    q_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_C, 16])
    s = step % STAGES
    mbarrier.wait(q_ready.index(s), (step // STAGES) & 1)
    q_smem = q_bufs.index(s).reshape([BLOCK_M, D])
    do_smem = do_bufs.index(s).reshape([BLOCK_M, DV])
    zero = gl.zeros([HALF_N, BLOCK_M], gl.float32, s_layout)
    st = warpgroup_mma(k_half, q_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
    dpt = warpgroup_mma(v_half, do_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
    if FLEX:  # the mods' positions, queries along the columns of the transposed tile (float32: lowering.py)
        o_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
        o_n = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
        q_i = o_m[None, :]
        k_i = o_n[:, None]
        q_f = o_m.to(gl.float32)[None, :]
        k_f = o_n.to(gl.float32)[:, None]
    # the row statistics are read from shared memory where they are used (16 registers each: not held across
    # the wgmma waits)
    st = warpgroup_mma_wait(num_outstanding=1, deps=(st, ))
    lse = stat_bufs.index(2 * s).load(gl.SliceLayout(0, s_layout))  # times log2 e; +inf where p = 0
    if SCORE_GRAD is not None:
        z, dz = SCORE_GRAD(st * fm[2], fm[0], fm[1], q_i, k_i, q_f, k_f, caps_s)
        pt = gl.exp2(z * LOG2E - lse[None, :])
    elif HAS_SOFTCAP:
        th = _tanh(st * softcap_scale)
        pt = gl.exp2(th * softcap_out - lse[None, :])
    else:
        pt = gl.exp2(st * qk_scale - lse[None, :])
    if MASKED:
        if FLEX:  # mask_mod decides (none: every key of a partial block is visible); FLEX_TAIL: the padding rows
            # and keys of a last block past Sq or Sk are hidden too, in full blocks as well (a score mod may give
            # them values, or derivatives, that are not finite)
            if FLEX == FLEX_TAIL:
                bounds = (o_n < seqlen_k)[:, None] & (o_m < seqlen_q)[None, :]
            if MASK_MOD is not None and SCORE_GRAD is None:
                if not full:  # a branch around the mask alone: full blocks skip mask_mod and its loads (with a
                    # score mod the branch also carries dz: measured 2% slower with ALiBi, 9% with softcap)
                    pt = gl.where(MASK_MOD(fm[0], fm[1], q_i, k_i, q_f, k_f, caps_m), pt, 0.0)
                if FLEX == FLEX_TAIL:
                    pt = gl.where(bounds, pt, 0.0)
            elif MASK_MOD is not None or FLEX == FLEX_TAIL:
                if MASK_MOD is None:
                    vis = bounds
                elif FLEX == FLEX_TAIL:
                    vis = (MASK_MOD(fm[0], fm[1], q_i, k_i, q_f, k_f, caps_m) | full) & bounds
                else:
                    vis = MASK_MOD(fm[0], fm[1], q_i, k_i, q_f, k_f, caps_m) | full
                pt = gl.where(vis, pt, 0.0)
                if SCORE_GRAD is not None:
                    if len(dz.shape) != 0:  # a derivative that may not be finite where the mask hides the score:
                        # 0 there now, so that the mask is not held across the dP wait (packed predicates
                        # otherwise). (0-d: one value for every score, e.g. the 1 of score + bias: nothing to mask)
                        dz = gl.where(vis, dz, 0.0)
        else:
            o_m = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, s_layout))
            m_ok = o_m < seqlen_q
            o_n = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, s_layout))
            vis = (o_n < seqlen_k)[:, None] & m_ok[None, :]
            if HAS_RIGHT:
                vis = vis & (o_n[:, None] <= (o_m + off_diag + right)[None, :])
            if HAS_LEFT:
                vis = vis & (o_n[:, None] >= (o_m + off_diag - left)[None, :])
            pt = gl.where(vis, pt, 0.0)
    dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, ))
    delta = stat_bufs.index(2 * s + 1).load(gl.SliceLayout(0, s_layout))
    dst = pt * (dpt - delta[None, :])
    if HAS_SOFTCAP:
        dst = dst * (1.0 - th * th)
    if SCORE_GRAD is not None:
        dst = dst * dz
    # Dense problems issue dQ before dK and stage the dQ part while dK runs (FlashAttention-3's order): without a
    # right bound (the dQ turn chain has no slack) +2-4%; under causal rules at D=128 (64-row steps) +0.5-4.6% at
    # N 1K-16K, most at 16K (windows with a right bound take the same order, not measured apart), while D=64
    # (128-row steps) measured 2-4% slower there and keeps dK before the dS barrier (H100, docs/design/backward.md,
    # the eleventh round)
    DQ_UNDER_DK: gl.constexpr = not FLEX and (not HAS_RIGHT or BLOCK_M == 64)
    pt16 = gl.convert_layout(pt.to(dtype), gl.DotOperandLayout(operand_index=0, parent=v_layout, k_width=2))
    dv = warpgroup_mma(pt16, do_smem, dv, is_async=True)
    ds16 = dst.to(dtype)
    ds_a = gl.convert_layout(ds16, gl.DotOperandLayout(operand_index=0, parent=k_layout, k_width=2))
    if not DQ_UNDER_DK:
        dk = warpgroup_mma(ds_a, q_smem, dk, is_async=True)
    # dS^T into shared memory: both warpgroups' halves make the dQ operand. Buffer step % 2 is free again: a
    # warpgroup arrives on ds_ready of step i only after its dQ wgmma of step i - 1 has completed
    b = step % 2
    ds_bufs.index(b).slice(WG * HALF_N, HALF_N, dim=0).store(ds16)
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(ds_ready.index(b))
    if not DQ_UNDER_DK:
        dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(q_empty.index(s))
    mbarrier.wait(ds_ready.index(b), (step // 2) & 1)
    if BLOCK_M >= 128:  # this warpgroup's 64 query rows over the whole head dim (m64 n=D: half the operand
        # bytes per FLOP of m64 n=D/2 over all rows)
        dq = warpgroup_mma(ds_bufs.index(b).slice(WG * 64, 64, dim=1).permute((1, 0)), k_smem,
                           gl.zeros([64, D], gl.float32, q_layout), use_acc=False, is_async=True)
    else:
        dq = warpgroup_mma(ds_bufs.index(b).permute((1, 0)), k_smem.slice(WG * (D // 2), D // 2, dim=1),
                           gl.zeros([BLOCK_M, D // 2], gl.float32, q_layout), use_acc=False, is_async=True)
    if DQ_UNDER_DK:  # dV, dQ, dK in flight in that order: the dQ part is staged while dK runs
        dk = warpgroup_mma(ds_a, q_smem, dk, is_async=True)
        dv, dq = warpgroup_mma_wait(num_outstanding=1, deps=(dv, dq))
    else:
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ))
    qb = step % DQ_BUFS
    mbarrier.wait(dq_empty.index(qb), ((step // DQ_BUFS) & 1) ^ 1)
    dq_bufs.index(qb * 2 + WG).store(dq)
    fence_async_shared()  # (the TMA writer reads the buffer through the async proxy)
    thread_barrier()
    mbarrier.arrive(dq_full.index(qb))
    if DQ_UNDER_DK:  # (the Q / dO slot is released a dQ product later than in the other order)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ))
        mbarrier.arrive(q_empty.index(s))
    return dk, dv


@gluon.jit
def _consumer(q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, kv_ready, kv_empty, q_ready, q_empty,
              ds_ready, dq_full, dq_empty, dk_ptr, dv_ptr, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
              stride_vh, group_size, wk, fx, scale, qk_scale, softcap_scale, softcap_out, caps_s, caps_m,
              WG: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
              NEEDS_MASK: gl.constexpr, STAGES: gl.constexpr, DQ_BUFS: gl.constexpr, FLEX: gl.constexpr,
              Q_BLOCK: gl.constexpr, SCORE_GRAD: gl.constexpr, MASK_MOD: gl.constexpr, SCHED: gl.constexpr):
    """This warpgroup's 64 keys of each work item: dK and dV in registers over the item's steps, K and V handed
    back to the loader once its last step's products are done, then dK and dV stored."""
    BLOCK_M: gl.constexpr = q_bufs.shape[2]
    BLOCK_N: gl.constexpr = ds_bufs.shape[1]
    if SCHED != PLAIN:  # a persistent grid (walk.program_item)
        step = 0
        for it in range(program_items(wk[0], SCHED)):
            i_b, i_hk, i_n, sched = work_item(program_item(it, SCHED), wk, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                                              NEEDS_MASK, FLEX, SCHED)
            mbarrier.wait(kv_ready, it & 1)
            step = _consume_item(q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, kv_empty, q_ready,
                                 q_empty, ds_ready, dq_full, dq_empty, dk_ptr, dv_ptr, stride_kb, stride_ks,
                                 stride_kh, stride_vb, stride_vs, stride_vh, i_b, i_hk, i_n, group_size, sched, fx,
                                 wk[3], wk[4], wk[5], wk[6], wk[7], scale, qk_scale, softcap_scale, softcap_out,
                                 caps_s, caps_m, step, WG, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, NEEDS_MASK, STAGES,
                                 DQ_BUFS, FLEX, Q_BLOCK, SCORE_GRAD, MASK_MOD, SCHED)
    else:  # one item per program
        i_b, i_hk, i_n, sched = work_item(gl.program_id(0), wk, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, FLEX,
                                          SCHED)
        mbarrier.wait(kv_ready, 0)
        _consume_item(q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, kv_empty, q_ready, q_empty,
                      ds_ready, dq_full, dq_empty, dk_ptr, dv_ptr, stride_kb, stride_ks, stride_kh, stride_vb,
                      stride_vs, stride_vh, i_b, i_hk, i_n, group_size, sched, fx, wk[3], wk[4], wk[5], wk[6], wk[7],
                      scale, qk_scale, softcap_scale, softcap_out, caps_s, caps_m, gl.to_tensor(0), WG, HAS_LEFT,
                      HAS_RIGHT,
                      HAS_SOFTCAP, NEEDS_MASK, STAGES, DQ_BUFS, FLEX, Q_BLOCK, SCORE_GRAD, MASK_MOD, SCHED)


@gluon.jit
def _consume_item(q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, kv_empty, q_ready, q_empty,
                  ds_ready, dq_full, dq_empty, dk_ptr, dv_ptr, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                  stride_vh, i_b, i_hk, i_n, group_size, sched, fx, seqlen_q, seqlen_k, off_diag, left, right, scale,
                  qk_scale, softcap_scale, softcap_out, caps_s, caps_m, step, WG: gl.constexpr,
                  HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr,
                  NEEDS_MASK: gl.constexpr, STAGES: gl.constexpr, DQ_BUFS: gl.constexpr, FLEX: gl.constexpr,
                  Q_BLOCK: gl.constexpr, SCORE_GRAD: gl.constexpr, MASK_MOD: gl.constexpr, SCHED: gl.constexpr):
    """One work item (key block i_n of kv head i_hk), its steps from `step` on (returned advanced)."""
    BLOCK_M: gl.constexpr = q_bufs.shape[2]
    D: gl.constexpr = q_bufs.shape[4]
    DV: gl.constexpr = do_bufs.shape[4]
    HALF_N: gl.constexpr = ds_bufs.shape[1] // 2
    k_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    v_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DV, 16])
    n0 = i_n * 2 * HALF_N
    dk = gl.zeros([HALF_N, D], gl.float32, k_layout)
    dv = gl.zeros([HALF_N, DV], gl.float32, v_layout)
    for g in range(group_size):  # the query heads of the kv head: the loader and writers track which
        i_h = i_hk * group_size + g
        fm = (i_b, i_h, scale)
        n_steps, walk, merge = head_walk(sched, fx, i_b, i_h, i_n, BLOCK_M, FLEX, Q_BLOCK)
        if FLEX:  # one merged walk; mask_mod applies on blocks of the partial list (a runtime flag: two inlined
            # steps under a branch spilled and computed wrong gradients with an ALiBi score mod)
            for t in range(n_steps):
                m0 = walk_m0(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK, False)
                full = merge[2] > merge[3]
                merge = walk_next(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK)
                dk, dv = _step(dk, dv, step, m0, n0, q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs,
                               q_ready, q_empty, ds_ready, dq_full, dq_empty, seqlen_q, seqlen_k, off_diag, left,
                               right, qk_scale, softcap_scale, softcap_out, fm, full, caps_s, caps_m, WG, True,
                               HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, STAGES, DQ_BUFS, FLEX, SCORE_GRAD, MASK_MOD, False)
                step += 1
        else:
            m_lo, f_lo, f_hi, m_hi, rot, desc = sched
            n_above, n_full, n_below = step_counts(sched, BLOCK_M)
            # three ranges, each its own instantiation of the step: masked below the unmasked range, unmasked,
            # masked above (the masked ones only where a tile can need a mask); a downward walk (PAIRED) takes them
            # in the reverse order, each downwards (ranges 0 and 2 are the masked ones either way)
            for r in gl.static_range(3):
                if r == 0:
                    m_start = m_lo
                    n_r = n_below
                elif r == 1:
                    m_start = f_lo
                    n_r = n_full
                else:
                    m_start = f_hi
                    n_r = n_above
                if SCHED == PAIRED and r != 1:
                    if desc:
                        if r == 0:
                            m_start = f_hi
                            n_r = n_above
                        else:
                            m_start = m_lo
                            n_r = n_below
                if NEEDS_MASK or r == 1:
                    for t in range(n_r):
                        if SCHED == ROTATED and r == 1:  # walk_m0's rotation (the loader and writers walk the same)
                            m0 = m_start + ((t + rot) % n_r) * BLOCK_M
                        elif SCHED == PAIRED:
                            m0 = m_start + (t + desc * (n_r - 1 - 2 * t)) * BLOCK_M
                        else:
                            m0 = m_start + t * BLOCK_M
                        dk, dv = _step(dk, dv, step, m0, n0, q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs,
                                       stat_bufs, q_ready, q_empty, ds_ready, dq_full, dq_empty, seqlen_q, seqlen_k,
                                       off_diag, left, right, qk_scale, softcap_scale, softcap_out, fm, False, caps_s,
                                       caps_m, WG, r != 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, STAGES, DQ_BUFS, FLEX,
                                       SCORE_GRAD, MASK_MOD, NEEDS_MASK)
                        step += 1
    if SCHED != PLAIN:  # every wgmma reading K / V has completed (each step waits for its last): the next
        # item's may load
        mbarrier.arrive(kv_empty)
    rows = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, k_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, k_layout))
    gl.store(dk_ptr + i_b.to(gl.int64) * stride_kb + i_hk.to(gl.int64) * stride_kh + rows[:, None] * stride_ks
             + cols[None, :], (dk * scale).to(dk_ptr.dtype.element_ty), mask=(rows < seqlen_k)[:, None])
    rows = n0 + WG * HALF_N + gl.arange(0, HALF_N, layout=gl.SliceLayout(1, v_layout))
    cols = gl.arange(0, DV, layout=gl.SliceLayout(0, v_layout))
    gl.store(dv_ptr + i_b.to(gl.int64) * stride_vb + i_hk.to(gl.int64) * stride_vh + rows[:, None] * stride_vs
             + cols[None, :], dv.to(dv_ptr.dtype.element_ty), mask=(rows < seqlen_k)[:, None])
    return step


# ---- the whole kernel ----------------------------------------------------------------------------------------
@gluon.jit
def attn_bwd_pipeline(
    q_desc, k_desc, v_desc, do_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, acc, sem_ptr,
    stride_lb, stride_lh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, seqlen_q, seqlen_k, num_kv_heads, group_size, num_q_blocks, num_kv_blocks,
    num_items, head_group_ptr, scale, qk_scale, softcap_scale, softcap_out, left, right, fx, fk, caps_s, caps_m,
    STAGES: gl.constexpr, DQ_BUFS: gl.constexpr, CONSUMER_REGS: gl.constexpr, WORKER_REGS: gl.constexpr,
    WRITER_ROWS: gl.constexpr, HAS_LEFT: gl.constexpr,
    HAS_RIGHT: gl.constexpr, ALIGN_BOTTOM_RIGHT: gl.constexpr, HAS_SOFTCAP: gl.constexpr, NEEDS_MASK: gl.constexpr,
    TMA_DQ: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr, SCORE_GRAD: gl.constexpr,
    MASK_MOD: gl.constexpr, SCHED: gl.constexpr, PDL: gl.constexpr,
):
    """Shared memory, barriers and the partitions. The dense and flex kernels' docstrings say what their
    arguments hold; head_group_ptr (where the work items' head group is: walk.work_item), fx (the transposed block
    lists), fk (the forward ones), caps_s / caps_m, SCORE_GRAD / MASK_MOD, Q_BLOCK are the flex mode's block mask
    and mods (placeholders for dense). PDL: the kernel is launched with programmatic dependent launch after the
    preprocess (delta, the zeroed counters), so its programs may start while the preprocess ends: the loader
    waits for it before the first delta it reads, the dQ writers before their first counter (the consumers read
    nothing the preprocess writes; flex's would: its work items' head group, so flex passes False)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    D: gl.constexpr = q_desc.block_type.shape[3]
    dtype: gl.constexpr = q_desc.dtype
    if ALIGN_BOTTOM_RIGHT:
        off_diag = seqlen_k - seqlen_q
    else:
        off_diag = 0
    # the work items and what _item needs to place them; a program takes items pid, pid + programs, ...
    wk = (num_items, num_kv_blocks, num_kv_heads, seqlen_q, seqlen_k, off_diag, left, right, head_group_ptr)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    if NEEDS_MASK and not FLEX:  # K and V as one-buffer arrays, which the consumers index at run time (KV_FRESH)
        k_bufs = gl.allocate_shared_memory(dtype, [1] + k_desc.block_type.shape, k_desc.layout)
        v_bufs = gl.allocate_shared_memory(dtype, [1] + v_desc.block_type.shape, v_desc.layout)
        k_smem = k_bufs.index(0)
        v_smem = v_bufs.index(0)
    else:  # (the tiles' own leading dimension of 1 stands in for it)
        k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
        k_bufs = k_smem
        v_bufs = v_smem
    ds_bufs = gl.allocate_shared_memory(dtype, [2, BLOCK_N, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
    # a step's dQ part in two halves, one per consumer warpgroup: [BLOCK_M, D / 2] (the head dim split), or with
    # BLOCK_M = 128 [64, D] (the rows split)
    DQ_C: gl.constexpr = D * BLOCK_M // 128
    if TMA_DQ:  # the bulk copies' layout (swizzled: the consumers' stores are free of bank conflicts)
        dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFS * 2, 64, DQ_C], acc.layout)
    else:
        # float32 dQ halves, 8-float groups swizzled over DQ_PHASES rows (as many as the writer's row chunks
        # allow: a chunk may not split the pattern): a warp's accumulator store (8 rows, 2 floats per lane) takes
        # max(8 / DQ_PHASES, 2) bank passes (D / 2 = 32 columns: 4 phases, 2 passes; 64: 2 phases, 4) instead of 8
        DQ_PHASES: gl.constexpr = min(DQ_C // 8, WRITER_ROWS)
        dq_bufs = gl.allocate_shared_memory(gl.float32, [DQ_BUFS * 2, 64, DQ_C],
                                            gl.SwizzledSharedLayout(8, 1, DQ_PHASES, order=[1, 0]))
    # per Q / dO slot: the rows' lse (times log2 e) and delta, written by the loader
    stat_bufs = gl.allocate_shared_memory(gl.float32, [STAGES * 2, BLOCK_M],
                                          gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    kv_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_full = gl.allocate_shared_memory(gl.int64, [DQ_BUFS, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_BUFS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_ready, count=1)
    mbarrier.init(kv_empty, count=2)  # both consumer warpgroups
    for s in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(s), count=2)  # the TMA bytes, the loader's statistics
        mbarrier.init(q_empty.index(s), count=2)
    for s in gl.static_range(2):
        mbarrier.init(ds_ready.index(s), count=2)
    for s in gl.static_range(DQ_BUFS):
        mbarrier.init(dq_full.index(s), count=2)
        mbarrier.init(dq_empty.index(s), count=1)

    gl.warp_specialize([
        (_consumer, (q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, kv_ready, kv_empty, q_ready,
                     q_empty, ds_ready, dq_full, dq_empty, dk_ptr, dv_ptr, stride_kb, stride_ks, stride_kh, stride_vb,
                     stride_vs, stride_vh, group_size, wk, fx, scale, qk_scale, softcap_scale, softcap_out, caps_s,
                     caps_m, 0, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, NEEDS_MASK, STAGES, DQ_BUFS, FLEX, Q_BLOCK,
                     SCORE_GRAD, MASK_MOD, SCHED)),
        (_consumer, (q_bufs, do_bufs, k_bufs, v_bufs, ds_bufs, dq_bufs, stat_bufs, kv_ready, kv_empty, q_ready,
                     q_empty, ds_ready, dq_full, dq_empty, dk_ptr, dv_ptr, stride_kb, stride_ks, stride_kh, stride_vb,
                     stride_vs, stride_vh, group_size, wk, fx, scale, qk_scale, softcap_scale, softcap_out, caps_s,
                     caps_m, 1, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, NEEDS_MASK, STAGES, DQ_BUFS, FLEX, Q_BLOCK,
                     SCORE_GRAD, MASK_MOD, SCHED)),
        (loader, (q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty,
                  q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, STAGES, HAS_LEFT,
                  HAS_RIGHT, NEEDS_MASK, FLEX, Q_BLOCK, SCHED, PDL)),
        (dq_writer, (dq_bufs, dq_full, dq_empty, acc, sem_ptr, group_size, num_q_blocks, wk, fx, fk, BLOCK_M,
                      BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, DQ_BUFS, WRITER_ROWS, 0, 2, TMA_DQ, FLEX, Q_BLOCK,
                      SCHED, PDL)),
        (dq_writer, (dq_bufs, dq_full, dq_empty, acc, sem_ptr, group_size, num_q_blocks, wk, fx, fk, BLOCK_M,
                      BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, DQ_BUFS, WRITER_ROWS, 1, 2, TMA_DQ, FLEX, Q_BLOCK,
                      SCHED, PDL)),
    ], [4, 1, 1, 1], [CONSUMER_REGS, WORKER_REGS, WORKER_REGS, WORKER_REGS])
