"""Every environment switch of tileattn, read in one place (`tileattn info` prints them).

    TILEATTN_BACKEND=triton          every op on its Triton (portable) kernels, no Gluon (Hopper) kernel
    TILEATTN_BACKEND=dense.large_d   force one backend per op (comma-separated, e.g. dense.triton,mla.triton;
                                     `tileattn info` lists the names); a forced backend that does not serve a
                                     problem raises ValueError with its reason
    TILEATTN_SMEM_BUDGET=sm89|sm80|N emulate a smaller shared-memory budget (hw.py): the configs of smaller GPUs
    TILEATTN_AUTOTUNE=1              time every fitting dense config once per problem kind, cache the winner
    TILEATTN_CACHE_DIR=DIR           where autotune results are kept (default ~/.cache/tileattn)
    TILEATTN_DEBUG_FILL_NAN=1        fill outputs with NaN before each launch (tests: an unwritten element fails)
    TILEATTN_DIRECT_LAUNCH=0         every launch through Triton's normal path (launcher.py; read at import)
    TILEATTN_SM90=0                  former switch, now TILEATTN_BACKEND=triton (warns once)
    TILEATTN_SM90_BWD=0|1            the Hopper (Gluon) backward, dense and flex, never (0) or wherever it serves
                                     (1); unset: where it measured faster than the Triton kernels (both
                                     sequences >= 1K dense, >= 2K flex, on an H100; ops/*/launch_bwd_sm90.py)

Switches are read when a launch plan is made: plans made before a change keep their choice (tests clear the
plan caches after changing one).
"""
import os
import warnings

NAMES = ("TILEATTN_BACKEND", "TILEATTN_SMEM_BUDGET", "TILEATTN_AUTOTUNE", "TILEATTN_CACHE_DIR",
         "TILEATTN_DEBUG_FILL_NAN", "TILEATTN_DIRECT_LAUNCH", "TILEATTN_SM90", "TILEATTN_SM90_BWD")


def _on(name, default="0"):
    return os.environ.get(name, default) not in ("", "0")


def backend_spec() -> str:
    """TILEATTN_BACKEND, or "triton" for the former TILEATTN_SM90=0 (with a one-time warning)."""
    spec = os.environ.get("TILEATTN_BACKEND", "").strip()
    if "TILEATTN_SM90" in os.environ:
        _warn_once("TILEATTN_SM90", "TILEATTN_SM90 is deprecated: use TILEATTN_BACKEND=triton to keep every op on "
                                    "its Triton kernels (TILEATTN_SM90=1 is the default and can be dropped)")
        if not spec and not _on("TILEATTN_SM90", "1"):
            return "triton"
    return spec


def sm90_bwd() -> str:
    """TILEATTN_SM90_BWD: "off" (0), "on" (any other value: wherever the Hopper backward serves) or "auto"
    (unset or empty: where it measured faster)."""
    value = os.environ.get("TILEATTN_SM90_BWD", "").strip()
    return "auto" if not value else "off" if value == "0" else "on"


def smem_budget() -> str:
    return os.environ.get("TILEATTN_SMEM_BUDGET", "").strip().lower()


def autotune() -> bool:
    return _on("TILEATTN_AUTOTUNE")


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("TILEATTN_CACHE_DIR", "~/.cache/tileattn"))


def debug_fill_nan() -> bool:
    return _on("TILEATTN_DEBUG_FILL_NAN")


def direct_launch() -> bool:
    return _on("TILEATTN_DIRECT_LAUNCH", "1")


def describe() -> str:
    """The switches that are set, one per line (or a line saying none is)."""
    lines = [f"  {n}={os.environ[n]}" for n in NAMES if n in os.environ]
    return "\n".join(lines) if lines else "  (no TILEATTN_* switch set)"


_warned = set()


def _warn_once(key, msg):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, FutureWarning, stacklevel=3)
