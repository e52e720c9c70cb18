"""flex_attention: torch's FlexAttention programming model (score_mod, mask_mod, block masks) on tileattn."""
import torch
import triton

from ... import hw
from ..dense.fp8 import FP8_DTYPES, Fp8V, check_fp8_options, split_descales
from ..dense.launch import _debug_fill as debug_fill_nan
from . import launch_sm90
from .bwd import flex_bwd
from .kernels import flex_fwd_kernel
from .trace import compile_mod

_DTYPES = (torch.float16, torch.bfloat16)


def _pow2_divisor(block, preferred):
    """The largest power of two <= preferred that divides `block` (a mask block size)."""
    b = preferred
    while b > 16 and block % b:
        b //= 2
    return b


def _config(d, dv, q_block, kv_block):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): tiles dividing the mask's blocks; small under the
    interpreter."""
    if hw.interpreter_enabled():
        bm, bn, warps, stages = 32, 16, 4, 1
    elif max(d, dv) <= 64:
        bm, bn, warps, stages = 128, 64, 4, 3
    elif max(d, dv) <= 128:
        bm, bn, warps, stages = 128, 64, 8, 2
    else:
        bm, bn, warps, stages = 64, 32, 4, 2
    return _pow2_divisor(q_block, bm), _pow2_divisor(kv_block, bn), warps, stages


def _mask_tensors(block_mask, batch, heads, seqlen_q, seqlen_k, device):
    """(kv_num, kv_idx, full_num, full_idx, q_block, kv_block, mask_mod) of a torch BlockMask, checked."""
    for name in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE", "mask_mod"):
        if not hasattr(block_mask, name):
            raise TypeError(f"block_mask: expected a torch BlockMask (create_block_mask), got "
                            f"{type(block_mask).__name__}")
    q_block, kv_block = block_mask.BLOCK_SIZE
    if q_block % 16 or kv_block % 16:
        raise ValueError(f"block_mask: BLOCK_SIZE must be multiples of 16, got {block_mask.BLOCK_SIZE}")
    seq = getattr(block_mask, "seq_lengths", None)
    if seq is not None and tuple(seq) != (seqlen_q, seqlen_k):
        raise ValueError(f"block_mask: made for (Q_LEN, KV_LEN) = {tuple(seq)}, the inputs have "
                         f"({seqlen_q}, {seqlen_k})")
    num, idx, fnum, fidx = _checked_lists(
        block_mask, ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"), batch, heads,
        triton.cdiv(seqlen_q, q_block), "query", device)
    return num, idx, fnum, fidx, q_block, kv_block, block_mask.mask_mod


def _checked_lists(block_mask, names, batch, heads, blocks, what, device):
    """The four block-list tensors `names` (count, indices, full count, full indices; the full pair may be None)
    of a BlockMask, checked: int32 on device, batch / head dims broadcasting to (batch, heads), at least
    `blocks` rows of `what` blocks; indices made contiguous along the list."""
    lists = [getattr(block_mask, n, None) for n in names]
    for name, t in zip(names, lists):
        if t is None:
            continue
        if t.device != device or t.dtype != torch.int32:
            raise ValueError(f"block_mask.{name}: expected int32 on {device}, got {t.dtype} on {t.device}")
        if t.shape[0] not in (1, batch) or t.shape[1] not in (1, heads):
            raise ValueError(f"block_mask.{name}: batch / head dims {tuple(t.shape[:2])} do not broadcast to "
                             f"({batch}, {heads})")
        if t.shape[2] < blocks:
            raise ValueError(f"block_mask.{name}: {t.shape[2]} {what} blocks, the inputs need {blocks}")
    for i in (1, 3):
        if lists[i] is not None and lists[i].stride(-1) != 1:
            lists[i] = lists[i].contiguous()
    return tuple(lists)


def _transposed_lists(block_mask, batch, heads, seqlen_k, device):
    """(q_num, q_idx, full_q_num, full_q_idx) of a torch BlockMask (the query blocks of each key block, which
    the backward's dK/dV kernel walks), checked."""
    num, idx = getattr(block_mask, "q_num_blocks", None), getattr(block_mask, "q_indices", None)
    if num is None or idx is None:
        raise ValueError("block_mask: has no q_num_blocks / q_indices (made with compute_q_blocks=False?); the "
                         "backward pass needs them")
    return _checked_lists(block_mask, ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"), batch,
                          heads, triton.cdiv(seqlen_k, block_mask.BLOCK_SIZE[1]), "key", device)


def _value_shape(value):
    """value's [B, Hkv, Sk, Dv] (an Fp8V holds the dense layout [B, Sk, Hkv, Dv])."""
    if isinstance(value, Fp8V):
        b, s, h, d = value.shape
        return (b, h, s, d)
    return tuple(value.shape)


def _check(query, key, value, enable_gqa, scale):
    for name, t in (("query", query), ("key", key), ("value", value)):
        if name == "value" and isinstance(t, Fp8V):
            if t.device != query.device:
                raise ValueError(f"value: on {t.device}, query is on {query.device}")
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, H, S, D], got {t.dim()} dims")
        if t.dtype not in _DTYPES + FP8_DTYPES:
            raise TypeError(f"{name}: expected float16, bfloat16 or an fp8 dtype, got {t.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name}: on {t.device}, query is on {query.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    hw.check_kernel_device(query.device, "query, key and value")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"key / value: expected {query.dtype} like query, got {key.dtype} / {value.dtype}")
    B, H, _, D = query.shape
    vshape = _value_shape(value)
    if key.shape[0] != B or vshape[0] != B:
        raise ValueError(f"key / value: batch {key.shape[0]} / {vshape[0]}, query has {B}")
    if key.shape[3] != D:
        raise ValueError(f"key: head dim {key.shape[3]}, query has {D}")
    if key.shape[1] != vshape[1] or key.shape[2] != vshape[2]:
        raise ValueError(f"value: [B, H, S] {list(vshape[:3])} differ from key's {list(key.shape[:3])}")
    hkv = key.shape[1]
    if hkv != H and not (enable_gqa and hkv > 0 and H % hkv == 0):
        raise ValueError(f"key: {hkv} heads for {H} query heads (pass enable_gqa=True for grouped heads; H must "
                         f"be a multiple of the kv heads)")
    if not (16 <= D <= 256 and 1 <= vshape[3] <= 256):
        raise ValueError(f"query / value: head dims must be in 16..256, got D={D}, Dv={vshape[3]}")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale: expected a positive number, got {scale}")


def _dequantize(x, descale, group):
    """fp8 [B, H, S, D] (or an Fp8V, dense layout) times its descale ([B, Hkv] per kv head, or one value) as
    float32 [B, H, S, D]."""
    if isinstance(x, Fp8V):
        x = x.unpack().transpose(1, 2)
    x = x.float()
    if isinstance(descale, torch.Tensor) and descale.numel() > 1:
        return x * descale.repeat_interleave(group, dim=1)[:, :, None, None]
    return x * (float(descale) if descale is not None else 1.0)


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, *, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """Attention with a programmable score modifier and a block-sparse mask, as torch's flex_attention.

    query [B, Hq, Sq, D], key [B, Hkv, Sk, D], value [B, Hkv, Sk, Dv] (float16 / bfloat16, last dim contiguous);
    Hkv = Hq unless enable_gqa (Hq a multiple of Hkv; query head h reads kv head h // (Hq / Hkv)).
    score_mod(score, b, h, q_idx, kv_idx) -> score: plain Python on the scaled score (see trace.py for what
    it may use, captured tensors included; the same function works in torch's flex_attention).
    block_mask: a torch BlockMask (torch.nn.attention.flex_attention.create_block_mask or
    tileattn.create_block_mask): blocks it leaves out are skipped, its partial blocks apply its mask_mod, its
    full blocks do not. None: every key is visible. scale defaults to D ** -0.5.

    fp8 (float8_e4m3fn / e5m2) query, key and value, as tileattn.attention takes them: the real values are the
    stored ones times q_descale / k_descale / v_descale (numbers, or float32 [B, Hkv] per kv head); score_mod
    sees the real (descaled, scaled) scores; value plain [B, Hkv, Sk, Dv] (re-laid out on each call) or
    tileattn.fp8_v_layout(value.transpose(1, 2)) (an Fp8V: no copy); the output is out_dtype (default
    bfloat16). On the Hopper kernel's shapes (see launch_sm90.py) fp8 runs its fp8 path; elsewhere the inputs
    are dequantized to out_dtype first.

    Returns out [B, Hq, Sq, Dv] in query's dtype (fp8: out_dtype), and with return_lse also lse [B, Hq, Sq]
    float32 (natural log). Rows that see no key give 0 (lse -inf).

    Differentiable (float16 / bfloat16) in query, key and value, and through a returned lse: score_mod's
    derivative with respect to the score is generated from its trace (captured tensors get no gradient); GQA
    sums dk / dv over each group; deterministic (no atomics). The block mask must carry its transposed lists
    (q_num_blocks / q_indices, as create_block_mask makes them).
    """
    _check(query, key, value, enable_gqa, scale)
    check_fp8_options(query, key.transpose(1, 2), q_descale, k_descale, v_descale, out_dtype, query.shape[0])
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    scale = D ** -0.5 if scale is None else float(scale)
    fp8 = query.dtype in FP8_DTYPES
    smod = compile_mod(score_mod, "score") if score_mod is not None else None
    if block_mask is None:
        lists, q_block, kv_block, mmod = None, 128, 128, None
    else:
        num, idx, fnum, fidx, q_block, kv_block, mask_fn = _mask_tensors(block_mask, B, H, Sq, Sk, query.device)
        lists = (num, idx, fnum, fidx)
        mmod = compile_mod(mask_fn, "mask") if mask_fn is not None else None
    mods = (smod, mmod, lists, q_block, kv_block)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (query, key, value)):
        if fp8:
            raise NotImplementedError("flex_attention: fp8 inputs have no backward pass (detach them, or train in "
                                      "float16 / bfloat16)")
        if smod is not None:
            smod.grad_fn()  # an operation without a derivative raises here, before the forward runs
        tlists = None if block_mask is None else _transposed_lists(block_mask, B, H, Sk, query.device)
        out, lse = _FlexFn.apply(query, key, value, scale, mods, tlists)
        return (out, lse) if return_lse else out
    return _forward(query, key, value, scale, mods, return_lse, q_descale, k_descale, v_descale, out_dtype)


class _FlexFn(torch.autograd.Function):
    """flex_attention with its backward (bwd.py); returns (out, lse) so that a returned lse can be
    differentiated too."""

    @staticmethod
    def forward(ctx, query, key, value, scale, mods, tlists):
        out, lse = _forward(query, key, value, scale, mods, True)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.scale, ctx.mods, ctx.tlists = scale, mods, tlists
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        query, key, value, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        smod, mmod, lists, q_block, kv_block = ctx.mods
        dq, dk, dv = flex_bwd(dout, query, key, value, out, lse, dlse, ctx.scale, smod, mmod, lists, ctx.tlists,
                              q_block, kv_block)
        return dq, dk, dv, None, None, None


def _forward(query, key, value, scale, mods, return_lse, q_descale=None, k_descale=None, v_descale=None,
             out_dtype=None):
    """The forward pass on checked inputs: mods = (traced score mod, traced mask mod, the block mask's lists
    or None, Q block, KV block)."""
    smod, mmod, lists, q_block, kv_block = mods
    B, H, Sq, D = query.shape
    Sk, Dv = key.shape[2], _value_shape(value)[3]
    fp8 = query.dtype in FP8_DTYPES
    odt = (out_dtype or torch.bfloat16) if fp8 else query.dtype
    out = torch.empty(B, H, Sq, Dv, dtype=odt, device=query.device)
    lse = torch.empty(B, H, Sq, dtype=torch.float32, device=query.device) if return_lse else out
    if debug_fill_nan():  # tests: an element the kernel never writes fails the comparison
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    if Sq == 0 or B * H == 0:
        return (out, lse) if return_lse else out
    dense = lists is None
    num, idx, fnum, fidx = (None,) * 4 if dense else lists
    if launch_sm90.serves(query, key, value, q_block, kv_block):
        qk, vf, descales = split_descales(q_descale, k_descale, v_descale)
        launch_sm90.launch(query, key, value, out, lse, scale * qk, smod, mmod, lists, return_lse, descales, vf)
        return (out, lse) if return_lse else out
    if fp8:  # the portable kernel takes 16-bit inputs: dequantize (real values, then bfloat16)
        group = H // key.shape[1]
        query, key, value = (_dequantize(x, d, g).to(odt) for x, d, g in
                             ((query, q_descale, group), (key, k_descale, 1), (value, v_descale, 1)))
    bm, bn, warps, stages = _config(D, Dv, q_block, kv_block)
    dummy = out  # never read where a block-mask tensor is absent
    sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    grid = (triton.cdiv(Sq, bm), B * H)
    flex_fwd_kernel[grid](
        query, key, value, out, lse, num if num is not None else dummy, idx if idx is not None else dummy,
        fnum if fnum is not None else dummy, fidx if fidx is not None else dummy,
        smod.capture_args() if smod else (), mmod.capture_args() if mmod else (),
        query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), out.stride(0), out.stride(1), out.stride(2), *sl,
        *launch_sm90.mask_strides(num), *launch_sm90.mask_strides(idx), *launch_sm90.mask_strides(fnum),
        *launch_sm90.mask_strides(fidx),
        H, H // key.shape[1], Sq, Sk, D, Dv, scale,
        SCORE_MOD=smod.fn if smod else None, MASK_MOD=mmod.fn if mmod else None, DENSE=dense,
        HAS_FULL=fnum is not None, Q_BLOCK=q_block, KV_BLOCK=kv_block, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=triton.next_power_of_2(D), BLOCK_DV=triton.next_power_of_2(Dv), RETURN_LSE=return_lse,
        num_warps=warps, num_stages=stages,
    )
    return (out, lse) if return_lse else out
