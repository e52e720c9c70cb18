"""Host side of dense attention forward for large head dims: configs, grid, arguments.

The dense API sends a problem here when D or Dv is above 256, or when the Gluon kernel serves it (plans.py);
nothing else changes for the caller. Two kernels:
  - on an H100 (sm90, triton 3.6) with no window and no softcap, for Dv >= 512 and for D and Dv in (192, 384]
    (Q resident in shared memory): the Gluon kernel of large_d_sm90.py (supports_sm90, kernel_call_sm90);
  - everywhere else the Triton kernel of large_d_kernels.py. Its shared memory is fixed by the config, not by
    the head dim: num_stages Q and K chunks of BLOCK_K columns, one [BLOCK_N, BLOCK_DV] V tile and the P tile.
"""
from dataclasses import dataclass

import torch
import triton

from ... import hw
from . import launch_sm90
from .launch import MAX_GRID_Y, _forced, _scales, tma_ok

# above this head dim (of Q/K or of V) the large-D kernel serves the problem
LARGE_D_FROM = 257


@dataclass(frozen=True)
class LargeDConfig:
    block_m: int
    block_n: int
    block_k: int  # head-dim columns of one Q K^T step
    block_dv: int  # output columns per program, at most (the slice is min(block_dv, Dv rounded up to a power of 2))
    num_warps: int
    num_stages: int
    block_dv2: int = 0  # a second accumulator's columns: a program's slice is block_dv + block_dv2 columns

    def slice_dv(self, dv: int) -> int:
        return min(self.block_dv, max(16, triton.next_power_of_2(dv)))

    def smem_bytes(self, dv: int, elem_bytes: int) -> int:
        """A lower bound of the kernel's shared memory (Q and K chunks in flight, the V tiles, the P tile): a
        pre-filter; on a GPU the compiled kernel's own figure decides."""
        chunks = max(1, self.num_stages - 1) * (self.block_m + self.block_n) * self.block_k
        v = self.block_n * (self.slice_dv(dv) + self.block_dv2)
        return (chunks + v + self.block_m * self.block_n) * elem_bytes


C = LargeDConfig

# sm90 (H100), per (Dv bucket, causal): Dv up to 320 / 384 / 512 / 768 / 1024 (any Dv <= 256 with D > 256
# takes the first). Chosen by scripts/sweep_large_d.py on the H100 (B=1, H=48, N=8192, fp16, D = Dv, 2026-11-21,
# bench/NOTES.md "Large head dims"), TFLOPS non-causal / causal:
#   D=320  128x128, 256 + 64 columns, 3 stages: 353 / 342 (two slices of 256: 250 / 257)
#   D=384  128x64, 256 + 128 columns, 4 stages: 296 / 301 (128x128, 256 then 128: 272 / 266)
#   D=512  128x128, 2 x 256 columns, 4 stages: 294 / 288
#   D=768  128x128, 3 x 256, 4 stages non-causal 248, 3 stages causal 239 (256 + 128 slices spill: 187-228)
#   D=1024 128x128, 4 x 256, 4 stages non-causal 206, 3 stages causal 198 (256 + 128: 130-171)
_SM90 = {
    (320, False): [C(128, 128, 64, 256, 8, 3, 64)],
    (320, True): [C(128, 128, 64, 256, 8, 3, 64)],
    (384, False): [C(128, 64, 64, 256, 8, 4, 128)],
    (384, True): [C(128, 64, 64, 256, 8, 4, 128)],
    (512, False): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (512, True): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (768, False): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (768, True): [C(128, 128, 64, 256, 8, 3)],
    (1024, False): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (1024, True): [C(128, 128, 64, 256, 8, 3)],
}
_BUCKETS = (320, 384, 512, 768, 1024)
# every budget, small to large; always tried after the table's own candidates
_FALLBACK = [C(64, 64, 64, 128, 4, 2), C(64, 32, 32, 64, 4, 2), C(32, 32, 32, 64, 4, 1)]


def applies(d: int, dv: int) -> bool:
    """Whether the large-D kernel serves head dims (d, dv)."""
    return max(d, dv) >= LARGE_D_FROM


def candidates(arch: int, dv: int, causal: bool, elem_bytes: int, smem_budget: int):
    """Configs for this problem, best first, that fit `smem_budget` bytes by the estimate. Never empty."""
    table = _SM90 if arch >= 90 else {}
    bucket = next(b for b in _BUCKETS if dv <= b)
    out = []
    for cfg in table.get((bucket, causal), []) + _FALLBACK:
        if cfg not in out and cfg.smem_bytes(dv, elem_bytes) <= smem_budget:
            out.append(cfg)
    return out or _FALLBACK[-1:]


# ---- Hopper: the Gluon kernel (large_d_sm90.py) -------------------------------------------------------------

@dataclass(frozen=True)
class LargeDSm90Config:
    block_n: int = 128  # keys per block
    block_k: int = 64  # head-dim columns per ring buffer
    stages: int = 4  # ring buffers (Q chunk halves + K chunk)
    dvs: int = 256  # output columns per CTA (two warpgroups x 64 rows x dvs float32 accumulators)
    consumer_regs: int = 240
    q_resident: bool = False  # the whole Q tile loaded once (D <= 384), the ring holds K chunks only

    def smem_bytes(self, d: int, elem_bytes: int) -> int:
        q = 128 * triton.cdiv(d, self.block_k) * self.block_k if self.q_resident else self.stages * 128 * self.block_k
        return (q + self.stages * self.block_n * self.block_k + self.block_n * self.dvs) * elem_bytes + 1024


# Measured on the H100 (fp16, D = Dv, TFLOPS non-causal / causal, outputs checked; scripts/sweep_large_d.py --sm90
# and scripts/dev_large_d_sm90.py; bench/NOTES.md "Large head dims"). Dv >= 512, B=1, H=48, N=8192: D=512 413 / 388,
# D=1024 266 / 248 (2026-11-21, after the P V / scores wgmmas stopped overlapping in a warpgroup, which had made
# ptxas serialize every wgmma: 373 / 338 and 234 / 221 before; the Triton kernel 295 / 290 and 209 / 198). 5 ring
# buffers: no better. 64-key blocks with P V(b - 1) issued after the scores of b (no serialization at that size)
# and one or two V buffers: 0.60-0.98 of this config at D = 512 and 1024.
SM90 = LargeDSm90Config()
# D and Dv in (192, 384]: the whole Q tile resident (at most 96 KB), a ring of 4 K chunks, one V tile (at D=256
# 192 KB, cuDNN's plan); Dv > 256 takes two slices. Same run, 2026-11-21: D=256 against cuDNN, B=1, H=48, N=8K
# 0.96 / 0.94 and B=1, H=8, N=16K 0.89 / 1.05 (the dense kernels: 0.82 / 0.75 and 0.74 / 0.83; 64-key blocks with 8
# ring buffers and two V buffers: 0.85-0.98). Against the Triton kernel at H=48, N=8K: D=384 376 / 369 TFLOPS vs
# 295 / 300, D=320 355 / 349 vs 354 / 345 (Q streamed through the ring: 351 / 311 and 311 / 288).
SM90_Q_RESIDENT = LargeDSm90Config(q_resident=True)
Q_RESIDENT_DIMS = (193, 384)  # D and Dv both in this range


def sm90_config(d: int, dv: int) -> LargeDSm90Config:
    """The Gluon kernel's config for head dims (d, dv)."""
    return SM90_Q_RESIDENT if max(d, dv) <= Q_RESIDENT_DIMS[1] else SM90


# the parameters that change between calls of one plan
VARYING_SM90 = ("q_desc", "k_desc", "v_desc", "O", "LSE", "sm_scale")


def supports_sm90(q, k, v, out, varlen, scale, window_left, window_right, softcap) -> bool:
    """Whether the Gluon kernel serves this problem: an sm90 GPU with triton 3.6 (launch_sm90.available), 16-bit
    batched inputs aligned for TMA, Dv >= 512 or D and Dv both in (192, 384] (the rest keeps the Triton kernel
    with its second accumulator), no window or softcap (causal is a right bound of 0), B * Hq within the grid's
    y limit. TILEATTN_SM90=0 or a forced config (force_config) keeps the other kernels."""
    if _forced.cfg is not None or varlen or not hw.sm90_kernels(q.device):
        return False
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False
    d, dv = q.shape[-1], v.shape[-1]
    if not (dv >= 512 or Q_RESIDENT_DIMS[0] <= min(d, dv) and max(d, dv) <= Q_RESIDENT_DIMS[1]):
        return False
    if window_left >= 0 or window_right > 0 or softcap > 0 or scale <= 0:
        return False
    if q.shape[0] * q.shape[2] > MAX_GRID_Y or min(q.shape[1], k.shape[1]) == 0:
        return False
    if sm90_config(d, dv).smem_bytes(d, q.element_size()) > hw.device_info(q.device).smem_per_block:
        return False
    return all(tma_ok(t) and t.stride(-1) == 1 for t in (q, k, v)) and launch_sm90.available()


def kernel_call_sm90(q, k, v, out, lse, scale, causal, align_bottom_right, return_lse, cfg=None):
    """(kernel, grid, args, kwargs) of the Gluon kernel for supported inputs, with cfg or sm90_config's."""
    from .large_d_sm90 import attn_fwd_large_d_sm90_kernel
    from .kernels import LOG2E
    batch, seqlen_q, hq, d = q.shape
    seqlen_k, hkv, dv = k.shape[1], k.shape[2], v.shape[-1]
    cfg = cfg or sm90_config(d, dv)
    num_slices = triton.cdiv(dv, cfg.dvs)
    sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    grid = (triton.cdiv(seqlen_q, 128) * num_slices, batch * hq)
    desc = launch_sm90._desc
    args = (desc(q, [1, 64, 1, cfg.block_k]), desc(k, [1, cfg.block_n, 1, cfg.block_k]),
            desc(v, [1, cfg.block_n, 1, cfg.dvs]), out, lse, out.stride(0), out.stride(1), out.stride(2), *sl,
            seqlen_q, seqlen_k, hq, hq // hkv, scale * LOG2E)
    kwargs = dict(D=d, DV=dv, NUM_SLICES=num_slices, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
                  CAUSAL=causal, ALIGN_BOTTOM_RIGHT=align_bottom_right, RETURN_LSE=return_lse, REVERSE_M=causal,
                  Q_RESIDENT=cfg.q_resident, num_warps=4)
    return attn_fwd_large_d_sm90_kernel, grid, args, kwargs


class Sm90Launcher:
    """A plan's launcher for the Gluon kernel, called with the dense kernel's values (plans._forward)."""
    __slots__ = ("launcher", )

    def __init__(self, launcher):
        self.launcher = launcher

    def __call__(self, grid, q, k, v, out, lse, qd, kd, vd, qk_scale, softcap_scale, softcap_out, out_scale):
        self.launcher(grid, q, k, v, out, lse, qk_scale)


_choice_cache = {}


def choose_config(q, v, causal, run):
    """forced (force_config with a LargeDConfig) > the first candidate whose compiled shared memory fits the
    device's budget (or the emulated one, TILEATTN_SMEM_BUDGET). Cached per (device, dtype, Dv, causal,
    budget). causal: the mask has a right bound."""
    forced = _forced.cfg
    if isinstance(forced, LargeDConfig):
        return forced
    info = hw.device_info(q.device)
    key = (q.device, q.dtype, v.shape[-1], causal, info.smem_per_block)
    cfg = _choice_cache.get(key)
    if cfg is None:
        cands = candidates(info.arch, v.shape[-1], causal, q.element_size(), info.smem_per_block)
        if q.device.type == "cuda":
            cfg = next((c for c in cands if run(c, compile_only=True).metadata.shared <= info.smem_per_block),
                       cands[-1])
        else:
            cfg = cands[0]
        _choice_cache[key] = cfg
    return cfg


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


def _cover(dv, w, w2):
    """Slices of w + w2 columns, then one narrower last slice for the remainder (its own launch)."""
    full, rem = divmod(dv, w + w2)
    out = [(0, w, w2, full)] if full else []
    if rem:
        last = (min(_pow2(rem), w), 0) if rem <= w else (w, _pow2(rem - w))
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


def kernel_call(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left,
                window_right, softcap, align_bottom_right, return_lse, cfg: LargeDConfig):
    """[(grid, args, kwargs)] of attn_fwd_large_d_kernel for validated inputs and this config: one launch per
    entry of slices(), run in order."""
    varlen = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    hq, hkv, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if varlen:
        sq, sk, sv, so = ((0,) + tuple(t.stride()) for t in (q, k, v, out))
        sl = (0, lse.stride(0)) if return_lse else (0, 0)
    else:
        sq, sk, sv, so = (t.stride() for t in (q, k, v, out))
        sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    num_bh = batch * hq
    calls = []
    for dv_start, block_dv, block_dv2, count in slices(dv, cfg):
        grid = (triton.cdiv(max(seqlen_q, 1), cfg.block_m) * count, min(num_bh, MAX_GRID_Y),
                triton.cdiv(num_bh, MAX_GRID_Y))
        args = (q, k, v, out, lse,
                sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], so[0], so[1], so[2], sl[0], sl[1],
                cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, hq, hq // hkv, num_bh,
                *_scales(scale, softcap), window_left, window_right)
        kwargs = dict(
            D=d, DV=dv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DV_START=dv_start,
            BLOCK_DV=block_dv, BLOCK_DV2=block_dv2, NUM_SLICES=count, HAS_LEFT=window_left >= 0,
            HAS_RIGHT=window_right >= 0, ALIGN_BOTTOM_RIGHT=align_bottom_right, HAS_SOFTCAP=softcap > 0,
            IS_VARLEN=varlen, RETURN_LSE=return_lse and dv_start == 0, REVERSE_M=window_right >= 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
        calls.append((grid, args, kwargs))
    return calls


# the kernel parameters that change between calls of one plan (KernelLauncher's `varying`)
VARYING = ("Q", "K", "V", "O", "LSE", "qk_scale", "softcap_scale", "softcap_out")
VARYING_VARLEN = VARYING + ("cu_seqlens_q", "cu_seqlens_k")


class PlanLauncher:
    """A plan's launcher: one KernelLauncher per launch of kernel_call, called in order with the dense kernel's
    values (plans._forward), less the fp8 descales and the output scale, which large head dims never have."""
    __slots__ = ("grids", "launchers")

    def __init__(self, grids, launchers):
        self.grids, self.launchers = grids, launchers

    def __call__(self, grid, q, k, v, out, lse, qd, kd, vd, qk_scale, softcap_scale, softcap_out, out_scale,
                 *cu_seqlens):
        for g, launcher in zip(self.grids, self.launchers):
            launcher(g, q, k, v, out, lse, qk_scale, softcap_scale, softcap_out, *cu_seqlens)


def _launch_fn(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left,
               window_right, softcap, align_bottom_right, return_lse):
    """launch(cfg, compile_only=False) through Triton's normal path (compile_only: returns the compiled kernel
    of the first launch, whose .metadata.shared is the shared memory; a tail launch needs no more)."""
    from .large_d_kernels import attn_fwd_large_d_kernel

    def launch(cfg, compile_only=False):
        calls = kernel_call(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left,
                            window_right, softcap, align_bottom_right, return_lse, cfg)
        if compile_only:
            grid, args, kwargs = calls[0]
            return attn_fwd_large_d_kernel.warmup(*args, grid=grid, **kwargs)
        for grid, args, kwargs in calls:
            attn_fwd_large_d_kernel[grid](*args, **kwargs)

    return launch


def plan(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left, window_right,
         softcap, align_bottom_right, return_lse):
    """(grid, launcher, cfg) of a launch plan (plans.py; the launcher carries its own grids), or None when neither
    large-D kernel serves the problem (head dims up to 256 the Gluon kernel does not take). The config is chosen
    here (sm90_config, choose_config)."""
    from .large_d_kernels import attn_fwd_large_d_kernel
    from ...launcher import KernelLauncher
    if supports_sm90(q, k, v, out, cu_seqlens_q is not None, scale, window_left, window_right, softcap):
        cfg = sm90_config(q.shape[-1], v.shape[-1])
        kernel, grid, a, kw = kernel_call_sm90(q, k, v, out, lse, scale, window_right == 0, align_bottom_right,
                                               return_lse, cfg)
        return grid, Sm90Launcher(KernelLauncher(kernel, a, kw, VARYING_SM90)), cfg
    if not applies(q.shape[-1], v.shape[-1]):
        return None
    args = (q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left, window_right,
            softcap, align_bottom_right, return_lse)
    cfg = choose_config(q, v, window_right >= 0, _launch_fn(*args))
    calls = kernel_call(*args, cfg)
    varying = VARYING_VARLEN if cu_seqlens_q is not None else VARYING
    launcher = PlanLauncher([g for g, _, _ in calls],
                            [KernelLauncher(attn_fwd_large_d_kernel, a, kw, varying) for _, a, kw in calls])
    return calls[0][0], launcher, cfg


def compiled(q, k, v, causal=False, cfg=None):
    """The compiled large-D kernel (first launch) for these batched inputs, with the chosen config or cfg:
    .metadata.shared is its shared memory, .n_regs / .n_spills its registers. Compiles, never runs."""
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    lse = torch.empty(0, dtype=torch.float32, device=q.device)
    args = (q, k, v, out, lse, None, None, q.shape[1], k.shape[1], q.shape[-1] ** -0.5, -1, 0 if causal else -1,
            0.0, True, False)
    launch = _launch_fn(*args)
    return launch(cfg or choose_config(q, v, causal, launch), compile_only=True)
