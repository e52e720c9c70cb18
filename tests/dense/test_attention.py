"""Dense attention forward against the float32 reference, under the tolerance rule.

CPU runs (Triton interpreter) take the small `CPU_CASES` in float16 (the interpreter's bf16 dots are
wrong); the `gpu`-marked matrix covers bf16, long sequences and every head dim on the GPU.
"""
import dataclasses
import itertools

import pytest
import torch

import tileattn
from tileattn import force_backend, hw
from tileattn.ops.common.configs import sm90_config
from tileattn.ops.dense import dispatch, launch_triton, plans
from tileattn.ops.dense.configs import AttnConfig
from tileattn.ops.dense.reference import attention_ref, varlen_attention_ref

from tests.helpers import assert_close, plan_only_device, randn


def _check(q, k, v, **kw):
    out, lse = tileattn.attention(q, k, v, return_lse=True, **kw)
    ref, lse_ref = attention_ref(q, k, v, **kw)
    ref_lp, lse_lp = attention_ref(q, k, v, dtype=q.dtype, **kw)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert lse.shape == lse_ref.shape and lse.dtype == torch.float32
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


def _case_id(c):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap = c
    s = f"B{B}-Sq{Sq}-Sk{Sk}-H{Hq}-Hkv{Hkv}-D{D}" + (f"-Dv{Dv}" if Dv != D else "")
    s += "-causal" if causal else ""
    s += f"-win{window[0]}_{window[1]}" if window != (-1, -1) else ""
    s += f"-cap{softcap:g}" if softcap else ""
    return s


# (B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap)
CPU_CASES = [
    (1, 1, 1, 1, 1, 32, 32, False, (-1, -1), 0.0),
    (2, 17, 17, 4, 4, 64, 64, True, (-1, -1), 0.0),
    (1, 127, 127, 2, 1, 64, 64, False, (-1, -1), 0.0),
    (1, 40, 127, 8, 2, 64, 64, True, (-1, -1), 0.0),   # Sq < Sk, GQA 4
    (1, 127, 40, 8, 1, 64, 64, True, (-1, -1), 0.0),   # Sq > Sk: first rows see nothing, MQA
    (1, 1, 100, 8, 1, 32, 32, True, (-1, -1), 0.0),    # decode-like
    (1, 70, 70, 2, 2, 96, 96, False, (-1, -1), 0.0),
    (1, 33, 65, 2, 2, 192, 128, True, (-1, -1), 0.0),  # Dv != D
    (1, 33, 33, 1, 1, 256, 256, False, (-1, -1), 0.0),
    (1, 65, 65, 2, 2, 32, 64, False, (-1, -1), 0.0),
    (1, 90, 90, 2, 2, 64, 64, False, (16, 8), 0.0),
    (1, 90, 120, 2, 1, 64, 64, True, (24, -1), 0.0),
    (1, 90, 90, 2, 2, 64, 64, False, (-1, 0), 0.0),
    (1, 60, 60, 2, 2, 64, 64, False, (0, 0), 0.0),
    (2, 50, 50, 4, 2, 64, 64, True, (-1, -1), 30.0),
    (1, 50, 70, 2, 2, 64, 64, False, (-1, -1), 5.0),
    (1, 100, 30, 2, 2, 64, 64, False, (5, 0), 0.0),  # window rows past the keys see nothing
]


@pytest.mark.parametrize("case", CPU_CASES, ids=_case_id)
def test_attention(case, device):
    B, Sq, Sk, Hq, Hkv, D, Dv, causal, window, softcap = case
    dt = torch.float16
    q, k, v = randn(B, Sq, Hq, D, dtype=dt, device=device), randn(B, Sk, Hkv, D, dtype=dt, device=device), \
        randn(B, Sk, Hkv, Dv, dtype=dt, device=device)
    _check(q, k, v, causal=causal, window=window, softcap=softcap)


# the tensor-descriptor (TMA) path and small tiles, forced, so the interpreter covers them as well
FORCED = [AttnConfig(32, 32, 4, 2, True, False), AttnConfig(16, 32, 4, 2), AttnConfig(64, 16, 4, 1),
          AttnConfig(16, 16, 4, 2, pipeline_qk=True), AttnConfig(32, 16, 4, 2, True, pipeline_qk=True)]


@pytest.mark.parametrize("cfg", FORCED, ids=lambda c: f"M{c.block_m}-N{c.block_n}-tma{int(c.use_tma)}"
                         f"-pq{int(c.pipeline_qk)}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forced_configs(cfg, causal, device):
    q = randn(2, 45, 4, 64, dtype=torch.float16, device=device)
    k = randn(2, 77, 2, 64, dtype=torch.float16, device=device)
    v = randn(2, 77, 2, 96, dtype=torch.float16, device=device)
    with force_backend(config=cfg):
        _check(q, k, v, causal=causal, window=(30, -1))


def test_strided_inputs(device):
    """Head-major storage seen through a transpose and a sliced head dim: no copies, right answer."""
    q = randn(2, 4, 50, 64, dtype=torch.float16, device=device).transpose(1, 2)
    kv = randn(2, 60, 2, 2, 64, dtype=torch.float16, device=device)
    k, v = kv[:, :, 0], kv[:, :, 1]
    assert not q.is_contiguous() and not k.is_contiguous()
    _check(q, k, v, causal=True)


def _cu(lens, device):
    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lens", [([5, 0, 40, 17], [9, 3, 40, 0]), ([1, 33], [1, 70])], ids=["empty", "short"])
def test_varlen(lens, causal, device):
    lq, lk = lens
    cq, ck = _cu(lq, device), _cu(lk, device)
    q = randn(sum(lq), 4, 64, dtype=torch.float16, device=device)
    k = randn(sum(lk), 2, 64, dtype=torch.float16, device=device)
    v = randn(sum(lk), 2, 32, dtype=torch.float16, device=device)
    out, lse = tileattn.varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=causal, return_lse=True)
    ref, lse_ref = varlen_attention_ref(q, k, v, cq, ck, causal=causal)
    ref_lp, lse_lp = varlen_attention_ref(q, k, v, cq, ck, dtype=q.dtype, causal=causal)
    assert out.shape == (sum(lq), 4, 32) and lse.shape == (4, sum(lq))
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


def test_rows_with_nothing_visible(device):
    q = randn(1, 20, 2, 64, dtype=torch.float16, device=device)
    k = randn(1, 5, 2, 64, dtype=torch.float16, device=device)
    v = randn(1, 5, 2, 64, dtype=torch.float16, device=device)
    out, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
    assert torch.all(out[:, :15] == 0) and torch.all(lse[:, :, :15] == float("-inf"))
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 15:]).all()


def test_sdpa_matches_torch(device):
    q = randn(2, 4, 33, 64, dtype=torch.float16, device=device)
    k = randn(2, 2, 50, 64, dtype=torch.float16, device=device)
    v = randn(2, 2, 50, 64, dtype=torch.float16, device=device)
    for causal in (False, True):
        out = tileattn.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        kw = dict(causal="top_left" if causal else False)
        t = lambda x: x.transpose(1, 2)  # noqa: E731
        ref, _ = attention_ref(t(q), t(k), t(v), **kw)
        ref_lp, _ = attention_ref(t(q), t(k), t(v), dtype=q.dtype, **kw)
        assert out.shape == (2, 4, 33, 64) and out.is_contiguous()
        assert_close("sdpa", out, t(ref), t(ref_lp))


def test_sdpa_attn_mask_falls_back_with_warning(device):
    q = randn(1, 2, 8, 32, dtype=torch.float16, device=device)
    mask = torch.rand(8, 8, device=device) > 0.3
    mask[:, 0] = True
    with pytest.warns(UserWarning, match="falling back"):
        out = tileattn.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), attn_mask=mask)
    assert (out.float() - ref).abs().max() < 1e-2


# --------------------------------------------------------------------------------------------------------
# the GPU matrix
# --------------------------------------------------------------------------------------------------------
GPU_SHAPES = [
    (2, 1000, 1000, 8, 8, 128, 128), (1, 1, 1000, 8, 1, 128, 128), (2, 127, 1000, 16, 4, 64, 64),
    (2, 1000, 127, 16, 2, 64, 64), (1, 513, 777, 8, 8, 96, 96), (1, 300, 300, 4, 4, 192, 128),
    (1, 300, 300, 4, 4, 256, 256), (1, 257, 257, 4, 4, 32, 64), (1, 1024, 1024, 8, 8, 160, 160),
    (1, 2048, 2048, 4, 4, 64, 64), (1, 2048, 2048, 4, 4, 128, 128),
]
GPU_OPTS = [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (False, (100, 50), 0.0), (True, (-1, -1), 30.0)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("opts", GPU_OPTS, ids=lambda o: f"c{int(o[0])}-w{o[1][0]}_{o[1][1]}-cap{o[2]:g}")
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "B{}-Sq{}-Sk{}-H{}-Hkv{}-D{}-Dv{}".format(*s))
def test_gpu_matrix(shape, opts, dtype, device):
    B, Sq, Sk, Hq, Hkv, D, Dv = shape
    causal, window, softcap = opts
    q, k, v = randn(B, Sq, Hq, D, dtype=dtype, device=device), randn(B, Sk, Hkv, D, dtype=dtype, device=device), \
        randn(B, Sk, Hkv, Dv, dtype=dtype, device=device)
    _check(q, k, v, causal=causal, window=window, softcap=softcap)


@pytest.mark.gpu
@pytest.mark.parametrize("budget", ["sm89", "sm80"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_smem_budget_emulation(budget, D, device, monkeypatch):
    monkeypatch.setenv("TILEATTN_SMEM_BUDGET", budget)
    plans.clear_plans()  # plans read the budget when they are made
    q = randn(2, 700, 8, D, dtype=torch.float16, device=device)
    k = randn(2, 900, 2, D, dtype=torch.float16, device=device)
    v = randn(2, 900, 2, D, dtype=torch.float16, device=device)
    _check(q, k, v, causal=True)
    # the kernel chosen under the emulated budget must itself fit the emulated GPU
    assert plans.compile_only(q, k, v, causal=True).metadata.shared <= hw.device_info(q.device).smem_per_block


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_varlen(dtype, device):
    lq = [0, 1, 513, 1000, 77, 0, 300]
    lk = [10, 1, 513, 1200, 0, 0, 900]
    cq, ck = _cu(lq, device), _cu(lk, device)
    q = randn(sum(lq), 8, 128, dtype=dtype, device=device)
    k = randn(sum(lk), 2, 128, dtype=dtype, device=device)
    v = randn(sum(lk), 2, 128, dtype=dtype, device=device)
    for causal in (False, True):
        out, lse = tileattn.varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=causal, return_lse=True)
        ref, lse_ref = varlen_attention_ref(q, k, v, cq, ck, causal=causal)
        ref_lp, lse_lp = varlen_attention_ref(q, k, v, cq, ck, dtype=dtype, causal=causal)
        assert_close("out", out, ref, ref_lp)
        assert_close("lse", lse, lse_ref, lse_lp)


def _backend(q, k, v, **opts):
    return dispatch.select(plans.describe(q, k, v, **opts)[0])[0].name


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_sm90_dispatch(D, device, monkeypatch):
    """On an H100, D = 64 / 128 go to the Gluon kernel, and D = 256 without a right bound (causal D = 256
    measured faster on the portable kernel, common/configs.py; without a window or softcap D = 256 goes to the
    large-D Gluon kernel first, test_large_d.py); TILEATTN_BACKEND=triton and a smaller budget send them to the
    portable one; every route agrees with the reference."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    q = randn(2, 1000, 8, D, dtype=torch.float16, device=device)
    k = randn(2, 1100, 2, D, dtype=torch.float16, device=device)
    v = randn(2, 1100, 2, D, dtype=torch.float16, device=device)
    window = (100, -1)  # keeps D = 256 off the large-D kernel
    assert _backend(q, k, v, window=window) == "dense.sm90"
    assert _backend(q, k, v, causal=True, window=window) == ("dense.sm90" if D != 256 else "dense.triton")
    assert _backend(q, k, v, scale=-1.0, window=window) == "dense.triton"  # the kernel needs a positive scale
    assert _backend(q[..., : D - 8], k[..., : D - 8], v, window=window) == "dense.triton"
    _check(q, k, v, causal=True)
    _check(q, k, v, window=window)
    monkeypatch.setenv("TILEATTN_BACKEND", "triton")
    assert _backend(q, k, v, window=window) == "dense.triton"
    plans.clear_plans()
    _check(q, k, v, causal=True)
    monkeypatch.delenv("TILEATTN_BACKEND")
    monkeypatch.setenv("TILEATTN_SMEM_BUDGET", "sm89")
    assert _backend(q, k, v, window=window) == "dense.triton"
    plans.clear_plans()


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(window=(100, 20)), dict(causal=True, softcap=30.0)],
                         ids=["full", "causal", "window", "causal-softcap"])
def test_gpu_sm90_persistent(D, opts, device, monkeypatch):
    """The Gluon kernel's CTAs walk many tiles of unequal length (barrier phases and Q slots carried across
    tiles; D = 256 has one Q slot): as dispatch sends them (more tiles than SMs), and forced onto the kernel with
    1 and 7 CTAs for the whole problem (masks dispatch sends elsewhere included) and with one CTA per tile; the
    consumers' wgmma turns (Sm90Config.pingpong) both ways."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    monkeypatch.setenv("TILEATTN_DEBUG_FILL_NAN", "1")
    plans.clear_plans()
    q = randn(3, 333, 48, D, dtype=torch.float16, device=device)  # 3 query blocks x 144 heads: 432 tiles
    k = randn(3, 555, 12, D, dtype=torch.float16, device=device)
    v = randn(3, 555, 12, D, dtype=torch.float16, device=device)
    _check(q, k, v, **opts)
    table = sm90_config(D, q.dtype)
    for programs, pingpong in ((1, table.pingpong), (7, table.pingpong), (0, not table.pingpong),
                               (7, not table.pingpong)):
        with force_backend("dense.sm90", config=dataclasses.replace(table, max_programs=programs, pingpong=pingpong)):
            _check(q, k, v, **opts)
    with force_backend("dense.sm90", config=dataclasses.replace(table, one_cta_from=256)):  # one CTA per tile
        _check(q, k, v, **opts)
    for programs in (0, 7):  # causal and window tiles in the other order (Sm90Config.lpt: the table's, or the snake)
        with force_backend("dense.sm90", config=dataclasses.replace(table, lpt=not table.lpt, max_programs=programs)):
            _check(q, k, v, **opts)
    plans.clear_plans()


@pytest.mark.gpu
@pytest.mark.parametrize("exp2_fma", [1, 2])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_sm90_exp2_fma(dtype, D, exp2_fma, device):
    """The softmax's exp2 with 1 or 2 of every 4 values on the FMA pipe (Sm90Config.exp2_fma, a polynomial)
    agrees with the reference: masked scores (exp2(-inf) must give 0 exactly), rows that see no key (Sq > Sk,
    bottom-right causal: out 0, lse -inf), a window, softcap, and scores spread over a wide exponent range."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    q = randn(2, 300, 8, D, dtype=dtype, device=device)
    k = randn(2, 200, 2, D, dtype=dtype, device=device)
    v = randn(2, 200, 2, D, dtype=dtype, device=device)
    cfg = dataclasses.replace(sm90_config(D, dtype), exp2_fma=exp2_fma)
    plans.clear_plans()
    with force_backend("dense.sm90", config=cfg):
        for opts in (dict(causal=True), dict(window=(40, 8)), dict(causal=True, softcap=20.0), dict()):
            _check(q, k, v, **opts)
        _check(q * 4, k, v, scale=0.5)  # scores of ~+-40 in log2 units: exponents far below the row max
    plans.clear_plans()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_sm90_three_consumers(dtype, device):
    """Three consumer warpgroups (Sm90Config.consumers = 3: 192-row tiles, 160 registers each) at D = 64: tiles
    whose last rows run past Sq, causal (the heaviest tiles first), a window whose first rows see no key, Sq > Sk
    bottom-right (rows that see nothing: out 0, lse -inf), softcap, GQA, one CTA and 7 CTAs walking every tile."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    table = sm90_config(64, dtype)
    cfg = dataclasses.replace(table, consumers=3, consumer_regs=160, pingpong=False)
    k = randn(2, 250, 2, 64, dtype=dtype, device=device)
    v = randn(2, 250, 2, 64, dtype=dtype, device=device)
    plans.clear_plans()
    # 2 tiles of 192 rows per head, the second ragged: at Sq = 300 its third warpgroup has no row at all
    for sq in (333, 300):
        q = randn(2, sq, 8, 64, dtype=dtype, device=device)
        for programs in (0, 1, 7):
            with force_backend("dense.sm90", config=dataclasses.replace(cfg, max_programs=programs)):
                for opts in (dict(), dict(causal=True), dict(window=(40, 0)), dict(causal=True, softcap=30.0)):
                    _check(q, k, v, **opts)
    plans.clear_plans()


def test_sm90_tile_order():
    """launch_sm90.tile_order (Sm90Config.lpt): where it returns an order, every tile exactly once, each CTA's tiles
    window by window of heads, and less work for the busiest CTA than the snake (tile_of) on the cost model; None
    where the snake is as good or the rounds are too many to be worth the host's time."""
    import numpy as np

    from tileattn.ops.common import launch_sm90
    snake_only = []
    for seqlen, bh, programs in ((1000, 128, 132), (4096, 128, 132), (16384, 32, 132), (2048, 12, 132), (333, 144, 7)):
        costs = launch_sm90.block_costs(seqlen, seqlen, 0, -1, 0, 128, 128)
        num_m = len(costs)
        assert costs[0] < costs[-1]  # causal: the last query block sees the most keys
        snake = launch_sm90._snake_table(num_m, bh, programs)
        assert sorted(snake[snake >= 0].tolist()) == list(range(num_m * bh))
        table = launch_sm90.tile_order(costs, num_m, bh, programs)
        if table is None:
            snake_only.append(seqlen)
            continue
        assert table.shape[1] == programs and table.dtype == np.int32
        assert sorted(table[table >= 0].tolist()) == list(range(num_m * bh))
        for p in range(programs):  # -1 only after a CTA's last tile; heads in ascending windows (of any of the
            # window sizes, which all divide the largest)
            col = table[:, p]
            n = int((col >= 0).sum())
            assert (col[:n] >= 0).all() and (col[n:] == -1).all()
            assert (np.diff(col[:n] // num_m // max(launch_sm90.LPT_HEADS)) >= 0).all()
        assert launch_sm90._makespan(costs, num_m, table) < launch_sm90._makespan(costs, num_m, snake)
    assert 4096 not in snake_only and 16384 not in snake_only  # the cost model's gain (docs/design/dense.md)
    # past LPT_MAX_ROUNDS rounds the snake stays, without the host building orders (1,024 heads of 64 blocks)
    costs = launch_sm90.block_costs(8192, 8192, 0, -1, 0, 128, 128)
    assert len(costs) * 1024 > launch_sm90.LPT_MAX_ROUNDS * 132
    assert launch_sm90.tile_order(costs, len(costs), 1024, 132) is None
    # a window bound: the key range starts at the window's first key block
    assert launch_sm90.block_costs(512, 512, 0, 128, 0, 128, 128, overhead=0) == [1.0, 2.0, 2.0, 2.0]


def test_sm90_config_consumers():
    """Sm90Config.consumers: 2 or 3; three take at most 160 registers each and no pingpong; the grid's tiles and the
    shared memory count consumers * block_m query rows."""
    from tileattn.ops.common import launch_sm90
    from tileattn.ops.common.configs import Sm90Config, sm90_smem_bytes
    two = Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240)
    three = dataclasses.replace(two, consumers=3, consumer_regs=160)
    for bad in (dict(consumers=4), dict(consumers=3), dict(consumers=3, consumer_regs=160, pingpong=True)):
        with pytest.raises(ValueError, match="consumers"):
            dataclasses.replace(two, **bad)
    assert sm90_smem_bytes(three, 64, 64, 2) - sm90_smem_bytes(two, 64, 64, 2) == 2 * 64 * 64 * 2  # a Q tile per slot
    # one CTA per tile (no persistent grid, so no device facts needed)
    assert launch_sm90.grid(dataclasses.replace(three, persistent=False), 1000, 4, "cuda") == (6 * 4,)
    assert launch_sm90.grid(dataclasses.replace(two, persistent=False), 1000, 4, "cuda") == (8 * 4,)


@pytest.mark.parametrize("lpt", [False, True], ids=["snake", "lpt"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn], ids=["fp16", "e4m3"])
def test_sm90_plan_builds(dtype, lpt, monkeypatch):
    """dense.sm90's launch plan builds with every tensor it passes varying per call (KernelLauncher refuses a
    tensor frozen into the plan), with and without the longest-first tile table; the values a call replays match
    the kernel's VARYING parameters. Runs without a GPU: the plan is built, not launched."""
    from tileattn.ops.common import launch_sm90 as pipeline
    from tileattn.ops.dense import launch_sm90
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    dev = plan_only_device(monkeypatch)
    monkeypatch.setattr(pipeline, "reason", lambda *a, **kw: "")
    runs = []
    monkeypatch.setattr(launch_sm90.Sm90Launch, "run", lambda self, c: runs.append((self, self._values(c))))
    q = randn(2, 1000, 64, 64, dtype=torch.float16, device=dev)
    opts = dict(causal=True)
    if dtype != torch.float16:
        (q, qd), (k, kd), (v, vd) = (tileattn.quantize_fp8(t, dtype=dtype) for t in (q, q.flip(1), q.flip(2)))
        opts.update(q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        k, v = q.flip(1), q.flip(2)
    plans.clear_plans()
    cfg = dataclasses.replace(sm90_config(64, dtype), lpt=lpt)
    with force_backend("dense.sm90", config=cfg):
        tileattn.attention(q, k, v, **opts)
    plans.clear_plans()
    (launch, values), = runs
    assert len(values) == len(launch_sm90.VARYING)
    assert (launch.order is not None) == lpt  # 128 heads of 8 tiles on 132 CTAs: the table wins
    if lpt:
        assert values[launch_sm90.VARYING.index("order_ptr")] is launch.order


def test_sm90_dense_config_by_shape(monkeypatch):
    """sm90_dense_config: the table's entry below SM90_THREE_FROM's query lengths (masked problems: the second),
    three consumer warpgroups (<= 160 registers, no pingpong) from them, D = 128 never; the longest-first order
    off from SM90_LPT_BELOW rows; a forced config as it is.
    sm90_dense_config gives the table's two consumers where the three-consumer tiles exceed the plan's shared memory."""
    from tileattn.ops.common import launch_sm90 as pipeline
    from tileattn.ops.common.configs import SM90_LPT_BELOW, SM90_THREE_FROM, sm90_dense_config
    from tileattn.ops.dense import launch_sm90
    for dt in (torch.float16, torch.bfloat16, torch.float8_e4m3fn):
        base = sm90_config(64, dt)
        for masked, start in zip((False, True), SM90_THREE_FROM[(64, dt.itemsize)]):
            lpt = dict(lpt=base.lpt and start - 1 < SM90_LPT_BELOW)
            assert sm90_dense_config(64, dt, start - 1, masked) == dataclasses.replace(base, **lpt)
            three = sm90_dense_config(64, dt, start, masked)
            assert (three.consumers, three.pingpong) == (3, False) and three.consumer_regs <= 160
            assert three.lpt == (base.lpt and start < SM90_LPT_BELOW)
            assert dataclasses.replace(three, consumers=2, consumer_regs=base.consumer_regs,
                                       pingpong=base.pingpong, lpt=base.lpt) == base
    assert sm90_dense_config(128, torch.float16, 1 << 16, False) == sm90_config(128, torch.float16)
    with force_backend("dense.sm90", config=sm90_config(64, torch.float16)):
        assert sm90_dense_config(64, torch.float16, 1 << 16, False).consumers == 2
    dev = plan_only_device(monkeypatch)
    monkeypatch.setattr(pipeline, "reason", lambda *a, **kw: "")
    runs = []
    monkeypatch.setattr(launch_sm90.Sm90Launch, "run", lambda self, c: runs.append((self.grid, self.order)))
    q = randn(1, 4096, 2, 64, dtype=torch.float16, device=dev)
    cases = ((232448, dict(), 192), (170000, dict(), 128),  # three consumers need 181,248 bytes here, two 164,864
             (232448, dict(causal=True), 128), (232448, dict(window=(100, -1)), 128))  # masked: from 16K rows
    for smem, opts, rows in cases:
        monkeypatch.setattr(hw, "device_info", lambda device, smem=smem: hw.DeviceInfo(
            arch=90, num_sms=132, smem_per_block=smem))
        plans.clear_plans()
        with force_backend("dense.sm90"):
            tileattn.attention(q, q, q, **opts)
        assert runs.pop()[0] == (2 * -(-4096 // rows),), opts  # 2 heads of 22 or 32 tiles (fewer than the SMs)
    # where three consumers do not fit, the two-consumer fallback keeps the rule of its length: no longest-first
    # order at 16K rows (8 heads of 128 tiles on 132 CTAs would have one: launch_sm90.tile_order)
    q = randn(1, 16384, 8, 64, dtype=torch.float16, device=dev)
    for smem in (232448, 170000):
        monkeypatch.setattr(hw, "device_info", lambda device, smem=smem: hw.DeviceInfo(
            arch=90, num_sms=132, smem_per_block=smem))
        plans.clear_plans()
        with force_backend("dense.sm90"):
            tileattn.attention(q, q, q, causal=True)
        grid, order = runs.pop()
        assert order is None and grid == (132,), smem
    plans.clear_plans()


def test_sm90_grid_per_shape(monkeypatch):
    """The Hopper forward's grid: one CTA per SM below the table's one_cta_from (D=128), one CTA per tile from it;
    flex keeps the persistent grid."""
    from tileattn import hw
    from tileattn.ops.common import launch_sm90
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    cfg = sm90_config(128, torch.float16)
    n = cfg.one_cta_from
    assert n and launch_sm90.persistent(cfg, n - 1) and not launch_sm90.persistent(cfg, n)
    tiles = n // (2 * cfg.block_m) * 4
    assert launch_sm90.grid(cfg, n - 1, 4, "cuda") == (132,)
    assert launch_sm90.grid(cfg, n, 4, "cuda") == (tiles,)
    from tileattn.ops.flex.launch_sm90 import _grid_config
    assert launch_sm90.grid(_grid_config(cfg), n, 4, "cuda") == (132,)
    assert launch_sm90.grid(dataclasses.replace(cfg, persistent=False), 1024, 4, "cuda") == (1024 // 128 * 4,)


@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
def test_batch_head_axis_folded(varlen, device, monkeypatch):
    """B * Hq past the grid's y limit folds onto z (here a limit of 5 for 2 x 4 heads: 3 idle programs)."""
    monkeypatch.setattr(launch_triton, "MAX_GRID_Y", 5)
    monkeypatch.setenv("TILEATTN_BACKEND", "dense.triton")  # the portable kernel (the Gluon one has a 1-D grid)
    plans.clear_plans()
    try:
        if varlen:
            lq, lk = [37, 0], [50, 9]
            cq, ck = _cu(lq, device), _cu(lk, device)
            q = randn(sum(lq), 4, 64, dtype=torch.float16, device=device)
            k = randn(sum(lk), 2, 64, dtype=torch.float16, device=device)
            v = randn(sum(lk), 2, 64, dtype=torch.float16, device=device)
            out = tileattn.varlen_attention(q, k, v, cq, ck, max(lq), max(lk), causal=True)
            ref, _ = varlen_attention_ref(q, k, v, cq, ck, causal=True)
            ref_lp, _ = varlen_attention_ref(q, k, v, cq, ck, dtype=q.dtype, causal=True)
            assert_close("out", out, ref, ref_lp)
        else:
            q = randn(2, 37, 4, 64, dtype=torch.float16, device=device)
            k = randn(2, 50, 2, 64, dtype=torch.float16, device=device)
            v = randn(2, 50, 2, 64, dtype=torch.float16, device=device)
            _check(q, k, v, causal=True)
    finally:
        plans.clear_plans()
