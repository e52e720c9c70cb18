"""Backend choice, shared by every op: an ordered table of backends per op, each saying whether it serves a
problem and, if not, why; and the one place to force a backend or a config.

A backend is an object with
    name         "<op>.<kind>", e.g. "dense.sm90", "dense.triton", "mla.sm90"
    gluon        True when it runs a Gluon (Hopper) kernel: TILEATTN_BACKEND=triton skips it
    supports(p)  -> (ok, reason): whether it can serve problem p (the op's problem object), and why not
    prefers(p)   -> (ok, reason): whether it should, where it can but measured slower than the next one
and op-specific planning methods (ops/<op>/dispatch.py). `select` walks an op's table in order and returns the
first backend that supports and prefers the problem, with the reasons of those it skipped (debug logging under
the "tileattn" logger, and `tileattn info`, print them). A forced backend only needs to support it.

Forcing, one context manager and one environment variable (knobs.py):

    with tileattn.force_backend("dense.triton"):            # a backend for its op ("triton": every op's
        ...                                                  # Triton kernels)
    with tileattn.force_backend(config=AttnConfig(...)):     # a config; its class names the backend it sets
        ...
    TILEATTN_BACKEND=triton  /  TILEATTN_BACKEND=dense.large_d,mla.triton

A forced backend that does not serve a problem raises ValueError with its reason: never a silent fallback.
A forced config applies wherever its class is the config read (e.g. Sm90Config for the dense and flex Gluon
kernels, BwdConfig for the dense and flex backward). Plans made inside a `force_backend` block are keyed by it.
The forcing is process-wide, not per thread: autograd runs the backward of CUDA tensors on threads of its own,
and a backward inside the block must see it too.
"""
import contextlib
import logging
from collections.abc import Iterator

from ... import knobs

log = logging.getLogger("tileattn")

TRITON = "triton"  # the name that keeps every op on its Triton kernels


class Backend:
    """Base of the backends of ops/<op>/dispatch.py (see the module docstring)."""
    name = ""
    gluon = False

    def supports(self, p):
        raise NotImplementedError

    def prefers(self, p):
        return True, ""

    def __repr__(self):
        return f"<backend {self.name}>"


class _Forced:
    key = None  # what plan caches key on: None when nothing is forced
    names = None  # {op: backend name}, TRITON for every op, or None
    config = None


_forced = _Forced()  # process-wide (see the module docstring)


def _parse(spec, what):
    """{op: backend name} (or TRITON, or None) from a spec "triton" / "dense.sm90,mla.triton" / "" / "auto"."""
    if spec is not None and not isinstance(spec, str):
        raise TypeError(f"{what}: expected a str such as 'dense.sm90' or 'triton', got {type(spec).__name__}")
    spec = (spec or "").strip()
    if spec in ("", "auto"):
        return None
    if spec == TRITON:
        return TRITON
    names = {}
    for part in spec.split(","):
        part = part.strip()
        op, dot, kind = part.partition(".")
        if not dot or not op or not kind:
            raise ValueError(f"{what}: expected 'triton', 'auto' or '<op>.<backend>' names such as 'dense.sm90' "
                             f"(tileattn info lists them), got {part!r}")
        names[op] = part
    return names


@contextlib.contextmanager
def force_backend(name: str | None = None, *, config: object | None = None) -> Iterator[None]:
    """Within the block, serve every call by backend `name` (of its op; "triton": every op on its Triton
    kernels) and/or with `config` (a config dataclass of ops/*/configs.py; without `name`, the backend its
    class names). A forced backend that does not serve a problem raises ValueError. Nested blocks replace
    the outer one; plans made inside are keyed by it. Process-wide (backward threads see it too)."""
    names = _parse(name, "force_backend(name)")
    if config is not None:
        if not hasattr(type(config), "backend"):  # (every config class of ops/*/configs.py names its backend)
            raise TypeError(f"force_backend(config): expected a config of ops/*/configs.py (AttnConfig, "
                            f"Sm90Config, BwdConfig, ...), got {type(config).__name__}")
        implied = getattr(type(config), "backend", None)
        if names is None and implied:
            names = {implied.partition(".")[0]: implied}
        elif isinstance(names, dict) and implied and names.get(implied.partition(".")[0], implied) != implied:
            raise ValueError(f"force_backend: config {config} is for backend {implied}, not "
                             f"{names[implied.partition('.')[0]]}")
    prev = (_forced.key, _forced.names, _forced.config)
    _forced.names, _forced.config = names, config
    _forced.key = None if names is None and config is None else (
        tuple(sorted(names.items())) if isinstance(names, dict) else names, config)
    try:
        yield
    finally:
        _forced.key, _forced.names, _forced.config = prev


def forced_key():
    """A hashable summary of what force_backend sets (None: nothing): part of plan keys."""
    return _forced.key


def forced_config(config_type):
    """The forced config if it is a `config_type`, else None."""
    cfg = _forced.config
    return cfg if isinstance(cfg, config_type) else None


def _wanted(op):
    """(forced backend name for `op` or None, every op on Triton kernels, where it was set)."""
    names, source = _forced.names, "force_backend"
    if names is None:
        names, source = _parse(knobs.backend_spec(), "TILEATTN_BACKEND"), "TILEATTN_BACKEND"
    if names == TRITON:
        return None, True, source
    if names:
        return names.get(op), False, source
    return None, False, source


def select(op, backends, p):
    """(backend, skipped): the first of `backends` that serves problem `p`, honouring forcing, and the
    [(name, reason)] of those skipped before it. Raises ValueError when none serves it (or a forced one
    does not)."""
    want, triton_only, source = _wanted(op)
    if want is not None:
        b = next((b for b in backends if b.name == want), None)
        if b is None:
            raise ValueError(f"{source}: {want!r} is not a backend of {op} (one of "
                             f"{', '.join(b.name for b in backends)})")
        ok, why = b.supports(p)
        if not ok:
            raise ValueError(f"{source} asks for backend {want}, which does not serve this problem: {why}")
        log.debug("%s: %s (forced by %s)", op, want, source)
        return b, []
    skipped = []
    for b in backends:
        if b.gluon and triton_only:
            skipped.append((b.name, f"Gluon kernels are switched off ({source} triton)"))
            continue
        ok, why = b.supports(p)
        if ok:
            ok, why = b.prefers(p)
        if ok:
            if skipped:
                log.debug("%s: %s (skipped %s)", op, b.name, "; ".join(f"{n}: {r}" for n, r in skipped))
            else:
                log.debug("%s: %s", op, b.name)
            return b, skipped
        skipped.append((b.name, why))
    raise ValueError(f"no {op} kernel serves this problem: " + "; ".join(f"{n}: {r}" for n, r in skipped))


def explain(op, backends, p):
    """[(name, serves, reason)] for every backend of the table, in order, and which one `select` takes (or the
    error it raises) - what `tileattn info` prints."""
    rows = []
    for b in backends:
        ok, why = b.supports(p)
        if ok:
            ok, why = b.prefers(p)
        rows.append((b.name, ok, why))
    try:
        chosen = select(op, backends, p)[0].name
    except ValueError as e:
        chosen = f"error: {e}"
    return rows, chosen
