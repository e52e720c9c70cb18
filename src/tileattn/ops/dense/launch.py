"""Host side of dense attention forward: input checks, config choice, grid, launch.

check_inputs() does every check that needs no tensor values (it is safe under torch.compile tracing);
check_cu_seqlens() reads the cumulative lengths (one small device-to-host copy) and runs inside the custom op.
"""
import contextlib
import json
import math
import os
import threading

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ... import hw
from .configs import AttnConfig, candidates, seq_bucket
from .kernels import LOG2E, attn_fwd_kernel

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256


# ---------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------
def _check_tensor(name, t, ndim, layout):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride(-1) == 1), got "
                         f"strides {t.stride()}")


def _check_head_dim(name, d):
    if d % 8 != 0 or not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name} head dim must be a multiple of 8 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {d}")


def check_device(*tensors):
    dev = tensors[0].device
    for name, t in zip(("k", "v", "cu_seqlens_q", "cu_seqlens_k"), tensors[1:]):
        if t is not None and t.device != dev:
            raise ValueError(f"all tensors must be on one device: q is on {dev}, {name} on {t.device}")
    if dev.type == "cpu" and not hw.interpreter_enabled():
        raise ValueError("q, k, v are CPU tensors: tileattn runs on CUDA devices, or on the CPU only through "
                         "the Triton interpreter (set TRITON_INTERPRET=1 before importing triton)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device type {dev.type!r} for q, k, v")


def check_options(causal, scale, window, softcap):
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0):
        raise ValueError(f"scale must be a finite non-zero number or None, got {scale!r}")
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and not isinstance(w, bool) for w in window)):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    if window[0] < -1 or window[1] < -1:
        raise ValueError(f"window bounds must be >= 0, or -1 for unbounded, got {tuple(window)}")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0 disables it), got {softcap!r}")


def check_inputs(q, k, v, *, varlen):
    """Shape / dtype / layout / device checks. Raises TypeError or ValueError naming the argument."""
    ndim = 3 if varlen else 4
    lay_q = "[total_q, Hq, D]" if varlen else "[B, Sq, Hq, D]"
    lay_k = "[total_k, Hkv, D]" if varlen else "[B, Sk, Hkv, D]"
    lay_v = "[total_k, Hkv, Dv]" if varlen else "[B, Sk, Hkv, Dv]"
    _check_tensor("q", q, ndim, lay_q)
    _check_tensor("k", k, ndim, lay_k)
    _check_tensor("v", v, ndim, lay_v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not varlen and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on sequence length and heads")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}) must be a positive multiple of the number of "
                         f"key/value heads ({hkv})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    _check_head_dim("q/k", q.shape[-1])
    _check_head_dim("v", v.shape[-1])


def check_cu_seqlens(cu_q, cu_k, total_q, total_k, max_q, max_k):
    """Checks of the cumulative lengths that need their values (one device-to-host copy)."""
    for name, cu, total, mx in (("cu_seqlens_q", cu_q, total_q, max_q), ("cu_seqlens_k", cu_k, total_k, max_k)):
        vals = cu.tolist()
        if vals[0] != 0:
            raise ValueError(f"{name} must start at 0, got {vals[0]}")
        lens = [b - a for a, b in zip(vals[:-1], vals[1:])]
        if any(n < 0 for n in lens):
            raise ValueError(f"{name} must be non-decreasing, got {vals}")
        if vals[-1] > total:
            raise ValueError(f"{name}[-1] = {vals[-1]} exceeds the packed length {total}")
        if lens and max(lens) > mx:
            raise ValueError(f"max_seqlen {mx} is smaller than the longest sequence in {name} ({max(lens)})")


def check_cu_seqlens_meta(cu_q, cu_k, max_q, max_k):
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} must be a 1-D int32 tensor of length B + 1 >= 2, got {cu.dtype} "
                             f"shape {tuple(cu.shape)}")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"{name} must be an int >= 0, got {m!r}")


def effective_window(causal, window):
    """(left, right) with -1 = unbounded; causal clips the right bound to 0 (the diagonal)."""
    left, right = int(window[0]), int(window[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


# ---------------------------------------------------------------------------------------------------------
# config choice
# ---------------------------------------------------------------------------------------------------------
_forced = threading.local()
_autotune_cache = {}
_AUTOTUNE_FILE = os.path.join(os.path.expanduser(os.environ.get("TILEATTN_CACHE_DIR", "~/.cache/tileattn")),
                              "autotune-dense.json")


@contextlib.contextmanager
def force_config(cfg: AttnConfig):
    """Use `cfg` for every launch inside the block (tests and config sweeps)."""
    prev = getattr(_forced, "cfg", None)
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
    forced = getattr(_forced, "cfg", None)
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
def _tma_ok(t):
    """Tensor descriptors need a non-empty tensor with 16-byte aligned base and strides."""
    es = t.element_size()
    return t.numel() > 0 and t.data_ptr() % 16 == 0 and all((s * es) % 16 == 0 for s in t.stride()[:-1])


def _descriptor(t, block_n, block_d, varlen):
    if varlen:  # [total, H, D]
        return TensorDescriptor(t, list(t.shape), list(t.stride()), [block_n, 1, block_d])
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block_n, 1, block_d])


def alloc_out(q, v_head_dim, varlen):
    """Output in q's layout family: [B, Sq, Hq, Dv]; a head-major q ([B, H, S, D] seen through a transpose,
    as scaled_dot_product_attention passes it) gets a head-major output, so the returned view is contiguous
    in torch's layout."""
    shape = list(q.shape[:-1]) + [v_head_dim]
    if not varlen and q.dim() == 4 and q.stride(1) < q.stride(2):
        B, S, H, _ = shape
        return torch.empty((B, H, S, v_head_dim), dtype=q.dtype, device=q.device).transpose(1, 2)
    return torch.empty(shape, dtype=q.dtype, device=q.device)


def alloc_lse(q, varlen, return_lse):
    if not return_lse:
        return torch.empty(0, dtype=torch.float32, device=q.device)
    if varlen:
        return torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    return torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)


def _debug_fill():
    return os.environ.get("TILEATTN_DEBUG_FILL_NAN", "0") not in ("", "0")


def attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
             window_right, softcap, align_bottom_right, return_lse):
    """Launch the forward kernel on validated inputs. Returns (out, lse) (lse empty unless return_lse).

    The mask is given by the effective window (causal already folded in as window_right = 0).
    """
    out, lse, run, cfg = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                                  window_left, window_right, softcap, align_bottom_right, return_lse)
    if run is not None:
        run(cfg)
    return out, lse


def compiled_smem(q, k, v, causal=False):
    """Shared memory of the kernel chosen for these (batched, full or causal) inputs; compiles, never runs."""
    _, _, run, cfg = _prepare(q, k, v, None, None, 0, 0, q.shape[-1] ** -0.5, -1, 0 if causal else -1, 0.0,
                              True, False)
    return run(cfg, compile_only=True).metadata.shared


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
             window_right, softcap, align_bottom_right, return_lse):
    """Check cu_seqlens values, allocate the outputs, choose the config.

    Returns (out, lse, run, cfg); run(cfg, compile_only=False) launches (or only compiles) the kernel, and
    run is None when there is nothing to compute (the outputs are then already final).
    """
    varlen = cu_seqlens_q is not None
    if varlen:
        check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
        batch = cu_seqlens_q.shape[0] - 1
        seqlen_q, seqlen_k = max_seqlen_q, max_seqlen_k
    else:
        batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    hq, hkv, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    out = alloc_out(q, dv, varlen)
    lse = alloc_lse(q, varlen, return_lse)
    if _debug_fill():
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    if out.numel() == 0:
        return out, lse, None, None
    if seqlen_k == 0 and not varlen:
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse, None, None

    bd, bdv = _pow2(d), _pow2(dv)
    has_softcap = softcap > 0
    qk_scale = scale * LOG2E
    softcap_scale = scale / softcap if has_softcap else 1.0
    softcap_out = softcap * LOG2E if has_softcap else 1.0

    if varlen:
        sq, sk, sv, so = ((0,) + tuple(t.stride()) for t in (q, k, v, out))
        sl = (0, lse.stride(0)) if return_lse else (0, 0)
    else:
        sq, sk, sv, so = (t.stride() for t in (q, k, v, out))
        sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)

    def run(cfg, compile_only=False):
        use_tma = cfg.use_tma and _tma_ok(k) and _tma_ok(v)
        if use_tma:
            k_arg = _descriptor(k, cfg.block_n, bd, varlen)
            v_arg = _descriptor(v, cfg.block_n, bdv, varlen)
        else:
            k_arg, v_arg = k, v
        grid = (triton.cdiv(max(seqlen_q, 1), cfg.block_m), batch * hq)
        launcher = attn_fwd_kernel.warmup if compile_only else attn_fwd_kernel[grid]
        extra = {"grid": grid} if compile_only else {}
        return launcher(
            q, k_arg, v_arg, out, lse,
            sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], so[0], so[1], so[2], sl[0], sl[1],
            cu_seqlens_q, cu_seqlens_k,
            seqlen_q, seqlen_k, hq, hq // hkv,
            qk_scale, softcap_scale, softcap_out, window_left, window_right,
            D=d, DV=dv, BLOCK_D=bd, BLOCK_DV=bdv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
            ALIGN_BOTTOM_RIGHT=align_bottom_right, HAS_SOFTCAP=has_softcap, IS_VARLEN=varlen,
            RETURN_LSE=return_lse, USE_TMA=use_tma, WARP_SPECIALIZE=cfg.warp_specialize and use_tma,
            REVERSE_M=window_right >= 0, PIPELINE_QK=cfg.pipeline_qk and not cfg.warp_specialize,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **extra,
        )

    def smem_of(cfg):
        return run(cfg, compile_only=True).metadata.shared

    variant = (window_left >= 0, has_softcap, varlen, return_lse, align_bottom_right)
    cfg = choose_config(q, v, window_right >= 0, seqlen_q, variant, run, smem_of)
    return out, lse, run, cfg
