"""Config table of flex attention's portable Triton kernel (kernels.py). The Hopper kernel takes the dense
pipeline's table (ops/common/configs.py, Sm90Config); the backward, the shared BwdConfig table."""
from dataclasses import dataclass
from typing import ClassVar

from ... import hw
from ..common.backend import forced_config


@dataclass(frozen=True)
class FlexConfig:
    """Tiles of the portable kernel (each divides the mask's blocks: flex_config halves them as needed)."""
    backend: ClassVar = "flex.triton"
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# By the larger head dim. Measured against compiled torch flex_attention on the H100 (bf16, B=4, H=16, N=8192,
# D=128; docs/design/flex.md): the Hopper kernel serves the grid's shapes, this table the others.
_INTERPRETER = FlexConfig(32, 16, 4, 1)
_TABLE = [(64, FlexConfig(128, 64, 4, 3)), (128, FlexConfig(128, 64, 8, 2)), (256, FlexConfig(64, 32, 4, 2))]


def _pow2_divisor(block, preferred):
    """The largest power of two <= preferred that divides `block` (a mask block size)."""
    b = preferred
    while b > 16 and block % b:
        b //= 2
    return b


def flex_config(d, dv, q_block, kv_block) -> FlexConfig:
    """The portable kernel's config for head dims (d, dv) and the mask's blocks: forced > interpreter > table."""
    cfg = forced_config(FlexConfig)
    if cfg is None:
        cfg = _INTERPRETER if hw.interpreter_enabled() else next(c for dmax, c in _TABLE if max(d, dv) <= dmax)
    return FlexConfig(_pow2_divisor(q_block, cfg.block_m), _pow2_divisor(kv_block, cfg.block_n), cfg.num_warps,
                      cfg.num_stages)
