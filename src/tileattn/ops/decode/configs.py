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


# Best first, per head dim. Shared memory: num_stages steps of K and V (block_n * D * 2 * element bytes each)
# plus the query tile. Starting points, to be replaced by scripts/sweep.py decode on the H100.
_CANDIDATES = {
    64: [DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    128: [DecodeConfig(64, 4, 3), DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 1)],
    256: [DecodeConfig(32, 4, 3), DecodeConfig(32, 4, 2), DecodeConfig(16, 4, 2), DecodeConfig(16, 4, 1)],
}
HEAD_DIMS = tuple(_CANDIDATES)


def candidates(head_dim):
    """The split kernel's configs for head_dim, best first (the forced one alone)."""
    forced = forced_config(DecodeConfig)
    return [forced] if forced is not None else _CANDIDATES[head_dim]


def block_m(rows):
    """Query rows per tile: the rows of one sequence and KV head (q_len * G) rounded up to 16, 32 or 64."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def smem_bytes(cfg, bm, head_dim, cache_bytes, q_bytes=2):
    """The query tile plus num_stages steps of K and V (converted copies of an fp8 cache go through registers)."""
    return bm * head_dim * q_bytes + max(1, cfg.num_stages) * cfg.block_n * head_dim * 2 * cache_bytes
