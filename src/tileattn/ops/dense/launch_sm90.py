"""Backend "dense.sm90": the Hopper Gluon kernel (gluon_sm90.py) for batched inputs.

It serves head dims D = Dv in {64, 128, 256} (fp16 / bf16 / fp8) with TMA-aligned tensors on an H100/H200 with
triton 3.6 (ops/common/launch_sm90.py says why not otherwise); the rest goes to the other backends. fp8 V must
be the view of an fp8.Fp8V: a plain fp8 V is packed once per call (fp8.fp8_v_layout). fp8 with a single key
(Sk = 1) launches attn_fwd_sm90_kernel_one_key, compiled with seqlen_k a run-time value (gluon_sm90.py says
why).
"""
import torch

from ... import hw
from ...launcher import KernelLauncher
from ..common import launch_sm90 as pipeline
from ..common.backend import Backend
from ..common.configs import sm90_config, sm90_dense_config
from ..common.fp8 import P_SHIFT, descale_strides, fp8_v_layout
from .gluon_sm90 import attn_fwd_sm90_kernel, attn_fwd_sm90_kernel_one_key

# the kernel parameters that change between calls of one launch plan (launcher.KernelLauncher's `varying`)
VARYING = ("q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr", "qd_ptr", "kd_ptr", "vd_ptr", "sm_scale",
           "softcap_scale", "softcap_out", "out_scale", "order_ptr")


def _pack_v(v):
    return fp8_v_layout(v).view()


def _epilogue(cfg, separate_o):
    """The kernel's EPILOGUE: cfg.epilogue, but "tma" for a deferred store of O staged in a single Q slot (the next
    tile's Q would wait for the slot the deferred wait releases). "kstage" stages O in a K buffer, which holds the
    input dtype: an output of another dtype (fp8 inputs) is refused."""
    if cfg.epilogue == "kstage" and separate_o:
        raise ValueError("Sm90Config.epilogue = 'kstage' stages O in a K/V stage's K buffer of the input dtype: "
                         "16-bit inputs only (fp8's output has its own buffers; use 'tma' or 'deferred')")
    if cfg.epilogue == "deferred" and not separate_o and cfg.q_slots < 2:
        return "tma"
    return cfg.epilogue


class Sm90Launch:
    """A planned launch of attn_fwd_sm90_kernel: run(c) launches it on call c's tensors and values."""
    __slots__ = ("grid", "launcher", "v_prep", "order")

    def __init__(self, grid, launcher, v_prep, order):
        # order: the plan's tile-order table (Sm90Config.lpt) or None (the kernel then reads no table, and is
        # passed the call's lse as a stand-in pointer)
        self.grid, self.launcher, self.v_prep, self.order = grid, launcher, v_prep, order

    def _values(self, c):
        v = c.v if self.v_prep is None else self.v_prep(c.v)
        qd, kd, vd = c.descales if c.descales is not None else (c.lse, c.lse, c.lse)
        return (c.q, c.k, v, c.out, c.lse, qd, kd, vd, *pipeline.scales(c.scale, c.softcap), c.out_scale,
                c.lse if self.order is None else self.order)

    def run(self, c):
        self.launcher(self.grid, *self._values(c))

    def compile(self, c):
        return self.launcher.compile(self.grid, *self._values(c))


class Sm90Backend(Backend):
    name = "dense.sm90"
    gluon = True

    def supports(self, p):
        if p.varlen:
            return False, "packed (varlen) inputs take the Triton kernel"
        why = pipeline.reason(p.device, p.dtype, p.head_dim, p.head_dim_v, p.out_dtype)
        if why:
            return False, why
        if p.opts.softcap <= 0 and p.opts.scale <= 0:
            return False, "a negative scale (the kernel folds a positive scale into exp2 after the row max)"
        if min(p.seqlen_q, p.seqlen_k) == 0:
            return False, "an empty sequence"
        q, k, v, out = p.tma
        if not (q and k and out and (v or p.fp8)):  # an fp8 V is packed (Fp8V: TMA-ready by construction)
            return False, "q, k, v or the output is not aligned for tensor descriptors (16-byte base and strides)"
        return True, ""

    def prefers(self, p):
        if p.right >= 0 and not sm90_config(p.head_dim, p.dtype).serves_causal:
            return False, f"D={p.head_dim} with a right bound (causal): the Triton kernel measured faster (configs)"
        return True, ""

    def plan(self, p, c):
        left, right = p.opts.window
        cfg = sm90_dense_config(p.head_dim, p.dtype, p.seqlen_q, left >= 0 or right >= 0,
                                hw.device_info(p.device).smem_per_block, p.out_dtype.itemsize)
        v_prep = _pack_v if p.fp8 and not p.opts.v_packed else None
        v = c.v if v_prep is None else v_prep(c.v)
        lse = c.lse
        sl = (lse.stride(0), lse.stride(1)) if p.opts.return_lse else (0, 0)
        descales = c.descales or (None, None, None)
        args = (
            *pipeline.descriptors(c.q, c.k, v, c.out, cfg), lse, *[d if d is not None else lse for d in descales],
            sl[0], sl[1], *[st for d in descales for st in descale_strides(d)],
            p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_q // p.heads_kv, p.batch * p.heads_q,
            *pipeline.scales(c.scale, c.softcap), float(c.out_scale), left, right,
        )
        grid = pipeline.grid(cfg, p.seqlen_q, p.batch * p.heads_q, p.device)
        order = None
        if cfg.lpt and right >= 0 and pipeline.persistent(cfg, p.seqlen_q):
            rows = cfg.consumers * cfg.block_m
            costs = pipeline.block_costs(p.seqlen_q, p.seqlen_k, p.seqlen_k - p.seqlen_q if p.opts.bottom_right
                                         else 0, left, right, rows, cfg.block_n)
            table = pipeline.tile_order(costs, len(costs), p.batch * p.heads_q, grid[0])
            order = None if table is None else torch.from_numpy(table).to(p.device)
        args += (order, order.shape[0]) if order is not None else (lse, 0)
        kwargs = dict(
            BLOCK_M=cfg.block_m, Q_SLOTS=cfg.q_slots, STAGES=cfg.stages, CONSUMER_REGS=cfg.consumer_regs,
            HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, ALIGN_BOTTOM_RIGHT=p.opts.bottom_right,
            HAS_SOFTCAP=c.softcap > 0, RETURN_LSE=p.opts.return_lse, REVERSE_M=right >= 0,
            HAS_DESCALE=p.descale, P_SHIFT=P_SHIFT if p.fp8 else 0, V_SEQ_MAJOR=p.fp8,
            SEPARATE_O=p.out_dtype != p.dtype, PINGPONG=cfg.pingpong, EXP2_FMA=cfg.exp2_fma,
            NUM_CONSUMERS=cfg.consumers, ORDERED=order is not None,
            EPILOGUE=_epilogue(cfg, p.out_dtype != p.dtype), num_warps=4,
        )
        kernel = attn_fwd_sm90_kernel_one_key if p.fp8 and p.seqlen_k == 1 else attn_fwd_sm90_kernel
        return Sm90Launch(grid, KernelLauncher(kernel, args, kwargs, VARYING), v_prep, order)
