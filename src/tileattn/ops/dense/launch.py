"""Host side of dense attention forward: input checks, config choice, grid, launch.

check_inputs() does every check that needs no tensor values (it is safe under torch.compile tracing);
check_cu_seqlens() reads the cumulative lengths (one small device-to-host copy) and runs inside the custom op.

Launches go through plans (bottom of this file): the first call of a problem checks its tensors, chooses the
config and launches through Triton's normal path; a repeated call checks the options, allocates the outputs
and replays the compiled kernel (tileattn.launcher). _prepare() and compiled_smem() keep the normal path.
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
from ...launcher import KernelLauncher
from . import launch_sm90
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
    # runs on every call (the tensor checks only once per problem key): no generator, no tuple building
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0):
        raise ValueError(f"scale must be a finite non-zero number or None, got {scale!r}")
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    left, right = window
    if type(left) is bool or type(right) is bool or not (isinstance(left, int) and isinstance(right, int)):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    if left < -1 or right < -1:
        raise ValueError(f"window bounds must be >= 0, or -1 for unbounded, got {tuple(window)}")
    if not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0 disables it), got {softcap!r}")


def check_sdpa_inputs(query, key, value, enable_gqa):
    """scaled_dot_product_attention's own checks, on the [B, H, S, D] tensors (check_inputs follows)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-dim tensor [B, H, S, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True for "
                         f"grouped-query attention")


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


def alloc_out(q, v_head_dim, varlen):
    """Output in q's layout family: [B, Sq, Hq, Dv] (see _out_layout for head-major inputs)."""
    shape, head_major = _out_layout(q, v_head_dim, varlen)
    out = torch.empty(shape, dtype=q.dtype, device=q.device)
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


def _kernel_call(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k, scale, window_left,
                 window_right, softcap, align_bottom_right, return_lse, cfg):
    """(grid, args, kwargs) of attn_fwd_kernel for these tensors, options and config."""
    varlen = cu_seqlens_q is not None
    batch = cu_seqlens_q.shape[0] - 1 if varlen else q.shape[0]
    hq, hkv, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    bd, bdv = _pow2(d), _pow2(dv)
    if varlen:
        sq, sk, sv, so = ((0,) + tuple(t.stride()) for t in (q, k, v, out))
        sl = (0, lse.stride(0)) if return_lse else (0, 0)
    else:
        sq, sk, sv, so = (t.stride() for t in (q, k, v, out))
        sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    use_tma = cfg.use_tma and _tma_ok(k) and _tma_ok(v)
    if use_tma:
        k_arg = _descriptor(k, cfg.block_n, bd, varlen)
        v_arg = _descriptor(v, cfg.block_n, bdv, varlen)
    else:
        k_arg, v_arg = k, v
    qk_scale, softcap_scale, softcap_out = _scales(scale, softcap)
    grid = (triton.cdiv(max(seqlen_q, 1), cfg.block_m), batch * hq)
    args = (q, k_arg, v_arg, out, lse,
            sq[0], sq[1], sq[2], sk[0], sk[1], sk[2], sv[0], sv[1], sv[2], so[0], so[1], so[2], sl[0], sl[1],
            cu_seqlens_q, cu_seqlens_k,
            seqlen_q, seqlen_k, hq, hq // hkv,
            qk_scale, softcap_scale, softcap_out, window_left, window_right)
    kwargs = dict(
        D=d, DV=dv, BLOCK_D=bd, BLOCK_DV=bdv, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        HAS_LEFT=window_left >= 0, HAS_RIGHT=window_right >= 0,
        ALIGN_BOTTOM_RIGHT=align_bottom_right, HAS_SOFTCAP=softcap > 0, IS_VARLEN=varlen,
        RETURN_LSE=return_lse, USE_TMA=use_tma, WARP_SPECIALIZE=cfg.warp_specialize and use_tma,
        REVERSE_M=window_right >= 0, PIPELINE_QK=cfg.pipeline_qk and not cfg.warp_specialize,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return grid, args, kwargs


# the kernel parameters that change between calls of one plan (KernelLauncher's `varying`), in the order
# _forward passes them; everything else is fixed by the plan key
_VARYING = ("Q", "K", "V", "O", "LSE", "qk_scale", "softcap_scale", "softcap_out")
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
            window_right, softcap, align_bottom_right, return_lse):
    """(run, cfg): the config for this problem (choose_config) and run(cfg, compile_only=False)."""
    seqlen_q, seqlen_k = _seqlens(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k)

    def run(cfg, compile_only=False):
        grid, args, kwargs = _kernel_call(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqlen_q, seqlen_k,
                                          scale, window_left, window_right, softcap, align_bottom_right,
                                          return_lse, cfg)
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


# ---------------------------------------------------------------------------------------------------------
# launch plans: the per-call fast path
# ---------------------------------------------------------------------------------------------------------
# A repeated call (same shapes, strides, dtypes, devices, 16-byte alignment of q/k/v, options and forced
# config) finds a _Problem (its tensors passed check_inputs/check_device before) and in it a _Plan (config,
# grid, output layout, and a KernelLauncher replaying the compiled kernel), so it only checks the options,
# allocates the outputs and launches. Environment knobs (TILEATTN_DEBUG_FILL_NAN, TILEATTN_SMEM_BUDGET,
# TILEATTN_AUTOTUNE) are read when a plan is made: clear_plans() makes later calls see new values.
_MAX_PROBLEMS = 1024  # distinct tensor keys kept; the cache is emptied beyond (many shapes, e.g. varlen)
_problems = {}


def clear_plans():
    """Forget every launch plan (the next call of each problem is planned again)."""
    _problems.clear()


class _Problem:
    """What the tensors of a problem fix: validated once per key. `plans` maps option keys to _Plans.

    torch_layout: the caller's tensors (and the output) are [B, H, S, D] (scaled_dot_product_attention); the
    kernel sees them through transposes, which are only made when a plan is built.
    """
    __slots__ = ("on_cpu", "torch_layout", "out_shape", "out_strides", "lse_shape", "no_lse", "default_scale",
                 "plans")

    def __init__(self, q, v, varlen, torch_layout=False):
        self.on_cpu = q.device.type == "cpu"  # check_device reads TRITON_INTERPRET: re-run per call there
        self.torch_layout = torch_layout
        # torch.empty_strided gives alloc_out's layout in one call: ~1 us less than empty (+ 2 us with the
        # transpose of a head-major output), scripts/host_overhead.py --cpu
        shape, strides = _out_shape_strides(q, v.shape[-1], varlen)
        if torch_layout:
            shape, strides = _swap12(shape), _swap12(strides)
        self.out_shape, self.out_strides = shape, strides
        self.lse_shape = _lse_shape(q, varlen)
        self.no_lse = torch.empty(0, dtype=torch.float32, device=q.device)  # lse argument when not written
        self.default_scale = q.shape[-1] ** -0.5
        self.plans = {}


def _swap12(t):
    return (t[0], t[2], t[1], t[3])


class _Plan:
    __slots__ = ("fill", "done", "grid", "launcher", "scales")

    def __init__(self, fill, done, grid=None, launcher=None, scales=None):
        self.fill = fill  # TILEATTN_DEBUG_FILL_NAN
        self.done = done  # nothing to launch: the outputs are final after allocation ("empty" / "no keys")
        self.grid = grid
        self.launcher = launcher
        self.scales = scales  # (scale, softcap) -> the kernel's scale arguments


def _tensor_key(q, k, v, kind):
    # everything check_inputs/check_device look at, plus what the kernel specializes on (16-byte alignment);
    # kind: False (batched), True (varlen), or ("sdpa", enable_gqa)
    return (kind, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device,
            q.data_ptr() % 16 == 0, k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0)


def _new_problem(key, q, v, varlen, torch_layout=False):
    if len(_problems) >= _MAX_PROBLEMS:
        _problems.clear()
    prob = _problems[key] = _Problem(q, v, varlen, torch_layout)
    return prob


def attention_eager(q, k, v, causal, scale, window, softcap, align_bottom_right, return_lse):
    """attention() for plain eager calls (torch.Tensor inputs, nothing to trace, no gradient to track): the
    tensor checks run once per problem key, the option checks every call. Returns out, or (out, lse)."""
    key = _tensor_key(q, k, v, False)
    prob = _problems.get(key)
    if prob is None:
        check_inputs(q, k, v, varlen=False)  # the order of the API's checks: a bad tensor is reported first
        check_options(causal, scale, window, softcap)
        check_device(q, k, v)
        prob = _new_problem(key, q, v, False)
    else:
        check_options(causal, scale, window, softcap)
        if prob.on_cpu:
            check_device(q, k, v)
    left, right = effective_window(causal, window)
    out, lse = _forward(prob, q, k, v, None, None, 0, 0, prob.default_scale if scale is None else float(scale),
                        left, right, float(softcap), align_bottom_right, return_lse, return_lse)
    return (out, lse) if return_lse else out


def sdpa_eager(query, key, value, causal, scale, enable_gqa):
    """scaled_dot_product_attention() for plain eager calls, on torch's [B, H, S, D] tensors as given: a
    repeated call makes no transposed views (~2 us each, scripts/host_overhead.py --cpu) and allocates the
    output in the layout it returns."""
    tkey = _tensor_key(query, key, value, ("sdpa", bool(enable_gqa)))
    prob = _problems.get(tkey)
    if prob is None:
        check_sdpa_inputs(query, key, value, enable_gqa)
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        check_inputs(q, k, v, varlen=False)
        check_options(causal, scale, (-1, -1), 0.0)
        check_device(q, k, v)
        prob = _new_problem(tkey, q, v, False, torch_layout=True)
    else:
        check_options(causal, scale, (-1, -1), 0.0)
        if prob.on_cpu:
            check_device(query, key, value)
    out, _ = _forward(prob, query, key, value, None, None, 0, 0,
                      prob.default_scale if scale is None else float(scale), -1, 0 if causal else -1, 0.0, False,
                      False, False)
    return out


def attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
             window_right, softcap, align_bottom_right, return_lse):
    """Launch the forward kernel. Returns (out, lse) (lse empty unless return_lse).

    The mask is given by the effective window (causal already folded in as window_right = 0). q, k, v are
    checked once per problem key (the API has checked them, and the options, already).
    """
    varlen = cu_seqlens_q is not None
    key = _tensor_key(q, k, v, varlen)
    prob = _problems.get(key)
    if prob is None:
        check_inputs(q, k, v, varlen=varlen)
        check_device(q, k, v)
        prob = _new_problem(key, q, v, varlen)
    return _forward(prob, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
                    window_right, softcap, align_bottom_right, return_lse, True)


def _forward(prob, q, k, v, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right, return_lse,
             lse_tensor):
    """Allocate the outputs and launch through the problem's plan for these options (made on first use).
    lse_tensor=False: without return_lse, lse is None (no allocation)."""
    okey = (left, right, softcap > 0, scale > 0, bottom_right, return_lse, _forced.cfg)
    if cu_q is not None:
        check_cu_seqlens(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)  # reads the values: host sync
        okey += (max_q, max_k, cu_q.shape[0], cu_q.data_ptr() % 16 == 0, cu_k.data_ptr() % 16 == 0)
    out = torch.empty_strided(prob.out_shape, prob.out_strides, dtype=q.dtype, device=q.device)
    if return_lse:
        lse = torch.empty(prob.lse_shape, dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty(0, dtype=torch.float32, device=q.device) if lse_tensor else None
    plan = prob.plans.get(okey)
    if plan is None:
        views = (q, k, v, out)
        if prob.torch_layout:  # the kernel's [B, S, H, D] views of [B, H, S, D] tensors (same addresses)
            views = tuple(t.transpose(1, 2) for t in views)
        plan = prob.plans[okey] = _new_plan(*views, lse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap,
                                            bottom_right, return_lse)
    if plan.fill:
        out.fill_(float("nan"))
        if return_lse:
            lse.fill_(float("nan"))
    if plan.done is not None:
        if plan.done == "no keys":
            out.zero_()
            if return_lse:
                lse.fill_(float("-inf"))
        return out, lse
    scales = plan.scales(scale, softcap)
    if cu_q is None:
        plan.launcher(plan.grid, q, k, v, out, lse if return_lse else prob.no_lse, *scales)
    else:
        plan.launcher(plan.grid, q, k, v, out, lse if return_lse else prob.no_lse, *scales, cu_q, cu_k)
    return out, lse


def _new_plan(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right,
              return_lse):
    """Choose the config (the slow path: choose_config, maybe autotuning) and set up the launcher."""
    varlen = cu_q is not None
    fill = _debug_fill()
    if out.numel() == 0:
        return _Plan(fill, "empty")
    if not varlen and k.shape[1] == 0:
        return _Plan(fill, "no keys")
    if lse is None:
        lse = torch.empty(0, dtype=torch.float32, device=q.device)
    if use_sm90(q, k, v, out, varlen, scale, softcap):
        kernel, grid, args, kwargs = launch_sm90.kernel_call(q, k, v, out, lse, scale, left, right, softcap,
                                                             bottom_right, return_lse)
        return _Plan(fill, None, grid, KernelLauncher(kernel, args, kwargs, launch_sm90.VARYING),
                     launch_sm90.scales)
    _, cfg = _choose(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right,
                     return_lse)
    seqlen_q, seqlen_k = _seqlens(q, k, cu_q, max_q, max_k)
    grid, args, kwargs = _kernel_call(q, k, v, out, lse, cu_q, cu_k, seqlen_q, seqlen_k, scale, left, right,
                                      softcap, bottom_right, return_lse, cfg)
    launcher = KernelLauncher(attn_fwd_kernel, args, kwargs, _VARYING_VARLEN if varlen else _VARYING)
    return _Plan(fill, None, grid, launcher, _scales)


def use_sm90(q, k, v, out, varlen, scale, softcap):
    """Whether the Hopper Gluon kernel (launch_sm90.py) serves this problem: on an sm90 GPU, for the shapes it
    supports, unless a Triton config is forced (force_config) or TILEATTN_SM90=0 asks for the portable
    kernel everywhere."""
    if _forced.cfg is not None or os.environ.get("TILEATTN_SM90", "1") in ("", "0"):
        return False
    if not launch_sm90.supports(q, k, v, out, varlen, hw.interpreter_enabled(), scale, softcap):
        return False
    # an emulated smaller budget (TILEATTN_SMEM_BUDGET) rules it out like a smaller GPU would
    cfg = launch_sm90.config_for(q.shape[-1])
    return launch_sm90.smem_bytes(cfg, q.shape[-1], v.shape[-1], q.element_size()) <= hw.device_info(
        q.device).smem_per_block
