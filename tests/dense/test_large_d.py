"""Large head dims (D or Dv above 256, up to 1024): the head-dim-tiled kernels (ops/dense/launch_large_d.py) against
the float32 reference under the tolerance rule, its slicing of the output head dim, its limits and errors.

CPU runs use small shapes in float16; the `gpu` matrix runs the H100 configs (both dtypes, every option, the
issue's head dims) and the 99 KB / 163 KB budget emulation.
"""
import pytest
import torch

import tileattn
from tileattn import force_backend, hw
from tileattn.ops.common.tma import gluon_sm90_reason
from tileattn.ops.dense import configs, dispatch, launch_large_d, plans
from tileattn.ops.dense.reference import attention_ref, varlen_attention_ref

from tests.dense.test_attention import _cu
from tests.helpers import assert_close, randn

C = configs.LargeDConfig


def _inputs(B, Sq, Sk, Hq, Hkv, D, Dv, dtype, device):
    return (randn(B, Sq, Hq, D, dtype=dtype, device=device), randn(B, Sk, Hkv, D, dtype=dtype, device=device),
            randn(B, Sk, Hkv, Dv, dtype=dtype, device=device))


def _check(q, k, v, **kw):
    out, lse = tileattn.attention(q, k, v, return_lse=True, **kw)
    ref, lse_ref = attention_ref(q, k, v, **kw)
    ref_lp, lse_lp = attention_ref(q, k, v, dtype=q.dtype, **kw)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


def _id(c):
    B, Sq, Sk, Hq, Hkv, D, Dv, kw = c
    opts = "-".join(f"{k}{v}" for k, v in kw.items()).replace(" ", "").replace("(", "").replace(")", "")
    return f"B{B}-Sq{Sq}-Sk{Sk}-H{Hq}-Hkv{Hkv}-D{D}-Dv{Dv}" + (f"-{opts}" if opts else "")


# (B, Sq, Sk, Hq, Hkv, D, Dv, options): small shapes for the interpreter, one config per case below
CPU_CASES = [
    (1, 17, 17, 2, 1, 264, 264, dict(causal=True)),
    (2, 37, 53, 4, 2, 320, 320, dict()),
    (1, 40, 40, 2, 2, 384, 384, dict(causal=True, softcap=20.0)),
    (1, 33, 70, 2, 1, 576, 512, dict(causal=True)),        # MLA-style prefill, Sq < Sk
    (1, 50, 20, 4, 1, 640, 640, dict(causal=True)),        # Sq > Sk: the first rows see nothing, MQA
    (1, 20, 45, 1, 1, 1024, 1024, dict(window=(8, 4))),
    (1, 33, 65, 2, 1, 128, 768, dict(causal=True)),        # only Dv is large
    (1, 19, 40, 2, 2, 512, 96, dict()),                    # only D is large
]


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_large_d(case, device):
    B, Sq, Sk, Hq, Hkv, D, Dv, kw = case
    _check(*_inputs(B, Sq, Sk, Hq, Hkv, D, Dv, torch.float16, device), **kw)


# configs that exercise each way of slicing Dv: full slices, a second accumulator, a narrower last launch,
# masked columns (a remainder wider than half a slice), a head dim not a multiple of the Q K^T step
FORCED = [C(32, 32, 64, 128, 4, 2), C(32, 16, 32, 64, 4, 2, 32), C(16, 32, 64, 128, 4, 1, 64)]


@pytest.mark.parametrize("cfg", FORCED, ids=lambda c: f"M{c.block_m}-N{c.block_n}-K{c.block_k}-dv{c.block_dv}+"
                                                      f"{c.block_dv2}")
@pytest.mark.parametrize("D,Dv", [(264, 264), (320, 360), (384, 200)])
def test_forced_configs(cfg, D, Dv, device):
    q, k, v = _inputs(1, 45, 45, 2, 1, D, Dv, torch.float16, device)
    with force_backend(config=cfg):
        _check(q, k, v, causal=True)


@pytest.mark.parametrize("dv,w,w2,expected", [
    (320, 256, 64, [(0, 256, 64, 1)]),
    (1024, 256, 0, [(0, 256, 0, 4)]),
    (1024, 256, 128, [(0, 256, 128, 2), (768, 256, 0, 1)]),
    (384, 256, 0, [(0, 256, 0, 1), (256, 128, 0, 1)]),
    (512, 256, 64, [(0, 256, 0, 2)]),                  # the second accumulator would not save a slice
    (400, 256, 0, [(0, 256, 0, 2)]),                   # a remainder wider than half a slice: masked columns
    (200, 256, 64, [(0, 256, 0, 1)]),
])
def test_slices(dv, w, w2, expected):
    assert launch_large_d.slices(dv, C(128, 128, 64, w, 8, 3, w2)) == expected


@pytest.mark.parametrize("dv", list(range(8, 1025, 8)))
def test_slices_cover_dv(dv):
    for cfg in (C(128, 128, 64, 256, 8, 3, 64), C(128, 64, 64, 256, 8, 4, 128), C(32, 32, 32, 64, 4, 1)):
        pos = 0
        for start, w, w2, n in launch_large_d.slices(dv, cfg):
            assert start == pos and w & (w - 1) == 0 and (w2 == 0 or w2 & (w2 - 1) == 0) and n >= 1
            pos += n * (w + w2)
        assert dv <= pos < dv + cfg.block_dv


def test_varlen_large_d(device):
    lq, lk = [5, 0, 40, 17], [9, 3, 40, 0]
    cq, ck = _cu(lq, device), _cu(lk, device)
    q = randn(sum(lq), 4, 320, dtype=torch.float16, device=device)
    k = randn(sum(lk), 2, 320, dtype=torch.float16, device=device)
    v = randn(sum(lk), 2, 384, dtype=torch.float16, device=device)
    out, lse = tileattn.varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=True, return_lse=True)
    ref, lse_ref = varlen_attention_ref(q, k, v, cq, ck, causal=True)
    ref_lp, lse_lp = varlen_attention_ref(q, k, v, cq, ck, dtype=q.dtype, causal=True)
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


def test_sdpa_large_d(device):
    q, k, v = (randn(1, 2, 33, 512, dtype=torch.float16, device=device) for _ in range(3))
    out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    ref_lp = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert_close("out", out, ref, ref_lp)


def test_grad_above_512_raises(device):
    q, k, v = _inputs(1, 8, 8, 1, 1, 640, 640, torch.float16, device)
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="backward takes head dims up to 512"):
        tileattn.attention(q, k, v)
    with torch.no_grad():
        tileattn.attention(q, k, v)  # fine without a gradient to track


def test_fp8_above_256_raises(device):
    q, k, v = (t.to(torch.float8_e4m3fn) for t in _inputs(1, 8, 8, 1, 1, 320, 320, torch.float16, device))
    with pytest.raises(ValueError, match="fp8 attention takes head dims up to 256"):
        tileattn.attention(q, k, v)


@pytest.mark.parametrize("budget", [99 * 1024, 163 * 1024, 227 * 1024])
@pytest.mark.parametrize("arch", [80, 89, 90])
@pytest.mark.parametrize("dv", [264, 320, 384, 512, 768, 1024])
def test_candidates_fit_budget(arch, budget, dv):
    for causal in (False, True):
        cands = configs.large_d_candidates(arch, dv, causal, 2, budget)
        assert cands and all(c.smem_bytes(dv, 2) <= budget for c in cands)


# ----------------------------------------------------------------------------------------------------------
# GPU
# ----------------------------------------------------------------------------------------------------------
GPU_DIMS = [(264, 264), (320, 320), (384, 384), (512, 512), (576, 512), (640, 640), (768, 768), (1024, 1024)]
GPU_OPTS = [dict(), dict(causal=True), dict(window=(300, 40)), dict(causal=True, softcap=30.0)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("opts", GPU_OPTS, ids=lambda o: "-".join(f"{k}{v}" for k, v in o.items()) or "full")
@pytest.mark.parametrize("dims", GPU_DIMS, ids=lambda d: f"D{d[0]}-Dv{d[1]}")
def test_gpu_large_d(dims, opts, dtype, device):
    D, Dv = dims
    # odd lengths (no multiple of any block), Sq != Sk, GQA 4
    _check(*_inputs(2, 383, 517, 8, 2, D, Dv, dtype, device), **opts)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(320, 320), (1024, 1024), (128, 512)], ids=lambda d: f"D{d[0]}-Dv{d[1]}")
def test_gpu_large_d_mqa_and_long(dims, device):
    D, Dv = dims
    _check(*_inputs(1, 1100, 1300, 4, 1, D, Dv, torch.bfloat16, device), causal=True)
    _check(*_inputs(1, 1, 2000, 8, 1, D, Dv, torch.float16, device), causal=True)  # decode-like, one row


@pytest.mark.gpu
@pytest.mark.parametrize("budget", ["sm89", "sm80"])
@pytest.mark.parametrize("dims", [(320, 320), (576, 512), (1024, 1024)], ids=lambda d: f"D{d[0]}-Dv{d[1]}")
def test_gpu_large_d_smem_budget_emulation(budget, dims, device, monkeypatch):
    monkeypatch.setenv("TILEATTN_SMEM_BUDGET", budget)
    plans.clear_plans()  # plans read the budget when they are made
    D, Dv = dims
    q, k, v = _inputs(2, 300, 420, 4, 2, D, Dv, torch.float16, device)
    _check(q, k, v, causal=True)
    # the kernel chosen under the emulated budget must itself fit the emulated GPU
    assert plans.compile_only(q, k, v, causal=True).metadata.shared <= hw.device_info(q.device).smem_per_block


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(320, 320), (384, 384), (512, 512), (768, 768), (1024, 1024)],
                         ids=lambda d: f"D{d[0]}-Dv{d[1]}")
def test_gpu_table_configs_compile_without_exceeding_smem(dims, device):
    D, Dv = dims
    q, k, v = _inputs(1, 256, 256, 1, 1, D, Dv, torch.float16, device)
    for causal in (False, True):
        assert plans.compile_only(q, k, v, causal).metadata.shared <= hw.device_info(q.device).smem_per_block


def _backend(q, k, v, **opts):
    return dispatch.select(plans.describe(q, k, v, **opts)[0])[0].name


def _sm90(q, k, v):
    return _backend(q, k, v, causal=True) == "dense.large_d_sm90"


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(512, 512), (576, 512), (128, 512), (520, 520), (1024, 1024), (256, 256),
                                  (200, 256), (256, 232), (384, 384), (264, 328)], ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("shape", [(2, 383, 517), (1, 300, 50), (1, 1, 700), (1, 129, 129)],
                         ids=lambda s: "B{}-Sq{}-Sk{}".format(*s))
def test_gpu_large_d_sm90(dims, shape, device):
    """The Gluon kernel (gluon_sm90_large_d.py), both configs (Dv >= 512; Q resident for D and Dv in (192, 384]): head
    dims that are no multiple of its 64-column chunk or of its 256-column slice, fewer chunks than ring buffers,
    Sq > Sk (query blocks that see no key), a single row."""
    B, Sq, Sk = shape
    D, Dv = dims
    q, k, v = _inputs(B, Sq, Sk, 8, 2, D, Dv, torch.bfloat16 if D in (520, 200) else torch.float16, device)
    if not _sm90(q, k, v):
        pytest.skip("the Gluon kernel needs an sm90 GPU and triton 3.6")
    for causal in (False, True):
        _check(q, k, v, causal=causal)
    # SDPA's causal mask is aligned top-left
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    out = tileattn.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True).transpose(1, 2)
    ref, _ = attention_ref(q, k, v, causal="top_left")
    ref_lp, _ = attention_ref(q, k, v, causal="top_left", dtype=q.dtype)
    assert_close("out", out, ref, ref_lp)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [768, 384, 256])
def test_gpu_large_d_sm90_is_used_and_matches_triton(D, device, monkeypatch):
    """On an H100 the plan for Dv >= 512 and for D = Dv = 256 or 384 (no window, no softcap) takes the Gluon kernel
    with its config for those dims; TILEATTN_BACKEND=triton takes the Triton kernels (dense, large-D), and they
    agree."""
    q, k, v = _inputs(2, 700, 900, 4, 1, D, D, torch.float16, device)
    if not _sm90(q, k, v):
        pytest.skip("the Gluon kernel needs an sm90 GPU and triton 3.6")
    assert _backend(q, k, v) == "dense.large_d_sm90"
    assert configs.large_d_sm90_config(D, D) == (configs.LARGE_D_SM90_STREAMED if D >= 512
                                                 else configs.LARGE_D_SM90_Q_RESIDENT)
    # a window or a softcap keeps the other kernels
    assert _backend(q, k, v, window=(64, 0)) != "dense.large_d_sm90"
    assert _backend(q, k, v, softcap=30.0) != "dense.large_d_sm90"
    gluon_out = tileattn.attention(q, k, v, causal=True)
    monkeypatch.setenv("TILEATTN_BACKEND", "triton")
    plans.clear_plans()
    triton_out = tileattn.attention(q, k, v, causal=True)
    ref, _ = attention_ref(q, k, v, causal=True)
    ref_lp, _ = attention_ref(q, k, v, causal=True, dtype=q.dtype)
    assert_close("gluon", gluon_out, ref, ref_lp)
    assert_close("triton", triton_out, ref, ref_lp)


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(256, 256), (128, 512)], ids=lambda d: f"D{d[0]}-Dv{d[1]}")
@pytest.mark.parametrize("shape", [(2, 383, 517), (1, 300, 50)], ids=lambda s: "B{}-Sq{}-Sk{}".format(*s))
def test_gpu_large_d_sm90_q_resident(dims, shape, device):
    """The Gluon kernel's Q-resident variant forced, returning the LSE: at D = 256 (routed there) and at D=128,
    Dv=512 (not routed), where Q is two ring buffers' worth."""
    B, Sq, Sk = shape
    D, Dv = dims
    q, k, v = _inputs(B, Sq, Sk, 8, 2, D, Dv, torch.float16, device)
    if gluon_sm90_reason(q.device):
        pytest.skip("the Gluon kernel needs an sm90 GPU and triton 3.6")
    with force_backend("dense.large_d_sm90", config=configs.LargeDSm90Config(q_resident=True)):
        for causal in (False, True):
            _check(q, k, v, causal=causal)
