"""Hugging Face transformers integration: "tileattn" as an attention implementation.

    import tileattn.integrations.transformers as tileattn_hf
    tileattn_hf.register()                              # once per process (idempotent); returns "tileattn"
    model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, attn_implementation="tileattn")
    model.set_attn_implementation("tileattn")           # or switch a model already loaded

What runs on tileattn's kernels (float16 / bfloat16; float32 queries are cast to the autocast dtype, else to the
module's float16 / bfloat16 weights' dtype, as transformers' FlashAttention path does):
- MHA / GQA / MQA: transformers passes query [B, Hq, Sq, D] and key / value [B, Hkv, Sk, D(v)]; they go to
  `tileattn.attention` as [B, S, H, D] views (no copy); the output is [B, Sq, Hq, Dv], contiguous.
- `scaling`; `softcap` (Gemma 2); `sliding_window` w: a causal query sees itself and the w - 1 keys before it,
  window (w - 1, 0), as HF's SDPA mask (kv_idx > q_idx - w); a non-causal one (w - 1, w - 1), as HF's
  FlashAttention path.
- causal aligned bottom-right (the last query sees the last key): prefill, chunked prefill and decode over
  transformers' caches (DynamicCache, sliding-window layers, StaticCache).
- padded batches: `build_mask` hands the attention a 2-D bool padding mask (None without padding), as transformers
  does for FlashAttention; keys / values (and, for causal modules, queries) are unpadded into
  `tileattn.varlen_attention` and the output scattered back, padding query rows 0. Causal queries are the last Sq
  positions of the mask (left padding, as generation pads); non-causal ones all attend (encoders, cross-attention).
- packed sequences (several per row, position_ids restarting, no padding mask, no cache: padding-free training):
  one varlen_attention call over the packed rows.
- non-causal modules (`module.is_causal` False, or an `is_causal=False` argument).
- training: gradients flow through tileattn's backward.

Falls back to transformers' SDPA function, with one warning per reason: dropout > 0, a 4-D mask (one the user
passes, or the mask `build_mask` makes for patterns tileattn does not express: image-token overlays, chunked
attention, custom mask functions), position_bias. Raises ValueError: output_attentions (no weights are computed),
attention sinks (s_aux), transformers' paged cache (continuous batching), and softcap in a call that needs the
fallback (SDPA has no softcap). Padded and packed batches read their lengths on the host (a sync per call).

Verified (CPU, Triton interpreter) with transformers 4.57.6, 5.17.0 and 5.23.0.
"""
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import masking_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import tileattn

NAME = "tileattn"
_HALF = (torch.float16, torch.bfloat16)


def register():
    """Registers NAME with transformers' AttentionInterface and AttentionMaskInterface (idempotent: a second call
    re-registers the same functions). Returns NAME, the value of `attn_implementation`."""
    from transformers import AttentionInterface
    AttentionInterface.register(NAME, attention_forward)
    masking_utils.AttentionMaskInterface.register(NAME, build_mask)
    return NAME


@dataclass(frozen=True)
class _Options:
    causal: bool
    scale: float | None
    window: tuple
    softcap: float
    dropout: float


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The attention function transformers calls for attn_implementation="tileattn".

    query [B, Hq, Sq, D]; key, value [B, Hkv, Sk, D(v)]; attention_mask: what `build_mask` returns (None, a 2-D
    bool padding mask, a 2-D integer packed-sequence mask), or a 4-D mask (SDPA fallback); kwargs: sliding_window,
    softcap, is_causal and whatever else the model passes. Returns (out [B, Sq, Hq, Dv] contiguous, None).
    """
    _refuse(attention_mask, kwargs)
    opts = _options(module, scaling, dropout, kwargs)
    reason = _fallback_reason(attention_mask, opts, kwargs)
    if reason is not None:
        return _sdpa_fallback(module, (query, key, value), attention_mask, opts, reason, kwargs)
    dtype = _compute_dtype(module, query)
    q, k, v = (t.transpose(1, 2).to(dtype) for t in (query, key, value))  # [B, S, H, D] views
    if attention_mask is None:
        out = tileattn.attention(q, k, v, causal=opts.causal, scale=opts.scale, window=opts.window,
                                 softcap=opts.softcap)
    elif attention_mask.dtype == torch.bool:
        out = _padded_attention(q, k, v, attention_mask, opts)
    else:
        out = _packed_attention(q, k, v, attention_mask, opts)
    return out.contiguous(), None


def build_mask(batch_size, kv_length, mask_function=masking_utils.causal_mask_function, attention_mask=None,
               **kwargs):
    """The mask function transformers calls for "tileattn" (create_causal_mask & co., once per forward and kind of
    layer). Returns what `attention_forward` takes:
    - None: no padding; the attention applies causal / sliding window itself, from its arguments;
    - a 2-D bool mask [B, L] over the first L <= Sk keys (True: a token): the padding mask at the keys' positions
      (kv_offset ...), as SDPA's mask reads it; a causal mask ends at the last query (a static cache's empty slots
      after it are cut off), so that the queries are its last Sq positions;
    - a 2-D integer mask [B, S]: packed sequences, each token's sequence index within its row (transformers'
      packed_sequence_mask);
    - for a pattern tileattn does not express, the 4-D mask SDPA would get (`attention_forward` then falls back).
    """
    kind, packed = _pattern(mask_function)
    if kind is not None and packed is not None and attention_mask is None and not bool((packed[:, -1] == 0).all()):
        return packed  # (transformers 4.x also sends rows of one sequence each: those need no mask)
    if kind is None or (packed is not None and attention_mask is not None):
        kwargs["allow_is_causal_skip"] = False
        return masking_utils.sdpa_mask(batch_size=batch_size, kv_length=kv_length, mask_function=mask_function,
                                       attention_mask=attention_mask, **kwargs)
    start = kwargs.get("kv_offset", 0)
    end = start + kv_length  # the keys' positions: start ... end - 1
    if kind == "causal":
        end = min(end, _query_end(kwargs, end))
    if attention_mask is None:
        if end == start + kv_length:
            return None
        device = kwargs.get("device") or next(t.device for t in kwargs.values() if torch.is_tensor(t))
        attention_mask = torch.ones(batch_size, end, dtype=torch.bool, device=device)
    mask = attention_mask[:, start:end]
    return None if mask.shape[1] == kv_length and mask.all() else mask


def _query_end(kwargs, default):
    """The position after the last query: q_offset + q_length (transformers >= 5), cache_position[-1] + 1 (4.x).
    A static cache gives a tensor (read here: one sync per mask)."""
    if "q_length" in kwargs:
        end = kwargs.get("q_offset", 0) + kwargs["q_length"]
    elif kwargs.get("cache_position") is not None:
        end = kwargs["cache_position"][-1] + 1
    else:
        return default
    return int(end)


_OVERLAYS = ("sliding_window_overlay.<locals>.inner_mask", "sliding_window_bidirectional_overlay.<locals>.inner_mask")


def _pattern(fn):
    """(kind, packed) of a masking_utils mask function. kind: "causal" or "bidirectional" when the attention applies
    it from its own arguments: those two, and-ed with HF's sliding-window overlays (their size comes as
    `sliding_window`) and packed-sequence masks (packed: their [B, S] sequence-index tensor, else None); kind None
    for anything else (chunked attention, image tokens, user functions)."""
    mu = masking_utils
    kinds, packed = set(), None
    for f in _and_parts(fn):
        name = getattr(f, "__qualname__", "") if getattr(f, "__module__", None) == mu.__name__ else ""
        if f is mu.causal_mask_function:
            kinds.add("causal")
        elif f is getattr(mu, "bidirectional_mask_function", None):  # transformers >= 5
            kinds.add("bidirectional")
        elif name == "packed_sequence_mask_function.<locals>.inner_mask":
            packed = _closure(f, "packed_sequence_mask")
        elif name not in _OVERLAYS:
            return None, None
    return (kinds.pop() if len(kinds) == 1 else None), packed


def _and_parts(fn):
    """The functions and_masks (and the position remap of packed sequences) combine, flattened; else [fn]."""
    name = getattr(fn, "__qualname__", "") if getattr(fn, "__module__", None) == masking_utils.__name__ else ""
    if name == "and_masks.<locals>.and_mask":
        return [part for f in (_closure(fn, "mask_functions") or ()) for part in _and_parts(f)]
    if name == "remap_positions_for_packed_sequence.<locals>.inner_mask":
        return _and_parts(_closure(fn, "mask_function"))
    return [fn]


def _closure(fn, name):
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return cells[name].cell_contents if name in cells else None


def _refuse(attention_mask, kwargs):
    """Requests no result of this function can honour, not even through the SDPA fallback."""
    if kwargs.get("output_attentions"):
        raise ValueError("tileattn computes no attention weights (output_attentions=True): load the model with "
                         "attn_implementation='eager' to get them")
    if kwargs.get("s_aux") is not None:
        raise ValueError("tileattn's transformers integration has no attention sinks (s_aux); use "
                         "tileattn.kvcache_attention(..., sinks=...) directly, or another attn_implementation")
    if kwargs.get("cache") is not None or kwargs.get("block_table") is not None:
        raise ValueError("tileattn's transformers integration does not serve transformers' paged cache "
                         "(continuous batching); tileattn.kvcache_attention / KVCachePlan serve paged caches")
    if attention_mask is not None and not torch.is_tensor(attention_mask):
        raise TypeError(f"attention_mask: expected None or a torch.Tensor, got {type(attention_mask).__name__} "
                        f"(a flex_attention BlockMask goes with attn_implementation='flex_attention')")


def _options(module, scaling, dropout, kwargs):
    """The call's options; pops is_causal, softcap and sliding_window from kwargs."""
    causal = kwargs.pop("is_causal", None)
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    w = kwargs.pop("sliding_window", None)
    window = (-1, -1) if w is None else (w - 1, 0 if causal else w - 1)
    return _Options(causal, scaling, window, float(kwargs.pop("softcap", None) or 0.0), float(dropout or 0.0))


def _fallback_reason(attention_mask, opts, kwargs):
    if opts.dropout > 0:
        return "attention dropout > 0 (tileattn has no dropout)"
    if attention_mask is not None and attention_mask.dim() == 4:
        return ("a 4-D attention mask (a custom mask, or a pattern tileattn does not express: image-token overlays, "
                "chunked attention, custom mask functions)")
    if kwargs.get("position_bias") is not None:
        return "position_bias (an additive bias)"
    return None


def _compute_dtype(module, query):
    """float16 / bfloat16 for the kernels: the query's, else autocast's, else the module's weights' (PEFT casts
    hidden states to float32, as transformers' FlashAttention path handles)."""
    if query.dtype in _HALF:
        return query.dtype
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    dtype = next((p.dtype for p in module.parameters() if p.dtype in _HALF), None)
    if dtype is None:
        raise TypeError(f"tileattn runs float16 / bfloat16 attention, and this model computes attention in "
                        f"{query.dtype}: load it with dtype=torch.bfloat16 (or float16), or run it under "
                        f"torch.autocast")
    return dtype


def _padded_attention(q, k, v, mask, opts):
    """A padded batch through varlen_attention. q [B, Sq, Hq, D], k / v [B, Sk, Hkv, D(v)]; mask [B, L] bool
    (True: a token) over the first L <= Sk keys. Returns [B, Sq, Hq, Dv], padding query rows 0."""
    B, Sq, L = q.shape[0], q.shape[1], mask.shape[1]
    if opts.causal and Sq > L:
        raise ValueError(f"a causal call with {Sq} queries and a padding mask over {L} keys: the queries must be the "
                         f"mask's last positions")
    # the longest sequences are bounded by L and Sq: passing the bounds reads no length back to the host
    kb, ks = mask.nonzero(as_tuple=True)
    cu_k, max_k = _cu_seqlens(mask.sum(1, dtype=torch.int32)), L
    if not opts.causal:  # every query attends (a cross-attention's queries are not the keys' tokens)
        cu_q = torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32, device=q.device)
        out = tileattn.varlen_attention(q.reshape(B * Sq, *q.shape[2:]), k[kb, ks], v[kb, ks], cu_q, cu_k, Sq, max_k,
                                        causal=False, scale=opts.scale, window=opts.window, softcap=opts.softcap)
        return out.view(B, Sq, *out.shape[1:])
    q_mask = mask[:, L - Sq:]  # the queries are the last Sq tokens (left padding when Sq < L, as FlashAttention's)
    qb, qs = q_mask.nonzero(as_tuple=True)
    cu_q, max_q = _cu_seqlens(q_mask.sum(1, dtype=torch.int32)), Sq
    out = tileattn.varlen_attention(q[qb, qs], k[kb, ks], v[kb, ks], cu_q, cu_k, max_q, max_k, causal=True,
                                    scale=opts.scale, window=opts.window, softcap=opts.softcap)
    return out.new_zeros(B, Sq, *out.shape[1:]).index_put((qb, qs), out)


def _packed_attention(q, k, v, seq, opts):
    """Packed sequences through varlen_attention: seq [B, S] int, each token's sequence index within its row
    (Sq = Sk = S, no padding). Returns [B, S, Hq, Dv]."""
    B, S = seq.shape
    if q.shape[1] != S or k.shape[1] != S:
        raise ValueError(f"packed sequences take Sq = Sk = {S} (no cache), got Sq={q.shape[1]}, Sk={k.shape[1]}")
    first = F.pad(seq.diff(dim=1) != 0, (1, 0), value=True).flatten()  # a sequence starts at each row and change
    starts = first.nonzero().squeeze(1)
    cu, max_len = _cu_seqlens(torch.diff(starts, append=starts.new_tensor([B * S])).to(torch.int32)), S
    rows = (t.reshape(B * S, *t.shape[2:]) for t in (q, k, v))
    out = tileattn.varlen_attention(*rows, cu, cu, max_len, max_len, causal=opts.causal, scale=opts.scale,
                                    window=opts.window, softcap=opts.softcap)
    return out.view(B, S, *out.shape[1:])


def _cu_seqlens(lens):
    """int32 cumulative lengths [0, l0, l0 + l1, ...]."""
    return F.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))


def _sdpa_fallback(module, qkv, mask, opts, reason, kwargs):
    """transformers' SDPA attention with the same semantics; padding query rows of causal calls 0, as above."""
    if opts.softcap:
        raise ValueError(f"tileattn: {reason} needs transformers' SDPA attention, which has no softcap; load this "
                         f"model with attn_implementation='eager'")
    _warn_once(reason, f"tileattn (transformers integration): {reason}; these calls run transformers' "
                       f"SDPA attention instead")
    query, key, value = qkv
    dead = None
    if mask is None or mask.dim() == 2:
        if mask is not None and mask.dtype == torch.bool:
            key, value = key[:, :, :mask.shape[1]], value[:, :, :mask.shape[1]]
        mask, dead = _dense_mask(mask, query.shape[2], key.shape[2], opts, query.device)
    causal = opts.causal and mask is None and query.shape[2] > 1  # transformers 4.x takes it literally
    out, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=opts.dropout, scaling=opts.scale,
                                    is_causal=causal, **kwargs)
    return (out if dead is None else out.masked_fill(dead, 0)), None


def _dense_mask(mask2d, Sq, Sk, opts, device):
    """The bool [B, 1, Sq, Sk] mask of causal (bottom-right) / window / `build_mask`'s 2-D mask (padding, or packed
    sequences: a token sees its own sequence), and the query rows to zero [B, Sq, 1, 1]; (None, None) where SDPA's
    own is_causal says the same (Sq == Sk, or one query)."""
    if mask2d is None and opts.window == (-1, -1) and (Sq == Sk or Sq == 1 or not opts.causal):
        return None, None
    i = torch.arange(Sq, device=device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=device)[None, :]
    left, right = opts.window
    vis = ((j <= i) if opts.causal else torch.ones(Sq, Sk, dtype=torch.bool, device=device))[None, None]
    if left >= 0:
        vis = vis & (j >= i - left)
    if right >= 0:
        vis = vis & (j <= i + right)
    pad = mask2d is not None and mask2d.dtype == torch.bool
    if pad:
        vis = vis & mask2d[:, None, None, :]
    elif mask2d is not None:
        vis = vis & (mask2d[:, None, :, None] == mask2d[:, None, None, :])
    dead = ~vis.any(-1)  # [B, 1, Sq]: rows that see no key (softmax of nothing); they attend to all, then read 0
    if opts.causal and pad and Sq <= Sk:
        dead = dead | ~mask2d[:, None, Sk - Sq:]
    return vis | dead[..., None], dead.squeeze(1)[..., None, None]


_warned = set()


def _warn_once(key, msg):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=4)
