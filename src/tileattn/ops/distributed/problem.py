"""The description of one ring-attention call (RingPlan) and its checks.

Every check runs on the calling rank's own tensors before any communication, and raises TypeError / ValueError
naming the argument. What the ranks hold must agree (shapes, dtypes, the causal flag, the layout, the scale):
that cannot be checked without communicating, so it is the caller's contract; a rank whose K/V shard differs in
size from its neighbours' makes the receive fail (gloo) or corrupts it (NCCL).
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..dense.problem import MAX_GRAD_HEAD_DIM, check_device, check_inputs, check_options
from .schedule import LAYOUTS


@dataclass(frozen=True)
class RingPlan:
    """One call's ring: this rank's place in it, the options, and the transport that moves blocks.

    transport: .exchange(send, recv, tag) starts sending `send` to the next rank and receiving the previous
    rank's block into `recv` (same shape and dtype) and returns a handle; .wait(handle) makes later work on the
    current stream see `recv` (and lets `send` be overwritten). P2PTransport is torch.distributed's; the
    single-GPU simulation of `tileattn bench cp --simulate` has its own."""
    rank: int
    world: int
    layout: str
    causal: bool
    scale: float
    transport: object


class P2PTransport:
    """torch.distributed point-to-point: send to the next rank of the group, receive from the previous one.

    NCCL: one batch_isend_irecv per exchange (the pair launched as one group). Other backends (gloo): a plain
    isend and irecv (gloo runs them on its threads; with torch 2.13, processes that had used batch_isend_irecv on
    gloo aborted at exit in 3-4 of 10 two-process runs, plain isend / irecv in none). A handle is the list of the
    works; wait() waits on each: on NCCL that makes the current CUDA stream wait for the communication stream
    (no host block), on gloo it blocks until the transfer is done. Tags keep the K/V and dK/dV messages apart
    on gloo (NCCL matches them by order, which every rank shares)."""

    def __init__(self, group, next_rank, prev_rank):
        self.group, self.next_rank, self.prev_rank = group, next_rank, prev_rank
        self.batched = "nccl" in str(dist.get_backend(group)).lower()

    def exchange(self, send, recv, tag):
        if not self.batched:
            return [dist.isend(send, self.next_rank, self.group, tag),
                    dist.irecv(recv, self.prev_rank, self.group, tag)]
        ops = [dist.P2POp(dist.isend, send, self.next_rank, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev_rank, self.group, tag)]
        return dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(handle):
        for work in handle:
            work.wait()


def check_ring_inputs(q, k, v, causal, scale, layout):
    """The local checks: tensors, options, layout rules. Raises before any communication."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dim() != 4:
            raise ValueError(f"{name} must have 4 dims [B, S_local, H, D] (ring_attention takes no packed varlen "
                             f"input), got shape {tuple(t.shape)}")
        if isinstance(t, torch.Tensor) and t.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"ring_attention takes float16 or bfloat16 tensors, {name} is {t.dtype}")
    check_inputs(q, k, v, varlen=False)
    check_options(causal, scale, (-1, -1), 0.0)
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(repr(x) for x in LAYOUTS)}, got {layout!r}")
    sq, sk = q.shape[1], k.shape[1]
    if sq == 0 or sk == 0:
        raise ValueError(f"ring_attention needs non-empty shards, got S_local {sq} (q) and {sk} (k)")
    if causal and sq != sk:
        raise ValueError(f"causal ring attention needs q and k shards of one length (global positions over "
                         f"equal-length shards), got S_local {sq} (q) and {sk} (k)")
    if causal and layout == "zigzag" and sq % 2:
        raise ValueError(f"layout='zigzag' holds two equal chunks per rank: S_local must be even, got {sq} "
                         f"(shard with tileattn.shard_sequence, or use layout='contiguous')")
    if any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled() \
            and max(q.shape[-1], v.shape[-1]) > MAX_GRAD_HEAD_DIM:
        raise ValueError(f"q, k or v requires grad, but the backward takes head dims up to {MAX_GRAD_HEAD_DIM} "
                         f"(got D={q.shape[-1]}, Dv={v.shape[-1]})")
    check_device(q, k, v)


def scale_of(q, scale):
    return float(q.shape[-1] ** -0.5 if scale is None else scale)


def ring_of(group, device):
    """(rank, world, next global rank, previous global rank, group as given) of the calling process in `group`
    (None: the default group), after checking that the group can carry tensors on `device`."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("ring_attention needs torch.distributed initialized (torch.distributed."
                         "init_process_group, e.g. under torchrun); group=None means the default group")
    # the plan keeps None for the default group: a reference to the default ProcessGroup object kept alive in an
    # autograd graph past destroy_process_group made gloo processes abort at exit (torch 2.13, 3-5 of 8 runs)
    pg = dist.group.WORLD if group is None else group
    try:
        rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"group: not a usable process group ({e})") from None
    if rank < 0:
        raise ValueError("group: the calling process is not a member of the group")
    backend = str(dist.get_backend(pg)).lower()
    if device.type == "cpu" and "gloo" not in backend and "mpi" not in backend:
        raise ValueError(f"q, k, v are CPU tensors but the group's backend ({backend}) cannot send them: use a "
                         f"gloo group for CPU tensors")
    if device.type == "cuda" and "nccl" in backend and device.index != torch.cuda.current_device():
        raise ValueError(f"q, k, v are on {device} but the current CUDA device is {torch.cuda.current_device()}: "
                         f"NCCL sends from the current device (call torch.cuda.set_device(local_rank) first)")
    nxt = dist.get_global_rank(pg, (rank + 1) % world)
    prev = dist.get_global_rank(pg, (rank - 1) % world)
    return rank, world, nxt, prev, group


def check_shard_args(world_size, layout, seq_dim, ndim, rank=None):
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size):
        raise ValueError(f"rank must be an int in [0, world_size = {world_size}), got {rank!r}")
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(repr(x) for x in LAYOUTS)}, got {layout!r}")
    if not isinstance(seq_dim, int) or isinstance(seq_dim, bool) or not -ndim <= seq_dim < ndim:
        raise ValueError(f"seq_dim must be an int in [-{ndim}, {ndim}) for a {ndim}-dim tensor, got {seq_dim!r}")
