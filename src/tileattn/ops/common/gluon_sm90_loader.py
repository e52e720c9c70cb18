"""The loader side of the Hopper forward pipeline (gluon_attn_sm90.py): which tile a CTA takes in each round of
the persistent grid, which key blocks a tile reads (dense: the masking model's range; flex: the block mask's
lists), and the loader partition that streams Q and K/V tiles into shared memory with TMA. The consumers use the
same tile and block functions, so both sides agree on every count."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import masking
from .gluon_compat import tma_load

_key_range = gluon.jit(masking.key_range.fn)
FLEX_TAIL = gl.constexpr(masking.FLEX_TAIL)


@gluon.jit
def rounds(num_tiles, order, ORDERED: gl.constexpr):
    """Rounds of this CTA's tile loop: cdiv(num_tiles, programs), or with ORDERED the order table's (order =
    (table, rounds): tile_of)."""
    if ORDERED:
        return order[1]
    else:
        return gl.cdiv(num_tiles, gl.num_programs(0))


@gluon.jit
def tile_of(r, num_m, num_tiles, REVERSE_M: gl.constexpr, order, ORDERED: gl.constexpr):
    """Tile of this CTA in round r of the persistent grid, as (valid, query block, batch * head).

    ORDERED: read from order[0], an int32 table [rounds, programs] of tiles t = batch * head * num_m + query
    block, -1 where a CTA has no tile that round (launch_sm90.tile_order: longest first within windows of heads).

    Rounds deal tiles out in a snake (CTA p takes r * nprog + p in even rounds, r * nprog + nprog - 1 - p in
    odd ones), so that with tiles in decreasing cost (REVERSE_M: the heaviest causal query blocks of a head
    first) a CTA that got a heavy tile in one round gets a light one in the next. Heads are the slow index:
    the CTAs of a round read few heads' K/V, which stay in L2 (on the H100, spreading a round over more heads
    lost 10-40% at N = 1K-16K, docs/design/dense.md, 2026-11-21)."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if ORDERED:
        t = gl.load(order[0] + r * nprog + pid)
        return t >= 0, t % num_m, t // num_m
    else:
        t = r * nprog + pid + (r % 2) * (nprog - 1 - 2 * pid)
        i_m = t % num_m
        if REVERSE_M:
            i_m = num_m - 1 - i_m
        return t < num_tiles, i_m, t // num_m


@gluon.jit
def _tile_keys(i_m, seqlen_q, seqlen_k, off_diag, left, right, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
               HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr):
    """(first query row, first key, key blocks) of a tile: loader and consumers must agree on the count."""
    m0 = i_m * ROWS
    m_last = gl.minimum(m0 + ROWS, seqlen_q) - 1
    lo, hi, _, _ = _key_range(m0, m_last, seqlen_k, off_diag, left, right, BLOCK_N, HAS_LEFT, HAS_RIGHT)
    return m0, lo, gl.cdiv(gl.maximum(hi - lo, 0), BLOCK_N)


@gluon.jit
def flex_lists(fx, i_b, i_h, i_m):
    """Flex: (partial blocks, full blocks, partial list, full list) of block i_m of (i_b, i_h), from the block
    mask's tensors in fx (see flex_fwd_sm90_kernel): a query block's key blocks in the forward lists, a key
    block's query blocks in the transposed ones (the backward's)."""
    n_part = gl.load(fx[0] + i_b * fx[4] + i_h * fx[5] + i_m * fx[6])
    part = fx[1] + i_b * fx[7] + i_h * fx[8] + i_m * fx[9]
    n_full = gl.load(fx[2] + i_b * fx[10] + i_h * fx[11] + i_m * fx[12])
    full = fx[3] + i_b * fx[13] + i_h * fx[14] + i_m * fx[15]
    return n_part, n_full, part, full


@gluon.jit
def tile_blocks(fx, i_b, i_h, i_m, seqlen_q, seqlen_k, off_diag, left, right, ROWS: gl.constexpr,
                 BLOCK_N: gl.constexpr, HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, FLEX: gl.constexpr,
                 WARPS: gl.constexpr):
    """(first query row, first key, key blocks, partial blocks, tail) of a tile, tail = (partial blocks, partial
    list, full list, ragged position, ragged first) for block_start. Dense: the window model's key range (lists
    unused); flex: the block mask's partial blocks, then its full ones. FLEX_TAIL (Sk not a multiple of BLOCK_N):
    a full list that holds the last, ragged key block has it taken out and walked first, so that it is masked
    (block 0 always is) and the full blocks' steps need no bound; WARPS: the calling partition's warps."""
    if FLEX:
        n_part, n_full, part, full = flex_lists(fx, i_b, i_h, i_m)
        if FLEX == FLEX_TAIL:
            rag = _position(full, n_full, gl.cdiv(seqlen_k, BLOCK_N) - 1, WARPS)
        else:
            rag = n_full
        return i_m * ROWS, 0, n_part + n_full, n_part, (n_part, part, full, rag, rag < n_full)
    else:
        m0, n_lo, n_blocks = _tile_keys(i_m, seqlen_q, seqlen_k, off_diag, left, right, ROWS, BLOCK_N, HAS_LEFT,
                                        HAS_RIGHT)
        return m0, n_lo, n_blocks, 0, (0, fx[1], fx[3], 0, False)


@gluon.jit
def _position(lst, n, value, WARPS: gl.constexpr):
    """Position of `value` in a block list of n entries (n if absent), read 32 * WARPS entries at a time."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    pos = n
    for c in range(0, n, 32 * WARPS):
        offs = c + gl.arange(0, 32 * WARPS, layout=layout)
        e = gl.load(lst + offs, mask=offs < n, other=-1)
        pos = gl.minimum(pos, gl.min(gl.where(e == value, offs, n), 0))
    return pos


@gluon.jit
def block_start(it, n_lo, lst, base, tail, BLOCK_N: gl.constexpr, FLEX: gl.constexpr):
    """First key of the tile's block `it`: n_lo + it * BLOCK_N, or (flex) entry it - base of a block list, or
    (FLEX_TAIL) block `it` of the order tile_blocks describes, from its tail: selects, no branch (it is used
    in the consumers' pipelined loops)."""
    if FLEX == FLEX_TAIL:
        n_part, part, full, rag, ragged_first = tail
        j = it - ragged_first.to(gl.int32)
        f = j - n_part
        f = f + (f >= rag).to(gl.int32)  # (the ragged entry skipped)
        first = ragged_first & (it == 0)
        f = gl.where(first, rag, f)
        in_part = (j >= 0) & (j < n_part) & (~first)
        return gl.load(gl.where(in_part, part + j, full + f)) * BLOCK_N
    elif FLEX:
        return gl.load(lst + it - base) * BLOCK_N
    else:
        return n_lo + it * BLOCK_N


@gluon.jit
def loader(args, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
           HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, REVERSE_M: gl.constexpr, V_SEQ_MAJOR: gl.constexpr,
           FLEX: gl.constexpr, ORDERED: gl.constexpr, EPILOGUE: gl.constexpr):
    """The forward pipeline's loader partition; args: its run-time arguments (attn_fwd_pipeline's l_args);
    EPILOGUE: the consumers' (it sets the order of a tile's first loads, _load_tile)."""
    (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, num_tiles, num_m,
     num_heads, group_size, seqlen_q, seqlen_k, off_diag, left, right, fx, order) = args
    kv = 0  # K/V tiles loaded so far by this CTA: ring slot and phase
    j = 0  # tiles started so far: Q slot and phase
    for r in range(rounds(num_tiles, order, ORDERED)):
        valid, i_m, i_bh = tile_of(r, num_m, num_tiles, REVERSE_M, order, ORDERED)
        if valid:
            j, kv = _load_tile(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready,
                               kv_empty, j, kv, i_m, i_bh, num_heads, group_size, seqlen_q, seqlen_k, off_diag,
                               left, right, fx, BLOCK_M, STAGES, NUM_CONSUMERS, HAS_LEFT, HAS_RIGHT, V_SEQ_MAJOR,
                               FLEX, EPILOGUE)


@gluon.jit
def _load_tile(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty,
               j, kv, i_m, i_bh, num_heads, group_size, seqlen_q, seqlen_k, off_diag, left, right, fx,
               BLOCK_M: gl.constexpr, STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
               HAS_LEFT: gl.constexpr, HAS_RIGHT: gl.constexpr, V_SEQ_MAJOR: gl.constexpr, FLEX: gl.constexpr,
               EPILOGUE: gl.constexpr):
    """The loads of one tile: Q into slot j % Q_SLOTS and its K/V blocks into the ring from position kv.

    With two Q slots Q goes first (its slot was freed a tile ago). With one, the slot frees only when the
    previous tile's O is stored: the first STAGES K/V blocks go before it (their buffers are freed by the
    previous tile's consumers, which need nothing more from the loader), so the ring is full when Q lands.
    EPILOGUE "kstage" with one slot: the previous tile hands its stages back in ring order, but the last one
    only after its O (staged in that stage's K buffer) is stored, and the Q slot between the two (after its last
    q.k, before its last p.v): the first STAGES - 1 blocks go before Q, the next (into that last stage) after it.
    The ring order itself never changes: the loader waits each position's `empty` in turn."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    i_b = i_bh // num_heads
    i_h = i_bh % num_heads
    i_hk = i_h // group_size
    m0, n_lo, n_blocks, n_part, tail = tile_blocks(fx, i_b, i_h, i_m, seqlen_q, seqlen_k, off_diag, left, right,
                                                    NUM_CONSUMERS * BLOCK_M, BLOCK_N, HAS_LEFT, HAS_RIGHT, FLEX, 1)
    if EPILOGUE == "kstage":  # a tile without keys takes one block all the same: its O is staged in that stage
        n_blocks = gl.maximum(n_blocks, 1)  # (gluon_sm90_consumer._consume_tile)
    Q_SLOTS: gl.constexpr = q_ready.shape[0]
    if Q_SLOTS == 1 and EPILOGUE == "kstage":
        first = gl.minimum(n_blocks, STAGES - 1)
    elif Q_SLOTS == 1:
        first = gl.minimum(n_blocks, STAGES)
    else:
        first = 0
    _load_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv, 0, first, n_lo, n_part, tail, i_b,
             i_hk, STAGES, V_SEQ_MAJOR, FLEX)
    slot = j % Q_SLOTS
    # slots and buffers start free: the first wait on an `empty` barrier passes (parity 1 of a fresh one)
    mbarrier.wait(q_empty.index(slot), ((j // Q_SLOTS) & 1) ^ 1)
    mbarrier.expect(q_ready.index(slot), NUM_CONSUMERS * q_desc.block_type.nbytes)
    for c in gl.static_range(NUM_CONSUMERS):
        tma_load(q_desc, [i_b, m0 + c * BLOCK_M, i_h, 0], q_ready.index(slot),
                                        q_bufs.index(slot * NUM_CONSUMERS + c))
    _load_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv, first, n_blocks, n_lo, n_part, tail,
             i_b, i_hk, STAGES, V_SEQ_MAJOR, FLEX)
    return j + 1, kv + n_blocks


@gluon.jit
def _load_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, kv_empty, kv, it_lo, it_hi, n_lo, n_part, tail,
             i_b, i_hk, STAGES: gl.constexpr, V_SEQ_MAJOR: gl.constexpr, FLEX: gl.constexpr):
    """K/V blocks it_lo..it_hi - 1 of a tile (keys from n_lo; flex: the partial then the full list) into ring
    positions kv + it."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[1]
    for it in range(it_lo, it_hi):
        s = (kv + it) % STAGES
        phase = ((kv + it) // STAGES) & 1
        if it < n_part:
            n0 = block_start(it, n_lo, tail[1], 0, tail, BLOCK_N, FLEX)
        else:
            n0 = block_start(it, n_lo, tail[2], n_part, tail, BLOCK_N, FLEX)
        mbarrier.wait(kv_empty.index(s), phase ^ 1)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma_load(k_desc, [i_b, n0, i_hk, 0], k_ready.index(s), k_bufs.index(s))
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        if V_SEQ_MAJOR:
            tma_load(v_desc, [i_b, i_hk, 0, n0], v_ready.index(s), v_bufs.index(s))
        else:
            tma_load(v_desc, [i_b, n0, i_hk, 0], v_ready.index(s), v_bufs.index(s))
