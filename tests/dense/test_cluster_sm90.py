"""The 2-CTA cluster forward (ops/dense/gluon_cluster_sm90.py, launch_cluster_sm90.py, backend dense.sm90_cluster)
against the float32 reference, under the tolerance rule, called directly and through tileattn.attention's dispatch
(causal from configs.CLUSTER_FROM query rows; with or without the lse, so training forwards too: their gradients
against the reference's). GPU tests: a Hopper GPU and triton 3.9. Without a GPU, `scripts/compile_cluster.py
--route` compiles the dispatched route for sm90, and the route's replay is checked against Triton's normal launch
(the last tests). The dispatch rule itself: tests/test_dispatch.py."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

import tileattn
from tileattn.ops.dense import launch_cluster_sm90, plans
from tileattn.ops.dense.reference import attention_ref

from tests.dense.test_backward import check_grads
from tests.helpers import assert_close, randn

LSE_PAD = 72  # lse entries past Sq in each head's row of the test's buffer (more than a 64-row block)
# (B, Sq, Sk, Hq, Hkv): whole pair tiles, a ragged last pair (one warpgroup without rows: Sq = 800), one pair,
# Sq != Sk both ways, GQA groups of 1, 2 and 8
SHAPES = [
    (1, 1024, 1024, 4, 4), (2, 1000, 1000, 8, 2), (1, 800, 800, 2, 1), (1, 200, 200, 2, 2),
    (1, 256, 1024, 4, 4), (1, 1024, 256, 4, 1), (2, 4096, 4096, 16, 2), (1, 1, 513, 8, 8),
]


def _hopper_39():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and \
        triton.__version__.startswith("3.9.")


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-Sq{}-Sk{}-H{}-Hkv{}".format(*s))
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "lse"])
def test_gpu_cluster_forward(with_lse, shape, causal, dtype, device):
    """out (and the lse) against the reference. The lse goes into a NaN-filled view of a wider buffer (LSE_PAD more
    entries per head, so stride_lh != Sq and stride_lb != Hq * Sq): an lse row no CTA writes (a wrong row of a CTA's
    64-row blocks) stays NaN and fails, and a row past Sq written (the ragged last pair of Sq = 800, 1000, 200, 1)
    shows in the padding. No served case has a row that sees no key (top-left causal: row i sees key 0)."""
    from tileattn.ops.dense.launch_cluster_sm90 import attention_cluster_sm90
    B, Sq, Sk, Hq, Hkv = shape
    D = 128
    q = randn(B, Sq, Hq, D, dtype=dtype, device=device)
    k, v = randn(B, Sk, Hkv, D, dtype=dtype, device=device), randn(B, Sk, Hkv, D, dtype=dtype, device=device)
    out = torch.full_like(q, float("nan"))  # an element the kernel never writes fails the comparison
    lse_buf = torch.full((B, Hq, Sq + LSE_PAD), float("nan"), device=device)
    if with_lse:
        _, lse = attention_cluster_sm90(q, k, v, causal=causal, out=out, return_lse=True, lse=lse_buf[..., :Sq])
    else:
        attention_cluster_sm90(q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    mode = "top_left" if causal else False
    ref, ref_lse = attention_ref(q, k, v, causal=mode)
    ref_lp, ref_lse_lp = attention_ref(q, k, v, causal=mode, dtype=dtype)
    assert_close("out", out, ref, ref_lp)
    if with_lse:
        assert_close("lse", lse, ref_lse, ref_lse_lp)
    assert torch.isnan(lse_buf[..., Sq:]).all(), "an lse entry past Sq was written"


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "lse"])
def test_gpu_cluster_repeatable(with_lse, device):
    """Bitwise the same output (and lse) over repeated launches (a race in the pair's barrier protocol tends to show
    as run-to-run differences before it shows as a wrong mean)."""
    from tileattn.ops.dense.launch_cluster_sm90 import attention_cluster_sm90
    q = randn(2, 2048, 16, 128, dtype=torch.float16, device=device)
    k, v = randn(2, 2048, 4, 128, dtype=torch.float16, device=device), randn(2, 2048, 4, 128, dtype=torch.float16,
                                                                              device=device)
    first = attention_cluster_sm90(q, k, v, causal=True, return_lse=with_lse)
    for _ in range(20):
        again = attention_cluster_sm90(q, k, v, causal=True, return_lse=with_lse)
        assert all(torch.equal(a, b) for a, b in zip(again, first)) if with_lse else torch.equal(again, first)


def test_cluster_reason_checks_out():
    """The launcher refuses an output buffer of another shape or dtype before any launch (a stray descriptor
    would write out of bounds)."""
    from tileattn.ops.dense.launch_cluster_sm90 import reason
    if not triton.__version__.startswith("3.9."):
        pytest.skip("the cluster prototype is written for triton 3.9")
    q = torch.zeros(1, 256, 2, 128, dtype=torch.float16)
    assert reason(q, q, q) == "" and reason(q, q, q, torch.empty_like(q)) == ""
    for bad in (torch.empty(1, 255, 2, 128, dtype=torch.float16), torch.empty_like(q, dtype=torch.bfloat16)):
        assert reason(q, q, q, bad).startswith("out:")
    # inputs the shape rules would misread: 3 dims, another device, no kv heads (q.shape[2] % 0)
    assert "dims" in reason(q[0], q[0], q[0])
    assert "one device" in reason(q, q.to("meta"), q)
    no_heads = torch.zeros(1, 256, 0, 128, dtype=torch.float16)
    assert "without heads" in reason(q, no_heads, no_heads)
    # the lse buffer: [B, Hq, Sq] float32 with a unit stride along Sq (any other strides)
    assert reason(q, q, q, lse=torch.empty(1, 2, 300)[..., :256]) == ""
    for bad in (torch.empty(1, 256, 2), torch.empty(1, 2, 256, dtype=torch.float16), torch.empty(1, 256, 2).mT):
        assert reason(q, q, q, lse=bad).startswith("lse:")
    # rows that would share memory (two heads' clusters racing on one row): expanded, or strides shorter than Sq
    assert reason(q, q, q, lse=torch.empty(1, 1, 256).expand(1, 2, 256)).startswith("lse:")
    assert reason(q, q, q, lse=torch.empty(400).as_strided((1, 2, 256), (512, 128, 1))).startswith("lse:")
    assert reason(q, q, q, lse=torch.empty(2, 1, 256).transpose(0, 1)) == ""  # heads outer, batch inner: fine
    q3 = torch.empty(2, 256, 8, 128, dtype=torch.float16)  # both outer dims > 1, the smaller one outermost
    assert reason(q3, q3, q3, lse=torch.empty(2, 8, 256)) == ""
    assert reason(q3, q3, q3, lse=torch.empty(2, 8, 300)[..., :256]) == ""
    assert reason(q3, q3, q3, lse=torch.empty(8, 2, 256).transpose(0, 1)) == ""
    assert reason(q3, q3, q3, lse=torch.empty(2, 300)[:, :256].unsqueeze(1).expand(2, 8, 256)).startswith("lse:")
    q2 = torch.zeros(2, 256, 2, 128, dtype=torch.float16)
    assert reason(q2, q2, q2, lse=torch.empty(2, 2, 256).transpose(0, 1).contiguous().transpose(0, 1)) == ""
    assert reason(q2, q2, q2, lse=torch.empty(1, 2, 256).expand(2, 2, 256)).startswith("lse:")


def test_cluster_lse_buffer_needs_return_lse():
    """An lse buffer passed without return_lse=True is refused (it would silently stay unwritten)."""
    from tileattn.ops.dense.launch_cluster_sm90 import attention_cluster_sm90
    q = torch.zeros(1, 256, 2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match="without return_lse"):
        attention_cluster_sm90(q, q, q, lse=torch.empty(1, 2, 256))


@pytest.fixture
def cluster_runs(monkeypatch):
    """The number of cluster launches since the test began (plans forgotten first: the route is chosen anew)."""
    plans.clear_plans()
    runs = []
    real = launch_cluster_sm90.ClusterLaunch.run
    monkeypatch.setattr(launch_cluster_sm90.ClusterLaunch, "run", lambda self, c: runs.append(1) or real(self, c))
    yield runs
    plans.clear_plans()


def _qkv(sq, sk, dtype, device, hq=4, hkv=2):
    q = randn(1, sq, hq, 128, dtype=dtype, device=device)
    return q, randn(1, sk, hkv, 128, dtype=dtype, device=device), randn(1, sk, hkv, 128, dtype=dtype, device=device)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_attention_takes_the_cluster_causal_8k(dtype, device, cluster_runs):
    """tileattn.attention, causal at N = 8192 (Sq = Sk: bottom-right is top-left), runs the cluster kernel and
    matches the reference; so does scaled_dot_product_attention's top-left causal with Sq < Sk."""
    q, k, v = _qkv(8192, 8192, dtype, device)
    out = tileattn.attention(q, k, v, causal=True)
    # the plan's replay (KernelLauncher's direct launch under 3.9) gives what its first, normal launch gave
    assert torch.equal(tileattn.attention(q, k, v, causal=True), out)
    assert len(cluster_runs) == 2
    ref, _ = attention_ref(q, k, v, causal=True)
    ref_lp, _ = attention_ref(q, k, v, causal=True, dtype=dtype)
    assert_close("out", out, ref, ref_lp)
    q, k, v = _qkv(8192, 10000, dtype, device, hq=2, hkv=1)
    out = tileattn.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True,
                                                enable_gqa=True)
    assert len(cluster_runs) == 3
    ref, _ = attention_ref(q, k, v, causal="top_left")
    ref_lp, _ = attention_ref(q, k, v, causal="top_left", dtype=dtype)
    assert_close("sdpa out", out.transpose(1, 2), ref, ref_lp)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
def test_gpu_attention_lse_takes_the_cluster_causal_8k(device, cluster_runs):
    """return_lse=True at causal N = 8192 runs the cluster kernel: out and lse match the reference, and the plan's
    replay gives both bitwise again. Below CLUSTER_FROM and non-causal the lse calls stay on dense.sm90."""
    dtype = torch.float16
    q, k, v = _qkv(8192, 8192, dtype, device)
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
    again = tileattn.attention(q, k, v, causal=True, return_lse=True)
    assert len(cluster_runs) == 2
    assert torch.equal(again[0], out) and torch.equal(again[1], lse)
    assert lse.shape == (1, 4, 8192) and lse.dtype == torch.float32 and lse.is_contiguous()
    ref, ref_lse = attention_ref(q, k, v, causal=True)
    ref_lp, ref_lse_lp = attention_ref(q, k, v, causal=True, dtype=dtype)
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, ref_lse, ref_lse_lp)
    tileattn.attention(q[:, :4096], k[:, :4096], v[:, :4096], causal=True, return_lse=True)
    tileattn.attention(q, k, v, causal=False, return_lse=True)
    assert len(cluster_runs) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("with_lse", [False, True], ids=["out", "out-lse"])
def test_gpu_training_step_takes_the_cluster(with_lse, dtype, device, cluster_runs):
    """A training step at causal N = 8192: the forward of inputs that require grad runs the cluster kernel (it keeps
    the lse for the backward), and dq, dk, dv (of out, and with_lse of the returned lse too) match the reference's
    under the tolerance rule (test_backward.check_grads). A wrong lse (a row off, a wrong scale) shows in every
    gradient, since the backward recomputes P from it."""
    q, k, v = (t.requires_grad_() for t in _qkv(8192, 8192, dtype, device, hq=2, hkv=1))

    def fn(q, k, v):
        return tileattn.attention(q, k, v, causal=True, return_lse=with_lse)

    def ref(q, k, v, dt):
        out, lse = attention_ref(q, k, v, causal=True, dtype=dt)
        return (out, lse) if with_lse else out

    check_grads(fn, ref, q, k, v, with_lse=with_lse)
    assert len(cluster_runs) == 2  # check_grads' two forwards; the backward is dense's own


@pytest.mark.parametrize("lse", [False, True], ids=["out", "lse"])
def test_route_compiles_for_sm90(lse, tmp_path):
    """Without a GPU: tileattn.attention's route at causal N = 8192 D = 128 (dispatch, the launch plan, its
    KernelLauncher with num_ctas=2) compiles the cluster kernel for sm90, without spills or serialized wgmmas; with
    return_lse=True too, whose kernel stores the lse (plain global stores, none without)."""
    if not triton.__version__.startswith("3.9."):
        pytest.skip("the cluster kernel is written for triton 3.9")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "compile_cluster.py")
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, script, "--route", "--causal", "--n", "8192", "--out", str(tmp_path)]
                         + (["--lse"] if lse else []), capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "route: tileattn.attention compiled attn_fwd_cluster_sm90_kernel" in res.stdout
    assert re.search(r"num_ctas 2\b", res.stdout), res.stdout[-3000:]
    stores = re.search(r"SASS STG \(plain global stores: the lse\)\s+(\d+)", res.stdout)
    assert stores and (int(stores.group(1)) > 0) == lse, res.stdout[-3000:]


def test_route_replays_as_its_normal_launch():
    """Without a GPU (the stand-in driver of scripts/host_overhead.py): the cluster plans of tileattn.attention and
    scaled_dot_product_attention replay (KernelLauncher's direct path under triton 3.9) with the C-launch arguments
    of Triton's normal path: grid in clusters, num_ctas 2 in the packed metadata, the new tensors' maps. A call
    that returns the lse, and one that tracks a gradient (whose forward keeps the lse for the backward), take the
    cluster too, and its launches get that call's lse buffer (the one returned / saved for the backward)."""
    if not triton.__version__.startswith("3.9."):
        pytest.skip("the cluster kernel is written for triton 3.9")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "src"), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-m", "tests.dense.test_cluster_sm90"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and "CHECK OK" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]


def _replay_checks():
    from scripts.host_overhead import _cpu_setup, normalized, replayed
    launches = _cpu_setup(record=True)
    from tileattn import hw, launcher
    hw.interpreter_enabled = lambda: False  # the Gluon route, on CPU tensors
    hw.is_hopper = lambda device: True
    hw.check_kernel_device = lambda device, what: None

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float16)

    def bshd():
        return rand(1, 8192, 4, 128), rand(1, 8192, 2, 128), rand(1, 8192, 2, 128)

    def names(res):
        """{address: name} of a call's outputs: out, and the lse it returned or saved for its backward."""
        out, lse = res if isinstance(res, tuple) else (res, None)
        if out.grad_fn is not None:  # custom_ops.EagerAttn saved (q, k, v, out, lse)
            lse = out.grad_fn.saved_tensors[4]
        return {out.data_ptr(): "out", **({lse.data_ptr(): "lse"} if lse is not None else {})}

    planned = []  # the KernelLauncher of every cluster launch (its frozen RETURN_LSE)
    real_run = launch_cluster_sm90.ClusterLaunch.run
    launch_cluster_sm90.ClusterLaunch.run = lambda self, c: planned.append(self.launcher) or real_run(self, c)
    calls = {"attention": (lambda q, k, v: tileattn.attention(q, k, v, causal=True), bshd),
             "attention lse": (lambda q, k, v: tileattn.attention(q, k, v, causal=True, return_lse=True), bshd),
             "attention grad": (lambda q, k, v: tileattn.attention(q.requires_grad_(), k, v, causal=True), bshd),
             "sdpa": (lambda q, k, v: tileattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                      lambda: (rand(1, 4, 8192, 128), rand(1, 2, 8300, 128), rand(1, 2, 8300, 128)))}
    for name, (f, make) in calls.items():
        a, b = make(), make()
        got = []
        for direct in (True, False):
            launcher.DIRECT = direct
            plans.clear_plans()
            launches.clear()
            outs = [f(*a), f(*a), f(*b)]
            got.append(([normalized(c, names(o)) for c, o in zip(launches, outs)],
                        [replayed(c) for c in launches]))
        (direct, replays), (normal, none) = got
        assert replays == [False, True, True] and none == [False] * 3, (name, replays, none)
        assert normal[0].metadata[1] == 2, f"{name}: not the cluster kernel ({normal[0].metadata})"
        assert direct == normal, f"{name}: the replay differs from the normal path"
        with_lse = name in ("attention lse", "attention grad")
        assert all(("lse" in c.args) == with_lse for c in direct), f"{name}: the lse buffer passed or not"
        assert {lf._values[lf._names.index("RETURN_LSE")] for lf in planned} == {with_lse}, name
        planned.clear()
        print(f"ok  {name}: grid {direct[1].grid}, metadata {direct[1].metadata}")
    print("CHECK OK")


if __name__ == "__main__":
    _replay_checks()
