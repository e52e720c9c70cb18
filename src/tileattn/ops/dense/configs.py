"""Launch configurations for the dense forward kernel.

A config table is a list of candidates per key, best first; the first candidate that fits the device's
shared-memory budget is used (hw.py; TILEATTN_SMEM_BUDGET emulates smaller GPUs). Autotuning (opt-in, see
launch.py) times every candidate that fits instead of taking the first.

Keys: (arch family, padded head dim of Q/K/V, causal (any right bound), sequence-length bucket). Table entries
say which measurement chose them.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class AttnConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    use_tma: bool = False  # K/V through tensor descriptors (sm90+)
    warp_specialize: bool = False  # compiler warp specialization of the unmasked loop (sm90+, with TMA)
    pipeline_qk: bool = False  # q.k of block n + 1 issued before the softmax of block n (unmasked loop)
    num_ctas: int = 1  # CTAs per cluster (Triton's num_ctas); 2 fails to compile in triton 3.6 (bench/NOTES.md)

    def smem_bytes(self, block_d: int, block_dv: int, elem_bytes: int) -> int:
        """A lower bound of the shared memory the kernel needs (K/V tiles of num_stages - 1 buffers in flight,
        plus the Q tile): a pre-filter only. On a GPU the compiled kernel's own figure decides (launch.py)."""
        kv = max(1, self.num_stages - 1) * self.block_n * (block_d + block_dv)
        q = self.block_m * block_d
        return (kv + q) * elem_bytes


C = AttnConfig

# Safe fallbacks for any budget, small to large; always appended after the table's own candidates.
_FALLBACK = [
    C(64, 64, 4, 2),
    C(64, 32, 4, 2),
    C(32, 32, 4, 1),
    C(16, 16, 4, 1),
]

# sm90 (H100), per (padded head dim, causal, sequence bucket). Chosen by scripts/sweep_dense.py on two healthy
# H100 leases (B=4, H=32, fp16, N = 1K / 4K / 16K for short / mid / long; geomean of the two runs' ratios to
# cuDNN; 2026-11-20, bench/NOTES.md). First entry: the winner; second: the runner-up.
_SM90 = {
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
_GENERIC = {
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


def candidates(arch: int, block_d: int, block_dv: int, causal: bool, elem_bytes: int, smem_budget: int,
               seqlen_q: int = 4096):
    """Configs for this problem, best first, that fit `smem_budget` bytes. Never empty."""
    table = _SM90 if arch >= 90 else _GENERIC
    bd = _bucket(max(block_d, block_dv))
    entries = table.get((bd, causal, seq_bucket(seqlen_q))) or table[(bd, causal, "any")]
    seen, out = set(), []
    for cfg in entries + _FALLBACK:
        if cfg in seen or (cfg.use_tma and arch < 90):
            continue
        seen.add(cfg)
        if cfg.smem_bytes(block_d, block_dv, elem_bytes) <= smem_budget:
            out.append(cfg)
    if not out:
        out.append(_FALLBACK[-1])
    return out
