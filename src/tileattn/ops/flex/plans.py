"""Launch plans of the flex forward: the per-call fast path of eager flex_attention calls.

The first call of a problem checks its tensors and block mask, traces its mods, describes it (FlexProblem),
lets dispatch.py choose the backend and launches through Triton's normal path (which compiles). A repeated
call finds its plan by keys and replays the kept launch (tileattn.launcher) on its own tensors: measured on the
H100's host, the unplanned path cost 260-530 us per call (~600 Python calls; docs/design/flex.md).

    tensor key   shapes, strides, dtypes, devices and 16-byte alignment of query, key and value, enable_gqa:
                 what check_inputs and the kernels' specialization look at (checked once per key)
    plan key     the traced mods (trace.compile_mod runs per call: it keys on the closure's contents), the
                 block mask's block sizes, lengths and list layouts (shapes, strides, dtypes, devices), the
                 scale, whether the lse is made, whether a gradient is tracked, a forced backend
                 (backend.forced_key)

fp8 inputs are planned too (their descale numbers and out_dtype key the plan, descale tensors vary); a call
that tracks a gradient of fp8 inputs, or passes descales with 16-bit ones, takes the unplanned path (api.py),
which reports it.
"""
import torch

from ... import hw
from ...launcher import PlanCache
from ..common.backend import forced_key
from ..common.fp8 import Fp8V, check_fp8_options
from . import dispatch
from .problem import (
    FlexCall,
    FlexProblem,
    check_inputs,
    check_scale,
    mask_tensors,
    real_mask_mod,
    transposed_lists,
)
from .trace import compile_mod

_MAX_ENTRIES = 1024  # distinct tensor keys kept; the cache is emptied beyond (many shapes)
_entries = {}  # tensor key -> {plan key: Plan}
_caching = PlanCache()
_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
_TLISTS = ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def clear_plans():
    """Forget every flex launch plan (the next call of each problem is planned again)."""
    _entries.clear()


def count_plans():
    """Plans held (tests)."""
    return sum(len(e) for e in _entries.values())


uncached = _caching.uncached  # (a context manager: no plan kept or replayed within it)


class Plan:
    """A flex forward planned for one key: p (FlexProblem), its backend, `kept` (its kept launch; None: Triton's
    normal launch), and the backward's kept launches per layout of the output and lse gradients."""
    __slots__ = ("p", "backend", "kept", "contiguous", "backward_kept")

    def __init__(self, p, backend, contiguous):
        self.p, self.backend, self.kept = p, backend, {}
        self.contiguous = contiguous  # an index list of the block mask is not contiguous along the list
        self.backward_kept = {}

    def run(self, c):
        """Fill call c's out and lse (allocated by dispatch.forward)."""
        self.backend.run(self.p, c, self.kept)

    def backward(self, dout, dlse):
        """The dict in which bwd.flex_bwd keeps its launches for gradients of these layouts (None when this
        plan keeps nothing). The Hopper / Triton choice is made per call (TILEATTN_SM90_BWD, dout's alignment);
        their launches have their own names."""
        if self.kept is None:
            return None
        key = (dout.shape, dout.stride(), dout.dtype, None if dlse is None else (dlse.shape, dlse.stride()))
        kept = self.backward_kept.get(key)
        if kept is None:
            kept = self.backward_kept[key] = {}
        return kept


def _tensor_key(q, k, v, enable_gqa):
    kind = type(v)
    if kind is Fp8V:
        v = v.data  # its seqlen is key's
    return (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
            kind, v.shape, v.stride(), v.dtype, v.device, bool(enable_gqa),
            q.data_ptr() % 16 == 0, k.data_ptr() % 16 == 0, v.data_ptr() % 16 == 0)


def _descale_key(d):
    """A descale as a plan keys it: a number by value (it folds into the kernel's scale), a tensor by layout."""
    if isinstance(d, torch.Tensor):
        return (d.shape, d.stride(), d.dtype, d.device, d.data_ptr() % 16 == 0)
    return d if d is None else float(d)


def _mask_key(block_mask, grad):
    """(key, lists) of a block mask: its block sizes, lengths and list layouts, and its lists (the transposed
    ones too for a gradient). key None without a block mask; False where these attributes do not make a key
    (not a BlockMask: the unplanned path reports it)."""
    if block_mask is None:
        return None, ()
    try:
        lists = tuple(getattr(block_mask, n, None) for n in _LISTS + (_TLISTS if grad else ()))
        key = (tuple(block_mask.BLOCK_SIZE), getattr(block_mask, "seq_lengths", None),
               tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in lists))
        hash(key)
    except (AttributeError, TypeError):
        return False, ()
    return key, lists


def lookup(qkv, score_mod, block_mask, scale, enable_gqa, return_lse, grad, fp8=None):
    """(problem, call, plan) of an eager flex_attention call on qkv = (query, key, value), the plan made on first
    use (with the checks api.flex_attention runs, in its order). fp8: (q_descale, k_descale, v_descale,
    out_dtype) of fp8 inputs, checked on every call. The call's outputs are not allocated yet (dispatch.forward
    does)."""
    query, key, value = qkv
    tkey = _tensor_key(query, key, value, enable_gqa)
    entry = _entries.get(tkey)
    if entry is None or query.device.type == "cpu":  # the device check reads TRITON_INTERPRET: per call there
        check_inputs(query, key, value, enable_gqa, scale)
        if entry is None:
            if len(_entries) >= _MAX_ENTRIES:
                _entries.clear()
            entry = _entries[tkey] = {}
    else:
        check_scale(scale)
    descales, out_dtype, fkey = (None, None, None), query.dtype, None
    if fp8 is not None:
        *descales, out_dtype = fp8
        check_fp8_options(query, key.transpose(1, 2), *descales, out_dtype, query.shape[0])
        # fp8 runs dequantized to out_dtype under the interpreter (no Hopper kernel there)
        hw.check_interpreter_dtype(out_dtype or torch.bfloat16, "out_dtype" if out_dtype is not None else
                                   "out_dtype (default for fp8 inputs)")
        out_dtype = out_dtype or torch.bfloat16
        fkey = (out_dtype, *(_descale_key(d) for d in descales))
    smod = compile_mod(score_mod, "score") if score_mod is not None else None
    mkey, lists = _mask_key(block_mask, grad)
    plan = okey = None
    if mkey is not False:
        mask_fn = real_mask_mod(block_mask.mask_mod) if mkey is not None else None
        mmod = compile_mod(mask_fn, "mask") if mask_fn is not None else None
        okey = (smod, mmod, mkey, scale, bool(return_lse), bool(grad), forced_key(), fkey)
        plan = entry.get(okey)
    if plan is None:
        p, c = _describe(qkv, smod, block_mask, scale, out_dtype, return_lse, grad)
        plan = Plan(p, dispatch.select(p)[0], any(t is not None and t.stride(-1) != 1 for t in lists[1::2]))
        if okey is not None and _caching.on:
            entry[okey] = plan
        else:
            plan.kept = None  # Triton's normal launch
        c.descales = tuple(descales)
        return p, c, plan
    if not lists:
        return plan.p, FlexCall(query, key, value, descales=tuple(descales)), plan
    if plan.contiguous:  # as problem.mask_tensors makes them
        lists = tuple(t.contiguous() if i % 2 and t is not None else t for i, t in enumerate(lists))
    return plan.p, FlexCall(query, key, value, lists=lists[:4], tlists=lists[4:] or None,
                            descales=tuple(descales)), plan


def _describe(qkv, smod, block_mask, scale, out_dtype, return_lse, grad):
    """(FlexProblem, FlexCall) of checked tensors qkv: the block mask's lists checked (for a gradient also its
    transposed lists, and the score mod's derivative made)."""
    query, key, value = qkv
    B, H, Sq, _ = query.shape
    lists, blocks, mmod = None, None, None
    if block_mask is not None:
        lists, q_block, kv_block, mask_fn = mask_tensors(block_mask, B, H, Sq, key.shape[2], query.device)
        blocks = (q_block, kv_block)
        mmod = compile_mod(mask_fn, "mask") if mask_fn is not None else None
    p = FlexProblem.of(query, key, value, (smod, mmod), blocks, scale, out_dtype, bool(return_lse))
    c = FlexCall(query, key, value, lists=lists)
    if grad:
        if smod is not None:
            smod.grad_fn()  # an operation without a derivative raises here, before the forward runs
        if block_mask is not None:
            c.tlists = transposed_lists(block_mask, B, H, key.shape[2], query.device)
    return p, c
