"""Config tables of dense attention forward, one per backend (dispatch.py), each entry with the measurement
that chose it. Forcing one: tileattn.force_backend(config=...) (a config's class names its backend).

    AttnConfig        portable Triton kernel (kernels.py): candidates per (arch, head dim, causal, length),
                      the first that fits the shared-memory budget (hw.py; TILEATTN_SMEM_BUDGET emulates
                      smaller GPUs), or the fastest with TILEATTN_AUTOTUNE=1 (launch_triton.py)
    (Sm90Config       the Hopper Gluon kernel's, shared with flex: ops/common/configs.py)
    LargeDConfig      large-D Triton kernel (kernels_large_d.py), per (Dv bucket, causal)
    LargeDSm90Config  large-D Gluon kernel (gluon_sm90_large_d.py), per head-dim range
    CLUSTER_FROM      where the 2-CTA cluster kernel (launch_cluster_sm90.py) is taken over the Hopper kernel
"""
from dataclasses import dataclass
from typing import ClassVar

import triton

from ..common.backend import forced_config


# ---- portable Triton kernel ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttnConfig:
    """A config of the portable Triton kernel (kernels.py)."""
    backend: ClassVar = "dense.triton"
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False  # K/V through tensor descriptors (sm90+)
    warp_specialize: bool = False  # compiler warp specialization of the unmasked loop (sm90+, with TMA)
    pipeline_qk: bool = False  # q.k of block n + 1 issued before the softmax of block n (unmasked loop)
    num_ctas: int = 1  # CTAs per cluster (Triton's num_ctas); 2 fails to compile in triton 3.6 (docs/design/dense.md)

    def smem_bytes(self, block_d: int, block_dv: int, elem_bytes: int) -> int:
        """A lower bound of the shared memory the kernel needs (K/V tiles of num_stages - 1 buffers in flight,
        plus the Q tile): a pre-filter only. On a GPU the compiled kernel's own figure decides (launch_triton.py)."""
        kv = max(1, self.num_stages - 1) * self.block_n * (block_d + block_dv)
        q = self.block_m * block_d
        return (kv + q) * elem_bytes


C = AttnConfig

# Safe fallbacks for any budget, small to large; always appended after the table's own candidates.
TRITON_FALLBACK = [
    C(64, 64, 4, 2),
    C(64, 32, 4, 2),
    C(32, 32, 4, 1),
    C(16, 16, 4, 1),
]

# sm90 (H100), per (padded head dim, causal, sequence bucket). Chosen by scripts/sweep.py dense on two healthy
# H100 leases (B=4, H=32, fp16, N = 1K / 4K / 16K for short / mid / long; geomean of the two runs' ratios to
# cuDNN; 2026-11-20, docs/design/dense.md). First entry: the winner; second: the runner-up.
TRITON_SM90 = {
    (64, False, "short"): [C(128, 64, 8, 3, True, True), C(128, 64, 4, 3)],
    (64, False, "mid"): [C(128, 64, 8, 3), C(128, 64, 8, 3, True)],
    (64, False, "long"): [C(128, 64, 8, 3, True), C(128, 64, 8, 3)],
    (64, True, "short"): [C(128, 64, 4, 3), C(128, 128, 8, 3)],
    (64, True, "mid"): [C(128, 64, 8, 3), C(128, 64, 8, 3, True)],
    (64, True, "long"): [C(128, 64, 8, 3), C(128, 64, 8, 3, True, True)],
    (128, False, "short"): [C(128, 128, 8, 3, True), C(128, 128, 8, 3)],
    (128, False, "mid"): [C(128, 128, 8, 3, True, True), C(128, 128, 8, 3, True)],
    (128, False, "long"): [C(128, 128, 8, 3), C(128, 128, 8, 3, True)],
    (128, True, "short"): [C(128, 64, 8, 3, True), C(64, 64, 4, 3)],
    (128, True, "mid"): [C(128, 128, 8, 3, True, True), C(64, 64, 4, 3, True)],
    (128, True, "long"): [C(128, 128, 8, 3, True), C(128, 64, 8, 3, True)],
    # D > 128: not swept yet; 128 x 64 tiles keep K/V stages within the budget
    (256, False, "any"): [C(128, 64, 8, 2), C(64, 64, 4, 2)],
    (256, True, "any"): [C(128, 64, 8, 2), C(64, 64, 4, 2)],
}

# Anything else (sm80/sm89, and the CPU interpreter): pointer loads, cp.async pipelining. Not measured here
# (no such GPU); sized to their budgets.
TRITON_GENERIC = {
    (64, False, "any"): [C(128, 64, 4, 3), C(64, 64, 4, 3)],
    (64, True, "any"): [C(128, 64, 4, 3), C(64, 64, 4, 3)],
    (128, False, "any"): [C(128, 64, 8, 3), C(64, 64, 4, 3)],
    (128, True, "any"): [C(128, 64, 8, 3), C(64, 64, 4, 3)],
    (256, False, "any"): [C(64, 64, 4, 2), C(64, 32, 4, 2)],
    (256, True, "any"): [C(64, 64, 4, 2), C(64, 32, 4, 2)],
}


def seq_bucket(seqlen_q: int) -> str:
    """short: up to 1.5K query rows, mid: up to 6K, long: beyond."""
    return "short" if seqlen_q <= 1536 else "mid" if seqlen_q <= 6144 else "long"


def _bucket(block_d: int) -> int:
    return 64 if block_d <= 64 else 128 if block_d <= 128 else 256


def triton_candidates(arch: int, block_d: int, block_dv: int, causal: bool, elem_bytes: int, smem_budget: int,
                      seqlen_q: int = 4096):
    """Configs for this problem, best first, that fit `smem_budget` bytes. Never empty."""
    table = TRITON_SM90 if arch >= 90 else TRITON_GENERIC
    bd = _bucket(max(block_d, block_dv))
    entries = table.get((bd, causal, seq_bucket(seqlen_q))) or table[(bd, causal, "any")]
    seen, out = set(), []
    for cfg in entries + TRITON_FALLBACK:
        if cfg in seen or (cfg.use_tma and arch < 90):
            continue
        seen.add(cfg)
        if cfg.smem_bytes(block_d, block_dv, elem_bytes) <= smem_budget:
            out.append(cfg)
    if not out:
        out.append(TRITON_FALLBACK[-1])
    return out


# ---- large head dims: Triton kernel --------------------------------------------------------------------------
# above this head dim (of Q/K or of V) the large-D kernel serves the problem
LARGE_D_FROM = 257


@dataclass(frozen=True)
class LargeDConfig:
    """A config of the large-D Triton kernel (kernels_large_d.py)."""
    backend: ClassVar = "dense.large_d"
    block_m: int
    block_n: int
    block_k: int  # head-dim columns of one Q K^T step
    block_dv: int  # output columns per program, at most (the slice is min(block_dv, Dv rounded up to a power of 2))
    num_warps: int
    num_stages: int
    block_dv2: int = 0  # a second accumulator's columns: a program's slice is block_dv + block_dv2 columns

    def slice_dv(self, dv: int) -> int:
        return min(self.block_dv, max(16, triton.next_power_of_2(dv)))

    def smem_bytes(self, dv: int, elem_bytes: int) -> int:
        """A lower bound of the kernel's shared memory (Q and K chunks in flight, the V tiles, the P tile): a
        pre-filter; on a GPU the compiled kernel's own figure decides."""
        chunks = max(1, self.num_stages - 1) * (self.block_m + self.block_n) * self.block_k
        v = self.block_n * (self.slice_dv(dv) + self.block_dv2)
        return (chunks + v + self.block_m * self.block_n) * elem_bytes


C = LargeDConfig

# sm90 (H100), per (Dv bucket, causal): Dv up to 320 / 384 / 512 / 768 / 1024 (any Dv <= 256 with D > 256
# takes the first). Chosen by scripts/sweep.py large-d on the H100 (B=1, H=48, N=8192, fp16, D = Dv, 2026-11-21,
# docs/design/large_d.md), TFLOPS non-causal / causal:
#   D=320  128x128, 256 + 64 columns, 3 stages: 353 / 342 (two slices of 256: 250 / 257)
#   D=384  128x64, 256 + 128 columns, 4 stages: 296 / 301 (128x128, 256 then 128: 272 / 266)
#   D=512  128x128, 2 x 256 columns, 4 stages: 294 / 288
#   D=768  128x128, 3 x 256, 4 stages non-causal 248, 3 stages causal 239 (256 + 128 slices spill: 187-228)
#   D=1024 128x128, 4 x 256, 4 stages non-causal 206, 3 stages causal 198 (256 + 128: 130-171)
LARGE_D_SM90 = {
    (320, False): [C(128, 128, 64, 256, 8, 3, 64)],
    (320, True): [C(128, 128, 64, 256, 8, 3, 64)],
    (384, False): [C(128, 64, 64, 256, 8, 4, 128)],
    (384, True): [C(128, 64, 64, 256, 8, 4, 128)],
    (512, False): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (512, True): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (768, False): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (768, True): [C(128, 128, 64, 256, 8, 3)],
    (1024, False): [C(128, 128, 64, 256, 8, 4), C(128, 128, 64, 256, 8, 3)],
    (1024, True): [C(128, 128, 64, 256, 8, 3)],
}
LARGE_D_BUCKETS = (320, 384, 512, 768, 1024)
# every budget, small to large; always tried after the table's own candidates
LARGE_D_FALLBACK = [C(64, 64, 64, 128, 4, 2), C(64, 32, 32, 64, 4, 2), C(32, 32, 32, 64, 4, 1)]


def large_d_candidates(arch: int, dv: int, causal: bool, elem_bytes: int, smem_budget: int):
    """Configs for this problem, best first, that fit `smem_budget` bytes by the estimate. Never empty."""
    table = LARGE_D_SM90 if arch >= 90 else {}
    bucket = next(b for b in LARGE_D_BUCKETS if dv <= b)
    out = []
    for cfg in table.get((bucket, causal), []) + LARGE_D_FALLBACK:
        if cfg not in out and cfg.smem_bytes(dv, elem_bytes) <= smem_budget:
            out.append(cfg)
    return out or LARGE_D_FALLBACK[-1:]


# ---- large head dims: Gluon kernel ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LargeDSm90Config:
    """A config of the large-D Gluon kernel (gluon_sm90_large_d.py)."""
    backend: ClassVar = "dense.large_d_sm90"
    block_n: int = 128  # keys per block
    block_k: int = 64  # head-dim columns per ring buffer
    stages: int = 4  # ring buffers (Q chunk halves + K chunk)
    dvs: int = 256  # output columns per CTA (two warpgroups x 64 rows x dvs float32 accumulators)
    consumer_regs: int = 240
    q_resident: bool = False  # the whole Q tile loaded once (D <= 384), the ring holds K chunks only

    def smem_bytes(self, d: int, elem_bytes: int) -> int:
        q = 128 * triton.cdiv(d, self.block_k) * self.block_k if self.q_resident else self.stages * 128 * self.block_k
        return (q + self.stages * self.block_n * self.block_k + self.block_n * self.dvs) * elem_bytes + 1024


# Measured on the H100 (fp16, D = Dv, TFLOPS non-causal / causal, outputs checked; scripts/sweep.py large-d --sm90
# and A/B runs; docs/design/large_d.md). Dv >= 512, B=1, H=48, N=8192: D=512 413 / 388,
# D=1024 266 / 248 (2026-11-21, after the P V / scores wgmmas stopped overlapping in a warpgroup, which had made
# ptxas serialize every wgmma: 373 / 338 and 234 / 221 before; the Triton kernel 295 / 290 and 209 / 198). 5 ring
# buffers: no better. 64-key blocks with P V(b - 1) issued after the scores of b (no serialization at that size)
# and one or two V buffers: 0.60-0.98 of this config at D = 512 and 1024.
LARGE_D_SM90_STREAMED = LargeDSm90Config()
# D and Dv in (192, 384]: the whole Q tile resident (at most 96 KB), a ring of 4 K chunks, one V tile (at D=256
# 192 KB, cuDNN's plan); Dv > 256 takes two slices. Same run, 2026-11-21: D=256 against cuDNN, B=1, H=48, N=8K
# 0.96 / 0.94 and B=1, H=8, N=16K 0.89 / 1.05 (the dense kernels: 0.82 / 0.75 and 0.74 / 0.83; 64-key blocks with 8
# ring buffers and two V buffers: 0.85-0.98). Against the Triton kernel at H=48, N=8K: D=384 376 / 369 TFLOPS vs
# 295 / 300, D=320 355 / 349 vs 354 / 345 (Q streamed through the ring: 351 / 311 and 311 / 288).
LARGE_D_SM90_Q_RESIDENT = LargeDSm90Config(q_resident=True)
Q_RESIDENT_DIMS = (193, 384)  # D and Dv both in this range


def large_d_sm90_config(d: int, dv: int) -> LargeDSm90Config:
    """The large-D Gluon kernel's config for head dims (d, dv), or the forced one."""
    forced = forced_config(LargeDSm90Config)
    if forced is not None:
        return forced
    return LARGE_D_SM90_Q_RESIDENT if max(d, dv) <= Q_RESIDENT_DIMS[1] else LARGE_D_SM90_STREAMED


# ---- the 2-CTA cluster kernel (D = 128, triton 3.9) -----------------------------------------------------------
# The query rows from which dispatch takes dense.sm90_cluster over dense.sm90, by causal; absent: never. Measured on
# an H200 under triton 3.9 (B=4 H=32 fp16, outputs checked against cuDNN; TFLOPS of the table's 1-CTA config vs the
# cluster, 2026-11-28), N = 1K / 2K / 4K / 8K / 16K, three runs:
#   run 1 (scripts/sweep.py fwd --dims 128 --variants "" --cluster, normal launches):
#     causal      227 / 460 / 528 / 556 / 580  vs  102 / 403 / 496 / 566 / 607   (8K +1.8%, 16K +4.7%)
#     non-causal  404 / 551 / 586 / 610 / 610  vs  277 / 546 / 591 / 599 / 598   (4K +0.9%, 8K / 16K -2%)
#   run 2 (tileattn bench dense --cluster, direct launches; bench/results/h200/dense.json's cluster_rows):
#     causal      347 / 487 / 523 / 558 / 582  vs  274 / 398 / 484 / 556 / 599   (8K -0.4%, 16K +2.9%)
#     non-causal  492 / 547 / 571 / 597 / 597  vs  466 / 536 / 580 / 611 / 633   (4K-16K +2-6%)
#   run 3 (as run 2, the kernel with the lse; ptxas 13.4; the cluster_rows there now):
#     causal      360 / 473 / 534 / 565 / 598  vs  281 / 408 / 498 / 560 / 606   (8K -0.9%, 16K +1.3%)
#     non-causal  471 / 546 / 599 / 609 / 604  vs  470 / 544 / 589 / 625 / 640   (8K +2.6%, 16K +6.1%)
#   and with the lse (scripts/sweep.py fwd --causal 1 --cluster --lse): 8K 562 vs 569, 16K 589 vs 609.
# Causal 16K won in every run (+1.3..+4.7%); causal 8K is even (+1.8%, -0.4%, -0.9%; +1.2% with the lse), kept;
# non-causal 8K / 16K won two runs of three and lost the first by 2%: it stays on the 1-CTA kernel until more runs
# agree.
CLUSTER_FROM = {True: 8192}


def cluster_from(causal: bool) -> int | None:
    """The query rows from which the cluster kernel is preferred (CLUSTER_FROM), or None (never)."""
    return CLUSTER_FROM.get(bool(causal))
