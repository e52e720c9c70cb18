"""Dense backward for head dims above 256 on batched inputs: the split backward.

No register file holds a [BLOCK_N, 512] float32 dK and dV (kernels_bwd_large_d.py's fused kernels hold a slice
and recompute S and dP per slice instead: 2-4x the FLOPs). The split backward computes each score tile once:
  1. bwd_scores_kernel writes P and dZ' * scale of a chunk (rows of some (batch, query head) pairs against a
     key range) in q's dtype to two workspaces, with the forward's masking, softcap and lse;
  2. three batched GEMMs (torch.bmm: cuBLAS) finish the chunk: dQ = dZ' K, dK = dZ'^T Q, dV = P^T dO, with the
     query heads of a kv head stacked along the rows (GQA: dK and dV summed over the group by the GEMM itself).
P and dZ' are rounded to q's dtype before their products, as in the fused kernels (and FlashAttention's).
Chunks: whole (batch, kv head) units while their workspaces fit WORKSPACE_BYTES, else row chunks of one unit;
a mask rule (causal, window) cuts the rows into ROW_CHUNKS_MASKED chunks so that each chunk's GEMMs cover only
the keys its rows see. Row chunks accumulate dK and dV in float32 (GEMMs with a float32 output).
Deterministic: no atomics, and cuBLAS GEMMs on one stream are run-to-run identical.
Varlen problems take the fused kernels (bwd.attn_bwd): their chunks would need the lengths on the host.
"""
import torch
import triton
import triton.language as tl

from ... import hw
from .kernels_bwd_large_d import bwd_scores_kernel
from .launch_triton import MAX_GRID_Y

# Both workspaces of one chunk together (P and dZ', q's dtype): 1 GiB holds B=1, H=16, N=4K in one chunk.
WORKSPACE_BYTES = 1 << 30
# Row chunks per unit under a mask rule: the GEMMs of chunk i of a causal problem cover keys up to its last row,
# so n chunks cost (n + 1) / 2n of the full square instead of all of it (4: 62.5%).
ROW_CHUNKS_MASKED = 4
# bwd_scores_kernel's tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). Chosen on the H100 (`sweep.py
# bwd-large-d` at 42a7de6, B=1 H=16 N=4K fp16, whole backward in ms, non-causal / causal): D=512 3.12 / 2.95,
# the best of seven (128 x 128 tiles 3.16 / 3.05, 64 x 64 3.36 / 3.10); D=320 2.26 / 2.13 (best 2.22 / 2.13).
# Compiled for sm90: 120 registers, no spills.
SCORE_TILES = (128, 64, 64, 8, 3)
SCORE_TILES_INTERPRETER = (32, 16, 32, 4, 1)


def _bmm_acc(a, b):
    """a @ b batched, float32 output from 16-bit inputs (cuBLAS accumulates in float32 and keeps it)."""
    if a.dtype == torch.float64:
        return torch.bmm(a, b)
    if a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())  # (the CPU has no mixed-dtype bmm)


def _heads_major(t, b0, b1, rows, h0, h1, g):
    """t[b0:b1, rows, heads of kv heads h0:h1] as [units, g * len(rows), D] (a copy): the rows of a kv head's g
    query heads stacked, head by head."""
    x = t[b0:b1, rows, h0 * g:h1 * g].unflatten(2, (h1 - h0, g))  # [b, r, hk, g, D]
    return x.permute(0, 2, 3, 1, 4).reshape((b1 - b0) * (h1 - h0), g * x.shape[1], x.shape[-1])


def _key_span(m0, m1, sk, off, left, right):
    """Keys [lo, hi) that query rows [m0, m1) see under the window (left, right) aligned with offset off."""
    lo = max(m0 + off - left, 0) if left >= 0 else 0
    hi = min(max(m1 - 1 + off + right + 1, 0), sk) if right >= 0 else sk
    return lo, max(hi, lo)


def _chunks(p, g):
    """(batches per chunk, kv heads per chunk, rows per chunk) within WORKSPACE_BYTES."""
    per_row = 2 * p.seqlen_k * p.dtype.itemsize * g  # both workspaces, one row of every query head of a kv head
    masked = p.left >= 0 or p.right >= 0
    rows = p.seqlen_q
    if masked and p.seqlen_q >= 2 * 128:
        rows = triton.cdiv(triton.cdiv(p.seqlen_q, ROW_CHUNKS_MASKED), 128) * 128
    units = max(WORKSPACE_BYTES // (per_row * rows), 1)
    if units == 1:  # one unit's rows must fit too
        rows = min(rows, max(WORKSPACE_BYTES // per_row // 128 * 128, 128))
    heads = min(units, p.heads_kv)
    return max(units // p.heads_kv, 1) if heads == p.heads_kv else 1, heads, rows


def attn_bwd_large_d(p, c, do, delta, grads, tail, launch):
    """dq, dk, dv (grads, written) of batched problem p (AttnProblem) for the forward call c, the output gradient
    do and delta (bwd_preprocess_kernel's, [B, Hq, Sq] float32); tail = (scale, qk_scale, softcap_scale,
    softcap_out, left, right) as bwd.attn_bwd passes its kernels; launch: bwd.Launches."""
    q, k, v, lse = c.q, c.k, c.v, c.lse
    dq, dk, dv = grads
    left, right = tail[4], tail[5]
    batch, sq, sk, hkv, g = p.batch, p.seqlen_q, p.seqlen_k, p.heads_kv, p.heads_q // p.heads_kv
    off = sk - sq if p.opts.bottom_right else 0
    bm, bn, bk, warps, stages = SCORE_TILES_INTERPRETER if hw.interpreter_enabled() else SCORE_TILES
    nb, nh, mc = _chunks(p, g)
    launch.not_replayable()  # the GEMMs and copies below are torch calls, not kernels a plan replays
    kw = dict(D=p.head_dim, DV_=p.head_dim_v, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, HAS_LEFT=left >= 0,
              HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right, HAS_SOFTCAP=p.opts.softcap > 0,
              NEEDS_MASK=left >= 0 or right >= 0, ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
              num_warps=warps, num_stages=stages)
    # (delta has lse's layout)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *lse.stride()[:2])
    for b0 in range(0, batch, nb):
        b1 = min(b0 + nb, batch)
        for h0 in range(0, hkv, nh):
            h1 = min(h0 + nh, hkv)
            units = (b1 - b0) * (h1 - h0)
            accs = None if mc >= sq else [torch.zeros(units, sk, t.shape[-1], device=q.device, dtype=torch.float32
                                                      if q.dtype != torch.float64 else q.dtype) for t in (dk, dv)]
            for m0 in range(0, sq, mc):
                m1 = min(m0 + mc, sq)
                lo, hi = _key_span(m0, m1, sk, off, left, right)
                dq_rows = dq[b0:b1, m0:m1, h0 * g:h1 * g].unflatten(2, (h1 - h0, g))  # [b, r, hk, g, D]
                if accs is None and (lo > 0 or hi < sk):  # the unit's only chunk, and keys no row sees
                    dk[b0:b1, :, h0:h1].zero_()
                    dv[b0:b1, :, h0:h1].zero_()
                if hi == lo:  # rows that see no key
                    dq_rows.zero_()
                    continue
                rows, cols = m1 - m0, hi - lo
                ws_p, ws_ds = (torch.empty(units * g, rows, cols, device=q.device, dtype=q.dtype) for _ in range(2))
                bh = units * g
                launch(bwd_scores_kernel, (triton.cdiv(rows, bm) * triton.cdiv(cols, bn), min(bh, MAX_GRID_Y),
                                           triton.cdiv(bh, MAX_GRID_Y)),
                       (q, k, v, do, lse, delta, ws_p, ws_ds, *strides, b0, h0 * g, m0, lo, rows, cols, sq, sk,
                        (h1 - h0) * g, g, bh, *tail), kw)
                ws_p, ws_ds = ws_p.view(units, g * rows, cols), ws_ds.view(units, g * rows, cols)
                kc = k[b0:b1, lo:hi, h0:h1].permute(0, 2, 1, 3).reshape(units, cols, -1)
                dq_rows.copy_(torch.bmm(ws_ds, kc).view(b1 - b0, h1 - h0, g, rows, -1).permute(0, 3, 1, 2, 4))
                qc = _heads_major(q, b0, b1, slice(m0, m1), h0, h1, g)
                doc = _heads_major(do, b0, b1, slice(m0, m1), h0, h1, g)
                if accs is None:  # the unit's only chunk: straight into the gradients
                    dk[b0:b1, lo:hi, h0:h1].copy_(torch.bmm(ws_ds.transpose(1, 2), qc).view(
                        b1 - b0, h1 - h0, cols, -1).transpose(1, 2))
                    dv[b0:b1, lo:hi, h0:h1].copy_(torch.bmm(ws_p.transpose(1, 2), doc).view(
                        b1 - b0, h1 - h0, cols, -1).transpose(1, 2))
                else:
                    accs[0][:, lo:hi] += _bmm_acc(ws_ds.transpose(1, 2), qc)
                    accs[1][:, lo:hi] += _bmm_acc(ws_p.transpose(1, 2), doc)
            if accs is not None:
                for grad, acc in zip((dk, dv), accs):
                    grad[b0:b1, :, h0:h1].copy_(acc.view(b1 - b0, h1 - h0, sk, -1).transpose(1, 2))
