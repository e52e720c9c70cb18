"""Backends of dense attention forward for large head dims.

    "dense.large_d_sm90"  the Gluon kernel (gluon_sm90_large_d.py) on an H100/H200 with triton 3.6, for Dv >= 512
                          and for D and Dv both in (192, 384] (Q resident in shared memory, cuDNN's plan at
                          D = 256): 16-bit batched TMA-aligned inputs, no window or softcap
    "dense.large_d"       the Triton kernel (kernels_large_d.py) for D or Dv above 256, everywhere else. Its
                          shared memory is fixed by the config, not by the head dim: num_stages Q and K chunks of
                          BLOCK_K columns, one [BLOCK_N, BLOCK_DV] V tile and the P tile; the output is cut into
                          slices (slices()), one launch per slice width
"""
import torch
import triton

from ... import hw
from ...launcher import KernelLauncher
from ..common.backend import Backend, forced_config
from ..common.softmax import LOG2E
from ..common.tma import gluon_desc, gluon_sm90_reason
from .configs import LARGE_D_FROM, Q_RESIDENT_DIMS, LargeDConfig, large_d_candidates, large_d_sm90_config
from .kernels_large_d import attn_fwd_large_d_kernel
from .launch_triton import MAX_GRID_Y, block_dim, scales
from .problem import AttnLaunch

# ---- the Gluon kernel ----------------------------------------------------------------------------------------
# the parameters that change between calls of one plan
VARYING_SM90 = ("q_desc", "k_desc", "v_desc", "O", "LSE", "sm_scale")


class LargeDSm90Launch(AttnLaunch):
    """A planned launch of attn_fwd_large_d_sm90_kernel."""
    __slots__ = ()


class LargeDSm90Backend(Backend):
    name = "dense.large_d_sm90"
    gluon = True

    def supports(self, p):
        why = gluon_sm90_reason(p.device)
        if why:
            return False, why
        d, dv = p.head_dim, p.head_dim_v
        if not (dv >= 512 or Q_RESIDENT_DIMS[0] <= min(d, dv) and max(d, dv) <= Q_RESIDENT_DIMS[1]):
            return False, (f"head dims D={d}, Dv={dv}: it serves Dv >= 512, or D and Dv both in "
                           f"[{Q_RESIDENT_DIMS[0]}, {Q_RESIDENT_DIMS[1]}]")
        if p.varlen or p.dtype not in (torch.float16, torch.bfloat16):
            return False, "it takes batched float16 / bfloat16 inputs"
        if p.left >= 0 or p.right > 0 or p.opts.softcap > 0 or p.opts.scale <= 0:
            return False, "a window, a softcap or a negative scale (it serves full and causal attention)"
        if p.batch * p.heads_q > MAX_GRID_Y or min(p.seqlen_q, p.seqlen_k) == 0:
            return False, "B * Hq past the grid's y limit, or an empty sequence"
        need = large_d_sm90_config(d, dv).smem_bytes(d, p.elem_bytes)
        budget = hw.device_info(p.device).smem_per_block
        if need > budget:
            return False, f"its config needs {need} bytes of shared memory, the budget is {budget}"
        if not all(p.tma[:3]):
            return False, "q, k or v is not aligned for tensor descriptors (16-byte base and strides)"
        return True, ""

    def plan(self, p, c):
        from .gluon_sm90_large_d import attn_fwd_large_d_sm90_kernel
        q, k, v, out, lse = c.q, c.k, c.v, c.out, c.lse
        d, dv = p.head_dim, p.head_dim_v
        cfg = large_d_sm90_config(d, dv)
        causal = p.right == 0
        num_slices = triton.cdiv(dv, cfg.dvs)
        sl = (lse.stride(0), lse.stride(1)) if p.opts.return_lse else (0, 0)
        grid = (triton.cdiv(p.seqlen_q, 128) * num_slices, p.batch * p.heads_q)
        args = (gluon_desc(q, [1, 64, 1, cfg.block_k]), gluon_desc(k, [1, cfg.block_n, 1, cfg.block_k]),
                gluon_desc(v, [1, cfg.block_n, 1, cfg.dvs]), out, lse, out.stride(0), out.stride(1), out.stride(2),
                *sl, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_q // p.heads_kv, c.scale * LOG2E)
        kwargs = dict(D=d, DV=dv, NUM_SLICES=num_slices, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                      CAUSAL=causal, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right, RETURN_LSE=p.opts.return_lse,
                      REVERSE_M=causal, Q_RESIDENT=cfg.q_resident, num_warps=4)
        return LargeDSm90Launch(grid, KernelLauncher(attn_fwd_large_d_sm90_kernel, args, kwargs, VARYING_SM90))


# ---- the Triton kernel ---------------------------------------------------------------------------------------
def _cover(dv, w, w2):
    """Slices of w + w2 columns, then one narrower last slice for the remainder (its own launch)."""
    full, rem = divmod(dv, w + w2)
    out = [(0, w, w2, full)] if full else []
    if rem:
        last = (min(block_dim(rem), w), 0) if rem <= w else (w, block_dim(rem - w))
        if out and last == (w, w2):  # the same width as the full slices: one more of them, masked
            return [(0, w, w2, full + 1)]
        out.append((full * (w + w2), last[0], last[1], 1))
    return out


def slices(dv: int, cfg: LargeDConfig):
    """The launches' output slices, [(first column, width, second accumulator's width, number of slices)].

    A program's slice is block_dv + block_dv2 columns (two accumulators), or block_dv alone. Every slice
    recomputes Q K^T, so the split with the fewest slices wins, then the one with fewer masked columns: Dv =
    320 with 256 + 64 is one slice; Dv = 1024 with 256 + 128 is 2 x 384, then a launch of one 256-column
    slice; Dv = 512 is 2 x 256."""
    w = cfg.slice_dv(dv)
    splits = [_cover(dv, w, 0)]
    if cfg.block_dv2 and dv > w:
        splits.append(_cover(dv, w, cfg.block_dv2))
    return min(splits, key=lambda sp: (sum(n for *_, n in sp), sum(n * (a + b) for _, a, b, n in sp)))


# the kernel parameters that change between calls of one plan (KernelLauncher's `varying`)
VARYING = ("Q", "K", "V", "O", "LSE", "qk_scale", "softcap_scale", "softcap_out")
VARYING_VARLEN = VARYING + ("cu_seqlens_q", "cu_seqlens_k")


class LargeDLaunch:
    """One KernelLauncher per output-slice launch of kernel_call, run in order."""
    __slots__ = ("grids", "launchers", "varlen")

    def __init__(self, grids, launchers, varlen):
        self.grids, self.launchers, self.varlen = grids, launchers, varlen

    def _values(self, c):
        vals = (c.q, c.k, c.v, c.out, c.lse, *scales(c.scale, c.softcap))
        return vals + (c.cu_q, c.cu_k) if self.varlen else vals

    def run(self, c):
        vals = self._values(c)
        for grid, launcher in zip(self.grids, self.launchers):
            launcher(grid, *vals)

    def compile(self, c):
        """The compiled kernel of the first launch (a tail launch needs no more shared memory)."""
        return self.launchers[0].compile(self.grids[0], *self._values(c))


def kernel_call(p, c, cfg: LargeDConfig):
    """The LargeDLaunch of attn_fwd_large_d_kernel for problem p (call c's tensors as the example), config cfg:
    one launch per entry of slices()."""
    q, k, v, out, lse = c.q, c.k, c.v, c.out, c.lse
    varlen, return_lse = p.varlen, p.opts.return_lse
    left, right = p.opts.window
    if varlen:
        sq, sk, sv, so = ((0,) + tuple(t.stride()) for t in (q, k, v, out))
        sl = (0, lse.stride(0)) if return_lse else (0, 0)
    else:
        sq, sk, sv, so = (t.stride() for t in (q, k, v, out))
        sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    num_bh = p.batch * p.heads_q
    grids, launchers = [], []
    for dv_start, block_dv, block_dv2, count in slices(p.head_dim_v, cfg):
        grid = (triton.cdiv(max(p.seqlen_q, 1), cfg.block_m) * count, min(num_bh, MAX_GRID_Y),
                triton.cdiv(num_bh, MAX_GRID_Y))
        args = (q, k, v, out, lse,
                sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], so[0], so[1], so[2], sl[0], sl[1],
                c.cu_q, c.cu_k, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_q // p.heads_kv, num_bh,
                *scales(c.scale, c.softcap), left, right)
        kwargs = dict(
            D=p.head_dim, DV=p.head_dim_v, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            DV_START=dv_start, BLOCK_DV=block_dv, BLOCK_DV2=block_dv2, NUM_SLICES=count, HAS_LEFT=left >= 0,
            HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right, HAS_SOFTCAP=c.softcap > 0,
            IS_VARLEN=varlen, RETURN_LSE=return_lse and dv_start == 0, REVERSE_M=right >= 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        grids.append(grid)
        launchers.append(KernelLauncher(attn_fwd_large_d_kernel, args, kwargs, VARYING_VARLEN if varlen else VARYING))
    return LargeDLaunch(grids, launchers, varlen)


_choice_cache = {}


def choose_config(p, c):
    """forced > the first candidate whose compiled shared memory fits the device's budget (or the emulated
    one, TILEATTN_SMEM_BUDGET). Cached per (device, dtype, Dv, causal, budget)."""
    forced = forced_config(LargeDConfig)
    if forced is not None:
        return forced
    info = hw.device_info(p.device)
    causal = p.right >= 0
    key = (p.device, p.dtype, p.head_dim_v, causal, info.smem_per_block)
    cfg = _choice_cache.get(key)
    if cfg is None:
        cands = large_d_candidates(info.arch, p.head_dim_v, causal, p.elem_bytes, info.smem_per_block)
        if p.device.type == "cuda":
            cfg = next((x for x in cands if kernel_call(p, c, x).compile(c).metadata.shared <= info.smem_per_block),
                       cands[-1])
        else:
            cfg = cands[0]
        _choice_cache[key] = cfg
    return cfg


class LargeDBackend(Backend):
    """Head dims above 256 (up to 1024), 16-bit inputs, every mask option, batched or varlen, any GPU."""
    name = "dense.large_d"

    def supports(self, p):
        if max(p.head_dim, p.head_dim_v) < LARGE_D_FROM:
            return False, (f"head dims up to {LARGE_D_FROM - 1} (D={p.head_dim}, Dv={p.head_dim_v}) take the dense "
                           f"kernels")
        if p.fp8:
            return False, "fp8 inputs (head dims up to 256)"
        return True, ""

    def plan(self, p, c):
        return kernel_call(p, c, choose_config(p, c))
