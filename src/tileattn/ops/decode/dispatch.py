"""Which kernel serves attention over a KV cache (ops/common/backend.py says how a table is walked and forced):
    decode.triton  Triton split-KV kernel (kernels.py), every plan
The plan (plan.KVCachePlan) is the problem object: its dims, dtypes, page size, masks and device.
"""
from ..common import backend
from .launch_triton import TritonBackend

TRITON = TritonBackend()
BACKENDS = (TRITON,)


def select(plan):
    return backend.select("decode", BACKENDS, plan)


def explain(plan):
    return backend.explain("decode", BACKENDS, plan)
