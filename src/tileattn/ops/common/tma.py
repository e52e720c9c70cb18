"""Tensor descriptors (TMA, Hopper's bulk copies): which tensors they take, and Gluon's descriptors.

The Gluon (Hopper) kernels are run-verified on triton 3.6 and 3.9 (`GLUON_TRITON`; the names that differ
between them: gluon_compat.py). Gluon is experimental and changes between releases, so other versions keep
every op on its Triton kernels.
"""
import functools

import torch
import triton


def tma_ok(t) -> bool:
    """A tensor descriptor needs a non-empty tensor with a 16-byte aligned base and 16-byte aligned strides
    (all but the last, which must be 1 for the copy engine to read rows)."""
    es = t.element_size()
    return t.numel() > 0 and t.data_ptr() % 16 == 0 and all((s * es) % 16 == 0 for s in t.stride()[:-1])


# triton releases whose Gluon the Hopper kernels were run-verified on (GPU test suite and benchmarks)
GLUON_TRITON = ("3.6.", "3.9.")


@functools.cache
def gluon_available() -> bool:
    """Gluon's Hopper API as the kernels were written and run-verified against it (GLUON_TRITON)."""
    if not triton.__version__.startswith(GLUON_TRITON):
        return False
    try:
        from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma  # noqa: F401
        return True
    except ImportError:
        return False


_LAYOUTS = {}


def gl_dtype(dtype):
    from triton.experimental.gluon import language as gl
    return {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv,
            torch.float8_e5m2: gl.float8e5, torch.float32: gl.float32}[dtype]


def nvmma_layout(block, dtype):
    """The default NVMMA shared-memory layout (swizzled for wgmma) of a [block] tile of `dtype` (cached)."""
    from triton.experimental.gluon import language as gl
    key = (tuple(block), dtype)
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _LAYOUTS[key] = gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(dtype))
    return lay


def gluon_desc(t, block, dims=None):
    """A Gluon host tensor descriptor over the whole of `t` with box `block` and the default NVMMA layout;
    dims: t seen with its dimensions in this order (t.permute(dims), keeping t itself as the base)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    shape, strides = list(t.shape), list(t.stride())
    if dims is not None:
        shape, strides = [shape[i] for i in dims], [strides[i] for i in dims]
    return TensorDescriptor(t, shape, strides, list(block), nvmma_layout(block, t.dtype))


def gluon_sm90_reason(device):
    """Why the Gluon (Hopper) kernels cannot run on `device`, or "" when they can."""
    from ... import hw
    if hw.interpreter_enabled():
        return "the Triton interpreter runs no Gluon kernel"
    if not hw.is_hopper(device):
        return f"{device} is not a Hopper GPU (compute capability 9)"
    if not gluon_available():
        return (f"triton {triton.__version__}: the Gluon kernels are verified on triton "
                f"{' and '.join(v.rstrip('.') for v in GLUON_TRITON)} only")
    return ""
