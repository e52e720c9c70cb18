"""Host time of one tileattn.attention call on a repeated problem.

    python scripts/host_overhead.py          # GPU: real launches, vs torch SDPA (cuDNN), same shape
    python scripts/host_overhead.py --cpu    # no GPU needed: the C launch is a no-op (see below)
    python scripts/host_overhead.py --check  # no GPU needed: cached launches pass the C launcher exactly
                                             # the arguments of Triton's normal path (tests run this)

GPU: per-call time at a tiny shape (B=1, S=128, H=1, D=64, fp16), where the kernel is far shorter than
the host work: time.perf_counter over 1000 back-to-back calls after warm-up, torch.cuda.synchronize at the
end. CPU: Triton compiles the real sm90 kernels (ptxas ships with Triton), but a stand-in driver loads no
binary and its C launcher is a no-op, so the figure is the Python path up to the launch: validation,
allocation, config, argument building, Triton's dispatch or the cached plan. C-side costs (argument parsing,
cuPointerGetAttribute per tensor argument, cuTensorMapEncodeTiled, cuLaunchKernelEx) are not in it.
The GPU and --cpu modes run on any tileattn revision with this public API (before/after comparisons).
"""
import argparse
import collections
import contextlib
import os
import sys
import time

SHAPE = (1, 128, 1, 64)  # B, S, H, D


Launch = collections.namedtuple("Launch", "grid stream function options scratch metadata hooks args signature")
Launch.__doc__ = """One C-level launch as the stand-in driver records it, in the same fields under triton 3.6 and 3.9:
grid (x, y, z), stream, function, options (cooperative, pdl), scratch (global, profile), metadata (the kernel's
packed metadata), hooks (launch metadata, enter hook, exit hook), args (the kernel arguments: one item per
parameter, constexprs included, a host descriptor expanded in place, a tuple parameter as a tuple), signature
(3.9: the argument annotations and the signature the C launch reads the arguments by; 3.6: None, compiled into
its per-kernel launcher)."""


def fake_cuda_driver(record=False):
    """A CUDA driver stand-in for a machine without a GPU: compiles for sm90, launches nothing.

    Returns (driver, launches): with record=True, `launches` collects a Launch per C-level launch call (else it
    stays empty and the launch is a bare no-op). Under triton 3.9 each launch is first checked as its C launch
    (driver.c, launchKernel) reads it: see _check_c_launch_39.
    """
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import driver as nvd

    launches = []
    v39 = hasattr(nvd, "annotate_arguments")

    class Utils:
        def load_binary(self, name, kernel, shared, device):
            return 1, 2, 64, 0, 1024  # module, function, n_regs, n_spills, n_max_threads

        def get_device_properties(self, device):
            return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536,
                    "warpSize": 32, "sm_clock_rate": 1, "mem_clock_rate": 1, "mem_bus_width": 1}

        def fill_tma_descriptor(self, ptr, swizzle, elem_size, elem_type, block, shape, strides, padding):
            # stands for the encoded CUtensorMap; equal inputs give equal "maps"
            return ("tmap", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides),
                    padding)

        fill_tma_descriptor_tiled = fill_tma_descriptor  # (triton 3.9's name)

        def launch(self, *args):  # triton 3.9: the C-level launch is a function of the utils module
            if record:
                launches.append(_check_c_launch_39(args))

        def build_signature_metadata(self, signature):  # triton 3.9 (its C module's): the types, kept as strings
            return tuple(signature)

    if v39 and nvd.PyKernelArg is None:  # triton 3.9: the C module's argument annotations (kind, nested tuple)
        nvd.PyKernelArg = lambda nested_tuple, type: (type, nested_tuple)
        nvd.ARG_CONSTEXPR, nvd.ARG_KERNEL, nvd.ARG_TUPLE = 0, 1, 2

    def launch_36(*args):  # triton 3.6: the per-kernel C module's launch (format "iiiKKppOOOOOO" + one per parameter)
        if record:
            launches.append(Launch(args[:3], *args[3:5], args[5:7], args[7:9], args[9], args[10:13], args[13:], None))

    class Launcher(nvd.CudaLauncher):
        # triton 3.6: CudaLauncher.__init__ without compiling the C module: the same attributes, a recording launch
        def __init__(self, src, metadata):
            if v39:  # triton 3.9: nothing to compile, the launch is Utils.launch
                super().__init__(src, metadata)
                return
            signature = dict(src.signature)
            self.num_ctas = getattr(metadata, "num_ctas", 1)
            self.launch = nvd.wrap_handle_tensordesc(launch_36, signature, getattr(metadata, "tensordesc_meta", None))
            self.global_scratch_size = metadata.global_scratch_size
            self.global_scratch_align = metadata.global_scratch_align
            self.profile_scratch_size = metadata.profile_scratch_size
            self.profile_scratch_align = metadata.profile_scratch_align
            self.launch_cooperative_grid = metadata.launch_cooperative_grid
            self.launch_pdl = metadata.launch_pdl

    class Driver(nvd.CudaDriver):
        def __init__(self):  # no GPUDriver.__init__: it binds torch.cuda functions
            self.utils = Utils()
            self.launcher_cls = Launcher
            self.get_current_device = lambda: 0
            self.get_current_stream = lambda device=None: 0
            self.set_current_device = lambda device: None
            self.get_device_capability = lambda device=None: (9, 0)

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

    return Driver(), launches


def _check_c_launch_39(args):
    """The Launch of triton 3.9's C launch call `args`, after the checks its parsing would make (driver.c,
    launchKernel, format "iiiKKpp(iii)OOOOOOy*O"): the grid, stream, function and packed metadata are ints, the kernel
    arguments hold one item per annotation (a tuple parameter a sequence of its own annotations', a constexpr an
    item skipped), and the kernel arguments it extracts match the signature one for one, each of its type's kind:
    a pointer an int, None or an object with data_ptr(), a tensor map the stand-in's, an int an int, a float a
    number. A stricter reading than the C launch's (which reads extra items of no annotation, or reads past the
    end), so that a replay passing what the C launch would misread fails here."""
    assert len(args) == 16, f"triton 3.9's launch takes 16 arguments, got {len(args)}"
    grid, stream, function, coop, pdl, metadata, hooks, scratch, (annotations, signature, kernel_args) = (
        args[:3], args[3], args[4], args[5], args[6], args[7], args[8:11], args[11:13], args[13:])
    ints = (*grid, stream, function, *metadata)
    assert len(metadata) == 3 and all(type(x) is int for x in ints), ("grid, stream, function, metadata", ints)
    flat = []

    def extract(items, annotations):  # driver.c, extractArgs
        assert isinstance(items, (tuple, list)) and len(items) == len(annotations), (items, annotations)
        for item, (kind, nested) in zip(items, annotations):
            if kind == 2:  # ARG_TUPLE
                extract(item, nested)
            elif kind == 1:  # ARG_KERNEL
                flat.append(item)

    extract(kernel_args, annotations)
    assert len(flat) == len(signature), f"{len(flat)} kernel arguments for a signature of {len(signature)}"
    for ty, x in zip(signature, flat):
        if ty[0] == "*":
            ok = x is None or type(x) is int or hasattr(x, "data_ptr")
        elif ty == "nvTmaDesc":
            ok = type(x) is tuple and x[:1] == ("tmap",)
        elif ty[0] in "iu":
            ok = isinstance(x, int)
        else:  # fp16, bf16, fp32, fp64
            ok = isinstance(x, (int, float))
        assert ok, f"a {ty} kernel argument cannot be {x!r}"
    return Launch(grid, stream, function, (coop, pdl), scratch, metadata, hooks, tuple(kernel_args),
                  (annotations, signature))


def normalized(call, names=None):
    """`call` (a Launch) as the checks compare it: tensors as their addresses (the normal path passes tensors, a
    replay their data_ptr()), the addresses in `names` as their names, no launch metadata or hooks."""
    names = names or {}

    def norm(a):
        if isinstance(a, tuple):
            return tuple(norm(x) for x in a)
        a = a.data_ptr() if hasattr(a, "data_ptr") else a
        return names.get(a, a) if type(a) is int else a
    return call._replace(hooks=None, args=norm(call.args))


def replayed(call):
    """Whether `call` (a Launch) came from a replay: the normal path passes the knobs' hooks (empty HookChains by
    default), a replay None."""
    return call.hooks[1] is None


def _time(fn, n):
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def _cpu_setup(record=False):
    """Real JIT kernels compiled for sm90, the stand-in driver, H100 config tables, CPU tensors let through."""
    os.environ.pop("TRITON_INTERPRET", None)  # must precede the first import of triton
    from triton.runtime import driver

    drv, launches = fake_cuda_driver(record)
    driver.set_active(drv)
    from tileattn import hw

    hw.interpreter_enabled = lambda: True  # CPU tensors pass check_device
    h100 = hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448)
    hw.device_info = lambda device: h100
    return launches


def run_cpu(n, repeats):
    _cpu_setup()
    import torch

    import tileattn

    q, k, v = (torch.randn(*SHAPE, dtype=torch.float16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [B, H, S, D], as SDPA callers have
    cases = [
        ("causal (pointer loads)", lambda: tileattn.attention(q, k, v, causal=True)),
        ("full (TMA, warp-specialized)", lambda: tileattn.attention(q, k, v)),
        ("causal, return_lse", lambda: tileattn.attention(q, k, v, causal=True, return_lse=True)),
        ("sdpa drop-in, causal", lambda: tileattn.scaled_dot_product_attention(qt, kt, vt, is_causal=True)),
    ]
    print(f"CPU, no-op launch, B,S,H,D={SHAPE} fp16, {n} calls, best of {repeats} (us per call)")
    for name, fn in cases:
        fn()  # compiles
        us = min(_time(fn, n) for _ in range(repeats))
        print(f"  {name:28s} {us:7.1f}")


def run_check():
    """Replayed launches (tileattn.launcher) give the C launcher the arguments Triton's normal path gives."""
    launches = _cpu_setup(record=True)
    import torch

    import tileattn
    from tileattn import force_backend, launcher
    from tileattn.ops.dense import plans
    from tileattn.ops.dense.configs import AttnConfig

    def norm(call, result):  # the fresh outputs of each call by name
        outs = result if isinstance(result, tuple) else (result,)
        return normalized(call, {t.data_ptr(): f"out{i}" for i, t in enumerate(outs) if t.numel()})

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float16)

    def cu(lens):
        return torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)

    def make(kind):
        if kind == "varlen":
            lq, lk = [5, 0, 40], [9, 3, 40]
            t = (rand(45, 4, 64), rand(52, 2, 64), rand(52, 2, 64), cu(lq), cu(lk))
            return t, lambda q, k, v, cq, ck: tileattn.varlen_attention(q, k, v, cq, ck, 40, 40, causal=True)
        if kind == "sdpa":
            t = (rand(2, 4, 33, 64), rand(2, 2, 50, 64), rand(2, 2, 50, 64))
            return t, lambda q, k, v: tileattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        t = (rand(2, 70, 4, 64), rand(2, 90, 2, 64), rand(2, 90, 2, 64))
        if kind == "lse-softcap-window":
            return t, lambda q, k, v: tileattn.attention(q, k, v, window=(20, 3), softcap=5.0, scale=0.3,
                                                         return_lse=True)
        return t, lambda q, k, v: tileattn.attention(q, k, v, causal=kind == "causal")

    tma = AttnConfig(128, 64, 8, 3, True)  # a TMA config of the portable kernel's sm90 table
    cases = [("causal", None), ("full", None), ("causal", tma), ("lse-softcap-window", None), ("sdpa", None),
             ("varlen", None), ("varlen", tma)]
    for kind, cfg in cases:
        a, f = make(kind)
        b, _ = make(kind)
        with force_backend(config=cfg) if cfg is not None else contextlib.nullcontext():
            got = []
            for direct in (True, False):
                launcher.DIRECT = direct
                plans.clear_plans()
                launches.clear()
                results = [f(*a), f(*a), f(*b)]
                got.append([norm(call, r) for call, r in zip(launches, results)] + [launches[1]])
        (n1, d_a, d_b, raw_direct), (n_a, n2, n_b, raw_normal) = got
        assert replayed(raw_direct) and not replayed(raw_normal), "replayed launches expected"
        assert d_a == n_a == n1 == n2, f"{kind}: replay differs from the normal path"
        assert d_b == n_b, f"{kind}: replay with new tensors differs from the normal path"
        maps = sum(isinstance(x, tuple) and x[:1] == ("tmap",) for x in raw_direct.args)
        print(f"ok  {kind}{' (forced TMA config)' if cfg else ''}: {len(raw_direct.args)} kernel arguments, "
              f"{maps} tensor maps")
    check_backward(launches)
    print("CHECK OK")


def check_backward(launches):
    """The Hopper backward's replayed plan (bwd.attn_bwd_planned: three launches, delta, the dQ sums and the
    counters as addresses in one allocation) passes the C launcher what its first call passed through Triton's
    normal path: the same grid, options and signature, the same arguments, the gradients' addresses where the
    first call had its own, and the workspace's pieces at the same offsets from its (other) base."""
    import torch

    import tileattn
    from tileattn import launcher
    from tileattn.ops.common import launch_bwd_sm90

    launcher.DIRECT = True
    launch_bwd_sm90.gluon_sm90_reason = lambda device: ""  # the stand-in is an H100

    def flat(call):
        out = []
        for a in call.args:
            out += list(a[1:]) if isinstance(a, tuple) and a[:1] == ("tmap",) else [a]  # a map's fields
        return [a.data_ptr() if hasattr(a, "data_ptr") else a for a in out]

    for d, window in ((64, (-1, 0)), (128, (-1, 0)), (128, (200, 0)), (64, (-1, -1))):
        q, k, v = (torch.randn(1, 1024, 2, d, dtype=torch.float16).requires_grad_() for _ in range(3))
        out = tileattn.attention(q, k, v, window=window)
        dout = torch.randn_like(out)
        calls = []
        for _ in range(2):  # the first call makes the plan (normal path), the second replays it
            launches.clear()
            grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            names = {t.data_ptr(): f"d{i}" for i, t in enumerate(grads)}
            calls.append(([[names.get(a, a) for a in flat(c)] for c in launches], replayed(launches[1]),
                          [c._replace(hooks=None, args=None) for c in launches]))  # grid, function, signature...
        (first, replayed1, rest1), (again, replayed2, rest2) = calls
        assert not replayed1 and replayed2, "the second backward should replay its plan"
        assert rest1 == rest2, f"D={d} window={window}: replayed launch fields differ from the normal path's"
        assert len(first) == len(again) == 3, (len(first), len(again))
        shift = set()  # the workspace's base moved by one offset for every piece
        for a1, a2 in zip(first, again):
            assert len(a1) == len(a2)
            shift.update(y - x for x, y in zip(a1, a2) if x != y)
        assert len(shift) <= 1, f"D={d} window={window}: replayed arguments differ beyond the workspace: {shift}"
        print(f"ok  backward D={d} window={window}: 3 launches replayed, workspace moved by {shift or 0}")


def run_gpu(n):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tileattn

    q, k, v = (torch.randn(*SHAPE, device="cuda", dtype=torch.float16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # [B, H, S, D] for SDPA

    def per_call(fn):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    print(f"{torch.cuda.get_device_name()}, B,S,H,D={SHAPE} fp16, {n} back-to-back calls (us per call)")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for causal in (True, False):
        us = per_call(lambda: tileattn.attention(q, k, v, causal=causal))
        us_s = per_call(lambda: tileattn.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            us_c = per_call(lambda: sdpa(qt, kt, vt, is_causal=causal))
        print(f"  causal={causal!s:5}  tileattn.attention {us:6.1f}   tileattn sdpa {us_s:6.1f}   "
              f"torch sdpa (cuDNN) {us_c:6.1f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cpu", action="store_true", help="no GPU: no-op launches, Python host path only")
    p.add_argument("--check", action="store_true", help="no GPU: replayed vs normal-path launch arguments")
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if a.check:
        run_check()
    elif a.cpu:
        run_cpu(a.n, a.repeats)
    else:
        run_gpu(a.n)


if __name__ == "__main__":
    sys.exit(main())
