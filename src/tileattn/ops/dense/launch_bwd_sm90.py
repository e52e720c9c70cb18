"""Launch of the dense Hopper backward kernel (gluon_bwd_sm90.py): which problems it takes and its arguments.

It serves fp16 / bf16 batched (not varlen) problems with D = Dv in {64, 128} and tensors that suit tensor
descriptors, on an H100/H200 with a Gluon-verified triton (ops/common/tma.py). By default it takes them when
both sequences have at least MIN_SEQLEN (1024) tokens; TILEATTN_SM90_BWD=1 sends it everything it serves, =0 nothing.
bwd.py sends the rest to the Triton kernels. The config table is ops/common/launch_bwd_sm90.py's.
"""
import torch
import triton

from ...launcher import Address
from ..common import launch_bwd_sm90 as pipeline
from ..common.launch_bwd_sm90 import BLOCK_N, CONFIGS  # noqa: F401 - this op's names for them
from ..common.tma import gluon_desc

# the default takes dense problems whose sequences both have at least this many tokens. With the rotated walks
# (ca48337) the Hopper kernel beat the Triton kernels' N=1K rows of the last bench (H100, B=4 H=32 fp16, as a
# fraction of cuDNN's backward in each run: D=128 non-causal 0.94 vs 0.76, causal 0.89 vs 0.83; D=64 non-causal
# 1.0 vs 0.84, causal 0.97 vs 0.92; `gpu_check.sh ab-bwd` and bench/results/h100/bwd.json at ae5f553). Shorter
# sequences are not measured.
MIN_SEQLEN = 1024


def reason(p, q, k, v, do, lse):
    """Why the Hopper backward does not take problem p ("" when it does)."""
    if p.varlen:
        return "packed (varlen) inputs"
    if not lse.is_contiguous():  # (delta takes lse's strides, a part of the Workspace allocation)
        return "a non-contiguous lse"
    rows = p.batch * p.heads_q * triton.cdiv(p.seqlen_q, 128) * 128  # (the sums' rows for any block_m <= 128)
    items = triton.cdiv(p.seqlen_k, BLOCK_N) * p.batch * p.heads_kv
    return pipeline.reason(q.device, q.dtype, p.head_dim, p.head_dim_v, (q, k, v, do), (rows, items),
                           min(p.seqlen_q, p.seqlen_k), MIN_SEQLEN)


class Workspace:
    """The backward's float32 buffers on this pipeline, in one allocation (one allocation instead of three:
    host time, the N = 1K rows' bottleneck): delta [B, Hq, Sq] (lse's layout), the dQ sums [B * Hq * query blocks *
    block_m, D] and the int32 counter buffer (pipeline.counter_count; left unset: the preprocess zeroes it,
    pipeline.zero_args). Everything is worked out here, once per plan, not per call (left, right: the window bounds
    as bwd.py clamps them)."""
    _ALIGN = 64  # float32 elements (256 bytes) between the pieces: TMA bases need 16 bytes

    def __init__(self, p, left, right, lse):
        bm = pipeline.block_m(p.head_dim)
        mb = triton.cdiv(p.seqlen_q, bm)
        # query blocks that no key block sees get no dQ part: their sums must start at zero
        off = p.seqlen_k - p.seqlen_q if p.opts.bottom_right else 0
        self.zero = left >= 0 or (right >= 0 and off + right < 0)
        self.delta_shape = lse.shape
        self.acc_shape = (p.batch * p.heads_q * mb * bm, p.head_dim)
        counters = pipeline.counter_count(p.batch, p.heads_q, p.heads_kv, mb)[1]
        sizes = (lse.numel(), self.acc_shape[0] * self.acc_shape[1], counters)
        self.offsets, end = [], 0
        for n in sizes:
            self.offsets.append(end)
            end += triton.cdiv(n, self._ALIGN) * self._ALIGN
        self.sizes, self.numel, self.device = sizes, end, lse.device

    def alloc(self):
        """The allocation (float32; zeroed where the sums must start at zero)."""
        return (torch.zeros if self.zero else torch.empty)(self.numel, dtype=torch.float32, device=self.device)

    def views(self, ws):
        """(delta, acc, counters) tensors of allocation ws."""
        (o0, o1, o2), (n0, n1, n2) = self.offsets, self.sizes
        return (ws[o0:o0 + n0].view(self.delta_shape), ws[o1:o1 + n1].view(self.acc_shape),
                ws[o2:o2 + n2].view(torch.int32))

    def addresses(self, ws):
        """(delta, acc, counters) of allocation ws as launcher.Address values (a plan's replay)."""
        base = ws.data_ptr()
        o0, o1, o2 = self.offsets
        f32 = torch.float32
        return Address(base + 4 * o0, f32), Address(base + 4 * o1, f32), Address(base + 4 * o2, torch.int32)


def attn_bwd_sm90(p, c, do, delta, grads, sums, tail, launch):
    """Launches the kernel: gradients into grads = (dq, dk, dv), through sums = (acc, counters) of a
    Workspace, the counters zeroed by the preprocess, which must be the launch just before (with PDL_TRIGGER: the
    kernel, launched with programmatic dependent launch, may start under its end) (tail:
    scale, qk_scale, softcap_scale, softcap_out, left, right as bwd.py computes them, the window bounds
    clamped; launch: bwd.Launches)."""
    from .gluon_bwd_sm90 import attn_bwd_sm90_kernel
    q, k, v, lse = c.q, c.k, c.v, c.lse
    dq, dk, dv = grads
    acc, counters = sums
    scale, qk_scale, softcap_scale, softcap_out, left, right = tail
    d = p.head_dim
    bm = pipeline.block_m(d)
    mb = triton.cdiv(p.seqlen_q, bm)
    # no masked step at all where no tile can need one (no window or causal rule, whole tiles)
    needs_mask = bool(left >= 0 or right >= 0 or p.seqlen_q % bm or p.seqlen_k % BLOCK_N)
    meta = pipeline.meta(d, needs_mask)
    nk = triton.cdiv(p.seqlen_k, BLOCK_N)
    # a persistent grid where every key block sees every query block (each key block starting its walk at its
    # own query block, so that no add to dQ waits for another) or for square causal problems of whole tiles
    # (pairs of key blocks of equal total length per program): pipeline.grid, gluon_bwd_sm90_walk.py
    causal_square = (right == 0 and left < 0 and p.seqlen_q == p.seqlen_k and p.seqlen_k % BLOCK_N == 0
                     and p.heads_q == p.heads_kv)
    walks = pipeline.ROTATED if not needs_mask else pipeline.PAIRED if causal_square else pipeline.PLAIN
    grid, items, sched = pipeline.grid(d, nk, p.batch * p.heads_kv, q.device, walks)
    # launch_cached: kernel[grid](...) encodes four tensor maps and binds ~40 arguments per call (~100 us of
    # host time, more than the whole backward at N=1K)
    launch(attn_bwd_sm90_kernel, grid, (
        gluon_desc(q, [1, bm, 1, d]), gluon_desc(k, [1, BLOCK_N, 1, d]), gluon_desc(v, [1, BLOCK_N, 1, d]),
        gluon_desc(do, [1, bm, 1, d]), lse, delta, dk, dv,
        gluon_desc(acc, pipeline.dq_half(d)) if meta["TMA_DQ"] else acc, counters, lse.stride(0), lse.stride(1),
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), p.seqlen_q, p.seqlen_k,
        p.heads_kv, p.heads_q // p.heads_kv, mb, nk, items, scale, qk_scale, softcap_scale, softcap_out, left,
        right),
        dict(HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right,
             HAS_SOFTCAP=p.opts.softcap > 0, NEEDS_MASK=needs_mask, SCHED=sched,
             launch_cooperative_grid=sched != pipeline.PLAIN, launch_pdl=True, **meta))
    pipeline.convert(launch, acc, counters, dq, lse, (p.heads_kv, nk), scale, False)
