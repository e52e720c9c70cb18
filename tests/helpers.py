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


def randn(*shape, dtype, device):
    return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)
