"""Backward pieces shared by the dense and flex backward kernels (Triton jit): where a sequence's rows are,
row tiles, the per-row statistics, the broadcasts of (possibly transposed) tiles, the walks of the backward
programs over their blocks (query_steps, key_steps, masked_step), the preprocess kernel
delta = rowsum(dO * O) - dlse, and the Hopper backward's dQ conversion.
"""
import triton
import triton.language as tl

from .masking import key_range, query_range


@triton.jit
def seq_rows(i_b, cu_q, cu_k, seqlen_q, seqlen_k, IS_VARLEN: tl.constexpr):
    """(first row of the sequence in q, in k, its query length, its key length)."""
    if IS_VARLEN:
        q0 = tl.load(cu_q + i_b)
        k0 = tl.load(cu_k + i_b)
        return q0, k0, tl.load(cu_q + i_b + 1) - q0, tl.load(cu_k + i_b + 1) - k0
    else:
        return 0, 0, seqlen_q, seqlen_k


# programmatic dependent launch's go-ahead (inline PTX, "=r"): a kernel launched after this one with PDL may start
# once every program of this grid has run it (or exited). The preprocess below and the Gluon backward's loader
# (gluon_bwd_sm90_loader.py) share it.
LAUNCH_DEPENDENTS_PTX = "griddepcontrol.launch_dependents; mov.b32 $0, 0;"
_LAUNCH_DEPENDENTS = tl.constexpr(LAUNCH_DEPENDENTS_PTX)


@triton.jit
def bwd_preprocess_kernel(O, DO, DLSE, DELTA, stride_ob, stride_os, stride_oh, stride_db, stride_ds, stride_dh,
                          stride_lb, stride_lh, stride_glb, stride_glh, cu_q, seqlen_q, num_heads, num_bh, ZERO,
                          zero_count, chain, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                          IS_VARLEN: tl.constexpr, HAS_DLSE: tl.constexpr, ACC: tl.constexpr = tl.float32,
                          ZERO_CHUNK: tl.constexpr = 0, CHAIN: tl.constexpr = False,
                          PDL_TRIGGER: tl.constexpr = False):
    """Grid (query blocks, B * Hq folded over y and z): delta = rowsum(dO * O) (- dlse), float32, in lse's
    layout (dlse contiguous along the sequence). ZERO_CHUNK > 0: the programs also zero the int32 buffer ZERO
    [zero_count], ZERO_CHUNK elements each in the order of (B * Hq, query block) (the Hopper backward's counters,
    launch_bwd_sm90.zero_args: one launch fewer than a fill). CHAIN (the flex Hopper backward): program (0, 0)
    also writes ZERO[zero_count] = the kernel's head group (chain_group). PDL_TRIGGER (sm90 only; followed by the
    dense Hopper kernel, launched with programmatic dependent launch): each program lets that kernel launch at
    once, so that its programs start on the SMs this grid's tail frees (it waits for this grid's writes)."""
    if PDL_TRIGGER:
        tl.inline_asm_elementwise(_LAUNCH_DEPENDENTS, "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    i_m = tl.program_id(0)
    i_bh = tl.program_id(1) + tl.program_id(2) * tl.num_programs(1)
    if i_bh >= num_bh:
        return
    if ZERO_CHUNK > 0:
        o_z = (i_bh * tl.num_programs(0) + i_m) * ZERO_CHUNK + tl.arange(0, ZERO_CHUNK)
        tl.store(ZERO + o_z, tl.zeros([ZERO_CHUNK], tl.int32), mask=o_z < zero_count)
    if CHAIN:
        if i_m + i_bh == 0:
            tl.store(ZERO + zero_count, chain_group(*chain))
    i_b = i_bh // num_heads
    i_h = (i_bh % num_heads).to(tl.int64)
    q0, _, seqlen_q, _ = seq_rows(i_b, cu_q, cu_q, seqlen_q, seqlen_q, IS_VARLEN)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_DV)
    m_ok = o_m < seqlen_q
    rows = (q0 + o_m).to(tl.int64)
    if IS_VARLEN:
        ob = 0
        db = 0
        lb = q0.to(tl.int64)
        glb = q0.to(tl.int64)
    else:
        ob = i_b.to(tl.int64) * stride_ob
        db = i_b.to(tl.int64) * stride_db
        lb = i_b.to(tl.int64) * stride_lb
        glb = i_b.to(tl.int64) * stride_glb
    o = load_rows(O + ob + i_h * stride_oh, rows, stride_os, m_ok, o_d, DV)
    do = load_rows(DO + db + i_h * stride_dh, rows, stride_ds, m_ok, o_d, DV)
    delta = tl.sum(o.to(ACC) * do.to(ACC), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + glb + i_h * stride_glh + o_m, mask=m_ok, other=0.0)
    tl.store(DELTA + lb + i_h * stride_lh + o_m, delta, mask=m_ok)


@triton.jit
def chain_group(num, idx, fnum, fidx, s_num, s_idx, s_fnum, s_fidx, num_kv_blocks, group):
    """The flex Hopper backward's head group (launch_bwd_sm90.FLEX_HEAD_GROUP) for a block mask whose transposed lists
    of (batch 0, head 0) are num, idx (partial) and fnum, fidx (full; s_*: their strides along the key blocks):
    `group` where most key blocks start their walk (their first query block) where the next key block starts
    too, as a document mask's do (each dQ add of that block then waits for the one of the key block above: the
    chain is long, and interleaving heads spaces its key blocks out), else 1. Reads 4 entries per key block."""
    o = tl.arange(0, 128)
    ties = 0
    for c in range(0, num_kv_blocks - 1, 128):
        n = c + o
        ok = n < num_kv_blocks - 1
        s0 = _walk_start(num, idx, fnum, fidx, s_num, s_idx, s_fnum, s_fidx, n, ok)
        s1 = _walk_start(num, idx, fnum, fidx, s_num, s_idx, s_fnum, s_fidx, n + 1, ok)
        ties += tl.sum(((s0 == s1) & (s0 < 2 ** 30) & ok).to(tl.int32), axis=0)
    return tl.where(2 * ties >= num_kv_blocks, group, 1)


@triton.jit
def _walk_start(num, idx, fnum, fidx, s_num, s_idx, s_fnum, s_fidx, n, ok):
    """First query block of key block n's transposed lists (2^30 where both are empty)."""
    n_p = tl.load(num + n * s_num, mask=ok, other=0)
    n_f = tl.load(fnum + n * s_fnum, mask=ok, other=0)
    first_p = tl.load(idx + n * s_idx, mask=ok & (n_p > 0), other=2 ** 30)
    first_f = tl.load(fidx + n * s_fidx, mask=ok & (n_f > 0), other=2 ** 30)
    return tl.minimum(tl.where(n_p > 0, first_p, 2 ** 30), tl.where(n_f > 0, first_f, 2 ** 30))


@triton.jit
def load_rows(ptr, rows, stride_s, ok, cols, ncols, UNMASKED: tl.constexpr = False):
    """[len(rows), len(cols)] tile of a row-major operand: rows of stride stride_s from ptr, masked by ok and
    cols < ncols (zeros there); UNMASKED: the caller knows every element is inside."""
    if UNMASKED:
        return tl.load(ptr + rows[:, None] * stride_s + cols[None, :])
    else:
        return tl.load(ptr + rows[:, None] * stride_s + cols[None, :], mask=ok[:, None] & (cols < ncols)[None, :],
                       other=0.0)


@triton.jit
def row_index(rows, ROW64: tl.constexpr):
    """Row indices for load_rows: int32 unless rows * stride can pass 2^31 (ROW64, the launcher's check)."""
    if ROW64:
        return rows.to(tl.int64)
    else:
        return rows


@triton.jit
def row_stats(LSE, DELTA, off, o_m, m_ok):
    """(lse, delta) of query rows o_m (lse -inf past the sequence: those rows get p = 0)."""
    return (tl.load(LSE + off + o_m, mask=m_ok, other=float("-inf")),
            tl.load(DELTA + off + o_m, mask=m_ok, other=0.0))


@triton.jit
def q_axis(x, TRANS: tl.constexpr):
    """A per-query vector broadcast along a tile's query axis (rows; columns of a transposed tile)."""
    if TRANS:
        return x[None, :]
    else:
        return x[:, None]


@triton.jit
def k_axis(x, TRANS: tl.constexpr):
    """A per-key vector broadcast along a tile's key axis (columns; rows of a transposed tile)."""
    if TRANS:
        return x[:, None]
    else:
        return x[None, :]


@triton.jit
def batch_bases(i_b, q0, stride_qb, stride_kb, stride_vb, stride_db, stride_lb, IS_VARLEN: tl.constexpr):
    """int64 element offsets of batch i_b in q, k, v, dO and lse / delta (varlen: 0, the rows carry the
    sequence; lse / delta: the sequence's first row q0)."""
    if IS_VARLEN:
        z = q0.to(tl.int64) * 0  # int64 like the other branch's (a literal 0 is int32: the compiler refuses)
        return z, z, z, z, q0.to(tl.int64)
    b64 = i_b.to(tl.int64)
    return b64 * stride_qb, b64 * stride_kb, b64 * stride_vb, b64 * stride_db, b64 * stride_lb


@triton.jit
def batch_base(i_b, stride_b, IS_VARLEN: tl.constexpr):
    """int64 element offset of batch i_b in a gradient (varlen: 0)."""
    if IS_VARLEN:
        return i_b.to(tl.int64) * 0  # int64 like the other branch's
    return i_b.to(tl.int64) * stride_b


@triton.jit
def query_steps(n0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, NEEDS_MASK: tl.constexpr):
    """The query blocks key block n0 walks: (m_lo, f_lo, f_hi, n_before, n_masked): unmasked blocks
    [f_lo, f_hi), then n_masked masked ones, the first n_before of them from m_lo (masked_step gives each)."""
    m_lo, f_lo, f_hi, m_hi = query_range(n0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M, BLOCK_N, HAS_LEFT,
                                         HAS_RIGHT, NEEDS_MASK)
    n_before = tl.cdiv(f_lo - m_lo, BLOCK_M)  # f_lo: a block start or m_hi
    return m_lo, f_lo, f_hi, n_before, n_before + tl.cdiv(m_hi - f_hi, BLOCK_M)


@triton.jit
def key_steps(m0, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, NEEDS_MASK: tl.constexpr):
    """The key blocks query block m0 walks: (lo, full_lo, full_hi, n_before, n_masked), as query_steps."""
    lo, hi, full_lo, full_hi = key_range(m0, m0 + BLOCK_M - 1, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT,
                                         HAS_RIGHT)
    if not NEEDS_MASK:
        full_lo, full_hi = lo, hi
    elif m0 + BLOCK_M > seqlen_q:  # a partial query block: rows past the sequence are masked everywhere
        full_lo, full_hi = hi, hi
    n_before = tl.cdiv(full_lo - lo, BLOCK_N)  # full_lo: a block start or hi
    return lo, full_lo, full_hi, n_before, n_before + tl.cdiv(hi - full_hi, BLOCK_N)


@triton.jit
def masked_step(i, lo, full_hi, n_before, BLOCK: tl.constexpr):
    """Start of masked step i: below the unmasked range for the first n_before, above it after."""
    return tl.where(i < n_before, lo + i * BLOCK, full_hi + (i - n_before) * BLOCK)


def wait_count_ptx(backoff_ns):
    """Inline PTX ("=r,l,r": out, the int32's address, the target) that waits until the int32 reaches the target:
    lane 0 of each warp polls it (acquire, backoff_ns between reads), then the warp barrier orders the whole
    warp's later memory operations after it. The Triton conversion below and the Gluon dQ writers
    (gluon_bwd_sm90_dq.py, the turn waits) share it."""
    return ("{ .reg .pred %p<2>; .reg .b32 %l<1>; mov.u32 %l0, %laneid; setp.ne.u32 %p1, %l0, 0; mov.b32 $0, 0; "
            "@%p1 bra done_${:uid}; spin_${:uid}: ld.global.acquire.gpu.b32 $0, [$1]; setp.lt.s32 %p0, $0, $2; "
            f"@!%p0 bra done_${{:uid}}; nanosleep.u32 {backoff_ns}; bra spin_${{:uid}}; done_${{:uid}}: "
            "bar.warp.sync -1; }")


_WAIT_COUNT = tl.constexpr(wait_count_ptx(128))


@triton.jit
def _wait_count(ptr, target):
    """Until the int32 at ptr reaches target (wait_count_ptx)."""
    tl.inline_asm_elementwise(_WAIT_COUNT, "=r,l,r", [ptr, target], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def bwd_dq_convert_kernel(ACC, DQ, LSE, COUNTERS, stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh,
                          seqlen_q, num_heads, group_size, done_offset, done_target, rows_per_head, scale,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, ZERO_UNSEEN: tl.constexpr):
    """Grid (cdiv(Sq, BLOCK_M), B * Hq): dQ = scale * the float32 sums of the Hopper backward (gluon_bwd_sm90.py;
    ACC [B * Hq, rows_per_head, D]) in dQ's dtype and strides, once the head's sums are complete: the kernel may
    start while the backward still runs (programmatic dependent launch), so it first waits for the done counter of
    the head's (batch, kv head) (COUNTERS[done_offset:] [B, Hkv], after the turn counters; group_size query heads
    per kv head) to reach done_target.
    ZERO_UNSEEN: rows whose lse (LSE [B, Hq, Sq]) is -inf saw no key and get 0 whatever ACC holds (a query block
    that no key block sees is never written: flex allocates the sums without zeroing them)."""
    i_m = tl.program_id(0)
    i_bh = tl.program_id(1)
    # (batch * Hq + h) // g = batch * Hkv + h // g
    _wait_count(COUNTERS + done_offset + i_bh // group_size, done_target)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, D)
    m_ok = (o_m < seqlen_q)[:, None]
    x = tl.load(ACC + (i_bh.to(tl.int64) * rows_per_head + o_m)[:, None] * D + o_d[None, :], mask=m_ok)
    i_b = (i_bh // num_heads).to(tl.int64)
    i_h = (i_bh % num_heads).to(tl.int64)
    x = x * scale
    if ZERO_UNSEEN:
        lse = tl.load(LSE + i_b * stride_lb + i_h * stride_lh + o_m, mask=o_m < seqlen_q, other=0.0)
        x = tl.where((lse == float("-inf"))[:, None], 0.0, x)
    tl.store(DQ + i_b * stride_dqb + i_h * stride_dqh + o_m.to(tl.int64)[:, None] * stride_dqs + o_d[None, :],
             x.to(DQ.dtype.element_ty), mask=m_ok)
