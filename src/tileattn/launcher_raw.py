"""The C launch of a compiled kernel, per triton version: what the direct path of launcher.KernelLauncher calls.

Both supported versions end Triton's normal launch in one C call on the nvidia backend; they differ in how it is
reached and in what it takes.

triton 3.6 (nvidia/driver.py, make_launcher): a C module compiled per kernel signature. `run.launch` is its `launch`,
wrapped by wrap_handle_tensordesc when the kernel takes descriptors (the C entry is then the wrapper's `launcher`).
It takes, as format "iiiKKppOOOOOO" then one item per parameter (a tuple parameter as a tuple):

    gx, gy, gz, stream, function, cooperative, pdl, global scratch, profile scratch, packed metadata,
    launch metadata, enter hook, exit hook, *kernel arguments

triton 3.9 (nvidia/driver.c, launchKernel): one C function for every kernel, utils.launch, wrapped the same way
(backends/driver.py, wrap_handle_tensordesc_impl, which expands the descriptors through libtriton's
make_tensordesc_args). It takes, as format "iiiKKpp(iii)OOOOOOy*O":

    gx, gy, gz, stream, function, cooperative, pdl, packed metadata (num_warps, num_ctas, shared),
    launch metadata, enter hook, exit hook, global scratch, profile scratch,
    arg annotations, signature, kernel arguments

where the kernel arguments are one sequence, flattened by the annotations (run.arg_annotations: a tuple parameter
nested as a tuple, constexprs present and skipped) and read by the signature's bytes (run.kernel_signature). A kernel
built with GSan instrumentation takes three more arguments per launch (state, launch table and index): refused.

In both, the kernel arguments are the parameters in order, each host descriptor expanded in place into what
make_tensordesc_arg gives ([tensor map, *shape, *strides] where lowered to TMA, else the base pointer, shape, strides
and flags), and a pointer may be passed as its address (an int), which the C launcher takes as it is (a tensor
costs a data_ptr() call and a cuPointerGetAttribute there).
"""
import inspect

import triton

# the versions whose launcher this module knows ("3.6", "3.9"), or None: every launch takes the normal path
VERSION = next((v for v in ("3.6", "3.9") if triton.__version__.startswith(v + ".")), None)

_FORMAT_36 = "iiiKKppOOOOOO"  # triton 3.6's _BASE_ARGS_FORMAT: the leading arguments the 3.6 call fills in


class RawLaunch:
    """How to call one compiled kernel's C launch directly.

    entry: the C launch; metas: the descriptor metadata, one per descriptor parameter in order (None: not lowered
    to a TMA map); pieces(desc, meta): the kernel arguments a host descriptor expands to (make_tensordesc_arg);
    consts: names the call statement uses besides the replay's own; call(args): the call statement of replay code,
    given the kernel arguments' expressions (strings, in order).
    """
    __slots__ = ("entry", "metas", "pieces", "consts", "call")


def raw_launch(run, n_desc):
    """The RawLaunch of a compiled kernel's launcher object `run` (with `n_desc` descriptor parameters) under this
    triton version, or None where unsupported (another version, a launcher not of the expected shape, GSan)."""
    if VERSION == "3.6":
        return _raw_36(run, n_desc)
    if VERSION == "3.9":
        return _raw_39(run, n_desc)
    return None


def _unwrap(launch, n_desc):
    """(C entry, descriptor metadata) of `launch`: itself when the kernel takes no descriptor, else the function
    that wrap_handle_tensordesc wrapped and the metadata list it holds; None where not found."""
    if not n_desc:
        return launch, []
    try:
        closure = inspect.getclosurevars(launch).nonlocals
    except TypeError:
        return None
    entry, metas = closure.get("launcher"), closure.get("tensordesc_meta")
    if entry is None or not isinstance(metas, list):
        return None
    return entry, metas


def _raw_36(run, n_desc):
    """triton 3.6: the per-signature C module's launch; the wrapper's metadata list is always one per descriptor."""
    from triton.backends.nvidia import driver as nvd
    if getattr(nvd, "_BASE_ARGS_FORMAT", None) != _FORMAT_36 or not isinstance(run, nvd.CudaLauncher):
        return None
    found = _unwrap(run.launch, n_desc)
    if found is None or len(found[1]) != n_desc:
        return None
    r = RawLaunch()
    r.entry, r.metas, r.pieces, r.consts = found[0], found[1], nvd.make_tensordesc_arg, {}
    r.call = lambda args: ("raw(gx, gy, gz, get_stream(device), function, coop, pdl, None, None, packed, None, None, "
                           f"None{''.join(', ' + a for a in args)})")
    return r


def _raw_39(run, n_desc):
    """triton 3.9: utils.launch, the one C launch of every kernel, with the launcher's annotations and signature."""
    from triton.backends.nvidia import driver as nvd
    from triton.runtime import driver
    if not isinstance(run, nvd.CudaLauncher) or getattr(run, "gsan_enabled", True):
        return None
    annotations, signature = getattr(run, "arg_annotations", None), getattr(run, "kernel_signature", None)
    if annotations is None or signature is None or len(inspect.signature(nvd.make_tensordesc_arg).parameters) != 3:
        return None
    found = _unwrap(run.launch, n_desc)
    if found is None or found[0] != driver.active.utils.launch:
        return None
    metas = found[1] or [None] * n_desc  # as make_tensordesc_args reads an empty list: no descriptor lowered
    if len(metas) != n_desc:
        return None
    r = RawLaunch()
    r.entry, r.metas = found[0], metas
    r.pieces = lambda desc, meta: nvd.make_tensordesc_arg(desc, meta, None)  # (its third argument is unused)
    r.consts = {"annotations": annotations, "signature": signature}
    r.call = lambda args: ("raw(gx, gy, gz, get_stream(device), function, coop, pdl, packed, None, None, None, "
                           f"None, None, annotations, signature, ({''.join(a + ', ' for a in args)}))")
    return r
