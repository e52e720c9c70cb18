"""The description of one flex_attention call, and its checks.

    FlexProblem  shapes, dtypes, the block mask's geometry, the traced mods, options: what dispatch and the
                 backends take, with the tensors of the call (FlexCall)
    FlexCall     the call's tensors: query, key, value (an fp8 value may be an Fp8V), out, lse, the block
                 mask's lists (kv_num, kv_idx, full_num, full_idx; None without a block mask), for the
                 backward its transposed lists (q_num, q_idx, full_q_num, full_q_idx), and the mods' captured
                 tensors
    FlexOptions  what the registered ops (custom_ops.py) take besides tensors, as one string
Every check raises TypeError / ValueError naming the argument, before any launch.
"""
import ast
import functools
import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import triton
from torch.nn.attention.flex_attention import noop_mask

from ... import hw
from ..common.fp8 import FP8_DTYPES, Fp8V
from ..common.tma import tma_ok

DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True, eq=False)
class FlexProblem:
    """One flex attention forward: query [B, Hq, Sq, D], key [B, Hkv, Sk, D], value [B, Hkv, Sk, Dv]."""
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    out_dtype: torch.dtype
    device: torch.device
    scale: float  # fp8: number descales of q and k folded in
    score_mod: Any = None  # trace.ModSpec or None
    mask_mod: Any = None
    has_block_mask: bool = False  # False: every key visible (every block full)
    q_block: int = 128  # the block mask's block sizes (128 x 128 without one)
    kv_block: int = 128
    return_lse: bool = False
    tma: bool = False  # query, key (and a plain value) suit tensor descriptors, seen as [B, S, H, D]

    @property
    def fp8(self) -> bool:
        return self.dtype in FP8_DTYPES

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @staticmethod
    def of(query, key, value, mods, blocks, scale, out_dtype, return_lse):
        """The problem of checked inputs: mods (score mod, mask mod), each a trace.ModSpec or None; blocks
        (q_block, kv_block) of the block mask, or None without one; scale None for D ** -0.5."""
        B, H, Sq, D = query.shape
        views = [t.transpose(1, 2) for t in (query, key) + ((value,) if isinstance(value, torch.Tensor) else ())]
        q_block, kv_block = blocks or (128, 128)
        return FlexProblem(B, H, key.shape[1], Sq, key.shape[2], D, value_shape(value)[3], query.dtype, out_dtype,
                           query.device, D ** -0.5 if scale is None else float(scale), *mods,
                           blocks is not None, q_block, kv_block, return_lse, tma=all(tma_ok(t) for t in views))


@dataclass
class FlexCall:
    query: torch.Tensor
    key: torch.Tensor
    value: Any  # a tensor, or an Fp8V
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    lists: tuple | None = None
    tlists: tuple | None = None
    descales: tuple = (None, None, None)  # fp8: q_descale, k_descale, v_descale as the caller gave them
    captures: tuple | None = None  # (score mod's, mask mod's) tensors in ModSpec.captures' order; None: those


@dataclass(frozen=True)
class FlexOptions:
    """A flex call's non-tensor arguments to the registered ops, and the layout of their tensor list: the score
    mod's captures, the mask mod's, then the block-mask lists present (`lists`: one 0/1 per name of LISTS, ""
    without a block mask)."""
    score: str = ""  # the traced score mod's source digest (trace.spec_of), "" without one
    n_score: int = 0
    mask: str = ""
    n_mask: int = 0
    q_block: int = 128
    kv_block: int = 128
    lists: str = ""
    scale: float | None = None  # None: D ** -0.5 (taken from the real shapes, never a symbolic float)
    return_lse: bool = False  # asked for, or needed by the backward

    LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
             "full_q_num_blocks", "full_q_indices")

    def encode(self) -> str:
        """The options as `name=repr(value);...` (decode reverses it, floats exactly)."""
        return ";".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def decode(text: str) -> "FlexOptions":
        return FlexOptions(**{k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in text.split(";"))})


def mod_captures(p, c):
    """(the score mod's captured tensors, the mask mod's) for call c of problem p: the call's own (the registered
    op's, custom_ops.py), else the traced mods' (ModSpec.captures)."""
    if c.captures is not None:
        for spec, caps in zip((p.score_mod, p.mask_mod), c.captures):
            if spec is not None:
                spec.check_captures(caps)
        captures = c.captures
    else:
        captures = (p.score_mod.captures if p.score_mod else (), p.mask_mod.captures if p.mask_mod else ())
    check_captures_device(p, captures)
    return captures


def value_shape(value):
    """value's [B, Hkv, Sk, Dv] (an Fp8V holds the dense layout [B, Sk, Hkv, Dv])."""
    if isinstance(value, Fp8V):
        b, s, h, d = value.shape
        return (b, h, s, d)
    return tuple(value.shape)


# positions below 2^24 are exact in float32: trace.py evaluates index differences that meet a float in float32
MAX_SEQLEN = 2 ** 24


def check_inputs(query, key, value, enable_gqa, scale):
    for name, t in (("query", query), ("key", key), ("value", value)):
        if name == "value" and isinstance(t, Fp8V):
            if t.device != query.device:
                raise ValueError(f"value: on {t.device}, query is on {query.device}")
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected [B, H, S, D], got {t.dim()} dims")
        if t.dtype not in DTYPES + FP8_DTYPES:
            raise TypeError(f"{name}: expected float16, bfloat16 or an fp8 dtype, got {t.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name}: on {t.device}, query is on {query.device}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    hw.check_kernel_device(query.device, "query, key and value")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"key / value: expected {query.dtype} like query, got {key.dtype} / {value.dtype}")
    B, H, _, D = query.shape
    vshape = value_shape(value)
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
    check_scale(scale)
    if max(query.shape[2], key.shape[2]) > MAX_SEQLEN:
        raise ValueError(f"query / key: sequence lengths {query.shape[2]} / {key.shape[2]}; flex_attention serves "
                         f"up to {MAX_SEQLEN} tokens (mods may see positions as exact float32 values)")
    hw.check_interpreter_dtype(query.dtype, "query")


def check_scale(scale):
    # (comparisons, not math.isfinite: a scale that Dynamo traces as a symbol compares without a guard)
    if scale is None:
        return
    try:
        ok = not isinstance(scale, bool) and 0 < scale < math.inf
    except TypeError:  # a string, a list ...: no number to compare
        raise TypeError(f"scale: expected a finite positive number, got {type(scale).__name__} {scale!r}") from None
    if not ok:
        raise ValueError(f"scale: expected a finite positive number, got {scale!r}")


def check_captures_device(p, captures):
    """Every captured tensor (mod_captures' pair of tuples) on the device of the call's query."""
    for kind, caps in zip(("score", "mask"), captures):
        for i, t in enumerate(caps):
            if t.device != p.device:
                raise ValueError(f"the {kind}_mod's captured tensor {i} {tuple(t.shape)} is on {t.device}, query "
                                 f"is on {p.device}: move it to the query's device")


def mask_tensors(block_mask, batch, heads, seqlen_q, seqlen_k, device):
    """(lists, q_block, kv_block, mask_mod) of a torch BlockMask, checked: lists = (kv_num, kv_idx, full_num,
    full_idx), the full pair None when the mask has none."""
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
    lists = _checked_lists(block_mask, ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"),
                           (batch, heads), triton.cdiv(seqlen_q, q_block), "query", device)
    return lists, q_block, kv_block, real_mask_mod(block_mask.mask_mod)


def real_mask_mod(mask_mod):
    """The block mask's mask_mod, or None for torch's default (noop_mask: every key of a listed partial block is
    visible, which a block mask without a mask_mod means here too; BlockMask.from_kv_blocks sets it)."""
    return None if mask_mod is noop_mask else mask_mod


def _checked_lists(block_mask, names, batch_heads, blocks, what, device):
    """The four block-list tensors `names` (count, indices, full count, full indices; the full pair may be None)
    of a BlockMask, checked: int32 on device, batch / head dims broadcasting to batch_heads, at least `blocks`
    rows of `what` blocks; indices made contiguous along the list."""
    batch, heads = batch_heads
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


def transposed_lists(block_mask, batch, heads, seqlen_k, device):
    """(q_num, q_idx, full_q_num, full_q_idx) of a torch BlockMask (the query blocks of each key block, which
    the backward's dK/dV kernel walks), checked."""
    num, idx = getattr(block_mask, "q_num_blocks", None), getattr(block_mask, "q_indices", None)
    if num is None or idx is None:
        raise ValueError("block_mask: has no q_num_blocks / q_indices (made with compute_q_blocks=False?); the "
                         "backward pass needs them")
    return _checked_lists(block_mask, ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"),
                          (batch, heads), triton.cdiv(seqlen_k, block_mask.BLOCK_SIZE[1]), "key", device)


def mask_strides(t, ndim=3):
    """(batch, head, query block) strides of a block-mask tensor, 0 on broadcast (size-1) batch / head dims;
    zeros for an absent tensor."""
    if t is None:
        return (0,) * ndim
    return tuple(0 if (i < 2 and t.shape[i] == 1) else t.stride(i) for i in range(ndim))
