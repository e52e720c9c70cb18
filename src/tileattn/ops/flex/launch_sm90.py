"""Backend "flex.sm90": flex attention on the Hopper Gluon kernel (gluon_sm90.py, flex_fwd_sm90_kernel; the
dense forward's pipeline, ops/common/gluon_attn_sm90.py, over a block mask).

It serves 16-bit and fp8 inputs with D = Dv in {64, 128} and block masks of 128 x 128 blocks (torch's default), at
any sequence lengths (a last block past Sq or Sk is partly padding: the kernel hides the padding keys), on an
H100/H200 with triton 3.6; dispatch.py sends everything else to the portable kernel. Without a block mask every
block is full (a broadcast list of all key blocks).
"""
import dataclasses

import torch
import triton

from ...launcher import launch_built
from ..common import launch_sm90 as pipeline
from ..common.backend import Backend, forced_config
from ..common.configs import Sm90Config, sm90_config
from ..common.fp8 import P_SHIFT, Fp8V, descale_strides, fp8_v_layout, split_descales
from ..common.masking import FLEX_TAIL, FLEX_WHOLE
from ..common.tma import gluon_desc
from .gluon_sm90 import flex_fwd_sm90_kernel
from .problem import mask_strides, mod_captures
from .trace import capture_args

BLOCK = 128  # the kernel's query tile (2 consumer warpgroups x 64 rows) and key tile: the mask's block size
_FULL_LISTS = {}  # (query blocks, key blocks, device) -> (zeros, counts, indices) of an all-full block mask
_EMPTY_FULL = {}  # (query blocks, device) -> (zero counts, their index view): a mask without full blocks


def mask_lists(lists, num_kv, num_q, device):
    """(num, idx, full num, full idx) of a block mask's lists (forward, or transposed with the roles of queries
    and keys swapped) over num_q rows of num_kv blocks: without a block mask (lists None) every block is full
    (cached per shape), and a mask without full blocks gets an empty full list."""
    if lists is None:
        return _full_lists(num_q, num_kv, device)
    num, idx, fnum, fidx = lists
    if fnum is None:
        key = (num.shape[2], device)
        empty = _EMPTY_FULL.get(key)
        if empty is None:
            fnum = torch.zeros(1, 1, num.shape[2], dtype=torch.int32, device=device)
            empty = _EMPTY_FULL[key] = (fnum, fnum[..., None])
        fnum, fidx = empty
    return num, idx, fnum, fidx


def flex_mode(*seqlens):
    """The Hopper pipelines' FLEX mode (masking.py) for sequence lengths `seqlens`: whole mask blocks, or a last
    block that ends past one of them (the forward passes Sk: its padding rows are never stored; the backward
    passes Sq and Sk)."""
    return FLEX_TAIL if any(n % BLOCK for n in seqlens) else FLEX_WHOLE


def _table_config(d, dtype):
    """The Sm90Config the flex kernel runs (a forced one as given): the dense table's, with the consumers' wgmmas
    not in strict turns. The fp8 table takes ping-pong at D=64 for dense problems, but on the flex bench's six mods
    (B=4 H=16 N=8192, e4m3, 2026-11-25, `scripts/sweep.py flex-fwd --fp8 --d 64 --variants pingpong=0`) it measured
    slower on all six: causal 1.174 vs 1.169 ms, sliding window 0.401 vs 0.375, documents 0.748 vs 0.710, prefix-LM
    1.191 vs 1.180, ALiBi 1.391 vs 1.291, softcap 2.407 vs 2.388 (and 2-8% slower on four of six at D=128)."""
    cfg = sm90_config(d, dtype)
    if cfg.pingpong and forced_config(Sm90Config) is None:
        cfg = dataclasses.replace(cfg, pingpong=False)
    return cfg


def _grid_config(cfg):
    """The flex kernel's grid is persistent at every length: one CTA per tile (the dense table's choice from
    cfg.one_cta_from rows) measured slower at 8K (docs/design/flex.md) and was not measured longer."""
    return dataclasses.replace(cfg, one_cta_from=0) if cfg.one_cta_from else cfg


def _full_lists(num_q, num_kv, device):
    key = (num_q, num_kv, device)
    lists = _FULL_LISTS.get(key)
    if lists is None:
        zeros = torch.zeros(1, 1, num_q, dtype=torch.int32, device=device)
        counts = torch.full((1, 1, num_q), num_kv, dtype=torch.int32, device=device)
        idx = torch.arange(num_kv, dtype=torch.int32, device=device).expand(1, 1, num_q, num_kv)
        lists = _FULL_LISTS[key] = (zeros, zeros[..., None].expand(1, 1, num_q, 1), counts, idx)
    return lists


class Sm90Backend(Backend):
    name = "flex.sm90"
    gluon = True

    def supports(self, p):
        if p.head_dim not in (64, 128):
            return False, f"head dims D={p.head_dim}, Dv={p.head_dim_v}: it serves D = Dv in [64, 128]"
        why = pipeline.reason(p.device, p.dtype, p.head_dim, p.head_dim_v, p.out_dtype)
        if why:
            return False, why
        if (p.q_block, p.kv_block) != (BLOCK, BLOCK):
            return False, f"mask blocks {p.q_block} x {p.kv_block}: it serves {BLOCK} x {BLOCK} blocks"
        if p.fp8 and p.seqlen_k == 1:  # ptxas miscompiles the fp8 P of a key length specialized to 1 (fp8.md)
            return False, "fp8 with a single key (Sk = 1)"
        cfg = sm90_config(p.head_dim, p.dtype)
        if cfg.consumers != 2 or 2 * cfg.block_m != BLOCK or cfg.block_n != BLOCK:  # (the kernel has two consumers)
            return False, f"its config {cfg} does not tile {BLOCK} x {BLOCK} mask blocks"
        if cfg.epilogue == "kstage":
            return False, "Sm90Config.epilogue = 'kstage' is the dense kernel's only (the flex kernel's is 'tma')"
        if not p.tma:
            return False, "query, key or value is not aligned for tensor descriptors (16-byte base and strides)"
        return True, ""

    def run(self, p, c, kept=None):
        """Fill c.out (and c.lse). fp8: the descales are split here (numbers fold into the scale and the
        output factor), a plain value is packed (fp8_v_layout).
        kept: a launch plan's dict (plans.py), in which the launch is kept and replayed on this call's tensors
        (launcher.launch_built; the plan's key fixes every other argument, descale numbers included). None:
        Triton's normal launch."""
        B, H, Sq, _ = c.query.shape
        lists = mask_lists(c.lists, triton.cdiv(c.key.shape[2], BLOCK), triton.cdiv(Sq, BLOCK), c.query.device)
        captures = mod_captures(p, c)
        descales = split_descales(*c.descales)
        lse = c.lse
        v = _v_operand(p, c.value)
        # the kernel's tensors in argument order (what launch_cached varies): descriptor bases first
        tensors = [c.query, c.key, v, c.out, lse, *[d if d is not None else lse for d in descales[2]], *lists,
                   *(t for caps in captures for t in caps)]
        def build():
            cfg = _table_config(p.head_dim, p.dtype)
            grid = pipeline.grid(_grid_config(cfg), Sq, B * H, c.query.device)
            return (flex_fwd_sm90_kernel, grid, *_arguments(p, c, cfg, v, lists, captures, descales))
        if kept is None:
            kernel, grid, args, kwargs = build()
            kernel[grid](*args, **kwargs)
        else:
            launch_built(kept, "fwd", tensors, build)


def _v_operand(p, value):
    """What the kernel's V descriptor covers: a 16-bit value itself ([B, Hkv, Sk, Dv], seen as [B, Sk, Hkv, Dv]);
    fp8: the packed sequence-major buffer the fp8 p.v reads (fp8.py; a plain value is re-laid out here)."""
    if not p.fp8:
        return value
    return pipeline.packed_v_buffer((value if isinstance(value, Fp8V) else fp8_v_layout(value.transpose(1, 2))).view())


def _arguments(p, c, cfg, v, lists, captures, descales):
    """(args, kwargs) of flex_fwd_sm90_kernel for call c of problem p: q, k and out descriptors on the
    [B, H, S, D] tensors themselves, seen as [B, S, H, D]; v from _v_operand; descales from split_descales."""
    Sk = c.key.shape[2]
    qk, out_scale, descales = descales
    d, dv, bm, bn = p.head_dim, p.head_dim_v, cfg.block_m, cfg.block_n
    bshd = (0, 2, 1, 3)
    v_desc = gluon_desc(v, [1, 1, dv, bn]) if p.fp8 else gluon_desc(v, [1, bn, 1, dv], bshd)
    descs = (gluon_desc(c.query, [1, bm, 1, d], bshd), gluon_desc(c.key, [1, bn, 1, d], bshd), v_desc,
             gluon_desc(c.out, [1, bm, 1, dv], bshd))
    lse = c.lse
    sl = (lse.stride(0), lse.stride(1)) if p.return_lse else (0, 0)
    smod, mmod = p.score_mod, p.mask_mod
    fx = (*lists, *(s for t in lists for s in mask_strides(t)), float(p.scale * qk))
    B, H, Sq = c.query.shape[:3]
    args = (*descs, lse, *[d if d is not None else lse for d in descales], *sl,
            *[st for d in descales for st in descale_strides(d)], Sq, Sk, H, p.group, B * H, float(out_scale), fx,
            *(capture_args(t) for t in captures))
    kwargs = dict(
        BLOCK_M=cfg.block_m, Q_SLOTS=cfg.q_slots, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
        RETURN_LSE=p.return_lse, HAS_DESCALE=descales[0] is not None, P_SHIFT=P_SHIFT if p.fp8 else 0,
        V_SEQ_MAJOR=p.fp8, SEPARATE_O=p.out_dtype != p.dtype, PINGPONG=cfg.pingpong, EXP2_FMA=cfg.exp2_fma,
        REVERSE_M=True, FLEX=flex_mode(Sk),
        SCORE_MOD=smod.gluon_fn() if smod else None, MASK_MOD=mmod.gluon_fn() if mmod else None,
        num_warps=4,
    )
    return args, kwargs
