"""The ring loops on the dense op's kernels: the forward merges each K/V block's partial output into a float32
running (out, lse); the backward keeps dQ local and sends each block's dK/dV accumulator around the ring with
the block, computing each block's gradients from the merged (global) out and lse.

Overlap: each step starts the exchange of the next block (RingPlan.transport) before it launches the current
block's kernels, and waits for it only after them; on NCCL the waits are stream dependencies, so the copy runs
while the step computes. Two buffers per kind alternate: a step receives into the one its predecessor sent from
(that send was waited for before the swap) while the kernels read the other.

Determinism: every sum has a fixed order (the ring's), no atomics. A rank's out and lse merge its steps
0, 1, ..., W - 1 in order; dQ sums them the same way; the dK/dV of rank j's block accumulate the contributions of
ranks j, j + 1, ..., j + W - 1 in that order, in float32, and arrive back at rank j after W hops.
"""
import math

import torch
import triton

from ...launcher import launch_cached
from ..dense import bwd as dense_bwd
from ..dense.api import attention
from ..dense.problem import AttnOptions, AttnProblem, Call, effective_window
from .kernels import merge_kernel
from .schedule import source_rank, step_parts

KV_TAG, GRAD_TAG = 0, 1  # message tags: a block's K/V, a block's dK/dV accumulator


def pack(k, v, dtype=None):
    """k and v copied into one contiguous flat buffer (one message per step), in `dtype` (default k's)."""
    nk = k.numel()
    buf = torch.empty(nk + v.numel(), dtype=dtype or k.dtype, device=k.device)
    buf[:nk].view(k.shape).copy_(k)
    buf[nk:].view(v.shape).copy_(v)
    return buf


def unpack(buf, k_shape, v_shape):
    """The k and v views of a pack()ed buffer."""
    nk = math.prod(k_shape)
    return buf[:nk].view(k_shape), buf[nk:].view(v_shape)


def merge(acc, lse_acc, o, lse, rows):
    """Merge a block's (o [B, s, H, Dv], lse [B, H, s] float32) into rows `rows` of the running float32
    (acc [B, S, H, Dv], lse_acc [B, H, S]), in place (kernels.merge_kernel)."""
    a, la = acc[:, rows], lse_acc[:, :, rows]
    batch, seqlen, heads, dv = o.shape
    block_dv = triton.next_power_of_2(dv)
    block_m = 64 if block_dv <= 128 else 32
    if lse.stride(-1) != 1:
        lse = lse.contiguous()
    launch_cached(merge_kernel, (batch * heads, triton.cdiv(seqlen, block_m)), (
        a, la, o, lse, a.stride(0), a.stride(1), a.stride(2), o.stride(0), o.stride(1), o.stride(2),
        la.stride(0), la.stride(1), lse.stride(0), lse.stride(1), seqlen, heads),
        dict(DV=dv, BLOCK_M=block_m, BLOCK_DV=block_dv, num_warps=4))


def ring_forward(plan, q, k, v):
    """(out in q's dtype [B, S_local, Hq, Dv], lse float32 [B, Hq, S_local]) of this rank's queries against
    every rank's K/V shard."""
    sq, sk, world = q.shape[1], k.shape[1], plan.world
    kv = pack(k, v)
    spare = torch.empty_like(kv) if world > 1 else None
    acc = lse_acc = None
    for step in range(world):
        last = step == world - 1
        pending = None if last else plan.transport.exchange(kv, spare, KV_TAG)
        kb, vb = unpack(kv, k.shape, v.shape)
        src = source_rank(plan.rank, world, step)
        for part in step_parts(plan.layout, plan.causal, plan.rank, src, sq, sk):
            o, lse = attention(q[:, part.q_rows], kb[:, part.k_rows], vb[:, part.k_rows], causal=part.causal,
                               scale=plan.scale, return_lse=True)
            if acc is None and part.q_rows == slice(0, sq):  # step 0: every row's first block (no merge)
                acc, lse_acc = o.float(), lse
                continue
            if acc is None:
                acc = torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.float32, device=q.device)
                lse_acc = torch.full((q.shape[0], q.shape[2], sq), -math.inf, dtype=torch.float32, device=q.device)
            merge(acc, lse_acc, o, lse, part.q_rows)
        if not last:
            plan.transport.wait(pending)
            kv, spare = spare, kv
    return acc.to(q.dtype), lse_acc


def block_bwd(plan, part, saved, kb, vb):
    """(dq [B, rows, Hq, D], dk, dv [B, k rows, Hkv, D(v)]) of one Part, in the inputs' dtypes, by the dense
    backward (FlashAttention-2's, deterministic) with the global out and lse: its probabilities are
    exp(s - lse_global), this block's share of the full softmax. saved: (q, out, lse, dout, dlse)."""
    q, out, lse, dout, dlse = saved
    rows, keys = part.q_rows, part.k_rows
    opts = AttnOptions(scale=plan.scale, window=effective_window(part.causal, (-1, -1)), return_lse=True)
    lse_rows = lse[:, :, rows].contiguous()  # the backward writes its delta in lse's layout: a dense one
    c = Call(q[:, rows], kb[:, keys], vb[:, keys], out[:, rows], lse_rows, None, None, None, plan.scale, 0.0, 1.0)
    return dense_bwd.attn_bwd(AttnProblem.of(c, opts), c, dout[:, rows],
                              None if dlse is None else dlse[:, :, rows])


def ring_backward(plan, q, k, v, saved):
    """(dq, dk, dv) of this rank's shards, in their dtypes; saved: (q, out, lse, dout, dlse) as block_bwd."""
    sq, sk, world = q.shape[1], k.shape[1], plan.world
    kv = pack(k, v)
    spare = torch.empty_like(kv) if world > 1 else None
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    # the dK/dV accumulators (float32, pack()ed like K/V): the one this step adds into and sends, the one it
    # receives the next block's into
    grads = [torch.zeros(kv.numel(), dtype=torch.float32, device=q.device)]
    grads.append(torch.empty_like(grads[0]) if world > 1 else None)
    grad_pending = None  # a transport's handle may be None (the simulation's on the CPU): `step` says what is pending
    for step in range(world):
        last = step == world - 1
        pending = None if last else plan.transport.exchange(kv, spare, KV_TAG)
        kb, vb = unpack(kv, k.shape, v.shape)
        src = source_rank(plan.rank, world, step)
        blocks = [(part, block_bwd(plan, part, saved, kb, vb))
                  for part in step_parts(plan.layout, plan.causal, plan.rank, src, sq, sk)]
        for part, (dq_part, _, _) in blocks:
            dq[:, part.q_rows] += dq_part
        if step > 0:  # this block's accumulator, from the previous rank
            plan.transport.wait(grad_pending)
        acc = grads[step % 2]
        dk_acc, dv_acc = unpack(acc, k.shape, v.shape)
        for part, (_, dk_part, dv_part) in blocks:
            dk_acc[:, part.k_rows] += dk_part
            dv_acc[:, part.k_rows] += dv_part
        if world > 1:  # on to the next rank; the last hop brings every block home
            grad_pending = plan.transport.exchange(acc, grads[(step + 1) % 2], GRAD_TAG)
        if not last:
            plan.transport.wait(pending)
            kv, spare = spare, kv
    if world > 1:
        plan.transport.wait(grad_pending)
    dk, dv = unpack(grads[world % 2] if world > 1 else grads[0], k.shape, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingAttention(torch.autograd.Function):
    """ring_forward / ring_backward as one differentiable op: (q, k, v, plan) -> (out, lse)."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        out, lse = ring_forward(plan, q, k, v)
        ctx.plan = plan
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        ctx.save_for_backward(q, k, v, out, lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:  # only the lse was used
            dout = torch.zeros_like(out)
        elif dout.stride(-1) != 1:
            dout = dout.contiguous()
        # dK/dV travel even where k and v need no gradient here: every rank of the ring must make the same
        # transfers, and whether another rank's k needs one is not known locally
        dq, dk, dv = ring_backward(ctx.plan, q, k, v, (q, out, lse, dout, dlse))
        ctx.plan = None  # the graph keeps no process group past its backward
        return dq, dk, dv, None
