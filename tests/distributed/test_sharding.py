"""The sequence shards (shard_sequence / unshard_sequence, no process group) and the ring schedule: over the
ranks and steps, the parts each rank computes cover every visible (query, key) pair of the whole sequence exactly
once, with the zigzag layout's causal work equal on every rank."""
import pytest
import torch

import tileattn
from tileattn.ops.distributed.schedule import source_rank, step_parts


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("seq_dim", [1, 2, -2])
def test_shard_unshard_round_trip(world, layout, seq_dim):
    x = torch.randn(2, 24, 24, 3)
    shards = [tileattn.shard_sequence(x, r, world, layout=layout, seq_dim=seq_dim) for r in range(world)]
    assert all(s.is_contiguous() and s.shape[seq_dim] == 24 // world for s in shards)
    assert torch.equal(tileattn.unshard_sequence(shards, layout=layout, seq_dim=seq_dim), x)


def test_zigzag_chunks():
    """Rank r holds chunks r and 2W - 1 - r of 2W, in that order."""
    pos = torch.arange(16).view(1, 16)
    got = [tileattn.shard_sequence(pos, r, 4, layout="zigzag").flatten().tolist() for r in range(4)]
    assert got == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    assert tileattn.shard_sequence(pos, 1, 4, layout="contiguous").flatten().tolist() == [4, 5, 6, 7]


def test_shard_is_differentiable():
    x = torch.randn(1, 8, 2, 4, requires_grad=True)
    tileattn.shard_sequence(x, 1, 2).sum().backward()  # rank 1 of 2: chunks 1 and 2 of 4, positions 2..5
    assert x.grad[0, 2:6].eq(1).all() and x.grad[0, :2].eq(0).all() and x.grad[0, 6:].eq(0).all()


@pytest.mark.parametrize("kwargs, exc, needle", [
    (dict(x=torch.zeros(1, 10, 2, 4), rank=0, world_size=3), ValueError, "multiple of 6"),
    (dict(x=torch.zeros(1, 10, 2, 4), rank=0, world_size=4, layout="contiguous"), ValueError, "multiple of 4"),
    (dict(x=torch.zeros(1, 8, 2, 4), rank=2, world_size=2), ValueError, "rank"),
    (dict(x=torch.zeros(1, 8, 2, 4), rank=0, world_size=0), ValueError, "world_size"),
    (dict(x=torch.zeros(1, 8, 2, 4), rank=0, world_size=2, layout="ring"), ValueError, "layout"),
    (dict(x=torch.zeros(1, 8, 2, 4), rank=0, world_size=2, seq_dim=4), ValueError, "seq_dim"),
    (dict(x=[1, 2], rank=0, world_size=2), TypeError, "x must be"),
])
def test_shard_checks(kwargs, exc, needle):
    with pytest.raises(exc, match=needle):
        tileattn.shard_sequence(**kwargs)


def test_unshard_checks():
    with pytest.raises(ValueError, match="one shape"):
        tileattn.unshard_sequence([torch.zeros(1, 4, 2), torch.zeros(1, 6, 2)])
    with pytest.raises(ValueError, match="even"):
        tileattn.unshard_sequence([torch.zeros(1, 3, 2), torch.zeros(1, 3, 2)], layout="zigzag")
    with pytest.raises(TypeError, match="list"):
        tileattn.unshard_sequence([])


def _global_positions(world, layout, n):
    return [tileattn.shard_sequence(torch.arange(n).view(1, n), r, world, layout=layout)[0] for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_schedule_covers_each_pair_once(world, layout, causal):
    n = 2 * world * 3
    pos = _global_positions(world, layout, n)
    seen = torch.zeros(n, n, dtype=torch.int64)  # [query position, key position]: times computed
    work = {}
    for rank in range(world):
        for step in range(world):
            src = source_rank(rank, world, step)
            qpos, kpos = pos[rank], pos[src]
            pairs = 0
            for part in step_parts(layout, causal, rank, src, len(qpos), len(kpos)):
                qi, kj = qpos[part.q_rows], kpos[part.k_rows]
                vis = torch.ones(len(qi), len(kj), dtype=torch.bool)
                if part.causal:  # on the diagonal block: local row order is global order
                    vis = torch.tril(vis)
                seen[qi[:, None].expand_as(vis)[vis], kj[None, :].expand_as(vis)[vis]] += 1
                pairs += int(vis.sum())
            work[rank, step] = pairs
    want = torch.tril(torch.ones(n, n, dtype=torch.int64)) if causal else torch.ones(n, n, dtype=torch.int64)
    assert torch.equal(seen, want)
    if layout == "zigzag" and causal:  # balanced: after the diagonal step, (2c)^2 / 2 pairs per rank and step
        c = n // (2 * world)
        assert all(work[r, s] == 2 * c * c for r in range(world) for s in range(1, world))


def test_ring_worker_import_leaves_the_environment():
    """Collecting the multi-process tests must not take the GPU from the pytest process (the ranks get their
    CPU-only environment at spawn time)."""
    import importlib
    import os

    import tests.distributed.ring_worker as worker
    before = dict(os.environ)
    importlib.reload(worker)
    assert dict(os.environ) == before
