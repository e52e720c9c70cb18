"""Host side of the Hopper forward pipeline (gluon_attn_sm90.py), shared by the dense and flex Gluon backends:
what the pipeline serves, its grid, its scale arguments and its tensor descriptors."""
import torch
import triton

from ... import hw
from .configs import SM90, SM90_FP8, sm90_config, sm90_smem_bytes
from .fp8 import FP8_DTYPES, packed_pitch
from .masking import key_span
from .softmax import LOG2E
from .tma import gluon_desc, gluon_sm90_reason

DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES


def reason(device, dtype, head_dim, head_dim_v, out_dtype):
    """Why the pipeline cannot serve these head dims and dtypes on `device` ("" when it can): a Hopper GPU and
    triton 3.6, D = Dv with a table entry (configs.SM90 / SM90_FP8), the config's shared memory within the
    device's budget (TILEATTN_SMEM_BUDGET may emulate a smaller one)."""
    why = gluon_sm90_reason(device)
    if why:
        return why
    if dtype not in DTYPES:
        return f"dtype {dtype}"
    table = SM90_FP8 if dtype in FP8_DTYPES else SM90
    if head_dim not in table or head_dim_v != head_dim:
        return f"head dims D={head_dim}, Dv={head_dim_v}: the Gluon kernel serves D = Dv in {sorted(table)}"
    cfg = sm90_config(head_dim, dtype)
    need = sm90_smem_bytes(cfg, head_dim, head_dim_v, dtype.itemsize, out_dtype.itemsize)
    budget = hw.device_info(device).smem_per_block
    if need > budget:
        return f"its config needs {need} bytes of shared memory, the budget is {budget}"
    return ""


def persistent(cfg, seqlen_q):
    """Whether the grid is persistent for sequences of seqlen_q query rows (cfg.persistent, cfg.one_cta_from)."""
    return cfg.persistent and not (cfg.one_cta_from and seqlen_q >= cfg.one_cta_from)


def grid(cfg, seqlen_q, num_bh, device):
    """(programs,): one per SM (persistent) or one per tile of consumers * block_m query rows, at most
    cfg.max_programs."""
    tiles = triton.cdiv(seqlen_q, cfg.consumers * cfg.block_m) * num_bh
    n = min(tiles, hw.device_info(device).num_sms) if persistent(cfg, seqlen_q) else tiles
    if cfg.max_programs:
        n = min(n, cfg.max_programs)
    return (max(1, n),)


# heads per window of the longest-first order (tile_order tries each): a window's tiles are dealt out before the
# next window's, so the CTAs of a round read few heads' K/V. A cost model of causal problems (B*H = 128 on 132
# CTAs, docs/design/dense.md) gives the snake 97% of an even split at any N, windows of 8-17 heads 99-100% from N =
# 4K; at 1K-2K no window size is reliably better than the snake (too few tiles per CTA to even out window by window)
LPT_HEADS = (8, 16, 32, 64)
# rounds of the persistent grid past which tile_order keeps the snake without trying: the orders are built on the
# host when a plan is made (0.17 s at 65,536 tiles, 0.02 s at 8,192), and with many rounds the snake's imbalance
# is a small part of the whole (the measured gains, dense.md lever 5, are at 8-62 rounds)
LPT_MAX_ROUNDS = 64


def _makespan(costs, num_m, table):
    """The most work any CTA gets from an order table (tile_order's)."""
    return max(sum(costs[t % num_m] for t in col if t >= 0) for col in table.T)


def _snake_table(num_m, num_bh, programs):
    """tile_of's snake order (REVERSE_M) as a table."""
    import numpy as np
    tiles = num_m * num_bh
    rounds = -(-tiles // programs)
    table = np.full((rounds, programs), -1, dtype=np.int32)
    for r in range(rounds):
        for p in range(programs):
            t = r * programs + p + (r % 2) * (programs - 1 - 2 * p)
            if t < tiles:
                table[r, p] = t - t % num_m + num_m - 1 - t % num_m
    return table


def _lpt_table(costs, num_m, num_bh, programs, heads):
    """Window by window of `heads` (batch, head) pairs, each tile, heaviest first, to the CTA with the least work."""
    import heapq

    import numpy as np
    loads = [(0.0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for w0 in range(0, num_bh, heads):
        window = sorted(((costs[i], bh * num_m + i) for bh in range(w0, min(w0 + heads, num_bh))
                         for i in range(num_m)), key=lambda x: -x[0])
        for c, t in window:
            load, p = heapq.heappop(loads)
            lists[p].append(t)
            heapq.heappush(loads, (load + c, p))
    table = np.full((max(len(x) for x in lists), programs), -1, dtype=np.int32)
    for p, x in enumerate(lists):
        table[:len(x), p] = x
    return table


def tile_order(costs, num_m, num_bh, programs):
    """The persistent grid's tiles (t = batch * head * num_m + query block) for the kernel's ORDERED mode: of the
    longest-first orders by windows of LPT_HEADS heads, the one whose busiest CTA gets the least work on the cost
    model (costs[i_m]: query block i_m's work, the same for every head), or None where the snake (tile_of) is as
    good or the rounds exceed LPT_MAX_ROUNDS. Returns an int32 numpy table [rounds, programs], round r of CTA p in
    row r, -1 where p has no tile left."""
    if num_m * num_bh > LPT_MAX_ROUNDS * programs:
        return None
    best = _snake_table(num_m, num_bh, programs)
    best_span, snake = _makespan(costs, num_m, best), True
    for heads in LPT_HEADS:
        table = _lpt_table(costs, num_m, num_bh, programs, heads)
        span = _makespan(costs, num_m, table)
        if span < best_span * (1 - 1e-9):
            best, best_span, snake = table, span, False
    return None if snake else best


def block_costs(seqlen_q, seqlen_k, off_diag, left, right, rows, block_n, overhead=0.5):
    """Each query block's work in key blocks (its tiles' key range, as the kernel walks it) plus a fixed per-tile
    overhead (Q, epilogue)."""
    out = []
    for m0 in range(0, seqlen_q, rows):
        lo, hi = key_span(m0, min(m0 + rows, seqlen_q), seqlen_k, off_diag, left, right)
        out.append((hi - lo // block_n * block_n) / block_n + overhead)  # (the walk starts on a block boundary)
    return out


def scales(scale, softcap):
    """(sm_scale, softcap_scale, softcap_out) of the kernel: the scale times log2 e goes inside exp2, or the
    softcap maps raw scores to log2 units and exp2 takes them as they are."""
    if softcap > 0:
        return 1.0, scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0, 1.0


def packed_v_buffer(v):
    """The [B, Hkv, Dv, Sk'] packed buffer under an fp8 v (the [B, Sk, Hkv, Dv] view of an fp8.Fp8V) that its
    descriptor covers."""
    vt = v.permute(0, 2, 3, 1)
    return vt.as_strided(vt.shape[:3] + (packed_pitch(v),), vt.stride())


def descriptors(q, k, v, out, cfg):
    """(q, k, v, o) descriptors of [B, S, H, D] tensors for the pipeline. An fp8 v is the view of an fp8.Fp8V:
    its descriptor is over the whole [B, Hkv, Dv, Sk'] packed buffer (sequence-major)."""
    d, dv = q.shape[-1], v.shape[-1]
    if v.dtype in FP8_DTYPES:
        v_desc = gluon_desc(packed_v_buffer(v), [1, 1, dv, cfg.block_n])
    else:
        v_desc = gluon_desc(v, [1, cfg.block_n, 1, dv])
    return (gluon_desc(q, [1, cfg.block_m, 1, d]), gluon_desc(k, [1, cfg.block_n, 1, d]), v_desc,
            gluon_desc(out, [1, cfg.block_m, 1, dv]))
