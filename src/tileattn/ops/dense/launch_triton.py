"""Backend "dense.triton": the portable Triton kernel (kernels.py) on any GPU, and the CPU interpreter.

Config choice: forced (tileattn.force_backend(config=AttnConfig(...))) > autotuned (TILEATTN_AUTOTUNE=1) > the
first entry of configs.triton_candidates whose compiled shared memory fits the device's budget (or the emulated
one, TILEATTN_SMEM_BUDGET). The choice is cached per kind of problem.
"""
import json
import os

import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import hw, knobs
from ...launcher import KernelLauncher
from ..common.backend import Backend, forced_config
from ..common.fp8 import P_SHIFT, descale_strides
from ..common.softmax import LOG2E
from ..common.tma import tma_ok
from .configs import AttnConfig, seq_bucket, triton_candidates
from .kernels import attn_fwd_kernel

# CUDA's limit on a grid's y (and z) size: the batch-head index of the kernels is folded over y and z
MAX_GRID_Y = 65535
MAX_HEAD_DIM = 256  # the kernel holds a whole head dim per tile; larger ones take the large-D backends


def scales(scale, softcap):
    """(qk_scale, softcap_scale, softcap_out) of the kernel: scores in log2 units, plain or capped."""
    if softcap > 0:
        return scale * LOG2E, scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0, 1.0


def block_dim(d):
    """A head dim (or a slice width) rounded up to a power of two, at least 16: a tile's width."""
    return max(16, triton.next_power_of_2(d))


# ---------------------------------------------------------------------------------------------------------
# config choice
# ---------------------------------------------------------------------------------------------------------
_choice_cache = {}
_autotune_cache = {}


def _autotune_file():
    return os.path.join(knobs.cache_dir(), "autotune-dense.json")


def _load_autotune_file():
    if not _autotune_cache and os.path.exists(_autotune_file()):
        try:
            with open(_autotune_file()) as f:
                for key, val in json.load(f).items():
                    _autotune_cache[key] = AttnConfig(**val)
        except (OSError, ValueError, TypeError):
            pass  # a damaged cache is ignored, never trusted


def _save_autotune_file():
    try:
        os.makedirs(os.path.dirname(_autotune_file()), exist_ok=True)
        with open(_autotune_file(), "w") as f:
            json.dump({k: vars(c) for k, c in _autotune_cache.items()}, f, indent=1)
    except OSError:
        pass


def choose_config(p, c):
    """The config for problem p (run on call c when autotuning): forced > autotuned (opt-in) > the first
    candidate that fits. "Fits": the compiled kernel's shared memory (read from the compiler on a GPU; the
    estimate under the interpreter) is within the device's budget."""
    forced = forced_config(AttnConfig)
    if forced is not None:
        return forced
    info = hw.device_info(p.device)
    bd, bdv = block_dim(p.head_dim), block_dim(p.head_dim_v)
    causal = p.right >= 0
    variant = (p.left >= 0, p.opts.softcap > 0, p.varlen, p.opts.return_lse, p.opts.bottom_right)
    key = (p.device, p.dtype, bd, bdv, causal, seq_bucket(p.seqlen_q), info.smem_per_block, variant,
           knobs.autotune())
    cfg = _choice_cache.get(key)
    if cfg is not None:
        return cfg
    cands = triton_candidates(info.arch, bd, bdv, causal, p.elem_bytes, info.smem_per_block, p.seqlen_q)
    if p.fp8:  # fp8 tensor-core products take 32 keys at a time
        cands = [x for x in cands if x.block_n >= 32] or [AttnConfig(32, 32, 4, 1)]
    on_gpu = p.device.type == "cuda"

    def fits(x):
        return not on_gpu or kernel_call(p, c, x).compile(c).metadata.shared <= info.smem_per_block
    if not knobs.autotune() or not on_gpu:
        cfg = next((x for x in cands if fits(x)), cands[-1])
    else:
        cfg = _autotune([x for x in cands if fits(x)] or cands[-1:], key, p, c)
    _choice_cache[key] = cfg
    return cfg


def _autotune(cands, key, p, c):
    skey = "-".join(str(x) for x in key)
    _load_autotune_file()
    if skey not in _autotune_cache:
        best, best_ms = None, float("inf")
        for cfg in cands:
            try:
                launch = kernel_call(p, c, cfg)
                ms = triton.testing.do_bench(lambda: launch.run(c), warmup=5, rep=20, return_mode="median")
            except Exception:  # noqa: BLE001 - a candidate that fails to compile or launch is skipped, not fatal
                continue
            if ms < best_ms:
                best, best_ms = cfg, ms
        _autotune_cache[skey] = best or cands[0]
        _save_autotune_file()
    return _autotune_cache[skey]


# ---------------------------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------------------------
def _descriptor(t, block_n, block_d, varlen):
    if varlen:  # [total, H, D]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [block_n, 1, block_d])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block_n, 1, block_d])


# the kernel parameters that change between calls of one plan (KernelLauncher's `varying`), in TritonLaunch's
# order; everything else is fixed by the plan key
VARYING = ("Q", "K", "V", "O", "LSE", "QD", "KD", "VD", "qk_scale", "softcap_scale", "softcap_out", "out_scale")
VARYING_VARLEN = VARYING + ("cu_seqlens_q", "cu_seqlens_k")


class TritonLaunch:
    """A planned launch of attn_fwd_kernel: run(c) launches it on call c's tensors and values."""
    __slots__ = ("grid", "launcher", "varlen")

    def __init__(self, grid, launcher, varlen):
        self.grid, self.launcher, self.varlen = grid, launcher, varlen

    def _values(self, c):
        qd, kd, vd = c.descales if c.descales is not None else (c.lse, c.lse, c.lse)
        vals = (c.q, c.k, c.v, c.out, c.lse, qd, kd, vd, *scales(c.scale, c.softcap), c.out_scale)
        return vals + (c.cu_q, c.cu_k) if self.varlen else vals

    def run(self, c):
        self.launcher(self.grid, *self._values(c))

    def compile(self, c):
        """The compiled kernel (no launch): .metadata.shared is its shared memory."""
        return self.launcher.compile(self.grid, *self._values(c))


def kernel_call(p, c, cfg):
    """The TritonLaunch of attn_fwd_kernel for problem p, with call c's tensors as the example, and config cfg."""
    q, k, v, out, lse = c.q, c.k, c.v, c.out, c.lse
    varlen, return_lse = p.varlen, p.opts.return_lse
    left, right = p.opts.window
    bd, bdv = block_dim(p.head_dim), block_dim(p.head_dim_v)
    if varlen:
        sq, sk, sv, so = ((0,) + tuple(t.stride()) for t in (q, k, v, out))
        stride_vd = v.stride(2)
        sl = (0, lse.stride(0)) if return_lse else (0, 0)
    else:
        sq, sk, sv, so = (t.stride() for t in (q, k, v, out))
        stride_vd = v.stride(3)
        sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    use_tma = cfg.use_tma and tma_ok(k) and tma_ok(v) and stride_vd == 1
    k_arg, v_arg = (_descriptor(k, cfg.block_n, bd, varlen), _descriptor(v, cfg.block_n, bdv, varlen)) if use_tma \
        else (k, v)
    num_bh = p.batch * p.heads_q
    grid = (triton.cdiv(max(p.seqlen_q, 1), cfg.block_m), min(num_bh, MAX_GRID_Y), triton.cdiv(num_bh, MAX_GRID_Y))
    descales = c.descales or (None, None, None)
    ds = [d if d is not None else lse for d in descales]  # unread placeholders without descales
    args = (q, k_arg, v_arg, out, lse, *ds,
            sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], stride_vd, so[0], so[1], so[2],
            sl[0], sl[1], *[s for d in descales for s in descale_strides(d)],
            c.cu_q, c.cu_k,
            p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_q // p.heads_kv, num_bh,
            *scales(c.scale, c.softcap), float(c.out_scale), left, right)
    kwargs = dict(
        D=p.head_dim, DV=p.head_dim_v, BLOCK_D=bd, BLOCK_DV=bdv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
        ALIGN_BOTTOM_RIGHT=p.opts.bottom_right, HAS_SOFTCAP=c.softcap > 0, IS_VARLEN=varlen,
        RETURN_LSE=return_lse, USE_TMA=use_tma, WARP_SPECIALIZE=cfg.warp_specialize and use_tma,
        REVERSE_M=right >= 0, PIPELINE_QK=cfg.pipeline_qk and not cfg.warp_specialize,
        HAS_DESCALE=p.descale, P_SHIFT=P_SHIFT if p.fp8 else 0,
        ROUND_P=p.fp8 and hw.interpreter_enabled(), V_PACKED=p.opts.v_packed,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.num_ctas != 1:  # only passed when used: the interpreter and older GPUs know no clusters
        kwargs["num_ctas"] = cfg.num_ctas
    return TritonLaunch(grid, KernelLauncher(attn_fwd_kernel, args, kwargs, VARYING_VARLEN if varlen else VARYING),
                        varlen)


class TritonBackend(Backend):
    """Any GPU (and the interpreter), every option: head dims up to 256, batched or varlen, 16-bit or fp8 (any
    V layout)."""
    name = "dense.triton"

    def supports(self, p):
        if max(p.head_dim, p.head_dim_v) > MAX_HEAD_DIM:
            return False, f"head dims above {MAX_HEAD_DIM} (D={p.head_dim}, Dv={p.head_dim_v}) take the large-D kernels"
        return True, ""

    def plan(self, p, c):
        return kernel_call(p, c, choose_config(p, c))
