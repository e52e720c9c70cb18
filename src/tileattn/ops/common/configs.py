"""Config tables more than one op reads: the Hopper forward pipeline's (dense and flex Gluon kernels) and the
backward kernels' tiles (dense and flex backward). Each entry says which measurement chose it."""
from dataclasses import dataclass, replace
from typing import ClassVar

from ... import hw
from .backend import forced_config


@dataclass(frozen=True)
class BwdConfig:
    """Tiles of the backward kernels, each (BLOCK_M, BLOCK_N, num_warps, num_stages): the dK/dV kernel's
    (one program per BLOCK_N keys) and the dQ kernel's (one per BLOCK_M queries). Forcing one
    (tileattn.force_backend(config=BwdConfig(...))) sets the dense and the flex backward."""
    backend: ClassVar = None  # no backend of its own: read by the dense and flex backward
    dkdv: tuple
    dq: tuple


# The interpreter's small tiles; on GPUs 64 x 64 tiles with 4 warps, 32 x 32 past d = 128.
# scripts/sweep.py bwd on the H100 (fp16, B=4, H=32, N 1K-16K; docs/design/backward.md): 3 stages win at D=64
# (causal 16K 336 vs 312 TFLOPS with 2), 2 at D=128 (non-causal 16K 350 vs 325); 8 warps on 64 x 64 (no spills
# at D=128) lost 40%, 64 x 128 tiles with 8 warps 35-50%. Earlier (2026-11-21): 128 x 128 / 8 warps 258 vs 357
# at D=128.
_INTERPRETER = BwdConfig((16, 16, 4, 1), (16, 16, 4, 1))
_BWD = [  # (largest head dim, config)
    (64, BwdConfig((64, 64, 4, 3), (64, 64, 4, 3))),
    (128, BwdConfig((64, 64, 4, 2), (64, 64, 4, 2))),
    (256, BwdConfig((32, 32, 4, 1), (32, 32, 4, 1))),
]


def bwd_config(d: int) -> BwdConfig:
    """The backward's tiles for head dim d (the larger of D and Dv): forced > interpreter > table."""
    forced = forced_config(BwdConfig)
    if forced is not None:
        return forced
    if hw.interpreter_enabled():
        return _INTERPRETER
    return next(cfg for dmax, cfg in _BWD if d <= dmax or dmax == _BWD[-1][0])


@dataclass(frozen=True)
class Sm90Config:
    """A config of the Hopper forward pipeline (gluon_attn_sm90.py): the dense and the flex Gluon kernels."""
    backend: ClassVar = "dense.sm90"
    block_m: int  # query rows per consumer warpgroup (the CTA computes consumers * block_m)
    block_n: int  # keys per K/V tile
    stages: int  # K/V tiles in flight (shared-memory ring)
    consumer_regs: int  # registers per thread of the second consumer warpgroup (setmaxnreg)
    persistent: bool = True  # one CTA per SM looping over tiles (else one CTA per tile)
    one_cta_from: int = 0  # with persistent: problems of at least this many query rows take one CTA per tile (0: none)
    q_slots: int = 2  # Q tiles in flight per consumer (2: the next tile's Q loads during this one)
    serves_causal: bool = True  # False: problems with a right bound (causal) go to the portable kernel
    max_programs: int = 0  # CTAs of the grid at most (0: one per SM; tests use few CTAs walking many tiles)
    pingpong: bool = False  # the consumers issue their wgmmas in strict turns (FA3's warp scheduler barrier)
    exp2_fma: int = 0  # of every 4 softmax exp2s, how many run on the FMA pipe (a polynomial) instead of the MUFU
    # consumer warpgroups (2, or 3: tiles of 3 * block_m rows, 16 warps, so at most 160 registers each; no pingpong)
    consumers: int = 2
    # the persistent grid's tiles of problems with a right bound (causal) in a precomputed longest-first order within
    # windows of heads where a cost model says it beats the snake (launch_sm90.tile_order; dense only)
    lpt: bool = False
    # how each tile's O leaves (dense only; gluon_attn_sm90._consume_tile): "tma" (staged in shared memory, TMA-stored,
    # the store waited for before the next tile), "deferred" (that wait in the next tile, where the buffer is needed
    # again; with O staged in the Q slot (16-bit) it needs q_slots >= 2, else the dense plan takes "tma"), "kstage"
    # (16-bit: O staged in the K buffer of the tile's last K/V stage, so the Q slot is handed back once the tile's
    # last q.k is done and the next Q loads under the epilogue; needs consumers * block_m <= block_n). A fourth
    # form, plain stores from registers ("direct"), lost on every row measured and was removed (dense.md lever 2)
    epilogue: str = "tma"

    def __post_init__(self):
        if self.epilogue not in ("tma", "deferred", "kstage"):
            raise ValueError(f"Sm90Config.epilogue = {self.epilogue!r}: 'tma', 'deferred' or 'kstage'")
        if self.epilogue == "kstage" and self.consumers * self.block_m > self.block_n:
            raise ValueError(f"Sm90Config.epilogue = 'kstage' stages the tile's {self.consumers} x {self.block_m} "
                             f"output rows in one {self.block_n}-key K buffer: needs consumers * block_m <= block_n")
        if self.consumers not in (2, 3):
            raise ValueError(f"Sm90Config.consumers = {self.consumers}: the pipeline takes 2 or 3")
        if self.consumers == 3 and (self.consumer_regs > 160 or self.pingpong):
            raise ValueError("Sm90Config with 3 consumers: consumer_regs <= 160 (3 x 128 threads x 160 + the loader's "
                             f"128 x 24 fill the register file) and no pingpong; got {self.consumer_regs}, "
                             f"pingpong={self.pingpong}")


# Per head dim. Shared memory: 2 x q_slots Q tiles + stages x (K + V) tiles, within the 227 KB of an
# H100.
# Chosen from the compiled kernel's registers (no spills in the key loop) and shared memory
# (scripts/compile_sm90_cpu.py); timing sweeps are in docs/design/dense.md.
# The pipelined loop (FA3's intra-warpgroup overlap) won over a plain one at N >= 4K on the H100 (2026-11-21,
# an A/B run, docs/design/dense.md): D=64 434 vs 396 TFLOPS at 16K non-causal, D=128 546 vs 524; 128-key tiles beat 64.
# The persistent grid (one CTA per SM, the next tile's Q loaded during the current one) against one CTA per
# tile, same run (2026-11-21, docs/design/dense.md): geomean over the dense grid 0.922 vs 0.867 of cuDNN; N=1K
# rows +4-20% (D=64 causal 205 -> 246 TFLOPS), N=16K within -4..+1%.
# D=128: one Q slot and three K/V stages (225 KB) against two and two (193 KB), same run on the H100
# (2026-11-24, scripts/sweep.py fwd, fp16 B=4 H=32; docs/design/dense.md): non-causal N 1K/2K/4K/16K 440/478/508/535
# -> 519/567/555/623 TFLOPS, causal 326/430/469/508 -> 344/454/516/541. With two stages the consumers waited for K
# (Nsight Compute: k_ready waits ~7% of their time), as a stage frees only when both warpgroups' p.v of it is done.
# pingpong (strict wgmma turns) measured -5..+5% with either ring, D=64 -9..+1%: off.
# exp2_fma (2026-11-24, scripts/sweep.py fwd --variants "exp2_fma=1;exp2_fma=2", B=4 H=32 N 2K/8K; dense.md): 1 of
# 4 on the FMA pipe gave fp16 -1..-7% (D=128 causal 8K +1%), fp8 D=64 +0..+6%, fp8 D=128 -4..+3%; 2 of 4 lost
# everywhere: 0 in both tables.
# one_cta_from: the persistent grid against one CTA per tile on the S0 grid (2026-11-24, `tileattn bench dense
# --long`, fp16 B=4 H=32 (B*N constant past 16K), two runs: dense.json at 11fd35b and a1b80b3;
# docs/design/dense.md): persistent +5-29% at N <= 4K (D=64 causal 1K 247 vs 192 TFLOPS). At N >= 16K (16K, 32K,
# 64K, causal and not) D=128 ran faster with one CTA per tile in 11 of 12 rows (persistent / one CTA 0.93-1.02,
# mean 0.96; causal 16K 580 vs 624): one CTA per tile from 16K rows. D=64 there: persistent / one CTA 0.94-1.04 in
# 12 rows (mean 0.99, within the run-to-run spread): left persistent.
# lpt at D = 64 (2026-11-28, on the H200: `scripts/sweep.py fwd --causal 1 --variants "lpt=1;lpt=0;lpt=1"`, fp16 B=4
# H=32, two runs, outputs checked; dense.md lever 5): causal N 1K/2K/4K/8K 241-244/346-347/390-391/415-416 -> 254-257/
# 350/393-399/416-423 TFLOPS (+5% at 1K, +1% from 2K); fp8 +0..+2% at 2K-8K. D = 128: 1K -1%, 2K -2..-4%: off.
# epilogue "deferred" at D = 64 (2026-11-28, the H200, `scripts/sweep.py fwd --dims 64,128 --seqlens 1024,2048,4096
# --variants "epilogue=direct;epilogue=deferred"`, fp16 and e4m3, B=4 H=32, outputs checked; dense.md lever 2), table
# -> deferred, TFLOPS: fp16 non-causal 1K/2K/4K 379/456/468 -> 385/473/471, causal 253/353/404 -> 257/357/405; e4m3
# non-causal 398/500/542 -> 402/493/543, causal 243/375/446 -> 267/377/453. D = 128 fp8 (its O has its own buffer)
# -1..+2%: "tma" kept; 16-bit D = 128 has one Q slot, where "deferred" falls back to "tma" (those rows, -1..+1%,
# are the run's noise). "direct" lost on every row (-1..-30%) and is gone.
SM90 = {
    64: Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240, lpt=True, epilogue="deferred"),
    128: Sm90Config(block_m=64, block_n=128, stages=3, consumer_regs=240, q_slots=1, one_cta_from=16384),
    # D = 256: one Q slot (64 KB) and two stages of 64-key K/V tiles (128 KB); a 64 x 256 float32 accumulator
    # is 128 registers per thread. Against the portable kernel on the H100 (2026-11-21, tileattn bench dense
    # with TILEATTN_SM90=1/0): non-causal +4-6% (B=1, H=48, N=8K: 509 vs 481 TFLOPS; B=1, H=8, N=16K: 508 vs
    # 488), causal -2% (H=48, 8K) to -32% (H=8, 16K): causal stays on the portable kernel. 32-key tiles with 4
    # stages and one CTA per tile were no better (docs/design/large_d.md, D = 256).
    256: Sm90Config(block_m=64, block_n=64, stages=2, consumer_regs=240, q_slots=1, serves_causal=False),
}
# fp8 (1-byte Q/K/V tiles, a bf16/fp16 O buffer per consumer): the same tiles, more stages in flight.
# D = 256: 64-key tiles (P is carried in float32 across the pipelined loop: with the 64 x 256 accumulator, 128
# keys would not fit 240 registers), one Q slot, 192 KiB with the O buffers (compiled: 197,008 bytes), causal
# served. On the H100 (2026-11-24, `scripts/sweep.py fwd --dtype e4m3 --dims 256`, B=4 H=32, N 4K/8K/16K): 4
# stages 987-1045 TFLOPS non-causal, 898-936 causal; 3 stages 985-1021 / 927-970 (kept: same or better on 4 of 6
# rows, 32 KiB less); 2 stages 772-813. fp16 on the same kernel: 491-514; the portable fp8 kernel ran 281
# (docs/design/fp8.md).
# pingpong at D = 64 (2026-11-25, `scripts/sweep.py fwd --dtype e4m3 --variants pingpong=1`, B=4 H=32, two runs on
# the H100, outputs checked; docs/design/fp8.md): +1-5% on all 10 rows (N 2K / 8K: 457 -> 462, 516 -> 526, causal
# 369 -> 381, 474 -> 491; N 1K / 4K / 16K: 396 -> 400, 484 -> 489, 520 -> 528, causal 249 -> 262, 427 -> 442, 496 ->
# 505 TFLOPS). D = 128 mixed (-6..+3%): off there. The flex kernel runs without it (flex/launch_sm90._table_config:
# its fp8 rows measured slower with it at D = 64 and D = 128).
SM90_FP8 = {
    64: Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240, pingpong=True, lpt=True, epilogue="deferred"),
    128: Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240),
    256: Sm90Config(block_m=64, block_n=64, stages=3, consumer_regs=240, q_slots=1),
}


def sm90_config(d: int, dtype) -> Sm90Config:
    """The Gluon kernel's config for head dim d and input dtype (KeyError: no entry), or the forced one."""
    forced = forced_config(Sm90Config)
    if forced is not None:
        return forced
    return (SM90_FP8 if dtype.itemsize == 1 else SM90)[d]


# The dense forward at D = 64: three consumer warpgroups (192-row tiles, 160 registers each, no pingpong) from these
# query lengths, (problems without a window or causal bound, problems with one); (d, bytes per input element) ->
# first N. On the H200 (2026-11-28, `scripts/sweep.py fwd --dims 64 --variants "consumers=3,consumer_regs=160"` (fp8:
# ",pingpong=0"), B=4 H=32, two runs, outputs checked; dense.md lever 3, fp8.md lever 1), table -> three, TFLOPS:
# fp16 non-causal N 1K/2K/4K/8K/16K 382/420/435/439/414 -> 348/446/459/469-488/504, causal 4K/8K/16K
# 396/415/425 -> 319/413-422/450-457 (at 1K 243 -> 135: most steps are masked ones, a third of them on rows the
# 192-row tile adds past the diagonal); e4m3 non-causal 403/458/482/508/512 -> 378/502/543/605-610/626, causal
# 436/475/491 -> 348/516-519/581. Unmeasured, and given the measured rule of the nearest case: bf16 (fp16's), e5m2
# (e4m3's), a window without a causal bound (the causal column). To re-measure now that the table holds them:
# `--variants "consumers=2,consumer_regs=240"` (fp8 D=64: ",pingpong=1" added).
SM90_THREE_FROM = {(64, 2): (2048, 16384), (64, 1): (2048, 8192)}
# The "kstage" epilogue (O staged in the K buffer of the tile's last stage, so D = 128's single Q slot frees after
# the last q.k and the next tile's Q loads under the last p.v and the epilogue) for problems below this many query
# rows; (d, bytes per input element) -> N. On the H200 (2026-11-28, `scripts/sweep.py fwd --dims 128 --seqlens
# 1024,...,16384 --causal 0,1 --variants "epilogue=kstage;epilogue=kstage"`, B=4 H=32, outputs checked; two fp16
# runs, one bf16; dense.md lever 2), table -> kstage, TFLOPS: fp16 non-causal 1K/2K/4K/8K/16K 513-518/558-565/
# 590-597/561/627 -> 528-537/572-574/590-602/597-607/511-608, causal 348-351/451-454/468-521/548/596 -> 365-369/
# 471-479/518-541/565/588; bf16 non-causal 1K/2K/4K/8K 531/587/618/643 -> 553/597/621/614, causal 354/466/539/585
# -> 373/496/558/553. +2..+6% at 1K-2K, +0..+4% at 4K; 8K mixed (fp16 +3..+6%, bf16 -5%), 16K -1% (one CTA per
# tile there): below 8K. D = 64 (two Q slots, "deferred") measured -0..-2% with it: not taken. fp8 refuses it.
SM90_KSTAGE_BELOW = {(128, 2): 8192}
# The longest-first order (lpt) for problems below this many query rows. At N = 16K causal, D = 64 (2026-11-28, the
# H200, `sweep.py fwd --variants "lpt=0;lpt=1;lpt=0"`, three consumers) it lost: fp16 406-423 vs 454-459 TFLOPS,
# e4m3 553 vs 580-581; at 8K it won (e4m3, three consumers: 544-549 vs 515). Its head windows put many heads' K/V
# in one round where the snake keeps one or two (L2), which the cost model does not count.
SM90_LPT_BELOW = 16384


def sm90_dense_config(d: int, dtype, seqlen_q: int, masked: bool, budget: int = None, out_bytes: int = None
                      ) -> Sm90Config:
    """The dense forward's config for one problem (masked: a causal or window bound): sm90_config's entry, with the
    "kstage" epilogue below SM90_KSTAGE_BELOW's query lengths, three consumer warpgroups from SM90_THREE_FROM's query
    lengths on where their shared memory fits `budget`
    (bytes; None: no limit; out_bytes: the output's element size, as sm90_smem_bytes) and the longest-first order
    off from SM90_LPT_BELOW's; a forced config as it is."""
    forced = forced_config(Sm90Config)
    if forced is not None:
        return forced
    cfg = sm90_config(d, dtype)
    if cfg.lpt and seqlen_q >= SM90_LPT_BELOW:
        cfg = replace(cfg, lpt=False)
    start = SM90_THREE_FROM.get((d, dtype.itemsize), (0, 0))[int(bool(masked))]
    if start and seqlen_q >= start:
        three = replace(cfg, consumers=3, consumer_regs=min(cfg.consumer_regs, 160), pingpong=False)
        if budget is None or sm90_smem_bytes(three, d, d, dtype.itemsize, out_bytes) <= budget:
            cfg = three
    if cfg.consumers == 2 and seqlen_q < SM90_KSTAGE_BELOW.get((d, dtype.itemsize), 0):
        cfg = replace(cfg, epilogue="kstage")  # (after the consumers: three have no K buffer for their O)
    return cfg


def sm90_smem_bytes(cfg: Sm90Config, d: int, dv: int, elem_bytes: int, out_bytes: int = None) -> int:
    """Shared memory of the kernel: q_slots Q tiles per consumer, `stages` K and V tiles, one O tile per
    consumer when the output dtype is wider than the input (fp8), 1 KB for barriers and alignment (matches the
    compiled kernel's figure within that KB, scripts/compile_sm90_cpu.py)."""
    o = cfg.consumers * cfg.block_m * dv * out_bytes if out_bytes and out_bytes != elem_bytes else 0
    return (cfg.consumers * cfg.q_slots * cfg.block_m * d + cfg.stages * cfg.block_n * (d + dv)) * elem_bytes + o + 1024
