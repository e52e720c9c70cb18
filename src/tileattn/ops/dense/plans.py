"""Launch plans of dense attention forward: the per-call fast path (attention_eager, sdpa_eager, attn_fwd).

The first call of a problem checks its tensors (checks.py), chooses the config and launches through Triton's
normal path (launch.py); a repeated call checks the options, allocates the outputs and replays the compiled
kernel (tileattn.launcher).
"""

import torch

from ... import hw
from ...launcher import KernelLauncher
from . import large_d, launch_sm90
from .fp8 import fp8_v_layout, is_fp8
from .checks import (check_cu_seqlens, check_device, check_inputs, check_options, check_sdpa_inputs,
                     effective_window)
from .kernels import attn_fwd_kernel
from .launch import (_VARYING, _VARYING_VARLEN, _choose, _debug_fill, _forced, _kernel_call, _lse_shape,
                     _out_shape_strides, _scales, _seqlens)


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
    __slots__ = ("on_cpu", "torch_layout", "out_shape", "out_strides", "out_dtype", "lse_shape", "no_lse",
                 "default_scale", "plans")

    def __init__(self, q, v, varlen, torch_layout=False, out_dtype=None):
        self.on_cpu = q.device.type == "cpu"  # check_device reads TRITON_INTERPRET: re-run per call there
        self.torch_layout = torch_layout
        # torch.empty_strided gives alloc_out's layout in one call: ~1 us less than empty (+ 2 us with the
        # transpose of a head-major output), scripts/host_overhead.py --cpu
        shape, strides = _out_shape_strides(q, v.shape[-1], varlen)
        if torch_layout:
            shape, strides = _swap12(shape), _swap12(strides)
        self.out_shape, self.out_strides = shape, strides
        self.out_dtype = out_dtype or q.dtype
        self.lse_shape = _lse_shape(q, varlen)
        self.no_lse = torch.empty(0, dtype=torch.float32, device=q.device)  # lse argument when not written
        self.default_scale = q.shape[-1] ** -0.5
        self.plans = {}


def _swap12(t):
    return (t[0], t[2], t[1], t[3])


class _Plan:
    __slots__ = ("fill", "done", "grid", "launcher", "scales", "v_prep")

    def __init__(self, fill, done, grid=None, launcher=None, scales=None, v_prep=None):
        self.fill = fill  # TILEATTN_DEBUG_FILL_NAN
        self.done = done  # nothing to launch: the outputs are final after allocation ("empty" / "no keys")
        self.grid = grid
        self.launcher = launcher
        self.scales = scales  # (scale, softcap) -> the kernel's scale arguments
        self.v_prep = v_prep  # fp8: V -> the layout the kernel reads (fp8_v_layout), or None


def _tensor_key(q, k, v, kind):
    # everything check_inputs/check_device look at, plus what the kernel specializes on (16-byte alignment);
    # kind: False (batched), True (varlen), or ("sdpa", enable_gqa)
    return (kind, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device,
            q.data_ptr() % 16 == 0, k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0)


def _fp8_key(descales, out_dtype):
    """What the fp8 options add to a problem key: the descale tensors' layouts and the output dtype."""
    return (out_dtype,) + tuple(None if d is None else (d.shape, d.stride(), d.dtype, d.device, d.data_ptr() % 16 == 0)
                                for d in descales)


def _new_problem(key, q, v, varlen, torch_layout=False, out_dtype=None):
    if len(_problems) >= _MAX_PROBLEMS:
        _problems.clear()
    prob = _problems[key] = _Problem(q, v, varlen, torch_layout, out_dtype)
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


_NO_DESCALES = (None, None, None)


def attn_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
             window_right, softcap, align_bottom_right, return_lse, q_descale=None, k_descale=None,
             v_descale=None, out_scale=1.0, out_dtype=None, v_packed=False):
    """Launch the forward kernel. Returns (out, lse) (lse empty unless return_lse).

    The mask is given by the effective window (causal already folded in as window_right = 0). q, k, v are
    checked once per problem key (the API has checked them, and the options, already). fp8: the descale
    tensors (or None; numbers are already folded into scale and out_scale), the output dtype, and whether v
    is the view of an Fp8V (v_packed).
    """
    varlen = cu_seqlens_q is not None
    descales = (q_descale, k_descale, v_descale)
    key = _tensor_key(q, k, v, varlen)
    if is_fp8(q.dtype):
        key += _fp8_key(descales, out_dtype) + (v_packed,)
    prob = _problems.get(key)
    if prob is None:
        check_inputs(q, k, v, varlen=varlen)
        check_device(q, k, v)
        prob = _new_problem(key, q, v, varlen, out_dtype=out_dtype)
    return _forward(prob, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window_left,
                    window_right, softcap, align_bottom_right, return_lse, True, descales, out_scale, v_packed)


def _forward(prob, q, k, v, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right, return_lse,
             lse_tensor, descales=_NO_DESCALES, out_scale=1.0, v_packed=False):
    """Allocate the outputs and launch through the problem's plan for these options (made on first use).
    lse_tensor=False: without return_lse, lse is None (no allocation)."""
    okey = (left, right, softcap > 0, scale > 0, bottom_right, return_lse, _forced.cfg)
    if cu_q is not None:
        check_cu_seqlens(cu_q, cu_k, q.shape[0], k.shape[0], max_q, max_k)  # reads the values: host sync
        okey += (max_q, max_k, cu_q.shape[0], cu_q.data_ptr() % 16 == 0, cu_k.data_ptr() % 16 == 0)
    out = torch.empty_strided(prob.out_shape, prob.out_strides, dtype=prob.out_dtype, device=q.device)
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
                                            bottom_right, return_lse, descales, out_scale, v_packed)
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
    if plan.v_prep is not None:
        v = plan.v_prep(v)
    if descales is _NO_DESCALES:
        qd = kd = vd = prob.no_lse
    else:
        qd, kd, vd = (prob.no_lse if d is None else d for d in descales)
    if cu_q is None:
        plan.launcher(plan.grid, q, k, v, out, lse if return_lse else prob.no_lse, qd, kd, vd, *scales, out_scale)
    else:
        plan.launcher(plan.grid, q, k, v, out, lse if return_lse else prob.no_lse, qd, kd, vd, *scales, out_scale,
                      cu_q, cu_k)
    return out, lse


def _new_plan(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right,
              return_lse, descales=_NO_DESCALES, out_scale=1.0, v_packed=False):
    """Choose the config (the slow path: choose_config, maybe autotuning) and set up the launcher."""
    varlen = cu_q is not None
    fill = _debug_fill()
    if out.numel() == 0:
        return _Plan(fill, "empty")
    if not varlen and k.shape[1] == 0:
        return _Plan(fill, "no keys")
    if lse is None:
        lse = torch.empty(0, dtype=torch.float32, device=q.device)
    seqlen_q, seqlen_k = _seqlens(q, k, cu_q, max_q, max_k)
    large = large_d.plan(q, k, v, out, lse, cu_q, cu_k, seqlen_q, seqlen_k, scale, left, right, softcap,
                         bottom_right, return_lse)
    if large is not None:
        grid, launcher, _ = large
        return _Plan(fill, None, grid, launcher, _scales)
    if use_sm90(q, k, v, out, varlen, scale, softcap, right >= 0):
        v_prep = None
        if is_fp8(v.dtype) and not v_packed:  # packed once per call (fp8.py)
            v_prep = _pack_v
            v = _pack_v(v)
        kernel, grid, args, kwargs = launch_sm90.kernel_call(q, k, v, out, lse, scale, left, right, softcap,
                                                             bottom_right, return_lse, descales=descales,
                                                             out_scale=out_scale)
        return _Plan(fill, None, grid, KernelLauncher(kernel, args, kwargs, launch_sm90.VARYING),
                     launch_sm90.scales, v_prep)
    _, cfg = _choose(q, k, v, out, lse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap, bottom_right,
                     return_lse, descales, out_scale, v_packed)
    grid, args, kwargs = _kernel_call(q, k, v, out, lse, cu_q, cu_k, seqlen_q, seqlen_k, scale, left, right,
                                      softcap, bottom_right, return_lse, cfg, descales, out_scale, v_packed)
    launcher = KernelLauncher(attn_fwd_kernel, args, kwargs, _VARYING_VARLEN if varlen else _VARYING)
    return _Plan(fill, None, grid, launcher, _scales)


def _pack_v(v):
    return fp8_v_layout(v).view()


def use_sm90(q, k, v, out, varlen, scale, softcap, causal=False):
    """Whether the Hopper Gluon kernel (launch_sm90.py) serves this problem: on an sm90 GPU, for the shapes it
    supports, unless a Triton config is forced (force_config) or TILEATTN_SM90=0 asks for the portable
    kernel everywhere."""
    if _forced.cfg is not None or not hw.sm90_kernels(q.device):
        return False
    if not launch_sm90.supports(q, k, v, out, varlen, hw.interpreter_enabled(), scale, softcap, causal):
        return False
    # an emulated smaller budget (TILEATTN_SMEM_BUDGET) rules it out like a smaller GPU would
    cfg = launch_sm90.config_for(q.shape[-1], q.dtype)
    return launch_sm90.smem_bytes(cfg, q.shape[-1], v.shape[-1], q.element_size(),
                                  out.element_size()) <= hw.device_info(q.device).smem_per_block
