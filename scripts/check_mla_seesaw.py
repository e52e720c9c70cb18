"""Usage: python3 scripts/check_mla_seesaw.py [--broken {early_free,one_free,no_pfree,skip_box,no_mxwait}] [--seeds N]

Barrier-protocol model of the seesaw MLA kernel's pair schedule (gluon_sm90_seesaw.py), written from its code:
actors loader, WG0, WG1; a 2-slot ring of 64-token blocks, each of 9 boxes (ckv columns in 64-column boxes 0-7,
kpe box 8) with its own ready (TMA) barrier, and two halves with their own empty barriers (left: boxes 0-3, read
by WG0's P V; right: boxes 4-8, WG1's); per-warpgroup p_ready / p_free for the published P and row statistics,
mx_ready for the pair's row maxima; the Q slot's q_ready / q_empty. mbarrier semantics: an arrive counts towards
the barrier's count, the last one completes the phase; a wait on parity p passes iff (completed phases & 1) != p.

The schedule (consumer): both warpgroups' scores of a pair at once (box by box, the own half first), the row
maxima exchanged (mx / mx_ready), the own P V, the publish of P, the other's P V, each half freed after the P V
reading it; an odd tile's lone last block published by WG0 (P, m, row sums) and gathered by WG1; the loader takes
a pair's owners' halves first (load_pairs). (The earlier turn orders, seesaw_order 0-2, and their model are on
branches mla-seesaw / mla-seesaw-box.)

Every interleaving step picks a random runnable actor (TMA completions are actors too, one per box; 3 seeds in 4
mostly favour one actor: WG0, WG1 or the TMA completions). Flags:
  deadlock  every actor blocked;
  alias     a wait passes while the barrier is not exactly one phase past the intended one;
  race      a buffer written (TMA or P store) while a reader holds it, or read with another block's data.
Tiles: every mix of 1-6 blocks (and empty tiles), several tiles per CTA. --broken variants must fail:
  early_free  WG1 frees its half of the other's block before that P V is waited on (race);
  one_free    the whole slot refilled on warpgroup 0's free alone (races on the right half, and deadlocks);
  no_pfree    the owner publishes P without waiting for p_free (race on the P buffer);
  skip_box    the scores do not wait for their last box (race: a read of a box still loading);
  no_mxwait   the other's row maxima read without waiting for mx_ready (race).
(The kernel keeps the maxima out of m_bufs, which the lone block's publish writes. Writing them there shows no race
in the model either: warpgroup 0's next scores wait for a half that the loader refills only after warpgroup 1
has read m and freed the lone block's half, a dependence through the loader's order, too indirect to rely on.)"""
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


def loader(w, tiles, broken=None):
    kv = 0
    for j, n in enumerate(tiles):
        first = min(n, STAGES) if j > 0 else 0
        yield from load_pairs(w, kv, 0, first, broken)
        yield w.wait("q_empty", 0, j - 1)  # (j = 0: parity 1 on a fresh barrier passes)
        w.write(("q", 0), j)
        w.tma.append((("q_ready", 0), [(("q", 0), j)]))
        yield from load_pairs(w, kv, first, n, broken)
        kv += n


def load_pairs(w, kv, lo, hi, broken=None):
    """gluon_producer._load_pairs: the blocks of a pair (lo even), the owners' halves first (block it's left, block
    it + 1's right), then the others."""
    for it in range(lo, hi, 2):
        halves = [(it, 0), (it + 1, 1), (it, 1), (it + 1, 0)]
        for b, h in halves:
            if b < hi:
                yield from load_half(w, kv + b, h, broken)


def load_half(w, g, h, broken=None):
    s = g % STAGES
    if broken != "one_free" or h == 0:
        yield w.wait(("emptyL", "emptyR")[h], s, g // STAGES - 1)
    for c in HALF[h]:
        w.write(("box", s, c), g)
        w.tma.append((("ready", (s, c)), [(("box", s, c), g)]))


def consumer(w, tiles, WG, broken):
    """gluon_sm90_seesaw._consumer: pair k of a tile holds blocks 2k (WG0's) and 2k + 1 (WG1's); both warpgroups'
    scores at once, the row maxima exchanged (mx, mx_ready), the own P V, the publish of P, the other's P V; an odd
    tile ends on WG0's lone block (_lone: publish and gather, with m)."""
    me = f"wg{WG}"
    OTHER = 1 - WG
    empty = "emptyL" if WG == 0 else "emptyR"
    mx = "mx"
    kv = 0
    c = [0, 0]  # blocks each warpgroup owned in earlier tiles (c[1]: the full pairs too)

    def scores(g, own_first=True):
        s = g % STAGES
        boxes = list(HALF[WG]) + list(HALF[OTHER]) if own_first else list(range(NB))
        for i, b in enumerate(boxes):
            if not (broken == "skip_box" and i == len(boxes) - 1):
                yield w.wait("ready", (s, b), g // STAGES)
            w.read(me, ("box", s, b), g)

    def scores_done(g, j):
        s = g % STAGES
        w.unread(me, ("q", 0))
        for b in range(NB):
            w.unread(me, ("box", s, b))
            # the owner may zero V's rows past the sequence in both halves (a tile's last block): no one else may
            # be reading them
            if w.readers[("box", s, b)]:
                w.bad.add(("race-write", ("box", s, b), g, tuple(sorted(w.readers[("box", s, b)]))))

    for j, n in enumerate(tiles):
        yield w.wait("q_ready", 0, j)
        for k in range(n // 2):
            g = kv + 2 * k + WG
            go = kv + 2 * k + OTHER
            pair = kv + 2 * k  # (the pair's identity, for the maxima's contents)
            w.read(me, ("q", 0), j)
            yield from scores(g)
            yield  # the scores' wait
            scores_done(g, j)
            w.write((mx, WG), pair)
            w.data[(mx, WG)] = pair
            w.arrive("mx_ready", WG)
            if broken != "no_mxwait":
                yield w.wait("mx_ready", OTHER, c[1] + k)
            w.read(me, (mx, OTHER), pair)
            yield  # the softmax
            w.unread(me, (mx, OTHER))
            for b in HALF[WG]:
                w.read(me, ("box", g % STAGES, b), g)  # the own P V, issued
            if broken != "no_pfree":
                yield w.wait("p_free", WG, c[WG] + k - 1)
            w.write(("x", WG), g)
            w.data[("x", WG)] = g
            w.arrive("p_ready", WG)
            for b in range(WG * H, WG * H + H):
                yield w.wait("ready", (go % STAGES, b), go // STAGES)
            yield w.wait("p_ready", OTHER, c[OTHER] + k)
            w.read(me, ("x", OTHER), go)
            for b in HALF[WG]:
                w.read(me, ("box", go % STAGES, b), go)  # the other's P V, issued
            if broken == "early_free":
                w.arrive(empty, go % STAGES)
            yield  # the own P V waited (the other's may still run)
            for b in HALF[WG]:
                w.unread(me, ("box", g % STAGES, b))
            if broken != "one_free" or WG == 0:
                w.arrive(empty, g % STAGES)
            yield  # the other's P V waited
            w.unread(me, ("x", OTHER))
            for b in HALF[WG]:
                w.unread(me, ("box", go % STAGES, b))
            w.arrive("p_free", OTHER)
            if broken != "early_free" and (broken != "one_free" or WG == 0):
                w.arrive(empty, go % STAGES)
        if WG == 1:
            w.arrive("q_empty", 0)
        if n % 2:  # the lone block of WG0
            k = n // 2
            g = kv + 2 * k
            s = g % STAGES
            if WG == 0:
                w.read(me, ("q", 0), j)
                yield from scores(g)
                yield
                scores_done(g, j)
                for b in HALF[0]:
                    w.read(me, ("box", s, b), g)
                if broken != "no_pfree":
                    yield w.wait("p_free", 0, c[0] + k - 1)
                for buf in (("x", 0), ("m", 0)):
                    w.write(buf, g)
                    w.data[buf] = g
                w.arrive("p_ready", 0)
                yield  # own P V waited
                for b in HALF[0]:
                    w.unread(me, ("box", s, b))
                w.arrive(empty, s)
            else:
                for b in range(H, 2 * H):
                    yield w.wait("ready", (s, b), g // STAGES)
                yield w.wait("p_ready", 0, c[0] + k)
                w.read(me, ("x", 0), g)
                w.read(me, ("m", 0), g)
                for b in HALF[1]:
                    w.read(me, ("box", s, b), g)
                if broken == "early_free":
                    w.arrive(empty, s)
                yield
                w.unread(me, ("x", 0))
                w.unread(me, ("m", 0))
                for b in HALF[1]:
                    w.unread(me, ("box", s, b))
                w.arrive("p_free", 0)
                if broken != "early_free" and broken != "one_free":
                    w.arrive(empty, s)
        if WG == 0:
            w.arrive("q_empty", 0)
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


def run(tiles, seed, broken=None):
    random.seed(seed)
    counts = dict(ready=1, emptyL=1, emptyR=1, p_ready=1, p_free=1, q_ready=1, q_empty=2, mx_ready=1)
    w = World(counts)
    actors = {"loader": loader(w, tiles, broken), "wg0": consumer(w, tiles, 0, broken),
              "wg1": consumer(w, tiles, 1, broken)}
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
    p.add_argument("--broken", choices=("early_free", "one_free", "no_pfree", "skip_box", "no_mxwait"), default=None)
    p.add_argument("--seeds", type=int, default=40)
    a = p.parse_args()
    seqs = [list(t) for r in (1, 2, 3) for t in itertools.product(range(0, 7), repeat=r)]
    seqs += [[5, 1, 6, 0, 3, 2, 4], [1, 1, 1, 1], [6, 6, 6], [2, 3, 2, 3, 1]]
    total = defaultdict(int)
    examples = {}
    for tiles in seqs:
        for seed in range(a.seeds):
            for b in run(tiles, seed, a.broken):
                total[b[0]] += 1
                examples.setdefault(b[0], (tiles, seed, b))
    failed = sum(total.values()) > 0
    print(f"pair schedule: {len(seqs)} tile sequences (1-3 tiles of 0-6 blocks, and 4 longer) x {a.seeds} "
          f"interleavings, broken={a.broken}")
    for kind in ("deadlock", "alias", "race-write", "race-read", "overarrive"):
        print(f"  {kind}: {total[kind]}" + (f"   e.g. {examples[kind]}" if kind in examples else ""))
    return 1 if failed != (a.broken is not None) else 0


if __name__ == "__main__":
    raise SystemExit(main())
