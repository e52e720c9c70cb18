"""Replay launches of a compiled Triton (or Gluon) kernel with little host overhead.

`kernel[grid](*args)` spends tens of microseconds of Python per call in triton 3.6 and 3.9 (a no-op C launch, this
repository's dense kernel: ~25-35 us on a CPU-only dev box, scripts/host_overhead.py --cpu): JITFunction.run
binds the arguments, computes the specialization of every one (type, divisibility by 16, value 1), builds
the cache key and looks the kernel up; the launcher wrapper then expands each host TensorDescriptor and
encodes a fresh CUtensorMap (cuTensorMapEncodeTiled) for it, and calls the (empty) launch hooks.

A KernelLauncher is made from one example call and a list of `varying` parameters; every other parameter
is frozen to its example value. Its first call goes through the normal path (`kernel[grid](...)`, which
compiles); later calls on an NVIDIA GPU call the C launcher of that compiled kernel directly:

    launcher = KernelLauncher(kernel, args, kwargs, varying=("X", "Y", "scale"))
    launcher(grid, x, y, 0.5)   # same order as `varying`

Contract (the caller's cache key must make it hold): the frozen values, and the dtype and the
shape/strides of every varying tensor and descriptor, are those of the example call. What the launcher
checks itself on every call: the current device is the one it compiled for, no launch hook is installed,
and each pointer the kernel was specialized as 16-byte aligned still is; any of these failing sends the
call through the normal path (which re-specializes as Triton always does). replay() leaves the first two to a
caller that launches a batch (direct(), once per batch).

Varying parameters may be pointers (pass the tensor), host tensor descriptors (pass the new base tensor;
shape, strides, block shape and layout stay those of the example descriptor), non-specialized scalars
(floats, bools), and pointers inside a flat tuple parameter, named (name, index) (the tuple's other elements
stay frozen). Integers are specialized by Triton (value 1, divisibility by 16), so they must be frozen
and keyed by the caller; every pointer and descriptor parameter must be varying (a frozen one would keep
pointing at the example's memory).

Not replayed: Triton's per-call check that global variables used by the kernel have not changed, and
knobs changed after the first call (debug, instrumentation). Under TRITON_INTERPRET=1, on another backend,
under a triton version other than 3.6 and 3.9 (the C launch of each is in launcher_raw.py), for a kernel with
scratch memory, pre-run hooks or GSan instrumentation, or with TILEATTN_DIRECT_LAUNCH=0, every call takes the
normal path.
"""
import contextlib
import copy
import dataclasses
import inspect

import torch
from triton import knobs as triton_knobs
from triton.runtime.jit import JITFunction

from . import knobs, launcher_raw

# TILEATTN_DIRECT_LAUNCH=0 keeps every launch on Triton's normal path (to rule this module out)
# The raw launch is written against the launchers of triton 3.6 (the H100 image's) and 3.9 (a fresh install's),
# launcher_raw.py; other versions take the normal path rather than trust that internals with the same names
# mean the same.
DIRECT = knobs.direct_launch() and launcher_raw.VERSION is not None

_TMAP_CACHE_SIZE = 64  # encoded tensor maps kept per descriptor parameter (one per distinct base pointer)

_runtime = triton_knobs.runtime


def _is_descriptor(x):
    """A host tensor descriptor (triton.tools.tensor_descriptor or gluon's): a dataclass with a base tensor."""
    return dataclasses.is_dataclass(x) and not isinstance(x, type) and hasattr(x, "base")


def _without_base(desc):
    desc = copy.copy(desc)
    desc.base = None
    return desc


def _hooks_installed():
    """Launch hooks (profilers such as proton) need the normal path's launch metadata. The knobs hold empty
    HookChains by default (falsy `calls`); a hook set directly is a plain callable (truthy)."""
    enter, exit_ = _runtime.launch_enter_hook, _runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter) or getattr(exit_, "calls", exit_))


class _Direct:
    """What a direct launch needs: the C launch entry (and the version's call of it, launcher_raw.RawLaunch), handles,
    and the argument template."""
    __slots__ = ("raw", "consts", "call", "function", "packed", "coop", "pdl", "device", "get_device", "get_stream",
                 "template", "positions", "masks", "tmaps", "replay")


class KernelLauncher:
    """Launches one specialization of `kernel` (a JITFunction, or the interpreter's stand-in).

    Args:
        kernel: the @triton.jit / @gluon.jit function.
        args, kwargs: an example call, as for `kernel[grid](*args, **kwargs)` (kwargs may hold parameters
            and launch options such as num_warps).
        varying: names of the parameters that change between calls, in the order __call__ takes them.
    """

    def __init__(self, kernel, args, kwargs, varying):
        self.kernel = kernel
        sig = inspect.signature(kernel.fn)
        bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
        bound.apply_defaults()
        self._values = list(bound.arguments.values())  # every parameter, in order
        self._options = {k: v for k, v in kwargs.items() if k not in sig.parameters}
        names = list(sig.parameters)
        # (parameter index, index in its tuple or -1)
        self._varying = tuple((names.index(n), -1) if isinstance(n, str) else (names.index(n[0]), n[1])
                              for n in varying)
        self._names = names
        fixed = set(self._varying)
        for i, val in enumerate(self._values):  # a tensor frozen into the template would outlive its call
            items = enumerate(val) if isinstance(val, tuple) else [(-1, val)]
            for k, item in items:
                if (isinstance(item, torch.Tensor) or _is_descriptor(item)) and (i, k) not in fixed:
                    where = names[i] if k < 0 else f"{names[i]}[{k}]"
                    raise ValueError(f"KernelLauncher: tensor / descriptor parameter {where!r} must be varying")
        self._is_desc = tuple(k < 0 and _is_descriptor(self._values[i]) for i, k in self._varying)
        for (i, k), is_desc in zip(self._varying, self._is_desc):
            # keep no reference to the example's tensors (a plan may outlive them by far); a descriptor
            # stays as the template of the per-call ones, without its base
            if k >= 0:
                self._values[i] = _replace_item(self._values[i], k, None)
            else:
                self._values[i] = _without_base(self._values[i]) if is_desc else None
        self._direct = None
        self._tried_direct = not DIRECT
        self.compiled = None  # the kernel the last normal-path call compiled (its .metadata: registers, shared)

    def __call__(self, grid, *values):
        """Launch on `grid` with these values of the varying parameters. Returns nothing."""
        d = self._direct
        if len(values) != len(self._varying):  # a caller that lost track of its tensors must not replay stale ones
            raise ValueError(f"KernelLauncher: {len(values)} values for {len(self._varying)} varying parameters")
        if d is None or d.get_device() != d.device or _hooks_installed():
            return self._normal(grid, values)
        n = len(grid)
        if not d.replay(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, *values):
            self._normal(grid, values)  # a pointer lost the 16-byte alignment the kernel assumed
        return None

    @property
    def replayable(self):
        """Whether this launcher has a direct launch (its first call compiled a kernel the direct path takes)."""
        return self._direct is not None

    def direct(self):
        """Whether calls take the direct path now (replayable, on its device, no launch hook installed): a caller
        that checked this for one launcher may replay() a batch of replayable launchers of the same device."""
        d = self._direct
        return d is not None and d.get_device() == d.device and not _hooks_installed()

    def replay(self, grid3, *values):
        """__call__ for a caller that checked direct() (just before, on this device) and passes the grid as (x,
        y, z) and exactly the varying values: no checks but the pointers' alignment. Replayable launchers only."""
        if not self._direct.replay(*grid3, *values):
            self._normal(grid3, values)

    def compile(self, grid, *values):
        """Compile (or find in Triton's cache) the kernel for these values of the varying parameters, without
        launching it. Returns the compiled kernel (.metadata.shared: its shared memory)."""
        return self.kernel.warmup(*self._bind(values), grid=grid, **self._options)

    # -- normal path ----------------------------------------------------------------------------------------
    def _bind(self, values):
        args = list(self._values)
        for (i, k), is_desc, val in zip(self._varying, self._is_desc, values):
            if k >= 0:
                args[i] = _replace_item(args[i], k, val)
            else:
                args[i] = dataclasses.replace(args[i], base=val) if is_desc else val
        return args

    def _normal(self, grid, values):
        args = self._bind(values)
        compiled = self.compiled = self.kernel[grid](*args, **self._options)
        if not self._tried_direct:
            self._tried_direct = True
            self._direct = self._make_direct(compiled, args)
        return None

    # -- direct path ----------------------------------------------------------------------------------------
    def _make_direct(self, compiled, args):
        """The direct launch of `compiled` (what the normal path just ran), or None where unsupported."""
        if not isinstance(self.kernel, JITFunction) or self.kernel.pre_run_hooks or compiled is None:
            return None
        if hasattr(compiled, "result"):  # async compilation
            compiled = compiled.result()
        try:
            from triton.runtime import driver
        except ImportError:
            return None
        run = compiled.run  # the launcher object (handles are loaded by now)
        if getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1):
            return None  # CudaLauncher allocates scratch per launch: leave it the normal path
        signature = list(compiled.src.signature.values())
        if len(signature) != len(args):
            return None
        attrs = compiled.src.attrs
        n_desc = sum(isinstance(s, str) and s.startswith("tensordesc") for s in signature)
        raw = launcher_raw.raw_launch(run, n_desc)  # the C entry, descriptor metadata, call of this triton version
        if raw is None:
            return None

        # per varying value: its position in the expanded argument list, the alignment mask (15: the kernel
        # assumes 16-byte alignment, 0: any pointer, -1: a scalar), the tensor-map cache of a descriptor
        varying = dict(zip(self._varying, range(len(self._varying))))
        n = len(self._varying)
        template, positions, masks, tmaps = [], [0] * n, [-1] * n, [None] * n
        metas = iter(raw.metas)
        for i, (ty, val) in enumerate(zip(signature, args)):
            name = self._names[i]
            if isinstance(ty, tuple):  # a tuple: its pointers vary, the rest is frozen
                items = list(val)
                for k, (ty_k, val_k) in enumerate(zip(ty, val)):
                    j = varying.get((i, k))
                    is_ptr = isinstance(ty_k, str) and ty_k.startswith("*")
                    if j is None and (is_ptr or isinstance(ty_k, tuple)):
                        raise ValueError(f"KernelLauncher: {name!r}[{k}] ({ty_k}) must be a varying pointer "
                                         "(nested tuples are not replayed)")
                    if j is not None:
                        if not is_ptr:
                            raise ValueError(f"KernelLauncher: {name!r}[{k}] ({ty_k}) cannot be varying: only "
                                             "pointers vary inside a tuple")
                        positions[j] = (len(template), k)
                        masks[j] = 15 if attrs.get((i, k)) else 0  # tt.divisibility 16
                        items[k] = val_k.data_ptr()
                template.append(tuple(items))
                continue
            is_ptr = isinstance(ty, str) and ty.startswith("*")
            is_desc = isinstance(ty, str) and ty.startswith("tensordesc")
            if (i, -1) not in varying:
                if is_ptr or is_desc:
                    raise ValueError(f"KernelLauncher: pointer/descriptor parameter {name!r} must be varying")
                template.append(val)
                continue
            j = varying[(i, -1)]
            positions[j] = len(template)
            if is_ptr:
                masks[j] = 15 if attrs.get((i,)) else 0  # tt.divisibility 16
                template.append(val.data_ptr())
            elif is_desc:
                meta = next(metas)
                pieces = raw.pieces(val, meta)  # [map or base, *shape, *strides (, ...)]
                masks[j] = 15  # descriptors need a 16-byte aligned base
                if meta is None:  # not lowered to a TMA map: base pointer, then shape/strides
                    pieces[0] = val.base.data_ptr()
                else:
                    tmaps[j] = _TensorMaps(_without_base(val), meta, raw.pieces)
                    tmaps[j][val.base.data_ptr()] = pieces[0]
                template.extend(pieces)
            elif ty == "constexpr" or not isinstance(ty, str) or ty[0] in "iu" and ty != "u1":
                raise ValueError(f"KernelLauncher: parameter {name!r} ({ty}) is specialized by Triton; it "
                                 f"cannot be varying")
            else:  # fp16/bf16/fp32/fp64/u1: passed as they are
                template.append(val)

        d = _Direct()
        d.raw, d.consts, d.call = raw.entry, raw.consts, raw.call
        d.function, d.packed = compiled.function, compiled.packed_metadata
        d.coop, d.pdl = run.launch_cooperative_grid, run.launch_pdl
        active = driver.active
        d.get_device = active.get_current_device
        if d.get_device is torch.cuda.current_device:
            d.get_device = getattr(torch._C, "_cuda_getDevice", d.get_device)  # the same, minus the lazy init
        d.get_stream = active.get_current_stream
        d.device = d.get_device()
        d.template, d.positions, d.masks, d.tmaps = template, tuple(positions), tuple(masks), tuple(tmaps)
        d.replay = _replay_function(d, self._encode)
        return d

    @staticmethod
    def _encode(tmaps, base, ptr):
        """The tensor map of the example descriptor moved to `base`, kept per base pointer: the map holds
        only the address, shape, strides, box, dtype and swizzle, so one address always gives the same map."""
        if len(tmaps) >= _TMAP_CACHE_SIZE:
            tmaps.clear()
        tmap = tmaps[ptr] = tmaps.pieces(dataclasses.replace(tmaps.desc, base=base), tmaps.meta)[0]
        return tmap


def _replay_function(d, encode):
    """replay(x, y, z, *values) -> bool: the C launch of `d` (a _Direct) with these values of the varying
    parameters, generated as straight-line code (one statement per value, the frozen arguments as constants; a loop
    over the template cost ~2x the host time, scripts/host_overhead.py --cpu). False, with nothing launched, when
    a pointer lost the 16-byte alignment the kernel assumed."""
    env = {"raw": d.raw, "function": d.function, "packed": d.packed, "coop": d.coop, "pdl": d.pdl,
           "device": d.device, "get_stream": d.get_stream, "encode": encode, **d.consts}
    exprs, body = [], []
    for i, x in enumerate(d.template):  # frozen arguments (tuples element by element: their pointers vary)
        if type(x) is tuple:
            exprs.append([])
            for k, y in enumerate(x):
                env[f"c{i}_{k}"] = y
                exprs[-1].append(f"c{i}_{k}")
        else:
            env[f"c{i}"] = x
            exprs.append(f"c{i}")
    for j, (pos, mask, tmaps) in enumerate(zip(d.positions, d.masks, d.tmaps)):
        value = f"v{j}"
        if mask >= 0:  # a pointer or a descriptor's base
            body.append(f"p{j} = v{j}.data_ptr()")
            if mask:
                body.append(f"if p{j} & {mask}: return False")
            value = f"p{j}"
            if tmaps is not None:
                env[f"tm{j}"] = tmaps
                body += [f"t{j} = tm{j}.get(p{j})", f"if t{j} is None: t{j} = encode(tm{j}, v{j}, p{j})"]
                value = f"t{j}"
        if type(pos) is int:
            exprs[pos] = value
        else:
            exprs[pos[0]][pos[1]] = value
    args = [(f"({', '.join(e)},)" if e else "()") if type(e) is list else e for e in exprs]
    values = "".join(f", v{j}" for j in range(len(d.positions)))
    src = "\n    ".join([f"def replay(gx, gy, gz{values}):", *body, d.call(args), "return True"])
    exec(compile(src, "<tileattn.launcher replay>", "exec"), env)  # noqa: S102 - code built from this function's strings
    return env["replay"]


class _TensorMaps(dict):
    """Encoded tensor maps of one descriptor parameter, by base pointer, with the example descriptor, its metadata
    and the version's make_tensordesc_arg (launcher_raw.RawLaunch.pieces)."""

    def __init__(self, desc, meta, pieces):
        super().__init__()
        self.desc, self.meta, self.pieces = desc, meta, pieces


_CACHED = {}  # (kernel, frozen values, tensor dtypes, options, device) -> KernelLauncher, least recent first
_CACHED_MAX = 256


def launch_cached(kernel, grid, args, kwargs):
    """`kernel[grid](*args, **kwargs)` through a KernelLauncher kept per specialization: every tensor and
    host tensor descriptor argument varies (a descriptor by its base tensor), every other argument (and the
    tensors' dtypes, the descriptors' shapes, strides, boxes and layouts, the launch options, the device) keys
    the cache. For kernels called with positional tensors, descriptors, plain scalars and flat tuples of
    tensors and scalars (their tensors vary, their other elements key the cache).
    Returns (the launcher, the tensors it varies: tensor arguments, descriptor bases and the tensors in tuples,
    in argument order),
    so that a caller's own plan can replay `launcher(grid, *tensors)` with the same frozen arguments."""
    pos, tensors, frozen = [], [], []
    for i, a in enumerate(args):  # one pass, plain scalars first: this runs per launch (host time)
        if type(a) in _PLAIN:
            frozen.append(a)
        elif isinstance(a, torch.Tensor):
            pos.append(i)
            tensors.append(a)
            frozen.append(None)
        elif _is_descriptor(a):
            pos.append(i)
            tensors.append(a.base)
            frozen.append(_desc_key(a))
        elif type(a) is tuple:  # its tensors vary, the rest keys
            items = []
            for k, x in enumerate(a):
                if isinstance(x, torch.Tensor):
                    pos.append((i, k))
                    tensors.append(x)
                    items.append(None)
                else:
                    items.append(x)
            frozen.append(("tuple", *items))
        else:
            frozen.append(a)
    key = (kernel, tuple(frozen), tuple(t.dtype for t in tensors), tuple(kwargs.items()),
           tensors[0].device if tensors else None)
    launcher = _CACHED.pop(key, None)
    if launcher is None:
        names = list(inspect.signature(kernel.fn).parameters)
        launcher = KernelLauncher(kernel, args, kwargs,
                                  varying=[names[i] if type(i) is int else (names[i[0]], i[1]) for i in pos])
    _CACHED[key] = launcher  # most recent last
    while len(_CACHED) > _CACHED_MAX:
        _CACHED.pop(next(iter(_CACHED)))
    launcher(grid, *tensors)
    return launcher, tensors


_PLAIN = (int, float, bool, type(None), str)


class Address:
    """A pointer into an allocation, passed where a kernel takes a tensor (Triton's launchers read data_ptr() and
    dtype): a plan's buffers carved from one allocation cost no view each (a slice and a view cost as much host
    time as an allocation, ~5 us on the H100 machines' host, docs/design/backward.md, the eighth round). The
    caller keeps the allocation alive until the launches are queued, on the stream it was allocated on."""
    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr, dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self):
        return self.ptr


class PlanCache:
    """The on / off switch of a module's launch plans (ops/dense/plans.py, ops/flex/plans.py): `on` while calls
    keep and replay their plans; `uncached()` turns it off within a block, where every call makes a fresh plan,
    keeps none and launches through Triton's normal path (tests compare it with the replayed launches)."""

    def __init__(self):
        self.on = True

    @contextlib.contextmanager
    def uncached(self):
        self.on = False
        try:
            yield
        finally:
            self.on = True


def launch_kept(kept, name, grid, tensors, build):
    """A caller-kept launch: `kept[name]` (a KernelLauncher) replays on `tensors` (the kernel's tensor arguments,
    descriptors by their base, in argument order); when absent, `build()` -> (kernel, args, kwargs) goes through
    launch_cached once, and the launcher is kept after checking that `tensors` are its varying tensors (same
    objects, same order). The caller owns the key under which `kept` stays valid: every frozen argument (scalars,
    shapes, strides, dtypes, options) must be the same as the build's. Returns the launcher."""
    launcher = kept.get(name)
    if launcher is not None:
        launcher(grid, *tensors)
        return launcher
    kernel, args, kwargs = build()
    launcher, varying = launch_cached(kernel, grid, args, kwargs)
    if len(varying) != len(tensors) or any(a is not b for a, b in zip(varying, tensors)):
        raise RuntimeError(f"launch_kept({name!r}): the caller's tensor order differs from the kernel's tensor "
                           "arguments")
    kept[name] = launcher
    return launcher


def launch_built(kept, name, tensors, build):
    """A caller-kept launch whose arguments cost host time to build (descriptors): `kept[name]` (a launcher and
    its grid) replays on `tensors` (as launch_kept takes them); when absent, build() -> (kernel, grid, args,
    kwargs) runs once and goes through launch_kept. The caller owns the key under which `kept` stays valid."""
    entry = kept.get(name)
    if entry is not None:
        entry[0](entry[1], *tensors)
        return
    kernel, grid, args, kwargs = build()
    kept[name] = (launch_kept({}, name, grid, tensors, lambda: (kernel, args, kwargs)), grid)


def launch_args(kept, name, kernel, grid, args, kwargs):
    """A caller-kept launch whose arguments are built on every call: `kept[name]` replays on the tensors among
    `args` (tensor arguments and the tensors in tuple arguments, in order); when absent, the call goes through
    launch_cached and its launcher is kept. For kernels without descriptor arguments (a descriptor costs more
    host time to build than this saves: launch_kept takes the tensors as a list instead). The caller owns the
    key under which `kept` stays valid, as for launch_kept; kept None: launch_cached alone."""
    if kept is None:
        launch_cached(kernel, grid, args, kwargs)
        return
    launcher = kept.get(name)
    if launcher is None:
        kept[name] = launch_cached(kernel, grid, args, kwargs)[0]
        return
    tensors = []
    for a in args:
        if isinstance(a, torch.Tensor):
            tensors.append(a)
        elif type(a) is tuple:
            tensors += [x for x in a if isinstance(x, torch.Tensor)]
    launcher(grid, *tensors)


def _replace_item(t, k, x):
    """Tuple t with element k replaced by x."""
    return t[:k] + (x,) + t[k + 1:]


def _desc_key(desc):
    """What a descriptor's launcher keeps from its example: everything but the base tensor."""
    return ("desc", *(repr(getattr(desc, f.name)) for f in dataclasses.fields(desc) if f.name != "base"))
