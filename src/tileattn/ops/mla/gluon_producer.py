"""The producer side of the Hopper MLA kernel(s) (gluon_sm90.py, gluon_sm90_shard.py, gluon_sm90_seesaw.py): what
fills the ring of cache steps the consumer warpgroups read, and the work-item helpers both sides share.

  - `_loader` (one warp): a tile's Q, then its cache steps through the ring with TMA (see gluon_sm90.py).
  - fp8 (e4m3) caches (gluon_sm90.py): the consumers' wgmmas take 16-bit operands (Q stays in q's dtype, so the
    scores keep its precision; fp8 wgmma would need Q quantized and V transposed). The loader then streams the
    steps into a ring of F_STAGES fp8 buffers (`_fp8_rings`: `f_ready` / `f_empty`), and each consumer warpgroup
    widens its share of the next step (its ckv half; warpgroup 0 also kpe) into the 16-bit ring while its
    wgmmas of the current step run (`_widen_step`); `kv_ready` then counts both shares. The widening is exact
    (every e4m3 value is a bf16 and an fp16 value); the cache scale is applied by the consumers (scores and
    output), as for 16-bit caches. An fp8 step frees as soon as it is widened, so the fp8 ring keeps the loads
    in flight while the 16-bit ring holds the steps the consumers still read.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from ..common.gluon_compat import thread_barrier, tma_load


@gluon.jit
def _work_item(r, row_blocks, num_tiles, WORK):
    """(b, row block, start, end, output slot) of this CTA's tile in round r of the persistent grid; b = -1 when
    the CTA has no tile this round or the work item is unused (loader and consumers skip it alike)."""
    t = r * gl.num_programs(0) + gl.program_id(0)
    i_r = t % row_blocks
    w = t // row_blocks
    b = -1
    start = 0
    end = 0
    out_slot = -1
    if t < num_tiles:
        b = gl.load(WORK + w * 4)
        start = gl.load(WORK + w * 4 + 1)
        end = gl.load(WORK + w * 4 + 2)
        out_slot = gl.load(WORK + w * 4 + 3)
    return b, i_r, start, end, out_slot


@gluon.jit
def _buf(bufs, i):
    """Buffer i of a ring allocated in its descriptor's [1, rows, cols] block shape, as a [rows, cols] view."""
    return bufs.index(i).reshape([bufs.shape[2], bufs.shape[3]])


@gluon.jit
def _page_of(bt_row, n0, num_pages, PAGE: gl.constexpr):
    """Page id of token n0 (clamped into the cache: a bad id reads wrong rows, never outside)."""
    page = gl.load(bt_row + n0 // PAGE)
    return gl.minimum(gl.maximum(page, 0), num_pages - 1)


@gluon.jit
def _loader(qn_desc, qp_desc, ckv_desc, kpe_desc, qn_bufs, qp_buf, c_bufs, p_bufs, q_ready, q_empty, kv_ready,
            kv_empty, WORK, BT, stride_bt, num_pages, num_tiles, row_blocks,
            PAGE: gl.constexpr, STAGES: gl.constexpr, QP_SMEM: gl.constexpr = True, PAIRS: gl.constexpr = False):
    """QP_SMEM: the Q slot holds the rope part too (else only the nope halves: qp_desc and qp_buf unused).
    PAIRS (gluon_sm90_seesaw.py): every slot's two halves have their own empty barriers and every box its own
    ready barrier, the steps loaded by pairs (_load_pairs)."""
    BLOCK_M: gl.constexpr = qn_desc.block_type.shape[1]
    DH: gl.constexpr = qn_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[1]
    kv = 0  # cache steps loaded so far by this CTA: ring slot and phase
    j = 0  # tiles started so far: phase of the Q slot
    for r in range(gl.cdiv(num_tiles, gl.num_programs(0))):
        b, i_r, start, end, _ = _work_item(r, row_blocks, num_tiles, WORK)
        if b >= 0:
            n_blocks = gl.cdiv(end - start, BLOCK_N)
            bt_row = BT + b.to(gl.int64) * stride_bt
            # the Q slot frees only when the previous tile is done: its first STAGES steps go first (their
            # buffers are freed by the previous tile's consumers, which need nothing more from the loader).
            # A CTA's first tile finds the slot free: Q goes first there, ahead of the steps that every CTA
            # requests at the kernel's start (behind them, Q kept the consumers waiting for ~10 step times at
            # batch 128, kv 1K; first Q measured 85 -> 81 us per run there on the H100: docs/design/mla.md, the
            # session of 2026-11-28)
            first = gl.minimum(n_blocks, STAGES) * (j > 0).to(gl.int32)
            _load_steps(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv, 0, first, start, bt_row,
                        num_pages, PAGE, STAGES, PAIRS)
            mbarrier.wait(q_empty.index(0), (j & 1) ^ 1)
            if QP_SMEM:
                mbarrier.expect(q_ready.index(0), 2 * qn_desc.block_type.nbytes + qp_desc.block_type.nbytes)
                tma_load(qp_desc, [b, i_r * BLOCK_M, 0], q_ready.index(0), qp_buf.index(0))
            else:
                mbarrier.expect(q_ready.index(0), 2 * qn_desc.block_type.nbytes)
            for h in gl.static_range(2):
                tma_load(qn_desc, [b, i_r * BLOCK_M, h * DH], q_ready.index(0), qn_bufs.index(h))
            _load_steps(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv, first, n_blocks, start, bt_row,
                        num_pages, PAGE, STAGES, PAIRS)
            j += 1
            kv += n_blocks


@gluon.jit
def _load_steps(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv, it_lo, it_hi, start, bt_row,
                num_pages, PAGE: gl.constexpr, STAGES: gl.constexpr, PAIRS: gl.constexpr = False):
    """Cache steps it_lo..it_hi - 1 of a tile (tokens from start) into ring positions kv + it. PAIRS: by pairs
    of steps, each half on its own empty barrier and each box on its own ready barrier (_load_pairs)."""
    DH: gl.constexpr = ckv_desc.block_type.shape[2]
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[1]
    nbytes: gl.constexpr = 2 * ckv_desc.block_type.nbytes + kpe_desc.block_type.nbytes
    # (an empty range still reads a page id, within the tile's steps: its last step's, or its first's for the
    # empty range [0, 0) that a CTA's first tile starts with, never outside the sequence's row of the table)
    if PAIRS:
        _load_pairs(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv, it_lo, it_hi, start, bt_row,
                    num_pages, PAGE, STAGES)
    else:
        page = _page_of(bt_row, start + gl.maximum(gl.minimum(it_lo, it_hi - 1), 0) * BLOCK_N, num_pages, PAGE)
        for it in range(it_lo, it_hi):
            s = (kv + it) % STAGES
            n0 = start + it * BLOCK_N
            # the next step's page id is read while this one waits for its buffer
            next_page = _page_of(bt_row, gl.minimum(n0 + BLOCK_N, start + (it_hi - 1) * BLOCK_N), num_pages,
                                 PAGE)
            mbarrier.wait(kv_empty.index(s), (((kv + it) // STAGES) & 1) ^ 1)
            mbarrier.expect(kv_ready.index(s), nbytes)
            slot = n0 % PAGE
            for h in gl.static_range(2):
                tma_load(ckv_desc, [page, slot, h * DH], kv_ready.index(s), c_bufs.index(2 * s + h))
            tma_load(kpe_desc, [page, slot, 0], kv_ready.index(s), p_bufs.index(s))
            page = next_page


@gluon.jit
def _load_pairs(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv, it_lo, it_hi, start, bt_row, num_pages,
                PAGE: gl.constexpr, STAGES: gl.constexpr):
    """_load_steps(PAIRS), for the seesaw kernel's pair schedule (gluon_sm90_seesaw.py; it_lo even, or the range
    empty): empty barriers 2s (ckv's first half) and 2s + 1 (its second half and kpe) per slot s, each half loaded
    once its own says so; ckv_desc's box is one column box of a half, and box c of slot s (ckv's boxes in column
    order, then kpe) lands on kv_ready[c].index(s). Steps (it, it + 1) of a pair, owned by warpgroups 0 and 1, go
    in the order their halves free: each owner's own half (freed by its own P V, early in the pair before), then
    the others (freed by the P V of the other's P, last)."""
    BLOCK_N: gl.constexpr = ckv_desc.block_type.shape[1]
    for it in range(it_lo, it_hi, 2):
        n0 = start + it * BLOCK_N
        n1 = gl.minimum(n0 + BLOCK_N, start + (it_hi - 1) * BLOCK_N)  # (no step it + 1: its page id unused)
        page0 = _page_of(bt_row, n0, num_pages, PAGE)
        page1 = _page_of(bt_row, n1, num_pages, PAGE)
        two = it + 1 < it_hi
        _load_half(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv + it, page0, n0 % PAGE, 0, STAGES)
        if two:
            _load_half(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv + it + 1, page1, n1 % PAGE, 1,
                       STAGES)
        _load_half(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv + it, page0, n0 % PAGE, 1, STAGES)
        if two:
            _load_half(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, kv + it + 1, page1, n1 % PAGE, 0,
                       STAGES)


@gluon.jit
def _load_half(ckv_desc, kpe_desc, c_bufs, p_bufs, kv_ready, kv_empty, g, page, slot, h: gl.constexpr,
               STAGES: gl.constexpr):
    """Half h of step g once its empty barrier says so, each box on its own ready barrier (kv_ready[c], a tuple of
    [STAGES, 1] allocations: ckv's boxes in column order, then kpe with the right half)."""
    DH: gl.constexpr = c_bufs.shape[3]
    BOX: gl.constexpr = ckv_desc.block_type.shape[2]
    H: gl.constexpr = DH // BOX
    s = g % STAGES
    mbarrier.wait(kv_empty.index(2 * s + h), ((g // STAGES) & 1) ^ 1)
    for j in gl.static_range(H):
        bar = kv_ready[h * H + j].index(s)
        mbarrier.expect(bar, ckv_desc.block_type.nbytes)
        tma_load(ckv_desc, [page, slot, h * DH + j * BOX], bar, c_bufs.index(2 * s + h).slice(j * BOX, BOX, dim=2))
    if h == 1:
        mbarrier.expect(kv_ready[2 * H].index(s), kpe_desc.block_type.nbytes)
        tma_load(kpe_desc, [page, slot, 0], kv_ready[2 * H].index(s), p_bufs.index(s))


# ---- fp8 caches ----------------------------------------------------------------------------------------------
@gluon.jit
def _fp8_rings(ckv_desc, kpe_desc, F_STAGES: gl.constexpr):
    """The fp8 ring the loader fills for the consumers' widening (_widen_step): F_STAGES steps in the descriptors' block
    shapes, with their ready (TMA) and empty (both consumer warpgroups' widening) barriers."""
    f_c = gl.allocate_shared_memory(ckv_desc.dtype, [2 * F_STAGES] + ckv_desc.block_type.shape, ckv_desc.layout)
    f_p = gl.allocate_shared_memory(kpe_desc.dtype, [F_STAGES] + kpe_desc.block_type.shape, kpe_desc.layout)
    f_ready = gl.allocate_shared_memory(gl.int64, [F_STAGES, 1], mbarrier.MBarrierLayout())
    f_empty = gl.allocate_shared_memory(gl.int64, [F_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(F_STAGES):
        mbarrier.init(f_ready.index(s), count=1)
        mbarrier.init(f_empty.index(s), count=2)  # both consumer warpgroups' shares
    return f_c, f_p, f_ready, f_empty


# e4m3 -> 16-bit on the integer pipe, four values per 32-bit register (the conversion instructions run at a
# quarter of the ALU's rate, and widening with them was measured to limit the kernel): each byte goes to the
# high byte of a 16-bit lane, the exponent and mantissa bits shift into the target's fields (exponent bias 7
# where the target's is 127 / 15) and one exact multiply by 2^120 / 2^8 rebiases, subnormals included. An e4m3
# NaN (magnitude 0x7f) comes out as 480, not NaN.
_SPREAD = """{
.reg .b32 z, lo, hi, s, k;
mov.b32 z, 0;
mov.b32 k, SCALE;
prmt.b32 lo, $2, z, 0x1404;
prmt.b32 hi, $2, z, 0x3424;
and.b32 s, lo, 0x80008000;
shr.b32 lo, lo, SHIFT;
and.b32 lo, lo, MASK;
or.b32 lo, lo, s;
and.b32 s, hi, 0x80008000;
shr.b32 hi, hi, SHIFT;
and.b32 hi, hi, MASK;
or.b32 hi, hi, s;
mul.rn.TYPE $0, lo, k;
mul.rn.TYPE $1, hi, k;
}"""
_TO_BF16 = gl.constexpr(_SPREAD.replace("SHIFT", "4").replace("MASK", "0x07F007F0").replace("TYPE", "bf16x2")
                        .replace("SCALE", "0x7B807B80"))
_TO_F16 = gl.constexpr(_SPREAD.replace("SHIFT", "1").replace("MASK", "0x3F803F80").replace("TYPE", "f16x2")
                       .replace("SCALE", "0x5C005C00"))


@gluon.jit
def _load_fp8(src):
    """A [rows, D] fp8 (e4m3) box as bytes, 16 per thread and row (rows in groups of 4 * 32 / (D / 16), at least
    one row per warp)."""
    D: gl.constexpr = src.shape[1]
    TPW_C: gl.constexpr = D // 16 if D // 16 < 32 else 32
    TPW_R: gl.constexpr = 32 // TPW_C
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [TPW_R, TPW_C], [4, 1], [1, 0])
    return src.load(layout).to(gl.uint8, bitcast=True)


@gluon.jit
def _store_widened(dst, x):
    """dst = the e4m3 bytes x (_load_fp8) in dst's 16-bit type."""
    if dst.dtype == gl.bfloat16:
        y = gl.inline_asm_elementwise(_TO_BF16, "=r,=r,r", [x], dtype=gl.bfloat16, is_pure=True, pack=4)
    else:
        y = gl.inline_asm_elementwise(_TO_F16, "=r,=r,r", [x], dtype=gl.float16, is_pure=True, pack=4)
    dst.store(y)


@gluon.jit
def _widen(src, dst):
    """dst = src for a [rows, D] fp8 (e4m3) buffer and its 16-bit twin, by one warpgroup in passes of
    configs.widen_rows(D) rows (16 bytes per thread per row group; at least 8 rows, the swizzle's period;
    launch_sm90 checks that they divide rows). Triton (3.6) puts a warpgroup barrier before every pass's store
    but the first: its barrier analysis sees two stores into one allocation, whatever rows they take."""
    ROWS: gl.constexpr = src.shape[0]
    D: gl.constexpr = src.shape[1]
    TPW_C: gl.constexpr = D // 16 if D // 16 < 32 else 32
    TPW_R: gl.constexpr = 32 // TPW_C
    PASS: gl.constexpr = TPW_R * 4 if TPW_R * 4 > 8 else 8
    for p in gl.static_range(ROWS // PASS):
        _store_widened(dst.slice(p * PASS, PASS, dim=0), _load_fp8(src.slice(p * PASS, PASS, dim=0)))


@gluon.jit
def _widen_step(fp8, c_bufs, p_bufs, kv_ready, kv_empty, g, WG: gl.constexpr, F_STAGES: gl.constexpr,
                STAGES: gl.constexpr, ONCE: gl.constexpr = False, LATE: gl.constexpr = False):
    """Consumer warpgroup WG's share of cache step g (this CTA's count, as the loader's): its ckv half (and for
    warpgroup 0 the kpe part) widened from fp8 ring slot g % F_STAGES into 16-bit ring slot g % STAGES, once
    both warpgroups have freed that slot's previous step. fp8: _fp8_rings' (f_c, f_p, f_ready, f_empty).
    ONCE (MLASm90Config.widen_once): the share in one load and one store per buffer (its loads back to back, no
    barrier between passes); else in passes (_widen). LATE (MLASm90Config.fence_late): the stores only; the
    caller publishes them later (_widened, or its own fence and barrier, then _widen_arrive)."""
    f_c, f_p, f_ready, f_empty = fp8
    sf = g % F_STAGES
    sb = g % STAGES
    mbarrier.wait(f_ready.index(sf), (g // F_STAGES) & 1)
    mbarrier.wait(kv_empty.index(sb), ((g // STAGES) & 1) ^ 1)
    if ONCE:
        c8 = _load_fp8(_buf(f_c, 2 * sf + WG))
        if WG == 0:
            p8 = _load_fp8(_buf(f_p, sf))
        _store_widened(_buf(c_bufs, 2 * sb + WG), c8)
        if WG == 0:
            _store_widened(_buf(p_bufs, sb), p8)
    else:
        _widen(_buf(f_c, 2 * sf + WG), _buf(c_bufs, 2 * sb + WG))
        if WG == 0:
            _widen(_buf(f_p, sf), _buf(p_bufs, sb))
    if not LATE:
        _widened(fp8, kv_ready, g, F_STAGES, STAGES)


@gluon.jit
def _widened(fp8, kv_ready, g, F_STAGES: gl.constexpr, STAGES: gl.constexpr):
    """Publishes a warpgroup's share of step g (_widen_step): the stores must be visible to both warpgroups'
    wgmmas (the async proxy) before kv_ready says so."""
    fence_async_shared()
    thread_barrier()
    _widen_arrive(fp8, kv_ready, g, F_STAGES, STAGES)


@gluon.jit
def _widen_arrive(fp8, kv_ready, g, F_STAGES: gl.constexpr, STAGES: gl.constexpr):
    """The arrives of _widened, for a caller that has fenced and synchronized the warpgroup after the stores."""
    f_c, f_p, f_ready, f_empty = fp8
    mbarrier.arrive(f_empty.index(g % F_STAGES))
    mbarrier.arrive(kv_ready.index(g % STAGES))
