"""Backend "mla.sm90": the Hopper Gluon split kernels (gluon_sm90.py; gluon_sm90_shard.py for QK_SHARD configs,
gluon_sm90_seesaw.py, the pair schedule, for seesaw ones).

It serves plans on an H100/H200 with triton 3.6, 16-bit or fp8 (e4m3) caches (fp8: widened by the consumer
warpgroups, gluon_producer.py), Dc / 2 and Dr powers of two up to 256, pages holding whole cache steps and a
config within the shared-memory budget; it prefers 16 query rows or more (configs.MIN_ROWS). `tensors_ok(...)`
checks, per run, that the tensors suit TMA (else the plan runs the portable kernel for that call).
"""
import torch

from ... import hw
from ...launcher import launch_kept
from ..common.backend import Backend
from ..common.softmax import LOG2E
from ..common.tma import gluon_desc, gluon_sm90_reason, nvmma_layout, tma_ok
from .checks import is_pow2
from .configs import BLOCK_M, MIN_ROWS, sm90_configs, smem_bytes, widen_rows


def _rows_view(q):
    """q [B, Sq, Hq, D] as [B, Sq * Hq, D] (row r = t * Hq + h) without a copy, or None."""
    b, s, h, d = q.shape
    if s > 1 and q.stride(1) != h * q.stride(2):
        return None
    return q.as_strided((b, s * h, d), (q.stride(0), q.stride(2), 1))


def tensors_ok(r):
    """Whether run r's tensors (plan.MLARun) suit the kernel's TMA descriptors."""
    qs = [_rows_view(r.q_nope), _rows_view(r.q_pe)]
    return all(t is not None and tma_ok(t) for t in qs) and tma_ok(r.ckv_cache) and tma_ok(r.kpe_cache)


class Sm90Backend(Backend):
    name = "mla.sm90"
    gluon = True

    def supports(self, plan):
        why = gluon_sm90_reason(plan.device)
        if why:
            return False, why
        if plan.cache_dtype not in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
            return False, f"{plan.cache_dtype} caches run on the Triton kernel"
        # the accumulator of one warpgroup is 64 x Dc / 2 float32: at most 128 registers per thread
        if not (is_pow2(plan.dc) and 32 <= plan.dc <= 512 and is_pow2(plan.dr) and 16 <= plan.dr <= 256):
            return False, f"Dc={plan.dc}, Dr={plan.dr}: it serves powers of two, Dc in 32..512, Dr in 16..256"
        if self.config(plan) is None:
            return False, (f"no config fits pages of {plan.page_size} tokens, the shared-memory budget of "
                           f"{hw.device_info(plan.device).smem_per_block} bytes and {plan.cache_dtype} caches")
        return True, ""

    def prefers(self, plan):
        if plan.rows < MIN_ROWS:
            return False, f"{plan.rows} query rows: a 64-row tile would be mostly padding (configs.MIN_ROWS)"
        return True, ""

    def config(self, plan):
        """The first config that fits the plan's page size, cache dtype and the shared-memory budget, or None (a
        qk_shard config also needs >= 3 stages of >= 32 tokens and Dr <= 64: the rope part of Q is held in
        registers; a seesaw config, Dr <= 64 too; an fp8 config, >= 3 stages (the consumers widen the next step into
        the slot of the one before last), >= 2 fp8 stages with qk_shard, of a size the widening passes divide)."""
        budget = hw.device_info(plan.device).smem_per_block
        fp8 = plan.cache_dtype == torch.float8_e4m3fn
        order = sm90_configs(fp8, plan.rows, plan.first_chunk)
        return next((cfg for cfg in order if plan.page_size % cfg.block_n == 0
                     and smem_bytes(cfg, plan.dc, plan.dr) <= budget and (cfg.fp8_stages > 0) == fp8
                     and (not fp8 or (cfg.stages >= 3 and (not cfg.qk_shard or cfg.fp8_stages >= 2)
                                      and all(cfg.block_n % widen_rows(d) == 0 for d in (plan.dc // 2, plan.dr))))
                     and (not cfg.qk_shard or (cfg.stages >= 3 and cfg.block_n >= 32 and plan.dr <= 64))
                     and (not cfg.seesaw or plan.dr <= 64)), None)

    def launch(self, plan, r):
        """Run the split kernel of plan's schedule on run r (plan.MLARun); returns the compiled kernel.

        The first run of a plan key (plan.run's) builds the descriptors and goes through launcher.launch_cached;
        later runs hand its launcher the new tensors (plan.launchers: the descriptors only change base)."""
        cfg = plan.sm90
        num_tiles = plan.row_blocks * plan.capacity
        grid = (min(num_tiles, plan.programs or hw.device_info(r.q_nope.device).num_sms),)
        qn, qp = _rows_view(r.q_nope), _rows_view(r.q_pe)
        tail = (r.block_table, plan.seqlens, plan.work, r.out, r.lse, plan.o_part, plan.lse_part, r.kv_scale)
        # the kernel's tensor arguments in order (a descriptor by its base)
        rope_in_regs = cfg.qk_shard or cfg.seesaw  # (no q_pe descriptor: its rows are read into registers)
        tensors = (qn, r.ckv_cache, r.kpe_cache, qp, *tail) if rope_in_regs else (qn, qp, r.ckv_cache,
                                                                                   r.kpe_cache, *tail)

        def build():
            dh = plan.dc // 2
            descs = [gluon_desc(qn, [1, BLOCK_M, dh]), gluon_desc(r.ckv_cache, [1, cfg.block_n, dh]),
                     gluon_desc(r.kpe_cache, [1, cfg.block_n, plan.dr])]
            strides = (r.block_table.stride(0), *r.out.stride()[:3], r.lse.stride(0), r.lse.stride(1))
            dims = (plan.num_heads, plan.q_len, r.ckv_cache.shape[0], num_tiles, plan.row_blocks,
                    plan.scale * LOG2E)
            opts = dict(PAGE=plan.page_size, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs, CAUSAL=plan.causal,
                        RETURN_LSE=r.return_lse, num_warps=4)
            if cfg.fp8_stages:  # the 16-bit ring the consumers fill: the layouts of 16-bit descriptors' boxes
                opts.update(F_STAGES=cfg.fp8_stages, C_LAYOUT=nvmma_layout([1, cfg.block_n, dh], plan.dtype),
                            P_LAYOUT=nvmma_layout([1, cfg.block_n, plan.dr], plan.dtype),
                            WIDEN_ONCE=cfg.widen_once, FENCE_LATE=cfg.fence_late)
            if cfg.seesaw:  # ckv loaded per 64-column box (the 128-byte swizzle's width), each on its own barrier
                from .gluon_sm90_seesaw import mla_split_sm90_seesaw_kernel as kernel
                descs[1] = gluon_desc(r.ckv_cache, [1, cfg.block_n, min(dh, 64)])
                del opts["STAGES"]  # (2 blocks, fixed)
                return kernel, (*descs, qp, *tail, qp.stride(0), qp.stride(1), *strides, *dims), opts
            if cfg.qk_shard:
                from .gluon_sm90_shard import mla_split_sm90_shard_kernel as kernel
                return kernel, (*descs, qp, *tail, qp.stride(0), qp.stride(1), *strides, *dims), opts
            from .gluon_sm90 import mla_split_sm90_kernel as kernel
            return kernel, (descs[0], gluon_desc(qp, [1, BLOCK_M, plan.dr]), *descs[1:], *tail, *strides,
                            *dims), opts

        return launch_kept(plan.launchers, self.name, grid, tensors, build).compiled
