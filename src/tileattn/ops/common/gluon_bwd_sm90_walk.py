"""The Hopper backward's work items and walks (gluon_bwd_sm90.py): which key block and head a program's item is,
and the query blocks each step of it visits, in the same order for every partition (loader, consumers, dQ
writers)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import masking
from .gluon_sm90_loader import flex_lists

_query_range = gluon.jit(masking.query_range.fn)


# ---- a work item's schedule (every partition walks the same steps) ------------------------------------------
# A walk is one query head's. Dense: sched = (m_lo, f_lo, f_hi, m_hi) = query_range(...) and rot (work_item), the
# same for every head.
# Flex: the block mask's transposed lists of the CTA's key block, (partial blocks, full blocks, partial list,
# full list) of Q_BLOCK-row query blocks, merged in ascending order (as dense: each key block reaches a query
# block a few steps after the key block above it, so dQ turns rarely wait; the partial list first, then the full
# one, made every turn wait for the whole walk of the key block above under a sliding window: 14x slower), each
# block in Q_BLOCK / BLOCK_M steps. The merge keeps (i_p, i_f, a, f): the next entry of each list and its value
# (NO_BLOCK past the end).
NO_BLOCK = gl.constexpr(2 ** 30)


@gluon.jit
def work_item(item, wk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
              NEEDS_MASK: gl.constexpr, FLEX: gl.constexpr, ROTATE: gl.constexpr):
    """(i_b, i_hk, i_n, sched) of work item `item`: items are (batch, kv head)-major with the highest key block
    first, the order in which a plain grid dispatches them and a persistent program takes them. Flex: with a
    head group G > 1 (read at wk[8], where the preprocess wrote it: bwd_kernels.chain_group), G (batch, kv head)
    pairs at a time are interleaved: key block n of each of the G heads, then key block n - 1 of each, ... (so a
    head's consecutive key blocks are dispatched G items apart). Either way a head's higher key blocks come
    first, which the dQ turns' order needs. Dense: sched = (query_range(...), rot): rot is where the key block's
    walk of the unmasked range starts (ROTATE, else 0)."""
    num_items, num_kv_blocks, num_kv_heads, seqlen_q, seqlen_k, off_diag, left, right, head_group_ptr = wk
    if FLEX:
        head_group = gl.load(head_group_ptr)
        h0 = item // (head_group * num_kv_blocks) * head_group  # the group's first (batch, kv head)
        heads = gl.minimum(head_group, num_items // num_kv_blocks - h0)  # (the last group may be smaller)
        j = item - h0 * num_kv_blocks
        i_bh = h0 + j % heads
        i_n = num_kv_blocks - 1 - j // heads
        sched = (0, 0, 0, 0, 0)  # (per head: _head_walk)
    else:
        i_bh = item // num_kv_blocks
        i_n = num_kv_blocks - 1 - item % num_kv_blocks
        m_lo, f_lo, f_hi, m_hi = _query_range(i_n * BLOCK_N, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M,
                                              BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK)
        if ROTATE:  # key block n starts at query block n * blocks // key blocks (blocks of the unmasked range)
            rot = (i_n * ((f_hi - f_lo) // BLOCK_M)) // num_kv_blocks
        else:
            rot = 0
        sched = (m_lo, f_lo, f_hi, m_hi, rot)
    return i_bh // num_kv_heads, i_bh % num_kv_heads, i_n, sched


@gluon.jit
def head_walk(sched, fx, i_b, i_h, i_n, BLOCK_M: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr):
    """(steps, walk, merge state) of query head i_h."""
    if FLEX:
        walk = flex_lists(fx, i_b, i_h, i_n)
        n_part, n_full, part, full = walk
        return (n_part + n_full) * (Q_BLOCK // BLOCK_M), walk, (0, 0, _list_entry(part, 0, n_part),
                                                                _list_entry(full, 0, n_full))
    else:
        n_above, n_full, n_below = step_counts(sched, BLOCK_M)
        return n_above + n_full + n_below, sched, (0, 0, 0, 0)


@gluon.jit
def _list_entry(lst, i, n):
    """Entry i of a block list of n entries, NO_BLOCK for i >= n (never reading past the tensor)."""
    return gl.where(i < n, gl.load(lst + gl.maximum(gl.minimum(i, n - 1), 0)), NO_BLOCK)


@gluon.jit
def _flex_next(t, merge, walk, BLOCK_M: gl.constexpr, Q_BLOCK: gl.constexpr):
    """The merge state after step t (the next block's entries are loaded a step ahead of their use)."""
    i_p, i_f, a, f = merge
    n_part, n_full, part, full = walk
    done = (t % (Q_BLOCK // BLOCK_M)) == (Q_BLOCK // BLOCK_M) - 1
    i_p = i_p + (done & (a < f)).to(gl.int32)
    i_f = i_f + (done & (a > f)).to(gl.int32)
    return i_p, i_f, _list_entry(part, i_p, n_part), _list_entry(full, i_f, n_full)


@gluon.jit
def step_counts(sched, BLOCK_M: gl.constexpr):
    """Dense: (masked steps above the unmasked range, unmasked steps, masked steps below)."""
    m_lo, f_lo, f_hi, m_hi, rot = sched
    return gl.cdiv(m_hi - f_hi, BLOCK_M), (f_hi - f_lo) // BLOCK_M, gl.cdiv(f_lo - m_lo, BLOCK_M)


@gluon.jit
def walk_m0(t, walk, merge, BLOCK_M: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr,
            ROTATE: gl.constexpr):
    """First query row of step t (ascending; dense: masked below the unmasked range, unmasked (ROTATE: from block
    rot on, cyclically), masked above)."""
    if FLEX:
        return gl.minimum(merge[2], merge[3]) * Q_BLOCK + (t % (Q_BLOCK // BLOCK_M)) * BLOCK_M
    else:
        m_lo, f_lo, f_hi, m_hi, rot = walk
        n_above, n_full, n_below = step_counts(walk, BLOCK_M)
        if t < n_below:
            m0 = m_lo + t * BLOCK_M
        elif t < n_below + n_full:
            if ROTATE:
                m0 = f_lo + ((t - n_below + rot) % n_full) * BLOCK_M
            else:
                m0 = f_lo + (t - n_below) * BLOCK_M
        else:
            m0 = f_hi + (t - n_below - n_full) * BLOCK_M
        return m0


@gluon.jit
def walk_next(t, walk, merge, BLOCK_M: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr):
    if FLEX:
        return _flex_next(t, merge, walk, BLOCK_M, Q_BLOCK)
    else:
        return merge
