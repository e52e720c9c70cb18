"""Public entry points of dense attention: attention, varlen_attention, scaled_dot_product_attention."""
from __future__ import annotations

import sys
import warnings

import torch

from ..common import fp8
from ..common.args import check_bool
from . import custom_ops, plans
from .problem import (
    MAX_GRAD_HEAD_DIM,
    AttnOptions,
    check_cu_seqlens_meta,
    check_device,
    check_inputs,
    check_options,
    check_sdpa_inputs,
    effective_window,
)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | fp8.Fp8V, *, causal: bool = False,
              scale: float | None = None, window: tuple[int, int] | list[int] = (-1, -1), softcap: float = 0.0,
              return_lse: bool = False, q_descale: fp8.Descale = None, k_descale: fp8.Descale = None,
              v_descale: fp8.Descale = None,
              out_dtype: torch.dtype | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward over padded batches.

    Args:
        q: [B, Sq, Hq, D]; k: [B, Sk, Hkv, D]; v: [B, Sk, Hkv, Dv]. float16, bfloat16, float8_e4m3fn or
            float8_e5m2, one dtype, one device. Any strides with a contiguous last dim (no copies are made;
            fp8 v may instead have a contiguous sequence dim, or be an `Fp8V`, see below). D and Dv:
            multiples of 8 in [32, 1024], Dv may differ from D. Above 256 (float16/bfloat16 only) a kernel
            that tiles the head dim serves the call (launch_large_d.py); gradients take D, Dv <= 512.
        causal: query i sees key j iff j <= i + Sk - Sq (aligned bottom-right, as FlashAttention >= 2.1;
            with Sq > Sk the first Sq - Sk query rows see nothing).
        scale: multiplier of q.k; default D ** -0.5.
        window: (left, right) local attention, i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 leaves
            that side unbounded, as does any bound >= 2 ** 30 (longer than any sequence). With causal=True the
            right bound is clipped to 0.
        softcap: if > 0, scores s become softcap * tanh(s / softcap) (s already scaled).
        return_lse: also return the log-sum-exp of the (scaled, capped) scores.
        q_descale, k_descale, v_descale: fp8 only. The real value of an element is its stored value times
            its descale: None (1), a positive number, or a float32 tensor of shape [B, Hkv] or one element
            (read on the device, no sync). `quantize_fp8` makes such tensors and descales.
        out_dtype: fp8 only: torch.bfloat16 (default) or torch.float16.

    GQA/MQA: Hq must be a multiple of Hkv; query head h uses key/value head h // (Hq // Hkv).

    fp8: scores are q.k * q_descale * k_descale * scale, in float32; the probabilities P are rounded to V's
    fp8 dtype (after a scaling by 2 ** 8, which keeps small ones out of the subnormal range) for the P V
    product, as FlashAttention-3 does. The fast V is an `Fp8V` (`fp8_v_layout(v)`: sequence-major, keys in
    the register order of the P operand; e.g. an fp8 KV cache kept that way): attention reads it without a
    copy. Any other fp8 V is re-laid out inside each call on Hopper, a read and a write of V that costs 1-5%
    of the call at D = 128, N = 4K-16K on an H100, up to 24% at N = 1K (bench/results/h100/fp8.json, rows
    tileattn-e4m3-vrow).
    An fp8 k/v with a float16/bfloat16 q is refused (quantize q as well, `quantize_fp8`).

    Returns:
        out [B, Sq, Hq, Dv] in q's dtype (fp8: out_dtype); with return_lse, (out, lse) with lse [B, Hq, Sq]
        float32 (natural log). A row that sees no key gets out = 0 and lse = -inf.
    """
    if q_descale is None and k_descale is None and v_descale is None and out_dtype is None \
            and getattr(q, "dtype", None) not in fp8.FP8_DTYPES:
        if _plain_eager(q, k, v):
            return plans.attention_eager(q, k, v, causal, scale, window, softcap, return_lse)
        if _plain_tracked(q, k, v, None, None) and plans.checked(q, k, v):
            return _attention_tracked(q, k, v, causal, scale, window, softcap, return_lse)
    v_packed = isinstance(v, fp8.Fp8V)
    if v_packed:
        v = v.view()  # the sequence-major view the kernels take (keys in packed order)
    check_inputs(q, k, v, varlen=False)
    check_options(causal, scale, window, softcap, return_lse)
    fp8.check_fp8_options(q, k, q_descale, k_descale, v_descale, out_dtype, q.shape[0])
    check_device(q, k, v)
    qk_factor, out_scale, descales = fp8.split_descales(q_descale, k_descale, v_descale)
    opts = AttnOptions(scale=_scale(q, scale) * qk_factor, window=effective_window(causal, window),
                       softcap=float(softcap), return_lse=bool(return_lse), out_scale=out_scale,
                       out_dtype=_out_dtype(q, out_dtype), v_packed=v_packed)
    return _run(q, k, v, (), descales, opts)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     scale: float | None = None, window: tuple[int, int] | list[int] = (-1, -1),
                     softcap: float = 0.0, return_lse: bool = False, q_descale: fp8.Descale = None,
                     k_descale: fp8.Descale = None, v_descale: fp8.Descale = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward over packed variable-length sequences.

    Args:
        q: [total_q, Hq, D]; k: [total_k, Hkv, D]; v: [total_k, Hkv, Dv] (same dtypes, strides and head-dim
            rules as `attention`).
        cu_seqlens_q, cu_seqlens_k: int32 [B + 1] cumulative lengths starting at 0; sequence b is rows
            cu[b]:cu[b + 1]. Empty sequences are allowed. The values are checked on the host (one small
            device-to-host copy per call).
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence (they size the launch grid; a value above the
            packed length counts as the packed length).
        causal, scale, window, softcap, return_lse: as in `attention`, per sequence (causal aligned
            bottom-right within each sequence).
        q_descale, k_descale, v_descale, out_dtype: fp8 as in `attention`, descale tensors of shape
            [B, Hkv] with B = len(cu_seqlens_q) - 1 (or one element). fp8 varlen runs on the portable
            kernel (any V layout, no transpose).

    Returns:
        out [total_q, Hq, Dv] in q's dtype (fp8: out_dtype); with return_lse, (out, lse) with lse
        [Hq, total_q] float32. Rows (and lse entries) from cu_seqlens_q[-1] on (padding after the last
        sequence) are left unwritten, as in FlashAttention.
    """
    check_inputs(q, k, v, varlen=True)
    check_options(causal, scale, window, softcap, return_lse)
    check_cu_seqlens_meta(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    fp8.check_fp8_options(q, k, q_descale, k_descale, v_descale, out_dtype, cu_seqlens_q.shape[0] - 1)
    check_device(q, k, v, cu_seqlens_q, cu_seqlens_k)
    qk_factor, out_scale, descales = fp8.split_descales(q_descale, k_descale, v_descale)
    opts = AttnOptions(scale=_scale(q, scale) * qk_factor, window=effective_window(causal, window),
                       softcap=float(softcap), return_lse=bool(return_lse), max_seqlen_q=int(max_seqlen_q),
                       max_seqlen_k=int(max_seqlen_k), out_scale=out_scale, out_dtype=_out_dtype(q, out_dtype))
    return _run(q, k, v, (cu_seqlens_q, cu_seqlens_k), descales, opts)


def _plain(*tensors):
    """Eager plain tensors (None allowed): no tensor subclass (FakeTensor, Parameter, DTensor), nothing to trace."""
    return all(t is None or type(t) is torch.Tensor for t in tensors) and not torch.compiler.is_compiling()


def _plain_eager(q, k, v):
    """A call with plain tensors, nothing to trace and no gradient to track. It goes straight to the launch
    plans (plans.attention_eager): the registered op's dispatcher costs ~100 us a call on the H100 host,
    as long as the whole kernel at N = 1K. Tensor subclasses (FakeTensor, Parameter) take the op."""
    return _plain(q, k, v) and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))


def _plain_tracked(q, k, v, cu_q, cu_k):
    """An eager 16-bit call on plain tensors that tracks a gradient: it takes custom_ops.EagerAttn (the same
    forward and backward as the registered op, ~90 us less host time per call). Compiling, tensor subclasses,
    torch.func transforms, dispatch modes (FlopCounterMode, make_fx: they see the op) and fp8 (whose op raises
    on backward) take the op. (torch._C's checks: torch >= 2.4.)"""
    return (_plain(q, k, v, cu_q, cu_k) and q.dtype not in fp8.FP8_DTYPES
            and not torch._C._are_functorch_transforms_active() and torch._C._len_torch_dispatch_stack() == 0)


_tracked_options = {}  # the registered op's options string per (option values, head dim), built once


def _attention_tracked(q, k, v, causal, scale, window, softcap, return_lse):
    """attention() for an eager 16-bit call on plain tensors that tracks a gradient, tensors already checked
    (plans.checked): the options checked, their string for custom_ops.EagerAttn built once per option values
    (AttnOptions.encode costs ~10 us of Python a call, scripts/host_overhead.py --cpu), then the same forward and
    backward as _run's."""
    check_options(causal, scale, window, softcap, return_lse)
    _check_grad_head_dim(q, v)
    key = (scale, causal, window[0], window[1], softcap, bool(return_lse), q.shape[-1])
    options = _tracked_options.get(key)
    if options is None:
        options = AttnOptions(scale=_scale(q, scale), window=effective_window(causal, window),
                              softcap=float(softcap), return_lse=True).encode()
        if len(_tracked_options) >= 1024:
            _tracked_options.clear()
        _tracked_options[key] = options
    out, lse = custom_ops.EagerAttn.apply(q, k, v, None, None, options)
    return (out, lse) if return_lse else out


def _check_grad_head_dim(q, v):
    if max(q.shape[-1], v.shape[-1]) > MAX_GRAD_HEAD_DIM:
        raise ValueError(f"q, k or v requires grad, but the backward takes head dims up to "
                         f"{MAX_GRAD_HEAD_DIM} (got D={q.shape[-1]}, Dv={v.shape[-1]}); run the forward "
                         f"under torch.no_grad() or detach the inputs")


def _scale(q, scale):
    return float(q.shape[-1] ** -0.5 if scale is None else scale)


def _out_dtype(q, out_dtype):
    """fp8 inputs give bfloat16 unless asked otherwise; other inputs their own dtype."""
    return (out_dtype or torch.bfloat16) if q.dtype in fp8.FP8_DTYPES else None


def _run(q, k, v, cu_seqlens, descales, opts):
    """The forward of checked inputs: through the registered op where torch.compile traces or autograd records
    (a tracked gradient asks for the lse: the backward recomputes the probabilities from it), else straight to
    the launch plans. descales: fp8.split_descales' tensors; opts: AttnOptions (return_lse as the caller asked)."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if grad:
        _check_grad_head_dim(q, v)
    run_opts = opts.with_lse() if grad and not opts.return_lse else opts
    descales = None if descales[0] is None else descales
    # The registered op is what torch.compile traces and what autograd sees; an eager call with no gradient
    # to track (varlen, fp8, tensor subclasses; plain batched calls never get here) skips the op dispatcher.
    if torch.compiler.is_compiling() or grad:
        cu_q, cu_k = cu_seqlens or (None, None)
        if grad and _plain_tracked(q, k, v, cu_q, cu_k):
            out, lse = custom_ops.EagerAttn.apply(q, k, v, cu_q, cu_k, run_opts.encode())
        elif q.dtype in fp8.FP8_DTYPES:
            out, lse = custom_ops.attn_fwd_fp8(q, k, v, cu_q, cu_k, list(descales or ()), run_opts.encode())
        else:
            out, lse = custom_ops.attn_fwd(q, k, v, cu_q, cu_k, run_opts.encode())
    else:
        out, lse = plans.attn_fwd(q, k, v, cu_seqlens, descales, run_opts)
    return (out, lse) if opts.return_lse else out


_warned = set()


def _warn_once(key, msg):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=3)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """Drop-in for torch.nn.functional.scaled_dot_product_attention.

    Layout [B, H, S, D] as torch's (any strides with a contiguous last dim); causal is aligned top-left as
    torch does (query i sees key j iff j <= i). GQA needs enable_gqa=True, as in torch. dtypes and head dims
    as in `attention`.

    Fallbacks: a call with attn_mask (boolean or additive) or dropout_p > 0 is handed to torch's own
    scaled_dot_product_attention, with one warning per kind of fallback.

    Returns the output [B, Hq, Sq, Dv] in the input dtype, contiguous in that layout.
    """
    check_bool("is_causal", is_causal)  # a truthy "False" is no bool: torch refuses it too
    check_bool("enable_gqa", enable_gqa)
    if attn_mask is not None or dropout_p > 0.0:
        what = "attn_mask" if attn_mask is not None else "dropout_p > 0"
        _warn_once(what, f"tileattn.scaled_dot_product_attention: {what} is not supported by tileattn's "
                         f"kernels; falling back to torch.nn.functional.scaled_dot_product_attention")
        return torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=bool(is_causal), scale=scale,
            enable_gqa=bool(enable_gqa))  # (numpy bools as Python's: torch takes only these)
    if _plain_eager(query, key, value):
        return plans.sdpa_eager(query, key, value, bool(is_causal), scale, enable_gqa)
    check_sdpa_inputs(query, key, value, enable_gqa)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    check_inputs(q, k, v, varlen=False)
    check_options(bool(is_causal), scale, (-1, -1), 0.0)
    check_device(q, k, v, name="query")
    opts = AttnOptions(scale=_scale(q, scale), window=(-1, 0 if is_causal else -1), bottom_right=False)
    out = _run(q, k, v, (), (None, None, None), opts)
    return out.transpose(1, 2)


def _bind_on_package():
    """tileattn/__init__.py loads this module through a module-level __getattr__, which Python runs on every
    `tileattn.attention` lookup (~3 us a call, scripts/host_overhead.py --cpu); binding the public names on
    the package once turns later lookups into plain attribute reads."""
    package = sys.modules.get(__name__.split(".")[0])
    if package is not None:
        for name in ("attention", "varlen_attention", "scaled_dot_product_attention"):
            setattr(package, name, globals()[name])


_bind_on_package()
