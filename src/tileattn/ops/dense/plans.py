"""Launch plans of dense attention forward: the per-call fast path behind `attention`,
`scaled_dot_product_attention` and the registered op.

The first call of a problem checks its tensors (problem.py), describes it (AttnProblem), lets dispatch.py choose
the backend and plans the launch (the first launch goes through Triton's normal path, which compiles); a
repeated call checks the options, allocates the outputs and replays the compiled kernel (tileattn.launcher).

A repeated call finds an _Entry by its tensor key (shapes, strides, dtypes, devices, 16-byte alignment of q, k,
v: what the checks and the kernels specialize on) and in it a _Plan by its option key (window, whether softcap
and scale are positive, alignment, lse, forced backend or config, varlen maxima). Scale, softcap and the fp8
output factor are per-call values. Environment switches (knobs.py) are read when a plan is made:
clear_plans() makes later calls see new values.
"""
import torch

from ... import knobs
from ...launcher import PlanCache
from ..common.backend import forced_key
from ..common.fp8 import is_fp8
from . import bwd, dispatch
from .problem import (
    AttnOptions,
    AttnProblem,
    Call,
    check_cu_seqlens,
    check_device,
    check_inputs,
    check_options,
    check_sdpa_inputs,
    effective_window,
    lse_shape,
    out_shape_strides,
)

_MAX_ENTRIES = 1024  # distinct tensor keys kept; the cache is emptied beyond (many shapes, e.g. varlen)
_entries = {}
_caching = PlanCache()


def clear_plans():
    """Forget every launch plan, the backward's too (the next call of each problem is planned again)."""
    _entries.clear()
    bwd.clear_plans()


uncached = _caching.uncached  # (a context manager: no plan kept or replayed within it)


def count_plans():
    """Plans held (tests)."""
    return sum(len(e.plans) for e in _entries.values())


class _Entry:
    """What the tensors of a problem fix, validated once per tensor key; `plans` maps option keys to _Plans.

    torch_layout: the caller's tensors (and the output) are [B, H, S, D] (scaled_dot_product_attention); the
    kernels see them through transposes, made only when a plan is made.
    """
    __slots__ = ("on_cpu", "torch_layout", "out_shape", "out_strides", "out_dtype", "lse_shape", "no_lse",
                 "default_scale", "plans")

    def __init__(self, q, v, varlen, torch_layout=False, out_dtype=None):
        self.on_cpu = q.device.type == "cpu"  # check_device reads TRITON_INTERPRET: re-run per call there
        self.torch_layout = torch_layout
        # torch.empty_strided gives alloc_out's layout in one call: ~1 us less than empty (+ 2 us with the
        # transpose of a head-major output), scripts/host_overhead.py --cpu
        shape, strides = out_shape_strides(q, v.shape[-1], varlen)
        if torch_layout:
            shape, strides = _swap12(shape), _swap12(strides)
        self.out_shape, self.out_strides = shape, strides
        self.out_dtype = out_dtype or q.dtype
        self.lse_shape = lse_shape(q, varlen)
        self.no_lse = torch.empty(0, dtype=torch.float32, device=q.device)  # lse argument when not written
        self.default_scale = q.shape[-1] ** -0.5
        self.plans = {}


def _swap12(t):
    return (t[0], t[2], t[1], t[3])


class _Plan:
    __slots__ = ("fill", "done", "launch")

    def __init__(self, fill, done, launch=None):
        self.fill = fill  # TILEATTN_DEBUG_FILL_NAN
        self.done = done  # nothing to launch: the outputs are final after allocation ("empty" / "no keys")
        self.launch = launch  # the backend's planned launch: launch.run(call)


def _tensor_key(q, k, v, kind):
    # everything check_inputs/check_device look at, plus what the kernels specialize on (16-byte alignment);
    # kind: False (batched), True (varlen), or ("sdpa", enable_gqa)
    return (kind, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            v.shape, v.stride(), v.dtype, v.device,
            q.data_ptr() % 16 == 0, k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0)


def _fp8_key(descales, opts):
    """What the fp8 options add to a tensor key: the descale tensors' layouts, the output dtype, V packed."""
    return (opts.out_dtype, opts.v_packed) + tuple(
        None if d is None else (d.shape, d.stride(), d.dtype, d.device, d.data_ptr() % 16 == 0)
        for d in (descales or (None, None, None)))


def _new_entry(key, q, v, varlen, torch_layout=False, out_dtype=None):
    if len(_entries) >= _MAX_ENTRIES:
        _entries.clear()
    entry = _entries[key] = _Entry(q, v, varlen, torch_layout, out_dtype)
    return entry


def checked(q, k, v):
    """Whether batched q, k, v have the layouts of a call already checked (a kept entry: check_inputs and
    check_device passed for this tensor key; on the CPU, as in attention_eager, the device is checked again)."""
    entry = _entries.get(_tensor_key(q, k, v, False))
    if entry is not None and entry.on_cpu:
        check_device(q, k, v)
    return entry is not None


def attention_eager(q, k, v, causal, scale, window, softcap, return_lse):
    """attention() for plain eager calls (torch.Tensor inputs, nothing to trace, no gradient to track): the
    tensor checks run once per tensor key, the option checks every call. Returns out, or (out, lse)."""
    key = _tensor_key(q, k, v, False)
    entry = _entries.get(key)
    if entry is None:
        check_inputs(q, k, v, varlen=False)  # the order of the API's checks: a bad tensor is reported first
        check_options(causal, scale, window, softcap, return_lse)
        check_device(q, k, v)
        entry = _new_entry(key, q, v, False)
    else:
        check_options(causal, scale, window, softcap, return_lse)
        if entry.on_cpu:
            check_device(q, k, v)
    left, right = effective_window(causal, window)
    scale = entry.default_scale if scale is None else float(scale)
    softcap = float(softcap)
    out = torch.empty_strided(entry.out_shape, entry.out_strides, dtype=entry.out_dtype, device=q.device)
    lse = torch.empty(entry.lse_shape, dtype=torch.float32, device=q.device) if return_lse else entry.no_lse
    okey = (left, right, softcap > 0, scale > 0, True, return_lse, forced_key())
    _forward(entry, okey, Call(q, k, v, out, lse, None, None, None, scale, softcap, 1.0), None)
    return (out, lse) if return_lse else out


def sdpa_eager(query, key, value, causal, scale, enable_gqa):
    """scaled_dot_product_attention() for plain eager calls, on torch's [B, H, S, D] tensors as given: a
    repeated call makes no transposed views (~2 us each, scripts/host_overhead.py --cpu) and allocates the
    output in the layout it returns."""
    tkey = _tensor_key(query, key, value, ("sdpa", bool(enable_gqa)))
    entry = _entries.get(tkey)
    if entry is None:
        check_sdpa_inputs(query, key, value, enable_gqa)
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        check_inputs(q, k, v, varlen=False)
        check_options(causal, scale, (-1, -1), 0.0)
        check_device(q, k, v, name="query")
        entry = _new_entry(tkey, q, v, False, torch_layout=True)
    else:
        check_options(causal, scale, (-1, -1), 0.0)
        if entry.on_cpu:
            check_device(query, key, value, name="query")
    scale = entry.default_scale if scale is None else float(scale)
    out = torch.empty_strided(entry.out_shape, entry.out_strides, dtype=entry.out_dtype, device=query.device)
    okey = (-1, 0 if causal else -1, False, scale > 0, False, False, forced_key())
    _forward(entry, okey, Call(query, key, value, out, entry.no_lse, None, None, None, scale, 0.0, 1.0), None)
    return out


def attn_fwd(q, k, v, cu_seqlens, descales, opts):
    """The forward of checked tensors (the registered op's body, and eager varlen / fp8 calls). cu_seqlens:
    () or (cu_seqlens_q, cu_seqlens_k); descales: None or fp8's three descale tensors (numbers are already
    folded into opts.scale and opts.out_scale); opts: AttnOptions. Returns (out, lse), lse empty unless
    opts.return_lse."""
    varlen = bool(cu_seqlens)
    cu_q, cu_k = cu_seqlens if varlen else (None, None)
    key = _tensor_key(q, k, v, varlen)
    if is_fp8(q.dtype):
        key += _fp8_key(descales, opts)
    entry = _entries.get(key)
    if entry is None:
        check_inputs(q, k, v, varlen=varlen)
        check_device(q, k, v)
        entry = _new_entry(key, q, v, varlen, out_dtype=opts.out_dtype)
    okey = (opts.window[0], opts.window[1], opts.softcap > 0, opts.scale > 0, opts.bottom_right, opts.return_lse,
            forced_key())
    if varlen:
        check_cu_seqlens(cu_q, cu_k, q.shape[0], k.shape[0], opts.max_seqlen_q, opts.max_seqlen_k)  # a host sync
        okey += (opts.max_seqlen_q, opts.max_seqlen_k, cu_q.shape[0], cu_q.data_ptr() % 16 == 0,
                 cu_k.data_ptr() % 16 == 0)
    out = torch.empty_strided(entry.out_shape, entry.out_strides, dtype=entry.out_dtype, device=q.device)
    if opts.return_lse:
        lse = torch.empty(entry.lse_shape, dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty(0, dtype=torch.float32, device=q.device)
    _forward(entry, okey, Call(q, k, v, out, lse, cu_q, cu_k, descales, opts.scale, opts.softcap, opts.out_scale),
             opts)
    return out, lse


def _forward(entry, okey, c, opts):
    """Launch call c (outputs allocated) through the entry's plan for okey, made on first use (opts: the call's
    AttnOptions, or None for the eager paths, which describe themselves by okey)."""
    plan = entry.plans.get(okey)
    if plan is None:
        if opts is None:
            opts = AttnOptions(scale=c.scale, window=(okey[0], okey[1]), softcap=c.softcap, bottom_right=okey[4],
                               return_lse=okey[5])
        plan = _new_plan(entry, c, opts)
        if _caching.on:
            entry.plans[okey] = plan
    if plan.fill:
        c.out.fill_(float("nan"))
        if c.lse.numel():
            c.lse.fill_(float("nan"))
    if plan.done is None:
        plan.launch.run(c)
    elif plan.done == "no keys":
        c.out.zero_()
        c.lse.fill_(float("-inf"))


def _views(entry, c):
    """Call c as the kernels see it: [B, S, H, D] views of [B, H, S, D] tensors (same addresses)."""
    if not entry.torch_layout:
        return c
    q, k, v, out = (t.transpose(1, 2) for t in (c.q, c.k, c.v, c.out))
    return Call(q, k, v, out, c.lse, c.cu_q, c.cu_k, c.descales, c.scale, c.softcap, c.out_scale)


def _new_plan(entry, c, opts):
    """Describe the problem, choose its backend (dispatch.py) and plan the launch."""
    fill = knobs.debug_fill_nan()
    c = _views(entry, c)
    if c.out.numel() == 0:
        return _Plan(fill, "empty")
    if c.cu_q is None and c.k.shape[1] == 0:
        return _Plan(fill, "no keys")
    p = AttnProblem.of(c, opts)
    return _Plan(fill, None, dispatch.plan(p, c))


def describe(q, k, v, causal=False, window=(-1, -1), softcap=0.0, scale=None):
    """(problem, call) of an attention() call on these batched tensors and options, its output allocated, no
    launch (fp8: bfloat16 output, no descale tensors): what dispatch.select / dispatch.explain take (tests)."""
    check_inputs(q, k, v, varlen=False)
    check_options(causal, scale, window, softcap)
    entry = _Entry(q, v, False, out_dtype=torch.bfloat16 if is_fp8(q.dtype) else None)
    out = torch.empty_strided(entry.out_shape, entry.out_strides, dtype=entry.out_dtype, device=q.device)
    scale = entry.default_scale if scale is None else float(scale)
    c = Call(q, k, v, out, entry.no_lse, None, None, None, scale, float(softcap), 1.0)
    opts = AttnOptions(scale=scale, window=effective_window(causal, window), softcap=float(softcap))
    return AttnProblem.of(c, opts), c


def compile_only(q, k, v, causal=False):
    """The kernel the chosen backend compiles for these batched inputs (its first launch; compiles, never
    runs): .metadata.shared is its shared memory (tests check it against the device's budget)."""
    p, c = describe(q, k, v, causal=causal)
    return dispatch.plan(p, c).compile(c)
