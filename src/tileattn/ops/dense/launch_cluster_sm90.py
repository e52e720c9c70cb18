"""PROTOTYPE host side of the 2-CTA cluster forward (gluon_cluster_sm90.py; triton 3.9 Gluon, Hopper): descriptors
with the cluster's CGA layouts and a launch with num_ctas=2. Not wired into dispatch; not run on a GPU yet.

    out = attention_cluster_sm90(q, k, v, causal=False)   # q [B, Sq, Hq, 128], k / v [B, Sk, Hkv, 128]

Serves D = Dv = 128, fp16 / bf16, non-causal or causal with top-left alignment (query i sees key j <= i, torch
SDPA's convention; `attention_ref(..., causal="top_left")`), GQA (Hq a multiple of Hkv), no lse, no window /
softcap / fp8, TMA-aligned tensors.
"""
import torch
import triton

from ..common.softmax import LOG2E
from ..common.tma import gl_dtype, tma_ok

BLOCK_M = 64  # rows per consumer warpgroup and CTA (a warpgroup's box covers 2 * BLOCK_M rows of the pair)
BLOCK_N = 128
STAGES = 3
CONSUMER_REGS = 240
NUM_CONSUMERS = 2
PAIR_ROWS = 2 * NUM_CONSUMERS * BLOCK_M  # query rows of one cluster
D_SERVED = 128

# cga_layout bases of the [1, rows, 1, D] boxes: Q / O split by rows between the two CTAs, K / V broadcast
ROW_SPLIT_4D = [[0, 1, 0, 0]]
BROADCAST_4D = [[0, 0, 0, 0]]


def reason(q, k, v, out=None):
    """Why the cluster prototype cannot take these inputs ("" when it can); out: the output buffer, if given."""
    if not triton.__version__.startswith("3.9."):
        return f"triton {triton.__version__}: the cluster kernel is written for triton 3.9's Gluon"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: fp16 or bf16, all the same"
    if q.shape[-1] != D_SERVED or k.shape[-1] != D_SERVED or v.shape[-1] != D_SERVED:
        return f"head dims {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]}: D = Dv = {D_SERVED} only"
    if q.shape[2] % k.shape[2] or k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0]:
        return "shapes: q [B, Sq, Hq, D], k / v [B, Sk, Hkv, D] with Hq a multiple of Hkv"
    if min(q.shape[1], k.shape[1]) == 0:
        return "an empty sequence"
    if not all(tma_ok(t) for t in (q, k, v)):
        return "a tensor not aligned for TMA (16-byte base and strides, last stride 1)"
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or not tma_ok(out)):
        return "out: q's shape, dtype and device, aligned for TMA"
    return ""


def _desc(t, block, cga_layout):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(t.dtype), cga_layout=cga_layout)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), layout)


def descriptors(q, k, v, out):
    """(q, k, v, o) descriptors: Q / O boxes of one warpgroup's 2 * BLOCK_M logical rows split by rows (each CTA
    copies its BLOCK_M), K / V boxes of BLOCK_N keys broadcast (the lead's multicast fills both CTAs)."""
    d = q.shape[-1]
    rows = [1, 2 * BLOCK_M, 1, d]
    keys = [1, BLOCK_N, 1, d]
    return (_desc(q, rows, ROW_SPLIT_4D), _desc(k, keys, BROADCAST_4D), _desc(v, keys, BROADCAST_4D),
            _desc(out, rows, ROW_SPLIT_4D))


def grid(batch, heads_q, seqlen_q):
    """(clusters,): one per pair tile of PAIR_ROWS query rows and (batch, head); the launch multiplies by
    num_ctas (triton's launcher: gridDimX = grid * num_ctas, cluster dim x = num_ctas)."""
    return (triton.cdiv(seqlen_q, PAIR_ROWS) * batch * heads_q,)


def launch(q, k, v, out, causal=False, scale=None):
    """Launches the cluster kernel on q, k, v into out; returns what the launch returns (triton's compiled
    kernel: its asm / metadata are what scripts/compile_cluster.py reports)."""
    from .gluon_cluster_sm90 import attn_fwd_cluster_sm90_kernel
    why = reason(q, k, v, out)
    if why:
        raise ValueError(f"attention_cluster_sm90: {why}")
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = D ** -0.5 if scale is None else float(scale)
    if scale <= 0:
        raise ValueError("a positive scale (it is folded into exp2 after the row max)")
    q_desc, k_desc, v_desc, o_desc = descriptors(q, k, v, out)
    return attn_fwd_cluster_sm90_kernel[grid(B, Hq, Sq)](
        q_desc, k_desc, v_desc, o_desc, Sq, Sk, Hq, Hq // Hkv, scale * LOG2E,
        BLOCK_M=BLOCK_M, STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS, HAS_RIGHT=bool(causal),
        REVERSE_M=bool(causal), num_warps=4, num_ctas=2,
    )


def attention_cluster_sm90(q, k, v, causal=False, scale=None, out=None):
    """softmax(q k^T * scale [top-left causal mask]) v with the 2-CTA cluster kernel: out [B, Sq, Hq, D] in
    q's dtype."""
    if out is None:
        out = torch.empty_like(q)
    launch(q, k, v, out, causal, scale)
    return out
