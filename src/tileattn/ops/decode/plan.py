"""Plans of attention over a KV cache: the split-KV schedule of one batch composition, its buffers, the launches.

A plan is made once per batch composition (the host reads the lengths once, a device sync). The queries of one
sequence and KV head form row tiles (kernels.py); each tile's key range (its causal and window bounds
applied) is cut into work items of at most `chunk` tokens, sized so that the programs fill the GPU whatever
the lengths (long ranges get more items, short ones one), and sorted longest first. Only a batch with fewer
tiles than the programs aimed for is split; a split tile's last piece to finish merges the pieces.
`run` then only launches kernels on buffers the plan owns: no host sync, no allocation, so it can be captured in
a CUDA graph. `update(seqlens)` re-plans into the same buffers (a captured graph sees the new schedule).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ... import hw
from ..common.args import is_int
from ..common.masking import UNBOUNDED_WINDOW
from ..common.paging import check_seqlens, choose_chunk
from . import dispatch
from .checks import check_lengths, check_plan_args, check_run_args, host_lengths
from .configs import block_m, occupancy

# The split schedule, measured on the H100 (2026-11-23, scripts/sweep.py decode --quick, GB/s of a 2934 read
# bandwidth). A problem whose programs (items x Hkv) fit one wave of the config's programs per SM (`occupancy`)
# is split up to that wave (pieces of >= MIN_STEPS steps): batch 1 x 32K, Hq 32 / Hkv 8, 2 per SM 1738, 4 per SM
# 1307; fp8 batch 32 x 16K (4 per SM) 2225, unsplit 1256. One that already needs more than a wave is split
# into about FINE_WAVES waves of pieces of >= FINE_STEPS steps, so the last wave's tail is short: batch 64 x 4K
# 2788, unsplit 2445. Tiles of 64+ rows stay unsplit then (Hq 64, q_len 16, batch 32 x 4K: 2185, split 1826).
FINE_WAVES = 4
FINE_STEPS = 16
MIN_STEPS = 4  # a split piece has at least this many BLOCK_N steps (its partial output costs a write + read)


@dataclass(slots=True)
class DecodeRun:
    """One run's tensors: queries, caches, block table, new keys / values, scales, per-head vectors, outputs."""
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor | None
    k_new: torch.Tensor | None = None
    v_new: torch.Tensor | None = None
    k_scale: float | torch.Tensor = 1.0
    v_scale: float | torch.Tensor = 1.0
    alibi_slopes: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    return_lse: bool = False


def tile_ranges(lens, q_lens, group, bm, causal, window):
    """[(b, r0, lo, hi)]: the row tiles of every sequence and the key range [lo, hi) its rows may see."""
    wl, wr = window
    tiles = []
    for b, (n, m) in enumerate(zip(lens, q_lens)):
        rows = m * group
        for r0 in range(0, rows, bm):
            first, last = r0 // group, (min(rows, r0 + bm) - 1) // group  # query tokens of the tile
            hi = n
            if causal:
                hi = min(hi, n - m + last + 1)
            if wr >= 0:
                hi = min(hi, n - m + last + wr + 1)
            lo = max(0, n - m + first - wl) if wl >= 0 else 0
            tiles.append((b, r0, lo, max(lo, hi)))
    return tiles


def schedule(tiles, chunk):
    """Work items [(b, r0, start, end, slot, split tile)] and split tiles [(b, r0, first slot, count)] for `tiles`.

    Items cover each tile's range in `chunk`-token pieces, longest first; a tile of one piece (an empty range
    too) writes the output directly (slot -1, split tile -1), the pieces of a longer one get consecutive
    workspace slots and the index of their split tile (whose last piece to finish merges them)."""
    items, split, slot = [], [], 0
    for b, r0, lo, hi in tiles:
        count = max(1, -(-(hi - lo) // chunk))
        if count == 1:
            items.append((b, r0, lo, hi, -1, -1))
            continue
        split.append((b, r0, slot, count))
        for i in range(count):
            items.append((b, r0, lo + i * chunk, min(hi, lo + (i + 1) * chunk), slot + i, len(split) - 1))
        slot += count
    items.sort(key=lambda it: it[2] - it[3])  # longest first (end - start descending)
    return items, split, slot


class KVCachePlan:
    """Split-KV schedule and buffers for attention over a KV cache, for one batch composition.

        plan = tileattn.KVCachePlan(seqlens, num_heads=32, num_kv_heads=8, head_dim=128, page_size=16)
        out = plan.run(q, k_cache, v_cache, block_table)       # capturable in a CUDA graph
        plan.update(new_seqlens)                                # same buffers, new schedule

    seqlens: int32 [B] on the GPU, the tokens each query attends over, the new ones included (with run's
    k_new / v_new, those are written at positions seqlens - q_len ... seqlens - 1 first); read once here (a
    device sync). Queries: q_len (the same for every sequence: q [B, q_len, Hq, D]) or cu_seqlens_q (int32
    [B + 1], packed q [total_q, Hq, D], for chunked prefill; read here too). Query t of a sequence of n tokens
    and m queries sits at position n - m + t (bottom-right aligned): with causal it sees positions <= its own.
    num_heads (Hq), num_kv_heads (Hkv): GQA/MQA, query head h reads KV head h // (Hq // Hkv). head_dim: 64, 128
    or 256. page_size: 1..256 for a paged cache [num_pages, page_size, Hkv, D] read through a block table
    [B, max_pages] int32; None for a contiguous cache [B, max_seqlen, Hkv, D]. dtype: float16 / bfloat16 (q,
    out); cache_dtype: dtype (the default) or float8_e4m3fn (with run's k_scale / v_scale).
    scale (default head_dim ** -0.5), window (left, right) as `attention`'s (-1 or >= 2 ** 30: unbounded), softcap (> 0:
    scores s become softcap * tanh(s / softcap)).

    The plan owns its outputs: `run` returns out (q's shape) and, with return_lse, lse float32 (natural log;
    [B, Hq, q_len], or [Hq, total_q] for packed queries), overwritten by the next run unless `out` / `lse` are
    passed. host_seqlens: the lengths as a list of ints (or a CPU tensor), when the caller knows them (no device
    read).
    `run` does not check page ids (that would need a sync); out-of-range ids are clamped in the kernel,
    so they never read outside the cache but give wrong rows: `tileattn.kvcache_attention` checks them.
    """

    def __init__(self, seqlens: torch.Tensor, *, num_heads: int, num_kv_heads: int, head_dim: int,
                 page_size: int | None = None, q_len: int = 1, cu_seqlens_q: torch.Tensor | None = None,
                 dtype: torch.dtype = torch.bfloat16, cache_dtype: torch.dtype | None = None, causal: bool = True,
                 scale: float | None = None, window: tuple[int, int] | list[int] = (-1, -1), softcap: float = 0.0,
                 host_seqlens: Sequence[int] | None = None) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim, self.page_size = num_heads, num_kv_heads, head_dim, \
            page_size
        self.q_len, self.dtype, self.causal, self.scale = q_len, dtype, causal, scale
        self.window, self.softcap = window, softcap
        self.cache_dtype = dtype if cache_dtype is None else cache_dtype
        check_plan_args(seqlens, self, cu_seqlens_q)
        self.causal, self.softcap = bool(causal), float(softcap) if softcap else 0.0
        self.window = tuple(-1 if w >= UNBOUNDED_WINDOW else int(w) for w in window)  # (longer than any sequence)
        # (numpy's ints as Python's: they reach the kernels)
        self.num_heads, self.num_kv_heads, self.head_dim = int(num_heads), int(num_kv_heads), int(head_dim)
        self.page_size = None if page_size is None else int(page_size)
        self.q_len = int(q_len) if is_int(q_len) else q_len
        if self.causal and self.window[1] > 0:
            self.window = (self.window[0], 0)  # causal clips the right bound
        self.device = seqlens.device
        self.batch = seqlens.shape[0]
        self.paged = page_size is not None
        self.varlen = cu_seqlens_q is not None
        self.group = num_heads // num_kv_heads
        self.scale = head_dim ** -0.5 if scale is None else float(scale)
        if self.varlen:
            cu = cu_seqlens_q.to("cpu", torch.int64).tolist()
            self.q_lens = [cu[b + 1] - cu[b] for b in range(self.batch)]
            if cu[0] != 0 or any(m < 0 for m in self.q_lens):
                raise ValueError(f"cu_seqlens_q: must start at 0 and be non-decreasing, got {cu}")
            self.total_q, self.q_len = cu[-1], None
            starts = cu[:-1]
        else:
            self.q_lens = [q_len] * self.batch
            self.total_q, starts = self.batch * q_len, [0] * self.batch
        self.max_q_len = max(self.q_lens, default=0)
        self.block_m = block_m(self.max_q_len * self.group)
        backend, _ = dispatch.select(self)
        self.backend = backend
        self.config = backend.config(self)
        num_tiles = sum(-(-m * self.group // self.block_m) for m in self.q_lens)
        info = hw.device_info(self.device)
        wave = info.num_sms * occupancy(self.config, self.block_m, head_dim, self.cache_dtype.itemsize,
                                        info.smem_per_block)
        self.min_steps = MIN_STEPS
        self.target_items = max(1, wave // num_kv_heads)
        if num_tiles >= self.target_items and self.block_m < 64:
            self.min_steps, self.target_items = FINE_STEPS, max(1, FINE_WAVES * wave // num_kv_heads)
        self.may_split = num_tiles < self.target_items
        self.capacity = self.target_items + num_tiles if self.may_split else num_tiles
        self.tile_capacity = min(num_tiles, self.target_items) if self.may_split else 0
        dev = self.device
        self.seqlens = torch.zeros(self.batch, dtype=torch.int32, device=dev)
        self.qinfo = torch.tensor([[s, m] for s, m in zip(starts, self.q_lens)], dtype=torch.int32,
                                  device=dev).reshape(self.batch, 2)
        self.work = torch.full((max(1, self.capacity), 6), -1, dtype=torch.int32, device=dev)
        self.tiles = torch.full((max(1, self.tile_capacity), 4), -1, dtype=torch.int32, device=dev)
        # pieces of each split tile finished in this run, per KV head (the last one merges, then resets it)
        self.sem = torch.zeros(max(1, self.tile_capacity), num_kv_heads, dtype=torch.int32, device=dev)
        slots = self.target_items if self.may_split else 0
        self.o_part = torch.empty(slots, num_kv_heads, self.block_m, head_dim, dtype=torch.float32, device=dev)
        self.lse_part = torch.empty(slots, num_kv_heads, self.block_m, dtype=torch.float32, device=dev)
        q_shape = (self.total_q, num_heads, head_dim) if self.varlen else (self.batch, q_len, num_heads, head_dim)
        self.out = torch.empty(q_shape, dtype=dtype, device=dev)
        lse_shape = (num_heads, self.total_q) if self.varlen else (self.batch, num_heads, q_len)
        self.lse = torch.empty(lse_shape, dtype=torch.float32, device=dev)
        # k_scale, v_scale given as numbers other than 1 are written here on every run (a captured graph then
        # replays the fill with its captured value); 1 reads `ones`, which is never written
        self.scales = torch.empty(2, num_kv_heads, dtype=torch.float32, device=dev)
        self.ones = torch.ones(num_kv_heads, dtype=torch.float32, device=dev)
        self.update(seqlens, host_seqlens)

    def update(self, seqlens: torch.Tensor, host_seqlens: Sequence[int] | None = None) -> KVCachePlan:
        """Re-plan for new lengths of the same batch composition (a device sync, unless host_seqlens gives
        them as a list of ints), into the plan's buffers."""
        check_seqlens(seqlens, self.batch, self.device, "seqlens")
        if host_seqlens is None:
            lens = seqlens.to("cpu", torch.int64).tolist()
        else:
            lens = host_lengths(host_seqlens, self.batch)
        self.short = check_lengths(lens, self.q_lens)  # (b, length, q_len) of the first sequence shorter than its
        # queries, or None: run refuses k_new while there is one
        self.max_len = max(lens, default=0)
        tiles = tile_ranges(lens, self.q_lens, self.group, self.block_m, self.causal, self.window)
        step = self.config.block_n
        if self.may_split:
            chunk = choose_chunk([hi - lo for _, _, lo, hi in tiles], step, self.target_items, self.min_steps)
        else:
            chunk = max(step, max((hi - lo for _, _, lo, hi in tiles), default=0))
        items, split, slots = schedule(tiles, chunk)
        assert len(items) <= max(1, self.capacity) and len(split) <= max(1, self.tile_capacity) \
            and (slots == 0 or slots <= self.o_part.shape[0])
        work = torch.full(tuple(self.work.shape), -1, dtype=torch.int32)
        if items:
            work[: len(items)] = torch.tensor(items, dtype=torch.int32)
        self.work.copy_(work)
        tiles_t = torch.full(tuple(self.tiles.shape), -1, dtype=torch.int32)
        if split:
            tiles_t[: len(split)] = torch.tensor(split, dtype=torch.int32)
        self.tiles.copy_(tiles_t)
        self.seqlens.copy_(seqlens)
        self.num_items, self.num_slots, self.chunk = len(items), slots, chunk
        return self

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_table: torch.Tensor | None = None, *, k_new: torch.Tensor | None = None,
            v_new: torch.Tensor | None = None, k_scale: float | torch.Tensor = 1.0,
            v_scale: float | torch.Tensor = 1.0, alibi_slopes: torch.Tensor | None = None,
            sinks: torch.Tensor | None = None, out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
            return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of the plan's batch over k_cache / v_cache (the plan's layout and cache_dtype).

        k_new, v_new: q's token layout with [Hkv, D] heads ([B, q_len, Hkv, D] or [total_q, Hkv, D]), written into
        the cache at each sequence's last q_len positions before attending (an fp8 cache: divided by the scale,
        saturated). k_scale, v_scale: the cache's values times them are the keys and values (an fp8 cache's
        float32 scales): a number, or a float32 tensor of one element (any shape) or [Hkv] (a captured graph
        reads the tensor's current value). alibi_slopes: float32 [Hq], score - slope * |pos_q - pos_k|. sinks: float32
        [Hq], one logit per head that joins the softmax's denominator (gpt-oss). Returns out (and lse)."""
        r = DecodeRun(q, k_cache, v_cache, block_table, k_new, v_new, k_scale, v_scale, alibi_slopes, sinks, out,
                      lse, return_lse)
        check_run_args(self, r)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, k_new,
                                                                                     v_new)):
            raise NotImplementedError("attention over a KV cache has no backward pass (an inference kernel): "
                                      "call it under torch.no_grad() / inference_mode()")
        for i, name in enumerate(("k_scale", "v_scale")):
            x = getattr(r, name)
            if not isinstance(x, torch.Tensor):
                if float(x) == 1.0:
                    setattr(r, name, self.ones)
                else:
                    setattr(r, name, self.scales[i].fill_(float(x)))
        r.out = self.out if out is None else out
        r.lse = self.lse if lse is None else lse
        if k_new is not None:
            self.backend.append(self, r)
        self.backend.launch(self, r)
        return (r.out, r.lse) if return_lse else r.out

    def __repr__(self) -> str:
        layout = f"page_size={self.page_size}" if self.paged else "contiguous"
        q = f"cu_seqlens_q (total {self.total_q})" if self.varlen else f"q_len={self.q_len}"
        return (f"KVCachePlan(batch={self.batch}, Hq={self.num_heads}, Hkv={self.num_kv_heads}, D={self.head_dim}, "
                f"{q}, {layout}, {self.backend.name} {self.config}, block_m={self.block_m}, items={self.num_items}, "
                f"chunk={self.chunk}, split slots={self.num_slots})")
