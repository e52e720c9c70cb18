"""Backend "decode.triton": the portable split kernel (kernels.py), any GPU and the interpreter, 16-bit and fp8
(e4m3) caches. Its config is the first of configs.candidates whose shared memory fits the budget."""
from ... import hw
from ...launcher import launch_cached
from ..common.backend import Backend
from ..common.softmax import LOG2E
from .configs import candidates, smem_bytes
from .kernels import append_kv_kernel, decode_split_kernel


def _q_strides(plan, q):
    """(stride_b, stride_t, stride_h) of queries / outputs: [B, q_len, H, D], or packed [total_q, H, D]."""
    return (q.stride(0), q.stride(1), q.stride(2)) if not plan.varlen else (0, q.stride(0), q.stride(1))


def _lse_strides(plan, lse):
    """(stride_b, stride_h, stride_t) of lse: [B, Hq, q_len], or packed [Hq, total_q]."""
    return tuple(lse.stride()) if not plan.varlen else (0, lse.stride(0), lse.stride(1))


def _scale_stride(t):
    return 0 if t.numel() == 1 else t.stride(0)


class TritonBackend(Backend):
    name = "decode.triton"

    def supports(self, plan):
        return True, ""

    def config(self, plan):
        """The first candidate for the plan's head dim whose shared memory fits the budget."""
        budget = hw.device_info(plan.device).smem_per_block
        cache_bytes = plan.cache_dtype.itemsize
        for cfg in candidates(plan.head_dim, plan.block_m, cache_bytes == 1):
            if smem_bytes(cfg, plan.block_m, plan.head_dim, cache_bytes) <= budget:
                return cfg
        raise ValueError(f"attention over a KV cache: no configuration fits the shared-memory budget of {budget} "
                         f"bytes (head_dim={plan.head_dim})")

    def append(self, plan, r):
        """Write run r's new keys and values (plan.DecodeRun) into the cache at each sequence's last q_len
        positions."""
        k, v, kn, vn = r.k_cache, r.v_cache, r.k_new, r.v_new
        block_t = 16
        bt = r.block_table if plan.paged else plan.seqlens
        launch_cached(append_kv_kernel, (plan.num_kv_heads, plan.batch, -(-plan.max_q_len // block_t)), (
            kn, vn, k, v, bt, plan.seqlens, plan.qinfo, r.k_scale, r.v_scale,
            *_q_strides(plan, kn), *_q_strides(plan, vn),
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            bt.stride(0), _scale_stride(r.k_scale), _scale_stride(r.v_scale), k.shape[0],
        ), dict(D=plan.head_dim, PAGE=plan.page_size or 1, PAGED=plan.paged, BLOCK_T=block_t,
                QUANT=plan.cache_dtype.itemsize == 1, num_warps=4))

    def launch(self, plan, r):
        """Run the split kernel of plan's schedule on run r (plan.DecodeRun): one launch (launcher.launch_cached:
        a few microseconds of Python), split tiles merged by their last piece."""
        cfg = plan.config
        q, k, v, out, lse = r.q, r.k_cache, r.v_cache, r.out, r.lse
        bt = r.block_table if plan.paged else plan.seqlens
        dummy = plan.scales
        slopes = r.alibi_slopes if r.alibi_slopes is not None else dummy
        sinks = r.sinks if r.sinks is not None else dummy
        softcap = plan.softcap
        qk_scale = plan.scale if softcap > 0 else plan.scale * LOG2E
        wl, wr = plan.window
        lse_strides = _lse_strides(plan, lse)
        launch_cached(decode_split_kernel, (plan.num_kv_heads, plan.capacity), (
            q, k, v, bt, plan.seqlens, plan.qinfo, plan.work, plan.tiles, plan.sem, out, lse, plan.o_part,
            plan.lse_part,
            r.k_scale, r.v_scale, slopes, sinks,
            *_q_strides(plan, q),
            k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), bt.stride(0),
            *_q_strides(plan, out), *lse_strides,
            _scale_stride(r.k_scale), _scale_stride(r.v_scale),
            k.shape[0], qk_scale, softcap if softcap > 0 else 1.0, wl, wr,
        ), dict(
            D=plan.head_dim, G=plan.group, PAGE=plan.page_size or 1, PAGED=plan.paged,
            BLOCK_M=plan.block_m, BLOCK_N=cfg.block_n, CAUSAL=plan.causal, SOFTCAP=softcap > 0,
            ALIBI=r.alibi_slopes is not None, HAS_SINK=r.sinks is not None, WINDOW=wl >= 0 or wr >= 0,
            FP8=plan.cache_dtype.itemsize == 1, RETURN_LSE=r.return_lse, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        ))
