"""Config tables of MLA decode, one per backend (dispatch.py), each entry with the measurement that chose it.
Forcing one: tileattn.force_backend(config=...) (a config's class names its backend).

    MLAConfig      portable split kernel (kernels.py): candidates per query-row tile, the first whose shared
                   memory fits the budget (so sm89 / sm80 budgets, emulated with TILEATTN_SMEM_BUDGET, get
                   smaller steps or split outputs)
    MLASm90Config  Hopper split kernels (gluon_sm90.py; gluon_sm90_shard.py with qk_shard; gluon_sm90_seesaw.py
                   with seesaw): the first that fits the page size and the budget
"""
from dataclasses import dataclass
from typing import ClassVar

from ..common.backend import forced_config

BLOCK_M = 64  # query rows per tile of the Gluon kernel: one wgmma M for each of its two consumer warpgroups


@dataclass(frozen=True)
class MLAConfig:
    """A config of the portable split kernel (kernels.py)."""
    backend: ClassVar = "mla.triton"
    block_n: int  # cache tokens per step
    num_warps: int
    num_stages: int
    out_split: int  # programs sharing one work item's output columns (each recomputes the scores)


# Candidates per query-row tile (block_m), best first; the first whose shared memory fits the budget is used,
# so the 99 KB / 163 KB budgets of sm89 / sm80 (emulated with TILEATTN_SMEM_BUDGET) get smaller steps or
# split outputs. Chosen by scripts/sweep.py mla on the H100 (2026-11-21, bf16, page 64, read bandwidth
# 2939 GB/s): 16 rows (Hq 16, Sq 1), batch 768 x 1K: 32/4/2/1 2638 GB/s, 64/8/2/1 2343, 32/8/2/1 2251;
# 64 rows (Hq 64), batch 768 x 2K: 64/8/2/1 1721 (it spills: 255 registers), 32/8/3/1 1401, 32/8/2/1 1362,
# 32/4/2/2 806; batch 16 x 32K: 64/8/2/1 1465, 32/8/3/1 1237.
_SMALL_M = [
    MLAConfig(block_n=32, num_warps=4, num_stages=2, out_split=1),
    MLAConfig(block_n=64, num_warps=8, num_stages=2, out_split=1),
]
_LARGE_M = [
    MLAConfig(block_n=64, num_warps=8, num_stages=2, out_split=1),
    MLAConfig(block_n=32, num_warps=8, num_stages=2, out_split=1),
]
# for small budgets: the query rows alone are 72 KB at block_m = 64, Dc = 512, Dr = 64
_FALLBACK = [
    MLAConfig(block_n=32, num_warps=4, num_stages=2, out_split=2),
    MLAConfig(block_n=16, num_warps=4, num_stages=1, out_split=2),
    MLAConfig(block_n=16, num_warps=4, num_stages=1, out_split=4),
]


def candidates(block_m):
    """The portable kernel's configs for query-row tiles of block_m, best first (the forced one alone)."""
    forced = forced_config(MLAConfig)
    if forced is not None:
        return [forced]
    return (_SMALL_M if block_m <= 16 else _LARGE_M) + _FALLBACK


@dataclass(frozen=True)
class MLASm90Config:
    """A config of the Hopper split kernel (gluon_sm90.py)."""
    backend: ClassVar = "mla.sm90"
    block_n: int  # cache tokens per step (a page holds whole steps)
    stages: int  # steps in flight (shared-memory ring)
    consumer_regs: int = 240  # registers per thread of the second consumer warpgroup (setmaxnreg)
    # QK_SHARD: the warpgroups take turns computing a step's scores and share P through shared memory
    # (gluon_sm90_shard.py; no score computed twice); off: both compute every step's scores
    qk_shard: bool = False
    # fp8 caches: cache steps in flight in fp8, which the consumer warpgroups widen into the `stages` 16-bit
    # steps the consumers read (gluon_producer.py); 0: 16-bit caches, loaded straight into the 16-bit ring
    fp8_stages: int = 0
    # fp8 widening switches (docs/design/mla.md, 2c; the fp8 table below says which are on). widen_once: a
    # warpgroup's share of a step loaded whole, then converted and stored with one store per buffer (in passes,
    # Triton puts a warpgroup barrier before each pass's store). fence_late: the share's proxy fence placed where
    # no wgmma is in flight (after the step's last wgmma wait; QK_SHARD: shared with the fence of the P published
    # at the same turn)
    widen_once: bool = False
    fence_late: bool = False
    # the seesaw kernel's pair schedule (gluon_sm90_seesaw.py; SM90_PAIR, the table's first 16-bit config):
    # 64-token blocks whose scores one warpgroup computes at N = 64, taken in pairs (only the row maxima exchanged
    # before the two softmaxes, which run at once), the output split by columns, a 2-block ring freed per half.
    # Its earlier turn orders (seesaw_order 0-2) measured slower and are gone: docs/design/mla.md item 3
    seesaw: bool = False

    def __post_init__(self):
        if self.seesaw and (self.block_n != 64 or self.stages != 2):
            raise ValueError(f"MLASm90Config.seesaw (the pair schedule) runs 64-token blocks through a 2-block ring "
                             f"(the shared memory of a third is not there): block_n=64, stages=2, got {self.block_n}, "
                             f"{self.stages}")
        if self.seesaw and (self.qk_shard or self.fp8_stages):
            raise ValueError("MLASm90Config.seesaw (the pair schedule) is its own kernel for 16-bit caches: qk_shard "
                             "and fp8_stages (fp8 caches) are not served with it")
        if (self.widen_once or self.fence_late) and not self.fp8_stages:
            raise ValueError("MLASm90Config: widen_once / fence_late switch the fp8 widening, which needs "
                             "fp8_stages > 0 (a 16-bit config would run without them)")
        if self.widen_once and self.block_n > 32:
            raise ValueError(f"MLASm90Config.widen_once holds a whole step's share in registers: block_n <= 32, "
                             f"got {self.block_n}")


# Best first; the first that fits the page size and the shared-memory budget is used. Shared memory at
# Dc = 512, Dr = 64, 16-bit: the Q slot 72 KB, a 64-token step 72 KB (two stages: 216 KB of the 227 KB).
# Measured on the H100 (2026-11-21, scripts/sweep.py mla --quick, bf16, page 64, read bandwidth 2937 GB/s),
# GB/s for 32 tokens x 4 stages / 32 x 3 / 64 x 2, and the portable kernel's best:
#   batch 768 x 2K, Hq 64: 2574 / 2497 / 2281, portable 1721;  batch 16 x 32K, Hq 64: 2475 / 2329 / 2056, 1535;
#   batch 768 x 1K, Hq 32: 2538 / 2441 / 2180, portable 2120;  batch 768 x 1K, Hq 16: 2568 / 2453 / 2157, 2638.
# 16 rows: on the H100 (2026-11-24, scripts/sweep.py mla-sched --kernels, Hq 16, Sq 1) the Gluon kernel (32 x 4)
# against the portable one: batch 128 kv 1K 0.081 / 0.104 ms, kv 4K 0.232 / 0.369; batch 768 kv 1K 0.362 / 0.356.
# So from 16 rows up the Gluon kernel; fewer (a 64-row tile mostly padding, not measured) stay portable.
SM90_CONFIGS = [
    MLASm90Config(block_n=32, stages=4),
    MLASm90Config(block_n=32, stages=3),
    MLASm90Config(block_n=64, stages=2),
]
MIN_ROWS = 16
# The 16-bit order: the seesaw pair schedule (gluon_sm90_seesaw.py) first, then QK_SHARD (gluon_sm90_shard.py: pages
# of 32-token steps but not of whole 64-token blocks), then the plain kernel (Dr > 64, smaller shared-memory budgets).
# Pair against QK_SHARD on the H200 (2026-11-28, `scripts/sweep.py mla-sched --configs 10,7,0`, where MLA_SCHED 10 was
# the pair, 7 today, and the pair-first table against `--configs 0,3`, page 64, bf16, graph ms, two runs with the
# order reversed; `bench mla` with it first: docs/design/mla.md, "Pair schedule"): Hq 128 batch 128 kv 1K / 8K 0.105 /
# 0.115, 0.567 / 0.667, batch 768 kv 1K / 2K 0.501 / 0.590, 0.934 / 1.081; Hq 64 batch 768 kv 1K 0.319 / 0.338, batch
# 128 kv 4K 0.179 / 0.196, batch 16 kv 32K Sq 2 0.286 / 0.334; Hq 16-32 batch 768 kv 2K 0.484-0.505 / 0.569-0.586,
# batch 128 kv 8K Hq 16 0.311 / 0.356 (1.06-1.18x). At batch 128 kv 1K Hq 16 (unsplit 1K items) 0.067 / 0.068, the
# plain kernel 0.065: within the run's spread, but to re-measure before moving PLAIN_BELOW_CHUNK.
# QK_SHARD itself beat the plain kernel at every row count on the H200 (`bench mla` at 052affa: seed 1.12-1.27x,
# batch 128 1.02-1.32x, long 0.94-1.35x), where on the H100 (2026-11-24) it won only above one 64-row tile.
# Both lose on short split items, one row tile whose items are 256 tokens: graph ms pair / QK_SHARD / plain, batch
# 32 kv 1K Hq 16 Sq 4 0.047 / 0.046 / 0.041, batch 4 kv 8K 0.072 / 0.069 / 0.064, batch 1 kv 32K 0.152 / 0.150 /
# 0.144 (QK_SHARD against plain in the bench's long group: items of 64-256 tokens 0.94-0.99x, 512 0.99x, 1024
# 1.00-1.02x). So one row tile whose items are shorter than PLAIN_BELOW_CHUNK tokens (at the plan's first lengths)
# takes the plain kernel first.
SM90_SHARD = MLASm90Config(block_n=32, stages=4, qk_shard=True)
SM90_PAIR = MLASm90Config(block_n=64, stages=2, seesaw=True)  # (231,936 bytes of shared memory at Dc = 512)
PLAIN_BELOW_CHUNK = 512


def smem_bytes(cfg: MLASm90Config, dc: int, dr: int, elem_bytes: int = 2) -> int:
    """The Q slot, `stages` cache steps, 1 KB for barriers and alignment; with qk_shard (or seesaw) the Q slot holds
    only the nope part (the rope part lives in registers) and two P tiles and the row statistics are added; with
    fp8_stages, that many fp8 cache steps."""
    fp8 = cfg.fp8_stages * cfg.block_n * (dc + dr)
    if cfg.qk_shard or cfg.seesaw:  # (seesaw: the same parts, two 64-token blocks and two 64 x 64 P tiles)
        pair = 2 * BLOCK_M * 4 if cfg.seesaw else 0  # (the pair's row maxima)
        return (BLOCK_M * dc + cfg.stages * cfg.block_n * (dc + dr) + 2 * BLOCK_M * cfg.block_n) * elem_bytes \
            + fp8 + pair + 2048
    return (BLOCK_M + cfg.stages * cfg.block_n) * (dc + dr) * elem_bytes + fp8 + 1024


# fp8 (e4m3) caches (the kernel without QK_SHARD): three 16-bit steps (one being widened while the consumers read
# two), two fp8 steps in flight (freed as soon as they are widened). Shared memory at Dc = 512, Dr = 64, 32-token
# steps: the Q slot 72 KB + three 36 KB steps + two 18 KB fp8 steps. Measured on the H100 (2026-11-24,
# scripts/sweep.py mla-sched --fp8 --configs 1, page 64), ms with 232 / 240 consumer registers: batch 768 kv 1K
# Hq 64 0.458 / 0.467, Hq 16 0.412 / 0.432; batch 128 kv 4K Hq 64 0.287 / 0.289; kv 2K Hq 128 0.296 / 0.291 (SM90_FP8).
# fp8 caches on the QK_SHARD kernel (each warpgroup widens its half of every step, at its turns: gluon_sm90_shard.py):
# 64 KB of Q (nope) + three 36 KB steps + two 18 KB fp8 steps + 8 KB of P. First at every row count: the consumers
# (widening and scores), not the reads, limit fp8, and sharing the scores halves each warpgroup's part. On the H200
# (2026-11-28, `scripts/sweep.py mla-sched --fp8 --configs 0,2`, page 64, graph ms, the config below / this one):
# batch 128 kv 1K Hq 128 0.172 / 0.162; batch 768 kv 1K Hq 64 0.469 / 0.436; batch 128 kv 4K Hq 64 0.290 / 0.263;
# batch 768 kv 2K Hq 128 1.669 / 1.513; batch 768 kv 1K Hq 16 0.433 / 0.403; batch 128 kv 2K Hq 32 0.158 / 0.145
# (+6..+10%).
# The widening's switches (docs/design/mla.md 2c; on the H200, 2026-11-28, `scripts/sweep.py mla-sched --fp8
# --configs 4,5,6,1,7,8,9`, page 64, graph ms, off / once / late / both; QK_SHARD's off was the table's config
# then, index 2 now): QK_SHARD batch 128 kv 1K Hq 64 0.093 /
# 0.090 / 0.102 / 0.096, Hq 128 0.162 / 0.154 / 0.178 / 0.167, batch 768 kv 1K Hq 64 0.433 / 0.407 / 0.475 / 0.443;
# the plain kernel 0.098 / 0.094 / 0.096 / 0.094, 0.174 / 0.168 / 0.172 / 0.166, 0.469 / 0.456 / 0.469 / 0.447.
# So widen_once on both, fence_late on the plain kernel only (with QK_SHARD it delays the publish of P).
SM90_SHARD_FP8 = MLASm90Config(block_n=32, stages=3, qk_shard=True, fp8_stages=2, widen_once=True)
SM90_FP8 = MLASm90Config(block_n=32, stages=3, consumer_regs=232, fp8_stages=2, widen_once=True,
                         fence_late=True)  # (1 KB less shared memory)
SM90_FP8_CONFIGS = [SM90_SHARD_FP8, SM90_FP8]


def widen_rows(d):
    """Rows of a [rows, d] fp8 cache box a consumer warpgroup widens per pass (gluon_producer._widen: 16 bytes
    per thread; at least 8, the shared-memory swizzle's period): an fp8 config's block_n must be a multiple for
    d = Dc / 2 and Dr."""
    return max(8, 32 // min(32, d // 16) * 4)


def sm90_configs(fp8=False, rows=BLOCK_M + 1, chunk=None):
    """The Gluon kernels' configs for 16-bit (or fp8) caches, best first (the forced one alone): for 16-bit caches
    the pair schedule, then QK_SHARD, except for plans of one row tile (`rows` <= BLOCK_M) whose work items are
    shorter than PLAIN_BELOW_CHUNK tokens (`chunk`: the plan's item length at its first lengths; None: unknown), which
    take the plain kernel first."""
    forced = forced_config(MLASm90Config)
    if forced is not None:
        return [forced]
    if fp8:
        return SM90_FP8_CONFIGS
    if rows <= BLOCK_M and chunk is not None and chunk < PLAIN_BELOW_CHUNK:
        return SM90_CONFIGS + [SM90_PAIR, SM90_SHARD]
    return [SM90_PAIR, SM90_SHARD] + SM90_CONFIGS
