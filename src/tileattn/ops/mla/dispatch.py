"""Which kernel serves an MLA decode plan (ops/common/backend.py says how a table is walked and forced):
    mla.sm90    Gluon, two warpgroups splitting the 512 output columns (16-bit caches, > 16 query rows)
    mla.triton  Triton, every plan (and any run whose tensors do not suit the Gluon kernel's TMA)
The plan (plan.MLADecodePlan) is the problem object: its dims, dtypes, page size and device.
"""
from ..common import backend
from .launch_sm90 import Sm90Backend
from .launch_triton import TritonBackend

SM90 = Sm90Backend()
TRITON = TritonBackend()
BACKENDS = (SM90, TRITON)


def select(plan):
    return backend.select("mla", BACKENDS, plan)


def explain(plan):
    return backend.explain("mla", BACKENDS, plan)
