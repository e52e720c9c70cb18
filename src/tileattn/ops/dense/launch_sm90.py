"""Launch of the Hopper Gluon forward kernel (gluon_sm90.py) for the batched layout.

`supports(...)` says whether the kernel serves a problem, `kernel_call(...)` gives its grid and arguments
(plans.py replays them), `launch(...)` runs it through Triton's normal path. Problems it does not serve
(other GPUs or triton versions, the interpreter, varlen, head dims other than 64 / 128 / 256 (fp8: 64 / 128),
Dv != D, TMA-unaligned tensors) go to the portable Triton kernel (plans.use_sm90). fp8 V must be the view of
an fp8.Fp8V; plans.py packs any other V once per call (fp8.fp8_v_layout).
"""
from dataclasses import dataclass

import torch
import triton

from ... import hw
from .fp8 import P_SHIFT, descale_strides, is_fp8, packed_pitch
from .kernels import LOG2E
from .launch import tma_ok


@dataclass(frozen=True)
class Sm90Config:
    block_m: int  # query rows per consumer warpgroup (the CTA computes 2 * block_m)
    block_n: int  # keys per K/V tile
    stages: int  # K/V tiles in flight (shared-memory ring)
    consumer_regs: int  # registers per thread of the second consumer warpgroup (setmaxnreg)
    persistent: bool = True  # one CTA per SM looping over tiles (else one CTA per tile)
    q_slots: int = 2  # Q tiles in flight per consumer (2: the next tile's Q loads during this one)
    serves_causal: bool = True  # False: problems with a right bound (causal) go to the portable kernel


# Per head dim. Shared memory: 2 x q_slots Q tiles + stages x (K + V) tiles, within the 227 KB of an
# H100.
# Chosen from the compiled kernel's registers (no spills in the key loop) and shared memory (inspect_sm90.py);
# timing sweeps are in bench/NOTES.md.
# The pipelined loop (FA3's intra-warpgroup overlap) won over a plain one at N >= 4K on the H100 (2026-11-21,
# scripts/dev_sm90.py): D=64 434 vs 396 TFLOPS at 16K non-causal, D=128 546 vs 524; 128-key tiles beat 64.
# The persistent grid (one CTA per SM, the next tile's Q loaded during the current one) against one CTA per
# tile, same run (2026-11-21, dev_sm90.py --old): geomean over the dense grid 0.922 vs 0.867 of cuDNN; N=1K
# rows +4-20% (D=64 causal 205 -> 246 TFLOPS), N=16K within -4..+1%.
_CONFIGS = {
    64: Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240),
    128: Sm90Config(block_m=64, block_n=128, stages=2, consumer_regs=240),
    # D = 256: one Q slot (64 KB) and two stages of 64-key K/V tiles (128 KB); a 64 x 256 float32 accumulator
    # is 128 registers per thread. Against the portable kernel on the H100 (2026-11-21, tileattn bench dense
    # with TILEATTN_SM90=1/0): non-causal +4-6% (B=1, H=48, N=8K: 509 vs 481 TFLOPS; B=1, H=8, N=16K: 508 vs
    # 488), causal -2% (H=48, 8K) to -32% (H=8, 16K): causal stays on the portable kernel. 32-key tiles with 4
    # stages and one CTA per tile were no better (scripts/dev_sm90.py --dims 256).
    256: Sm90Config(block_m=64, block_n=64, stages=2, consumer_regs=240, q_slots=1, serves_causal=False),
}
# fp8 (1-byte Q/K/V tiles, a bf16/fp16 O buffer per consumer): the same tiles, more stages in flight
_FP8_CONFIGS = {
    64: Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240),
    128: Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240),
}

_GL_DTYPES = {}
_LAYOUTS = {}


def available() -> bool:
    """Gluon's Hopper API as this kernel was written and tested against it: triton 3.6 (Gluon is experimental
    and changes between releases; other versions get the portable kernel)."""
    if not triton.__version__.startswith("3.6."):
        return False
    try:
        from . import gluon_sm90  # noqa: F401
        return True
    except ImportError:
        return False


def supports(q, k, v, out, varlen, interpret, scale, softcap, causal=False) -> bool:
    """Whether the Gluon kernel serves this problem (else the portable kernel does). causal: the mask has a
    right bound."""
    if varlen or interpret or q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    d, dv = q.shape[-1], v.shape[-1]
    if q.dtype not in (torch.float16, torch.bfloat16) and not is_fp8(q.dtype):
        return False
    cfg = (_FP8_CONFIGS if is_fp8(q.dtype) else _CONFIGS).get(d)
    if cfg is None or dv != d or causal and not cfg.serves_causal:
        return False
    if softcap <= 0 and scale <= 0:  # the kernel folds a positive scale into exp2 after the row max
        return False
    if min(q.shape[1], k.shape[1]) == 0:
        return False
    if is_fp8(q.dtype):  # V is packed (fp8.Fp8V, TMA-ready by construction) when it is not already
        return all(tma_ok(t) for t in (q, k, out)) and available()
    return all(tma_ok(t) for t in (q, k, v, out)) and available()


def _layout(block, dtype):
    from triton.experimental.gluon import language as gl
    key = (tuple(block), dtype)
    lay = _LAYOUTS.get(key)
    if lay is None:
        gdt = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv,
               torch.float8_e5m2: gl.float8e5}[dtype]
        lay = _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), gdt)
    return lay


def _desc(t, block):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), _layout(block, t.dtype))


def config_for(d: int, dtype=torch.float16) -> Sm90Config:
    return (_FP8_CONFIGS if is_fp8(dtype) else _CONFIGS)[d]


def smem_bytes(cfg: Sm90Config, d: int, dv: int, elem_bytes: int, out_bytes: int = None) -> int:
    """Shared memory of the kernel: q_slots Q tiles per consumer, `stages` K and V tiles, one O tile per
    consumer when the output dtype is wider than the input (fp8), 1 KB for barriers and alignment (matches the
    compiled kernel's figure within that KB, scripts/inspect_sm90.py)."""
    o = 2 * cfg.block_m * dv * out_bytes if out_bytes and out_bytes != elem_bytes else 0
    return (2 * cfg.q_slots * cfg.block_m * d + cfg.stages * cfg.block_n * (d + dv)) * elem_bytes + o + 1024


def grid_for(cfg: Sm90Config, seqlen_q, num_bh, num_sms):
    tiles = triton.cdiv(seqlen_q, 2 * cfg.block_m) * num_bh
    return (min(tiles, num_sms) if cfg.persistent else tiles,)


def scales(scale, softcap):
    """(sm_scale, softcap_scale, softcap_out) of the kernel: the scale times log2 e goes inside exp2, or the
    softcap maps raw scores to log2 units and exp2 takes them as they are."""
    if softcap > 0:
        return 1.0, scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0, 1.0


# the kernel parameters that change between calls of one launch plan (launcher.KernelLauncher's `varying`)
VARYING = ("q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr", "qd_ptr", "kd_ptr", "vd_ptr", "sm_scale",
           "softcap_scale", "softcap_out", "out_scale")


def kernel_call(q, k, v, out, lse, scale, window_left, window_right, softcap, align_bottom_right, return_lse,
                cfg: Sm90Config = None, programs: int = None, descales=(None, None, None), out_scale=1.0):
    """(kernel, grid, args, kwargs) of the Gluon kernel for validated, supported inputs (fp8: v is the view of
    an fp8.Fp8V). `programs` overrides the number of CTAs (tests: few CTAs walking many tiles). descales: fp8
    descale tensors or Nones; out_scale: the output factor (fp8 v descale as a number)."""
    from .gluon_sm90 import attn_fwd_sm90_kernel
    cfg = cfg or config_for(q.shape[-1], q.dtype)
    batch, seqlen_q, hq, d = q.shape
    seqlen_k, hkv, dv = k.shape[1], k.shape[2], v.shape[-1]
    sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    grid = grid_for(cfg, seqlen_q, batch * hq, hw.device_info(q.device).num_sms)
    if programs is not None:
        grid = (max(1, min(programs, grid[0])),)
    fp8 = is_fp8(q.dtype)
    if fp8:  # v: the view of an Fp8V; the descriptor is over its whole [B, Hkv, Dv, Sk'] buffer
        vt = v.permute(0, 2, 3, 1)
        vt = vt.as_strided(vt.shape[:3] + (packed_pitch(v),), vt.stride())
        v_desc = _desc(vt, [1, 1, dv, cfg.block_n])
    else:
        v_desc = _desc(v, [1, cfg.block_n, 1, dv])
    ds = [d_ if d_ is not None else lse for d_ in descales]  # placeholders, never read without descales
    args = (
        _desc(q, [1, cfg.block_m, 1, d]), _desc(k, [1, cfg.block_n, 1, d]), v_desc,
        _desc(out, [1, cfg.block_m, 1, dv]), lse, *ds, sl[0], sl[1],
        *[st for d_ in descales for st in descale_strides(d_)],
        seqlen_q, seqlen_k, hq, hq // hkv, batch * hq, *scales(scale, softcap), float(out_scale), window_left,
        window_right,
    )
    kwargs = dict(
        BLOCK_M=cfg.block_m, Q_SLOTS=cfg.q_slots, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0, ALIGN_BOTTOM_RIGHT=align_bottom_right,
        HAS_SOFTCAP=softcap > 0, RETURN_LSE=return_lse, REVERSE_M=window_right >= 0,
        HAS_DESCALE=any(d_ is not None for d_ in descales), P_SHIFT=P_SHIFT if fp8 else 0, V_SEQ_MAJOR=fp8,
        SEPARATE_O=out.dtype != q.dtype,
        num_warps=4,
    )
    return attn_fwd_sm90_kernel, grid, args, kwargs


def launch(q, k, v, out, lse, scale, window_left, window_right, softcap, align_bottom_right, return_lse,
           cfg: Sm90Config = None, compile_only=False, programs: int = None):
    """Run (or only compile) the Gluon kernel through Triton's normal launch path; fills out (and lse)."""
    kernel, grid, args, kwargs = kernel_call(q, k, v, out, lse, scale, window_left, window_right, softcap,
                                             align_bottom_right, return_lse, cfg, programs)
    if compile_only:
        return kernel.warmup(*args, grid=grid, **kwargs)
    return kernel[grid](*args, **kwargs)
