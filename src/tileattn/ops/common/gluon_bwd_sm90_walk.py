"""The Hopper backward's work items and walks (gluon_bwd_sm90.py): which key block and head a program's item is,
and the query blocks each step of it visits, in the same order for every partition (loader, consumers, dQ
writers)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import masking
from .gluon_sm90_loader import flex_lists

_query_range = gluon.jit(masking.query_range.fn)


# ---- a work item's schedule (every partition walks the same steps) ------------------------------------------
# A walk is one query head's. Dense: sched = (m_lo, f_lo, f_hi, m_hi) = query_range(...), rot and desc (work_item),
# the same for every head.
# Flex: the block mask's transposed lists of the CTA's key block, (partial blocks, full blocks, partial list,
# full list) of Q_BLOCK-row query blocks, merged in ascending order (as dense: each key block reaches a query
# block a few steps after the key block above it, so dQ turns rarely wait; the partial list first, then the full
# one, made every turn wait for the whole walk of the key block above under a sliding window: 14x slower), each
# block in Q_BLOCK / BLOCK_M steps. The merge keeps (i_p, i_f, a, f): the next entry of each list and its value
# (NO_BLOCK past the end).
NO_BLOCK = gl.constexpr(2 ** 30)

# The grid's schedule (the kernels' SCHED constexpr; launch_bwd_sm90.grid picks it):
#   PLAIN: one program per work item, dispatched in item order;
#   ROTATED: a persistent, cooperatively launched grid whose programs take items pid, pid + programs, ...; the
#     unmasked range of key block n's walk starts at query block rot(n) and wraps around (every key block sees
#     every query block);
#   PAIRED: a persistent, cooperatively launched grid for square causal problems of whole tiles with an even
#     number K of key blocks: pair n < K / 2 of a head is key block n (walked upwards from its diagonal), then key
#     block K - 1 - n (walked downwards to its diagonal), so that every pair is Q + R steps long (Q query blocks,
#     R = BLOCK_N / BLOCK_M) and the programs of a round end together (the plain grid ends on the heaviest items
#     of its last heads). A program takes pairs pid, pid + programs, ..., two items each.
PLAIN = gl.constexpr(0)
ROTATED = gl.constexpr(1)
PAIRED = gl.constexpr(2)


@gluon.jit
def program_items(num_items, SCHED: gl.constexpr):
    """How many items this program of a persistent grid takes (PAIRED: two per pair)."""
    per: gl.constexpr = 2 if SCHED == PAIRED else 1
    units = num_items // per
    return per * gl.cdiv(units - gl.program_id(0), gl.num_programs(0))


@gluon.jit
def program_item(j, SCHED: gl.constexpr):
    """The j-th item this program of a persistent grid takes: pid, pid + programs, ... (PAIRED: both items of
    pair pid, then both of pair pid + programs, ...)."""
    per: gl.constexpr = 2 if SCHED == PAIRED else 1
    return (gl.program_id(0) + (j // per) * gl.num_programs(0)) * per + j % per


@gluon.jit
def paired_turn(mb, i_n, num_kv_blocks, num_q_blocks, R: gl.constexpr):
    """(turn, last) of key block i_n on query block mb under the PAIRED schedule: the dQ adds to a query block go
    in the order in which the pairs' walks reach it when every step takes the same time and a head's pairs start
    together (a round holds whole heads). Pair n reaches block mb at step mb - R * n with its first key block n
    (upwards from block R * n), and at step 2 * Q - 1 - R * n - mb with key block K - 1 - n (downwards from Q - 1,
    after the Q - R * n steps of the first); ties (R = 1) go to the later key block. Along a program's walk these
    times only grow, and an add waits only for an earlier one: no cycle. Plain Python ints work too (tests)."""
    h2 = num_kv_blocks // 2
    if i_n < h2:
        key = 2 * (mb - R * i_n) + 1
    else:
        key = 2 * (2 * num_q_blocks - 1 - R * (num_kv_blocks - 1 - i_n) - mb)
    # first key blocks (pairs 0 .. h_hi see block mb) that reach it earlier: pairs h_lo ..; second key blocks
    # (pairs l_lo .. h2 - 1 see it) that reach it earlier: pairs l_from .. (the numerators are offset to stay
    # >= 0 where it matters: integer division truncates)
    h_hi = min(mb // R, h2 - 1)
    h_lo = max((2 * mb + 1 - key + 2 * R) // (2 * R), 0)
    l_lo = max(num_kv_blocks - 1 - mb // R, 0)
    l_from = max((4 * num_q_blocks - 2 - 2 * mb - key + 2 * R) // (2 * R), l_lo)
    turn = max(h_hi - h_lo + 1, 0) + max(h2 - l_from, 0)
    return turn, turn == h_hi + max(h2 - l_lo, 0)


@gluon.jit
def work_item(item, wk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr,
              NEEDS_MASK: gl.constexpr, FLEX: gl.constexpr, SCHED: gl.constexpr):
    """(i_b, i_hk, i_n, sched) of work item `item`: items are (batch, kv head)-major with the highest key block
    first, the order in which a plain grid dispatches them and a persistent program takes them. Flex: with a
    head group G > 1 (read at wk[8], where the preprocess wrote it: bwd_kernels.chain_group), G (batch, kv head)
    pairs at a time are interleaved: key block n of each of the G heads, then key block n - 1 of each, ... (so a
    head's consecutive key blocks are dispatched G items apart). Either way a head's higher key blocks come
    first, which the dQ turns' order needs (PLAIN, ROTATED). PAIRED: item 2 p is key block n = p % (K / 2) of pair
    p's head, item 2 p + 1 its key block K - 1 - n. Dense: sched = (query_range(...), rot, desc): rot is where the
    key block's walk of the unmasked range starts (ROTATED, else 0); desc: the walk goes downwards (PAIRED's second
    key blocks)."""
    num_items, num_kv_blocks, num_kv_heads, seqlen_q, seqlen_k, off_diag, left, right, head_group_ptr = wk
    if FLEX:
        head_group = gl.load(head_group_ptr)
        h0 = item // (head_group * num_kv_blocks) * head_group  # the group's first (batch, kv head)
        heads = gl.minimum(head_group, num_items // num_kv_blocks - h0)  # (the last group may be smaller)
        j = item - h0 * num_kv_blocks
        i_bh = h0 + j % heads
        i_n = num_kv_blocks - 1 - j // heads
        sched = (0, 0, 0, 0, 0, 0)  # (per head: _head_walk)
    else:
        desc = 0
        if SCHED == PAIRED:
            h2 = num_kv_blocks // 2
            pair = item // 2
            desc = item % 2
            i_bh = pair // h2
            i_n = pair % h2
            if desc:
                i_n = num_kv_blocks - 1 - i_n
        else:
            i_bh = item // num_kv_blocks
            i_n = num_kv_blocks - 1 - item % num_kv_blocks
        m_lo, f_lo, f_hi, m_hi = _query_range(i_n * BLOCK_N, seqlen_q, seqlen_k, off_diag, left, right, BLOCK_M,
                                              BLOCK_N, HAS_LEFT, HAS_RIGHT, NEEDS_MASK)
        if SCHED == ROTATED:  # key block n starts at query block n * blocks // key blocks (of the unmasked range)
            rot = (i_n * ((f_hi - f_lo) // BLOCK_M)) // num_kv_blocks
        else:
            rot = 0
        sched = (m_lo, f_lo, f_hi, m_hi, rot, desc)
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
    m_lo, f_lo, f_hi, m_hi, rot, desc = sched
    return gl.cdiv(m_hi - f_hi, BLOCK_M), (f_hi - f_lo) // BLOCK_M, gl.cdiv(f_lo - m_lo, BLOCK_M)


@gluon.jit
def walk_m0(t, walk, merge, BLOCK_M: gl.constexpr, FLEX: gl.constexpr, Q_BLOCK: gl.constexpr,
            SCHED: gl.constexpr):
    """First query row of step t (ascending; dense: masked below the unmasked range, unmasked (ROTATED: from block
    rot on, cyclically), masked above; desc (PAIRED): the same blocks in the reverse order)."""
    if FLEX:
        return gl.minimum(merge[2], merge[3]) * Q_BLOCK + (t % (Q_BLOCK // BLOCK_M)) * BLOCK_M
    else:
        m_lo, f_lo, f_hi, m_hi, rot, desc = walk
        n_above, n_full, n_below = step_counts(walk, BLOCK_M)
        if SCHED == PAIRED:
            if desc:
                t = n_above + n_full + n_below - 1 - t
        if t < n_below:
            m0 = m_lo + t * BLOCK_M
        elif t < n_below + n_full:
            if SCHED == ROTATED:
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
