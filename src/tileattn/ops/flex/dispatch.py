"""Which kernel serves a flex attention forward (ops/common/backend.py says how a table is walked and forced):
    flex.sm90    Gluon, the dense forward's pipeline over a block mask (128 x 128 blocks, D = Dv in {64, 128})
    flex.triton  Triton, every problem
"""
from ..common import backend
from .launch_sm90 import Sm90Backend
from .launch_triton import TritonBackend

BACKENDS = (Sm90Backend(), TritonBackend())


def select(p):
    """(backend, skipped) for problem p (problem.FlexProblem)."""
    return backend.select("flex", BACKENDS, p)


def explain(p):
    return backend.explain("flex", BACKENDS, p)
