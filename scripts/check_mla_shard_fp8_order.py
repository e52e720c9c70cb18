"""Deadlock check of the fp8 QK_SHARD schedule (ops/mla/gluon_sm90_shard.py, _consumer with F_STAGES > 0) as an
event model, transcribed by hand from the kernel: two consumer warpgroups and the loader, barriers as monotone
counters (a wait passes once enough arrivals happened), every tile-length sequence of a small grid run to the end.
A sequence that stops with every actor waiting is a deadlock of the order. (Parity reuse is safe by construction:
no step's slot can start its next phase before the waiter has used it.)

    python3 scripts/check_mla_shard_fp8_order.py [STAGES F_STAGES [late]]   (the kernel: 3 2)

late: MLASm90Config.fence_late, the share of step o + 1 published with P of step o (after it), not before the
other warpgroup's P V.
"""
import itertools
import random
import sys
from collections import defaultdict

S, F = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (3, 2)
LATE = sys.argv[3:] == ["late"]
ev = defaultdict(int)  # barrier arrivals, by (barrier, step or warpgroup)

def run(tiles):
    ev.clear()
    kvs = list(itertools.accumulate([0] + tiles))[:-1]
    def widen(w, g, arrive=True):
        yield lambda: ev[("fready", g)] >= 1
        if g - S >= 0:
            yield lambda: ev[("kvempty", g - S)] >= 2
        if arrive:
            widened(g)
    def widened(g):
        ev[("fempty", g)] += 1
        ev[("kvready", g)] += 1
    def wg(w):
        pub = 0  # my publishes so far
        seen = 0  # other's publishes gathered so far
        for t, (n, kv) in enumerate(zip(tiles, kvs)):
            n_own = (n + 1 - w) // 2
            yield from widen(w, kv)
            if n > 1:
                yield from widen(w, kv + 1)
            if w == 1 and n > 2:
                yield from widen(w, kv + 2)
            yield lambda t=t: ev[("qready", t)] >= 1
            def publish():
                nonlocal pub
                yield lambda p=pub: ev[("pfree", w)] >= p
                ev[("pready", w)] += 1
                pub += 1
            def gather():
                nonlocal seen
                yield lambda s_=seen: ev[("pready", 1 - w)] >= s_ + 1
                seen += 1
            def release():
                ev[("pfree", 1 - w)] += 1
            if w == 0:
                yield lambda: ev[("kvready", kv)] >= 2
                yield from publish()
            elif n_own > 0:
                yield lambda: ev[("kvready", kv + 1)] >= 2
                yield lambda: ev[("kvready", kv)] >= 2
                yield from gather()
                yield from publish()
                release()
                ev[("kvempty", kv)] += 1
            for k in range(1, n_own):
                o = 2 * k + w
                yield from widen(w, kv + o)
                yield lambda g=kv + o: ev[("kvready", g)] >= 2
                yield lambda g=kv + o - 1: ev[("kvready", g)] >= 2
                yield from gather()
                ev[("kvempty", kv + o - 2)] += 1
                if o + 1 < n:
                    yield from widen(w, kv + o + 1, not LATE)
                yield from publish()
                if LATE and o + 1 < n:
                    widened(kv + o + 1)
                release()
                ev[("kvempty", kv + o - 1)] += 1
            if n_own > 0:
                ev[("kvempty", kv + 2 * n_own - 2 + w)] += 1
            ev[("qempty", t)] += 1
            last = n - 1
            if last % 2 == 1 - w:
                yield lambda g=kv + last: ev[("kvready", g)] >= 2
                yield from gather()
                release()
                ev[("kvempty", kv + last)] += 1
    def loader():
        for t, (n, kv) in enumerate(zip(tiles, kvs)):
            first = min(n, F) if t > 0 else 0
            for i in range(n):
                if i == first:
                    if t > 0:
                        yield lambda t=t: ev[("qempty", t - 1)] >= 2
                    ev[("qready", t)] += 1
                g = kv + i
                if g - F >= 0:
                    yield lambda g=g: ev[("fempty", g - F)] >= 2
                ev[("fready", g)] += 1
            if first >= n:  # (a tile of no more steps than `first`: Q after them)
                if t > 0:
                    yield lambda t=t: ev[("qempty", t - 1)] >= 2
                ev[("qready", t)] += 1
    actors = [wg(0), wg(1), loader()]
    waits = [None] * 3
    done = [False] * 3
    rng = random.Random(0)
    while not all(done):
        progressed = False
        order = list(range(3))
        rng.shuffle(order)
        for i in order:
            if done[i]:
                continue
            while True:
                if waits[i] is not None and not waits[i]():
                    break
                try:
                    waits[i] = next(actors[i])
                    progressed = True
                except StopIteration:
                    done[i] = True
                    progressed = True
                    break
        if not progressed:
            return False
    return True

bad = []
for tiles in itertools.chain(([n] for n in range(1, 12)), itertools.product(range(1, 8), repeat=3)):
    if not run(list(tiles)):
        bad.append(tiles)
print(f"S={S} F={F}{' late' if LATE else ''}: {len(bad)} deadlocking tile sequences", bad[:10])
