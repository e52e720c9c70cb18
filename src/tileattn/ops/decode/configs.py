"""Config table of attention over a KV cache (ops/decode), with the measurement that chose it.
Forcing one: tileattn.force_backend(config=DecodeConfig(...)).

    DecodeConfig  the portable split kernel (kernels.py): candidates per head dim, best first; the first whose
                  shared memory fits the budget is used, so the 99 KB / 163 KB budgets of sm89 / sm80
                  (emulated with TILEATTN_SMEM_BUDGET) get shorter steps or fewer stages.
"""
from dataclasses import dataclass
from typing import ClassVar

from ..common.backend import forced_config


@dataclass(frozen=True)
class DecodeConfig:
    """A config of the split kernel (kernels.py)."""
    backend: ClassVar = "decode.triton"
    block_n: int  # cache tokens per step
    num_warps: int
    num_stages: int


# Best first, per (head dim, row tile, cache). Shared memory: num_stages steps of K and V (block_n * D * 2 *
# element bytes each) plus the query tile. Measured on the H100 (2026-11-23, scripts/sweep.py decode --quick,
# bf16, D = 128, GB/s against a read bandwidth of 2937; block_n / warps / stages):
#   16 rows (Hq 32 / Hkv 8, q_len 1), batch 32 x 4K: 64/4/3 2664, 128/8/2 2664, 128/4/3 2663, 32/4/6 2657;
#       batch 128 x 16K: 64/4/3 3042, 128/8/2 3044; batch 1 x 32K: 32/4/3 1523, 64/4/3 1508, 128/4/2 1370
#   32 rows (Hq 64 / Hkv 8, q_len 4), batch 32 x 4K: 128/4/2 2598, 128/4/3 2578, 64/4/2 2376, 64/4/3 2108
#   64 rows (q_len 16), batch 32 x 4K: 32/4/6 2533, 64/4/2 2383, 64/4/3 2362, 32/8/6 2219
#   128 rows (Hq 64 / Hkv 8, q_len 16): 32/4/6 1965, 32/8/6 1753, 32/4/3 1646, 128/8/2 1522
#   fp8 (e4m3) caches, 16 rows, batch 32 x 16K: 64/2/3 2196, 64/2/4 2194, 128/4/2 2048, 128/4/3 2013,
#       64/4/3 1603; batch 128 x 16K (Hq 64): 64/2/3 2300, 32/4/6 2145, 128/4/2 2142
_SMALL = {
    64: [DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    128: [DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    256: [DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 2), DecodeConfig(16, 4, 1)],
}
_MID = {  # 32-row tiles
    64: [DecodeConfig(128, 4, 2), DecodeConfig(64, 4, 2), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    128: [DecodeConfig(128, 4, 2), DecodeConfig(64, 4, 2), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    256: [DecodeConfig(64, 4, 2), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 2), DecodeConfig(16, 4, 1)],
}
_LARGE = {  # 64- and 128-row tiles (multi-token decode, chunked prefill)
    64: [DecodeConfig(32, 4, 6), DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    128: [DecodeConfig(32, 4, 6), DecodeConfig(64, 4, 2), DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2),
          DecodeConfig(16, 4, 1)],
    256: [DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 2), DecodeConfig(16, 4, 1)],
}
_FP8 = {  # e4m3 caches, 16- and 32-row tiles
    64: [DecodeConfig(64, 2, 3), DecodeConfig(128, 4, 2), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    128: [DecodeConfig(64, 2, 3), DecodeConfig(128, 4, 2), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    256: [DecodeConfig(64, 4, 2), DecodeConfig(32, 4, 3), DecodeConfig(16, 4, 2), DecodeConfig(16, 4, 1)],
}
HEAD_DIMS = tuple(_SMALL)


def candidates(head_dim, block_m, fp8):
    """The split kernel's configs for head_dim and block_m-row tiles, best first (the forced one alone)."""
    forced = forced_config(DecodeConfig)
    if forced is not None:
        return [forced]
    if block_m >= 64:
        table = _LARGE
    else:
        table = _FP8 if fp8 else _SMALL if block_m == 16 else _MID
    return table[head_dim]


def block_m(rows):
    """Query rows per tile: the rows of one sequence and KV head (q_len * G) rounded up to 16, 32, 64 or 128
    (a tile of 128 rows reads each cache step once for all of them)."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64 if rows <= 64 else 128


def smem_bytes(cfg, bm, head_dim, cache_bytes, q_bytes=2):
    """The query tile plus num_stages steps of K and V (converted copies of an fp8 cache go through registers)."""
    return bm * head_dim * q_bytes + max(1, cfg.num_stages) * cfg.block_n * head_dim * 2 * cache_bytes


def occupancy(cfg, bm, head_dim, cache_bytes, smem_per_block):
    """Programs of the split kernel one SM holds, from its shared memory (the SM has the block budget + 1 KB),
    at most 8."""
    return max(1, min(8, (smem_per_block + 1024) // (smem_bytes(cfg, bm, head_dim, cache_bytes) + 1024)))
