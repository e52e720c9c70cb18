"""Public entry points of context-parallel attention: ring_attention, shard_sequence, unshard_sequence.

The sequence of a batch is split over the ranks of a process group; each rank holds a shard of q, k and v
(`shard_sequence`), and ring_attention gives each rank the attention output of its own queries against the whole
sequence. K/V shards travel around the ring (rank r sends to r + 1, receives from r - 1) while each rank
computes against the block it holds; partial outputs merge through their log-sum-exp in float32. Design notes:
docs/design/distributed.md.

Not supported: packed variable-length (varlen) input, sliding windows, softcap, fp8, unequal shard lengths, and
torch.compile (the ring's point-to-point calls are eager; compile the rest of the model around it).
"""
import torch
import torch.distributed as dist

from .problem import P2PTransport, RingPlan, check_ring_inputs, check_shard_args, ring_of, scale_of
from .ring import RingAttention, ring_forward
from .schedule import chunk_ids, num_chunks


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: "dist.ProcessGroup | None" = None,
                   *, causal: bool = False, scale: float | None = None, layout: str = "zigzag",
                   return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of this rank's query shard against the whole sequence, whose K/V shards the ranks of `group`
    hold. Every rank of the group must call it with shards of the same shapes and the same options (a
    collective); forward and backward (every rank must run the backward too).

    Args:
        q: [B, S_local, Hq, D]; k: [B, S_local_k, Hkv, D]; v: [B, S_local_k, Hkv, Dv]: this rank's shards of
            the sequence in `layout` (`shard_sequence` makes them). float16 or bfloat16 (bfloat16 needs a GPU:
            the Triton interpreter's bfloat16 dots are wrong), one dtype, one device: CUDA tensors over NCCL
            (the current device, torch.cuda.set_device), CPU tensors over gloo through the Triton
            interpreter (tests). Head dims as `tileattn.attention` (gradients: D, Dv <= 512). Any strides with
            a contiguous last dim.
        group: the process group (None: the default group). Its ranks, in group-rank order, hold the shards.
        causal: over global positions: the query at global position i sees the key at global position j iff
            j <= i. Needs S_local_k == S_local (equal-length shards, so q and k positions coincide); the
            alignment question of Sq != Sk does not arise. Not causal: every query sees every key, and the
            q and K/V shards may differ in length.
        scale: multiplier of q.k; default D ** -0.5.
        layout: how the sequence of S tokens is split over W ranks.
            "zigzag" (default): 2W chunks of S / (2W) tokens; rank r holds chunks r and 2W - 1 - r, in that order.
                For causal attention every rank then has the same work at every ring step (S_local even).
            "contiguous": rank r holds tokens [r S / W, (r + 1) S / W). Causal work is unbalanced (rank r
                computes r + 1/2 blocks' worth, and every step waits for the busiest rank); still correct.
        return_lse: also return the log-sum-exp (natural log) of the scaled scores of each query over the whole
            sequence; differentiable.

    GQA/MQA: Hq must be a multiple of Hkv; query head h uses key/value head h // (Hq // Hkv).

    Numerics: each block's output and lse come from tileattn.attention; the merge runs in float32, and so do the
    dQ, dK and dV sums (dK/dV travel between ranks in float32). Deterministic: the same inputs on the same
    number of ranks give bit-identical outputs and gradients (fixed summation order, no atomics); results
    differ in rounding from a single-device call on the whole sequence.

    Communication: W - 1 K/V transfers in the forward; W - 1 K/V and W dK/dV transfers in the backward; each
    starts before the step's kernels and is waited for after them (on NCCL the copy overlaps the kernels).
    Memory beyond the outputs: two K/V buffers and the float32 accumulators (forward: out; backward: dQ and
    two dK/dV buffers).

    Checks of this rank's tensors and options (ValueError / TypeError naming the argument) run before any
    communication; that every rank passes the same shapes and options cannot be checked without
    communicating, and is the caller's contract.

    Returns:
        out [B, S_local, Hq, Dv] in q's dtype, in q's layout order; with return_lse, (out, lse) with lse
        [B, Hq, S_local] float32.
    """
    check_ring_inputs(q, k, v, causal, scale, layout)
    rank, world, nxt, prev, group = ring_of(group, q.device)
    plan = RingPlan(rank, world, layout, causal, scale_of(q, scale), P2PTransport(group, nxt, prev))
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = RingAttention.apply(q, k, v, plan)
    else:
        out, lse = ring_forward(plan, q, k, v)
    return (out, lse) if return_lse else out


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, *, layout: str = "zigzag",
                   seq_dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s shard of a whole sequence x (e.g. [B, S, H, D]; the lse layout [B, H, S] with seq_dim=2).

    layout "zigzag": x's S tokens split in 2 * world_size chunks, the shard is chunks rank and
    2 * world_size - 1 - rank, in that order (S must be a multiple of 2 * world_size); "contiguous": chunk rank
    of world_size (S a multiple of world_size). Returns a new contiguous tensor (differentiable).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_shard_args(world_size, layout, seq_dim, x.dim(), rank)
    n, parts = x.shape[seq_dim], num_chunks(world_size, layout)
    if n % parts:
        raise ValueError(f"the sequence length {n} (dim {seq_dim} of x) must be a multiple of {parts} for "
                         f"layout={layout!r} over {world_size} ranks")
    c = n // parts
    return torch.cat([x.narrow(seq_dim, i * c, c) for i in chunk_ids(rank, world_size, layout)], dim=seq_dim)


def unshard_sequence(x: "torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...]",
                     group: "dist.ProcessGroup | None" = None, *, layout: str = "zigzag",
                     seq_dim: int = 1) -> torch.Tensor:
    """The whole sequence from its shards (the inverse of `shard_sequence`).

    x: this rank's shard, gathered from every rank of `group` (None: the default group) with
    torch.distributed.all_gather (a collective: every rank calls it; not differentiable); or the list of all
    ranks' shards in rank order (no communication). Returns the whole tensor (S = world * S_local along seq_dim)
    on every rank.
    """
    if isinstance(x, (list, tuple)):
        parts = list(x)
        if not parts or not all(isinstance(p, torch.Tensor) for p in parts):
            raise TypeError("x must be a tensor or a non-empty list of the ranks' shard tensors")
        if any(p.shape != parts[0].shape or p.dtype != parts[0].dtype for p in parts):
            raise ValueError(f"the shards must share one shape and dtype, got "
                             f"{[(tuple(p.shape), p.dtype) for p in parts]}")
    elif isinstance(x, torch.Tensor):
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("unshard_sequence of one shard gathers over torch.distributed, which is not "
                             "initialized; pass the list of every rank's shard instead")
        world = dist.get_world_size(group)
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(world)]
        dist.all_gather(parts, x.contiguous(), group=group)
    else:
        raise TypeError(f"x must be a tensor or a list of tensors, got {type(x).__name__}")
    world = len(parts)
    check_shard_args(world, layout, seq_dim, parts[0].dim())
    n = parts[0].shape[seq_dim]
    if layout == "contiguous":
        return torch.cat(parts, dim=seq_dim)
    if n % 2:
        raise ValueError(f"a zigzag shard holds two equal chunks: its length {n} (dim {seq_dim}) must be even")
    c, chunks = n // 2, [None] * (2 * world)
    for r, p in enumerate(parts):
        first, second = chunk_ids(r, world, layout)
        chunks[first], chunks[second] = p.narrow(seq_dim, 0, c), p.narrow(seq_dim, c, c)
    return torch.cat(chunks, dim=seq_dim)
