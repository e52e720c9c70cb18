"""The Hopper backward's dQ writers (gluon_bwd_sm90.py): each step's staged dQ part added to the query block's
float32 sums in a fixed key-block order (the turn), so that the sums are bit-identical run to run."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from . import masking
from .bwd_kernels import wait_count_ptx
from .gluon_bwd_sm90_loader import grid_dependency_wait
from .gluon_bwd_sm90_walk import (
    PAIRED,
    PLAIN,
    ROTATED,
    head_walk,
    paired_turn,
    program_item,
    program_items,
    walk_m0,
    walk_next,
    work_item,
)
from .gluon_compat import tma_reduce_add, tma_store, tma_wait_writes
from .gluon_sm90_loader import flex_lists

_key_range = gluon.jit(masking.key_range.fn)


# ---- dQ writer -----------------------------------------------------------------------------------------------
_WAIT_TURN = gl.constexpr(wait_count_ptx(64))


@gluon.jit
def _wait_turn(sem, target):
    """Until the counter at sem reaches target (bwd_kernels.wait_count_ptx: lane 0 polls with a 64 ns back-off,
    the warp barrier orders the warp's later memory operations after it). A turn counter only rises one add at a
    time and no add past this one's can come first, so reaching the target is reading it."""
    gl.inline_asm_elementwise(_WAIT_TURN, "=r,l,r", [sem, target], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pass_turn(sem):
    """After the warp barrier (every lane's stores ordered before it), lane 0 adds 1 to the counter (release)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred %p<1>; .reg .b32 %l<1>; bar.warp.sync -1; mov.u32 %l0, %laneid; setp.eq.u32 %p0, %l0, 0; "
        "@%p0 red.release.gpu.global.add.s32 [$1], 1; mov.b32 $0, 0; }", "=r,l", [sem], dtype=gl.int32,
        is_pure=False, pack=1)


@gluon.jit
def _fence_proxy_async():
    """Orders this thread's generic-proxy memory operations with its bulk-copy (async proxy) ones, both ways."""
    gl.inline_asm_elementwise("fence.proxy.async; mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _count_around(lst, n, kvb, num_kv_blocks):
    """(entries above kvb, entries below kvb) among the first n of block list lst (entries outside
    [0, num_kv_blocks) are no key block and not counted); one warp, 128 entries at a time."""
    layout: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
    o = gl.arange(0, 128, layout=layout)
    above = 0
    below = 0
    for c in range(0, n, 128):
        j = gl.load(lst + c + o, mask=c + o < n, other=-1)
        ok = (j >= 0) & (j < num_kv_blocks)
        above += gl.sum((ok & (j > kvb)).to(gl.int32), axis=0)
        below += gl.sum((ok & (j < kvb)).to(gl.int32), axis=0)
    return above, below


@gluon.jit
def _turn(m0, i_b, i_h, i_n, fk, seqlen_k, off_diag, left, right, num_kv_blocks, num_q_blocks,
          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
          FLEX: gl.constexpr, Q_BLOCK: gl.constexpr, SCHED: gl.constexpr):
    """(turn, last) of key block i_n on the query block at m0: how many key blocks add to its dQ first, and
    whether none adds after (then nobody waits for the turn). Dense: from the masking rule's key range, higher
    key blocks first; ROTATED (every key block sees every query block, key block n's walk starts at query block
    rot(n) = n * num_q_blocks // num_kv_blocks): in the order the walks reach the block, j0 = the highest key
    block with rot(j0) <= the block's index first, then j0 - 1, ..., 0, then num_kv_blocks - 1, ..., j0 + 1;
    PAIRED: walk.paired_turn. Flex: counted in the query block's forward lists fk."""
    if FLEX:
        n_part, n_full, part, full = flex_lists(fk, i_b, i_h, m0 // Q_BLOCK)
        above, below = _count_around(part, n_part, i_n, num_kv_blocks)
        above_full, below_full = _count_around(full, n_full, i_n, num_kv_blocks)
        return above + above_full, below + below_full == 0
    elif SCHED == PAIRED:
        return paired_turn(m0 // BLOCK_M, i_n, num_kv_blocks, num_q_blocks, BLOCK_N // BLOCK_M)
    elif SCHED == ROTATED:
        j0 = ((m0 // BLOCK_M + 1) * num_kv_blocks + num_q_blocks - 1) // num_q_blocks - 1
        turn = (j0 - i_n + num_kv_blocks) % num_kv_blocks
        return turn, turn == num_kv_blocks - 1
    else:
        lo, hi, _, _ = _key_range(m0, m0 + BLOCK_M - 1, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT,
                                  HAS_RIGHT)
        # key blocks add from the highest that sees this query block down: turn = how many come first
        return ((hi - 1) // BLOCK_N) - i_n, i_n * BLOCK_N <= lo


@gluon.jit
def dq_writer(dq_bufs, dq_full, dq_empty, acc, sem_ptr, group_size, num_q_blocks, wk, fx, fk,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
              NEEDS_MASK: gl.constexpr, DQ_BUFS: gl.constexpr, ROWS: gl.constexpr, W: gl.constexpr,
              WRITERS: gl.constexpr, TMA_DQ: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr,
              SCHED: gl.constexpr, PDL: gl.constexpr):
    """Writer W of WRITERS (one warp each) takes the steps with step % WRITERS == W: its turn waits and adds
    overlap with the other writers' (different query blocks). TMA_DQ: acc is a tensor
    descriptor and each staged half goes out as one bulk reduce-add (a store for the first key block); else
    acc is a pointer and the warp adds ROWS rows at a time with vector atomics. The two staged parts of a step
    are its [BLOCK_M, D / 2] column halves, or with BLOCK_M = 128 its [64, D] row halves. PDL: first waits for
    the preprocess, which zeroes the counters (gluon_bwd_sm90.attn_bwd_pipeline)."""
    if PDL:
        grid_dependency_wait()
    DQ_C: gl.constexpr = dq_bufs.shape[2]
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // min(DQ_C // 4, 32), min(DQ_C // 4, 32)], [1, 1], [1, 0])
    r_idx = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    c_idx = gl.arange(0, DQ_C, layout=gl.SliceLayout(0, layout))
    num_kv_blocks = wk[1]
    num_kv_heads = wk[2]
    if SCHED != PLAIN:  # a persistent grid (walk.program_item)
        step = 0
        for it in range(program_items(wk[0], SCHED)):
            i_b, i_hk, i_n, sched = work_item(program_item(it, SCHED), wk, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT,
                                              NEEDS_MASK, FLEX, SCHED)
            step = _write_item(dq_bufs, dq_full, dq_empty, acc, sem_ptr, i_b, i_hk, i_n, group_size, num_kv_heads,
                               num_kv_blocks, num_q_blocks, sched, fx, fk, wk[4], wk[5], wk[6], wk[7], step, r_idx,
                               c_idx, layout, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, DQ_BUFS, ROWS, W, WRITERS,
                               TMA_DQ, FLEX, Q_BLOCK, SCHED)
            _item_done(sem_ptr, wk, group_size, num_q_blocks, i_b, i_hk, TMA_DQ)
    else:  # one item per program
        i_b, i_hk, i_n, sched = work_item(gl.program_id(0), wk, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, FLEX,
                                          SCHED)
        _write_item(dq_bufs, dq_full, dq_empty, acc, sem_ptr, i_b, i_hk, i_n, group_size, num_kv_heads,
                    num_kv_blocks, num_q_blocks, sched, fx, fk, wk[4], wk[5], wk[6], wk[7], gl.to_tensor(0), r_idx,
                    c_idx, layout,
                    BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, DQ_BUFS, ROWS, W, WRITERS, TMA_DQ, FLEX, Q_BLOCK, SCHED)
        _item_done(sem_ptr, wk, group_size, num_q_blocks, i_b, i_hk, TMA_DQ)


@gluon.jit
def _item_done(sem_ptr, wk, group_size, num_q_blocks, i_b, i_hk, TMA_DQ: gl.constexpr):
    """This writer's adds to the item's dQ sums are in global memory: one count on the done counter of the
    item's (batch, kv head), which follows the turn counters ([B * Hq, query blocks], then [B, Hkv]: the launch
    allocates them as one buffer). The dQ conversion, launched to start early, waits for a head's count to reach
    every writer of every key block (launch_bwd_sm90.convert)."""
    if TMA_DQ:
        tma_wait_writes()
        _fence_proxy_async()
    num_bh = wk[0] // wk[1]  # batch * kv heads
    _pass_turn(sem_ptr + num_bh * group_size * num_q_blocks + i_b * wk[2] + i_hk)


@gluon.jit
def _write_item(dq_bufs, dq_full, dq_empty, acc, sem_ptr, i_b, i_hk, i_n, group_size, num_kv_heads, num_kv_blocks,
                num_q_blocks, sched, fx, fk, seqlen_k, off_diag, left, right, step, r_idx, c_idx,
                layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr,
                HAS_RIGHT: gl.constexpr, DQ_BUFS: gl.constexpr, ROWS: gl.constexpr, W: gl.constexpr,
                WRITERS: gl.constexpr, TMA_DQ: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr,
                SCHED: gl.constexpr):
    """This writer's steps of one work item, from `step` on (returned advanced)."""
    DQ_R: gl.constexpr = dq_bufs.shape[1]
    DQ_C: gl.constexpr = dq_bufs.shape[2]
    D: gl.constexpr = DQ_C * 128 // BLOCK_M
    ROW_STEP: gl.constexpr = BLOCK_M - DQ_R  # where part 1 starts: (0, D / 2) or (64, 0)
    COL_STEP: gl.constexpr = D - DQ_C
    for g in range(group_size):
        i_h = i_hk * group_size + g
        i_bhq = (i_b * num_kv_heads * group_size + i_h).to(gl.int64)
        n_steps, walk, merge = head_walk(sched, fx, i_b, i_h, i_n, BLOCK_M, FLEX, Q_BLOCK)
        for t in range(n_steps):
            m0 = walk_m0(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK, SCHED)
            merge = walk_next(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK)
            if step % WRITERS == W:
                turn, last = _turn(m0, i_b, i_h, i_n, fk, seqlen_k, off_diag, left, right, num_kv_blocks,
                                   num_q_blocks, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, FLEX, Q_BLOCK, SCHED)
                sem = sem_ptr + i_bhq * num_q_blocks + m0 // BLOCK_M
                qb = step % DQ_BUFS
                mbarrier.wait(dq_full.index(qb), (step // DQ_BUFS) & 1)
                if turn > 0:
                    _wait_turn(sem, turn)
                if TMA_DQ:
                    row = (i_bhq * num_q_blocks * BLOCK_M + m0).to(gl.int32)  # < 2^31: launch_bwd_sm90 checks
                    if turn > 0:
                        _fence_proxy_async()  # the earlier blocks' adds, acquired above, before this one's
                        for h in gl.static_range(2):
                            tma_reduce_add(acc, [row + h * ROW_STEP, h * COL_STEP], dq_bufs.index(qb * 2 + h))
                    else:
                        for h in gl.static_range(2):
                            tma_store(acc, [row + h * ROW_STEP, h * COL_STEP], dq_bufs.index(qb * 2 + h))
                    tma.store_wait(0)  # the halves are read: the consumers may stage the next step's
                    mbarrier.arrive(dq_empty.index(qb))
                    if not last:
                        tma_wait_writes()  # written to global memory before the turn passes
                        _fence_proxy_async()
                        _pass_turn(sem)
                else:
                    base = acc + (i_bhq * num_q_blocks * BLOCK_M + m0) * D
                    for h in gl.static_range(2):
                        for r in gl.static_range(0, DQ_R, ROWS):
                            x = dq_bufs.index(qb * 2 + h).slice(r, ROWS, dim=0).load(layout)
                            ptrs = base + (h * ROW_STEP + r + r_idx)[:, None] * D + (h * COL_STEP + c_idx)[None, :]
                            if turn > 0:
                                gl.atomic_add(ptrs, x, sem="relaxed", scope="gpu")  # ordered by the turn
                            else:
                                gl.store(ptrs, x)
                    if not last:
                        _pass_turn(sem)
                    mbarrier.arrive(dq_empty.index(qb))
            step += 1
    return step
