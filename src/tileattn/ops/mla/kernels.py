"""Triton kernels of MLA decode over a paged compressed KV cache (split-KV, then a combine step).

Every query row (one query token t of one head h of one sequence b) attends to the same compressed cache
of sequence b: ckv [tokens, DC] (the keys' "nope" part, and also the values) and kpe [tokens, DR] (the
rotary part of the keys). Score(row, j) = q_nope . ckv_j + q_pe . kpe_j; out = softmax(scale * score) @ ckv.

`mla_split_kernel`: grid (row blocks, work items, output slices). A work item (from the plan's schedule) is
a token range [start, end) of one sequence. Its program loads the query rows once, walks the range in
BLOCK_N-token steps gathering rows of the paged cache through the block table, and keeps an online softmax
in base 2 (the scale times log2 e is folded into the exponent). A work item covering a whole sequence
writes the output directly; a split one writes its normalised partial output and log2-sum-exp to the
workspace, and `mla_combine_kernel` merges a sequence's partials.

Output slices (the analogue of sharding the output over programs): with OUT_SPLIT > 1 each program keeps
only DC / OUT_SPLIT output columns and recomputes the scores, so its registers and shared memory hold a
smaller V tile (for small shared-memory budgets).

Masking: token j of sequence b is visible to query token t iff j < seqlen_b - q_len + t + 1 (CAUSAL) or
j < seqlen_b. Rows that see nothing give out = 0 and lse = -inf. Page ids are clamped into [0, num_pages)
before the gather, so a bad block table can never make the kernel read outside the cache (the launch code
checks page ids on the host where it can; see plan.py).
"""
import triton
import triton.language as tl

from ..common.paging import gather_rows
from ..common.softmax import online_softmax

LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def mla_split_kernel(
    QN, QP, CKV, KPE, BT, SEQLENS, WORK, O, LSE, OP, LSEP, KVS,
    stride_qnb, stride_qns, stride_qnh,
    stride_qpb, stride_qps, stride_qph,
    stride_cp, stride_cs, stride_kp, stride_ks, stride_bt,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, q_len, num_pages, sm_scale,
    DC: tl.constexpr, DR: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    OUT_SPLIT: tl.constexpr, CAUSAL: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """Work item w = program_id(1): WORK[w] = (b, start, end, slot), b < 0 for unused capacity, slot < 0 to
    write O [B, Sq, Hq, DC] (and LSE [B, Hq, Sq], natural log) directly, else OP [slots, Sq * Hq, DC] and
    LSEP [slots, Sq * Hq] (log2) float32 at that slot. sm_scale: scale * log2 e. KVS: the cache's float32
    scale (cache values times it are the keys and values; 1 for 16-bit caches): it multiplies the scores'
    scale and the output; an fp8 cache is converted to q's dtype (exactly) for the dots."""
    pid_m = tl.program_id(0)
    w = tl.program_id(1)
    pid_o = tl.program_id(2)
    b = tl.load(WORK + w * 4)
    if b < 0:
        return
    start = tl.load(WORK + w * 4 + 1)
    end = tl.load(WORK + w * 4 + 2)
    slot = tl.load(WORK + w * 4 + 3)
    seqlen = tl.load(SEQLENS + b)
    BLOCK_O: tl.constexpr = DC // OUT_SPLIT
    kv_scale = tl.load(KVS)
    sm_scale = sm_scale * kv_scale

    r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows: r = t * num_heads + h
    row_ok = r < q_len * num_heads
    t = r // num_heads
    h = r % num_heads
    o_c = tl.arange(0, DC)
    o_r = tl.arange(0, DR)
    o_o = pid_o * BLOCK_O + tl.arange(0, BLOCK_O)
    b64 = b.to(tl.int64)
    qn = tl.load(QN + b64 * stride_qnb + t[:, None].to(tl.int64) * stride_qns + h[:, None] * stride_qnh
                 + o_c[None, :], mask=row_ok[:, None], other=0.0)
    qp = tl.load(QP + b64 * stride_qpb + t[:, None].to(tl.int64) * stride_qps + h[:, None] * stride_qph
                 + o_r[None, :], mask=row_ok[:, None], other=0.0)
    # tokens < limit are visible to the row; the item's end bounds it too (a step may run past the end)
    if CAUSAL:
        limit = tl.minimum(seqlen - q_len + t + 1, end)
    else:
        limit = tl.zeros([BLOCK_M], tl.int32) + end

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_O], tl.float32)
    bt_row = BT + b64 * stride_bt
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + tl.arange(0, BLOCK_N)
        tok_ok = tok < end
        page = tl.load(bt_row + tok // PAGE, mask=tok_ok, other=0)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
        slot_in_page = tok % PAGE
        kn = gather_rows(CKV, stride_cp, stride_cs, page, slot_in_page, o_c, tok_ok).to(qn.dtype)  # [BLOCK_N, DC]
        kp = gather_rows(KPE, stride_kp, stride_ks, page, slot_in_page, o_r, tok_ok).to(qn.dtype)  # [BLOCK_N, DR]
        s = tl.dot(qn, tl.trans(kn)) + tl.dot(qp, tl.trans(kp))
        s = tl.where(tok[None, :] < limit[:, None], s, float("-inf"))
        p, alpha, m_i, l_i = online_softmax(s, m_i, l_i, sm_scale)
        if OUT_SPLIT == 1:
            v = kn
        else:
            v = gather_rows(CKV, stride_cp, stride_cs, page, slot_in_page, o_o, tok_ok).to(qn.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)

    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc * (kv_scale / l_safe)[:, None]
    lse2 = tl.where(seen, m_i * sm_scale + tl.log2(l_safe), float("-inf"))  # log2-sum-exp2 of scaled scores
    if slot < 0:
        o_ptr = O + b64 * stride_ob + t[:, None].to(tl.int64) * stride_os + h[:, None] * stride_oh + o_o[None, :]
        tl.store(o_ptr, out.to(O.dtype.element_ty), mask=row_ok[:, None])
        if RETURN_LSE and pid_o == 0:
            tl.store(LSE + b64 * stride_lb + h * stride_lh + t, lse2 * LN2, mask=row_ok)
    else:
        rows = q_len * num_heads
        base = slot.to(tl.int64) * rows
        tl.store(OP + (base + r[:, None]) * DC + o_o[None, :], out, mask=row_ok[:, None])
        if pid_o == 0:
            tl.store(LSEP + base + r, lse2, mask=row_ok)


@triton.jit
def mla_combine_kernel(
    OP, LSEP, SPLITS, O, LSE,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, q_len,
    DC: tl.constexpr, BLOCK_R: tl.constexpr, RETURN_LSE: tl.constexpr,
):
    """Grid (row blocks, B). SPLITS[b] = (first slot, count). count 1: the split kernel wrote the output;
    count 0 (an empty sequence): out = 0, lse = -inf; else merge the count partials of slots first.. by
    their log2-sum-exp."""
    pid_r = tl.program_id(0)
    b = tl.program_id(1)
    first = tl.load(SPLITS + b * 2)
    count = tl.load(SPLITS + b * 2 + 1)
    if count == 1:
        return
    rows = q_len * num_heads
    r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = r < rows
    t = r // num_heads
    h = r % num_heads
    o_c = tl.arange(0, DC)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for i in range(0, count):
        m = tl.maximum(m, tl.load(LSEP + (first + i).to(tl.int64) * rows + r, mask=row_ok, other=float("-inf")))
    m_shift = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros([BLOCK_R, DC], tl.float32)
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    for i in range(0, count):
        base = (first + i).to(tl.int64) * rows
        wgt = tl.exp2(tl.load(LSEP + base + r, mask=row_ok, other=float("-inf")) - m_shift)
        part = tl.load(OP + (base + r[:, None]) * DC + o_c[None, :], mask=row_ok[:, None], other=0.0)
        acc += wgt[:, None] * part
        l_sum += wgt
    seen = l_sum > 0.0
    out = acc / tl.where(seen, l_sum, 1.0)[:, None]
    b64 = b.to(tl.int64)
    tl.store(O + b64 * stride_ob + t[:, None].to(tl.int64) * stride_os + h[:, None] * stride_oh + o_c[None, :],
             out.to(O.dtype.element_ty), mask=row_ok[:, None])
    if RETURN_LSE:
        lse = tl.where(seen, (m_shift + tl.log2(tl.where(seen, l_sum, 1.0))) * LN2, float("-inf"))
        tl.store(LSE + b64 * stride_lb + h * stride_lh + t, lse, mask=row_ok)
