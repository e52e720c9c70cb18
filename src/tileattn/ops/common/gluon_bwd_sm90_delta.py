"""The Hopper backward's delta programs (gluon_bwd_sm90.py, SPLIT_DELTA): on a persistent grid of several rounds,
the programs past the work programs (the SMs the rounds' whole heads leave over) compute delta = rowsum(dO * O)
(- dlse) for the heads of the later rounds while the work programs run the first ones; the preprocess computes
only the first round's heads and marks the other rows pending (PENDING, a NaN that float32 arithmetic never
makes: the GPU's NaN results are 0x7fffffff). A work program's loader reads a step's delta rows until none is
pending: each row is its own flag, written once, so the delta programs store without fences or counters. The grid
is launched cooperatively, so the delta programs run whatever else holds the GPU: the wait cannot hang on them.

dx = (o, do, dlse, O's strides (batch, row, head), dO's, dlse's (batch, head), the first query head (batch * Hq +
h) of the delta programs' work)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_bwd_sm90_sync import grid_dependency_wait

PENDING = gl.constexpr(-1)  # a delta row not written yet, as int32 (0xffffffff)
CHUNK = gl.constexpr(16384)  # elements per chunk: [CHUNK / DV, DV] tiles of O and dO, 128 registers a thread


@gluon.jit
def wait_rows(ptrs, ok, delta):
    """A step's delta rows (delta: as loaded from ptrs where ok) once none is pending (the loader; 64 ns between
    reads, which bypass L1)."""
    pending = gl.max((delta.to(gl.int32, bitcast=True) == PENDING).to(gl.int32), axis=0)
    while pending > 0:
        gl.inline_asm_elementwise("nanosleep.u32 64; mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False,
                                  pack=1)
        delta = gl.load(ptrs, mask=ok, other=0.0, volatile=True)
        pending = gl.max((delta.to(gl.int32, bitcast=True) == PENDING).to(gl.int32), axis=0)
    return delta


@gluon.jit
def delta_rows(dx, delta_ptr, stride_lb, stride_lh, group_size, wk, WG: gl.constexpr, DV: gl.constexpr,
               HAS_DLSE: gl.constexpr):
    """A consumer warpgroup of a delta program: chunks of CHUNK / DV rows of the query heads from dx[11] on,
    head-major (so the heads complete in the order the rounds need them), taken by the delta programs' warpgroups
    in turn; delta in lse's layout (stride_lb, stride_lh), float32."""
    ROWS: gl.constexpr = CHUNK // DV
    VEC: gl.constexpr = 8
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // (DV // VEC), DV // VEC], [4, 1], [1, 0])
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, DV, layout=gl.SliceLayout(0, layout))
    seqlen_q = wk[3]
    heads_q = wk[2] * group_size
    chunks = gl.cdiv(seqlen_q, ROWS)
    total = wk[0] // wk[1] * group_size * chunks  # (batch * kv heads) * group * chunks
    worker = (gl.program_id(0) - wk[9]) * 2 + WG
    workers = (gl.num_programs(0) - wk[9]) * 2
    grid_dependency_wait()  # after the preprocess, which marks these rows pending
    for c in range(dx[11] * chunks + worker, total, workers):
        i_bhq = c // chunks
        i_b = (i_bhq // heads_q).to(gl.int64)
        i_h = (i_bhq % heads_q).to(gl.int64)
        r = ((c % chunks) * ROWS + rows).to(gl.int64)
        ok = r < seqlen_q
        # (first out of L2: these rows stream through it beside the work programs' tiles)
        o = gl.load(dx[0] + i_b * dx[3] + i_h * dx[5] + r[:, None] * dx[4] + cols[None, :], mask=ok[:, None],
                    eviction_policy="evict_first")
        do = gl.load(dx[1] + i_b * dx[6] + i_h * dx[8] + r[:, None] * dx[7] + cols[None, :], mask=ok[:, None],
                     eviction_policy="evict_first")
        d = gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1)
        if HAS_DLSE:
            d -= gl.load(dx[2] + i_b * dx[9] + i_h * dx[10] + r, mask=ok, other=0.0)
        gl.store(delta_ptr + i_b * stride_lb + i_h * stride_lh + r, d, mask=ok)
