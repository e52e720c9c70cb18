"""Usage: python3 scripts/check_mla_seesaw.py [--order {0,1,2}] [--broken {early_free,one_free,no_pfree,skip_box}]
                                          [--seeds N]

Barrier-protocol model of the seesaw MLA kernel (gluon_sm90_seesaw.py), written from its code: actors loader,
WG0, WG1; a 2-slot ring of 64-token blocks, each of 9 boxes (ckv columns in 64-column boxes 0-7, kpe box 8) with
its own ready (TMA) barrier, and two halves with their own empty barriers (left: boxes 0-3, read by WG0's P V;
right: boxes 4-8, WG1's); per-warpgroup p_ready / p_free for the published P and row statistics; the Q slot's
q_ready / q_empty. mbarrier semantics: an arrive counts towards the barrier's count, the last one completes the
phase; a wait on parity p passes iff (completed phases & 1) != p.

--order: MLASm90Config.seesaw_order (gluon_sm90_seesaw._turn), all three when not given: 0 a turn waits for its
block whole, then issues its scores and the other's P V of the block before; 1 the same with the scores waiting
box by box; 2 the other's P V first, then the scores box by box (the own half first), both waited before the
softmax, this warpgroup's half of the block before freed then (the loader refills the owner's half of a block
first).

Every interleaving step picks a random runnable actor (TMA completions are actors too, one per box; 3 seeds in 4
mostly favour one actor: WG0, WG1 or the TMA completions). Flags:
  deadlock  every actor blocked;
  alias     a wait passes while the barrier is not exactly one phase past the intended one;
  race      a buffer written (TMA or P store) while a reader holds it, or read with another block's data.
Tiles: every mix of 1-6 blocks (and empty tiles), several tiles per CTA. --broken variants must fail:
  early_free  WG1 frees its half of the other's block before that P V is waited on (race);
  one_free    the whole slot refilled on warpgroup 0's free alone (races on the right half, and deadlocks);
  no_pfree    the owner publishes P without waiting for p_free (race on the P buffer);
  skip_box    the scores do not wait for their last box (race: a read of a box still loading)."""
import argparse
import itertools
import random
from collections import defaultdict

STAGES = 2


class World:
    def __init__(self, counts):
        self.counts = counts
        self.pend = defaultdict(int)
        self.done = defaultdict(int)
        self.bad = set()
        self.data = {}  # (buffer, index) -> block id held
        self.readers = defaultdict(set)  # (buffer, index) -> actors reading it (a wgmma in flight)
        self.tma = []  # pending TMA completions: (barrier key, [(buffer key, block)])

    def arrive(self, name, i):
        k = (name, i)
        self.pend[k] += 1
        if self.pend[k] == self.counts[name]:
            self.pend[k] = 0
            self.done[k] += 1
        elif self.pend[k] > self.counts[name]:
            self.bad.add(("overarrive", name, i))

    def wait(self, name, i, g):
        """A wait for the completion of phase g (parity g & 1) of barrier (name, i): a predicate."""
        k = (name, i)

        def ok():
            if (self.done[k] & 1) != (g & 1):
                if self.done[k] != g + 1:
                    self.bad.add(("alias", name, i, g, self.done[k]))
                return True
            return False
        return ok

    def write(self, buf, block):
        if self.readers[buf]:
            self.bad.add(("race-write", buf, block, tuple(sorted(self.readers[buf]))))
        self.data[buf] = None  # in flight

    def read(self, who, buf, block):
        if self.data.get(buf) != block:
            self.bad.add(("race-read", who, buf, block, self.data.get(buf)))
        self.readers[buf].add(who)

    def unread(self, who, buf):
        self.readers[buf].discard(who)


NB, H = 9, 4  # boxes per block (8 of ckv, kpe), ckv boxes per half
HALF = {0: range(0, H), 1: range(H, NB)}  # the boxes each half's empty barrier frees


def loader(w, tiles, order, broken=None):
    kv = 0
    for j, n in enumerate(tiles):
        first = min(n, STAGES) if j > 0 else 0
        for g in range(kv, kv + first):
            yield from load_block(w, g, g - kv, order, broken)
        yield w.wait("q_empty", 0, j - 1)  # (j = 0: parity 1 on a fresh barrier passes)
        w.write(("q", 0), j)
        w.tma.append((("q_ready", 0), [(("q", 0), j)]))
        for g in range(kv + first, kv + n):
            yield from load_block(w, g, g - kv, order, broken)
        kv += n


def load_block(w, g, it, order, broken=None):
    """Block g (the tile's it-th): each half once its empty barrier says so, each box on its own ready barrier;
    order 2: first the half of the warpgroup owning the block (it % 2 owns it)."""
    s = g % STAGES
    first = it % 2 if order == 2 else 0
    for h in (first, 1 - first):
        if broken != "one_free" or h == 0:
            yield w.wait(("emptyL", "emptyR")[h], s, g // STAGES - 1)
        for c in HALF[h]:
            w.write(("box", s, c), g)
            w.tma.append((("ready", (s, c)), [(("box", s, c), g)]))


def consumer(w, tiles, WG, order, broken):
    """The warpgroup's turns (gluon_sm90_seesaw._consumer, _turn): for its own block o, the scores of o and the
    other's block o - 1 (gather, P V), then the softmax and publish of o, then the own P V of o."""
    me = f"wg{WG}"
    OTHER = 1 - WG
    empty = "emptyL" if WG == 0 else "emptyR"
    kv = 0
    c = [0, 0]  # blocks each warpgroup owned in earlier tiles: p_ready / p_free phases

    def gather(g, o_idx):
        # the other's block g (its o_idx-th owned block overall): my half's ckv boxes, P, m, row sums; then its
        # P V on my half
        for b in range(WG * H, WG * H + H):
            yield w.wait("ready", (g % STAGES, b), g // STAGES)
        yield w.wait("p_ready", OTHER, o_idx)
        w.read(me, ("x", OTHER), g)
        for b in HALF[WG]:
            w.read(me, ("box", g % STAGES, b), g)

    def other_pv_done(g):
        w.unread(me, ("x", OTHER))
        for b in HALF[WG]:
            w.unread(me, ("box", g % STAGES, b))
        w.arrive("p_free", OTHER)
        w.arrive(empty, g % STAGES)

    def scores(g):
        # the 9 boxes of block g: order 0 all waited, then read; else each waited and read in turn (order 2: the
        # own half first)
        s = g % STAGES
        boxes = list(HALF[WG]) + list(HALF[OTHER]) if order == 2 else list(range(NB))
        if order == 0:
            for b in boxes:
                yield w.wait("ready", (s, b), g // STAGES)
        for i, b in enumerate(boxes):
            if order > 0 and not (broken == "skip_box" and i == len(boxes) - 1):
                yield w.wait("ready", (s, b), g // STAGES)
            w.read(me, ("box", s, b), g)

    for j, n in enumerate(tiles):
        n_own = (n + 1 - WG) // 2
        yield w.wait("q_ready", 0, j)
        for k in range(n_own):
            o = 2 * k + WG
            g = kv + o
            s = g % STAGES
            w.read(me, ("q", 0), j)
            o_idx = c[OTHER] + (o - 1 - OTHER) // 2
            if order == 2:
                if o > 0:  # the other's block o - 1 first: its P V
                    yield from gather(g - 1, o_idx)
                    if broken == "early_free":
                        w.arrive(empty, (g - 1) % STAGES)
                yield from scores(g)
                yield  # the wait for both (the scores were issued after the P V)
                if o > 0:
                    if broken == "early_free":
                        w.unread(me, ("x", OTHER))
                        for b in HALF[WG]:
                            w.unread(me, ("box", (g - 1) % STAGES, b))
                        w.arrive("p_free", OTHER)
                    else:
                        other_pv_done(g - 1)
            else:
                yield from scores(g)
                if o > 0:  # the other's block o - 1: its P V under these scores
                    yield from gather(g - 1, o_idx)
                    if broken == "early_free":
                        w.arrive(empty, (g - 1) % STAGES)
                yield  # the scores' wait
            w.unread(me, ("q", 0))
            for b in range(NB):
                w.unread(me, ("box", s, b))
                # the owner zeroes V's rows past the sequence in both halves (a tile's last block): no one else
                # may be reading them
                if w.readers[("box", s, b)]:
                    w.bad.add(("race-write", ("box", s, b), g, tuple(sorted(w.readers[("box", s, b)]))))
            for b in HALF[WG]:
                w.read(me, ("box", s, b), g)  # own P V reads my half (a wgmma from here to its wait)
            # publish P_o
            if broken != "no_pfree":
                yield w.wait("p_free", WG, c[WG] + k - 1)
            w.write(("x", WG), g)
            w.data[("x", WG)] = g
            w.arrive("p_ready", WG)
            if o > 0 and order != 2:
                yield  # the other's P V wait
                if broken == "early_free":
                    w.unread(me, ("x", OTHER))
                    for b in HALF[WG]:
                        w.unread(me, ("box", (g - 1) % STAGES, b))
                    w.arrive("p_free", OTHER)
                else:
                    other_pv_done(g - 1)
            yield  # own P V issued and waited
            for b in HALF[WG]:
                w.unread(me, ("box", s, b))
            if broken != "one_free" or WG == 0:
                w.arrive(empty, s)
        w.arrive("q_empty", 0)  # every score of this warpgroup's waited on
        last = n - 1
        if n > 0 and last % 2 == OTHER:  # the tile ends on the other's block
            g = kv + last
            yield from gather(g, c[OTHER] + (last - OTHER) // 2)
            yield
            other_pv_done(g)
        kv += n
        c[0] += (n + 1) // 2
        c[1] += n // 2


def tma_actor(w):
    while True:
        if not w.tma:
            yield "idle"
            continue
        i = random.randrange(len(w.tma))
        bar, writes = w.tma.pop(i)
        for buf, block in writes:
            w.data[buf] = block
        w.arrive(*bar)
        yield


def run(tiles, seed, order, broken=None):
    random.seed(seed)
    counts = dict(ready=1, emptyL=1, emptyR=1, p_ready=1, p_free=1, q_ready=1, q_empty=2)
    w = World(counts)
    actors = {"loader": loader(w, tiles, order, broken), "wg0": consumer(w, tiles, 0, order, broken),
              "wg1": consumer(w, tiles, 1, order, broken)}
    blocked = {k: None for k in actors}  # a pending wait predicate
    live = set(actors)
    # a quarter of the interleavings pick uniformly; the others mostly run one actor ahead whenever it can (a
    # warpgroup a turn ahead of the other, or the loads landing at once), which uniform picks rarely reach
    favor = (None, "wg0", "wg1", "tma")[seed % 4]
    tma = tma_actor(w)
    while live:
        runnable = [k for k in live if blocked[k] is None or blocked[k]()]
        if w.tma:
            runnable.append("tma")
        if not runnable:
            return w.bad | {("deadlock", tuple(tiles))}
        k = favor if favor in runnable and random.random() < 0.9 else random.choice(runnable)
        if k == "tma":
            next(tma)
            continue
        blocked[k] = None
        try:
            out = next(actors[k])
        except StopIteration:
            live.discard(k)
            continue
        blocked[k] = out if callable(out) else None
    return w.bad


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--order", type=int, choices=(0, 1, 2), default=None, help="one seesaw_order (else all)")
    p.add_argument("--broken", choices=("early_free", "one_free", "no_pfree", "skip_box"), default=None)
    p.add_argument("--seeds", type=int, default=40)
    a = p.parse_args()
    seqs = [list(t) for r in (1, 2, 3) for t in itertools.product(range(0, 7), repeat=r)]
    seqs += [[5, 1, 6, 0, 3, 2, 4], [1, 1, 1, 1], [6, 6, 6], [2, 3, 2, 3, 1]]
    orders = (0, 1, 2) if a.order is None else (a.order, )
    if a.broken == "skip_box":
        orders = tuple(o for o in orders if o > 0) or (2, )  # (order 0 waits for every box before any read)
    rc = 0
    for order in orders:
        total = defaultdict(int)
        examples = {}
        for tiles in seqs:
            for seed in range(a.seeds):
                for b in run(tiles, seed, order, a.broken):
                    total[b[0]] += 1
                    examples.setdefault(b[0], (tiles, seed, b))
        failed = sum(total.values()) > 0
        print(f"order {order}: {len(seqs)} tile sequences (1-3 tiles of 0-6 blocks, and 4 longer) x {a.seeds} "
              f"interleavings, broken={a.broken}")
        for kind in ("deadlock", "alias", "race-write", "race-read", "overarrive"):
            print(f"  {kind}: {total[kind]}" + (f"   e.g. {examples[kind]}" if kind in examples else ""))
        rc |= 1 if failed != (a.broken is not None) else 0
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
