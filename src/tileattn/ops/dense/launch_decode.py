"""Backend "dense.decode": a single query row per sequence (Sq = 1) over the keys and values as a contiguous
KV cache, through the split-KV kernel of ops/decode (KVCachePlan): the dense kernels give each (batch, head) one
program that walks all Sk keys, which leaves most of the GPU idle at small batch; split-KV cuts the key range
over the SMs and merges the pieces (bench/results/h100/decode.json).

The one import of another op's folder (tests/test_structure.py allows dense -> decode and nothing else).
"""
import torch

from ..common.backend import Backend
from ..decode.configs import HEAD_DIMS
from ..decode.plan import KVCachePlan


class DecodeLaunch:
    """A KVCachePlan for the problem's batch (every sequence Sk keys long): run(c) launches it on call c."""
    __slots__ = ("plan", "return_lse")

    def __init__(self, plan, return_lse):
        self.plan, self.return_lse = plan, return_lse

    def run(self, c):
        with torch.no_grad():  # the dense op's own autograd saves out and lse for its backward
            self.plan.run(c.q, c.k, c.v, out=c.out, lse=c.lse if self.return_lse else None,
                          return_lse=self.return_lse)

    def compile(self, c):
        self.run(c)


class DecodeBackend(Backend):
    name = "dense.decode"

    def supports(self, p):
        if p.varlen:
            return False, "packed (varlen) problems take the dense kernels"
        if p.fp8:
            return False, "fp8 inputs take the dense kernels"
        if p.head_dim != p.head_dim_v or p.head_dim not in HEAD_DIMS:
            return False, f"D={p.head_dim}, Dv={p.head_dim_v}: it serves D = Dv in {HEAD_DIMS}"
        if p.heads_q // p.heads_kv > 64:
            return False, f"{p.heads_q // p.heads_kv} query heads per KV head: it serves at most 64"
        if not p.opts.bottom_right and p.opts.window != (-1, -1):
            return False, "a top-left aligned mask (SDPA's is_causal) takes the dense kernels"
        if not p.opts.scale > 0:
            return False, f"scale {p.opts.scale}: the decode kernels take a positive one (the dense kernels any)"
        return True, ""

    def prefers(self, p):
        if p.seqlen_q != 1:
            return False, f"Sq={p.seqlen_q}: it is chosen for Sq = 1 (a decode step)"
        return True, ""

    def plan(self, p, c):
        seqlens = torch.full((p.batch,), p.seqlen_k, dtype=torch.int32, device=p.device)
        plan = KVCachePlan(seqlens, num_heads=p.heads_q, num_kv_heads=p.heads_kv, head_dim=p.head_dim,
                           page_size=None, q_len=1, dtype=p.dtype, causal=False, scale=p.opts.scale,
                           window=p.opts.window, softcap=p.opts.softcap, host_seqlens=[p.seqlen_k] * p.batch)
        return DecodeLaunch(plan, p.opts.return_lse)
