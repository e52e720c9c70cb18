"""Backend "flex.triton": the portable Triton kernel of flex attention (kernels.py), any GPU and the
interpreter. fp8 inputs are dequantized to the output dtype first (real values: stored times descale)."""
import torch
import triton

from ...launcher import launch_args
from ..common.backend import Backend
from ..common.fp8 import Fp8V
from .configs import flex_config
from .kernels import flex_fwd_kernel
from .problem import mask_strides, mod_captures
from .trace import capture_args


def _dequantize(x, descale, group):
    """fp8 [B, H, S, D] (or an Fp8V, dense layout) times its descale ([B, Hkv] per kv head, or one value) as
    float32 [B, H, S, D]."""
    if isinstance(x, Fp8V):
        x = x.unpack().transpose(1, 2)
    x = x.float()
    if isinstance(descale, torch.Tensor) and descale.numel() > 1:
        return x * descale.repeat_interleave(group, dim=1)[:, :, None, None]
    return x * (float(descale) if descale is not None else 1.0)


class TritonBackend(Backend):
    """Every flex problem: any block sizes (multiples of 16), lengths and head dims up to 256."""
    name = "flex.triton"

    def supports(self, p):
        return True, ""

    def run(self, p, c, kept=None):
        """Fill c.out (and c.lse). kept: a launch plan's dict (plans.py), in which the launch is kept and replayed
        (launcher.launch_args); None, and fp8 inputs (dequantized per call), take Triton's normal launch."""
        query, key, value, out, lse = c.query, c.key, c.value, c.out, c.lse
        num, idx, fnum, fidx = c.lists if c.lists is not None else (None,) * 4
        dummy = out  # never read where a block-mask tensor is absent
        lists = [t if t is not None else dummy for t in (num, idx, fnum, fidx)]
        captures = mod_captures(p, c)
        if p.fp8:  # the kernel takes 16-bit inputs: dequantize (real values, then the output dtype)
            q_descale, k_descale, v_descale = c.descales
            query, key, value = (_dequantize(x, d, g).to(p.out_dtype) for x, d, g in
                                 ((query, q_descale, p.group), (key, k_descale, 1), (value, v_descale, 1)))
        B, H, Sq, D = query.shape
        Sk, Dv = key.shape[2], value.shape[3]
        cfg = flex_config(D, Dv, p.q_block, p.kv_block)
        sl = (lse.stride(0), lse.stride(1)) if p.return_lse else (0, 0)
        smod, mmod = p.score_mod, p.mask_mod
        grid = (triton.cdiv(Sq, cfg.block_m), B * H)
        args = (
            query, key, value, out, lse, *lists, *(capture_args(t) for t in captures),
            query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
            value.stride(0), value.stride(1), value.stride(2), out.stride(0), out.stride(1), out.stride(2), *sl,
            *mask_strides(num), *mask_strides(idx), *mask_strides(fnum), *mask_strides(fidx),
            H, p.group, Sq, Sk, D, Dv, p.scale)
        kwargs = dict(
            SCORE_MOD=smod.fn if smod else None, MASK_MOD=mmod.fn if mmod else None, DENSE=c.lists is None,
            HAS_FULL=fnum is not None, Q_BLOCK=p.q_block, KV_BLOCK=p.kv_block, BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n, BLOCK_D=triton.next_power_of_2(D), BLOCK_DV=triton.next_power_of_2(Dv),
            RETURN_LSE=p.return_lse, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        if kept is None or p.fp8:
            flex_fwd_kernel[grid](*args, **kwargs)
        else:
            launch_args(kept, "fwd", flex_fwd_kernel, grid, args, kwargs)
