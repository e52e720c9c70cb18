"""Backward of attention / varlen_attention / scaled_dot_product_attention against autograd through the
float32 reference (tolerance rule: the input-precision error is autograd through the same reference computed
in the inputs' dtype)."""
import contextlib

import pytest
import torch

import tileattn
from tileattn.ops.dense.reference import attention_ref, varlen_attention_ref

from tests.helpers import assert_close, randn

DT = torch.float16  # bf16 dots are wrong in the CPU interpreter; bf16 runs in the GPU tests


def leaf(*shape, dtype, device):
    return randn(*shape, dtype=dtype, device=device).requires_grad_()


def grads(fn, inputs, weights):
    """Gradients of sum(out * w) (+ sum(lse * w_lse) when fn returns lse too) w.r.t. inputs."""
    res = fn(*inputs)
    outs = res if isinstance(res, tuple) else (res, )
    loss = sum((o.float() * w).sum() for o, w in zip(outs, weights))
    return torch.autograd.grad(loss, inputs)


def check_grads(fn, ref_fn, q, k, v, with_lse=False):
    out = fn(q, k, v)
    outs = out if isinstance(out, tuple) else (out, )
    weights = [torch.randn(o.shape, device=o.device) for o in outs][: 2 if with_lse else 1]
    got = grads(fn, (q, k, v), weights)
    f32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = grads(lambda *a: ref_fn(*a, torch.float32), f32, weights)
    lp = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    ref_lp = grads(lambda *a: ref_fn(*a, q.dtype), lp, weights)
    for name, g, r, rl in zip(("dq", "dk", "dv"), got, ref, ref_lp):
        assert g.dtype == q.dtype and g.shape == r.shape
        assert_close(name, g, r, rl)


CASES = [  # (B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap)
    (2, 37, 37, 2, 2, 32, 32, False, (-1, -1), 0.0),
    (1, 50, 50, 4, 2, 32, 48, True, (-1, -1), 0.0),
    (2, 33, 70, 4, 1, 64, 64, True, (-1, -1), 0.0),
    (1, 70, 33, 2, 2, 32, 32, True, (-1, -1), 0.0),
    (1, 64, 64, 2, 2, 32, 32, False, (9, 3), 0.0),
    (1, 45, 45, 2, 2, 32, 32, True, (-1, -1), 5.0),
    (1, 30, 50, 2, 2, 32, 32, False, (7, -1), 0.0),
    (1, 50, 30, 4, 2, 32, 32, False, (-1, 4), 3.0),
    (1, 40, 40, 2, 2, 32, 32, False, (2 ** 31 - 1, -1), 0.0),
    # unmasked tiles between masked ones (window), tiles that need no mask at all (whole tiles, no rule)
    (1, 100, 100, 2, 1, 32, 32, False, (40, 20), 0.0),
    (2, 64, 48, 2, 2, 32, 32, False, (-1, -1), 0.0),
    (1, 96, 64, 2, 2, 32, 32, True, (-1, -1), 2.0),
    # head dims above 256: launch_bwd_large_d.py (score tiles, then GEMMs; varlen: kernels_bwd_large_d.py's fused
    # kernels, test_varlen_backward)
    (1, 37, 37, 2, 1, 320, 320, True, (-1, -1), 0.0),
    (2, 40, 70, 2, 2, 512, 384, False, (9, 3), 0.0),
    (1, 50, 30, 4, 2, 296, 512, True, (-1, -1), 5.0),
    (1, 48, 48, 2, 2, 320, 320, False, (-1, -1), 0.0),  # whole 16-row tiles, not whole 32-row ones
]


@pytest.mark.parametrize("B,hq,hkv,window,budget", [
    (1, 2, 1, (-1, -1), 1), (1, 2, 1, (-1, 0), 1), (2, 2, 1, (100, 0), 2 << 20), (2, 2, 2, (-1, 0), 1 << 20)],
    ids=["rows", "causal-rows", "window-units", "mha-direct"])
def test_large_d_split_chunks(B, hq, hkv, window, budget, device, monkeypatch):
    """The split large-D backward (launch_bwd_large_d.py) across its chunkings: rows of one (batch, kv head)
    unit at a time (a workspace budget below one row chunk: float32 dK / dV sums), units of both batches in one
    chunk, a mask rule's row chunks and their key spans (260 rows: 128-row chunks, the last partial), GQA
    stacking, Sq != Sk; one query head per kv head: GEMMs on views of the tensors, a chunk per batch."""
    from tileattn.ops.dense import launch_bwd_large_d
    monkeypatch.setattr(launch_bwd_large_d, "WORKSPACE_BYTES", budget)
    monkeypatch.setattr(launch_bwd_large_d, "DIRECT_MIN_WORK", 0)  # (the batched CASES above take the copies)
    q = leaf(B, 260, hq, 264, dtype=DT, device=device)
    k, v = leaf(B, 270, hkv, 264, dtype=DT, device=device), leaf(B, 270, hkv, 272, dtype=DT, device=device)

    def ref(q, k, v, dtype):
        return attention_ref(q, k, v, dtype=dtype, window=window)[0]
    check_grads(lambda q, k, v: tileattn.attention(q, k, v, window=window), ref, q, k, v)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Sq{}-Sk{}-H{}/{}-D{}/{}-c{}-w{}-s{}".format(*c))
def test_attention_backward(case, device):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap = case
    q, k, v = leaf(B, Sq, Hq, D, dtype=DT, device=device), leaf(B, Sk, Hkv, D, dtype=DT, device=device), \
        leaf(B, Sk, Hkv, Dv, dtype=DT, device=device)
    opts = dict(causal=causal, window=window, softcap=softcap)

    def ref(q, k, v, dtype):
        return attention_ref(q, k, v, dtype=dtype, **opts)[0]
    check_grads(lambda q, k, v: tileattn.attention(q, k, v, **opts), ref, q, k, v)


@pytest.mark.parametrize("D", [32, 264], ids=["whole-row", "split"])
def test_backward_through_lse(D, device):
    """The returned lse takes part in the loss: its gradient flows to q and k (the split backward's too)."""
    q, k, v = (leaf(1, 40, 2, D, dtype=DT, device=device) for _ in range(3))

    def ref(q, k, v, dtype):
        return attention_ref(q, k, v, causal=True, dtype=dtype)
    check_grads(lambda q, k, v: tileattn.attention(q, k, v, causal=True, return_lse=True), ref, q, k, v,
                with_lse=True)


@pytest.mark.parametrize("lse_in_loss,d,dv", [(False, 32, 48), (True, 32, 48), (True, 320, 264)],
                         ids=["out", "lse", "large-d"])
def test_varlen_backward(lse_in_loss, d, dv, device):
    """Empty sequences, Dv != D, rows past cu_seqlens[-1] (padding: zero gradients), lse in the loss; head dims
    above 256 too (kernels_bwd_large_d.py)."""
    lens_q, lens_k = [5, 0, 40, 17], [9, 3, 40, 30]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = leaf(sum(lens_q) + 3, 4, d, dtype=DT, device=device)
    k, v = leaf(sum(lens_k) + 2, 2, d, dtype=DT, device=device), leaf(sum(lens_k) + 2, 2, dv, dtype=DT,
                                                                     device=device)

    def fn(q, k, v):
        return tileattn.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                         window=(20, -1), return_lse=lse_in_loss)

    def ref(q, k, v, dtype):
        res = varlen_attention_ref(q, k, v, cu_q, cu_k, dtype=dtype, causal=True, window=(20, -1))
        out = torch.cat([res[0], torch.zeros(3, 4, dv, dtype=dtype, device=q.device)])
        lse = torch.cat([res[1], torch.zeros(4, 3, dtype=dtype, device=q.device)], dim=1)
        return (out, lse) if lse_in_loss else out
    check_grads(fn, ref, q, k, v, with_lse=lse_in_loss)
    dq, dk, dv_ = grads(fn, (q, k, v), [torch.ones(q.shape[0], 4, dv, device=device)])
    assert dq[-3:].abs().max() == 0 and dk[-2:].abs().max() == 0 and dv_[-2:].abs().max() == 0


def test_lse_gradient_layouts(device):
    """lse.sum() hands the backward an expanded (stride 0) gradient, a transpose a strided one."""
    q, k, v = (leaf(2, 33, 2, 32, dtype=DT, device=device) for _ in range(3))
    w = torch.randn(2, 33, 2, device=device)

    def loss(fn):
        out, lse = fn(q, k, v)
        return lse.sum() + (lse.transpose(1, 2) * w).sum() + out.float().mean()

    got = torch.autograd.grad(loss(lambda *a: tileattn.attention(*a, causal=True, return_lse=True)), (q, k, v))
    f32 = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = torch.autograd.grad(loss(lambda *a: attention_ref(*(f32 if a[0] is q else a), causal=True)), f32)
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(g).all(), name
        assert (g.float() - r).abs().max() <= 2e-2 * r.abs().max() + 1e-3, name


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backward_and_checkpoint(causal, device):
    """scaled_dot_product_attention ([B, H, S, D], GQA, Sq != Sk, causal top-left) under activation
    checkpointing."""
    from torch.utils.checkpoint import checkpoint
    q = leaf(2, 4, 30, 32, dtype=DT, device=device)
    k, v = leaf(2, 2, 41, 32, dtype=DT, device=device), leaf(2, 2, 41, 32, dtype=DT, device=device)

    def fn(q, k, v):
        return checkpoint(tileattn.scaled_dot_product_attention, q, k, v, is_causal=causal, enable_gqa=True,
                          use_reentrant=False)

    def ref(q, k, v, dtype):
        out = attention_ref(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                            causal="top_left" if causal else False, dtype=dtype)[0]
        return out.transpose(1, 2)
    check_grads(fn, ref, q, k, v)


def test_eager_path_and_registered_op_agree(device):
    """Plain eager tensors take custom_ops.EagerAttn, a Parameter (a tensor subclass) the registered op: both
    record their own backward node and give bit-identical outputs, lse and gradients (the same kernels)."""
    q, k, v = (randn(2, 40, 4, 32, dtype=DT, device=device) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]  # GQA, strided K/V views
    w = torch.randn(2, 40, 4, 32, device=device)
    w_lse = torch.randn(2, 4, 40, device=device)
    results = {}
    for kind, make in (("eager", lambda t: t.clone().requires_grad_()),
                       ("op", lambda t: torch.nn.Parameter(t.clone()))):
        x = [make(t) for t in (q, k, v)]
        out, lse = tileattn.attention(*x, causal=True, window=(20, -1), return_lse=True)
        results[kind] = (type(out.grad_fn).__name__, out, lse,
                         *torch.autograd.grad((out.float() * w).sum() + (lse * w_lse).sum(), x))
    assert "EagerAttn" in results["eager"][0] and "EagerAttn" not in results["op"][0], \
        (results["eager"][0], results["op"][0])
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), results["eager"][1:], results["op"][1:]):
        assert torch.equal(a, b), name


def test_backward_plan_replay(device):
    """A repeated backward replays its launch plan (bwd.attn_bwd_planned): bit-identical to the call that made
    the plan, new data of the same layout gives the new gradients (checked against the reference), another
    layout (strided K/V views) or other options get their own plan."""
    from tileattn.ops.dense import bwd, plans
    plans.clear_plans()
    w = torch.randn(2, 48, 4, 32, device=device)

    def fn(*a):
        return tileattn.attention(*a, causal=True)
    results = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        q, k, v = (leaf(2, 48, 4, 32, dtype=DT, device=device) for _ in range(3))
        first = grads(fn, (q, k, v), [w])  # seed 1: makes the plan; seed 2: replays it
        again = grads(fn, (q, k, v), [w])  # replays
        assert bwd.count_plans() == 1
        for name, a, b in zip(("dq", "dk", "dv"), first, again):
            assert torch.equal(a, b), name
        check_grads(fn, lambda *a: attention_ref(*a[:3], causal=True, dtype=a[3])[0], q, k, v)
        results.append(again)
    assert not torch.equal(results[0][0], results[1][0])  # new data, new gradients
    kv = leaf(2, 48, 8, 32, dtype=DT, device=device)
    q = leaf(2, 48, 4, 32, dtype=DT, device=device)
    grads(fn, (q, kv[:, :, :4], kv[:, :, 4:]), [w])
    grads(lambda *a: tileattn.attention(*a, window=(5, 5)), (q, kv[:, :, :4], kv[:, :, 4:]), [w])
    assert bwd.count_plans() == 3
    # one tensor as q, k and v (self-attention on x) planned first, then three tensors of that layout: their
    # own plan (the first one's launches take x in every place)
    plans.clear_plans()
    x = leaf(2, 48, 4, 32, dtype=DT, device=device)
    grads(fn, (x, x, x), [w])
    q, k, v = (leaf(2, 48, 4, 32, dtype=DT, device=device) for _ in range(3))
    check_grads(fn, lambda *a: attention_ref(*a[:3], causal=True, dtype=a[3])[0], q, k, v)
    assert bwd.count_plans() == 2
    # an output gradient that is q itself, planned first, then a separate one
    plans.clear_plans()
    out = fn(q, k, v)
    torch.autograd.grad(out, (q, k, v), q, retain_graph=True)
    check_grads(fn, lambda *a: attention_ref(*a[:3], causal=True, dtype=a[3])[0], q, k, v)


def test_backward_plan_saved_tensor_hooks(device):
    """Saved-tensor hooks may hand the backward other layouts than the forward's (save_on_cpu(pin_memory=True) and
    offloading hooks give back contiguous copies; here a hook that copies): a plan made under the hooks is not
    replayed on the forward's own (transposed) tensors, and the gradients equal those of a plan made without."""
    from tileattn.ops.dense import bwd, plans
    torch.manual_seed(0)
    q, k, v = (randn(1, 2, 48, 32, dtype=DT, device=device).transpose(1, 2).requires_grad_() for _ in range(3))
    w = torch.randn(1, 48, 2, 32, device=device)

    def run(hooks):
        copy = torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(memory_format=torch.contiguous_format),
                                                        lambda t: t)
        with copy if hooks else contextlib.nullcontext():
            out = tileattn.attention(q, k, v, causal=True)
        return torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    plans.clear_plans()
    ref = run(False)
    plans.clear_plans()
    run(True)  # planned on contiguous copies
    got = run(False)  # the transposed tensors: a plan of their own
    assert bwd.count_plans() == 2
    for name, a, b in zip(("dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), name


def test_tracked_repeat_call_fast_path(device, monkeypatch):
    """A repeated tracked call (tensor layouts already checked) builds its options string once (api's fast path):
    the string is the one the full path builds, outputs and gradients are bit-identical to the first call's, and
    the options and the backward's head-dim limit are still checked on every call."""
    from tileattn.ops.dense import api, custom_ops
    from tileattn.ops.dense.problem import AttnOptions
    strings, fast = [], []
    real, real_fast = custom_ops.EagerAttn.apply, api._attention_tracked
    monkeypatch.setattr(custom_ops.EagerAttn, "apply", lambda *a: strings.append(a[-1]) or real(*a))
    monkeypatch.setattr(api, "_attention_tracked", lambda *a: fast.append(1) or real_fast(*a))
    q, k, v = (leaf(1, 24, 2, 32, dtype=DT, device=device) for _ in range(3))
    w = torch.randn(1, 24, 2, 32, device=device)
    runs = [tileattn.attention(q, k, v, window=(5, 3), softcap=2, scale=0.3) for _ in range(2)]
    assert strings[0] == strings[1] == AttnOptions(scale=0.3, window=(5, 3), softcap=2.0, return_lse=True).encode()
    assert len(fast) == 1  # the second call
    grads = [torch.autograd.grad((o.float() * w).sum(), (q, k, v)) for o in runs]
    assert torch.equal(runs[0], runs[1]) and all(torch.equal(a, b) for a, b in zip(*grads))
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)  # another options string, kept apart
    assert strings[-1] == AttnOptions(scale=32 ** -0.5, window=(-1, 0), return_lse=True).encode()
    assert lse.shape == (1, 2, 24)
    with pytest.raises(ValueError, match="scale"):
        tileattn.attention(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="window"):
        tileattn.attention(q, k, v, window=(-2, 0))
    big = [leaf(1, 8, 1, 520, dtype=DT, device=device) for _ in range(3)]
    with torch.no_grad():
        tileattn.attention(*big)  # the no-grad call keeps an entry for these layouts
    with pytest.raises(ValueError, match="head dims up to 512"):
        tileattn.attention(*big)


def test_eager_path_keeps_dispatch_modes_and_refuses_double_backward(device):
    """Under a dispatch mode (FlopCounterMode) the call takes the registered op, which the mode sees; a double
    backward through the eager path raises instead of treating the gradient as a constant."""
    from torch.utils.flop_counter import FlopCounterMode
    q, k, v = (leaf(1, 16, 2, 32, dtype=DT, device=device) for _ in range(3))
    with FlopCounterMode(display=False):
        out = tileattn.attention(q, k, v, causal=True)
    assert "EagerAttn" not in type(out.grad_fn).__name__
    out = tileattn.attention(q, k, v, causal=True)
    assert "EagerAttn" in type(out.grad_fn).__name__
    g = torch.autograd.grad(out.float().square().sum(), q, create_graph=True)[0]
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.float().sum().backward()


def test_fp8_has_no_backward(device):
    q, k, v = (randn(1, 16, 2, 32, dtype=DT, device=device) for _ in range(3))
    q8, k8, v8 = (x.to(torch.float8_e4m3fn).requires_grad_() for x in (q, k, v))
    out = tileattn.attention(q8, k8, v8)
    with pytest.raises(NotImplementedError, match="fp8"):
        out.float().sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128, 256, 320, 512])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_backward(D, causal, dtype, device):
    q = leaf(2, 1000, 8, D, dtype=dtype, device=device)
    k, v = leaf(2, 1000, 2, D, dtype=dtype, device=device), leaf(2, 1000, 2, D, dtype=dtype, device=device)

    def ref(q, k, v, dt):
        return attention_ref(q, k, v, causal=causal, dtype=dt)[0]
    check_grads(lambda q, k, v: tileattn.attention(q, k, v, causal=causal), ref, q, k, v)


def _sm90_launches(monkeypatch):
    """Records every launch of the dense Hopper backward's host side from now on (its kernel, then the dQ
    conversion) as (grid, args, kwargs), in the returned list; kept plans are cleared, since a plan replays
    without passing through attn_bwd_sm90."""
    from tileattn.ops.dense import launch_bwd_sm90, plans
    launches = []
    real = launch_bwd_sm90.attn_bwd_sm90

    def spy(p, c, do, delta, grads, sums, tail, launch):
        def record(kernel, grid, args, kw):
            launches.append((grid, args, kw))
            return launch(kernel, grid, args, kw)
        return real(p, c, do, delta, grads, sums, tail, record)
    monkeypatch.setattr(launch_bwd_sm90, "attn_bwd_sm90", spy)
    plans.clear_plans()
    return launches


@pytest.mark.gpu
@pytest.mark.parametrize("sm90_bwd,D,causal", [("0", 128, True), ("1", 128, True), ("1", 128, False), ("1", 64, True),
                                               ("1", 64, False), ("0", 512, True), ("1", 256, True)],
                         ids=["triton", "sm90", "sm90-noncausal", "sm90-d64", "sm90-d64-noncausal", "large-d",
                              "split-d256"])
def test_gpu_backward_deterministic(sm90_bwd, D, causal, device, monkeypatch):
    """Three runs, bit-identical gradients: the Triton kernels, the Hopper kernel (both dQ splits: head dim
    halves at D=128, row halves at D=64; both step orders: causal, and non-causal with dQ under dK), the
    split backward (D=512: the Triton score kernel; D=256: the Hopper one)."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import launch_bwd_sm90
    monkeypatch.setenv("TILEATTN_SM90_BWD", sm90_bwd)
    q = leaf(2, 2048, 8, D, dtype=torch.bfloat16, device=device)
    k, v = leaf(2, 2048, 2, D, dtype=torch.bfloat16, device=device), leaf(2, 2048, 2, D, dtype=torch.bfloat16,
                                                                         device=device)
    if sm90_bwd == "1" and gluon_sm90_reason(q.device):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(q.device)}")
    launches = _sm90_launches(monkeypatch)
    chunks = []  # the split backward's chunks: which score kernel each took
    if D > 128:
        from tileattn.ops.dense import launch_bwd_large_d as split
        real = split._scores
        monkeypatch.setattr(split, "_scores", lambda p, c, do, delta, ch, *a: chunks.append(ch.sm90) or
                            real(p, c, do, delta, ch, *a))
    w = torch.randn(2, 2048, 8, D, device=device)
    runs = [torch.autograd.grad((tileattn.attention(q, k, v, causal=causal).float() * w).sum(), (q, k, v))
            for _ in range(3)]
    for r in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], r))
    # the Hopper cases ran the Hopper kernel, with the table's rows per step (128 at D=64), the others did not:
    # the query rows per step of each Hopper kernel launch (its q descriptor's block; not the dQ conversion)
    rows = [args[0].block_shape[1] for _, args, _ in launches if hasattr(args[0], "block_shape")]
    assert rows == ([launch_bwd_sm90.pipeline.block_m(D)] if sm90_bwd == "1" and D <= 128 else [])
    assert set(chunks) == ({D == 256} if D > 128 else set())  # D=256: the Hopper score kernel on every chunk


def test_backward_under_torch_compile(device):
    """The registered op and its backward trace into one graph (aot_eager: no C++ compiler needed on CPU)."""
    q, k, v = (leaf(1, 24, 2, 32, dtype=DT, device=device) for _ in range(3))

    def fn(q, k, v):
        return tileattn.attention(q, k, v, causal=True, softcap=10.0)
    w = torch.randn(1, 24, 2, 32, device=device)
    eager = grads(fn, (q, k, v), [w])
    compiled = grads(torch.compile(fn, backend="aot_eager", fullgraph=True), (q, k, v), [w])
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


def test_eager_backward_under_compiled_autograd(device):
    """An eager forward's backward run by compiled autograd (Dynamo traces the autograd graph, EagerAttn's backward
    included, with fake tensors): it takes the registered op, and the gradients equal the eager backward's."""
    compiled_autograd = pytest.importorskip("torch._dynamo.compiled_autograd")
    if not hasattr(compiled_autograd, "_enable"):
        pytest.skip("this torch has no compiled_autograd._enable")
    q, k, v = (leaf(1, 24, 2, 32, dtype=DT, device=device) for _ in range(3))
    w = torch.randn(1, 24, 2, 32, device=device)

    def grads_of():
        out = tileattn.attention(q, k, v, causal=True)
        assert "EagerAttn" in type(out.grad_fn).__name__
        (out.float() * w).sum().backward()
        g = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return g
    eager = grads_of()
    with compiled_autograd._enable(lambda gm: torch.compile(gm, backend="aot_eager", fullgraph=True)):
        compiled = grads_of()
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)


class _RefForwardKernelBackward(torch.autograd.Function):
    """The float64 reference forward with tileattn's backward kernels (ops/dense/bwd.py) as its gradient, for
    torch.autograd.gradcheck: finite differences of the exact forward against the kernels' gradients."""

    @staticmethod
    def forward(ctx, q, k, v, causal, window, softcap):
        out, lse = attention_ref(q, k, v, causal=causal, window=window, softcap=softcap, dtype=torch.float64)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = (causal, window, softcap)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        from tileattn.ops.dense.bwd import attn_bwd
        from tileattn.ops.dense.problem import AttnOptions, AttnProblem, Call, effective_window
        q, k, v, out, lse = ctx.saved_tensors
        causal, window, softcap = ctx.opts
        opts = AttnOptions(scale=q.shape[-1] ** -0.5, window=effective_window(causal, window), softcap=softcap)
        c = Call(q, k, v, out, lse, None, None, None, opts.scale, softcap, 1.0)
        dq, dk, dv = attn_bwd(AttnProblem.of(c, opts), c, dout.contiguous(), dlse)
        return dq, dk, dv, None, None, None


@pytest.mark.parametrize("causal,window,softcap,hkv,sq,sk", [
    (True, (-1, -1), 0.0, 1, 7, 9),     # causal, MQA, Sq != Sk, ragged tiles
    (False, (3, 2), 2.0, 2, 6, 6),      # window and softcap
    (False, (-1, -1), 0.0, 2, 16, 16),  # whole tiles, no rule: the unmasked kernels
])
def test_float64_gradcheck(causal, window, softcap, hkv, sq, sk, device):
    """float64 gradcheck of the backward kernels (out and lse both in the loss; fast mode: random projections
    of the Jacobian, a few backward calls instead of one per output element). CPU suite only: the kernels'
    float64 dots run under the interpreter; GPUs take 16-bit inputs."""
    if str(device).startswith("cuda"):
        pytest.skip("float64 gradcheck: CPU suite (interpreter) only")
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, sq, 2, 8, dtype=torch.float64, device=device, generator=g).requires_grad_()
    k = torch.randn(1, sk, hkv, 8, dtype=torch.float64, device=device, generator=g).requires_grad_()
    v = torch.randn(1, sk, hkv, 8, dtype=torch.float64, device=device, generator=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda q, k, v: _RefForwardKernelBackward.apply(q, k, v, causal, window, softcap),
                                    (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=True)


SM90_CASES = [  # (B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, lse in the loss)
    (1, 128, 128, 2, 2, 64, False, (-1, -1), 0.0, False),     # whole tiles, no rule: no masked step
    (2, 333, 333, 4, 2, 128, True, (-1, -1), 0.0, False),     # ragged causal, GQA
    (1, 200, 517, 2, 1, 64, True, (-1, -1), 0.0, True),       # Sq < Sk (bottom-right), MQA, lse in the loss
    (1, 517, 200, 2, 2, 128, True, (-1, -1), 0.0, False),     # Sq > Sk: the first rows see no key (dQ = 0)
    (1, 300, 300, 2, 2, 128, False, (64, 32), 0.0, False),    # window: query blocks that see no key block
    (1, 256, 256, 2, 2, 64, True, (-1, -1), 20.0, False),     # softcap
    (1, 384, 384, 4, 1, 128, False, (-1, -1), 0.0, False),    # MQA, group of 4, several key blocks per query
    (1, 200, 517, 2, 1, 128, False, (90, 30), 0.0, True),     # both window bounds, bottom-right with Sq < Sk
    (1, 517, 300, 2, 2, 64, True, (70, -1), 0.0, False),      # causal + left bound, Sq > Sk
    (2, 700, 700, 4, 2, 64, False, (-1, -1), 0.0, False),     # D=64 (128-row steps): many key and query blocks
    (1, 400, 460, 2, 2, 128, False, (100, -1), 0.0, False),   # left bound only (no right bound: no slack)
    (1, 256, 640, 2, 2, 128, False, (-1, -1), 0.0, True),     # rotated walks (persistent), fewer query blocks than
    (1, 768, 256, 4, 2, 64, False, (-1, -1), 0.0, False),     # key blocks, then more (ties and gaps in the starts)
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", SM90_CASES, ids=lambda c: "B{}-Sq{}-Sk{}-H{}/{}-D{}-c{}-w{}-s{}-l{}".format(*c))
def test_gpu_backward_sm90(case, dtype, device, monkeypatch):
    """The Hopper backward kernel (ops/dense/gluon_bwd_sm90.py) against autograd through the reference, on the
    shapes and rules its schedule special-cases; the test checks that the kernel actually ran."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import launch_bwd_sm90
    B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, with_lse = case
    q, k = leaf(B, Sq, Hq, D, dtype=dtype, device=device), leaf(B, Sk, Hkv, D, dtype=dtype, device=device)
    v = leaf(B, Sk, Hkv, D, dtype=dtype, device=device)
    why = gluon_sm90_reason(q.device)
    if why:
        pytest.skip(f"the Hopper backward does not run here: {why}")
    monkeypatch.setenv("TILEATTN_SM90_BWD", "1")
    launches = _sm90_launches(monkeypatch)
    opts = dict(causal=causal, window=window, softcap=softcap)

    def ref(q, k, v, dt):
        out, lse = attention_ref(q, k, v, dtype=dt, **opts)
        return (out, lse) if with_lse else out
    check_grads(lambda q, k, v: tileattn.attention(q, k, v, return_lse=with_lse, **opts), ref, q, k, v,
                with_lse=with_lse)
    assert launches
    # dQ through TMA reduce-adds exactly where the tables ask for them (on triton 3.6 and 3.9)
    meta = launches[0][2]
    assert meta["TMA_DQ"] == launch_bwd_sm90.pipeline.config(D, meta["NEEDS_MASK"]).tma_dq


@pytest.mark.gpu
def test_gpu_backward_sm90_many_programs(device, monkeypatch):
    """Far more programs than fit on the GPU at once (B * Hkv * key blocks = 1024, against 4 x 132 SMs): the dQ
    turn chain makes a program wait only on lower ids, so this must neither hang nor vary between runs; the
    gradients agree with the Triton kernels'."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    q = leaf(2, 8192, 16, 128, dtype=torch.float16, device=device)
    k, v = (leaf(2, 8192, 8, 128, dtype=torch.float16, device=device) for _ in range(2))
    if gluon_sm90_reason(q.device):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(q.device)}")
    w = torch.randn(2, 8192, 16, 128, device=device)

    def grads(mode):
        monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
        return torch.autograd.grad((tileattn.attention(q, k, v, causal=True).float() * w).sum(), (q, k, v))
    runs = [grads("1") for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    for a, b in zip(runs[0], grads("0")):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_backward_sm90_early_conversion(D, device, monkeypatch):
    """The dQ conversion starts while the backward's last programs run (programmatic dependent launch) and waits
    per head for the writers' done counts: a short causal problem with many heads, whose longest programs come
    last, must give the Triton kernels' gradients, bit-identical over runs, with the conversion launched so."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import plans
    q = leaf(4, 1024, 32, D, dtype=torch.float16, device=device)
    k, v = (leaf(4, 1024, 8, D, dtype=torch.float16, device=device) for _ in range(2))
    if gluon_sm90_reason(q.device):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(q.device)}")
    launches = _sm90_launches(monkeypatch)
    w = torch.randn(4, 1024, 32, D, device=device)

    def grads(mode):
        monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
        plans.clear_plans()
        return torch.autograd.grad((tileattn.attention(q, k, v, causal=True).float() * w).sum(), (q, k, v))
    runs = [grads("1") for _ in range(3)]
    assert launches and launches[-1][2].get("launch_pdl") is True  # the conversion, the pipeline's last launch
    assert all(torch.equal(a, b) for r in runs[1:] for a, b in zip(runs[0], r))
    for a, b in zip(runs[0], grads("0")):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()


@pytest.mark.gpu
@pytest.mark.parametrize("D,causal", [(64, True), (128, False)])
def test_gpu_backward_sm90_poisoned_counters(D, causal, device, monkeypatch):
    """The counters come from torch.empty (a part of the backward's one workspace allocation, with delta and the dQ
    sums) and only the preprocess zeroes them: with the whole workspace filled with a large count before every
    call (as memory the allocator hands back may hold), the gradients still equal the Triton kernels' (a counter
    left at that value would let writers add out of turn and the conversion start before its sums are
    complete)."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import launch_bwd_sm90, plans
    q = leaf(2, 2048, 8, D, dtype=torch.float16, device=device)
    k, v = (leaf(2, 2048, 4, D, dtype=torch.float16, device=device) for _ in range(2))
    if gluon_sm90_reason(q.device):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(q.device)}")
    real = launch_bwd_sm90.Workspace.alloc
    poisoned = []

    def poisoned_alloc(self):
        ws = real(self)
        poisoned.append(ws.view(torch.int32).fill_(1 << 20))
        return ws
    monkeypatch.setattr(launch_bwd_sm90.Workspace, "alloc", poisoned_alloc)
    w = torch.randn(2, 2048, 8, D, device=device)

    def grads(mode):
        monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
        plans.clear_plans()
        return [torch.autograd.grad((tileattn.attention(q, k, v, causal=causal).float() * w).sum(), (q, k, v))
                for _ in range(2)]  # the plan's first call, then its replay
    runs = grads("1")
    assert len(poisoned) == 2  # (both calls took the poisoned buffers)
    ref = grads("0")[0]
    for run in runs:
        for a, b in zip(run, ref):
            assert torch.isfinite(a).all()
            assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()


@pytest.mark.gpu
@pytest.mark.parametrize("D,sq,sk,window", [(128, 2048, 2048, (300, 0)), (64, 2048, 1024, None)],
                         ids=["window", "unseen-rows"])
def test_gpu_backward_sm90_replay_zeroed_sums(D, sq, sk, window, device, monkeypatch):
    """Plans whose dQ sums must start at zero (a window's left bound; query rows that see no key, Sq > Sk under the
    bottom-right causal rule) replay with their workspace zeroed: a plan's first call and its replay, on new data
    each, equal the Triton kernels' gradients, and unseen rows get dq = 0."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import plans
    if gluon_sm90_reason(torch.device(device)):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(torch.device(device))}")
    kw = dict(window=window) if window else dict(causal=True)

    def grads(mode, seed):
        monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
        torch.manual_seed(seed)
        q = leaf(2, sq, 8, D, dtype=torch.float16, device=device)
        k, v = (leaf(2, sk, 4, D, dtype=torch.float16, device=device) for _ in range(2))
        w = torch.randn(2, sq, 8, D, device=device)
        return torch.autograd.grad((tileattn.attention(q, k, v, **kw).float() * w).sum(), (q, k, v))
    plans.clear_plans()
    runs = [grads("1", seed) for seed in (1, 2)]  # the plan's first call, then its replay
    plans.clear_plans()
    refs = [grads("0", seed) for seed in (1, 2)]
    for run, ref in zip(runs, refs):
        for a, b in zip(run, ref):
            assert torch.isfinite(a).all()
            assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()
        if sq > sk:
            assert not run[0][:, :sq - sk].any()  # rows before the first key (bottom-right alignment)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 2048, 8, 128), (2, 4096, 8, 64)],
                         ids=["D128-16-key-blocks", "D64-32-key-blocks"])
def test_gpu_backward_sm90_persistent_walks(shape, device, monkeypatch):
    """The persistent (cooperative) grid with rotated walks, non-causal, GQA: 512 items over 128 programs (whole
    heads per round), each program walking four. Two runs bit-identical, gradients as the Triton kernels'."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import launch_bwd_sm90, plans
    B, N, H, D = shape
    q = leaf(B, N, 2 * H, D, dtype=torch.float16, device=device)
    k, v = (leaf(B, N, H, D, dtype=torch.float16, device=device) for _ in range(2))
    if gluon_sm90_reason(q.device):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(q.device)}")
    if not launch_bwd_sm90.pipeline.config(D).persistent:
        pytest.skip("the table's grid is not persistent")
    launches = _sm90_launches(monkeypatch)
    w = torch.randn(B, N, 2 * H, D, device=device)

    def grads(mode):
        monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
        plans.clear_plans()
        return torch.autograd.grad((tileattn.attention(q, k, v).float() * w).sum(), (q, k, v))
    runs = [grads("1") for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    grid, _, kw = launches[0]
    assert kw["SCHED"] == launch_bwd_sm90.pipeline.ROTATED and kw["launch_cooperative_grid"] and grid == (128,)
    for a, b in zip(runs[0], grads("0")):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4, 2048, 8, 128), (1, 1024, 40, 128), (2, 4096, 8, 64), (1, 2048, 1, 64)],
                         ids=["D128-two-rounds", "D128-partial-round", "D64-two-rounds", "D64-one-head"])
def test_gpu_backward_sm90_paired_walks(shape, device, monkeypatch):
    """The persistent (cooperative) grid with paired walks, square causal problems without GQA: whole rounds, a
    last round with fewer programs, one head. Two runs bit-identical, gradients as the Triton kernels'."""
    from tileattn.ops.common.tma import gluon_sm90_reason
    from tileattn.ops.dense import launch_bwd_sm90, plans
    B, N, H, D = shape
    q, k, v = (leaf(B, N, H, D, dtype=torch.float16, device=device) for _ in range(3))
    if gluon_sm90_reason(q.device):
        pytest.skip(f"the Hopper backward does not run here: {gluon_sm90_reason(q.device)}")
    pipeline = launch_bwd_sm90.pipeline
    if not pipeline.config(D).persistent:
        pytest.skip("the table's config is not persistent")
    monkeypatch.setitem(pipeline.PAIRED_MAX_KV_BLOCKS, D, 64)  # (D = 64 too, which the table leaves off)
    launches = _sm90_launches(monkeypatch)
    w = torch.randn(B, N, H, D, device=device)

    def grads(mode):
        monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
        plans.clear_plans()
        return torch.autograd.grad((tileattn.attention(q, k, v, causal=True).float() * w).sum(), (q, k, v))
    runs = [grads("1") for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    grid, _, kw = launches[0]
    assert kw["SCHED"] == pipeline.PAIRED and kw["launch_cooperative_grid"]
    for a, b in zip(runs[0], grads("0")):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).norm() <= 1e-2 * b.float().norm()


@pytest.mark.parametrize("B,H,Hkv,Sq", [(2, 8, 4, 300), (1, 3, 1, 64)])
def test_sm90_backward_counters_zeroed_by_preprocess(B, H, Hkv, Sq, device):
    """The Hopper backward's counters (a turn counter per (B * Hq, query block), then a done counter per (B, Hkv))
    are allocated empty and zeroed by the preprocess kernel, which still computes delta = rowsum(dO * O)."""
    import triton

    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    from tileattn.ops.common.bwd_kernels import bwd_preprocess_kernel
    mb = triton.cdiv(Sq, pipeline.block_m(64))
    turns, n = pipeline.counter_count(B, H, Hkv, mb)
    assert (turns, n) == (B * H * mb, B * H * mb + B * Hkv)
    guard = torch.full((n + 64,), 12345, dtype=torch.int32, device=device)  # 64 past the end must stay untouched
    counters = guard[:n]
    out, do = (randn(B, Sq, H, 64, dtype=DT, device=device) for _ in range(2))
    delta = torch.full((B, H, Sq), float("nan"), device=device)
    pm = 64
    programs = triton.cdiv(Sq, pm) * B * H
    zero, zero_kw = pipeline.zero_args(counters, programs, delta)
    assert zero_kw["ZERO_CHUNK"] * programs >= n
    bwd_preprocess_kernel[(triton.cdiv(Sq, pm), B * H, 1)](
        out, do, delta, delta, out.stride(0), out.stride(1), out.stride(2), do.stride(0), do.stride(1), do.stride(2),
        delta.stride(0), delta.stride(1), 0, 0, delta, Sq, H, B * H, *zero, DV=64, BLOCK_M=pm, BLOCK_DV=64,
        IS_VARLEN=False, HAS_DLSE=False, num_warps=4, **zero_kw)
    assert not counters.any() and (guard[n:] == 12345).all()
    ref = (out.float() * do.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(delta, ref, rtol=1e-3, atol=1e-3)


def test_sm90_backward_config_rows_per_step(monkeypatch):
    """The Hopper backward's table may only ask for 64- or 128-row steps (the two ways the kernel splits a step's
    dQ between its warpgroups); the staged dQ half follows the rows per step."""
    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    assert pipeline.dq_half(128) == [64, 64] and pipeline.block_m(128) == 64
    assert pipeline.dq_half(64) == [64, 64] and pipeline.block_m(64) == 128
    monkeypatch.setitem(pipeline.CONFIGS, 64, pipeline.CONFIGS[64]._replace(block_m=96))
    with pytest.raises(ValueError, match="block_m = 96"):
        pipeline.meta(64)


def test_sm90_backward_unmasked_configs(monkeypatch):
    """launch_bwd_sm90.UNMASKED_CONFIGS: problems with no masked step take them (D=64: TMA reduce-adds), masked ones
    and flex CONFIGS; an entry must keep CONFIGS' block_m and persistence (the workspace and the grid are sized
    without the mask), else the launch refuses it."""
    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    for d in pipeline.CONFIGS:
        assert pipeline.config(d) == pipeline.config(d, True) == pipeline.Config(*pipeline.CONFIGS[d])
        alt = pipeline.config(d, False)
        assert (alt.block_m, alt.persistent) == (pipeline.config(d).block_m, pipeline.config(d).persistent)
        assert pipeline.meta(d, False)["TMA_DQ"] == alt.tma_dq
    assert pipeline.config(64, False).tma_dq and not pipeline.config(64).tma_dq
    monkeypatch.setitem(pipeline.UNMASKED_CONFIGS, 64, pipeline.UNMASKED_CONFIGS[64]._replace(block_m=64))
    with pytest.raises(ValueError, match="block_m and persistent"):
        pipeline.meta(64, False)
    pipeline.meta(64)  # the masked config is unaffected


def test_sm90_backward_grid(monkeypatch):
    """The Hopper backward's grid: one program per work item (key block, batch * kv head), or, with the table's
    persistent flag, whole heads per round up to one program per SM: a head's key blocks where the walks rotate
    (up to ROTATE_MAX_KV_BLOCKS key blocks), half of them where the walks pair (square causal problems, an even
    number of key blocks up to PAIRED_MAX_KV_BLOCKS)."""
    from tileattn import hw
    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    plain, rotated, paired = pipeline.PLAIN, pipeline.ROTATED, pipeline.PAIRED
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    monkeypatch.setitem(pipeline.CONFIGS, 128, pipeline.CONFIGS[128]._replace(persistent=True))
    monkeypatch.setitem(pipeline.PAIRED_MAX_KV_BLOCKS, 128, 64)
    assert pipeline.grid(128, 16, 128, "cuda", rotated) == ((128,), 2048, rotated)  # whole heads per round
    assert pipeline.grid(128, 40, 128, "cuda", rotated) == ((120,), 40 * 128, rotated)
    assert pipeline.grid(128, 4, 8, "cuda", rotated) == ((32,), 32, rotated)
    assert pipeline.grid(128, 64, 128, "cuda", rotated) == ((128,), 64 * 128, rotated)
    assert pipeline.grid(128, 65, 2, "cuda", rotated) == ((130,), 130, plain)  # long sequences: plain grid
    assert pipeline.grid(128, 8, 128, "cuda", paired) == ((132,), 1024, paired)  # 33 heads of 4 pairs a round
    assert pipeline.grid(128, 16, 128, "cuda", paired) == ((128,), 2048, paired)
    assert pipeline.grid(128, 8, 5, "cuda", paired) == ((20,), 40, paired)  # (at most one program per pair)
    assert pipeline.grid(128, 2, 1, "cuda", paired) == ((1,), 2, paired)
    assert pipeline.grid(128, 64, 128, "cuda", paired) == ((128,), 64 * 128, paired)
    assert pipeline.grid(128, 66, 2, "cuda", paired) == ((132,), 132, plain)  # past PAIRED_MAX_KV_BLOCKS
    assert pipeline.grid(128, 7, 4, "cuda", paired) == ((28,), 28, plain)  # an odd number of key blocks
    monkeypatch.setattr(pipeline, "ROTATE_MAX_KV_BLOCKS", 1000)
    assert pipeline.grid(128, 128, 4, "cuda", rotated) == ((128,), 512, rotated)
    assert pipeline.grid(128, 133, 2, "cuda", rotated) == ((266,), 266, plain)  # a head's key blocks would not fit
    assert pipeline.grid(128, 16, 128, "cuda", plain) == ((2048,), 2048, plain)  # other masks: one program per item
    monkeypatch.setitem(pipeline.PAIRED_MAX_KV_BLOCKS, 128, 1000)
    assert pipeline.grid(128, 264, 1, "cuda", paired) == ((132,), 264, paired)
    assert pipeline.grid(128, 266, 1, "cuda", paired) == ((266,), 266, plain)  # a head's pairs would not fit
    monkeypatch.setitem(pipeline.CONFIGS, 128, pipeline.CONFIGS[128]._replace(persistent=False))
    assert pipeline.grid(128, 16, 128, "cuda", rotated) == ((2048,), 2048, plain)
    assert pipeline.grid(128, 16, 128, "cuda", paired) == ((2048,), 2048, plain)


def test_sm90_backward_sched_values():
    """The host's schedule values (launch_bwd_sm90, which imports no Gluon) are the kernel's SCHED constexprs."""
    from tileattn.ops.common import gluon_bwd_sm90_walk as walk
    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    assert (pipeline.PLAIN, pipeline.ROTATED, pipeline.PAIRED) == (walk.PLAIN.value, walk.ROTATED.value,
                                                                   walk.PAIRED.value)


@pytest.mark.parametrize("R", [1, 2])
def test_sm90_backward_paired_turns(R):
    """The PAIRED schedule's dQ turns (gluon_bwd_sm90_walk.paired_turn, run here on Python ints): for every even
    number of key blocks K up to 66, each query block's visitors (the key blocks n with R * n <= its index) get
    the turns 0 .. V - 1 once each, the last of them `last`, in the order of the step at which their pair's walk reaches
    the block (key block n < K / 2 upwards from its diagonal, then key block K - 1 - n downwards); and each
    program's steps reach their blocks at strictly increasing times, so that an add only waits for earlier ones
    (no cycle)."""
    from tileattn.ops.common.gluon_bwd_sm90_walk import paired_turn
    turn_of = paired_turn.fn
    for K in range(2, 67, 2):
        Q = R * K
        visits = {}  # query block -> [(time, key block)]
        for n in range(K // 2):
            j = K - 1 - n
            walk = [(n, mb) for mb in range(R * n, Q)] + [(j, mb) for mb in range(Q - 1, R * j - 1, -1)]
            assert len(walk) == Q + R  # every pair as long as the others
            for time, (kb, mb) in enumerate(walk):
                visits.setdefault(mb, []).append((time, -kb))  # (ties: the later key block first)
        for mb, vis in visits.items():
            assert sorted(-kb for _, kb in vis) == [kb for kb in range(K) if R * kb <= mb]
            for order, (_, kb) in enumerate(sorted(vis)):
                assert turn_of(mb, -kb, K, Q, R) == (order, order == len(vis) - 1), (K, mb, -kb)
