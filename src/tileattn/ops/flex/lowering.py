"""Arithmetic lowerings of the mod writer (trace.py): the generated modules' helpers (floor division, powers, ...),
constant whole powers as products, and index differences evaluated in float32 (FloatIndex, which trace._Writer
mixes in).

Where kv_idx - q_idx (one + / - / negation over the positions and integer literals) meets a float32 value, as in
ALiBi's slope * (kv_idx - q_idx), the generated code uses the float32 positions the kernels pass (q_idx_f,
kv_idx_f) instead of an integer add and an int -> float conversion per score. Bit-identical below 2^24 tokens
(flex lengths are checked below that): both operands are exact in float32, and one rounded add equals the
conversion of the exact integer result. float16 / bfloat16 operands do not count: an integer meeting one is
computed in that precision.
"""
import operator

import torch
import torch.fx

_ARITH = {operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
          operator.pow: "pow"}
_ARITH_NAMES = {"add", "sub", "mul", "div", "true_divide", "pow"}
_SIGNS = (operator.neg, operator.abs, operator.pos)
_FLOAT_FUNCS = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid"}

MAX_PRODUCT_POWER = 16  # x ** n for a constant whole n up to this: repeated products (exact, any sign of x)

# the generated module's helper functions (trace._define puts them before each mod)
HELPERS = '''
@triton.jit
def _div(a, b):
    return a.to(tl.float32) / b


@triton.jit
def _floordiv(a, b):
    q = a // b
    return tl.where((a % b != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def _mod(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def _pow(a, b):
    # a ** b in float32 with torch's signs: |a| ** b, negated for a negative base and an odd whole exponent, NaN
    # for a negative base and a fractional one, 1 for b = 0 (constant whole exponents are products instead)
    af = a.to(tl.float32)
    bf = (b + tl.zeros_like(af)).to(tl.float32)
    mag = tl.exp2(tl.log2(tl.abs(af)) * bf)
    whole = tl.floor(bf) == bf
    odd = whole & (tl.floor(bf * 0.5) * 2.0 != bf)
    r = tl.where(odd & (af < 0), -mag, mag)
    r = tl.where((af < 0) & (whole == 0), float("nan"), r)
    return tl.where(bf == 0.0, 1.0, r)


@triton.jit
def _invert(a):
    return a == 0


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))
'''


def _whole(e):
    """A constant whole exponent that _int_power writes as products."""
    return isinstance(e, (int, float)) and not isinstance(e, bool) and float(e).is_integer() and \
        abs(e) <= MAX_PRODUCT_POWER


def _int_power(x, e):
    """x ** e (e a constant whole number) as products, by squaring: keeps x's sign and an integer x's dtype, as
    torch does (a float e makes the result float, a negative one 1 / x ** -e)."""
    n = abs(int(e))
    base = f"({x}).to(tl.float32)" if isinstance(e, float) else x
    if n == 0:
        return f"({base} * 0 + 1)"
    terms, p, k = [], base, n
    while k:
        if k & 1:
            terms.append(p)
        k >>= 1
        if k:
            p = f"({p} * {p})"
    prod = "(" + " * ".join(terms) + ")"
    return f"(1.0 / {prod})" if e < 0 else prod


class FloatIndex:
    """Mixin of trace._Writer: needs self.vars, self.gm, self.ref; keeps self.floats, self.low, self.fidx
    (note_types after each node)."""

    def _float_leaf(self, a):
        """float32 expression of q_idx / kv_idx or an integer literal, exact below 2^24; else None."""
        if isinstance(a, torch.fx.Node) and a.op == "placeholder" and self.vars.get(a) in ("q_idx", "kv_idx"):
            return f"{self.vars[a]}_f"
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) < 2 ** 24:
            return repr(float(a))
        return None

    def note_types(self, n):
        """After node n is written: records whether its value is float32 (floats) or float16 / bfloat16 (low),
        and the float32 form of an index difference (fidx)."""
        name = n.target if n.op == "call_method" else getattr(n.target, "__name__", None)
        op = _ARITH.get(n.target, "neg" if n.target is operator.neg else name)
        if op in ("add", "sub", "neg"):
            self._float_index(n, op, n.args)
        if self._float_result(n):
            self.floats.add(n)

    def _float_index(self, n, op, args):
        """Records in fidx a float32 form of one + / - / negation over q_idx, kv_idx and integer literals (e.g.
        kv_idx - q_idx). Where such a value meets a float (ALiBi's slope * (kv_idx - q_idx)), the float form is
        used: the kernels pass the positions also as float32 vectors (q_idx_f [BLOCK_M, 1], kv_idx_f
        [1, BLOCK_N], made without a conversion per block) and the tile takes one float add, instead of an
        integer add and an int -> float conversion per element (conversions run at a quarter of the FMA rate).
        Bit-identical: both operands are exact in float32 below 2^24, and one rounded add equals the conversion
        of the exact integer result (flex lengths are checked below 2^24)."""
        leaves = [self._float_leaf(a) for a in args]
        if any(x is None for x in leaves) or not any(isinstance(a, torch.fx.Node) for a in args):
            return
        if op == "neg" and len(args) == 1:
            self.fidx[n] = f"(0.0 - {leaves[0]})"  # (not -x: the integer path gives +0.0 at 0)
        elif op in ("add", "sub") and len(args) == 2:
            self.fidx[n] = f"({leaves[0]} {'+' if op == 'add' else '-'} {leaves[1]})"

    def _is_float(self, a):
        return isinstance(a, float) or (isinstance(a, torch.fx.Node) and a in self.floats)

    def _arith_refs(self, args, div=False):
        """The operands of an arithmetic op: an index difference next to a float operand (or divided: true
        division converts it anyway) in its float form."""
        refs = [self.ref(a) for a in args]
        if len(args) == 2:
            for i in (0, 1):
                if args[i] in self.fidx and (self._is_float(args[1 - i]) or div):
                    refs[i] = self.fidx[args[i]]
        return refs

    def _float_result(self, n):
        """Whether node n's value is a float32 tensor, from its operation and operands (False where unsure: that
        only forgoes _float_index's form). float16 / bfloat16 values do not count: an integer meeting one is
        computed in that precision, not in float32."""
        args = n.args
        name = n.target if n.op == "call_method" else getattr(n.target, "__name__", None)
        vals = list(args) + list(n.kwargs.values())
        if n.target in (operator.getitem, ) or name == "__getitem__":
            t = getattr(self.gm, args[0].target, None) if isinstance(args[0], torch.fx.Node) else None
            if isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16):
                self.low.add(n)
            return isinstance(t, torch.Tensor) and t.dtype == torch.float32
        if name == "to":
            dt = n.kwargs.get("dtype", args[1] if len(args) > 1 else None)
            if dt in (torch.float16, torch.bfloat16):
                self.low.add(n)
            return dt in (torch.float32, torch.float64)  # (float64 is computed as float32)
        if n.target in (operator.truediv, ) or name in ("float", "div", "true_divide"):  # _div: a float32 numerator
            return True
        if n.target in _ARITH or n.target in _SIGNS or name in _ARITH_NAMES or name in _FLOAT_FUNCS or name in (
                "minimum", "maximum", "clamp", "clip", "where", "abs", "neg"):
            ops = vals[1:] if name == "where" else vals
            if any(self._is_float(a) for a in ops):
                return True  # float32 wins over float16, bfloat16 and integers
            if any(isinstance(a, torch.fx.Node) and a in self.low for a in ops):
                self.low.add(n)
                return False
            return name in _FLOAT_FUNCS  # exp, log, ... of integers: float32
        return False
