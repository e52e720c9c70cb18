"""Score mods that are affine in the score, with a bias that splits into a query part and a key part:

    score_mod(s, b, h, q_idx, kv_idx) = a(b, h) * s + R(b, h, q_idx) + C(b, h, kv_idx)

ALiBi (s + slope[h] * (kv_idx - q_idx)), a per-key or per-query bias, a per-head temperature. trace.py writes
such a mod's kernel function as `qk * (scale * a) + C`, one FMA per score where the general form takes the
scale's multiply and then the mod's own arithmetic per score (ALiBi: three operations). R is left out of the
tile: a term that is constant along a query row cancels in the softmax, so it changes only the row's
log-sum-exp. The kernels' lse is then the lse of the row-free scores; a small kernel (kernels.lse_rows_kernel)
adds R(b, h, q_idx) where the forward returns the lse and takes it off again before the backward reads it.

The split is found on the traced graph: every node is either "pure" (depends on at most one of q_idx and kv_idx,
and not on the score: written as trace.py writes any node, integer semantics kept) or a sum of parts, built from
pure nodes, the score and numbers by +, -, unary -, casts to float32, and products with / quotients by values
that depend on neither position (b, h, numbers, captured tensors indexed by them). Anything else that mixes the
score or both positions (tanh, where, an index by kv_idx - q_idx, ...), or an operand in float16 / bfloat16 (which
torch may compute in that precision), leaves the mod on the general form.

Numerics: the parts are summed in float32 in another order than the mod writes them (ALiBi: slope * kv_idx -
slope * q_idx instead of slope * (kv_idx - q_idx)), so a score differs by float32 rounding of the parts
(about |slope * position| * 2^-24), far under the 16-bit inputs' own error.
"""
import operator

import torch
import torch.fx

_ADD = {operator.add, "add"}
_SUB = {operator.sub, "sub"}
_MUL = {operator.mul, "mul"}
_DIV = {operator.truediv, "div", "true_divide"}
_NEG = {operator.neg, "neg"}
_SAME = {operator.pos, "float"}  # value kept (float(): the parts are float32 already)
_LEAF_F = {"q_idx": "q_idx_f", "kv_idx": "kv_idx_f"}


class Affine:
    """A score mod's split: coef (the score's factor), row and col (the query and key parts) as expressions of
    the generated code (None: zero), and the lines of the pure nodes with their position dependence."""

    def __init__(self, coef, row, col, lines):
        self.coef, self.row, self.col, self.lines = coef, row, col, lines

    def body(self, keep):
        """The generated lines whose nodes depend on no position outside keep ("q" or "kv")."""
        return [line for line, deps in self.lines if deps <= {keep}]


def _op(n):
    """A call node's operation: its function, or the name of its method / torch function."""
    if n.op == "call_method":
        return n.target
    if n.target in (operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pos):
        return n.target
    return getattr(n.target, "__name__", None)


def _lin(x, y, sign):
    if y is None:
        return x
    if x is None:
        return y if sign == "+" else f"(-{y})"
    return f"({x} {sign} {y})"


def _scaled(parts, fmt):
    return tuple(None if p is None else fmt.format(p) for p in parts)


def split(w):
    """The Affine split of the score mod that _Writer w (trace.py, not in grad mode) holds, writing the pure
    nodes' lines into it; None when the mod does not have that form (w is then spent: use a fresh one)."""
    deps, parts, out = {}, {}, None
    lines = []  # (line, deps of its node)
    for n in w.gm.graph.nodes:
        if n.op == "placeholder":
            name = w.arg_names[len(w.vars)]
            w.vars[n] = name
            deps[n] = {"score": {"s"}, "q_idx": {"q"}, "kv_idx": {"kv"}}.get(name, set())
            if name == "score":
                w.floats.add(n)
            continue
        if n.op == "output":
            out = n.args[0]
            continue
        if n.op == "get_attr":
            deps[n] = set()
            continue
        args = list(n.args) + list(n.kwargs.values())
        flat = [y for a in args for y in (a if isinstance(a, (tuple, list)) else (a, ))]
        d = set().union(*(deps.get(a, set()) for a in flat if isinstance(a, torch.fx.Node)))
        deps[n] = d
        if "s" not in d and (d <= {"q"} or d <= {"kv"}):
            expr = w.node(n)
            v = f"v{len(w.lines)}"
            w.lines.append(f"    {v} = {expr}")
            w.vars[n] = v
            w.note_types(n)
            lines.append((w.lines[-1], frozenset(d)))
            continue
        p = _combine(w, n, deps, parts)
        if p is None:
            return None
        parts[n] = p
    if not isinstance(out, torch.fx.Node):
        return None
    coef, row, col = parts[out] if out in parts else _as_parts(w, out, deps, parts)
    return Affine(coef, row, col, lines)


def _as_parts(w, a, deps, parts):
    """(coef, row, col) of an operand: a mixed node's parts, a pure node or number as the part its position
    dependence says (no position: the row part, which leaves the tile)."""
    if isinstance(a, torch.fx.Node) and a in parts:
        return parts[a]
    if isinstance(a, torch.fx.Node):
        d = deps[a]
        if "s" in d:  # (the score placeholder itself)
            return ("1.0", None, None)
        # positions in float32 where the code has them (exact below 2^24: lowering.py)
        ref = _LEAF_F.get(w.vars.get(a)) if a.op == "placeholder" else w.fidx.get(a)
        ref = ref or w.ref(a)
        return (None, None, ref) if "kv" in d else (None, ref, None)
    return (None, w.ref(a), None)


def _uniform(w, a, deps):
    """The expression of an operand that depends on neither position nor the score, else None."""
    if isinstance(a, torch.fx.Node):
        return w.ref(a) if not deps[a] and a in w.vars else None
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return w.ref(a)
    return None


def _combine(w, n, deps, parts):
    """The parts of a node that mixes the score or both positions, or None where it is not a sum of parts."""
    op, a = _op(n), n.args
    if n.op not in ("call_function", "call_method"):
        return None
    if any(isinstance(x, torch.fx.Node) and x in w.low for x in a):
        return None  # (torch may compute it in float16 / bfloat16: the general form keeps that rounding)
    if op == "to":
        dt = n.kwargs.get("dtype", a[1] if len(a) > 1 else None)
        return _as_parts(w, a[0], deps, parts) if dt in (torch.float32, torch.float64) and len(a) <= 2 else None
    if n.kwargs:
        return None
    if op in _SAME and len(a) == 1:
        return _as_parts(w, a[0], deps, parts)
    if op in _NEG and len(a) == 1:
        return _scaled(_as_parts(w, a[0], deps, parts), "(-{})")
    if len(a) != 2:
        return None
    if op in _ADD or op in _SUB:
        x, y = (_as_parts(w, t, deps, parts) for t in a)
        sign = "+" if op in _ADD else "-"
        return tuple(_lin(p, q, sign) for p, q in zip(x, y))
    if op in _MUL:
        for i in (0, 1):
            u = _uniform(w, a[i], deps)
            if u is not None:
                return _scaled(_as_parts(w, a[1 - i], deps, parts), f"({{}} * {u})")
        return None
    if op in _DIV:
        u = _uniform(w, a[1], deps)
        # (times 1.0: true division of an integer part, as _div does, and of a number)
        return None if u is None else _scaled(_as_parts(w, a[0], deps, parts), f"(({{}}) * 1.0 / {u})")
    return None


def sources(form, unpack, grad):
    """(the kernels' score function, the row function or None) of a split mod; unpack: the captures' lines.
    The score function takes the raw q.k tile and the scale, as trace.py's general one does; with grad it
    also returns the derivative with respect to the (scaled) score, the coefficient."""
    coef = form.coef or "0.0"
    value = "qk * scale" if coef == "1.0" else f"qk * (scale * {coef})"
    if form.col is not None:
        value = f"{value} + {form.col}"
    # (the derivative as a 0-d tensor: the kernels see it is one value for every score, finite where masked)
    result = f"({value}).to(tl.float32)" + (f", tl.zeros([], tl.float32) + {coef}" if grad else "")
    body = "\n".join(unpack + form.body("kv") + [f"    return {result}"])
    src = f"@triton.jit\ndef mod(qk, scale, b, h, q_idx, kv_idx, q_idx_f, kv_idx_f, caps):\n{body}\n"
    if form.row is None:
        return src, None
    body = "\n".join(unpack + form.body("q") + [f"    return tl.zeros_like(q_idx_f) + ({form.row})"])
    return src, f"@triton.jit\ndef mod(b, h, q_idx, q_idx_f, caps):\n{body}\n"
