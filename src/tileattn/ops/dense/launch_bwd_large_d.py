"""Dense backward for large head dims on batched inputs: the split backward.

No register file holds a [BLOCK_N, 512] float32 dK and dV (kernels_bwd_large_d.py's fused kernels hold a slice
and recompute S and dP per slice instead: 2-4x the FLOPs). The split backward computes each score tile once:
  1. bwd_scores_kernel writes P and dZ' * scale of a chunk (the rows of some (batch, kv head) units, their
     query heads interleaved as in q, against a key range) in q's dtype to two workspaces, with the forward's
     masking, softcap and lse; on Hopper at D = Dv = 256 gluon_bwd_scores_sm90.py's kernel does (Q and dO held
     in registers, TMA stores; scores_sm90_reason says when);
  2. batched GEMMs (torch.bmm: cuBLAS) finish the chunk: dQ = dZ' K, dK = dZ'^T Q, dV = P^T dO, a kv head's
     query heads stacked along the rows (GQA: dK and dV summed over the group by the GEMM itself).
P and dZ' are rounded to q's dtype before their products, as in the fused kernels (and FlashAttention's).
Chunks: the whole squares of as many units as fit workspace_bytes(), else row chunks of one unit whose dK and dV
are summed in float32 (GEMMs with a float32 output). Under a mask rule the GEMMs are cut into PIECES_MASKED
pieces (dQ by rows, dK and dV by keys), each covering only the keys (rows) its rows (keys) see.
Deterministic: no atomics, and cuBLAS GEMMs on one stream are run-to-run identical.
Varlen problems take the fused kernels (bwd.attn_bwd): their chunks would need the lengths on the host.
"""
import torch
import triton
import triton.language as tl

from ... import hw, knobs
from ..common.masking import key_span
from ..common.tma import gluon_desc, gluon_sm90_reason, tma_ok
from .kernels_bwd_large_d import bwd_scores_kernel
from .launch_triton import MAX_GRID_Y

# Both workspaces of one chunk together (P and dZ', q's dtype), at most a sixteenth of the device's memory
# (workspace_bytes): 2 GiB holds a (batch, kv head) unit's whole square up to Sq * Sk = 2^29 with one query head
# per kv head, and all 32 heads of a batch at N = 4K. Each chunk costs the host ~70 torch calls (12 GEMMs over
# views under a mask rule), so fewer chunks keep the GPU ahead of it. H100 (2026-11-25, `profile_kernels.py swing`,
# B=4 H=32 N=4K D=256 causal, docs/design/backward.md, eleventh round): at 1 GiB (8 chunks) issuing one backward
# took the host 7.6-10.7 ms against 7.4-7.6 ms of kernels, and calls swung from 8.0 to 39 ms; at 2 GiB (4 chunks)
# 3.8-5.6 ms, call medians 8.2-8.3 ms (cuDNN 7.9-8.3), though a host stall can still stretch a call.
WORKSPACE_BYTES = 2 << 30
# One query head per kv head: a chunk per batch (GEMMs on views of the tensors, no copies: -1.1 of 14.8 ms at
# D=256 B=4 H=32 N=4K) where one batch's work, Hkv * Sq * Sk * D, is at least this; below it several batches per
# chunk (copies, fewer chunks, each ~12 torch calls of host time). H100, D=256 non-causal fp16, ms, copies /
# views: work 2^29 (B=32 H=8 N=512) 1.22 / 12.0 (host-bound), 2^33 (B=8 H=32 N=1K) 3.21 / 3.78, 2^35 (B=4 H=32
# N=2K) 5.00 / 3.97; cuDNN 0.80, 2.37, 4.16.
DIRECT_MIN_WORK = 1 << 35
# GEMM pieces under a mask rule: causal costs (n + 1) / 2n of the square in GEMMs instead of all of it.
PIECES_MASKED = 4
# bwd_scores_kernel's tiles (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). Chosen on the H100 (`sweep.py
# bwd-large-d` at 42a7de6, B=1 H=16 N=4K fp16, whole backward in ms, non-causal / causal): D=512 3.12 / 2.95,
# the best of seven (128 x 128 tiles 3.16 / 3.05, 64 x 64 3.36 / 3.10); D=320 2.26 / 2.13 (best 2.22 / 2.13).
# Compiled for sm90: 120 registers, no spills.
SCORE_TILES = (128, 64, 64, 8, 3)
SCORE_TILES_INTERPRETER = (32, 16, 32, 4, 1)
# The Hopper score kernel (gluon_bwd_scores_sm90.py) per head dim (D = Dv): (key tile, ring slots, registers per
# consumer thread). At D = 256 six 32 KB slots and the 32 KB of staging buffers fill the H100's 227 KB; Q and dO
# live in registers. SCORES_SM90 = False keeps every chunk on the Triton kernel (sweep.py bwd-large-d).
SCORES_SM90_CONFIGS = {256: (64, 6, 240)}
SCORES_SM90 = True
# A chunk takes the Hopper score kernel when its grid (one CTA per 128 query rows of a query head, walking every
# key tile) fills the GPU at least this many times over; smaller ones (few heads, short Sq against long Sk) keep
# the Triton kernel, whose grid spans the key tiles too. A guard, not a measurement: the kernel was measured at
# B=4 H=32 N=4K / 8K (16 waves).
SCORES_SM90_MIN_WAVES = 1


def _bmm_acc(a, b):
    """a @ b batched, float32 output from 16-bit inputs (cuBLAS accumulates in float32 and keeps it)."""
    if a.dtype == torch.float64:
        return torch.bmm(a, b)
    if a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())  # (the CPU has no mixed-dtype bmm)


def _empty(*shape, like):
    """torch.empty in like's dtype and device; NaN under TILEATTN_DEBUG_FILL_NAN (tests: an element that no kernel
    or GEMM writes fails the comparison)."""
    return _debug_nan(torch.empty(*shape, device=like.device, dtype=like.dtype))


def _debug_nan(t):
    return t.fill_(float("nan")) if knobs.debug_fill_nan() else t


def _row_span(n0, n1, sq, off, left, right):
    """Query rows [lo, hi) that see any of keys [n0, n1)."""
    lo = max(n0 - off - right, 0) if right >= 0 else 0
    hi = min(max(n1 - 1 - off + left + 1, 0), sq) if left >= 0 else sq
    return lo, max(hi, lo)


def _piece(lo, hi, n):
    """The length of n pieces of [lo, hi), a multiple of 128 (bwd_scores_kernel's tiles divide it)."""
    return max(triton.cdiv(triton.cdiv(hi - lo, n), 128) * 128, 128)


def workspace_bytes(device):
    """The chunks' workspace budget on `device`: WORKSPACE_BYTES, at most a sixteenth of its memory."""
    memory = hw.device_info(device).memory
    return min(WORKSPACE_BYTES, memory // 16) if memory else WORKSPACE_BYTES


def _chunks(p, g, budget):
    """(batches per chunk, kv heads per chunk, rows per chunk) within `budget` bytes of workspace: whole squares
    of as many (batch, kv head) units as fit, else row chunks of one unit (multiples of 128 rows)."""
    # both workspaces, one row of every query head of a kv head (rows padded to 8 keys: the Hopper kernel's pitch)
    per_row = 2 * triton.cdiv(p.seqlen_k, 8) * 8 * p.dtype.itemsize * g
    units = budget // (per_row * p.seqlen_q)
    if units == 0:
        return 1, 1, max(budget // per_row // 128 * 128, 128)
    heads = min(units, p.heads_kv)
    if g == 1 and p.heads_kv * p.seqlen_q * p.seqlen_k * max(p.head_dim, p.head_dim_v) >= DIRECT_MIN_WORK:
        return 1, heads, p.seqlen_q  # one batch per chunk: the GEMMs use views of the tensors (_Chunk.direct)
    return (units // p.heads_kv if heads == p.heads_kv else 1), heads, p.seqlen_q


class _Chunk:
    """Batches [b0, b1) x kv heads [h0, h1) (the units), query rows [m0, m1), keys [lo, hi). direct (one query
    head per kv head, one batch): the GEMMs' operands and outputs are views of the [B, S, H, D] tensors
    ([units, rows, D] with strides (D, H * D, 1): cuBLAS takes any batch stride), else copies in the
    workspaces' row order."""

    def __init__(self, b, h, m, keys, g, n_pieces=1, sm90_operands=None):
        (self.b0, self.b1), (self.h0, self.h1), (self.m0, self.m1), (self.lo, self.hi) = b, h, m, keys
        self.g, self.units = g, (b[1] - b[0]) * (h[1] - h[0])
        self.row_piece, self.key_piece = _piece(*m, n_pieces), _piece(*keys, n_pieces)
        self.direct = g == 1 and b[1] - b[0] == 1
        self.sm90_operands = sm90_operands  # q, k, v, dO descriptors: the Hopper score kernel takes the chunk

    @property
    def sm90(self):
        return self.sm90_operands is not None

    def rows_of(self, t, a, b):
        """Query-side t ([B, Sq, Hq, D]: q, dO) rows [a, b) of the units, [units, (b - a) * g, D] in the
        workspaces' row order."""
        if self.direct:
            return t[self.b0, a:b, self.h0:self.h1].transpose(0, 1)
        x = t[self.b0:self.b1, a:b, self.h0 * self.g:self.h1 * self.g].unflatten(2, (self.h1 - self.h0, self.g))
        return x.transpose(1, 2).reshape(self.units, (b - a) * self.g, t.shape[-1])

    def keys_of(self, t, a, b):
        """Key-side t ([B, Sk, Hkv, D]: k, or the gradients) keys [a, b) of the units, [units, b - a, D]."""
        if self.direct:
            return t[self.b0, a:b, self.h0:self.h1].transpose(0, 1)
        return t[self.b0:self.b1, a:b, self.h0:self.h1].transpose(1, 2).reshape(self.units, b - a, t.shape[-1])

    def rows_out(self, t):
        """Where the GEMMs write query-side gradient t's rows [m0, m1) ([units, rows * g, D]; finish() writes
        a buffer back)."""
        x = self.rows_of(t, self.m0, self.m1) if self.direct else None
        return _debug_nan(x) if x is not None else _empty(self.units, (self.m1 - self.m0) * self.g, t.shape[-1],
                                                          like=t)

    def keys_out(self, t):
        """Where the GEMMs write key-side gradient t's keys [lo, hi) ([units, hi - lo, D])."""
        x = self.keys_of(t, self.lo, self.hi) if self.direct else None
        return _debug_nan(x) if x is not None else _empty(self.units, self.hi - self.lo, t.shape[-1], like=t)

    def finish(self, dq, dk, dv, bufs):
        """Copy the GEMMs' buffers (rows_out(dq), keys_out(dk), keys_out(dv); None: not written here) into the
        gradients, unless they are views of them."""
        if self.direct:
            return
        nb, nh, g = self.b1 - self.b0, self.h1 - self.h0, self.g
        if bufs[0] is not None:
            dst = dq[self.b0:self.b1, self.m0:self.m1, self.h0 * g:self.h1 * g].unflatten(2, (nh, g))
            dst.copy_(bufs[0].view(nb, nh, self.m1 - self.m0, g, -1).transpose(1, 2))
        for t, buf in zip((dk, dv), bufs[1:]):
            if buf is not None:
                self.key_view(t, self.lo, self.hi).copy_(buf.view(nb, nh, self.hi - self.lo, -1))

    def key_view(self, t, a, b):
        """Key-side t's keys [a, b) of the units as [b1 - b0, h1 - h0, b - a, D] (a view, for writes)."""
        return t[self.b0:self.b1, a:b, self.h0:self.h1].transpose(1, 2)


def scores_sm90_reason(p, q, k, v, do):
    """Why the Hopper score kernel does not take problem p's chunks ("" when it does): SCORES_SM90 and
    TILEATTN_SM90_BWD (=0: off), a Hopper GPU with a Gluon-verified triton, fp16 / bf16, D = Dv in
    SCORES_SM90_CONFIGS, shared memory for its ring (TILEATTN_SMEM_BUDGET emulates less), q, k, v, dO fit for
    tensor descriptors. (A chunk also needs a grid of SCORES_SM90_MIN_WAVES.)"""
    if not SCORES_SM90 or knobs.sm90_bwd() == "off":
        return "turned off (SCORES_SM90, TILEATTN_SM90_BWD=0)"
    why = gluon_sm90_reason(q.device)
    if why:
        return why
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype}"
    if p.head_dim != p.head_dim_v or p.head_dim not in SCORES_SM90_CONFIGS:
        return f"head dims D={p.head_dim}, Dv={p.head_dim_v}: it serves D = Dv in {sorted(SCORES_SM90_CONFIGS)}"
    bn, slots, _ = SCORES_SM90_CONFIGS[p.head_dim]
    need = (slots * bn * p.head_dim + 4 * 64 * bn) * q.element_size() + 1024  # ring, staging, barriers
    if need > hw.device_info(q.device).smem_per_block:
        return f"{need} bytes of shared memory per block needed"
    if not all(tma_ok(t) for t in (q, k, v, do)):
        return "q, k, v or the output gradient is not aligned for tensor descriptors"
    return ""


def _sm90_operands(p, q, k, v, do):
    """The Hopper score kernel's descriptors of q, k, v and dO, made once per backward (every chunk reads them)."""
    d = p.head_dim
    bn = SCORES_SM90_CONFIGS[d][0]
    return gluon_desc(q, [1, 64, 1, d]), gluon_desc(k, [1, bn, 1, d]), gluon_desc(v, [1, bn, 1, d]), \
        gluon_desc(do, [1, 64, 1, d])


def _workspaces(ch, rows, cols, q, pitch):
    """The chunk's two workspaces as [units, rows, g, cols] in q's dtype, rows `pitch` elements apart (the GEMMs
    take them flattened to [units, rows * g, cols], a view)."""
    return [_empty(ch.units, rows, ch.g, pitch, like=q)[..., :cols] for _ in range(2)]


def _scores(p, c, do, delta, ch, tail, launch):
    """The score kernel over chunk ch (with its GEMM pieces ch.row_piece, ch.key_piece): the workspaces
    (P, dZ' * scale) as [units, rows * g, keys]. The Hopper kernel where scores_sm90_reason allows (ch.sm90),
    else bwd_scores_kernel."""
    q, k, v, lse = c.q, c.k, c.v, c.lse
    scale, qk_scale, softcap_scale, softcap_out, left, right = tail
    rows, cols, bh = ch.m1 - ch.m0, ch.hi - ch.lo, ch.units * ch.g
    flags = dict(HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right,
                 HAS_SOFTCAP=p.opts.softcap > 0, NEEDS_MASK=left >= 0 or right >= 0)
    args = (ch.b0, ch.h0 * ch.g, ch.m0, ch.lo, rows, cols, ch.row_piece, ch.key_piece, p.seqlen_q, p.seqlen_k,
            (ch.h1 - ch.h0) * ch.g)
    if ch.sm90:
        from .gluon_bwd_scores_sm90 import DO_SHARED, bwd_scores_sm90_kernel
        bn, slots, regs = SCORES_SM90_CONFIGS[p.head_dim]
        # (TMA: 16-byte aligned strides; the workspaces' own allocation keeps those of size-1 dimensions so)
        ws = _workspaces(ch, rows, cols, q, triton.cdiv(cols, 8) * 8)
        launch(bwd_scores_sm90_kernel, (triton.cdiv(rows, 128) * bh, ), (
            *ch.sm90_operands, *(gluon_desc(w, [1, 64, 1, bn]) for w in ws), lse, delta, lse.stride(0),
            lse.stride(1), *args, ch.g, triton.cdiv(rows, 128), scale, qk_scale, softcap_scale, softcap_out, left,
            right), dict(SLOTS=slots, CONSUMER_REGS=regs, DO_SHARED=DO_SHARED and flags["NEEDS_MASK"],
                         num_warps=4, **flags))
        return [w.flatten(1, 2) for w in ws]
    bm, bn, bk, warps, stages = SCORE_TILES_INTERPRETER if hw.interpreter_enabled() else SCORE_TILES
    ws = [w.flatten(1, 2) for w in _workspaces(ch, rows, cols, q, cols)]
    # (delta has lse's layout)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *lse.stride()[:2])
    launch(bwd_scores_kernel, (triton.cdiv(rows, bm) * triton.cdiv(cols, bn), min(bh, MAX_GRID_Y),
                               triton.cdiv(bh, MAX_GRID_Y)),
           (q, k, v, do, lse, delta, *ws, *strides, *args, ch.g, bh, *tail),
           dict(D=p.head_dim, DV_=p.head_dim_v, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                ACC=tl.float64 if q.dtype == torch.float64 else tl.float32, num_warps=warps, num_stages=stages,
                **flags))
    return ws


def _chunk_grads(p, c, do, delta, ch, grads, tail, launch):
    """Chunk ch's part of dq, dk, dv (grads = (dq, dk, dv, float32 dK / dV sums or None)): the score tiles, then
    per GEMM piece dQ rows (against the keys they see) and dK / dV keys (against the rows that see them)."""
    q, k = c.q, c.k
    dq, dk, dv, sums = grads
    left, right, g = tail[4], tail[5], ch.g
    off = p.seqlen_k - p.seqlen_q if p.opts.bottom_right else 0
    dq_out = ch.rows_out(dq)
    if ch.hi == ch.lo:  # rows that see no key
        dq_out.zero_()
        ch.finish(dq, dk, dv, (dq_out, None, None))
        return
    ws_p, ws_ds = _scores(p, c, do, delta, ch, tail, launch)
    qc, doc, kc = ch.rows_of(q, ch.m0, ch.m1), ch.rows_of(do, ch.m0, ch.m1), ch.keys_of(k, ch.lo, ch.hi)
    for a in range(ch.m0, ch.m1, ch.row_piece):  # dQ by rows
        e = min(a + ch.row_piece, ch.m1)
        lo, hi = (x - ch.lo for x in key_span(a, e, p.seqlen_k, off, left, right))
        r = slice((a - ch.m0) * g, (e - ch.m0) * g)
        if hi > lo:
            torch.bmm(ws_ds[:, r, lo:hi], kc[:, lo:hi], out=dq_out[:, r])
        else:
            dq_out[:, r].zero_()
    dk_out, dv_out = (None, None) if sums is not None else (ch.keys_out(dk), ch.keys_out(dv))
    ws_ds_t, ws_p_t = ws_ds.transpose(1, 2), ws_p.transpose(1, 2)  # (once: each torch call costs host time)
    for a in range(ch.lo, ch.hi, ch.key_piece):  # dK, dV by keys
        e = min(a + ch.key_piece, ch.hi)
        lo, hi = _row_span(a, e, p.seqlen_q, off, left, right)
        lo, hi = max(lo, ch.m0) - ch.m0, min(hi, ch.m1) - ch.m0
        kr = slice(a - ch.lo, e - ch.lo)
        if hi <= lo:
            if sums is None:
                dk_out[:, kr].zero_()
                dv_out[:, kr].zero_()
            continue
        r = slice(lo * g, hi * g)
        ds_t, p_t = ws_ds_t[:, kr, r], ws_p_t[:, kr, r]
        if sums is not None:
            sums[0][:, a:e] += _bmm_acc(ds_t, qc[:, r])
            sums[1][:, a:e] += _bmm_acc(p_t, doc[:, r])
        else:
            torch.bmm(ds_t, qc[:, r], out=dk_out[:, kr])
            torch.bmm(p_t, doc[:, r], out=dv_out[:, kr])
    ch.finish(dq, dk, dv, (dq_out, dk_out, dv_out))


def attn_bwd_large_d(p, c, do, delta, grads, tail, launch):
    """dq, dk, dv (grads, written) of batched problem p (AttnProblem) for the forward call c, the output gradient
    do and delta (bwd_preprocess_kernel's, lse's layout); tail = (scale, qk_scale, softcap_scale, softcap_out,
    left, right) as bwd.attn_bwd passes its kernels; launch: bwd.Launches."""
    q = c.q
    dq, dk, dv = grads
    left, right = tail[4], tail[5]
    sq, sk, g = p.seqlen_q, p.seqlen_k, p.heads_q // p.heads_kv
    off = sk - sq if p.opts.bottom_right else 0
    n_pieces = PIECES_MASKED if left >= 0 or right >= 0 else 1
    nb, nh, mc = _chunks(p, g, workspace_bytes(q.device))
    operands = None if scores_sm90_reason(p, q, c.k, c.v, do) else _sm90_operands(p, q, c.k, c.v, do)
    min_ctas = SCORES_SM90_MIN_WAVES * hw.device_info(q.device).num_sms if operands else 0
    launch.not_replayable()  # the GEMMs and copies below are torch calls, not kernels a plan replays
    for b0 in range(0, p.batch, nb):
        for h0 in range(0, p.heads_kv, nh):
            acc = mc < sq  # row chunks: dK and dV summed over them in float32
            b, h = (b0, min(b0 + nb, p.batch)), (h0, min(h0 + nh, p.heads_kv))
            units = (b[1] - b[0]) * (h[1] - h[0])
            sums = [torch.zeros(units, sk, t.shape[-1], device=q.device, dtype=torch.float32
                                if q.dtype != torch.float64 else q.dtype) for t in (dk, dv)] if acc else None
            if not acc:  # keys no row sees keep zero gradients
                lo, hi = key_span(0, sq, sk, off, left, right)
                if lo > 0 or hi < sk:
                    dk[b[0]:b[1], :, h[0]:h[1]].zero_()
                    dv[b[0]:b[1], :, h[0]:h[1]].zero_()
            for m0 in range(0, sq, mc):
                m1 = min(m0 + mc, sq)
                sm90 = operands and triton.cdiv(m1 - m0, 128) * units * g >= min_ctas
                ch = _Chunk(b, h, (m0, m1), key_span(m0, m1, sk, off, left, right), g, n_pieces,
                            operands if sm90 else None)
                _chunk_grads(p, c, do, delta, ch, (dq, dk, dv, sums), tail, launch)
            if acc:
                ch = _Chunk(b, h, (0, sq), (0, sk), g)
                for t, s in zip((dk, dv), sums):
                    ch.key_view(t, 0, sk).copy_(s.view(b[1] - b[0], h[1] - h[0], sk, -1))
