"""Which kernel serves a flex attention forward (ops/common/backend.py says how a table is walked and forced):
    flex.sm90    Gluon, the dense forward's pipeline over a block mask (128 x 128 blocks, D = Dv in {64, 128})
    flex.triton  Triton, every problem
"""
import torch

from ... import knobs
from ..common import backend
from .launch_sm90 import Sm90Backend
from .launch_triton import TritonBackend

BACKENDS = (Sm90Backend(), TritonBackend())


def select(p):
    """(backend, skipped) for problem p (problem.FlexProblem)."""
    return backend.select("flex", BACKENDS, p)


def explain(p):
    return backend.explain("flex", BACKENDS, p)


def forward(p, c, plan=None):
    """The forward pass of problem p on call c's checked inputs: allocates the outputs, runs the backend select
    chooses, or plan (plans.Plan: its backend's kept launch). Returns (out, lse) with p.return_lse, else out."""
    out = torch.empty(p.batch, p.heads_q, p.seqlen_q, p.head_dim_v, dtype=p.out_dtype, device=p.device)
    lse = torch.empty(p.batch, p.heads_q, p.seqlen_q, dtype=torch.float32, device=p.device) if p.return_lse else out
    if knobs.debug_fill_nan():  # tests: an element the kernel never writes fails the comparison
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    if p.seqlen_q and p.batch * p.heads_q:
        c.out, c.lse = out, lse
        if plan is not None:
            plan.run(c)
        else:
            select(p)[0].run(p, c)
    return (out, lse) if p.return_lse else out
