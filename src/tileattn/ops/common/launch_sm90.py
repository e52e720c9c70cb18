"""Host side of the Hopper forward pipeline (gluon_attn_sm90.py), shared by the dense and flex Gluon backends:
what the pipeline serves, its grid, its scale arguments and its tensor descriptors."""
import torch
import triton

from ... import hw
from .configs import SM90, SM90_FP8, sm90_config, sm90_smem_bytes
from .fp8 import FP8_DTYPES, packed_pitch
from .softmax import LOG2E
from .tma import gluon_desc, gluon_sm90_reason

DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES


def reason(device, dtype, head_dim, head_dim_v, out_dtype):
    """Why the pipeline cannot serve these head dims and dtypes on `device` ("" when it can): a Hopper GPU and
    triton 3.6, D = Dv with a table entry (configs.SM90 / SM90_FP8), the config's shared memory within the
    device's budget (TILEATTN_SMEM_BUDGET may emulate a smaller one)."""
    why = gluon_sm90_reason(device)
    if why:
        return why
    if dtype not in DTYPES:
        return f"dtype {dtype}"
    table = SM90_FP8 if dtype in FP8_DTYPES else SM90
    if head_dim not in table or head_dim_v != head_dim:
        return f"head dims D={head_dim}, Dv={head_dim_v}: the Gluon kernel serves D = Dv in {sorted(table)}"
    cfg = sm90_config(head_dim, dtype)
    need = sm90_smem_bytes(cfg, head_dim, head_dim_v, dtype.itemsize, out_dtype.itemsize)
    budget = hw.device_info(device).smem_per_block
    if need > budget:
        return f"its config needs {need} bytes of shared memory, the budget is {budget}"
    return ""


def persistent(cfg, seqlen_q):
    """Whether the grid is persistent for sequences of seqlen_q query rows (cfg.persistent, cfg.one_cta_from)."""
    return cfg.persistent and not (cfg.one_cta_from and seqlen_q >= cfg.one_cta_from)


def grid(cfg, seqlen_q, num_bh, device):
    """(programs,): one per SM (persistent) or one per tile of consumers * block_m query rows, at most
    cfg.max_programs."""
    tiles = triton.cdiv(seqlen_q, cfg.consumers * cfg.block_m) * num_bh
    n = min(tiles, hw.device_info(device).num_sms) if persistent(cfg, seqlen_q) else tiles
    if cfg.max_programs:
        n = min(n, cfg.max_programs)
    return (max(1, n),)


def scales(scale, softcap):
    """(sm_scale, softcap_scale, softcap_out) of the kernel: the scale times log2 e goes inside exp2, or the
    softcap maps raw scores to log2 units and exp2 takes them as they are."""
    if softcap > 0:
        return 1.0, scale / softcap, softcap * LOG2E
    return scale * LOG2E, 1.0, 1.0


def packed_v_buffer(v):
    """The [B, Hkv, Dv, Sk'] packed buffer under an fp8 v (the [B, Sk, Hkv, Dv] view of an fp8.Fp8V) that its
    descriptor covers."""
    vt = v.permute(0, 2, 3, 1)
    return vt.as_strided(vt.shape[:3] + (packed_pitch(v),), vt.stride())


def descriptors(q, k, v, out, cfg):
    """(q, k, v, o) descriptors of [B, S, H, D] tensors for the pipeline. An fp8 v is the view of an fp8.Fp8V:
    its descriptor is over the whole [B, Hkv, Dv, Sk'] packed buffer (sequence-major)."""
    d, dv = q.shape[-1], v.shape[-1]
    if v.dtype in FP8_DTYPES:
        v_desc = gluon_desc(packed_v_buffer(v), [1, 1, dv, cfg.block_n])
    else:
        v_desc = gluon_desc(v, [1, cfg.block_n, 1, dv])
    return (gluon_desc(q, [1, cfg.block_m, 1, d]), gluon_desc(k, [1, cfg.block_n, 1, d]), v_desc,
            gluon_desc(out, [1, cfg.block_m, 1, dv]))
