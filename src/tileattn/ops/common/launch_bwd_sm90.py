"""Host side of the Hopper backward pipeline (gluon_bwd_sm90.py), shared by the dense and flex backward: its
tiles and config table, what it serves, and the dQ sums and conversion around the kernel."""
from typing import NamedTuple

import torch
import triton

from ... import hw, knobs
from .bwd_kernels import bwd_dq_convert_kernel
from .tma import gluon_sm90_reason, tma_ok

BLOCK_N = 128  # keys per CTA: 64 per consumer warpgroup


class Config(NamedTuple):
    """One head dim's config: Q / dO stages, dQ staging buffers, registers per consumer thread and per loader /
    writer thread, rows a writer moves per chunk, TMA reduce-adds for dQ (else vector atomics), and query rows
    per step (block_m: 64, or 128 where each warpgroup then computes dQ for 64 of the rows over the whole head
    dim instead of all rows over half of it), and `persistent`: problems where every key block sees every query
    block (rotated walks) or square causal ones (paired walks) take a persistent, cooperatively launched grid
    (grid() says when), the others keep one program per work item."""
    stages: int
    dq_bufs: int
    consumer_regs: int
    worker_regs: int
    writer_rows: int
    tma_dq: bool
    block_m: int = 64
    persistent: bool = False


# Shared memory at D=128: 226 KB of the H100's 227. Chosen on the H100 (2026-11-24, `scripts/sweep.py bwd
# --sm90-cfgs ...` and `gpu_check.sh ab-bwd`, docs/design/backward.md): at D=128 232 / 40 registers beat 240 / 24
# (N=16K non-causal 489 vs 422 TFLOPS, 4K 411 vs 392: the dQ writers are the bottleneck and 24 registers spill
# their loop state; the consumers do not spill at 232); at D=64, 4 dQ buffers, 3 stages or 8-row chunks were
# within 2%. TMA reduce-adds against vector atomics: D=128 +3-9% on every row (N 2K-16K, causal and not; triton
# 3.9, 2026-11-24), and on triton 3.6 with the rotated walks +2-9% (2026-11-25, `gpu_check.sh ab-bwd`, N 1K-16K:
# non-causal 16K 480 -> 521, causal 16K 411 -> 426); D=64 -9-10% at N 2K-4K non-causal and even elsewhere (3.9),
# so D=128 only. D=64 takes 128-row steps (2026-11-24, `sweep.py bwd --dims 64 --sm90-cfgs 64:2,2,240,40,4,0,64`,
# two runs in either order): causal +3-6% at N 2K-8K, non-causal within +-2% at N 2K-8K; the 16K rows swung
# +-15% between repeats of the same config. (D=128 cannot: S^T, dP^T, dK and dV would need 256 accumulator
# registers.) Since the TMA reduce-adds the D=128 writers hold little state, and 240 / 24 beat 232 / 40 (2026-11-28,
# `gpu_check.sh ab-bwd` twice, 232 / 40 and 240 / 24 alternated, fp16 B=4 H=32, TFLOPS: non-causal 2K 465 / 466 ->
# 469 / 488, 16K 546 / 546 -> 553 / 554, 8K 527 / 527 -> 531 / 516; causal 1K 257 / 259 -> 264 / 263, 8K 470 / 460 ->
# 476 / 481, 16K 432 / 443 -> 467 / 471; triton 3.6 SASS at N=1K (rotated, paired walks): spill stores 36 -> 64 bytes,
# 416 -> 432; the causal step loops lose descriptor reloads from local memory in their wgmma issue:
# docs/design/backward.md, seventeenth round).
CONFIGS = {64: Config(2, 2, 240, 40, 4, False, 128, True), 128: Config(2, 2, 240, 24, 2, True, 64, True)}
# Problems with no masked step (dense: no causal or window rule, whole tiles; they take the rotated walks up to 8K),
# where they differ (the same block_m and persistence: the workspace and the grid do not know the mask). D=64 with
# TMA reduce-adds and 24 writer registers: on an H200 (2026-11-28, triton 3.6, `sweep.py bwd --dims 64 --sm90-cfgs
# 64:2,2,240,24,4,1,128,1`, fp16 B=4 H=32, TFLOPS, the table's config first): non-causal 1K 352 -> 359 (twice), 2K 394
# -> 417, 4K 402 -> 421, 16K 438 -> 458; but causal 1K 232 -> 225 / 226, 2K 331 -> 328, 4K 383 -> 385, 16K 443 -> 453,
# so masked problems (and flex) keep CONFIGS. Confirmed by `gpu_check.sh ab-bwd` (the tree before, then this one;
# three runs): 1K 352 -> 359, 2K 411 -> 428, 4K 419 -> 439, 8K 426 / 430 / 430 -> 437 / 436 / 437, 16K 452 / 456 / 456
# -> 424 / 459 / 461 (16K swings, as it did on the H100). (On triton 3.9 in 2026-11-24 the reduce-adds had lost 9-10%
# at non-causal 2K-4K, with the 40-register writers and before the rotated walks.)
UNMASKED_CONFIGS = {64: Config(2, 2, 240, 24, 4, True, 128, True)}
# the default takes problems whose sequences both have at least this many tokens (flex; dense passes its own,
# ops/dense/launch_bwd_sm90.py): below, the Triton kernels measured faster or as fast (H100, B=4, H=32, fp16,
# dense before the rotated walks: at N=1K causal 187-215 vs 132-157 TFLOPS at D=128, 80-90 vs 47-136 at D=64: a
# few steps per program and the dQ turn chain; at N=2K the Hopper kernel is ahead by 2-16% except D=64 causal, 5%
# behind; at N >= 4K it is ahead on every row, by 4-46%)
MIN_SEQLEN = 2048


def reason(device, dtype, head_dim, head_dim_v, tensors, counts, seqlen, min_seqlen=MIN_SEQLEN):
    """Why the pipeline does not take a problem ("" when it does): TILEATTN_SM90_BWD, a Hopper GPU with a
    Gluon-verified triton, fp16 / bf16, D = Dv in CONFIGS, q, k, v, dO (`tensors`, seen as [B, S, H, D]) fit
    for tensor descriptors, `counts` = (rows of dQ sums: B * Hq * padded Sq, work items: key blocks * B * Hkv, the
    grid's one dimension) both below 2^31, and by default the shorter sequence (`seqlen`) at least min_seqlen."""
    mode = knobs.sm90_bwd()
    if mode == "off":
        return "TILEATTN_SM90_BWD=0"
    why = gluon_sm90_reason(device)
    if why:
        return why
    if dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {dtype}"
    if head_dim != head_dim_v or head_dim not in CONFIGS:
        return f"head dims D={head_dim}, Dv={head_dim_v}: it serves D = Dv in {sorted(CONFIGS)}"
    if not all(tma_ok(t) for t in tensors):
        return "q, k, v or the output gradient is not aligned for tensor descriptors"
    rows, items = counts
    if rows >= 2 ** 31:
        return "2^31 or more rows of dQ sums (int32 coordinates)"
    if items >= 2 ** 31:
        return "2^31 or more work items (key blocks x batch x kv heads: the grid's limit)"
    if mode == "auto" and seqlen < min_seqlen:
        return f"a sequence shorter than {min_seqlen}: the Triton kernels measured faster there"
    return ""


def config(d, masked=True):
    """Head dim d's Config (checked): CONFIGS[d], or for a problem with no masked step (masked=False)
    UNMASKED_CONFIGS[d] where there is one."""
    cfg = Config(*CONFIGS[d])
    if cfg.block_m not in (64, 128):  # the kernel splits a step's dQ between its two warpgroups by columns or rows
        raise ValueError(f"launch_bwd_sm90.CONFIGS[{d}].block_m = {cfg.block_m}: the kernel takes 64 or 128")
    if not masked and d in UNMASKED_CONFIGS:
        alt = Config(*UNMASKED_CONFIGS[d])
        if (alt.block_m, alt.persistent) != (cfg.block_m, cfg.persistent):
            raise ValueError(f"launch_bwd_sm90.UNMASKED_CONFIGS[{d}]: block_m and persistent must be CONFIGS[{d}]'s "
                             "(the workspace and the grid are sized without the mask)")
        cfg = alt
    return cfg


def block_m(d):
    """Query rows per step of the pipeline at head dim d (the dQ sums are padded to a multiple of it)."""
    return config(d).block_m


def dq_half(d):
    """[rows, columns] of the dQ half tile a consumer warpgroup stages per step (the TMA reduce-add's box)."""
    bm = block_m(d)
    return [bm // 2, d] if bm >= 128 else [bm, d // 2]


def meta(d, masked=True):
    """The kernel's config keywords for head dim d (masked=False: a problem with no masked step, config())."""
    c = config(d, masked)
    return dict(STAGES=c.stages, DQ_BUFS=c.dq_bufs, CONSUMER_REGS=c.consumer_regs, WORKER_REGS=c.worker_regs,
                WRITER_ROWS=c.writer_rows, TMA_DQ=c.tma_dq, num_warps=4)


# rotated walks up to this many key blocks (N = 8K at BLOCK_N = 128); longer problems keep one program per item.
# Measured on the H100 (fp16, B=4, H=32, non-causal, `gpu_check.sh ab-bwd`, same run): at N=16K the plain grid
# beat the rotated one in both runs taken (2026-11-24: D=128 516 vs 492 TFLOPS, D=64 404 vs 394; 2026-11-25, TMA
# reduce-adds at D=128: 550 vs 533, D=64 471 vs 389): the chain's idle time is a small share of a long program's
# life and the persistent grid leaves 4 of 132 SMs idle. At N <= 4K rotation measured +9-23%; at N=8K the plain grid
# lost (2026-11-28, same run, the rotated tree twice around it: D=128 522 / 519 -> 502, D=64 434 / 436 -> 411).
ROTATE_MAX_KV_BLOCKS = 64

# the kernel's SCHED (gluon_bwd_sm90_walk.py's constexprs of the same names; test_sm90_backward_sched_values):
# one program per item, rotated walks, paired walks
PLAIN, ROTATED, PAIRED = 0, 1, 2

# paired walks (square causal problems of whole tiles, MHA) up to this many key blocks, per head dim (absent: never);
# longer problems keep one program per item. Measured on the H100 (2026-11-28, fp16 B=4 H=32 causal, TFLOPS, the
# plain grid's tree and the paired one alternated twice in one run, docs/design/backward.md thirteenth round):
# D=128 1K 258 / 255 -> 264 / 259, 2K 367 / 359 -> 379 / 379, 4K 431 / 424 -> 437 / 426, 8K 463 / 473 -> 462 / 456;
# D=64 (one query block per key block, so a pair's adds meet the next pair's one step later) slower on every row:
# 1K 207 / 205 -> 195 / 191, 2K 307 / 304 -> 296 / 292, 4K 384 / 381 -> 351 / 351, 8K 429 / 413 -> 382 / 382.
PAIRED_MAX_KV_BLOCKS = {128: 32}


# The flex backward's work items interleave this many (batch, kv head) pairs where its block mask's walks start in
# ties (bwd_kernels.chain_group, decided on the GPU by the preprocess; gluon_bwd_sm90_walk.work_item): key block n of
# each, then n - 1 of each, ..., so that a head's consecutive key blocks start this many dispatches apart. Where the
# key blocks of a head start their walks at the same query block (a document mask's), they would otherwise start
# together, and each dQ add to that block waits for the one of the key block above: the lowest key block waits for
# the whole chain. More heads in flight cost L2 hits, though. Measured on the H100 (2026-11-25, `scripts/sweep.py
# bwd-order` on c721a1c, where every mask and dense took the group given; backward ms for 1 / 2 / 4 / 8 heads,
# gradients bit-identical): flex N=8192 B=4 H=16 D=128 documents 4.24 / 4.07 / 3.79 / 3.70, causal 5.77 / 5.86 /
# 5.91 / 7.89, ALiBi 6.34 / 6.38 / 6.58 / 8.45, softcap 7.98 / 7.99 / 8.21 / 9.48, prefix-LM 5.96 / 5.83 / 5.98 /
# 7.89, sliding window even up to 4; dense fp16 B=4 H=32: D=128 causal 8K 11.85 / 11.70 / 12.03 / 16.36,
# non-causal 16K 79.8 / 80.6 / 82.2 / 116.2, D=64 causal 16K 23.7 / 23.7 / 25.9 / 28.0. Hence 4, only on ties, and
# dense head by head (its non-causal problems up to 8K take the rotated walks).
FLEX_HEAD_GROUP = 4


def grid(d, num_kv_blocks, num_bh, device, walks):
    """(grid, items, sched): the work items are (key block, batch * kv head) pairs. `walks` is the schedule the
    problem allows (the caller's check): ROTATED where every key block sees every query block, PAIRED for a square
    causal problem of whole tiles without GQA, else PLAIN. One program per item (PLAIN), or, where the config is
    persistent, a cooperatively launched persistent grid (every program resident, which the orders below need to
    be free of deadlock) whose rounds hold whole heads, so that every key block of a head runs at the same time (a
    head split across rounds measured 7% slower at N=16K: its first key blocks waited a round for the rest):
      - ROTATED up to ROTATE_MAX_KV_BLOCKS key blocks: the largest multiple of num_kv_blocks programs up to one per
        SM (at most one per item);
      - PAIRED with an even number of key blocks up to PAIRED_MAX_KV_BLOCKS[d]: the largest multiple of
        num_kv_blocks / 2 programs up to one per SM (at most one per pair of items).
    One CTA fits an SM: the kernel takes ~226 KB of shared memory."""
    items = num_kv_blocks * num_bh
    sms = hw.device_info(device).num_sms
    if config(d).persistent:
        if walks == ROTATED and num_kv_blocks <= min(sms, ROTATE_MAX_KV_BLOCKS):
            return (min(items, sms // num_kv_blocks * num_kv_blocks),), items, ROTATED
        half = num_kv_blocks // 2
        if (walks == PAIRED and num_kv_blocks % 2 == 0 and 0 < half <= sms
                and num_kv_blocks <= PAIRED_MAX_KV_BLOCKS.get(d, 0)):
            return (min(items // 2, sms // half * half),), items, PAIRED
    return (items,), items, PLAIN


# dQ writer warps per program (gluon_bwd_sm90.attn_bwd_pipeline): each counts once per work item on its (batch, kv
# head)'s done counter, so a head's sums are complete at WRITERS * key blocks counts
WRITERS = 2


def counter_count(batch, heads_q, heads_kv, q_blocks):
    """(turn counters, all counters) of the kernel's int32 counter buffer: a turn counter per (batch * query head,
    query block), then the done counter per (batch, kv head) that the writers find right after them."""
    turns = batch * heads_q * q_blocks
    return turns, turns + batch * heads_kv


def zero_args(counters, programs, unused, chain=None):
    """(args, kwargs) that make the backward's preprocess (bwd_kernels.bwd_preprocess_kernel, `programs` programs)
    zero the counter buffer: the buffer is allocated empty, and the preprocess runs before the kernel on the same
    stream (a fill would cost one launch more per backward: host time, the N = 1K rows' bottleneck). counters None
    (a backward off this pipeline): nothing zeroed, `unused` (any tensor) stands for the buffer. chain (flex):
    bwd_kernels.chain_group's arguments; the preprocess then writes the kernel's head group into the buffer's
    last element (alloc_counters makes one more) instead of zeroing it."""
    if counters is None:
        return (unused, 0, ()), {}
    n = counters.numel() - (chain is not None)
    chunk = max(2, triton.next_power_of_2(triton.cdiv(n, programs)))
    return (counters, n, chain or ()), dict(ZERO_CHUNK=chunk, CHAIN=chain is not None)


def convert(launch, acc, counters, dq, lse, counts, scale, zero_unseen):
    """Launches dQ = scale * sums (acc [B * Hq * query blocks * block_m(D), D] float32) into dq [B, Sq, Hq, D] (a
    view in any strides); counts = (heads_kv, key blocks[, query blocks]), the query blocks (the sums' rows per
    head over block_m(D)) where the kernel has more than Sq needs (flex: whole mask blocks); counters: the
    kernel's counter buffer (counter_count).
    Launched with programmatic dependent launch: its programs start on the SMs the backward's tail frees, each
    waiting for its head's done counter to reach WRITERS * key blocks. zero_unseen: rows whose lse [B, Hq, Sq] is
    -inf get 0 (their sums may be unwritten)."""
    batch, seqlen_q, heads_q, d = dq.shape
    heads_kv, kv_blocks = counts[:2]
    q_blocks = counts[2] if len(counts) > 2 else triton.cdiv(seqlen_q, block_m(d))
    launch(bwd_dq_convert_kernel, (triton.cdiv(seqlen_q, 64), batch * heads_q), (
        acc, dq, lse, counters, dq.stride(0), dq.stride(1), dq.stride(2), lse.stride(0), lse.stride(1), seqlen_q,
        heads_q, heads_q // heads_kv, counter_count(batch, heads_q, heads_kv, q_blocks)[0], WRITERS * kv_blocks,
        q_blocks * block_m(d), scale), dict(D=d, BLOCK_M=64, ZERO_UNSEEN=zero_unseen, num_warps=4, launch_pdl=True))
