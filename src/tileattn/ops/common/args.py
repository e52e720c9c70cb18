"""Type checks of scalar, flag and output arguments shared by the ops' argument checks: a bool is no number
(True would run as 1), a truthy string is no bool ("False" would run as True), and an output whose elements
overlap would be written by several rows."""
import numbers
import sys


def is_int(x):
    """An integer (numpy's too), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x):
    """A real number (numpy's too), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_bool(x):
    """A bool: Python's, or numpy's (numpy.bool_, taken as Python's; numpy is not imported for it: a numpy
    bool's caller has imported it)."""
    if isinstance(x, bool):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.bool_)


def check_bool(name, x):
    """A flag argument must be a bool: a truthy string ("False") or a number is refused, as torch refuses it."""
    if not is_bool(x):
        raise TypeError(f"{name} must be a bool, got {type(x).__name__} {x!r}")


def overlaps(t):
    """Whether two elements of t may share memory: taken by increasing stride, every dimension of size > 1 must
    step over all that the smaller ones span (a stride 0 from expand fails, as do rows aliased by as_strided)."""
    span = 1  # offsets 0 .. span - 1 reached by the dimensions taken so far
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n > 1):
        if stride < span:
            return True
        span += stride * (size - 1)
    return False


def check_no_overlap(name, t):
    """An output tensor whose elements may share memory (overlaps: e.g. a stride 0 from expand)."""
    if overlaps(t):
        raise ValueError(f"{name}: its elements overlap in memory (shape {list(t.shape)}, strides "
                         f"{list(t.stride())}, e.g. from expand); pass a tensor that owns each element")
