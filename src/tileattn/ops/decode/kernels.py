"""Triton kernels of attention over a KV cache (paged or contiguous): split-KV (with the merge of split pieces)
and the append of new keys and values.

Rows. The queries of one sequence b that share a KV head hk are processed together, so each cache byte is read
once for all of them: a tile holds BLOCK_M rows r = t * G + g (query token t of the sequence, query head
hk * G + g, G = Hq // Hkv). Decode (q_len 1, G 4) is one tile of 4 rows; chunked prefill has many tiles.

`decode_split_kernel`: grid (Hkv, work items), the only kernel of a run (no separate combine launch). A work item
(from the plan's schedule, plan.py) is one row tile of one sequence and one key range [k_start, k_end). Its program
loads the tile's queries once, walks the range in BLOCK_N-token steps, gathering the cache's rows through the block
table (or from the contiguous cache when not PAGED), and keeps an online softmax in base 2. An item covering its
tile's whole key range writes the output (finished with the sink, when there is one); a split one writes its partial
output (divided by its own sum) and log2-sum-exp to the workspace and counts itself done on its tile's semaphore;
the tile's last piece to finish merges the partials (`_merge`) and writes the output.

Visibility of key j to the query token t of sequence b (pos = seqlen_b - q_len_b + t, bottom-right aligned):
j < seqlen_b, and j <= pos (CAUSAL), and pos - WINDOW_LEFT <= j (WINDOW_LEFT >= 0), and j <= pos + WINDOW_RIGHT
(WINDOW_RIGHT >= 0). Scores are q.k * scale * k_scale, then softcap * tanh(s / softcap) (SOFTCAP), then
minus slope_h * |pos - j| (ALIBI). A sink (one logit per query head) joins the softmax's denominator only.
Rows that see nothing give out = 0 and lse = -inf (or the sink's logit).
Page ids are clamped into [0, num_pages) before the gather, so a bad block table can never make the kernel read
outside the cache (the one-call API checks the page ids on the host). Tokens past a sequence's length are
never loaded.
"""
import triton
import triton.language as tl

from ..common.paging import gather_rows
from ..common.softmax import tanh

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _finish(acc, l_i, m2, v_scale, SINKS, hq, HAS_SINK: tl.constexpr):
    """(out, lse2) of accumulated rows: out = acc / l * v_scale, lse2 their log2-sum-exp2 (-inf for a row
    that saw nothing), the sink's logit (natural units, per query head) joined to the denominator."""
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    lse2 = tl.where(seen, m2 + tl.log2(l_safe), float("-inf"))
    out = acc * (v_scale / l_safe)[:, None]
    if HAS_SINK:
        sink2 = tl.load(SINKS + hq).to(tl.float32) * LOG2E
        top = tl.maximum(lse2, sink2)
        both = top + tl.log2(tl.exp2(lse2 - top) + tl.exp2(sink2 - top))
        out = out * tl.exp2(lse2 - both)[:, None]
        lse2 = both
    return out, lse2


@triton.jit
def _store_out(O, LSE, out, lse2, b, t, hq, q_row, row_ok, d,
               stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt, RETURN_LSE: tl.constexpr):
    """Rows of sequence b, query token t (packed row q_row + t), query head hq: out and lse (natural log)."""
    b64 = b.to(tl.int64)
    tok = (q_row + t).to(tl.int64)
    o_ptr = O + b64 * stride_ob + tok[:, None] * stride_ot + hq[:, None] * stride_oh + d[None, :]
    tl.store(o_ptr, out.to(O.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        tl.store(LSE + b64 * stride_lb + hq * stride_lh + tok * stride_lt, lse2 * LN2, mask=row_ok)


@triton.jit
def decode_split_kernel(
    Q, K, V, BT, SEQLENS, QINFO, WORK, TILES, SEM, O, LSE, OP, LSEP, KS, VS, SLOPES, SINKS,
    stride_qb, stride_qt, stride_qh,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
    stride_ksh, stride_vsh,
    num_pages, qk_scale, softcap, window_left, window_right,
    D: tl.constexpr, G: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
    WINDOW: tl.constexpr, FP8: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """kv head hk = program_id(0), work item w = program_id(1): WORK[w] = (b, r0, k_start, k_end, slot, tile),
    b < 0 for unused capacity, slot < 0 to write O (and LSE) directly, else OP [slots, Hkv, BLOCK_M, D] and
    LSEP [slots, Hkv, BLOCK_M] (log2, float32), then count the piece in SEM[tile, hk]: the tile's last piece
    to finish merges them all (TILES[tile] = (b, r0, first slot, count)) and resets the counter.
    QINFO[b] = (first packed query row, q_len). Q / O rows: b * stride_qb + (QINFO[b][0] + t) * stride_qt
    + h * stride_qh. qk_scale: scale (times log2 e unless SOFTCAP);
    KS / VS: float32 cache scales per kv head (stride_ksh 0: one for all). FP8: an e4m3 cache is converted
    to float16 (exactly, one instruction per two values; bfloat16 would take several) and the dots run in
    float16, q converted too (a |q| past 65504 saturates)."""
    hk = tl.program_id(0)
    w = tl.program_id(1)
    b = tl.load(WORK + w * 6)
    if b < 0:
        return
    r0 = tl.load(WORK + w * 6 + 1)
    k_start = tl.load(WORK + w * 6 + 2)
    k_end = tl.load(WORK + w * 6 + 3)
    slot = tl.load(WORK + w * 6 + 4)
    seqlen = tl.load(SEQLENS + b)
    q_row = tl.load(QINFO + b * 2)
    q_len = tl.load(QINFO + b * 2 + 1)

    r = r0 + tl.arange(0, BLOCK_M)
    row_ok = r < q_len * G
    t = r // G
    hq = hk * G + r % G
    d = tl.arange(0, D)
    b64 = b.to(tl.int64)
    q = tl.load(Q + b64 * stride_qb + (q_row + t)[:, None].to(tl.int64) * stride_qt + hq[:, None] * stride_qh
                + d[None, :], mask=row_ok[:, None], other=0.0)
    if FP8:
        q = q.to(tl.float16)
    k_scale = tl.load(KS + hk * stride_ksh)
    v_scale = tl.load(VS + hk * stride_vsh)
    pos = seqlen - q_len + t  # the query token's position in its sequence
    hi = tl.zeros([BLOCK_M], tl.int32) + tl.minimum(seqlen, k_end)
    if CAUSAL:
        hi = tl.minimum(hi, pos + 1)
    if WINDOW:
        if window_right >= 0:
            hi = tl.minimum(hi, pos + window_right + 1)
        lo = tl.where(window_left >= 0, pos - window_left, 0)
    if ALIBI:
        slope = tl.load(SLOPES + hq, mask=row_ok, other=0.0).to(tl.float32) * LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    bt_row = BT + b64 * stride_bt
    for n0 in range(k_start, k_end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        tok_ok = tok < k_end
        if PAGED:
            page = tl.load(bt_row + tok // PAGE, mask=tok_ok, other=0)
            page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
            slot_in_page = tok % PAGE
        else:
            page = tl.zeros([BLOCK_N], tl.int32) + b
            slot_in_page = tok
        k = gather_rows(K + hk * stride_kh, stride_kp, stride_ks, page, slot_in_page, d, tok_ok).to(q.dtype)
        v = gather_rows(V + hk * stride_vh, stride_vp, stride_vs, page, slot_in_page, d, tok_ok).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * (qk_scale * k_scale)
        if SOFTCAP:
            s = (softcap * LOG2E) * tanh(s / softcap)
        if ALIBI:
            s -= slope[:, None] * tl.abs(pos[:, None] - tok[None, :]).to(tl.float32)
        vis = tok[None, :] < hi[:, None]
        if WINDOW:
            vis = vis & (tok[None, :] >= lo[:, None])
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_shift[:, None])
        alpha = tl.exp2(m_i - m_shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if slot < 0:
        out, lse2 = _finish(acc, l_i, m_i, v_scale, SINKS, hq, HAS_SINK)
        _store_out(O, LSE, out, lse2, b, t, hq, q_row, row_ok, d,
                   stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt, RETURN_LSE)
    else:
        out, lse2 = _finish(acc, l_i, m_i, v_scale, SINKS, hq, False)
        base = (slot.to(tl.int64) * tl.num_programs(0) + hk) * BLOCK_M
        i = tl.arange(0, BLOCK_M)
        tl.store(OP + (base + i[:, None]) * D + d[None, :], out, mask=row_ok[:, None])
        tl.store(LSEP + base + i, lse2, mask=row_ok)
        tile = tl.load(WORK + w * 6 + 5)
        count = tl.load(TILES + tile * 4 + 3)
        sem = SEM + tile * tl.num_programs(0) + hk
        tl.debug_barrier()  # every thread's partial stores issued before the release below
        done = tl.atomic_add(sem, 1, sem="acq_rel")
        if done == count - 1:  # the last piece: the others' partials are visible (acquire)
            _merge(OP, LSEP, TILES, tile, hk, O, LSE, SINKS, b, t, hq, q_row, row_ok, d,
                   stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
                   D, BLOCK_M, HAS_SINK, RETURN_LSE)
            tl.atomic_xchg(sem, 0)  # ready for the next run (a captured graph replays it)


@triton.jit
def _merge(OP, LSEP, TILES, tile, hk, O, LSE, SINKS, b, t, hq, q_row, row_ok, d,
           stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
           D: tl.constexpr, BLOCK_M: tl.constexpr, HAS_SINK: tl.constexpr, RETURN_LSE: tl.constexpr):
    """Merge the count partials of split tile `tile` (TILES[tile] = (b, r0, first slot, count)) for KV head hk
    by their log2-sum-exp, join the sink, write O (and LSE). Loads bypass L1 (.cg): other programs wrote them."""
    first = tl.load(TILES + tile * 4 + 2)
    count = tl.load(TILES + tile * 4 + 3)
    num_kv = tl.num_programs(0)
    rl = tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, count):
        base = ((first + s).to(tl.int64) * num_kv + hk) * BLOCK_M
        m = tl.maximum(m, tl.load(LSEP + base + rl, mask=row_ok, other=float("-inf"), cache_modifier=".cg"))
    m_shift = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    for s in range(0, count):
        base = ((first + s).to(tl.int64) * num_kv + hk) * BLOCK_M
        wgt = tl.exp2(tl.load(LSEP + base + rl, mask=row_ok, other=float("-inf"), cache_modifier=".cg") - m_shift)
        part = tl.load(OP + (base + rl[:, None]) * D + d[None, :], mask=row_ok[:, None], other=0.0,
                       cache_modifier=".cg")
        acc += wgt[:, None] * part
        l_sum += wgt
    out, lse2 = _finish(acc, l_sum, m_shift, 1.0, SINKS, hq, HAS_SINK)
    _store_out(O, LSE, out, lse2, b, t, hq, q_row, row_ok, d,
               stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt, RETURN_LSE)


@triton.jit
def append_kv_kernel(
    KN, VN, K, V, BT, SEQLENS, QINFO, KS, VS,
    stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh,
    stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt, stride_ksh, stride_vsh,
    num_pages,
    D: tl.constexpr, PAGE: tl.constexpr, PAGED: tl.constexpr, BLOCK_T: tl.constexpr, QUANT: tl.constexpr,
):
    """Grid (Hkv, B, token blocks): the q_len_b new keys and values of sequence b (rows QINFO[b][0] + i of
    KN / VN, head hk) go to cache positions seqlen_b - q_len_b + i. QUANT: an fp8 cache, values divided by
    the head's scale and saturated to +-448 before the cast."""
    hk = tl.program_id(0)
    b = tl.program_id(1)
    i = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
    q_row = tl.load(QINFO + b * 2)
    q_len = tl.load(QINFO + b * 2 + 1)
    seqlen = tl.load(SEQLENS + b)
    ok = i < q_len
    pos = seqlen - q_len + i
    d = tl.arange(0, D)
    b64 = b.to(tl.int64)
    if PAGED:
        page = tl.load(BT + b64 * stride_bt + pos // PAGE, mask=ok, other=0)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        slot = pos % PAGE
    else:
        page = tl.zeros([BLOCK_T], tl.int64) + b64
        slot = pos
    row = (q_row + i).to(tl.int64)
    kn = tl.load(KN + b64 * stride_knb + row[:, None] * stride_knt + hk * stride_knh + d[None, :],
                 mask=ok[:, None], other=0.0).to(tl.float32)
    vn = tl.load(VN + b64 * stride_vnb + row[:, None] * stride_vnt + hk * stride_vnh + d[None, :],
                 mask=ok[:, None], other=0.0).to(tl.float32)
    if QUANT:
        kn = tl.clamp(kn / tl.load(KS + hk * stride_ksh), -448.0, 448.0)
        vn = tl.clamp(vn / tl.load(VS + hk * stride_vsh), -448.0, 448.0)
    dst_k = K + page * stride_kp + slot.to(tl.int64) * stride_ks + hk * stride_kh
    dst_v = V + page * stride_vp + slot.to(tl.int64) * stride_vs + hk * stride_vh
    tl.store(dst_k[:, None] + d[None, :], kn.to(K.dtype.element_ty), mask=ok[:, None])
    tl.store(dst_v[:, None] + d[None, :], vn.to(V.dtype.element_ty), mask=ok[:, None])
