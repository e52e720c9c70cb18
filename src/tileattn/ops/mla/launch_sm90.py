"""Launch of the Hopper Gluon MLA split kernel (gluon_sm90.py).

`config_for(plan)` says whether the kernel can serve a plan (an sm90 GPU, triton 3.6, 16-bit dtypes,
Dc / 2 and Dr powers of two up to 256, pages holding whole cache steps, the shared-memory budget) and with
which tiles; `tensors_ok(...)` checks, per run, that the tensors suit TMA (else the plan runs the portable
kernel for that call); `kernel_call(...)` gives the kernel, grid and arguments.
"""
from dataclasses import dataclass

import torch

from ... import hw
from ..dense import launch_sm90 as dense_sm90
from ..dense.launch import tma_ok
from .kernels import LOG2E

BLOCK_M = 64  # query rows per tile: one wgmma M for each of the two consumer warpgroups


@dataclass(frozen=True)
class MLASm90Config:
    block_n: int  # cache tokens per step (a page holds whole steps)
    stages: int  # steps in flight (shared-memory ring)
    consumer_regs: int = 240  # registers per thread of the second consumer warpgroup (setmaxnreg)


# Best first; the first that fits the page size and the shared-memory budget is used. Shared memory at
# Dc = 512, Dr = 64, 16-bit: the Q slot 72 KB, a 64-token step 72 KB (two stages: 216 KB of the 227 KB).
# Measured on the H100 (2026-11-21, scripts/sweep_mla.py --quick, bf16, page 64, read bandwidth 2937 GB/s),
# GB/s for 32 tokens x 4 stages / 32 x 3 / 64 x 2, and the portable kernel's best:
#   batch 768 x 2K, Hq 64: 2574 / 2497 / 2281, portable 1721;  batch 16 x 32K, Hq 64: 2475 / 2329 / 2056, 1535;
#   batch 768 x 1K, Hq 32: 2538 / 2441 / 2180, portable 2120;  batch 768 x 1K, Hq 16: 2568 / 2453 / 2157, 2638.
# So 16 rows or fewer (a 64-row tile would be mostly padding) stay on the portable kernel.
_CONFIGS = [
    MLASm90Config(block_n=32, stages=4),
    MLASm90Config(block_n=32, stages=3),
    MLASm90Config(block_n=64, stages=2),
]
MIN_ROWS = 17


def smem_bytes(cfg: MLASm90Config, dc: int, dr: int, elem_bytes: int = 2) -> int:
    """The Q slot, `stages` cache steps, 1 KB for barriers and alignment."""
    return (BLOCK_M + cfg.stages * cfg.block_n) * (dc + dr) * elem_bytes + 1024


def _pow2(x):
    return x > 0 and x & (x - 1) == 0


def config_for(device, rows, dc, dr, page_size, dtype):
    """The config of the Gluon kernel for a plan's shape (rows = Sq * Hq), or None when it does not serve it
    (then the portable kernel does). TILEATTN_SM90=0 keeps every plan on the portable kernel."""
    device = torch.device(device)
    if rows < MIN_ROWS or not hw.sm90_kernels(device):
        return None
    if dtype not in (torch.float16, torch.bfloat16) or not dense_sm90.available():
        return None
    # the accumulator of one warpgroup is 64 x Dc / 2 float32: at most 128 registers per thread
    if not (_pow2(dc) and 32 <= dc <= 512 and _pow2(dr) and 16 <= dr <= 256):
        return None
    budget = hw.device_info(device).smem_per_block
    for cfg in _CONFIGS:
        if page_size % cfg.block_n == 0 and smem_bytes(cfg, dc, dr) <= budget:
            return cfg
    return None


def _rows_view(q):
    """q [B, Sq, Hq, D] as [B, Sq * Hq, D] (row r = t * Hq + h) without a copy, or None."""
    b, s, h, d = q.shape
    if s > 1 and q.stride(1) != h * q.stride(2):
        return None
    return q.as_strided((b, s * h, d), (q.stride(0), q.stride(2), 1))


def tensors_ok(q_nope, q_pe, ckv_cache, kpe_cache):
    """Whether this run's tensors suit the kernel's TMA descriptors."""
    qs = [_rows_view(q_nope), _rows_view(q_pe)]
    return all(t is not None and tma_ok(t) for t in qs) and tma_ok(ckv_cache) and tma_ok(kpe_cache)


def _desc(t, block):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    gdt = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}[t.dtype]
    layout = gl.NVMMASharedLayout.get_default_for(list(block), gdt)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), layout)


def kernel_call(plan, q_nope, q_pe, ckv_cache, kpe_cache, block_table, kv_scale, out, lse, return_lse,
                programs=None):
    """(kernel, grid, args, kwargs) of the Gluon kernel for a plan's run on validated tensors."""
    from .gluon_sm90 import mla_split_sm90_kernel
    cfg = plan.config
    dh = plan.dc // 2
    num_tiles = plan.row_blocks * plan.capacity
    grid = (min(num_tiles, programs or hw.device_info(q_nope.device).num_sms),)
    args = (
        _desc(_rows_view(q_nope), [1, BLOCK_M, dh]), _desc(_rows_view(q_pe), [1, BLOCK_M, plan.dr]),
        _desc(ckv_cache, [1, cfg.block_n, dh]), _desc(kpe_cache, [1, cfg.block_n, plan.dr]),
        block_table, plan.seqlens, plan.work, out, lse, plan.o_part, plan.lse_part, kv_scale,
        block_table.stride(0), *out.stride()[:3], lse.stride(0), lse.stride(1),
        plan.num_heads, plan.q_len, ckv_cache.shape[0], num_tiles, plan.row_blocks, plan.scale * LOG2E,
    )
    kwargs = dict(PAGE=plan.page_size, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs, CAUSAL=plan.causal,
                  RETURN_LSE=return_lse, num_warps=4)
    return mla_split_sm90_kernel, grid, args, kwargs
