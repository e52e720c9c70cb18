"""The Hopper backward's loader partition (gluon_bwd_sm90.py): one warp that loads each work item's K and V and
each step's Q and dO tiles by TMA into the ring, with the rows' lse and delta beside them; and the kernel's two
halves of programmatic dependent launch (the wait for the preprocess before it, the go-ahead to the dQ conversion
after it)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import softmax
from .bwd_kernels import LAUNCH_DEPENDENTS_PTX
from .gluon_bwd_sm90_walk import PLAIN, head_walk, program_item, program_items, walk_m0, walk_next, work_item
from .gluon_compat import tma_load

LOG2E = gl.constexpr(softmax.LOG2E)
_LAUNCH_DEPENDENTS = gl.constexpr(LAUNCH_DEPENDENTS_PTX)


@gluon.jit
def grid_dependency_wait():
    """Waits until the kernel this one was launched after with programmatic dependent launch (the backward's
    preprocess: delta, the zeroed counters) has completed and its writes are visible (returns at once without
    such a launch). The loader and the dQ writers call it."""
    gl.inline_asm_elementwise("griddepcontrol.wait; mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def _launch_dependents():
    """Lets a kernel launched after this one with programmatic dependent launch (the dQ conversion) start once
    every program of this grid has run this (or exited), instead of once the grid is done."""
    gl.inline_asm_elementwise(_LAUNCH_DEPENDENTS, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def loader(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty, q_ready,
           q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, STAGES: gl.constexpr,
           HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, NEEDS_MASK: gl.constexpr, FLEX: gl.constexpr,
           Q_BLOCK: gl.constexpr, SCHED: gl.constexpr, PDL: gl.constexpr):
    """Per work item: TMA loads of K and V (once the consumers are done with the previous item's), then each
    step's Q and dO tiles; each step's lse and delta rows through registers into stat_bufs (lse as exp2's
    offset: lse * log2 e, +inf for rows past Sq and rows that saw no key, so p = 0). The ring runs on across
    items, so the next item's first tiles load under the current item's last steps. PDL: the first item's K and
    V load before the wait for the preprocess (_load_item)."""
    if not PDL:
        _launch_dependents()  # every program is running: the dQ conversion may start on the SMs the grid frees
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[1]
    stat_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    rows = gl.arange(0, BLOCK_M, layout=stat_layout)
    if SCHED != PLAIN:  # a persistent grid (walk.program_item)
        step = 0
        for it in range(program_items(wk[0], SCHED)):
            step = _load_item(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready,
                              kv_empty, q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx,
                              program_item(it, SCHED), it, step, rows, STAGES, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, FLEX,
                              Q_BLOCK, SCHED, PDL)
    else:  # one item per program
        _load_item(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty,
                   q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, gl.program_id(0),
                   0, gl.to_tensor(0), rows, STAGES, HAS_LEFT, HAS_RIGHT, NEEDS_MASK, FLEX, Q_BLOCK, SCHED, PDL)


@gluon.jit
def _load_item(q_desc, k_desc, v_desc, do_desc, q_bufs, do_bufs, k_smem, v_smem, stat_bufs, kv_ready, kv_empty,
               q_ready, q_empty, lse_ptr, delta_ptr, stride_lb, stride_lh, group_size, wk, fx, item, it, step, rows,
               STAGES: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, NEEDS_MASK: gl.constexpr,
               FLEX: gl.constexpr, Q_BLOCK: gl.constexpr, SCHED: gl.constexpr, PDL: gl.constexpr):
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
            _launch_dependents()  # every program is running: the dQ conversion may start on the SMs the grid frees
    return _load_steps(q_desc, do_desc, q_bufs, do_bufs, stat_bufs, q_ready, q_empty, lse_ptr, delta_ptr, stride_lb,
                       stride_lh, wk[3], i_b, i_hk, i_n, group_size, sched, fx, step, rows, STAGES, FLEX, Q_BLOCK,
                       SCHED)


@gluon.jit
def _load_steps(q_desc, do_desc, q_bufs, do_bufs, stat_bufs, q_ready, q_empty, lse_ptr, delta_ptr, stride_lb,
                stride_lh, seqlen_q, i_b, i_hk, i_n, group_size, sched, fx, step, rows, STAGES: gl.constexpr,
                FLEX: gl.constexpr, Q_BLOCK: gl.constexpr, SCHED: gl.constexpr):
    """One item's Q / dO tiles and row statistics, from ring position `step` (returned advanced)."""
    BLOCK_M: gl.constexpr = q_desc.block_type.shape[1]
    for g in range(group_size):
        i_h = i_hk * group_size + g
        n_steps, walk, merge = head_walk(sched, fx, i_b, i_h, i_n, BLOCK_M, FLEX, Q_BLOCK)
        off = i_b.to(gl.int64) * stride_lb + i_h.to(gl.int64) * stride_lh
        for t in range(n_steps):
            m0 = walk_m0(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK, SCHED)
            merge = walk_next(t, walk, merge, BLOCK_M, FLEX, Q_BLOCK)
            s = step % STAGES
            m_ok = m0 + rows < seqlen_q
            lse = gl.load(lse_ptr + off + m0 + rows, mask=m_ok, other=float("inf"))
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
