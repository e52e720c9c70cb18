"""Usage: python3 scripts/check_mla_fp8_parity.py {shard,plain} STAGES F_STAGES [late]   (review of mla-fp8-widen)

Parity-exact mbarrier model of the fp8 MLA sm90 kernels (shard and plain), transcribed from the kernel code:
per-slot barriers with arrival counts and phase parity; a wait passes iff (completed phases & 1) != parity.
Flags: deadlock (all blocked), aliasing (a wait passes while completed > intended + 1, i.e. it used a later phase)."""

import itertools
import random
import sys
from collections import defaultdict

COUNT = dict(kv_ready=2, kv_empty=2, p_ready=1, p_free=1, f_ready=1, f_empty=2, q_ready=1, q_empty=2)


class Bar:
    def __init__(s):
        s.pend = defaultdict(int)
        s.done = defaultdict(int)

    def arrive(s, name, slot):
        k = (name, slot)
        s.pend[k] += 1
        if s.pend[k] == COUNT[name]:
            s.pend[k] = 0
            s.done[k] += 1


def run(tiles, S, F, LATE, kernel, seed, bad):
    B = Bar()

    def W(name, slot, par, intended):  # wait
        k = (name, slot)

        def ok():
            if (B.done[k] & 1) != par:
                if B.done[k] != intended + 1:
                    bad.add(("alias", name, slot, intended, B.done[k]))
                return True
            return False

        return ok

    def A(name, slot):
        B.arrive(name, slot)

    def widen(g, arrive=True):
        yield W("f_ready", g % F, (g // F) & 1, g // F)
        yield W("kv_empty", g % S, ((g // S) & 1) ^ 1, g // S - 1)
        if arrive:
            widen_arrive(g)

    def widen_arrive(g):
        A("f_empty", g % F)
        A("kv_ready", g % S)

    def kvr(g):
        return W("kv_ready", g % S, (g // S) & 1, g // S)

    def shard(WG):
        OTHER = 1 - WG
        kv = j = c0 = c1 = 0
        for n in tiles:
            c_own, c_other = (c0, c1) if WG == 0 else (c1, c0)
            n_own = (n + 1 - WG) // 2
            yield from widen(kv)
            if n > 1:
                yield from widen(kv + 1)
            if WG == 1 and n > 2:
                yield from widen(kv + 2)
            yield W("q_ready", 0, j & 1, j)

            def publish(free_phase, intended, arrive=True):
                yield W("p_free", WG, free_phase, intended)
                if arrive:
                    A("p_ready", WG)

            def gather(phase, intended):
                yield W("p_ready", OTHER, phase, intended)

            if WG == 0:
                yield kvr(kv)
                yield from publish((c_own & 1) ^ 1, c_own - 1)
            elif n_own > 0:
                yield kvr(kv + 1)
                yield kvr(kv)
                yield from gather(c_other & 1, c_other)
                yield from publish((c_own & 1) ^ 1, c_own - 1)
                A("p_free", OTHER)
                A("kv_empty", kv % S)
            for k in range(1, n_own):
                o = 2 * k + WG
                yield from widen(kv + o)
                yield kvr(kv + o)
                yield kvr(kv + o - 1)
                yield from gather((c_other + k - 1 + WG) & 1, c_other + k - 1 + WG)
                A("kv_empty", (kv + o - 2) % S)
                if o + 1 < n:
                    yield from widen(kv + o + 1, not LATE)
                yield from publish(((c_own + k) & 1) ^ 1, c_own + k - 1, not LATE)
                if LATE:
                    A("p_ready", WG)
                    if o + 1 < n:
                        widen_arrive(kv + o + 1)
                A("p_free", OTHER)
                A("kv_empty", (kv + o - 1) % S)
            if n_own > 0:
                A("kv_empty", (kv + 2 * n_own - 2 + WG) % S)
            A("q_empty", 0)
            last = n - 1
            if last % 2 == OTHER:
                yield kvr(kv + last)
                yield from gather((c_other + (last - OTHER) // 2) & 1, c_other + (last - OTHER) // 2)
                A("p_free", OTHER)
                A("kv_empty", (kv + last) % S)
            j += 1
            kv += n
            c0 += (n + 1) // 2
            c1 += n // 2

    def plain(WG):
        kv = j = 0
        for n in tiles:
            yield from widen(kv)
            yield W("q_ready", 0, j & 1, j)
            yield kvr(kv)
            if n > 1:
                yield from widen(kv + 1)
            for it in range(1, n):
                yield kvr(kv + it)
                if it < n - 1:
                    yield from widen(kv + it + 1, not LATE)
                    if LATE:
                        widen_arrive(kv + it + 1)
                A("kv_empty", (kv + it - 1) % S)
            A("q_empty", 0)
            A("kv_empty", (kv + n - 1) % S)
            j += 1
            kv += n

    def loader():
        kv = j = 0
        for n in tiles:
            first = min(n, F) if j > 0 else 0

            def steps(lo, hi):
                for it in range(lo, hi):
                    g = kv + it
                    yield W("f_empty", g % F, ((g // F) & 1) ^ 1, g // F - 1)
                    A("f_ready", g % F)

            yield from steps(0, first)
            yield W("q_empty", 0, (j & 1) ^ 1, j - 1)
            A("q_ready", 0)
            yield from steps(first, n)
            j += 1
            kv += n

    body = shard if kernel == "shard" else plain
    actors = [body(0), body(1), loader()]
    waits = [None] * 3
    done = [False] * 3
    rng = random.Random(seed)
    while not all(done):
        live = [i for i in range(3) if not done[i] and (waits[i] is None or waits[i]())]
        if not live:
            return False
        i = rng.choice(live)
        # a passed wait is consumed; run to the next wait
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            done[i] = True
    return True


if __name__ == "__main__":
    kernel = sys.argv[1]
    S, F = int(sys.argv[2]), int(sys.argv[3])
    LATE = "late" in sys.argv[4:]
    seeds = 4
    dead, bad = [], set()
    seqs = itertools.chain(([n] for n in range(1, 12)), itertools.product(range(1, 7), repeat=3))
    for tiles in seqs:
        for seed in range(seeds):
            if not run(list(tiles), S, F, LATE, kernel, seed, bad):
                dead.append((tiles, seed))
                break
    print(
        kernel, S, F, "late" if LATE else "", "deadlocks:", len(dead), dead[:5], "aliasing:", len(bad), sorted(bad)[:5]
    )
