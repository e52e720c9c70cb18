"""`tileattn bench cp`: context-parallel (ring) attention, its scaling efficiency.

Scaling efficiency (both modes). For a case (B, H, D, dtype, causal, S_local) on W GPUs:
    t_ring   one ring_attention call (forward, or forward + backward) over W GPUs, each holding S_local tokens
             of the sequence of S = W * S_local tokens (zigzag layout when causal, contiguous when not); the
             slowest rank's median.
    t_1      tileattn.attention (forward, or forward + backward) on one GPU at sequence length S_local, same
             B, H, D, causal.
    F(S)     attention FLOPs: 4 B H S^2 D, halved when causal (x 3.5 for forward + backward; it cancels).
    scaling_efficiency = (F(W S_local) / W / t_ring) / (F(S_local) / t_1) = W t_1 / t_ring:
the per-GPU throughput of the ring against one GPU running the same per-GPU sequence length (the issue's
definition; F(W S) = W^2 F(S), so 1.0 means the ring's W steps cost W single-GPU calls). Causal rings can
exceed 1: their steps past the first are unmasked rectangles, which run faster than a causal square.

Multi-GPU mode (`torchrun --nproc-per-node=N -m tileattn bench cp`, or plain `tileattn bench cp` on a machine
with N >= 2 visible GPUs, which starts one process per GPU): NCCL; W = 2, 4, ... (powers of two below N) and N,
each a sub-group of the first W ranks. First one small case (S_local = 1024, H = 4, Hkv = 2, D = 128, causal
zigzag and full contiguous) is checked on the whole sequence: the ring's outputs and gradients, gathered, against
the float32 reference under the tolerance rule (the input-precision reference as in the other suites), and
against tileattn.attention on one GPU (the difference is reported). Timing: fixed iteration counts (every
rank must run the same number of collectives), CUDA events per iteration, each rank's median, the maximum over
ranks. Summary: `scaling_efficiency_fwdbwd` / `scaling_efficiency_fwd` at the largest W and the largest
S_local of the grid, the minimum over causal and full; `scaling_efficiency_fwdbwd_w<W>` per W.

Single-GPU simulation (`--simulate`): what one GPU can say about the ring.
    (a) Compute of one ring step, timed alone: the forward step (the block's attention + the float32 merge) and
        the backward step (the block's dense backward + the float32 dQ/dK/dV sums), for each block shape
        (causal zigzag: the diagonal step, all queries against the first K/V chunk, the second query chunk
        against all K/V; full: one shape).
    (b) Transfer: a device-to-device copy of one K/V block (and of one float32 dK/dV block), a stand-in for the
        link (it moves the bytes through HBM, not NVLink: a lower bound of the link's time); also the time at a
        nominal NVLink bandwidth (NVLINK_GBPS, one direction).
    Per-step overlap = compute / max(compute, transfer). Predicted ring time for W ranks: the steps' sum of
    max(compute, transfer in flight), plus the backward's last dK/dV hop (ring.py's schedule), and from it the
    predicted efficiency (predicted_*; *_nvlink at the nominal link bandwidth).
    (c) The ring loop itself (ring.py's code, every kernel and merge, host launches included) on one GPU, with
        a transport that copies the block the ring would deliver on a side stream while the step computes:
        simulated_scaling_efficiency_* = W t_1 / t_loop. Causal: ranks 0 and W - 1 are run (their steps have
        the two off-diagonal shapes) and the slower counts: in lockstep every step waits for the slower kind.
        First, the simulated ranks' out, lse and dQ of a small case are checked against the float32 reference
        on the whole sequence (tolerance rule; not dK/dV: they need the other ranks' sums).
    Summary: simulated_scaling_efficiency_{fwd,fwdbwd}_w{2,4,8} at the largest S_local (minimum over causal and
    full), predicted_scaling_efficiency_fwdbwd_w8_nvlink, min_step_overlap_fwdbwd, check_failures.
Grid: B=1, H=32, D=128, bf16, S_local 4K, 8K, 16K, causal (zigzag) and full.
"""
import dataclasses
import os
import time

import torch

from ..ops.dense.api import attention
from ..ops.dense.reference import attention_ref
from ..ops.distributed.api import ring_attention, shard_sequence, unshard_sequence
from ..ops.distributed.problem import RingPlan
from ..ops.distributed.ring import KV_TAG, RingAttention, block_bwd, merge, pack, ring_forward, unpack
from ..ops.distributed.schedule import source_rank, step_parts
from ..tolerance import allowed_error
from .common import Progress, do_bench, finish, fmt, results_header

NVLINK_GBPS = 450.0  # H100 / H200 SXM NVLink 4: 18 links x 25 GB/s per direction (nominal)
FWDBWD_FLOPS = 3.5  # forward + backward FLOPs / forward FLOPs (the backward: 2.5x)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
MODES = ("fwd", "fwdbwd")


@dataclasses.dataclass(frozen=True)
class Grid:
    seqlens: tuple = (4096, 8192, 16384)  # S_local, tokens per GPU
    batch: int = 1
    heads: int = 32
    head_dim: int = 128
    dtype: str = "bf16"
    worlds: tuple = (2, 4, 8)  # --simulate: the ring sizes predicted and simulated
    check_seqlen: int = 1024  # S_local of the output check (H = check_heads, Hkv = check_heads // 2)
    check_heads: int = 4
    iters: int = 10  # multi-GPU: timed iterations per measurement (after 2 warm-up calls)
    device: str = "cuda"  # "cpu": the tests run both modes through the Triton interpreter (times meaningless)


def flops(g, seqlen, causal, mode):
    return 4.0 * g.batch * g.heads * seqlen * seqlen * g.head_dim * (0.5 if causal else 1.0) * \
        (FWDBWD_FLOPS if mode == "fwdbwd" else 1.0)


def _layout(causal):
    return "zigzag" if causal else "contiguous"


def _bench(fn, device):
    """Milliseconds of fn(): do_bench's median on a GPU; on the CPU (the tests: the code paths, not the times)
    one wall time."""
    if device.type == "cuda":
        return do_bench(fn)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _randn(g, *shape, generator=None):
    return torch.randn(*shape, generator=generator).to(device=g.device, dtype=DTYPES[g.dtype])


def _check_inputs(g, world):
    """(q, k, v, dout) of the correctness check: the whole sequence (world * check_seqlen tokens), check_heads
    query heads and half as many K/V heads, the same on every rank (a fixed seed)."""
    gen = torch.Generator().manual_seed(0)
    n, h = world * g.check_seqlen, g.check_heads
    q, k, v = (_randn(g, 1, n, heads, g.head_dim, generator=gen) for heads in (h, h // 2, h // 2))
    return q, k, v, _randn(g, 1, n, h, g.head_dim, generator=gen)


def _fwdbwd(fn, inputs, dout):
    """fn(*inputs) -> out, then the gradients of <out, dout> (a benchmark body)."""
    def run():
        out = fn(*inputs)
        torch.autograd.grad(out[0] if isinstance(out, tuple) else out, inputs, dout)
    return run


def _check(name, got, ref, ref_lp, dtype, failures, log):
    """Tolerance rule of one tensor (got vs the float32 ref, ref_lp the input-precision reference)."""
    err = (got.float() - ref.float()).abs().max().item()
    tol = allowed_error((ref_lp.float() - ref.float()).abs().max().item(), ref.float(), dtype)
    ok = err <= tol and bool(torch.isfinite(got).all())
    if not ok:
        failures.append(name)
        log(f"CHECK FAILED {name}: max error {err:.3e} > {tol:.3e}")
    return {"err": err, "tol": tol}


def _reference(q, k, v, dout, causal, dtype):
    """(out, lse, dq, dk, dv) of the whole sequence through attention_ref in `dtype`."""
    x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*x, causal=causal, dtype=dtype)
    return (out.detach(), lse.detach(), *torch.autograd.grad(out, x, dout.to(dtype)))


# ---------------------------------------------------------------------------------------------------------
# single-GPU simulation
# ---------------------------------------------------------------------------------------------------------
class CopyTransport:
    """The ring's transport on one device: exchange() copies the block that rank `rank` of a `world`-rank ring
    would receive (blocks[src], the pack()ed K/V of each simulated rank; a dK/dV accumulator: `send` itself) into
    `recv`, on a side stream so that it overlaps the step's kernels; wait() makes the current stream wait."""

    def __init__(self, blocks, rank, world, device):
        self.blocks, self.rank, self.world, self.kv_calls = blocks, rank, world, 0
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def exchange(self, send, recv, tag):
        src = send
        if tag == KV_TAG:  # the forward and the backward each make W - 1, for steps 1 .. W - 1
            step = self.kv_calls % (self.world - 1) + 1
            self.kv_calls += 1
            src = self.blocks[source_rank(self.rank, self.world, step)]
        if self.stream is None:
            recv.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            recv.copy_(src)
            done = torch.cuda.Event()
            done.record()
        return done

    @staticmethod
    def wait(handle):
        if handle is not None:
            torch.cuda.current_stream().wait_event(handle)


def _sim_rank(g, causal, world, rank, blocks, q, dout):
    """(fwd fn, fwdbwd fn) of rank `rank` of a simulated `world`-rank ring; blocks: every rank's pack()ed K/V
    (H = Hkv)."""
    shape = q.shape
    k, v = (t.clone().requires_grad_() for t in unpack(blocks[rank], shape, shape))
    plan = RingPlan(rank, world, _layout(causal), causal, g.head_dim ** -0.5,
                    CopyTransport(blocks, rank, world, q.device))

    def fwd():
        with torch.no_grad():
            return ring_forward(plan, q, k, v)
    return fwd, _fwdbwd(lambda *x: RingAttention.apply(*x, plan), (q, k, v), dout)


def _sim_check(g, world, log):
    """The simulated ring's out, lse and dQ of ranks 0 and W - 1 against the float32 reference on the whole
    sequence (check size), causal zigzag and full. Returns (info, failures)."""
    dt, h = DTYPES[g.dtype], g.check_heads
    q, k, v, dout = _check_inputs(g, world)
    info, failures = {}, []
    for causal in (True, False):
        refs = [_reference(q, k, v, dout, causal, d) for d in (torch.float32, dt)]
        lay = dict(world_size=world, layout=_layout(causal))
        blocks = [pack(shard_sequence(k, r, **lay), shard_sequence(v, r, **lay)) for r in range(world)]
        for rank in (0, world - 1):
            ql = shard_sequence(q, rank, **lay).requires_grad_()
            plan = RingPlan(rank, world, _layout(causal), causal, g.head_dim ** -0.5,
                            CopyTransport(blocks, rank, world, q.device))
            kv_shape = ql.shape[:2] + (h // 2, g.head_dim)
            kl, vl = (t.clone().requires_grad_() for t in unpack(blocks[rank], kv_shape, kv_shape))
            out, lse = RingAttention.apply(ql, kl, vl, plan)
            dq, = torch.autograd.grad(out, (ql,), shard_sequence(dout, rank, **lay))
            for name, got, i, dim in (("out", out, 0, 1), ("lse", lse, 1, 2), ("dq", dq, 2, 1)):
                ref, ref_lp = (shard_sequence(r[i], rank, seq_dim=dim, **lay) for r in refs)
                key = f"sim-w{world}-rank{rank}-{'causal' if causal else 'full'}-{name}"
                info[key] = _check(key, got, ref, ref_lp, dt, failures, log)
    return info, failures


def _step_times(g, causal, q, k, v, dout):
    """{kind: (forward step ms, backward step ms)} of the ring step shapes (module docstring, (a))."""
    sl, dev = q.shape[1], q.device
    out, lse = attention(q, k, v, causal=causal, return_lse=True)
    acc, lse_acc = out.float(), lse.clone()
    dq = torch.zeros(q.shape, dtype=torch.float32, device=dev)
    dkv = torch.zeros(k.numel() + v.numel(), dtype=torch.float32, device=dev)
    dk_acc, dv_acc = unpack(dkv, k.shape, v.shape)
    plan = RingPlan(0, 2, _layout(causal), causal, g.head_dim ** -0.5, None)
    kinds = {"diagonal": (0, 0), "first_kv_chunk": (1, 0), "second_q_chunk": (0, 1)} if causal else {"full": (0, 1)}
    times = {}
    for kind, (rank, src) in kinds.items():
        part, = step_parts(_layout(causal), causal, rank, src, sl, sl)
        rows, keys = part.q_rows, part.k_rows

        def fwd_step():
            o, l = attention(q[:, rows], k[:, keys], v[:, keys], causal=part.causal, scale=plan.scale,
                             return_lse=True)
            merge(acc, lse_acc, o, l, rows)

        def bwd_step():
            dq_p, dk_p, dv_p = block_bwd(plan, part, (q, out, lse, dout, None), k, v)
            dq[:, rows] += dq_p
            dk_acc[:, keys] += dk_p
            dv_acc[:, keys] += dv_p
        times[kind] = (_bench(fwd_step, dev), _bench(bwd_step, dev))
    return times


def _predict(world, steps, kv_ms, grad_ms):
    """(forward ms, forward + backward ms) of a `world`-rank ring from its step times and transfer times
    (ring.py's schedule: step s's compute overlaps the transfer of step s + 1's K/V and of step s - 1's dK/dV)."""
    off = [t for kind, t in steps.items() if kind != "diagonal"]
    first = steps.get("diagonal", off[0])
    fwd_off, bwd_off = max(t[0] for t in off), max(t[1] for t in off)
    fwd = bwd = 0.0
    for s in range(world):
        c_fwd, c_bwd = first if s == 0 else (fwd_off, bwd_off)
        fwd += max(c_fwd, kv_ms if s < world - 1 else 0.0)
        bwd += max(c_bwd, (kv_ms if s < world - 1 else 0.0) + (grad_ms if s > 0 else 0.0))
    return fwd, fwd + bwd + grad_ms


def _simulate_case(g, causal, sl, rows, model, log, progress):
    dev, dt = torch.device(g.device), DTYPES[g.dtype]
    q, k, v = (_randn(g, g.batch, sl, g.heads, g.head_dim).requires_grad_() for _ in range(3))
    dout = _randn(g, g.batch, sl, g.heads, g.head_dim)
    single = {"fwd": _bench(lambda: attention(q.detach(), k.detach(), v.detach(), causal=causal), dev),
              "fwdbwd": _bench(_fwdbwd(lambda *x: attention(*x, causal=causal), (q, k, v), dout), dev)}
    with torch.no_grad():
        steps = _step_times(g, causal, q.detach(), k.detach(), v.detach(), dout)
    kv = pack(k.detach(), v.detach())
    grad = torch.zeros(kv.numel(), dtype=torch.float32, device=dev)
    kv_ms = _bench(lambda: torch.empty_like(kv).copy_(kv), dev)
    grad_ms = _bench(lambda: torch.empty_like(grad).copy_(grad), dev)
    link_kv, link_grad = (t.numel() * t.element_size() / (NVLINK_GBPS * 1e9) * 1e3 for t in (kv, grad))
    case = {"B": g.batch, "H": g.heads, "D": g.head_dim, "dtype": str(dt)[6:], "S_local": sl,
            "causal": causal, "layout": _layout(causal)}
    off = [t for kind, t in steps.items() if kind != "diagonal"]
    entry = {"case": case, "single_ms": single, "step_ms": steps, "copy_kv_ms": kv_ms, "copy_grad_ms": grad_ms,
             "nvlink_kv_ms": link_kv, "nvlink_grad_ms": link_grad,
             "step_overlap_fwd": min(t[0] / max(t[0], kv_ms) for t in off),
             "step_overlap_fwdbwd": min((t[0] + t[1]) / max(t[0] + t[1], 2 * kv_ms + grad_ms) for t in off),
             "worlds": {}}
    for mode in MODES:
        rows.append({"case": {**case, "mode": mode}, "provider": "single", "ms": single[mode],
                     "tflops": flops(g, sl, causal, mode) / (single[mode] * 1e-3) / 1e12})
    for world in g.worlds:
        pred = _predict(world, steps, kv_ms, grad_ms)
        pred_link = _predict(world, steps, link_kv, link_grad)
        blocks = [pack(_randn(g, g.batch, sl, g.heads, g.head_dim), _randn(g, g.batch, sl, g.heads, g.head_dim))
                  for _ in range(world)]
        loop = {mode: 0.0 for mode in MODES}
        for rank in ((0, world - 1) if causal else (0,)):
            fns = _sim_rank(g, causal, world, rank, blocks, q.detach().requires_grad_(), dout)
            for mode, fn in zip(MODES, fns):
                loop[mode] = max(loop[mode], _bench(fn, dev))
        blocks = fns = None  # frees the device memory now
        res = {}
        for i, mode in enumerate(MODES):
            res[mode] = {"predicted_ms": pred[i], "predicted_nvlink_ms": pred_link[i], "simulated_ms": loop[mode],
                         "predicted_efficiency": world * single[mode] / pred[i],
                         "predicted_efficiency_nvlink": world * single[mode] / pred_link[i],
                         "simulated_efficiency": world * single[mode] / loop[mode]}
            rows.append({"case": {**case, "mode": mode}, "provider": f"sim-ring-w{world}", "ms": loop[mode],
                         "tflops": flops(g, world * sl, causal, mode) / world / (loop[mode] * 1e-3) / 1e12})
        entry["worlds"][world] = res
        log(progress() + f"{sl:>7} {str(causal):>6} {world:>3} " + " ".join(
            f"{res[m]['simulated_efficiency']:>9.3f} {res[m]['predicted_efficiency']:>9.3f} "
            f"{res[m]['predicted_efficiency_nvlink']:>9.3f}" for m in MODES))
    model.append(entry)


def run_simulate(grid, out_json=None, plot=None, log=print):
    doc = results_header("cp")
    doc["mode"] = "simulate"
    doc["grid"] = dataclasses.asdict(grid)
    rows, model = [], []
    check_info, failures = _sim_check(grid, max(grid.worlds), log)
    progress = Progress(len(grid.seqlens) * 2 * len(grid.worlds))
    log(f"{'S_local':>7} {'causal':>6} {'W':>3} " + " ".join(f"{m + ' sim':>9} {'predict':>9} {'nvlink':>9}"
                                                             for m in MODES) + "   efficiency")
    for causal in (False, True):
        for sl in grid.seqlens:
            _simulate_case(grid, causal, sl, rows, model, log, progress)
            if grid.device == "cuda":
                torch.cuda.empty_cache()
    doc.update(rows=rows, model=model, check=check_info)
    top = [m for m in model if m["case"]["S_local"] == max(grid.seqlens)]
    summary = {"s_local": max(grid.seqlens)}
    for mode in MODES:
        for w in grid.worlds:
            summary[f"simulated_scaling_efficiency_{mode}_w{w}"] = min(
                m["worlds"][w][mode]["simulated_efficiency"] for m in top)
    w_max = max(grid.worlds)
    summary[f"predicted_scaling_efficiency_fwdbwd_w{w_max}"] = min(
        m["worlds"][w_max]["fwdbwd"]["predicted_efficiency"] for m in top)
    summary[f"predicted_scaling_efficiency_fwdbwd_w{w_max}_nvlink"] = min(
        m["worlds"][w_max]["fwdbwd"]["predicted_efficiency_nvlink"] for m in top)
    summary["min_step_overlap_fwdbwd"] = min(m["step_overlap_fwdbwd"] for m in model)
    summary["check_failures"] = len(failures)
    doc["summary"] = summary
    return finish(doc, out_json, log, plot)


# ---------------------------------------------------------------------------------------------------------
# multi-GPU (one process per GPU)
# ---------------------------------------------------------------------------------------------------------
def _timed(fn, group, g, device):
    """Median ms of fn() on this rank (2 warm-up calls, g.iters timed, CUDA events per call), the maximum over
    the ranks of `group` (None: this rank alone). Every rank makes the same calls (no adaptive counts)."""
    import torch.distributed as dist
    for _ in range(2):
        fn()
    if group is not None:
        dist.barrier(group)
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(g.iters + 1)]
        events[0].record()
        for i in range(g.iters):
            fn()
            events[i + 1].record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in zip(events[:-1], events[1:])]
    else:
        for _ in range(g.iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    ms = torch.tensor([sorted(times)[len(times) // 2]], dtype=torch.float64,
                      device=device if device.type == "cuda" else "cpu")
    if group is not None:
        dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=group)
    return ms.item()


def _multi_check(g, rank, world, log):
    """The ring on every rank against the float32 reference and tileattn.attention on the gathered whole
    sequence (rank 0 compares). Returns (info, failures) on rank 0, ({}, []) elsewhere."""
    import torch.distributed as dist
    dt = DTYPES[g.dtype]
    q, k, v, dout = _check_inputs(g, world)
    info, failures = {}, []
    for causal in (True, False):
        lay = dict(world_size=world, layout=_layout(causal))
        ql, kl, vl = (shard_sequence(t, rank, **lay).requires_grad_() for t in (q, k, v))
        out, lse = ring_attention(ql, kl, vl, causal=causal, layout=_layout(causal), return_lse=True)
        grads = torch.autograd.grad(out, (ql, kl, vl), shard_sequence(dout, rank, **lay))
        got = [unshard_sequence(t.detach(), layout=_layout(causal), seq_dim=2 if i == 1 else 1)
               for i, t in enumerate((out, lse, *grads))]
        if rank == 0:
            refs = [_reference(q, k, v, dout, causal, d) for d in (torch.float32, dt)]
            x = [t.detach().requires_grad_() for t in (q, k, v)]
            o1, l1 = attention(*x, causal=causal, return_lse=True)
            single = (o1, l1, *torch.autograd.grad(o1, x, dout))
            for i, name in enumerate(("out", "lse", "dq", "dk", "dv")):
                key = f"ring-w{world}-{'causal' if causal else 'full'}-{name}"
                info[key] = _check(key, got[i], refs[0][i], refs[1][i], dt, failures, log)
                info[key]["vs_single_gpu"] = (got[i].float() - single[i].float()).abs().max().item()
        dist.barrier()
    return info, failures


def _sub_worlds(world):
    ws, w = [], 2
    while w < world:
        ws.append(w)
        w *= 2
    return ws + [world]


def run_multi(grid, rank, world, out_json=None, plot=None, log=print):
    """The multi-GPU mode's body on every rank of the initialized default group; rank 0 writes the results
    and returns the document, the others return None."""
    import torch.distributed as dist
    device = torch.device(grid.device)
    log = log if rank == 0 else (lambda *a, **k: None)
    doc = results_header("cp")
    doc.update(mode="multi-gpu", world_size=world, grid=dataclasses.asdict(grid))
    check_info, failures = _multi_check(grid, rank, world, log)
    worlds = _sub_worlds(world)
    groups = {w: dist.new_group(list(range(w))) for w in worlds}  # every rank makes every group, in order
    rows, ring = [], {}
    log(f"{'W':>3} {'S_local':>7} {'causal':>6} {'fwd ms':>9} {'fwdbwd ms':>10}")
    for w in worlds:
        if rank < w:
            for causal in (False, True):
                for sl in grid.seqlens:
                    q, k, v = (_randn(grid, grid.batch, sl, grid.heads, grid.head_dim).requires_grad_()
                               for _ in range(3))
                    dout = _randn(grid, grid.batch, sl, grid.heads, grid.head_dim)
                    opts = dict(causal=causal, layout=_layout(causal))
                    with torch.no_grad():
                        fwd = _timed(lambda: ring_attention(q, k, v, groups[w], **opts), groups[w], grid, device)
                    both = _timed(_fwdbwd(lambda *x: ring_attention(*x, groups[w], **opts), (q, k, v), dout),
                                  groups[w], grid, device)
                    ring[w, causal, sl] = {"fwd": fwd, "fwdbwd": both}
                    log(f"{w:>3} {sl:>7} {str(causal):>6} {fwd:>9.3f} {both:>10.3f}")
                    q = k = v = dout = None  # frees the device memory now
        dist.barrier()
    single = {}
    if rank == 0:
        for causal in (False, True):
            for sl in grid.seqlens:
                q, k, v = (_randn(grid, grid.batch, sl, grid.heads, grid.head_dim).requires_grad_() for _ in range(3))
                dout = _randn(grid, grid.batch, sl, grid.heads, grid.head_dim)
                with torch.no_grad():
                    fwd = _timed(lambda: attention(q, k, v, causal=causal), None, grid, device)
                both = _timed(_fwdbwd(lambda *x: attention(*x, causal=causal), (q, k, v), dout), None, grid, device)
                single[causal, sl] = {"fwd": fwd, "fwdbwd": both}
    dist.barrier()
    if rank != 0:
        return None
    eff = {}
    for (w, causal, sl), t in ring.items():
        case = {"B": grid.batch, "H": grid.heads, "D": grid.head_dim, "dtype": str(DTYPES[grid.dtype])[6:],
                "S_local": sl, "causal": causal, "layout": _layout(causal)}
        for mode in MODES:
            t1 = single[causal, sl][mode]
            eff[w, causal, sl, mode] = w * t1 / t[mode]
            rows.append({"case": {**case, "mode": mode}, "provider": f"ring-w{w}", "ms": t[mode],
                         "tflops": flops(grid, w * sl, causal, mode) / w / (t[mode] * 1e-3) / 1e12,
                         "scaling_efficiency": eff[w, causal, sl, mode]})
            if w == worlds[0]:
                rows.append({"case": {**case, "mode": mode}, "provider": "single", "ms": t1,
                             "tflops": flops(grid, sl, causal, mode) / (t1 * 1e-3) / 1e12})
    top = max(grid.seqlens)
    summary = {"world_size": world, "s_local": top}
    for mode in MODES:
        summary[f"scaling_efficiency_{mode}"] = min(eff[world, c, top, mode] for c in (False, True))
    for w in worlds:
        summary[f"scaling_efficiency_fwdbwd_w{w}"] = min(eff[w, c, top, "fwdbwd"] for c in (False, True))
    summary["check_failures"] = len(failures)
    doc.update(rows=rows, check=check_info, summary=summary)
    log("efficiency (W t_1 / t_ring): " + ", ".join(f"W={w} S_local={sl} {'causal' if c else 'full'} {m}: "
                                                    f"{fmt(e, '{:.3f}')}" for (w, c, sl, m), e in eff.items()))
    return finish(doc, out_json, log, plot)


def _init_and_run(grid, rank, world, init_method, out_json, plot, log=print):
    """One process of the multi-GPU mode: its GPU (torch.cuda.set_device(rank) for a spawned process, LOCAL_RANK
    under torchrun), the group (NCCL; gloo for the CPU tests), the body."""
    import torch.distributed as dist
    if grid.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl" if grid.device == "cuda" else "gloo", init_method=init_method, rank=rank,
                            world_size=world)
    try:
        return run_multi(grid, rank, world, out_json, plot, log)
    finally:
        dist.destroy_process_group()


def _spawned(rank, world, init_method, grid, out_json, plot):
    _init_and_run(grid, rank, world, init_method, out_json, plot)


def launched_by_torchrun():
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) and \
        int(os.environ["WORLD_SIZE"]) > 1


def gpus_for_multi():
    """The ranks the multi-GPU mode would run: torchrun's world size, else the visible GPUs (0 or 1: none)."""
    if launched_by_torchrun():
        return int(os.environ["WORLD_SIZE"])
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run(grid, simulate=False, out_json=None, plot=None, log=print, world=None):
    """The suite: --simulate on this GPU, else the multi-GPU mode (under torchrun in this process; otherwise
    one spawned process per visible GPU, or `world` processes). Returns the results document (None on torchrun's
    ranks other than 0)."""
    if simulate:
        return run_simulate(grid, out_json, plot, log)
    if launched_by_torchrun():
        return _init_and_run(grid, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", out_json, plot,
                             log)
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp
    world = world or gpus_for_multi()
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = out_json or os.path.join(tmp, "cp.json")
        mp.spawn(_spawned, args=(world, f"tcp://127.0.0.1:{port}", grid, path, plot), nprocs=world)
        with open(path) as f:
            return json.load(f)
