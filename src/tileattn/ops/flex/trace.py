"""score_mod / mask_mod written in plain Python, turned into Triton functions.

A mod is traced once with torch.fx (its arguments become symbols), and the graph is written out as the source
of a `@triton.jit` function over tiles:

    score_mod(score, b, h, q_idx, kv_idx) -> score      mask_mod(b, h, q_idx, kv_idx) -> bool

`score` is the float32 [BLOCK_M, BLOCK_N] tile of scaled scores; b and h are scalars; q_idx [BLOCK_M, 1] and
kv_idx [1, BLOCK_N] int32; the generated function also takes the positions as float32 (q_idx_f, kv_idx_f), which
index differences that meet a float use (lowering.FloatIndex). What a mod may use: arithmetic and comparisons (+
- * / // % **, < <= > >= == !=, & | ^ ~, unary -), torch.where, abs / exp / exp2 / log / log2 / sqrt / rsqrt / sin
/ cos / tanh / sigmoid / minimum / maximum / clamp, casts (.to, .float(), .int(), .long()), Python numbers, and
captured tensors indexed by expressions (`bias[h, q_idx - kv_idx]`, `doc_ids[b, q_idx]`). A captured tensor
becomes a kernel argument (its values can change without a recompile); its indices are clamped into range, so a
mod can never read outside it. Anything else (control flow on the arguments, other torch functions) raises a
FlexCompileError naming the construct.

Integer // and % follow Python (floor) semantics as torch does; integers are int32 (int64 for captured int64
tensors' values).
"""
import collections
import copy
import functools
import hashlib
import linecache
import math
import operator
import types
import weakref

import torch
import torch.fx

from .lowering import _ARITH_NAMES, HELPERS, FloatIndex, _int_power, _whole


class FlexCompileError(ValueError):
    """A score_mod / mask_mod construct tileattn cannot compile."""


_BINARY = {
    operator.add: "({} + {})", operator.sub: "({} - {})", operator.mul: "({} * {})",
    operator.truediv: "_div({}, {})", operator.floordiv: "_floordiv({}, {})", operator.mod: "_mod({}, {})",
    operator.lt: "({} < {})", operator.le: "({} <= {})", operator.gt: "({} > {})", operator.ge: "({} >= {})",
    operator.eq: "({} == {})", operator.ne: "({} != {})", operator.and_: "({} & {})", operator.or_: "({} | {})",
    operator.xor: "({} ^ {})", operator.pow: "_pow({}, {})",
}
_UNARY = {
    operator.neg: "(-{})", operator.invert: "_invert({})", operator.abs: "tl.abs({})", operator.pos: "{}",
}
# torch functions / tensor methods by name
_FUNCS = {
    "abs": "tl.abs({})", "exp": "tl.exp({})", "exp2": "tl.exp2({})", "log": "tl.log({})", "log2": "tl.log2({})",
    "sqrt": "tl.sqrt({})", "rsqrt": "tl.rsqrt({})", "sin": "tl.sin({})", "cos": "tl.cos({})",
    "tanh": "_tanh({})", "sigmoid": "_sigmoid({})", "neg": "(-{})", "logical_not": "_invert({})",
    "float": "({}).to(tl.float32)", "int": "({}).to(tl.int32)", "long": "({}).to(tl.int64)",
    "bool": "(({}) != 0)",
}
_FUNCS2 = {
    "add": _BINARY[operator.add], "sub": _BINARY[operator.sub], "mul": _BINARY[operator.mul],
    "div": _BINARY[operator.truediv], "true_divide": _BINARY[operator.truediv],
    "floor_divide": _BINARY[operator.floordiv], "remainder": _BINARY[operator.mod],
    "minimum": "tl.minimum({}, {})", "maximum": "tl.maximum({}, {})", "logical_and": "({} & {})",
    "logical_or": "({} | {})", "lt": "({} < {})", "le": "({} <= {})", "gt": "({} > {})", "ge": "({} >= {})",
    "eq": "({} == {})", "ne": "({} != {})", "pow": "_pow({}, {})", "bitwise_and": "({} & {})",
    "bitwise_or": "({} | {})",
}
_DTYPES = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16",
           torch.int32: "tl.int32", torch.int64: "tl.int64", torch.bool: "tl.int1", torch.float64: "tl.float32"}



class ModSpec:
    """A traced mod: `fn` (the @triton.jit function, taking the mod's arguments and a tuple of captures),
    `captures` (the tensors it reads, in argument order), `source` (the generated text), `gm` (the fx graph,
    its tensors replaced by meta tensors of the same dims and dtypes) and `key` (a digest of source and graph:
    two mods with one forward source but different derivatives, clamp and maximum, get two keys).
    `gluon_fn()` is the same function for Gluon kernels (@gluon.jit, gl.* for tl.*), `grad_fn()` its
    derivative for the backward pass; both made on first use.

    A captured tensor that the mod's function holds itself (the objects its cache key names by identity) is
    held weakly: the cache never keeps a user's tensor alive (compile_mod)."""

    def __init__(self, captures, source, kind, gm, weak_ids=()):
        self.source, self.kind = source, kind
        self.src_digest = hashlib.sha1(source.encode()).hexdigest()[:16]
        self.fn = _define(source, kind, self.src_digest)
        self.key = hashlib.sha1((source + "\n" + gm.code).encode()).hexdigest()[:16]
        self._captures = tuple(weakref.ref(t) if id(t) in weak_ids else (lambda t=t: t) for t in captures)
        self._narrow = tuple(span(t) < 2 ** 31 for t in captures)  # indexed in int32 (_Writer.index)
        self.gm = _meta_constants(gm)
        self._grad = None

    @property
    def captures(self):
        caps = tuple(r() for r in self._captures)
        if any(t is None for t in caps):  # compile_mod evicts a spec when one dies; a caller kept this one
            raise RuntimeError(f"tileattn flex: a tensor captured by this {self.kind}_mod was freed")
        return caps

    def grad_fn(self, gluon=False):
        """A score mod's @triton.jit function (gluon: @gluon.jit) returning (value, d value / d score), same
        arguments and captures (made on first use; FlexCompileError names an operation it cannot
        differentiate)."""
        if self._grad is None:
            src, caps = _emit(self.gm, self.kind, f"{self.kind}_mod (backward)", grad=True)
            assert len(caps) == len(self._captures)
            self._grad = (src, hashlib.sha1(src.encode()).hexdigest()[:16])
        src, digest = self._grad
        return _define(src, self.kind + "-grad", digest, gluon=gluon)

    def gluon_fn(self):
        return _define(self.source, self.kind, self.src_digest, gluon=True)

    def check_captures(self, tensors):
        """Raises ValueError where a tensor passed for a capture (the registered op's: same shape, maybe other
        strides) has offsets past the int32 arithmetic the mod was generated with."""
        for i, (t, narrow) in enumerate(zip(tensors, self._narrow)):
            if narrow and span(t) >= 2 ** 31:
                raise ValueError(f"tileattn flex: the {self.kind}_mod's captured tensor {i} {tuple(t.shape)} has "
                                 f"strides {t.stride()}, offsets past 2^31 where the traced one's fit int32: pass "
                                 f"a contiguous tensor")

    def detached(self):
        """A copy that holds no captured tensor (for the registry: the registered op passes its own)."""
        r = copy.copy(self)
        r._captures = tuple((lambda: None) for _ in self._captures)
        return r


def _meta_constants(gm):
    """gm with every tensor attribute replaced by a meta tensor of the same shape and dtype (one per distinct
    tensor, so that aliases stay aliases): what code generation reads, without holding the user's tensors."""
    metas = {}  # id -> (the tensor, kept so that its id stays its own while we replace, its meta copy)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target)
            if isinstance(t, torch.Tensor) and not t.is_meta:
                m = metas.setdefault(id(t), (t, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                                   device="meta")))[1]
                setattr(gm, n.target, m)
    return gm


def span(t):
    """The largest element offset of tensor t (its index arithmetic fits int32 below 2^31)."""
    return sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)


def capture_args(tensors):
    """A mod's captured tensors (ModSpec.captures, or tensors of the same dims and dtypes in their place: the
    registered op's) as kernel arguments: per tensor its pointer, then its sizes and strides."""
    args = []
    for t in tensors:
        args += [t, *t.shape, *t.stride()]
    return tuple(args)


def spec_of(digest):
    """The ModSpec traced in this process whose source has this digest (ModSpec.key), as the registered op
    names a mod (custom_ops.py)."""
    spec = _SPECS.get(digest)
    if spec is None:
        raise RuntimeError(f"tileattn flex: no mod with digest {digest} was traced in this process. The registry "
                           f"of traced mods is per process: the registered op's mods are traced when Dynamo "
                           f"traces the flex_attention call, so a graph exported or compiled ahead of time "
                           f"(torch.export, AOTInductor) and loaded in another process cannot run them")
    return spec


def register(spec):
    """Makes spec known to spec_of (captures.mod_plan, once per compile). The registry's copy holds no captured
    tensor: the registered op passes its own."""
    _SPECS.setdefault(spec.key, spec.detached())


def _define(src_fn, kind, digest, gluon=False):
    """The jit function of a generated mod source (cached per source and flavour)."""
    jit = _FUNCTIONS.get((digest, gluon))
    if jit is not None:
        return jit
    source = f"import triton\nimport triton.language as tl\n{HELPERS}\n\n{src_fn}"
    if gluon:
        source = (source.replace("import triton.language as tl", "from triton.experimental import gluon\n"
                                 "from triton.experimental.gluon import language as tl")
                  .replace("@triton.jit", "@gluon.jit"))
    fname = f"<tileattn-flex-{kind}-{digest}{'-gluon' if gluon else ''}>"
    linecache.cache[fname] = (len(source), None, source.splitlines(True), fname)
    ns = {"__name__": f"tileattn_flex_{kind}_{digest}{'_gluon' if gluon else ''}"}  # the compiler needs a module
    exec(compile(source, fname, "exec"), ns)
    jit = _FUNCTIONS[(digest, gluon)] = ns["mod"]
    return jit


def _literal(x, name):
    if isinstance(x, bool):
        return "True" if x else "False"
    if isinstance(x, int):
        return repr(x)
    if isinstance(x, float):
        if math.isinf(x):
            return 'float("inf")' if x > 0 else 'float("-inf")'
        if math.isnan(x):
            return 'float("nan")'
        return repr(x)
    raise FlexCompileError(f"{name}: cannot compile the constant {x!r} ({type(x).__name__})")


_LN2 = "0.6931471805599453"
_NON_DIFF = {operator.floordiv, operator.mod, operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
             operator.ne, operator.and_, operator.or_, operator.xor, operator.invert, operator.getitem}
def op_needs_y(n):
    """Whether a node's second argument is a value its derivative uses (not a dtype, shape or bound)."""
    name = n.target if n.op == "call_method" else getattr(n.target, "__name__", None)
    return len(n.args) > 1 and (n.target in (operator.mul, operator.truediv, operator.pow) or
                                name in ("mul", "div", "true_divide", "pow", "minimum", "maximum"))


_NON_DIFF_NAMES = {"floor_divide", "remainder", "lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or",
                   "logical_not", "bitwise_and", "bitwise_or", "int", "long", "bool", "__getitem__", "new_ones",
                   "new_zeros"}


class _Writer(FloatIndex):
    """Writes a traced mod's graph as lines of Triton code. With grad, every value that depends on the first
    argument (score) also gets its derivative with respect to it (forward mode), for the backward pass."""

    def __init__(self, gm, name, arg_names, grad=False):
        self.gm, self.name, self.arg_names, self.grad = gm, name, arg_names, grad
        self.lines, self.vars, self.captures, self.tans = [], {}, [], {}
        self.floats = set()  # nodes whose value is a float32 tensor (where that is known)
        self.low = set()  # nodes whose value is float16 / bfloat16
        self.fidx = {}  # node -> float32 expression of an index difference (FloatIndex.note_types)

    def ref(self, a):
        if isinstance(a, torch.fx.Node):
            if a not in self.vars:
                raise FlexCompileError(f"{self.name}: {a.op} {a.target} is used where a value was expected")
            return self.vars[a]
        return _literal(a, self.name)

    def capture(self, node):
        t = getattr(self.gm, node.target)
        if not isinstance(t, torch.Tensor):
            raise FlexCompileError(f"{self.name}: captured {type(t).__name__} {node.target} is not a tensor")
        if t.dtype not in _DTYPES or t.dtype == torch.float64:
            raise FlexCompileError(f"{self.name}: captured tensor of dtype {t.dtype} (use float32/16, int32/64 "
                                   f"or bool)")
        if t.numel() == 0:  # (the kernel clamps indices into range: an empty tensor has none)
            raise FlexCompileError(f"{self.name}: captured tensor {node.target} of shape {tuple(t.shape)} is empty: "
                                   f"there is no element to read")
        for i, c in enumerate(self.captures):
            if c is t:
                return i
        self.captures.append(t)
        return len(self.captures) - 1

    def index(self, node, tensor_node, idx):
        if not (isinstance(tensor_node, torch.fx.Node) and tensor_node.op == "get_attr"):
            raise FlexCompileError(f"{self.name}: indexing is supported on captured tensors only")
        i = self.capture(tensor_node)
        t = self.captures[i]
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != t.dim() or any(x is None or x is Ellipsis or isinstance(x, slice) for x in idx):
            raise FlexCompileError(f"{self.name}: a captured tensor of {t.dim()} dims must be indexed by "
                                   f"{t.dim()} scalar expressions (no slices, None or ...), got {len(idx)}")
        v = f"c{i}"
        if span(t) < 2 ** 31:  # offsets in int32 (clamped in the index's own type first; ModSpec.check_captures)
            off = " + ".join(f"tl.minimum(tl.maximum({self.ref(x)}, 0), {v}_n{k} - 1).to(tl.int32) * {v}_s{k}"
                             for k, x in enumerate(idx)) or "0"
        else:
            off = " + ".join(f"tl.minimum(tl.maximum(({self.ref(x)}).to(tl.int64), 0), {v}_n{k} - 1) * {v}_s{k}"
                             for k, x in enumerate(idx)) or "0"
        load = f"tl.load({v}_ptr + {off})"
        if t.dtype == torch.bool:
            load = f"({load} != 0)"
        return load

    def node(self, n):
        args = n.args
        if n.op == "get_attr":
            return None  # a captured tensor: used through indexing only
        if n.op == "call_function" and n.target in (operator.getitem, ) or (
                n.op == "call_method" and n.target == "__getitem__"):
            return self.index(n, args[0], args[1])
        if (n.target is operator.pow or (n.op == "call_method" and n.target == "pow")) and _whole(args[1]):
            return _int_power(self.ref(args[0]), args[1])
        if n.op == "call_function" and n.target in _BINARY:
            return _BINARY[n.target].format(*self._arith_refs(args, div=n.target is operator.truediv))
        if n.op == "call_function" and n.target in _UNARY:
            return _UNARY[n.target].format(self.ref(args[0]))
        name = None
        if n.op == "call_function" and getattr(n.target, "__module__", None) in ("torch", "torch._C._VariableFunctions",
                                                                                  None):
            name = getattr(n.target, "__name__", None)
        elif n.op == "call_method":
            name = n.target
        if name is None:
            raise FlexCompileError(f"{self.name}: cannot compile {n.op} {n.target}")
        if n.kwargs and name not in ("to", "clamp", "where", "new_ones", "new_zeros"):
            raise FlexCompileError(f"{self.name}: keyword arguments to {name} are not supported")
        if name in ("new_ones", "new_zeros") and len(args) == 2 and tuple(args[1]) == ():
            one = name == "new_ones"
            return ("True" if one else "False") if n.kwargs.get("dtype") == torch.bool else ("1" if one else "0")
        if name == "where" and len(args) == 3:
            return f"tl.where({self.ref(args[0])}, {self.ref(args[1])}, {self.ref(args[2])})"
        if name == "clamp" or name == "clip":
            lo = n.kwargs.get("min", args[1] if len(args) > 1 else None)
            hi = n.kwargs.get("max", args[2] if len(args) > 2 else None)
            x = self.ref(args[0])
            if lo is not None:
                x = f"tl.maximum({x}, {self.ref(lo)})"
            if hi is not None:
                x = f"tl.minimum({x}, {self.ref(hi)})"
            return x
        if name == "to":
            dt = n.kwargs.get("dtype", args[1] if len(args) > 1 else None)
            if dt not in _DTYPES:
                raise FlexCompileError(f"{self.name}: .to({dt!r}) is not supported (pass a torch dtype)")
            if dt == torch.bool:
                return f"(({self.ref(args[0])}) != 0)"
            if dt == torch.float32 and args[0] in self.fidx:
                return self.fidx[args[0]]
            return f"({self.ref(args[0])}).to({_DTYPES[dt]})"
        if name in _FUNCS and len(args) == 1:
            if name == "float" and args[0] in self.fidx:
                return self.fidx[args[0]]
            return _FUNCS[name].format(self.ref(args[0]))
        if name in _FUNCS2 and len(args) == 2:
            return _FUNCS2[name].format(*(self._arith_refs(args, div=name in ("div", "true_divide"))
                                          if name in _ARITH_NAMES else
                                          (self.ref(args[0]), self.ref(args[1]))))
        raise FlexCompileError(f"{self.name}: cannot compile {name}() with {len(args)} arguments")

    def tan(self, a):
        """The derivative of argument a with respect to score (a variable or a literal), None where it is 0."""
        return self.tans.get(a) if isinstance(a, torch.fx.Node) else None

    def tangent(self, n, v):
        """The expression of d(node n) / d(score) given n's value variable v; None where it is 0."""
        args = [a for a in n.args if isinstance(a, torch.fx.Node)] + \
            [a for a in n.kwargs.values() if isinstance(a, torch.fx.Node)]
        if not any(self.tan(a) is not None for a in args):
            return None
        name = n.target if n.op == "call_method" else getattr(n.target, "__name__", None)
        if n.target in _NON_DIFF or name in _NON_DIFF_NAMES:
            return None  # piecewise constant in score: derivative 0 almost everywhere
        a = n.args
        ta = self.tan(a[0]) if a else None
        tb = self.tan(a[1]) if len(a) > 1 else None
        x = self.ref(a[0]) if a else None
        y = self.ref(a[1]) if op_needs_y(n) else None

        def lin(sign):
            if tb is None:
                return ta
            if ta is None:
                return f"({sign}{tb})"
            return f"({ta} {sign} {tb})"
        op = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
              operator.neg: "neg", operator.pos: "pos", operator.abs: "abs", operator.pow: "pow"}.get(n.target, name)
        if op == "add":
            return lin("+")
        if op == "sub":
            return lin("-")
        if op == "mul":
            terms = ([f"{ta} * {y}"] if ta is not None else []) + ([f"{x} * {tb}"] if tb is not None else [])
            return "(" + " + ".join(terms) + ")"
        if op in ("div", "true_divide"):
            terms = ([f"{ta} / {y}"] if ta is not None else []) + ([f"- {v} * {tb} / {y}"] if tb is not None else [])
            return "(" + " ".join(terms) + ")"
        if op == "neg":
            return f"(-{ta})"
        if op in ("pos", "float"):
            return ta
        if op == "to":
            dt = n.kwargs.get("dtype", a[1] if len(a) > 1 else None)
            return ta if dt in (torch.float32, torch.float16, torch.bfloat16, torch.float64) else None
        if op == "abs":
            return f"tl.where({x} >= 0, {ta}, -({ta}))"
        rules = {"tanh": f"{ta} * (1.0 - {v} * {v})", "exp": f"{ta} * {v}", "exp2": f"{ta} * {v} * {_LN2}",
                 "log": f"{ta} / {x}", "log2": f"{ta} / ({x} * {_LN2})", "sqrt": f"{ta} * 0.5 / {v}",
                 "rsqrt": f"{ta} * -0.5 * {v} / {x}", "sin": f"{ta} * tl.cos({x})", "cos": f"-{ta} * tl.sin({x})",
                 "sigmoid": f"{ta} * {v} * (1.0 - {v})"}
        if op in rules and len(a) == 1:
            return f"({rules[op]})"
        if op in ("minimum", "maximum"):
            cmp = "<=" if op == "minimum" else ">="
            return f"tl.where({x} {cmp} {y}, {ta or '0.0'}, {tb or '0.0'})"
        if op == "where":
            tx, ty = self.tan(a[1]), self.tan(a[2])
            return f"tl.where({self.ref(a[0])}, {tx or '0.0'}, {ty or '0.0'})"
        if op in ("clamp", "clip") and all(self.tan(b) is None for b in list(a[1:]) + list(n.kwargs.values())):
            return f"tl.where({v} == {x}, {ta}, 0.0)"
        if op == "pow" and tb is None and not isinstance(a[1], torch.fx.Node):
            lower = _int_power(x, a[1] - 1) if _whole(a[1] - 1) else f"_pow({x}, {y} - 1)"  # as the forward
            return f"({ta} * {y} * {lower})"
        raise FlexCompileError(f"{self.name}: cannot differentiate {name or n.target} with respect to the score "
                               f"(the backward pass needs it); express the mod with +, -, *, /, where, tanh, exp, "
                               f"log, sqrt, sigmoid, abs, minimum / maximum / clamp or a constant power")

    def write(self):
        out = None
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                self.vars[n] = self.arg_names[len(self.vars)]
                if self.vars[n] == "score":
                    self.floats.add(n)
                if self.grad and len(self.vars) == 1:
                    self.tans[n] = "1.0"
            elif n.op == "output":
                out = n.args[0]
            else:
                expr = self.node(n)
                if expr is not None:
                    v = f"v{len(self.lines)}"
                    self.lines.append(f"    {v} = {expr}")
                    self.vars[n] = v
                    self.note_types(n)
                    if self.grad:
                        t = self.tangent(n, v)
                        if t is not None:
                            self.tans[n] = f"t{len(self.lines)}"
                            self.lines.append(f"    {self.tans[n]} = {t}")
        if isinstance(out, (tuple, list)):
            raise FlexCompileError(f"{self.name}: must return one value, not a {type(out).__name__}")
        return self.ref(out)


@functools.lru_cache(maxsize=1024)
def _code_names(code):
    """Every name a code object (and the code objects it holds) uses: globals and attributes."""
    names = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_names"):
            names |= _code_names(c)
    return frozenset(names)


def _closure_key(fn, objs, depth=0):
    """What a cached trace depends on besides the code: the objects the closure and the globals it names
    hold (by identity for tensors, by value for numbers; functions it calls, such as composed mods, by their
    own key; the attributes the code names of other objects, nn.Modules and modules by the same rules, so that
    `self.bias = new` or `cfg.WINDOW = 64` is a new key). Appends the objects named by identity to objs."""
    names = _code_names(fn.__code__)

    def k(x, d):
        if isinstance(x, (int, float, bool, str)) or x is None:
            return (type(x).__name__, x)
        if d < 4 and hasattr(x, "__code__") and hasattr(x, "__closure__"):
            return _closure_key(x, objs, d + 1)
        if d < 4 and isinstance(x, (tuple, list)):
            return tuple(k(y, d + 1) for y in x)
        if isinstance(x, type(torch)):  # a module: its numbers and tensors the code names
            return ("module", id(x), tuple((nm, k(v, d + 1)) for nm in sorted(names)
                                           for v in [getattr(x, nm, None)]
                                           if isinstance(v, (int, float, bool, str, torch.Tensor))))
        objs.append(x)
        if d < 4 and not isinstance(x, (torch.Tensor, type, torch.dtype)):
            attrs = []
            for nm in sorted(names):
                try:
                    v = getattr(x, nm)
                except Exception:  # noqa: BLE001 - no such attribute, or a property that raises
                    continue
                if not callable(v) or isinstance(v, types.FunctionType):  # not methods: their code is fixed
                    attrs.append((nm, k(v, d + 1)))
            return ("id", id(x), tuple(attrs))
        return ("id", id(x))
    cells = tuple(k(c.cell_contents, depth) for c in (fn.__closure__ or ()))
    g = getattr(fn, "__globals__", {})
    glob = tuple((nm, k(g[nm], depth)) for nm in fn.__code__.co_names if nm in g and not callable(g[nm]))
    return (fn.__code__, cells, glob, fn.__defaults__)


_TRACES = collections.OrderedDict()  # closure key -> (ModSpec, pins, finalizers), least recent first. An object
# the key names by identity is watched (weakref.finalize): the entry goes when it dies, so that no new object
# reuses its id for a stale trace, and the cache keeps no user object alive. pins: those that take no weakref.
_MAX_TRACES = 256
_FUNCTIONS = {}  # (source hash, gluon) -> the jit function (one compile per distinct mod source)
_SPECS = {}  # ModSpec.key -> ModSpec, for the registered ops (spec_of; filled by captures.mod_plan only)


def _emit(gm, kind, name, grad):
    """(source of the jit function `mod`, captured tensors) of a traced mod. grad (score mods): `mod` returns
    (score_mod's value, its derivative with respect to score)."""
    arg_names = (["score"] if kind == "score" else []) + ["b", "h", "q_idx", "kv_idx"]
    w = _Writer(gm, name, arg_names, grad=grad)
    result = w.write()
    if kind == "mask":
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        if isinstance(out, float) or (isinstance(out, torch.fx.Node) and (out in w.floats or out in w.low)):
            # (known floats only: the tracer does not type every value, so others are read as != 0)
            raise FlexCompileError(f"{name}: must return a bool tensor (True: the key is visible), got a "
                                   f"floating-point value; compare it instead (e.g. `x > 0`)")
        result = f"(({result}) != 0)"
    else:
        result = f"({result}).to(tl.float32)"
    if grad:
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        result = f"{result}, {w.tan(out) or '0.0'}"
    unpack = []
    for i, t in enumerate(w.captures):
        names = [f"c{i}_ptr"] + [f"c{i}_n{k}" for k in range(t.dim())] + [f"c{i}_s{k}" for k in range(t.dim())]
        base = sum(1 + 2 * c.dim() for c in w.captures[:i])
        unpack += [f"    {nm} = caps[{base + j}]" for j, nm in enumerate(names)]
    params = ", ".join(arg_names + ["q_idx_f", "kv_idx_f"])
    body = "\n".join(unpack + w.lines + [f"    return {result}"])
    return f"@triton.jit\ndef mod({params}, caps):\n{body}\n", tuple(w.captures)


def compile_mod(fn, kind, fresh=False):
    """The ModSpec of a score_mod (kind "score") or mask_mod (kind "mask"), traced once per function object
    and closure contents (fresh: traced again, as under torch.compile, where a recompile must see the
    attributes of captured objects that the cache key holds by identity)."""
    if not callable(fn):
        raise TypeError(f"{kind}_mod: expected a function, got {type(fn).__name__}")
    code = getattr(fn, "__code__", None)
    if code is None:
        raise FlexCompileError(f"{kind}_mod: {fn!r} is not a plain Python function")
    objs = []
    key = (kind, _closure_key(fn, objs))
    hit = None if fresh else _TRACES.get(key)
    if hit is not None:
        _TRACES.move_to_end(key)
        return hit[0]
    nargs = 5 if kind == "score" else 4
    if code.co_argcount < nargs:
        raise FlexCompileError(f"{kind}_mod: takes {code.co_argcount} arguments, expected {nargs} "
                               f"({'score, ' if kind == 'score' else ''}b, h, q_idx, kv_idx)")
    try:
        gm = torch.fx.symbolic_trace(fn)
    except FlexCompileError:
        raise
    except Exception as e:  # noqa: BLE001 - fx raises many types for untraceable code
        raise FlexCompileError(f"{kind}_mod {getattr(fn, '__name__', fn)}: cannot be traced ({type(e).__name__}: "
                               f"{e}); control flow on the mod's arguments is not supported, use torch.where") from e
    src_fn, captures = _emit(gm, kind, f"{kind}_mod {getattr(fn, '__name__', '')}", grad=False)
    spec = ModSpec(captures, src_fn, kind, gm, weak_ids={id(x) for x in objs})
    _remember(key, spec, objs)
    return spec


def _remember(key, spec, objs):
    """Caches spec under key (compile_mod), watching the objects the key names by identity."""
    _forget(key)
    pins, finalizers = [], []
    for x in {id(x): x for x in objs}.values():
        try:
            finalizers.append(weakref.finalize(x, _forget, key))
        except TypeError:  # no weakref (a dict, a dtype): held, as before, until the entry is evicted
            pins.append(x)
    _TRACES[key] = (spec, pins, finalizers)
    while len(_TRACES) > _MAX_TRACES:
        _forget(next(iter(_TRACES)))


def _forget(key):
    entry = _TRACES.pop(key, None)
    if entry is not None:
        for f in entry[2]:
            f.detach()
