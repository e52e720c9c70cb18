"""The Hopper backward's loader partition (gluon_bwd_sm90.py): one warp that loads each work item's K and V and
each step's Q and dO tiles by TMA into the ring, with the rows' lse and delta beside them."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import softmax
from .gluon_bwd_sm90_delta import wait_rows
from .gluon_bwd_sm90_sync import grid_dependency_wait, launch_dependents
from .gluon_bwd_sm90_walk import PLAIN, head_walk, program_item, program_items, walk_m0, walk_next, work_item
from .gluon_compat import tma_load

LOG2E = gl.constexpr(softmax.LOG2E)


@gluon.jit
def loader(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty, q_ready,
           q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, dx, STAGES: gl.constexpr,
           HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, NEEDS_MASK: gl.constexpr, FLEX: gl.constexpr,
           Q_BLOCK: gl.constexpr, SCHED: gl.constexpr, PDL: gl.constexpr, SPLIT_DELTA: gl.constexpr):
    """Per work item: TMA loads of K and V (once the consumers are done with the previous item's), then each
    step's Q and dO tiles; each step's lse and delta rows through registers into stat_bufs (lse as exp2's
    offset: lse * log2 e, +inf for rows past Sq and rows that saw no key, so p = 0). The ring runs on across
    items, so the next item's first tiles load under the current item's last steps. PDL: the first item's K and
    V load before the wait for the preprocess (_load_item). SPLIT_DELTA: a step's delta rows are read until none is
    pending where the delta programs write them (delta.wait_rows); a delta program's loader loads nothing."""
    if not PDL:
        launch_dependents()  # every program is running: the dQ conversion may start on the SMs the grid frees
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[1]
    stat_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    rows = gl.arange(0, BLOCK_M, layout=stat_layout)
    if SPLIT_DELTA:
        if PDL:
            if gl.program_id(0) >= wk[9]:  # a delta program: no work item below
                launch_dependents()
    if SCHED != PLAIN:  # a persistent grid (walk.program_item)
        step = 0
        for it in range(program_items(wk, SCHED)):
            step = _load_item(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready,
                              kv_empty, q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx,
                              dx, program_item(it, wk, SCHED), it, step, rows, STAGES, HAS_LEFT, HAS_RIGHT,
                              NEEDS_MASK, FLEX, Q_BLOCK, SCHED, PDL, SPLIT_DELTA)
    else:  # one item per program
        _load_item(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty,
                   q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, dx,
                   gl.program_id(0), 0, gl.to_tensor(0), rows, STAGES, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, FLEX, Q_BLOCK,
                   SCHED, PDL, SPLIT_DELTA)


@gluon.jit
def _load_item(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty,
               q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, dx, item, it,
               step, rows, STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
               NEEDS_MASK: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr, SCHED: gl.constexpr,
               PDL: gl.constexpr, SPLIT_DELTA: gl.constexpr):
    """Work item `item`, the it-th of this program: its K and V, then its steps from ring position `step`
    (returned advanced). PDL (the first item): after K and V are under way, the wait for the preprocess (its
    delta is read below), then the dQ conversion may launch: it polls the counters the preprocess zeroes without a
    wait of its own, and sees them zeroed because it can launch only once every program of this grid has passed
    this wait, so the preprocess has completed (its writes performed) before the conversion starts. (Cooperative
    grids start only after the preprocess ends anyway; the plain grid's programs start under its end.)"""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    i_b, i_hk, i_n, sched = work_item(item, wk, BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, FLEX, SCHED)
    if SCHED != PLAIN:
        mbarrier.wait(kv_empty, (it & 1) ^ 1)  # the consumers are done with the last item's (a fresh barrier passes)
    mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma_load(k_desc, [i_b, i_n * BLOCK_N, i_hk, 0], kv_ready, k_smem)
    tma_load(v_desc, [i_b, i_n * BLOCK_N, i_hk, 0], kv_ready, v_smem)
    if PDL:
        if it == 0:
            grid_dependency_wait()
            launch_dependents()  # every program is running: the dQ conversion may start on the SMs the grid frees
    return _load_steps(q_desc, do_desc, q_bufs, do_bufs, stat_bufs, q_ready, q_empty, lse_ptr, delta_ptr, stride_lb,
                       stride_lh, wk, i_b, i_hk, i_n, group_size, sched, fx, dx, step, rows, STAGES, FLEX,
                       Q_BLOCK, SCHED, SPLIT_DELTA)


@gluon.jit
def _load_steps(q_desc, do_desc, q_bufs, do_bufs, stat_bufs, q_ready, q_empty, lse_ptr, delta_ptr, stride_lb,
                stride_lh, wk, i_b, i_hk, i_n, group_size, sched, fx, dx, step, rows, STAGES: gl.constexpr,
                FLEX: gl.constexpr, Q_BLOCK: gl.constexpr, SCHED: gl.constexpr, SPLIT_DELTA: gl.constexpr):
    """One item's Q / dO tiles and row statistics, from ring position `step` (returned advanced)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[1]
    seqlen_q = wk[3]
    for g in range(group_size):
        i_h = i_hk * group_size + g
        n_steps, walk, merge = head_walk(sched, fx, i_b, i_h, i_n, BLOCK_M, FLEX, Q_BLOCK)
        off = i_b.to(gl.int64) * stride_lb + i_h.to(gl.int64) * stride_lh
        later = False  # (SPLIT_DELTA: the head's delta rows come from the delta programs)
        if SPLIT_DELTA:
            later = i_b * wk[2] * group_size + i_h >= dx[11]
        for t in range(n_steps):
            m0 = walk_m0(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK, SCHED)
            merge = walk_next(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK)
            s = step % STAGES
            m_ok = m0 + rows < seqlen_q
            lse = gl.load(lse_ptr + off + m0 + rows, mask=m_ok, other=float("inf"))
            if SPLIT_DELTA:  # (written during the kernel by other SMs: read from L2)
                delta = gl.load(delta_ptr + off + m0 + rows, mask=m_ok, other=0.0, cache_modifier=".cg")
                if later:
                    delta = wait_rows(delta_ptr + off + m0 + rows, m_ok, delta)
            else:
                delta = gl.load(delta_ptr + off + m0 + rows, mask=m_ok, other=0.0)
            mbarrier.wait(q_empty.index(s), ((step // STAGES) & 1) ^ 1)  # fresh slots pass
            mbarrier.expect(q_ready.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma_load(q_desc, [i_b, m0, i_h, 0], q_ready.index(s), q_bufs.index(s))
            tma_load(do_desc, [i_b, m0, i_h, 0], q_ready.index(s), do_bufs.index(s))
            stat_bufs.index(2 * s).store(gl.where(lse == float("-inf"), float("inf"), lse * LOG2E))
            stat_bufs.index(2 * s + 1).store(delta)
            mbarrier.arrive(q_ready.index(s))  # (release: the consumers that wait on it see the stores)
            step += 1
    return step
