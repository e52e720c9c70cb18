"""Launch of dense attention backward: delta, then dK/dV and dQ on one of four paths: the Hopper kernel
(launch_bwd_sm90.py, D = Dv <= 128, sequences >= 1K), the whole-row Triton kernels (kernels_bwd.py), the split
backward for head dims above 128 on batched inputs (launch_bwd_large_d.py: score tiles, then cuBLAS GEMMs), and
the fused slice kernels for varlen head dims above 256 (kernels_bwd_large_d.py).

Inputs: the forward's problem and call (its tensors, its output and its log-sum-exp: natural log,
[B, Hq, Sq] or varlen [Hq, total_q]), the output gradient and, when the returned lse was used, its gradient.
Gradients come in the dtypes and layouts of q, k, v; deterministic (no atomics: see kernels_bwd.py). Tiles:
ops/common/configs.py (BwdConfig, forced with tileattn.force_backend(config=BwdConfig(...))).
"""
import torch
import triton
import triton.language as tl

from ... import hw, knobs
from ...launcher import launch_cached
from ..common.backend import forced_key
from ..common.bwd_kernels import bwd_preprocess_kernel
from ..common.configs import bwd_config
from ..common.launch_bwd_sm90 import zero_args
from ..common.softmax import LOG2E
from . import launch_bwd_large_d, launch_bwd_sm90
from .kernels_bwd import bwd_dkdv_kernel, bwd_dq_kernel
from .kernels_bwd_large_d import bwd_dkdv_large_d_kernel, bwd_dq_large_d_kernel
from .launch_triton import MAX_GRID_Y
from .problem import AttnOptions, AttnProblem, Call


def _alloc_grads(varlen, q, k, v):
    # varlen: rows past cu_seqlens[-1] (padding) belong to no sequence and get zero gradients
    alloc = torch.zeros_like if varlen else torch.empty_like
    return alloc(q), alloc(k), alloc(v)


def _alloc_delta(lse, q):
    # float64 for float64 inputs (the CPU suite's gradcheck calls attn_bwd directly)
    return torch.empty_like(lse, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)


class Launches:
    """How attn_bwd launches its kernels: straight through launch_cached. A _Recorder (below) also keeps
    what a launch plan replays."""

    def buffers(self, tensors, workspace=None):
        """Buffers the call allocated, reported before a launch uses them: dq, dk, dv and delta, and on the
        Hopper path the dQ sums and the counters; there delta, the sums and the counters are views of one
        allocation, `workspace`'s (launch_bwd_sm90.Workspace)."""

    def __call__(self, kernel, grid, args, kwargs):
        launch_cached(kernel, grid, args, kwargs)

    def not_replayable(self):
        """The call also runs torch operations (the split backward's GEMMs): no plan can replay it."""


DIRECT = Launches()  # attn_bwd's default: every launch through launch_cached, nothing kept


# Batched problems with a head dim above this take the split backward (launch_bwd_large_d.py: score tiles,
# then cuBLAS GEMMs). H100, B=1 H=16 N=4K fp16 (`sweep.py bwd-large-d --whole` at 3709d62), split / whole-row
# Triton kernels, ms, non-causal and causal: D=192 1.72 / 6.11 and 1.86 / 3.35, D=256 1.92 / 6.36 and 2.09 /
# 3.49. Not measured below 192.
SPLIT_ABOVE_HEAD_DIM = 128
# Varlen problems with a head dim above this take kernels_bwd_large_d.py's fused slice kernels (chunks of the head
# dim for the products, one slice of the gradients' head dim per program); kernels_bwd.py holds whole rows of
# every operand.
MAX_WHOLE_HEAD_DIM = 256
# The slice kernels' tiles: (BLOCK_M, BLOCK_N, BLOCK_K: head-dim columns per product step, BLOCK_S:
# gradient columns per program, num_warps, num_stages). Chosen on the H100 (`sweep.py bwd-large-d` at 42a7de6's
# parent, batched B=1 H=16 N=4K fp16, ms; then the only large-D path): D=512 26 / 9.5 (non-causal / causal) against
# 35 / 18 for (64, 64, 64, 128, 8, 1) and 30 / 14 for (128, 64, 64, 128, 8, 1); D=320 13.8 / 6.4 against the best
# 12.6 / 6.3 (128, 64, 64, 128, 8, 1). A 256-column slice halves the S / dP recomputation at D=512; its dK/dV
# kernel spills 128 bytes (compile_sm90_cpu.py --bwd-large-d, D=512 varlen).
LARGE_D_TILES = (64, 64, 64, 256, 8, 1)
LARGE_D_TILES_INTERPRETER = (32, 16, 32, 64, 4, 1)  # (M != N: the tests see both tile sizes)


def _grid(blocks, bh):
    """(blocks, batch * heads folded over y and z: y holds at most 65535)."""
    return (blocks, min(bh, MAX_GRID_Y), triton.cdiv(bh, MAX_GRID_Y))


def _strides(t, varlen):
    """(batch, sequence, head) strides of a [B, S, H, D] (or varlen [total, H, D]) tensor."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def attn_bwd(p, c, do, dlse, launch=DIRECT):
    """(dq, dk, dv) of problem p (problem.AttnProblem) for the forward call c (problem.Call: q, k, v, out, lse,
    cu_seqlens), the output gradient do and the lse's gradient dlse (or None). launch: a Launches (a
    _Recorder while a plan is made)."""
    q, k, v, out, lse, cu_q = c.q, c.k, c.v, c.out, c.lse, c.cu_q
    # bfloat16 under the interpreter (wrong dots): the forward refuses it already, but tileattn::attn_bwd can be
    # called on its own
    hw.check_interpreter_dtype(q.dtype, "q")
    hw.check_interpreter_dtype(do.dtype, "grad_out")
    varlen = p.varlen
    batch, sq, sk, hq, hkv, d, dv = p.batch, p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.head_dim_v
    left, right = p.opts.window
    scale, softcap = p.opts.scale, p.opts.softcap
    dq, dk, dvv = _alloc_grads(varlen, q, k, v)
    if q.numel() == 0 or k.numel() == 0 or batch == 0:
        return dq.zero_(), dk.zero_(), dvv.zero_()
    if not do.stride(-1) == 1:
        do = do.contiguous()
    if dlse is not None:  # autograd may hand in expanded (stride 0) or transposed gradients
        dlse = dlse.contiguous()
    # window bounds past Sq + Sk never bind: clamp them so the kernels' int32 index arithmetic cannot overflow
    span = sq + sk
    left = min(left, span) if left >= 0 else left
    right = min(right, span) if right >= 0 else right
    # float64 (the CPU suite's gradcheck calls attn_bwd directly; the public API takes 16-bit inputs):
    # float64 accumulation and delta
    acc = tl.float64 if q.dtype == torch.float64 else tl.float32
    ls = (0, lse.stride(0)) if varlen else (lse.stride(0), lse.stride(1))
    gls = ((0, dlse.stride(0)) if varlen else (dlse.stride(0), dlse.stride(1))) if dlse is not None else (0, 0)
    cu_k_arg = c.cu_k if varlen else lse
    cu_q_arg = cu_q if varlen else lse
    bd, bdv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    cfg = bwd_config(max(d, dv))
    (km, kn, kw, ks), (qm, qn, qw, qs) = cfg.dkdv, cfg.dq
    pm = 64 if bdv <= 128 else 32
    pre_grid = _grid(triton.cdiv(sq, pm), batch * hq)
    sm90 = not launch_bwd_sm90.reason(p, q, k, v, do, lse)
    sums = None
    if sm90:  # delta, the Hopper kernel's dQ sums and counters in one allocation, the counters zeroed by the preprocess
        workspace = launch_bwd_sm90.Workspace(p, left, right, lse)
        delta, *sums = workspace.views(workspace.alloc())
        launch.buffers((dq, dk, dvv, delta, *sums), workspace)
    else:
        delta = _alloc_delta(lse, q)
        launch.buffers((dq, dk, dvv, delta))
    zero, zero_kw = zero_args(sums[1] if sums else None, pre_grid[0] * batch * hq, delta)
    launch(bwd_preprocess_kernel, pre_grid, (
        out, do, dlse if dlse is not None else lse, delta, *_strides(out, varlen), *_strides(do, varlen), *ls,
        *gls, cu_q_arg, sq, hq, batch * hq, *zero), dict(DV=dv, BLOCK_M=pm, BLOCK_DV=bdv, IS_VARLEN=varlen,
                                                         HAS_DLSE=dlse is not None, ACC=acc, num_warps=4,
                                                         PDL_TRIGGER=sm90, **zero_kw))
    if softcap > 0:
        qk_scale, softcap_scale, softcap_out = 1.0, scale / softcap, softcap * LOG2E
    else:
        qk_scale, softcap_scale, softcap_out = scale * LOG2E, 1.0, 1.0
    # no mask code at all where no tile can need it (no window or causal rule, whole tiles); else only the
    # tiles the rule cuts run masked
    ragged = varlen or sq % km or sk % kn or sq % qm or sk % qn
    needs_mask = bool(left >= 0 or right >= 0 or ragged)
    common = dict(D=d, DV_=dv, BLOCK_D=bd, BLOCK_DV=bdv, HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0,
                  ALIGN_BOTTOM_RIGHT=p.opts.bottom_right, HAS_SOFTCAP=softcap > 0, IS_VARLEN=varlen,
                  NEEDS_MASK=needs_mask, ACC=acc)
    qkv_strides = (*_strides(q, varlen), *_strides(k, varlen), *_strides(v, varlen), *_strides(do, varlen))
    tail = (scale, qk_scale, softcap_scale, softcap_out, left, right)
    if max(d, dv) > SPLIT_ABOVE_HEAD_DIM and not varlen:  # score tiles once, then GEMMs (launch_bwd_large_d.py)
        launch_bwd_large_d.attn_bwd_large_d(p, c, do, delta, (dq, dk, dvv), tail, launch)
        return dq, dk, dvv
    if max(d, dv) > MAX_WHOLE_HEAD_DIM:  # varlen: the head dim cut into chunks and slices (kernels_bwd_large_d.py)
        bm, bn, bk, bs, warps, stages = LARGE_D_TILES_INTERPRETER if hw.interpreter_enabled() else LARGE_D_TILES
        large = dict(common, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, BLOCK_S=bs, num_warps=warps, num_stages=stages,
                     NEEDS_MASK=bool(left >= 0 or right >= 0 or varlen or sq % bm or sk % bn))  # these tiles
        for name in ("BLOCK_D", "BLOCK_DV"):
            del large[name]
        ns_kv, ns_q = triton.cdiv(max(d, dv), bs), triton.cdiv(d, bs)
        launch(bwd_dkdv_large_d_kernel, _grid(triton.cdiv(sk, bn) * ns_kv, batch * hkv), (
            q, k, v, do, lse, delta, dk, dvv, *qkv_strides, *_strides(dk, varlen), *_strides(dvv, varlen), *ls,
            cu_q_arg, cu_k_arg, sq, sk, hkv, hq // hkv, batch * hkv, *tail), dict(NUM_SLICES=ns_kv, **large))
        launch(bwd_dq_large_d_kernel, _grid(triton.cdiv(sq, bm) * ns_q, batch * hq), (
            q, k, v, do, lse, delta, dq, *qkv_strides, *_strides(dq, varlen), *ls, cu_q_arg, cu_k_arg, sq, sk, hq,
            hq // hkv, batch * hq, *tail), dict(NUM_SLICES=ns_q, **large))
        return dq, dk, dvv
    if sm90:
        launch_bwd_sm90.attn_bwd_sm90(p, c, do, delta, (dq, dk, dvv), sums, tail, launch)
        return dq, dk, dvv
    # launch_cached: the normal kernel[grid](...) path costs ~100 us of host time per launch, more than the
    # whole backward of small problems (the GPU would wait on the host)
    launch(bwd_dkdv_kernel, _grid(triton.cdiv(sk, kn), batch * hkv), (
        q, k, v, do, lse, delta, dk, dvv, *qkv_strides, *_strides(dk, varlen), *_strides(dvv, varlen), *ls,
        cu_q_arg, cu_k_arg, sq, sk, hkv, hq // hkv, batch * hkv, *tail),
        dict(BLOCK_M=km, BLOCK_N=kn, num_warps=kw, num_stages=ks, **common))
    launch(bwd_dq_kernel, _grid(triton.cdiv(sq, qm), batch * hq), (
        q, k, v, do, lse, delta, dq, *qkv_strides, *_strides(dq, varlen), *ls, cu_q_arg, cu_k_arg, sq, sk, hq,
        hq // hkv, batch * hq, *tail), dict(BLOCK_M=qm, BLOCK_N=qn, num_warps=qw, num_stages=qs, **common))
    return dq, dk, dvv


# ---------------------------------------------------------------------------------------------------------
# launch plans: the eager backward's fast path
# ---------------------------------------------------------------------------------------------------------
# The backward of a batched problem costs ~130 us of host time on the H100 host when planned per call (Call and
# AttnProblem, the config, three launch_cached key builds of ~40 arguments; docs/design/backward.md, "The N = 1K
# rows are host-bound"), more than its kernels at N = 1K. A plan made on a key's first call keeps the
# launchers and which of the call's tensors each one takes; a repeated call allocates the buffers and replays.
_MAX_PLANS = 1024
_plans = {}


def clear_plans():
    """Forget every backward launch plan (plans.clear_plans calls this too)."""
    _plans.clear()


def count_plans():
    """Backward launch plans held (tests)."""
    return len(_plans)


class _Recorder(Launches):
    """Launches through launch_cached and keeps each launcher with the positions of its tensor arguments in
    the call's tensor list (inputs, then the buffers attn_bwd reports). A tensor argument that is none of
    them (a copy attn_bwd made) makes the call unplannable."""

    def __init__(self, tensors):
        self.tensors, self.launches, self.workspace, self.ok = list(tensors), [], None, True

    def buffers(self, tensors, workspace=None):
        self.tensors.extend(tensors)
        self.workspace = workspace

    def not_replayable(self):
        self.ok = False

    def __call__(self, kernel, grid, args, kwargs):
        launcher, tensors = launch_cached(kernel, grid, args, kwargs)
        slots = []
        for t in tensors:
            i = next((i for i, x in enumerate(self.tensors) if x is t), None)
            if i is None:
                self.ok = False
            slots.append(i)
        self.launches.append((launcher, grid, tuple(slots)))


class _Plan:
    """A backward's launches (launcher, grid, the slots of their tensors in the call's list: q, k, v, out, lse,
    do, dlse, then the buffers: dq, dk, dv, delta, and on the Hopper path the dQ sums and the counters) and how to
    allocate the buffers again."""
    __slots__ = ("launches", "workspace", "replayable")

    def __init__(self, recorder):
        self.launches = tuple((launcher, tuple(grid) + (1,) * (3 - len(grid)), slots)
                              for launcher, grid, slots in recorder.launches)
        self.workspace = recorder.workspace
        self.replayable = all(launcher.replayable for launcher, _, _ in self.launches)

    def run(self, q, k, v, out, lse, do, dlse):
        dq, dk, dv = _alloc_grads(False, q, k, v)
        workspace = self.workspace
        if workspace is None:
            t = [q, k, v, out, lse, do, dlse, dq, dk, dv, _alloc_delta(lse, q)]
        else:  # (ws: held until the launches are queued)
            ws = workspace.alloc()
            t = [q, k, v, out, lse, do, dlse, dq, dk, dv, *workspace.addresses(ws)]
        launches = self.launches
        if self.replayable and launches[0][0].direct():  # (one device: one check for the call's launches)
            for launcher, grid, slots in launches:
                launcher.replay(grid, *[t[i] for i in slots])
        else:
            for launcher, grid, slots in launches:
                launcher(grid, *[t[i] for i in slots])
        return dq, dk, dv


def _aliasing(tensors):
    """For each tensor, the index of the first one that is the same object (None when all are distinct: the
    common case, one set instead of a scan): a plan maps its launches' arguments to the call's tensors by identity,
    so calls that alias differently (attention(x, x, x), an output gradient that is q) need their own plans."""
    if len({id(t) for t in tensors}) == len(tensors):
        return None
    return tuple(next(j for j in range(i + 1) if tensors[j] is t) for i, t in enumerate(tensors))


def attn_bwd_planned(saved, do, dlse, options):
    """attn_bwd of a batched forward call (saved: the registered op's saved q, k, v, out, lse; options: its encoded
    options; do with a contiguous last dim) through a launch plan kept per key: the options, every tensor's
    shape, strides, dtype and 16-byte alignment, the device, which of them are one tensor (_aliasing), and
    the switches the routing reads. (Every saved tensor is in the key: saved-tensor hooks, such as
    torch.autograd.graph.save_on_cpu, may hand back other layouts than the forward's.)"""
    if dlse is not None:  # autograd may hand in expanded (stride 0) or transposed gradients
        dlse = dlse.contiguous()
    q, k, v, out, lse = saved
    tensors = (q, k, v, out, lse, do, dlse)
    key = (options, q.device, *[None if t is None else (t.shape, t.stride(), t.dtype, t.data_ptr() % 16)
                                for t in tensors], _aliasing(tensors), knobs.sm90_bwd(), forced_key(),
           hw.interpreter_enabled())
    plan = _plans.get(key)
    if plan is not None:
        return plan.run(*tensors)
    opts = AttnOptions.decode(options)
    c = Call(q, k, v, out, lse, None, None, None, opts.scale, opts.softcap, 1.0)
    rec = _Recorder(tensors)
    grads = attn_bwd(AttnProblem.of(c, opts), c, do, dlse, rec)
    if rec.ok and rec.launches:  # (an empty problem launches nothing: its zero gradients are made per call)
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = _Plan(rec)
    return grads
