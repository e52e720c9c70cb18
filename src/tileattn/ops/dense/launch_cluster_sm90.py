"""Backend "dense.sm90_cluster": the 2-CTA cluster forward (gluon_cluster_sm90.py; triton 3.9 Gluon, Hopper), whose
two CTAs share every K/V tile through TMA multicast; and its direct entry point:

    out = attention_cluster_sm90(q, k, v, causal=False)   # q [B, Sq, Hq, 128], k / v [B, Sk, Hkv, 128]
    out, lse = attention_cluster_sm90(q, k, v, causal=True, return_lse=True)   # lse [B, Hq, Sq] float32

Serves D = Dv = 128, fp16 / bf16, non-causal or causal with top-left alignment (query i sees key j <= i, torch
SDPA's convention; `attention_ref(..., causal="top_left")`), GQA (Hq a multiple of Hkv), with or without the lse
(natural log, as dense.sm90's), no window / softcap / fp8, TMA-aligned tensors; triton 3.9 only. Dispatch
(dispatch.py) takes it where it measured faster than dense.sm90, causal from configs.CLUSTER_FROM query rows, and
only where top-left is the asked alignment (Sq == Sk, or a top-left call such as scaled_dot_product_attention's);
force_backend may take it on anything it serves.

Plans launch through launcher.KernelLauncher (num_ctas=2 as a launch option): the first call takes Triton's normal
path, later ones its direct replay (launcher_raw.py, triton 3.9), whose packed metadata carries num_ctas, so the
replay launches clusters too (tests/dense/test_cluster_sm90.py, test_route_replays_as_its_normal_launch). The direct
entry point launches `kernel[grid]` on every call.
"""
import torch
import triton

from ... import hw
from ...launcher import KernelLauncher
from ..common.args import overlaps
from ..common.backend import Backend
from ..common.softmax import LOG2E
from ..common.tma import gl_dtype, gluon_sm90_reason, tma_ok
from .configs import cluster_from
from .problem import AttnLaunch

BLOCK_M = 64  # rows per consumer warpgroup and CTA (a warpgroup's box covers 2 * BLOCK_M rows of the pair)
BLOCK_N = 128
STAGES = 3
CONSUMER_REGS = 240
NUM_CONSUMERS = 2
PAIR_ROWS = 2 * NUM_CONSUMERS * BLOCK_M  # query rows of one cluster
D_SERVED = 128
DTYPES = (torch.float16, torch.bfloat16)
SMEM_BYTES = 229_760  # per CTA with the lse, 229,744 without (scripts/compile_cluster.py, triton 3.9.0, sm_90a)
CLUSTER_TRITON = "3.9."  # the Gluon cluster API the kernel is written against (num_ctas, cga_layout, multicast)

# cga_layout bases of the [1, rows, 1, D] boxes: Q / O split by rows between the two CTAs, K / V broadcast
ROW_SPLIT_4D = [[0, 1, 0, 0]]
BROADCAST_4D = [[0, 0, 0, 0]]


def triton_reason():
    """Why this triton cannot compile the cluster kernel ("" when it can)."""
    if not triton.__version__.startswith(CLUSTER_TRITON):
        return f"triton {triton.__version__}: the cluster kernel is written for triton 3.9's Gluon"
    return ""


def reason(q, k, v, out=None, lse=None):
    """Why attention_cluster_sm90 cannot take these inputs ("" when it can); out, lse: the output buffers, if
    given."""
    why = triton_reason()
    if why:
        return why
    if any(t.dim() != 4 for t in (q, k, v)):
        return f"q, k, v of {q.dim()}, {k.dim()}, {v.dim()} dims: [B, S, H, D] each"
    if k.device != q.device or v.device != q.device:
        return f"devices {q.device}, {k.device}, {v.device}: all on one device"
    if k.shape[2] == 0:
        return "k / v without heads"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: fp16 or bf16, all the same"
    if q.shape[-1] != D_SERVED or k.shape[-1] != D_SERVED or v.shape[-1] != D_SERVED:
        return f"head dims {q.shape[-1]}, {k.shape[-1]}, {v.shape[-1]}: D = Dv = {D_SERVED} only"
    if q.shape[2] % k.shape[2] or k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0]:
        return "shapes: q [B, Sq, Hq, D], k / v [B, Sk, Hkv, D] with Hq a multiple of Hkv"
    if min(q.shape[1], k.shape[1]) == 0:
        return "an empty sequence"
    if not all(tma_ok(t) for t in (q, k, v)):
        return "a tensor not aligned for TMA (16-byte base and strides, last stride 1)"
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device
                            or not tma_ok(out)):
        return "out: q's shape, dtype and device, aligned for TMA"
    if lse is not None and (lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.dtype != torch.float32
                            or lse.device != q.device or lse.stride(-1) != 1):
        return "lse: [B, Hq, Sq] float32 on q's device, unit stride along Sq"
    if lse is not None and overlaps(lse):  # (each row is written by its own cluster: shared rows would race)
        return "lse: the rows of its (batch, head) pairs overlap (an expanded or aliased buffer)"
    return ""


def _desc(t, block, cga_layout):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    layout = gl.NVMMASharedLayout.get_default_for(list(block), gl_dtype(t.dtype), cga_layout=cga_layout)
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block), layout)


def descriptors(q, k, v, out):
    """(q, k, v, o) descriptors: Q / O boxes of one warpgroup's 2 * BLOCK_M logical rows split by rows (each CTA
    copies its BLOCK_M), K / V boxes of BLOCK_N keys broadcast (the lead's multicast fills both CTAs)."""
    d = q.shape[-1]
    rows = [1, 2 * BLOCK_M, 1, d]
    keys = [1, BLOCK_N, 1, d]
    return (_desc(q, rows, ROW_SPLIT_4D), _desc(k, keys, BROADCAST_4D), _desc(v, keys, BROADCAST_4D),
            _desc(out, rows, ROW_SPLIT_4D))


def grid(batch, heads_q, seqlen_q):
    """(clusters,): one per pair tile of PAIR_ROWS query rows and (batch, head); the launch multiplies by
    num_ctas (triton's launcher: gridDimX = grid * num_ctas, cluster dim x = num_ctas)."""
    return (triton.cdiv(seqlen_q, PAIR_ROWS) * batch * heads_q,)


def no_lse(device):
    """The lse argument of a launch that writes none (not read): an empty float32 tensor, as the plans pass."""
    return torch.empty(0, dtype=torch.float32, device=device)


def kernel_args(q, k, v, out, lse, causal, sm_scale):
    """(args, kwargs) of attn_fwd_cluster_sm90_kernel on [B, S, H, D] tensors; lse: the [B, Hq, Sq] float32 buffer
    to write, or None (none written); sm_scale: scale * log2 e (> 0)."""
    B, Sq, Hq, _ = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    strides = (0, 0) if lse is None else (lse.stride(0), lse.stride(1))
    args = (*descriptors(q, k, v, out), no_lse(q.device) if lse is None else lse, *strides, Sq, Sk, Hq, Hq // Hkv,
            sm_scale)
    kwargs = dict(BLOCK_M=BLOCK_M, STAGES=STAGES, CONSUMER_REGS=CONSUMER_REGS, HAS_RIGHT=bool(causal),
                  REVERSE_M=bool(causal), RETURN_LSE=lse is not None, num_warps=4, num_ctas=2)
    return args, kwargs


def launch(q, k, v, out, causal=False, scale=None, lse=None):
    """Launches the cluster kernel on q, k, v into out (and lse, if given); returns what the launch returns
    (triton's compiled kernel: its asm / metadata are what scripts/compile_cluster.py reports)."""
    from .gluon_cluster_sm90 import attn_fwd_cluster_sm90_kernel
    why = reason(q, k, v, out, lse)
    if why:
        raise ValueError(f"attention_cluster_sm90: {why}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if scale <= 0:
        raise ValueError("a positive scale (it is folded into exp2 after the row max)")
    args, kwargs = kernel_args(q, k, v, out, lse, causal, scale * LOG2E)
    return attn_fwd_cluster_sm90_kernel[grid(q.shape[0], q.shape[2], q.shape[1])](*args, **kwargs)


def attention_cluster_sm90(q, k, v, causal=False, scale=None, out=None, return_lse=False, lse=None):
    """softmax(q k^T * scale [top-left causal mask]) v with the 2-CTA cluster kernel: out [B, Sq, Hq, D] in
    q's dtype; with return_lse, (out, lse) with lse [B, Hq, Sq] float32, natural log (written into `lse` if
    given: any strides with a unit one along Sq)."""
    if lse is not None and not return_lse:
        raise ValueError("attention_cluster_sm90: an lse buffer was given without return_lse=True (it would not "
                         "be written)")
    if out is None:
        out = torch.empty_like(q)
    if return_lse and lse is None:
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    launch(q, k, v, out, causal, scale, lse if return_lse else None)
    return (out, lse) if return_lse else out


# the kernel parameters that change between calls of one launch plan (launcher.KernelLauncher's `varying`)
VARYING = ("q_desc", "k_desc", "v_desc", "o_desc", "lse_ptr", "sm_scale")


class ClusterLaunch(AttnLaunch):
    """A planned launch of attn_fwd_cluster_sm90_kernel (c.lse: the lse to write, or the plans' empty stand-in where
    the plan writes none)."""
    __slots__ = ()


class ClusterBackend(Backend):
    """Serves what the kernel serves (the module docstring), on a Hopper GPU under triton 3.9; prefers causal
    problems from configs.CLUSTER_FROM query rows (measured faster than dense.sm90 there)."""
    name = "dense.sm90_cluster"
    gluon = True

    def supports(self, p):
        why = gluon_sm90_reason(p.device) or triton_reason()
        if why:
            return False, why
        if p.varlen:
            return False, "packed (varlen) inputs"
        if p.dtype not in DTYPES or p.out_dtype != p.dtype:
            return False, f"dtype {p.dtype} (output {p.out_dtype}): fp16 or bf16, the output in the same"
        if p.head_dim != D_SERVED or p.head_dim_v != D_SERVED:
            return False, f"head dims D={p.head_dim}, Dv={p.head_dim_v}: D = Dv = {D_SERVED} only"
        if p.opts.softcap > 0 or p.descale:
            return False, "a softcap or descale tensors"
        if p.left >= 0 or p.right > 0:
            return False, f"a window {p.opts.window}: the kernel serves full or causal attention"
        if p.right == 0 and p.opts.bottom_right and p.seqlen_q != p.seqlen_k:
            return False, "causal aligned bottom-right with Sq != Sk: the kernel's causal mask is top-left"
        if p.opts.scale <= 0:
            return False, "a negative scale (the kernel folds a positive scale into exp2 after the row max)"
        if min(p.seqlen_q, p.seqlen_k) == 0:
            return False, "an empty sequence"
        if not all(p.tma):
            return False, "q, k, v or the output is not aligned for tensor descriptors (16-byte base and strides)"
        budget = hw.device_info(p.device).smem_per_block
        if SMEM_BYTES > budget:
            return False, f"it needs {SMEM_BYTES} bytes of shared memory per CTA, the budget is {budget}"
        return True, ""

    def prefers(self, p):
        start = cluster_from(p.right == 0)
        if start is None:
            return False, "non-causal: dense.sm90 measured as fast or faster (configs.CLUSTER_FROM)"
        if p.seqlen_q < start:
            return False, f"causal below {start} query rows: dense.sm90 measured faster (configs.CLUSTER_FROM)"
        return True, ""

    def plan(self, p, c):
        from .gluon_cluster_sm90 import attn_fwd_cluster_sm90_kernel
        # the lse (asked for by the caller, or kept for a gradient): plans.py allocates it [B, Hq, Sq] contiguous,
        # as for dense.sm90, so the backward reads the same layout whichever forward wrote it
        lse = c.lse if p.opts.return_lse else None
        args, kwargs = kernel_args(c.q, c.k, c.v, c.out, lse, p.right == 0, c.scale * LOG2E)
        launcher = KernelLauncher(attn_fwd_cluster_sm90_kernel, args, kwargs, VARYING)
        return ClusterLaunch(grid(p.batch, p.heads_q, p.seqlen_q), launcher)
