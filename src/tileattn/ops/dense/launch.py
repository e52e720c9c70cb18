"""Host side of dense attention forward: config choice, grid, kernel arguments, launch (normal path).

Input checks live in checks.py. Launches go through plans (plans.py): the first call of a problem checks its
tensors, chooses the config and launches through Triton's normal path; a repeated call checks the options,
allocates the outputs and replays the compiled kernel (tileattn.launcher). _prepare() and compiled_smem()
keep the normal path.
"""
import contextlib
import json
import os
import threading

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import hw
from .checks import check_cu_seqlens, effective_window  # noqa: F401  (effective_window: for scripts/)
from .configs import AttnConfig, candidates, seq_bucket
from .fp8 import P_SHIFT, descale_strides, is_fp8
from .kernels import LOG2E, attn_fwd_kernel


# ---------------------------------------------------------------------------------------------------------
# config choice
# ---------------------------------------------------------------------------------------------------------
class _Forced(threading.local):
    cfg = None  # a class default: reading an unset thread-local attribute raises inside getattr (~0.5 us)


_forced = _Forced()
_autotune_cache = {}
_AUTOTUNE_FILE = os.path.join(os.path.expanduser(os.environ.get("TILEATTN_CACHE_DIR", "~/.cache/tileattn")),
                              "autotune-dense.json")


@contextlib.contextmanager
def force_config(cfg: AttnConfig):
    """Use `cfg` for every launch inside the block (tests and config sweeps)."""
    prev = _forced.cfg
    _forced.cfg = cfg
    try:
        yield
    finally:
        _forced.cfg = prev


def autotune_enabled() -> bool:
    """Opt-in with TILEATTN_AUTOTUNE=1: time every fitting candidate once per problem key, cache the winner
    in memory and in ~/.cache/tileattn/autotune-dense.json (TILEATTN_CACHE_DIR moves it)."""
    return os.environ.get("TILEATTN_AUTOTUNE", "0") not in ("", "0")


def _load_autotune_file():
    if not _autotune_cache and os.path.exists(_AUTOTUNE_FILE):
        try:
            with open(_AUTOTUNE_FILE) as f:
                for key, val in json.load(f).items():
                    _autotune_cache[key] = AttnConfig(**val)
        except (OSError, ValueError, TypeError):
            pass  # a damaged cache is ignored, never trusted


def _save_autotune_file():
    try:
        os.makedirs(os.path.dirname(_AUTOTUNE_FILE), exist_ok=True)
        with open(_AUTOTUNE_FILE, "w") as f:
            json.dump({k: vars(c) for k, c in _autotune_cache.items()}, f, indent=1)
    except OSError:
        pass


def _pow2(d):
    return max(16, triton.next_power_of_2(d))


_choice_cache = {}


def choose_config(q, v, causal, seqlen_q, variant, run, smem_of):
    """The config for this problem: forced > autotuned (opt-in) > first table entry that fits.

    "Fits" means the compiled kernel's shared memory (smem_of(cfg), read from the compiler on a GPU; the
    estimate under the interpreter) is within the device's budget, or the emulated one. The choice is cached
    per problem key, so later calls skip this work.
    """
    forced = _forced.cfg
    if forced is not None:
        return forced
    info = hw.device_info(q.device)
    bd, bdv = _pow2(q.shape[-1]), _pow2(v.shape[-1])
    key = (q.device, q.dtype, bd, bdv, causal, seq_bucket(seqlen_q), info.smem_per_block, variant,
           autotune_enabled())
    cfg = _choice_cache.get(key)
    if cfg is not None:
        return cfg
    cands = candidates(info.arch, bd, bdv, causal, q.element_size(), info.smem_per_block, seqlen_q)
    if is_fp8(q.dtype):  # fp8 tensor-core products take 32 keys at a time
        cands = [c for c in cands if c.block_n >= 32] or [AttnConfig(32, 32, 4, 1)]
    on_gpu = q.device.type == "cuda"
    fits = (lambda c: smem_of(c) <= info.smem_per_block) if on_gpu else (lambda c: True)
    if not autotune_enabled() or not on_gpu:
        cfg = next((c for c in cands if fits(c)), cands[-1])
    else:
        cfg = _autotune([c for c in cands if fits(c)] or cands[-1:], key, run)
    _choice_cache[key] = cfg
    return cfg


def _autotune(cands, key, run):
    skey = "-".join(str(x) for x in key)
    _load_autotune_file()
    if skey not in _autotune_cache:
        best, best_ms = None, float("inf")
        for cfg in cands:
            try:
                ms = triton.testing.do_bench(lambda: run(cfg), warmup=5, rep=20, return_mode="median")
            except Exception:  # a candidate that fails to compile or launch is skipped, not fatal
                continue
            if ms < best_ms:
                best, best_ms = cfg, ms
        _autotune_cache[skey] = best or cands[0]
        _save_autotune_file()
    return _autotune_cache[skey]


# ---------------------------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------------------------
def tma_ok(t):
    """Tensor descriptors need a non-empty tensor with 16-byte aligned base and strides."""
    es = t.element_size()
    return t.numel() > 0 and t.data_ptr() % 16 == 0 and all((s * es) % 16 == 0 for s in t.stride()[:-1])


def _descriptor(t, block_n, block_d, varlen):
    if varlen:  # [total, H, D]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [block_n, 1, block_d])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block_n, 1, block_d])


def _out_layout(q, v_head_dim, varlen):
    """(shape to allocate, head_major): a head-major q ([B, H, S, D] seen through a transpose, as
    scaled_dot_product_attention passes it) gets a head-major output, allocated [B, H, S, Dv] and returned
    transposed, so the result is contiguous in torch's layout."""
    shape = tuple(q.shape[:-1]) + (v_head_dim,)
    if not varlen and q.dim() == 4 and q.stride(1) < q.stride(2):
        B, S, H, _ = shape
        return (B, H, S, v_head_dim), True
    return shape, False


def _lse_shape(q, varlen):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _out_shape_strides(q, v_head_dim, varlen):
    """Shape and strides of alloc_out's result, without allocating."""
    shape, head_major = _out_layout(q, v_head_dim, varlen)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    if head_major:  # allocated [B, H, S, Dv], seen as [B, S, H, Dv]
        return (shape[0], shape[2], shape[1], shape[3]), (strides[0], strides[2], strides[1], strides[3])
    return shape, tuple(strides)


def alloc_out(q, v_head_dim, varlen, dtype=None):
    """Output in q's layout family: [B, Sq, Hq, Dv] (see _out_layout for head-major inputs), in `dtype`
    (default q's)."""
    shape, head_major = _out_layout(q, v_head_dim, varlen)
    out = torch.empty(shape, dtype=dtype or q.dtype, device=q.device)
    return out.transpose(1, 2) if head_major else out


def alloc_lse(q, varlen, return_lse):
    shape = _lse_shape(q, varlen) if return_lse else (0,)
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def _debug_fill():
    return os.environ.get("TILEATTN_DEBUG_FILL_NAN", "0") not in ("", "0")


def _scales(scale, softcap):
    """(qk_scale, softcap_scale, softcap_out) of the kernel: scores in log2 units, plain or capped."""
    if softcap > 0:
        return scale * LOG2E, scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0, 1.0


# CUDA's limit on a grid's y (and z) size: the batch-head index of attn_fwd_kernel is folded over y and z
MAX_GRID_Y = 65535


def _kernel_call(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left,
                 window_right, softcap, align_bottom_right, return_lse, cfg, descales=(None, None, None),
                 out_scale=1.0, v_packed=False):
    """(grid, args, kwargs) of attn_fwd_kernel for these tensors, options and config. descales: fp8 q/k/v
    descale tensors ([B, Hkv] or one element) or Nones; out_scale: the output factor (fp8 v descale);
    v_packed: v is the view of an fp8.Fp8V (keys in packed order)."""
    varlen = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    hq, hkv, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    bd, bdv = _pow2(d), _pow2(dv)
    if varlen:
        sq, sk, sv, so = ((0,) + tuple(t.stride()) for t in (q, k, v, out))
        stride_vd = v.stride(2)
        sl = (0, lse.stride(0)) if return_lse else (0, 0)
    else:
        sq, sk, sv, so = (t.stride() for t in (q, k, v, out))
        stride_vd = v.stride(3)
        sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    use_tma = cfg.use_tma and tma_ok(k) and tma_ok(v) and stride_vd == 1
    if use_tma:
        k_arg = _descriptor(k, cfg.block_n, bd, varlen)
        v_arg = _descriptor(v, cfg.block_n, bdv, varlen)
    else:
        k_arg, v_arg = k, v
    qk_scale, softcap_scale, softcap_out = _scales(scale, softcap)
    num_bh = batch * hq
    grid = (triton.cdiv(max(seqlen_q, 1), cfg.block_m), min(num_bh, MAX_GRID_Y), triton.cdiv(num_bh, MAX_GRID_Y))
    has_descale = any(d is not None for d in descales)
    ds = [d if d is not None else lse for d in descales]  # unread placeholders without descales
    dstr = [s for d in descales for s in descale_strides(d)]
    args = (q, k_arg, v_arg, out, lse, *ds,
            sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], stride_vd, so[0], so[1], so[2],
            sl[0], sl[1], *dstr,
            cu_seqlens_q, cu_seqlens_k,
            seqlen_q, seqlen_k, hq, hq // hkv, num_bh,
            qk_scale, softcap_scale, softcap_out, float(out_scale), window_left, window_right)
    kwargs = dict(
        D=d, DV=dv, BLOCK_D=bd, BLOCK_DV=bdv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
        ALIGN_BOTTOM_RIGHT=align_bottom_right, HAS_SOFTCAP=softcap > 0, IS_VARLEN=varlen,
        RETURN_LSE=return_lse, USE_TMA=use_tma, WARP_SPECIALIZE=cfg.warp_specialize and use_tma,
        REVERSE_M=window_right >= 0, PIPELINE_QK=cfg.pipeline_qk and not cfg.warp_specialize,
        HAS_DESCALE=has_descale, P_SHIFT=P_SHIFT if is_fp8(v.dtype) else 0,
        ROUND_P=is_fp8(v.dtype) and hw.interpreter_enabled(), V_PACKED=v_packed,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if cfg.num_ctas != 1:  # only passed when used: the interpreter and older GPUs know no clusters
        kwargs["num_ctas"] = cfg.num_ctas
    return grid, args, kwargs


# the kernel parameters that change between calls of one plan (KernelLauncher's `varying`), in the order
# plans._forward passes them; everything else is fixed by the plan key
_VARYING = ("Q", "K", "V", "O", "LSE", "QD", "KD", "VD", "qk_scale", "softcap_scale", "softcap_out", "out_scale")
_VARYING_VARLEN = _VARYING + ("cu_seqlens_q", "cu_seqlens_k")


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
             window_right, softcap, align_bottom_right, return_lse):
    """Check cu_seqlens values, allocate the outputs, choose the config.

    Returns (out, lse, run, cfg); run(cfg, compile_only=False) launches (or only compiles) the kernel through
    Triton's normal path, and run is None when there is nothing to compute (the outputs are then final).
    """
    varlen = cu_seqlens_q is not None
    if varlen:
        check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
    out = alloc_out(q, v.shape[-1], varlen)
    lse = alloc_lse(q, varlen, return_lse)
    if _debug_fill():
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    if out.numel() == 0:
        return out, lse, None, None
    if not varlen and k.shape[1] == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse, None, None
    run, cfg = _choose(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                       window_left, window_right, softcap, align_bottom_right, return_lse)
    return out, lse, run, cfg


def _seqlens(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
    """(seqlen_q, seqlen_k) as the kernel takes them: the maxima for varlen."""
    return (max_seqlen_q, max_seqlen_k) if cu_seqlens_q is not None else (q.shape[1], k.shape[1])


def _choose(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
            window_right, softcap, align_bottom_right, return_lse, descales=(None, None, None), out_scale=1.0,
            v_packed=False):
    """(run, cfg): the config for this problem (choose_config) and run(cfg, compile_only=False)."""
    seqlen_q, seqlen_k = _seqlens(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k)

    def run(cfg, compile_only=False):
        grid, args, kwargs = _kernel_call(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k,
                                          scale, window_left, window_right, softcap, align_bottom_right,
                                          return_lse, cfg, descales, out_scale, v_packed)
        if compile_only:
            return attn_fwd_kernel.warmup(*args, grid=grid, **kwargs)
        return attn_fwd_kernel[grid](*args, **kwargs)

    def smem_of(cfg):
        return run(cfg, compile_only=True).metadata.shared

    variant = (window_left >= 0, softcap > 0, cu_seqlens_q is not None, return_lse, align_bottom_right)
    return run, choose_config(q, v, window_right >= 0, seqlen_q, variant, run, smem_of)


def compiled_smem(q, k, v, causal=False):
    """Shared memory of the kernel chosen for these (batched, full or causal) inputs; compiles, never runs."""
    _, _, run, cfg = _prepare(q, k, v, None, None, 0, 0, q.shape[-1] ** -0.5, -1, 0 if causal else -1, 0.0,
                              True, False)
    return run(cfg, compile_only=True).metadata.shared
