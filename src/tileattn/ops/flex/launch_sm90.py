"""Flex attention on the Hopper Gluon kernel (ops/dense/gluon_sm90.py, flex_fwd_sm90_kernel).

It serves 16-bit and fp8 inputs with D = Dv in {64, 128}, block masks of 128 x 128 blocks (torch's default) and
sequence lengths that are multiples of 128, on an sm90 GPU; api.py sends everything else to the portable
kernel (kernels.py). Without a block mask every block is full (a broadcast list of all key blocks).
"""

import torch

from ... import hw
from ..dense import launch_sm90 as dense_sm90
from ..dense.fp8 import FP8_DTYPES, P_SHIFT, Fp8V, descale_strides, fp8_v_layout, packed_pitch

BLOCK = 128  # the kernel's query tile (2 consumer warpgroups x 64 rows) and key tile: the mask's block size
_FULL_LISTS = {}  # (query blocks, key blocks, device) -> (zeros, counts, indices) of an all-full block mask


def serves(query, key, value, q_block, kv_block):
    """value: [B, Hkv, Sk, Dv] (fp8: plain, re-laid out per call, or an Fp8V)."""
    if not hw.sm90_kernels(query.device):
        return False
    d, dv = query.shape[-1], value.shape[-1]
    if query.dtype not in (torch.float16, torch.bfloat16, *FP8_DTYPES) or d != dv or d not in (64, 128):
        return False
    if (q_block, kv_block) != (BLOCK, BLOCK) or query.shape[2] % BLOCK or key.shape[2] % BLOCK:
        return False
    cfg = dense_sm90.config_for(d, query.dtype)
    if 2 * cfg.block_m != BLOCK or cfg.block_n != BLOCK:
        return False
    if dense_sm90.smem_bytes(cfg, d, dv, query.element_size(), 2) > hw.device_info(query.device).smem_per_block:
        return False
    views = [t.transpose(1, 2) for t in (query, key) + (() if isinstance(value, Fp8V) else (value, ))]
    return all(dense_sm90.tma_ok(t) for t in views) and dense_sm90.available()


def _full_lists(num_q, num_kv, device):
    key = (num_q, num_kv, device)
    lists = _FULL_LISTS.get(key)
    if lists is None:
        zeros = torch.zeros(1, 1, num_q, dtype=torch.int32, device=device)
        counts = torch.full((1, 1, num_q), num_kv, dtype=torch.int32, device=device)
        idx = torch.arange(num_kv, dtype=torch.int32, device=device).expand(1, 1, num_q, num_kv)
        lists = _FULL_LISTS[key] = (zeros, zeros[..., None].expand(1, 1, num_q, 1), counts, idx)
    return lists


def mask_strides(t, ndim=3):
    """(batch, head, query block) strides of a block-mask tensor, 0 on broadcast (size-1) batch / head dims;
    zeros for an absent tensor."""
    if t is None:
        return (0,) * ndim
    return tuple(0 if (i < 2 and t.shape[i] == 1) else t.stride(i) for i in range(ndim))


def launch(query, key, value, out, lse, scale, smod, mmod, lists, return_lse, descales=(None, None, None),
           out_scale=1.0):
    """Run the Gluon flex kernel. lists: (kv_num, kv_idx, full_num, full_idx) of the block mask (a None full
    pair: no full blocks) or None (no block mask: every block full). fp8: descales are fp8.split_descales'
    tensors (or Nones; numbers are folded into scale and out_scale by the caller), value plain or an Fp8V."""
    from ..dense.gluon_sm90 import flex_fwd_sm90_kernel
    B, H, Sq, D = query.shape
    Sk = key.shape[2]
    if lists is None:
        num, idx, fnum, fidx = _full_lists(Sq // BLOCK, Sk // BLOCK, query.device)
    else:
        num, idx, fnum, fidx = lists
        if fnum is None:  # no full blocks: an empty full list
            fnum = torch.zeros(1, 1, num.shape[2], dtype=torch.int32, device=query.device)
            fidx = fnum[..., None]
    cfg = dense_sm90.config_for(D, query.dtype)
    fp8 = query.dtype in FP8_DTYPES
    q, k, o = (t.transpose(1, 2) for t in (query, key, out))  # [B, S, H, D] views
    if fp8:  # the packed sequence-major V the fp8 p.v reads (dense fp8.py); a plain V is re-laid out here
        v = (value if isinstance(value, Fp8V) else fp8_v_layout(value.transpose(1, 2))).view()
        vt = v.permute(0, 2, 3, 1)
        v_desc = dense_sm90._desc(vt.as_strided(vt.shape[:3] + (packed_pitch(v),), vt.stride()),
                                  [1, 1, D, cfg.block_n])
    else:
        v_desc = dense_sm90._desc(value.transpose(1, 2), [1, cfg.block_n, 1, D])
    sl = (lse.stride(0), lse.stride(1)) if return_lse else (0, 0)
    ds = [d if d is not None else lse for d in descales]
    fx = (num, idx, fnum, fidx, *mask_strides(num), *mask_strides(idx), *mask_strides(fnum), *mask_strides(fidx),
          float(scale))
    grid = dense_sm90.grid_for(cfg, Sq, B * H, hw.device_info(query.device).num_sms)
    flex_fwd_sm90_kernel[grid](
        dense_sm90._desc(q, [1, cfg.block_m, 1, D]), dense_sm90._desc(k, [1, cfg.block_n, 1, D]), v_desc,
        dense_sm90._desc(o, [1, cfg.block_m, 1, D]), lse, *ds, *sl,
        *[st for d in descales for st in descale_strides(d)],
        Sq, Sk, H, H // key.shape[1], B * H, float(out_scale), fx,
        smod.capture_args() if smod else (), mmod.capture_args() if mmod else (),
        BLOCK_M=cfg.block_m, Q_SLOTS=cfg.q_slots, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
        RETURN_LSE=return_lse, HAS_DESCALE=any(d is not None for d in descales), P_SHIFT=P_SHIFT if fp8 else 0,
        V_SEQ_MAJOR=fp8, SEPARATE_O=out.dtype != query.dtype,
        SCORE_MOD=smod.gluon_fn() if smod else None, MASK_MOD=mmod.gluon_fn() if mmod else None,
        num_warps=4,
    )
