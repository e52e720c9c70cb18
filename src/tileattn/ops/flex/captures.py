"""flex_attention's mods under torch.compile: what Dynamo's trace of a call takes from them.

Dynamo cannot run trace.py's torch.fx tracer over a mod, nor its cache key (both inspect Python objects in ways
it does not follow). So the host half of a mod, `mod_plan`, runs outside Dynamo's trace: it carries the mark of
torch._dynamo.assume_constant_result, so Dynamo calls it once per compile with the real function object and
takes its result as a constant:

    (digest, paths of each captured tensor, scalar checks, function paths)

digest names the traced mod (trace.spec_of: the registered op finds it there, custom_ops.py). A path says how
the mod reaches an object from the function: ("cell", i) the i-th closure cell, ("global", name) a global its
code names, ("item", i) an item of a tuple / list / dict, ("attr", name) an attribute (of an nn.Module, a
module or any other object: getattr, so __slots__ and properties too) whose name its code uses. A tensor
reached by several paths keeps them all: traced_mod checks they still lead to one tensor. The traced half,
`traced_mod`, runs inside Dynamo's trace and follows the paths (`follow`):
- the captured tensors: Dynamo sees them as graph inputs, so their values, and the tensors themselves (a new
  document-id tensor per batch), may change between calls without a recompile;
- the scalars the generated kernel code bakes in (numbers, strings, bools, dtypes): each is compared with its
  compile-time value, so Dynamo guards on it and another value recompiles;
- the functions the mod calls (composed mods): their code is guarded the same way.
Dynamo itself guards the mod's code. A mod must exist before the compiled call (defined at module level, made
in __init__ or by a factory such as tileattn.mods.alibi, or held by a BlockMask): Dynamo hands tileattn no
function object for a mod defined inside the compiled function, and traced_mod says so.

Not guarded: attributes of captured objects other than those on a path, and a closure cell of the same function
object rebound to a new value. The registry spec_of reads holds no captured tensor (trace.register).
"""
import dis
import math
import types

import torch

from .trace import FlexCompileError, compile_mod, register

_MAX_DEPTH = 6  # steps from the mod to an object it reads (compose_scores(alibi(slopes)): 3)
_SCALARS = (bool, int, float, str, torch.dtype, type(None))


_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR"})


def _names(code):
    """(global names, attribute names) a code object (and the code objects it holds: lambdas, comprehensions)
    loads: a global is looked up only under the first, an attribute only under the second, so that neither
    guards an unrelated object that shares a name."""
    gl, at = set(), set()
    for ins in dis.get_instructions(code):
        if ins.opname in _GLOBAL_OPS:
            gl.add(ins.argval)
        elif ins.opname in _ATTR_OPS:
            at.add(ins.argval)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            g, a = _names(c)
            gl |= g
            at |= a
    return gl, at


def _children(obj, names):
    """(step, child) for what a mod can read from obj: a function's closure cells and the globals its code names,
    the items of a tuple / list / dict, the attributes in `names` (the code's names) of an nn.Module or a plain
    object. Yields (step, child, names for the child's attributes)."""
    if isinstance(obj, types.FunctionType):
        own_globals, own = _names(obj.__code__)
        for i, cell in enumerate(obj.__closure__ or ()):
            try:
                yield ("cell", i), cell.cell_contents, own
            except ValueError:  # an empty cell
                continue
        for nm in sorted(own_globals):
            if nm in obj.__globals__:
                yield ("global", nm), obj.__globals__[nm], own
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            yield ("item", i), x, names
    elif isinstance(obj, dict):
        for k, x in obj.items():
            if type(k) in (str, int):
                yield ("item", k), x, names
    elif isinstance(obj, torch.nn.Module):
        for nm in sorted(names):
            for d in (obj._parameters, obj._buffers, obj._modules, obj.__dict__):
                if nm in d:
                    yield ("attr", nm), d[nm], names
                    break
    elif isinstance(obj, types.ModuleType):  # a module's numbers and tensors the code names (cfg.WINDOW)
        for nm in sorted(names):
            x = getattr(obj, nm, None)
            if isinstance(x, _SCALARS + (torch.Tensor,)) and x is not None:
                yield ("attr", nm), x, names
    elif not isinstance(obj, (type, torch.Tensor)):
        # any other object: the attributes the code names, through getattr (instance dicts, __slots__ and
        # properties alike), so that every number the kernel bakes in is guarded
        for nm in sorted(names):
            try:
                x = getattr(obj, nm)
            except Exception:  # noqa: BLE001 - no such attribute, or a property that raises
                continue
            yield ("attr", nm), x, names


def mod_plan(fn, kind, grad):
    """The host half of a mod under torch.compile (module docstring): (digest, tensor paths, scalar checks
    ((path, value), ...), function paths) of the real function fn. Traces it afresh (a recompile after a guard
    failed must not get a cached trace); with grad a score mod's derivative too, so that an operation without
    one raises at compile time."""
    spec = compile_mod(fn, kind, fresh=True)
    if grad and kind == "score":
        spec.grad_fn()
    register(spec)
    found = {id(t): [] for t in spec.captures}  # every path to each captured tensor (one tensor in two cells)
    scalars, functions, seen = [], [], {id(fn)}
    level = [((), fn, set())]
    for _ in range(_MAX_DEPTH):
        nxt = []
        for path, obj, names in level:
            for step, child, child_names in _children(obj, names):
                p = path + (step,)
                if isinstance(child, torch.Tensor):
                    if id(child) in found:
                        found[id(child)].append(p)
                elif isinstance(child, _SCALARS):
                    if not (isinstance(child, float) and math.isnan(child)):  # NaN != NaN: no guard to make
                        scalars.append((p, child))
                elif isinstance(child, type) or id(child) in seen:
                    continue
                else:
                    seen.add(id(child))
                    if isinstance(child, types.FunctionType):
                        functions.append(p)
                    nxt.append((p, child, child_names))
        level = nxt
    for t in spec.captures:
        if not found[id(t)]:
            raise FlexCompileError(
                f"{kind}_mod {getattr(fn, '__name__', fn)}: reads a captured {t.dtype} tensor of shape "
                f"{list(t.shape)} that tileattn cannot reach from the function under torch.compile (it follows "
                f"closure cells, the globals the code names, tuples / lists / dicts and attributes of nn.Modules "
                f"and plain objects held there, {_MAX_DEPTH} steps deep)")
    return spec.key, tuple(tuple(found[id(t)]) for t in spec.captures), tuple(scalars), tuple(functions)


# What torch._dynamo.assume_constant_result(mod_plan) sets (torch/_dynamo/decorators.py), without importing
# torch._dynamo (~0.8 s) for eager users; tests/flex/test_flex_compile.py checks the decorator still does this.
mod_plan._dynamo_marked_constant = True


def follow(obj, path):
    """The object at `path` (a mod_plan path) from obj."""
    for kind, arg in path:
        if kind == "cell":
            obj = obj.__closure__[arg].cell_contents
        elif kind == "global":
            obj = obj.__globals__[arg]
        elif kind == "attr":
            obj = getattr(obj, arg)
        else:
            obj = obj[arg]
    return obj


def traced_mod(fn, kind, grad):
    """The traced half of a mod under torch.compile (module docstring): (digest, captured tensors), with the
    guards on what the traced mod depends on."""
    try:
        fn.__closure__  # noqa: B018 - Dynamo raises AttributeError for a function made inside the compiled code
    except AttributeError:
        raise FlexCompileError(
            f"{kind}_mod: under torch.compile it must be a plain Python function made outside the compiled "
            f"function (at module level, in __init__, by a factory such as tileattn.mods.alibi): Dynamo gives "
            f"tileattn no function object for one defined inside it") from None
    digest, tensor_paths, scalars, functions = mod_plan(fn, kind, grad)
    for path, value in scalars:
        if follow(fn, path) != value:  # never true while tracing; the comparison makes Dynamo guard the value
            raise AssertionError(f"{kind}_mod: {path} changed while tracing")
    for path in functions:
        if not callable(follow(fn, path)):  # the same for a called function's code
            raise AssertionError(f"{kind}_mod: {path} changed while tracing")
    tensors = []
    for paths in tensor_paths:
        t = follow(fn, paths[0])
        for path in paths[1:]:  # one tensor reached two ways when traced: Dynamo guards that it still is
            if follow(fn, path) is not t:
                raise AssertionError(f"{kind}_mod: {path} changed while tracing")
        tensors.append(t)
    return digest, tensors
