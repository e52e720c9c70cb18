"""Which kernel serves a dense attention forward: the ordered backend table (ops/common/backend.py says how a
table is walked, forced, and explained).

Order, first match wins:
    dense.large_d_sm90  Gluon, D or Dv >= 512, or D and Dv in [193, 384] (faster than the dense kernels there)
    dense.large_d       Triton, D or Dv > 256
    dense.decode        Triton split-KV (ops/decode), Sq = 1, D = Dv in {64, 128, 256}
    dense.sm90_cluster  Gluon 2-CTA clusters (triton 3.9), D = Dv = 128, causal from configs.CLUSTER_FROM query rows
    dense.sm90          Gluon, FlashAttention-3's schedule, D = Dv in {64, 128, 256}
    dense.triton        Triton, everything else (varlen, other GPUs, the interpreter)
Each backend's supports(problem) says why it does not serve a problem; `tileattn info` prints the table for
typical problems, and the "tileattn" logger at DEBUG level logs every choice.
"""
from ..common import backend
from .launch_cluster_sm90 import ClusterBackend
from .launch_decode import DecodeBackend
from .launch_large_d import LargeDBackend, LargeDSm90Backend
from .launch_sm90 import Sm90Backend
from .launch_triton import TritonBackend

BACKENDS = (LargeDSm90Backend(), LargeDBackend(), DecodeBackend(), ClusterBackend(), Sm90Backend(), TritonBackend())
BY_NAME = {b.name: b for b in BACKENDS}


def select(p):
    """(backend, skipped) for problem p (problem.AttnProblem); raises ValueError when none serves it."""
    return backend.select("dense", BACKENDS, p)


def explain(p):
    """([(backend, serves, reason)], chosen) for problem p."""
    return backend.explain("dense", BACKENDS, p)


def plan(p, c):
    """The launch of the backend that serves problem p, planned with call c's tensors as the example."""
    return select(p)[0].plan(p, c)
