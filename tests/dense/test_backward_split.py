"""The split backward (ops/dense/launch_bwd_large_d.py) with its Hopper score kernel (gluon_bwd_scores_sm90.py,
D = Dv = 256): gradients against autograd through the float32 reference on the shapes and rules the kernel's
tiles, masks, chunks and workspace pitch special-case; the tests check that the kernel ran on every chunk."""
import pytest
import torch

import tileattn
from tileattn.ops.common.tma import gluon_sm90_reason
from tileattn.ops.dense import launch_bwd_large_d, plans
from tileattn.ops.dense.reference import attention_ref

from tests.dense.test_backward import check_grads, grads, leaf

CASES = [  # (B, Sq, Sk, Hq, Hkv, causal, window, softcap, workspace bytes, direct)
    (2, 300, 300, 2, 2, True, (-1, -1), 0.0, None, False),  # ragged rows, 300 keys: a padded workspace pitch
    (1, 257, 333, 4, 2, False, (40, 20), 5.0, None, False),  # GQA, both window bounds, softcap, Sq < Sk
    (2, 384, 256, 2, 1, False, (-1, -1), 0.0, None, False),  # MQA, whole tiles, no rule
    (1, 200, 100, 2, 2, True, (-1, -1), 0.0, None, False),  # bottom-right: 100 rows see no key
    (1, 260, 270, 2, 1, True, (-1, -1), 0.0, 1, False),  # row chunks of one unit (float32 dK / dV sums)
    (2, 300, 280, 4, 4, False, (-1, 50), 0.0, None, True),  # a chunk per batch (views of the tensors)
    (1, 640, 640, 2, 2, False, (100, -1), 0.0, None, True),  # left bound only: zero tiles on both sides
    (2, 40, 300, 2, 2, True, (-1, -1), 0.0, None, False),  # Sq < 64: the second warpgroup's rows all past Sq
    (1, 100, 30, 4, 2, False, (-1, -1), 3.0, None, False),  # Sk < 64: one partial key tile, 30-key rows
    (2, 70, 1, 2, 1, True, (-1, -1), 0.0, None, False),  # a single key; bottom-right: 69 rows see no key
    ("sdpa", 130, 300, 4, 2, True, (-1, -1), 0.0, None, False),  # top-left causal (SDPA's [B, H, S, D] views)
]


def _spy(monkeypatch):
    """The chunks' score-kernel choices (ch.sm90) from now on, in the returned list; the Hopper kernel takes the
    tests' small grids too (SCORES_SM90_MIN_WAVES = 0)."""
    monkeypatch.setattr(launch_bwd_large_d, "SCORES_SM90_MIN_WAVES", 0)
    chunks = []
    real = launch_bwd_large_d._scores

    def spy(p, c, do, delta, ch, tail, launch):
        chunks.append(ch.sm90)
        return real(p, c, do, delta, ch, tail, launch)
    monkeypatch.setattr(launch_bwd_large_d, "_scores", spy)
    plans.clear_plans()
    return chunks


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Sq{}-Sk{}-H{}/{}-c{}-w{}-s{}-ws{}-d{}".format(*c))
def test_gpu_split_scores_sm90(case, dtype, device, monkeypatch):
    B, Sq, Sk, Hq, Hkv, causal, window, softcap, budget, direct = case
    sdpa = B == "sdpa"
    B = 1 if sdpa else B
    q, k = leaf(B, Sq, Hq, 256, dtype=dtype, device=device), leaf(B, Sk, Hkv, 256, dtype=dtype, device=device)
    v = leaf(B, Sk, Hkv, 256, dtype=dtype, device=device)
    why = gluon_sm90_reason(q.device)
    if why:
        pytest.skip(f"the Hopper score kernel does not run here: {why}")
    if budget is not None:
        monkeypatch.setattr(launch_bwd_large_d, "WORKSPACE_BYTES", budget)
    monkeypatch.setattr(launch_bwd_large_d, "DIRECT_MIN_WORK", 0 if direct else 1 << 62)
    chunks = _spy(monkeypatch)
    opts = dict(causal=causal, window=window, softcap=softcap)

    def ref(q, k, v, dt):
        return attention_ref(q, k, v, dtype=dt, **dict(opts, causal="top_left" if sdpa else causal))[0]

    def fn(q, k, v):
        if sdpa:
            t = [x.transpose(1, 2) for x in (q, k, v)]
            return tileattn.scaled_dot_product_attention(*t, is_causal=causal, enable_gqa=True).transpose(1, 2)
        return tileattn.attention(q, k, v, **opts)
    check_grads(fn, ref, q, k, v)
    assert chunks and all(chunks)


@pytest.mark.gpu
def test_gpu_split_scores_sm90_matches_triton(device, monkeypatch):
    """The Hopper and the Triton score kernel give the same gradients (causal GQA, ragged) up to the order of float32
    sums (bit-identical in a bf16 case on the H100, not in this fp16 one): a tile read from a slot before its load
    landed, or a staging buffer rewritten under its store, would be far off."""
    q = leaf(2, 700, 4, 256, dtype=torch.float16, device=device)
    k, v = (leaf(2, 650, 2, 256, dtype=torch.float16, device=device) for _ in range(2))
    if gluon_sm90_reason(q.device):
        pytest.skip(gluon_sm90_reason(q.device))
    w = torch.randn(2, 700, 4, 256, device=device)
    chunks = _spy(monkeypatch)
    got = {}
    for sm90 in (False, True):
        monkeypatch.setattr(launch_bwd_large_d, "SCORES_SM90", sm90)
        plans.clear_plans()
        got[sm90] = grads(lambda q, k, v: tileattn.attention(q, k, v, causal=True), (q, k, v), [w])
    assert chunks == [False, True]
    for a, b in zip(got[False], got[True]):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2 * b.float().abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,causal,window,softcap", [(torch.float16, True, (-1, -1), 0.0),
                                                         (torch.bfloat16, False, (60, 30), 5.0),
                                                         (torch.float16, False, (-1, -1), 0.0)])
def test_gpu_split_scores_sm90_do_shared(dtype, causal, window, softcap, device, monkeypatch):
    """The Hopper score kernel with dO in shared memory (gluon_bwd_scores_sm90.DO_SHARED: triton 3.9's form) and
    in registers (3.6's) gives bit-identical gradients (the same products and sums; another ring layout: a slot
    read before its load landed, or dO's slots refilled under it, would be far off). Both forms compile under
    triton 3.6 and 3.9. Unmasked kernels keep dO in registers whatever DO_SHARED says (launch_bwd_large_d._scores:
    measured faster there), so the last case takes the register form in both runs."""
    masked = causal or window != (-1, -1)
    q = leaf(2, 700, 4, 256, dtype=dtype, device=device)
    k, v = (leaf(2, 650, 2, 256, dtype=dtype, device=device) for _ in range(2))
    if gluon_sm90_reason(q.device):
        pytest.skip(gluon_sm90_reason(q.device))
    from tileattn.ops.dense import gluon_bwd_scores_sm90
    w = torch.randn(2, 700, 4, 256, device=device)
    chunks = _spy(monkeypatch)
    forms = []  # the DO_SHARED each launch of the Hopper kernel was given (else both runs could take one form)
    spied = launch_bwd_large_d._scores

    def scores(p, c, do, delta, ch, tail, launch):
        def recorded(kernel, grid, args, kwargs):
            if kernel is gluon_bwd_scores_sm90.bwd_scores_sm90_kernel:
                forms.append(kwargs["DO_SHARED"])
            return launch(kernel, grid, args, kwargs)
        return spied(p, c, do, delta, ch, tail, recorded)
    monkeypatch.setattr(launch_bwd_large_d, "_scores", scores)
    got = {}
    for shared in (False, True):
        monkeypatch.setattr(gluon_bwd_scores_sm90, "DO_SHARED", shared)
        plans.clear_plans()
        n = len(forms)
        got[shared] = grads(lambda q, k, v: tileattn.attention(q, k, v, causal=causal, window=window,
                                                               softcap=softcap), (q, k, v), [w])
        assert len(forms) > n and all(f is (shared and masked) for f in forms[n:]), (shared, forms)
    assert chunks and all(chunks)
    for a, b in zip(got[False], got[True]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("memory,expected", [(80 << 30, 2 << 30), (16 << 30, 1 << 30), (0, 2 << 30)])
def test_workspace_budget(memory, expected, monkeypatch):
    """The chunks' workspace: WORKSPACE_BYTES, at most a sixteenth of the device's memory (0: not known)."""
    from tileattn import hw
    monkeypatch.setattr(launch_bwd_large_d, "WORKSPACE_BYTES", 2 << 30)
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(90, 132, 232448, memory))
    assert launch_bwd_large_d.workspace_bytes(torch.device("cpu")) == expected
