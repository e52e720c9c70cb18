"""Which query rows of a rank attend to which rows of the K/V block it holds at each ring step.

Layouts (the sequence of S tokens split over W ranks; equal-length shards):
    contiguous  rank r holds chunk r of W chunks (tokens r * S / W ... (r + 1) * S / W - 1).
    zigzag      the sequence split in 2W chunks of c = S / (2W) tokens; rank r holds chunks r and 2W - 1 - r,
                in that order (its local rows 0..c-1 are chunk r, rows c..2c-1 chunk 2W - 1 - r).

The ring: at step s (0 <= s < W) rank r holds the K/V shard of rank src = (r - s) mod W (every rank sends
what it holds to rank r + 1 and receives from rank r - 1). Causal attention is over global positions: a query
at global position i sees the key at global position j iff j <= i.

Contiguous, causal: src == r is the causal diagonal of the shard; src < r: every query sees every key; src > r:
nothing is visible (no work; the block only passes through).

Zigzag, causal, with q chunks (a, b) = (r, 2W-1-r) and K/V chunks (j, 2W-1-j) of src = j. Chunk x sees chunk y
whole when y < x, on its causal diagonal when y == x, not at all when y > x. Since r < W <= 2W-1-r:
    j == r  q chunk r: diagonal of chunk r, nothing of 2W-1-r; q chunk 2W-1-r: all of chunk r, diagonal of
            2W-1-r. Local row order is global order, so this is plain causal attention on the 2c local rows.
    j < r   both q chunks see all of chunk j (j < r < 2W-1-r) and nothing of 2W-1-j (> 2W-1-r > r):
            all 2c query rows against the first c K/V rows, no mask.
    j > r   q chunk r sees nothing (j > r and 2W-1-j >= W > r); q chunk 2W-1-r sees chunk j (j < W <=
            2W-1-r) and chunk 2W-1-j (< 2W-1-r): the last c query rows against all 2c K/V rows, no mask.
Every step computes 2c * 2c / 2 query-key pairs on every rank: the causal work is balanced, where the contiguous
layout gives rank r r + 1/2 blocks of work and the ring waits for the busiest rank.

Not causal: every step is all query rows against all K/V rows, whatever the layout (then the layout only
fixes which tokens a rank holds, and q and K/V shards may differ in length).
"""
from dataclasses import dataclass

LAYOUTS = ("zigzag", "contiguous")


@dataclass(frozen=True)
class Part:
    """One attention call of a ring step: local query rows q_rows against rows k_rows of the held K/V block,
    causal (on the diagonal, query row i sees key row j <= i) or not."""
    q_rows: slice
    k_rows: slice
    causal: bool


def source_rank(rank: int, world: int, step: int) -> int:
    """The rank whose K/V shard `rank` holds at ring step `step`."""
    return (rank - step) % world


def step_parts(layout: str, causal: bool, rank: int, src: int, seqlen_q: int, seqlen_k: int) -> tuple:
    """The Parts (possibly none) that `rank` computes against the K/V shard of rank `src` (module docstring).
    Causal needs seqlen_q == seqlen_k (even for zigzag: two chunks)."""
    every_q, every_k = slice(0, seqlen_q), slice(0, seqlen_k)
    if not causal:
        return (Part(every_q, every_k, False),)
    if src == rank:
        return (Part(every_q, every_k, True),)
    if layout == "contiguous":
        return (Part(every_q, every_k, False),) if src < rank else ()
    half_q, half_k = seqlen_q // 2, seqlen_k // 2
    if src < rank:
        return (Part(every_q, slice(0, half_k), False),)
    return (Part(slice(half_q, seqlen_q), every_k, False),)


def chunk_ids(rank: int, world: int, layout: str) -> tuple:
    """The chunks rank `rank` holds, in local order: (r,) of W chunks, or zigzag's (r, 2W - 1 - r) of 2W."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def num_chunks(world: int, layout: str) -> int:
    return 2 * world if layout == "zigzag" else world
