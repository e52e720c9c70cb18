"""Backend "mla.triton": the portable split kernel (kernels.py), any GPU and the interpreter, 16-bit and fp8
(e4m3) caches. Its config is the first of configs.candidates whose shared memory fits the budget."""
from ... import hw
from ...launcher import launch_kept
from ..common.backend import Backend
from ..common.softmax import LOG2E
from .configs import candidates
from .kernels import mla_split_kernel


def smem_estimate(plan, cfg):
    """Bytes of shared memory: the query rows plus num_stages cache steps (plus the V slice when the output is
    split). A GPU build checks the compiled figure (plan.compiled)."""
    e = 2
    q = plan.block_m * (plan.dc + plan.dr) * e
    step = cfg.block_n * (plan.dc + plan.dr + (plan.dc // cfg.out_split if cfg.out_split > 1 else 0)) * e
    return q + max(1, cfg.num_stages) * step


class TritonBackend(Backend):
    name = "mla.triton"

    def supports(self, plan):
        return True, ""

    def config(self, plan):
        """The first candidate for the plan's row tile that fits the shared-memory budget."""
        budget = hw.device_info(plan.device).smem_per_block
        for cfg in candidates(plan.block_m):
            if smem_estimate(plan, cfg) <= budget:
                return cfg
        raise ValueError(f"MLA decode: no configuration fits the shared-memory budget of {budget} bytes "
                         f"(Dc={plan.dc}, Dr={plan.dr})")

    def launch(self, plan, r):
        """Run the split kernel of plan's schedule on run r (plan.MLARun); returns the compiled kernel. The
        first run of a plan key goes through launcher.launch_cached, later ones replay its launcher."""
        cfg = plan.portable
        q_nope, q_pe, ckv_cache, kpe_cache, out, lse = r.q_nope, r.q_pe, r.ckv_cache, r.kpe_cache, r.out, r.lse
        tensors = (q_nope, q_pe, ckv_cache, kpe_cache, r.block_table, plan.seqlens, plan.work, out, lse, plan.o_part,
                   plan.lse_part, r.kv_scale)
        build = lambda: (mla_split_kernel, (  # noqa: E731
            *tensors,
            *q_nope.stride()[:3], *q_pe.stride()[:3],
            ckv_cache.stride(0), ckv_cache.stride(1), kpe_cache.stride(0), kpe_cache.stride(1),
            r.block_table.stride(0), *out.stride()[:3], lse.stride(0), lse.stride(1),
            plan.num_heads, plan.q_len, ckv_cache.shape[0], plan.scale * LOG2E,
        ), dict(
            DC=plan.dc, DR=plan.dr, PAGE=plan.page_size, BLOCK_M=plan.block_m, BLOCK_N=cfg.block_n,
            OUT_SPLIT=cfg.out_split, CAUSAL=plan.causal, RETURN_LSE=r.return_lse,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        ))
        grid = (plan.row_blocks, plan.capacity, cfg.out_split)
        return launch_kept(plan.launchers, self.name, grid, tensors, build).compiled
