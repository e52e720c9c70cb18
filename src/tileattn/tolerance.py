"""The tolerance rule shared by the tests and the benchmarks' output checks (FlashAttention's rule).

With `ref` the float32 reference and `ref_lp` the same computation in the input precision, an output passes
when max|out - ref| <= 2 * max|ref_lp - ref| + atol, atol being the rounding floor of the output dtype.
"""
import torch


def rounding_floor(ref: torch.Tensor, dtype: torch.dtype) -> float:
    """2 * max|r + 0.3 - 0.3 - r| with r = ref rounded to `dtype`: the error that rounding alone makes."""
    r = ref.to(dtype)
    return 2 * (r + 0.3 - 0.3 - r).abs().max().item()


def allowed_error(err_lp: float, ref: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest max|out - ref| the rule accepts, given err_lp = max|ref_lp - ref|."""
    return 2 * err_lp + rounding_floor(ref, dtype)
