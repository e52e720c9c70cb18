"""The tolerance rule (engineering.md) and input makers shared by the tests."""
import torch

from tileattn.tolerance import rounding_floor


def assert_close(name, out, ref, ref_lp):
    """max|out - ref| <= 2 * max|ref_lp - ref| + atol, atol the rounding floor of out's dtype.

    Infinite entries of ref (lse of rows that see nothing) must match exactly; no NaN anywhere.
    """
    out_dtype = out.dtype
    out = out.float()
    ref = ref.float()
    ref_lp = ref_lp.float()
    assert not torch.isnan(out).any(), f"{name}: NaN in output"
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(out), inf), f"{name}: infinities differ from the reference"
    assert torch.equal(out[inf], ref[inf]), f"{name}: infinities differ from the reference"
    fin = ~inf
    if not fin.any():
        return
    err = (out[fin] - ref[fin]).abs().max().item()
    err_lp = (ref_lp[fin] - ref[fin]).abs().max().item()
    atol = rounding_floor(ref[fin], out_dtype)
    assert err <= 2 * err_lp + atol, (f"{name}: max error {err:.3e} > 2 * {err_lp:.3e} (input-precision "
                                      f"error) + {atol:.3e}")


def same_tensors(a, b):
    """a and b (tensors, or tuples of them) have the same shapes, strides and bits."""
    if isinstance(a, tuple):
        return all(same_tensors(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


def randn(*shape, dtype, device):
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)


def paged_caches(lens, page_size, row_shapes, dtype, device, spare_pages, table_pad=0):
    """Caches [num_pages, page_size, *row_shape] (one per row shape) holding sequences of `lens` tokens in
    shuffled pages, random where a sequence has a token and NaN in every slot none uses, and the int32 block
    table [B, pages of the longest + table_pad] (entries past a sequence's pages -1). Returns (caches, table)."""
    pages_per = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per) + spare_pages
    perm = torch.randperm(num_pages).tolist()
    caches = [torch.full((num_pages, page_size, *shape), float("nan"), dtype=dtype, device=device)
              for shape in row_shapes]
    table = torch.full((len(lens), max(1, max(pages_per)) + table_pad), -1, dtype=torch.int32)
    nxt = 0
    for b, n in enumerate(lens):
        for i in range(pages_per[b]):
            pid = perm[nxt]
            nxt += 1
            table[b, i] = pid
            used = min(page_size, n - i * page_size)
            for cache, shape in zip(caches, row_shapes):
                cache[pid, :used] = randn(used, *shape, dtype=dtype, device=device)
    return caches, table.to(device)


def plan_only_device(monkeypatch):
    """The device of a test that builds launch plans without launching the attention kernel: the GPU where there
    is one (plans still run small Triton kernels, e.g. fp8 V's re-layout, which take CPU tensors only under the
    interpreter), else the CPU, with the kernels' device check seeing it as CI does (through the interpreter)."""
    from tileattn import hw
    if torch.cuda.is_available() and not hw.interpreter_enabled():
        return "cuda"
    monkeypatch.setattr(hw, "interpreter_enabled", lambda: True)
    return "cpu"
