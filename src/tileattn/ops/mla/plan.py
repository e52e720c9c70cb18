"""MLA decode plans: the split-KV schedule of one batch composition, its buffers, and the launches.

A plan is made once per batch composition (the host reads cache_seqlens once, a device sync): it splits
every sequence into work items of at most `chunk` tokens, sized so that one wave of programs fills
the GPU whatever the lengths (long sequences get more items, short ones one), and sorts them longest first.
Only a batch with fewer sequences than SMs is split (into at most one item per SM per row tile).
`run` then only launches kernels on buffers the plan owns: no host sync, no allocation, so it can be captured
in a CUDA graph. `update(cache_seqlens)` re-plans into the same buffers (a captured graph sees the new
schedule).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import triton

from ... import hw
from ...launcher import launch_kept
from ..common.backend import force_backend
from ..common.paging import check_seqlens, choose_chunk
from . import dispatch
from .checks import check_kv_scale, check_plan_args, check_run_args
from .configs import BLOCK_M, SM90_PAIR, MLAConfig, MLASm90Config
from .kernels import mla_combine_kernel
from .launch_sm90 import tensors_ok

_WAVES = 1  # work items aimed for: at most this many programs per SM (each walks a long token range)


def _target_items(num_sms, programs_per_item):
    """Work items a schedule aims for: _WAVES programs per SM, each work item taking programs_per_item."""
    return max(1, -(-_WAVES * num_sms // programs_per_item))


def _read_lengths(cache_seqlens):
    """cache_seqlens read to the CPU as int64 (the device sync), checked >= 0."""
    lens = cache_seqlens.to("cpu", torch.int64)
    if lens.numel() and int(lens.min()) < 0:
        raise ValueError("cache_seqlens: lengths must be >= 0")
    return lens


def _block_m(rows):
    return max(16, min(64, triton.next_power_of_2(rows)))


def schedule(lens, chunk):
    """Work items [(b, start, end, slot)] and per-sequence [(first slot, count)] for host lengths `lens`.

    Items cover each sequence in `chunk`-token pieces, longest first; a sequence of one piece writes the
    output directly (slot -1), the pieces of a longer one get consecutive workspace slots."""
    items, splits, slot = [], [], 0
    for b, n in enumerate(lens):
        count = -(-n // chunk)
        if count <= 1:
            splits.append((-1, count))
            if count:
                items.append((b, 0, n, -1))
            continue
        splits.append((slot, count))
        for i in range(count):
            items.append((b, i * chunk, min(n, (i + 1) * chunk), slot + i))
        slot += count
    items.sort(key=lambda it: it[1] - it[2])  # longest first (end - start descending)
    return items, splits, slot


@dataclass(slots=True)
class MLARun:
    """One run's tensors: the queries, the caches, the block table, the cache scale, the outputs."""
    q_nope: torch.Tensor
    q_pe: torch.Tensor
    ckv_cache: torch.Tensor
    kpe_cache: torch.Tensor
    block_table: torch.Tensor
    kv_scale: float | torch.Tensor  # a number or a one-element float32 tensor
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    return_lse: bool = False


def _run_key(r):
    """What run's checks and launches depend on in run r's tensors (shapes, strides, dtypes, devices, 16-byte
    alignment) and options; None when an argument is not a tensor (the checks then say which)."""
    try:
        return (r.return_lse, *[(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15) for t in (
            r.q_nope, r.q_pe, r.ckv_cache, r.kpe_cache, r.block_table, r.out, r.lse)])
    except (AttributeError, RuntimeError):  # not a tensor, or one without storage: the checks say which
        return None


_warned = set()


class MLADecodePlan:
    """Split-KV schedule and buffers for MLA decode of one batch composition.

        plan = tileattn.MLADecodePlan(cache_seqlens, num_heads=128, q_len=1, page_size=64)
        out = plan.run(q_nope, q_pe, ckv_cache, kpe_cache, block_table)     # capturable in a CUDA graph
        plan.update(new_cache_seqlens)                                       # same buffers, new schedule

    cache_seqlens: int32 [B] on the GPU (tokens in each sequence's cache, the q_len new ones included); read
    once here (a device sync). On Hopper they also pick the kernel, which `update` keeps: one row tile (q_len *
    num_heads <= 64) whose split items are short (configs.PLAIN_BELOW_CHUNK) takes the plain kernel, so build the
    plan at lengths like those it will run (all-zero placeholder lengths count as unknown: the long-item kernel).
    num_heads (1..128), q_len (>= 1), head_dim_ckv (Dc) and head_dim_kpe (Dr), powers of two >= 16; page_size: a
    power of two 1..128; dtype: float16 or bfloat16 (q and the output);
    cache_dtype: the caches' dtype, `dtype` (the default) or float8_e4m3fn (with run's kv_scale); causal: query t sees
    cache positions < seqlen - q_len + t + 1 (else all seqlen); scale defaults to (Dc + Dr) ** -0.5.
    max_pages_per_seq: the block table's width, checked against the lengths when given.

    The plan owns its outputs: `run` returns out [B, q_len, num_heads, Dc] (and lse [B, num_heads, q_len]
    float32, natural log), overwritten by the next run unless `out` / `lse` are passed. Workspace: partial
    outputs of split sequences, about num_SMs * 64 rows * Dc * 4 bytes (17 MB on an H100 at Dc = 512).
    `run` does not check page ids (that would need a sync); out-of-range ids are clamped in the kernel, so
    they never read outside the cache but give wrong rows: `tileattn.mla_decode` checks them on the host.
    `run` checks its tensors once per layout (shapes, strides, dtypes, devices, alignment) and replays the
    launches made for it; `update` checks the next run again. On the Hopper kernel an e4m3 NaN in a cache reads
    as 480 (the widening to 16 bits is done with integer operations); the portable kernel keeps NaN.
    """

    def __init__(self, cache_seqlens: torch.Tensor, *, num_heads: int, q_len: int = 1, head_dim_ckv: int = 512,
                 head_dim_kpe: int = 64, page_size: int = 64, dtype: torch.dtype = torch.bfloat16,
                 causal: bool = True, scale: float | None = None, max_pages_per_seq: int | None = None,
                 cache_dtype: torch.dtype | None = None, config: MLAConfig | MLASm90Config | None = None) -> None:
        self.num_heads, self.q_len, self.dc, self.dr, self.page_size = num_heads, q_len, head_dim_ckv, head_dim_kpe, \
            page_size
        self.dtype, self.causal, self.scale = dtype, causal, scale
        self.cache_dtype = dtype if cache_dtype is None else cache_dtype
        check_plan_args(cache_seqlens, self)
        self.causal = bool(causal)  # (and numpy's ints as Python's: they reach the kernels)
        self.num_heads, self.q_len, self.dc, self.dr, self.page_size = (int(x) for x in (num_heads, q_len,
                                                                                          head_dim_ckv, head_dim_kpe,
                                                                                          page_size))
        self.device = cache_seqlens.device
        self.batch = cache_seqlens.shape[0]
        self.scale = (head_dim_ckv + head_dim_kpe) ** -0.5 if scale is None else float(scale)
        self.max_pages_per_seq = max_pages_per_seq
        self.rows = q_len * num_heads
        lens = _read_lengths(cache_seqlens)  # (the one device sync: update's work is done from these)
        self.first_chunk = self._first_chunk(lens)
        if config is None:
            self._choose_kernels()
        else:
            if "config" not in _warned:
                _warned.add("config")
                warnings.warn("MLADecodePlan(config=...) is deprecated: use `with tileattn.force_backend(config=...)`"
                              " around the plan's construction", FutureWarning, stacklevel=2)
            with force_backend(config=config):
                self._choose_kernels()
        info = hw.device_info(self.device)
        programs_per_item = self.row_blocks * (1 if self.sm90 else self.portable.out_split)
        self.target_items = _target_items(info.num_sms, programs_per_item)
        self.capacity = self.target_items + self.batch  # work items can never exceed this (choose_chunk)
        self.slot_capacity = self.target_items
        dev = self.device
        self.seqlens = torch.zeros(self.batch, dtype=torch.int32, device=dev)
        self.work = torch.full((self.capacity, 4), -1, dtype=torch.int32, device=dev)
        self.splits = torch.zeros(self.batch, 2, dtype=torch.int32, device=dev)
        self.o_part = torch.empty(self.slot_capacity, self.rows, self.dc, dtype=torch.float32, device=dev)
        self.lse_part = torch.empty(self.slot_capacity, self.rows, dtype=torch.float32, device=dev)
        self.out = torch.empty(self.batch, q_len, num_heads, self.dc, dtype=dtype, device=dev)
        self.programs = None  # CTAs of the Gluon kernel (None: one per SM; tests set fewer to walk many tiles)
        self.compiled = None  # the split kernel of the last run (its metadata.shared: the real shared memory)
        self.lse = torch.empty(self.batch, num_heads, q_len, dtype=torch.float32, device=dev)
        self.kv_scale = torch.ones(1, dtype=torch.float32, device=dev)  # a number passed to run goes here
        # the number it holds, so that a run with the same number launches no fill (None: fill on every run, as
        # once a run was captured in a CUDA graph, whose replays write the captured number into it)
        self._kv_scale_value = 1.0
        # run's fast path: the key (_run_key) of the last checked run since update(), whether its tensors suit
        # TMA, and the launchers made for a key (backend name or "combine" -> launcher.KernelLauncher)
        self._checked = self._launch_key = self._tma_ok = None
        self.launchers = {}
        self._update(cache_seqlens, lens)

    def _first_chunk(self, lens):
        """The Gluon kernel's item length (tokens) at the lengths the plan is built with (lens, int64 on the CPU),
        as update() would cut them for the pair schedule (64-token steps, one item per SM and row tile): what
        chooses its config (configs.sm90_configs; later lengths keep it). None when every length is 0 (placeholders:
        unknown)."""
        lens = lens.tolist()
        if not any(lens):
            return None
        target = _target_items(hw.device_info(self.device).num_sms, triton.cdiv(self.rows, BLOCK_M))
        return choose_chunk(lens, SM90_PAIR.block_n, target)

    def _choose_kernels(self):
        """The backend (dispatch.py) and the configs: the Gluon kernel's tiles are 64 rows, the portable
        kernel's fit the rows (16..64); the portable config also serves runs whose tensors do not suit TMA."""
        backend, _ = dispatch.select(self)
        self.sm90 = dispatch.SM90.config(self) if backend is dispatch.SM90 else None
        self.block_m = BLOCK_M if self.sm90 else _block_m(self.rows)
        self.portable = dispatch.TRITON.config(self)
        self.config = self.sm90 or self.portable
        self.row_blocks = triton.cdiv(self.rows, self.block_m)

    def update(self, cache_seqlens: torch.Tensor) -> MLADecodePlan:
        """Re-plan for new lengths of the same batch (a device sync), into the plan's buffers."""
        check_seqlens(cache_seqlens, self.batch, self.device)
        return self._update(cache_seqlens, _read_lengths(cache_seqlens))

    def _update(self, cache_seqlens, lens):
        """update() with the lengths already read to the CPU (lens: _read_lengths')."""
        self.max_len = int(lens.max()) if lens.numel() else 0
        if self.max_pages_per_seq is not None and self.max_len > self.max_pages_per_seq * self.page_size:
            raise ValueError(f"cache_seqlens: a sequence of {self.max_len} tokens does not fit a block table of "
                             f"{self.max_pages_per_seq} pages of {self.page_size}")
        lens = lens.tolist()
        chunk = choose_chunk(lens, self.config.block_n, self.target_items)  # pieces of >= 2 steps
        items, splits, slots = schedule(lens, chunk)
        # choose_chunk: either <= target_items pieces, or one per sequence (no slots)
        assert len(items) <= self.capacity and slots <= self.slot_capacity
        work = torch.full((self.capacity, 4), -1, dtype=torch.int32)
        if items:
            work[: len(items)] = torch.tensor(items, dtype=torch.int32)
        self.work.copy_(work)
        self.splits.copy_(torch.tensor(splits, dtype=torch.int32).reshape(self.batch, 2))
        self.seqlens.copy_(cache_seqlens)
        self.num_items, self.num_slots, self.chunk = len(items), slots, chunk
        self.has_empty = bool(lens) and min(lens) == 0  # an empty sequence's out / lse come from the combine
        self._checked = None  # the next run checks its tensors against the new lengths
        return self

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
            block_table: torch.Tensor, *, kv_scale: float | torch.Tensor = 1.0, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None,
            return_lse: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention of the plan's batch: q_nope [B, q_len, Hq, Dc], q_pe [B, q_len, Hq, Dr] over ckv_cache
        [num_pages, page_size, Dc] and kpe_cache [num_pages, page_size, Dr] (the plan's cache_dtype) through
        block_table [B, max_pages] int32. kv_scale: the caches' values times it are the keys and values (the
        float32 scale of an fp8 cache), a number or a one-element float32 tensor (a captured graph reads the
        tensor's current value). Returns out (and lse with return_lse); see the class docstring."""
        r = MLARun(q_nope, q_pe, ckv_cache, kpe_cache, block_table, kv_scale, out, lse, return_lse)
        r.out = self.out if out is None else out
        r.lse = self.lse if lse is None else lse
        key = _run_key(r)
        if key is None or key != self._checked:
            # a new tensor layout (or the first run since update): check everything once, then runs with the
            # same key skip the checks and replay the launches made for it (self.launchers)
            check_run_args(self, r)
            self._checked, self._tma_ok = key, tensors_ok(r)
            if key != self._launch_key:
                self.launchers.clear()
                self._launch_key = key
        check_kv_scale(kv_scale, self)
        if torch.is_grad_enabled() and (q_nope.requires_grad or q_pe.requires_grad or ckv_cache.requires_grad
                                        or kpe_cache.requires_grad):
            raise NotImplementedError("MLA decode has no backward pass (an inference kernel): call it under "
                                      "torch.no_grad() / inference_mode()")
        capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not isinstance(kv_scale, torch.Tensor):
            # a fill (a launch, ~2.5 us of GPU time) only when the number changes, and on every run once a graph
            # has captured one (mla.md, open lever 4)
            value = float(kv_scale)
            if capturing or self._kv_scale_value != value:
                self.kv_scale.fill_(value)
                # (None stays None: a graph replay may have written its number since)
                self._kv_scale_value = None if capturing or self._kv_scale_value is None else value
            r.kv_scale = self.kv_scale
        out, lse = r.out, r.lse
        backend = dispatch.SM90 if self.sm90 and self._tma_ok else dispatch.TRITON
        self.compiled = backend.launch(self, r)
        if not (self.num_slots or self.has_empty or capturing):
            # nothing to merge (every sequence is one work item that wrote its output) and no empty sequence to
            # zero: the combine launch is skipped (host time that short decode steps would feel). A captured
            # graph always has it: update() may split sequences later.
            return (out, lse) if return_lse else out
        block_r = max(1, min(self.block_m, 16384 // self.dc))
        grid = (triton.cdiv(self.rows, block_r), self.batch)
        tensors = (self.o_part, self.lse_part, self.splits, out, lse)
        launch_kept(self.launchers, "combine", grid, tensors, lambda: (mla_combine_kernel, (
            *tensors, *out.stride()[:3], lse.stride(0), lse.stride(1), self.num_heads, self.q_len,
        ), dict(DC=self.dc, BLOCK_R=block_r, RETURN_LSE=return_lse, num_warps=4)))
        return (out, lse) if return_lse else out

    def __repr__(self) -> str:
        return (f"MLADecodePlan(batch={self.batch}, num_heads={self.num_heads}, q_len={self.q_len}, Dc={self.dc}, "
                f"Dr={self.dr}, page_size={self.page_size}, {self.config}, items={self.num_items}, "
                f"chunk={self.chunk}, split slots={self.num_slots})")

