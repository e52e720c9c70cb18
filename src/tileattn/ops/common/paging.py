"""Paged KV caches, shared by the decode ops (ops/mla, ops/decode): the split-KV chunk choice, the checks of
lengths and block tables, and the kernels' page-gather helper.

A paged cache holds each sequence's tokens in fixed-size pages: token j of sequence b is row j % page_size of
page block_table[b, j // page_size]. Decode work is split over the key range ("split-KV") so that a small
batch with long contexts still fills the GPU; `choose_chunk` picks the piece length.
"""
import torch
import triton
import triton.language as tl


def choose_chunk(lens, step, max_items, min_steps=2):
    """The smallest chunk (a multiple of `step`, at least `min_steps` steps) that cuts ranges of `lens` tokens
    into at most max_items pieces; one piece per range when even that makes more."""
    longest = max(lens, default=0)
    hi = max(step, -(-longest // step) * step)
    lo = min(hi, min_steps * step)

    def pieces(c):
        return sum(-(-n // c) for n in lens)
    if pieces(lo) <= max_items:
        return lo
    if pieces(hi) > max_items:
        return hi
    lo_k, hi_k = lo // step, hi // step  # pieces(lo_k * step) > max_items >= pieces(hi_k * step)
    while hi_k - lo_k > 1:
        mid = (lo_k + hi_k) // 2
        if pieces(mid * step) <= max_items:
            hi_k = mid
        else:
            lo_k = mid
    return hi_k * step


def check_seqlens(cache_seqlens, batch, device, name="cache_seqlens"):
    """A 1-D int32 tensor of `batch` lengths (None: any) on `device` (None: any)."""
    if not isinstance(cache_seqlens, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor")
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise ValueError(f"{name}: expected a 1-D int32 tensor, got {cache_seqlens.dtype} "
                         f"of shape {tuple(cache_seqlens.shape)}")
    if batch is not None and cache_seqlens.shape[0] != batch:
        raise ValueError(f"{name}: the plan is for a batch of {batch}, got {cache_seqlens.shape[0]} "
                         f"lengths (make a new plan for a new batch size)")
    if device is not None and cache_seqlens.device != device:
        raise ValueError(f"{name}: on {cache_seqlens.device}, the plan is on {device}")


def check_pages(block_table, cache_seqlens, page_size, num_pages):
    """Host check (a device sync) that every page a sequence uses is a valid id in [0, num_pages)."""
    lens = cache_seqlens.to(torch.int64)
    used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * page_size < lens[:, None]
    ids = block_table[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
        raise ValueError(f"block_table: page ids must be in [0, {num_pages}) for the pages a sequence uses, got "
                         f"{int(ids.min())}..{int(ids.max())}")


def gather_tokens(cache, block_table, b, n):
    """The first n tokens of sequence b as a dense tensor [n, ...] (host side, the references): through
    block_table from a paged cache [num_pages, page_size, ...], or cache[b, :n] of a contiguous one (None)."""
    if block_table is None:
        return cache[b, :n]
    page_size = cache.shape[1]
    tok = torch.arange(n, device=cache.device)
    return cache[block_table[b, tok // page_size].long(), tok % page_size]


@triton.jit
def gather_rows(cache, stride_p, stride_s, pages, slots, cols, mask):
    """[BLOCK_N, len(cols)] rows of a paged cache: token i is row slots[i] of page pages[i]."""
    rows = pages.to(tl.int64) * stride_p + slots.to(tl.int64) * stride_s
    return tl.load(cache + rows[:, None] + cols[None, :], mask=mask[:, None], other=0.0)
