"""The seesaw kernel's ring of boxes (gluon_sm90_seesaw.py; read its docstring first): the per-box ready barriers,
the scores issued box by box, and the P V helpers."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma

from .gluon_producer import _buf
from .gluon_sm90_shard import _gather


@gluon.jit
def _ready_barriers():
    """The ready barriers of the ring's boxes: one [2, 1] allocation (indexed by slot) per box position, 9 (ckv's
    8 boxes of 64 columns at Dc = 512, then kpe; at a smaller Dc the first 2 H + 1 serve). Separate allocations:
    Triton's barrier analysis takes a wait for a write of its allocation, and put a warpgroup barrier (BAR.SYNC)
    between any two waits on one (seen in the SASS: one before every box wait)."""
    ready = (_bar2(), _bar2(), _bar2(), _bar2(), _bar2(), _bar2(), _bar2(), _bar2(), _bar2())
    for c in gl.static_range(9):
        for s in gl.static_range(2):
            mbarrier.init(ready[c].index(s), count=1)
    return ready


@gluon.jit
def _bar2():
    return gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())


@gluon.jit
def _wait_boxes(ready, g, lo: gl.constexpr, hi: gl.constexpr):
    """Boxes lo..hi - 1 of block g have landed (box c of slot s completes ready[c].index(s))."""
    for c in gl.static_range(lo, hi):
        mbarrier.wait(ready[c].index(g % 2), (g // 2) & 1)


@gluon.jit
def _score_box(qk, qn_bufs, qp_op, c_bufs, p_bufs, ready, g, qz, C: gl.constexpr, USE_ACC: gl.constexpr):
    """qk (+)= the scores of box C of block g (C < 2H: ckv columns C * BOX.., else kpe), issued after its ready
    wait."""
    BOX: gl.constexpr = 64 if c_bufs.shape[3] > 64 else c_bufs.shape[3]  # (the 128-byte swizzle's width)
    H: gl.constexpr = c_bufs.shape[3] // BOX
    s = g % 2
    mbarrier.wait(ready[C].index(s), (g // 2) & 1)
    if C == 2 * H:
        qk = warpgroup_mma(qp_op, _buf(p_bufs, s).permute((1, 0)), qk, use_acc=USE_ACC, is_async=True)
    else:
        h: gl.constexpr = C // H
        j: gl.constexpr = C % H
        qk = warpgroup_mma(_buf(qn_bufs, qz + h).slice(j * BOX, BOX, dim=1),
                           _buf(c_bufs, 2 * s + h).slice(j * BOX, BOX, dim=1).permute((1, 0)), qk,
                           use_acc=USE_ACC, is_async=True)
    return qk


@gluon.jit
def _scores_boxed(qn_bufs, qp_op, c_bufs, p_bufs, ready, g, zero, qz, FIRST: gl.constexpr):
    """S = Q K^T of block g, issued asynchronously one 64-column box at a time (the box's 4 k16 wgmmas; the rope
    part with Q's from registers), each box right after its own ready wait, so the scores start when the first box
    lands; the boxes of half FIRST first (kpe goes with the right half). qz: 0, from the loop counter
    (gluon_sm90_shard._scores' note: the Q descriptors are not hoisted out of the loop)."""
    H: gl.constexpr = c_bufs.shape[3] // 64 if c_bufs.shape[3] > 64 else 1  # boxes per half
    NB: gl.constexpr = 2 * H + 1
    qk = zero
    for i in gl.static_range(NB):
        qk = _score_box(qk, qn_bufs, qp_op, c_bufs, p_bufs, ready, g, qz, (i + FIRST * H) % NB, i > 0)
    return qk


@gluon.jit
def _pv(acc, alpha, p, v_smem, o_row: gl.constexpr):
    """Rescale acc (no product of it in flight) and issue acc += P V (P from registers or shared memory). V's rows
    past the sequence were zeroed by the block's owner (gluon_sm90_seesaw._pair, _lone), so no warpgroup branches
    on the tail here."""
    acc = acc * gl.convert_layout(alpha, o_row)[:, None]
    return warpgroup_mma(p, v_smem, acc, is_async=True)


@gluon.jit
def _other_block(acc, m_i, l_i, g, phase, x_bufs, m_bufs, r_bufs, c_bufs, ready, p_ready, sm_scale,
                 WG: gl.constexpr, s_row: gl.constexpr, o_row: gl.constexpr):
    """The other warpgroup's block g as seen by this one (its P, m and row sums; phase: of its p_ready), and the
    P V of it on this warpgroup's half, issued (the caller waits, then _release and frees the half)."""
    OTHER: gl.constexpr = 1 - WG
    H: gl.constexpr = c_bufs.shape[3] // 64 if c_bufs.shape[3] > 64 else 1
    s = g % 2
    _wait_boxes(ready, g, WG * H, WG * H + H)
    alpha, m_i, l_i = _gather(m_i, l_i, m_bufs.index(OTHER), r_bufs.index(OTHER), p_ready.index(OTHER), phase,
                              sm_scale, s_row)
    acc = _pv(acc, alpha, x_bufs.index(OTHER), _buf(c_bufs, 2 * s + WG), o_row)
    return acc, m_i, l_i
