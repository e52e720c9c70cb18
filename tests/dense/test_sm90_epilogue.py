"""The Hopper forward's epilogue forms (Sm90Config.epilogue, gluon_sm90_consumer._consume_tile): "deferred" and
"kstage" on the GPU against the float32 reference, and on the CPU which mode reaches the kernel and which
combinations are refused."""
import dataclasses
import types

import pytest
import torch

import tileattn
from tileattn import force_backend, hw
from tileattn.ops.common.configs import sm90_config
from tileattn.ops.dense import plans
from tileattn.ops.dense.reference import attention_ref

from tests.dense.test_attention import _check
from tests.helpers import assert_close, plan_only_device, randn


@pytest.mark.gpu
@pytest.mark.parametrize("D,epilogue,consumers", [(64, "deferred", 2), (64, "deferred", 3), (128, "deferred", 2)])
def test_gpu_sm90_epilogue(D, epilogue, consumers, device, monkeypatch):
    """Sm90Config.epilogue: "deferred" (each tile's output store waited for in the next tile; O staged in the Q
    slot, whose release moves there too; D = 128 with two Q slots and two stages for it, as its table's single slot
    makes the plan take "tma"): CTAs walking many tiles (1 and 7 CTAs: every slot and phase reused), ragged last
    tiles (at Sq = 300 a three-consumer tile's last warpgroup has no row), tiles that see no key (causal, Sq > Sk
    bottom-right), causal / window / softcap / plain, lse, GQA; outputs filled with NaN first, so a store lost at a
    CTA's end shows."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    monkeypatch.setenv("TILEATTN_DEBUG_FILL_NAN", "1")
    cfg = dataclasses.replace(sm90_config(D, torch.float16), epilogue=epilogue)
    if D == 128 and epilogue == "deferred":
        cfg = dataclasses.replace(cfg, q_slots=2, stages=2)
    if consumers == 3:
        cfg = dataclasses.replace(cfg, consumers=3, consumer_regs=160, pingpong=False)
    k = randn(3, 555, 2, D, dtype=torch.float16, device=device)
    v = randn(3, 555, 2, D, dtype=torch.float16, device=device)
    plans.clear_plans()
    for sq in (333, 300):
        q = randn(3, sq, 8, D, dtype=torch.float16, device=device)
        for programs in (0, 1, 7):
            with force_backend("dense.sm90", config=dataclasses.replace(cfg, max_programs=programs)):
                for opts in (dict(), dict(causal=True), dict(window=(100, 20)), dict(causal=True, softcap=30.0)):
                    _check(q, k, v, **opts)
    q = randn(1, 700, 8, D, dtype=torch.float16, device=device)  # Sq > Sk, bottom-right: early rows see no key
    with force_backend("dense.sm90", config=dataclasses.replace(cfg, max_programs=7)):
        _check(q, k[:1], v[:1], causal=True)
    plans.clear_plans()


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["table", "pingpong", "stages2", "qslots2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_sm90_epilogue_kstage(dtype, variant, device, monkeypatch):
    """Sm90Config.epilogue "kstage" at D = 128 (O staged in the K buffer of the tile's last stage, that stage handed
    back after the store, the Q slot before the last p.v): the table's config (one Q slot, three stages), with
    pingpong (the wgmma turns around the epilogue's wait), with two stages (the loader puts one block before Q),
    with two Q slots; keys in 1, 2 and 9 blocks (causal: the first tiles walk 1 and 2, their last stage also their
    first), ragged tiles, 1 and 5 CTAs walking every tile (each stage and slot reused in every phase), out with and
    without the lse, tiles with no key block (causal Sq > Sk bottom-right, and a window past the keys: one
    uncomputed block gives them a stage), GQA; outputs filled with NaN first, so a store lost or overwritten shows.
    D = 64 (two O tiles per 128-key K buffer) once, at the table's D = 64 tiles."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    monkeypatch.setenv("TILEATTN_DEBUG_FILL_NAN", "1")
    over = dict(table={}, pingpong=dict(pingpong=True), stages2=dict(stages=2), qslots2=dict(q_slots=2, stages=2))
    cfg = dataclasses.replace(sm90_config(128, dtype), epilogue="kstage", **over[variant])
    k = randn(2, 1100, 2, 128, dtype=dtype, device=device)
    v = randn(2, 1100, 2, 128, dtype=dtype, device=device)
    plans.clear_plans()
    for sk in (100, 200, 1100):
        for sq in (sk, 333):
            q = randn(2, sq, 8, 128, dtype=dtype, device=device)
            for programs in (0, 1, 5):
                with force_backend("dense.sm90", config=dataclasses.replace(cfg, max_programs=programs)):
                    for opts in (dict(), dict(causal=True)):
                        _check(q, k[:, :sk], v[:, :sk], **opts)
                        out = tileattn.attention(q, k[:, :sk], v[:, :sk], **opts)  # (the kernel without the lse)
                        ref, _ = attention_ref(q, k[:, :sk], v[:, :sk], **opts)
                        assert_close("out", out, ref, attention_ref(q, k[:, :sk], v[:, :sk], dtype=dtype, **opts)[0])
    q = randn(1, 700, 8, 128, dtype=dtype, device=device)  # Sq > Sk, bottom-right: the first tiles see no key
    for programs in (1, 5):
        with force_backend("dense.sm90", config=dataclasses.replace(cfg, max_programs=programs)):
            _check(q, k[:1, :200], v[:1, :200], causal=True)
            _check(q, k[:1, :200], v[:1, :200], window=(0, 0))  # rows 500.. see key i - 500 only: 0..199
    if variant == "table":
        cfg64 = dataclasses.replace(sm90_config(64, dtype), epilogue="kstage", lpt=False)
        q, k64 = randn(2, 1100, 4, 64, dtype=dtype, device=device), randn(2, 1100, 2, 64, dtype=dtype, device=device)
        for programs in (0, 5):
            with force_backend("dense.sm90", config=dataclasses.replace(cfg64, max_programs=programs)):
                for opts in (dict(), dict(causal=True)):
                    _check(q, k64, k64.flip(1), **opts)
    plans.clear_plans()


def _epilogue_of(launcher):
    return launcher._values[launcher._names.index("EPILOGUE")]


def _planned_launchers(monkeypatch):
    """(device, runs): dense.sm90 plans build as on a 132-SM Hopper and their launches append the kernel launcher
    to `runs` instead of running (plan_only_device: the GPU where there is one, else the CPU)."""
    from tileattn.ops.common import launch_sm90 as pipeline
    from tileattn.ops.dense import launch_sm90
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    dev = plan_only_device(monkeypatch)
    monkeypatch.setattr(pipeline, "reason", lambda *a, **kw: "")
    runs = []
    monkeypatch.setattr(launch_sm90.Sm90Launch, "run", lambda self, c: runs.append(self.launcher))
    return dev, runs


def test_sm90_epilogue_reaches_kernel(monkeypatch):
    """Sm90Config.epilogue reaches the kernel: "deferred" where the output has its own buffer (fp8) or two Q slots
    hold O in turn (D = 64), "tma" instead with O staged in D = 128's single Q slot (the next Q would wait on the
    slot the deferred wait releases); an unknown mode (and "direct", measured slower and removed) is refused."""
    from tileattn.ops.common.configs import Sm90Config
    for mode in ("async", "direct"):
        with pytest.raises(ValueError, match="epilogue"):
            Sm90Config(block_m=64, block_n=128, stages=4, consumer_regs=240, epilogue=mode)
    dev, runs = _planned_launchers(monkeypatch)
    for D, dtype, mode, want in ((64, torch.float16, "deferred", "deferred"), (128, torch.float16, "deferred", "tma"),
                                 (128, torch.float8_e4m3fn, "deferred", "deferred")):
        q = randn(1, 256, 2, D, dtype=torch.float16, device=dev)
        opts = {}
        if dtype != torch.float16:
            q, qd = tileattn.quantize_fp8(q, dtype=dtype)
            opts = dict(q_descale=qd, k_descale=qd, v_descale=qd)
        plans.clear_plans()
        with force_backend("dense.sm90", config=dataclasses.replace(sm90_config(D, dtype), epilogue=mode)):
            tileattn.attention(q, q, q, **opts)
        launcher = runs.pop()
        assert _epilogue_of(launcher) == want, (D, dtype, mode)
    plans.clear_plans()


def test_sm90_epilogue_kstage_reaches_kernel(monkeypatch):
    """Sm90Config.epilogue "kstage" reaches the dense kernel with 16-bit inputs (D = 128's one Q slot, D = 64's two);
    refused with a ValueError where O cannot be staged in a K buffer: tiles of more rows than a K tile has keys
    (3 consumers, D = 256's 64-key tiles), fp8 (its output has its own buffers and dtype); the flex kernel declines
    it (its store is "tma"), saying why."""
    from tileattn.ops.flex import launch_sm90 as flex_sm90
    for bad in (dict(consumers=3, consumer_regs=160), dict(block_n=64)):
        with pytest.raises(ValueError, match="kstage"):
            dataclasses.replace(sm90_config(64, torch.float16), epilogue="kstage", **bad)
    with pytest.raises(ValueError, match="kstage"):
        dataclasses.replace(sm90_config(256, torch.float16), epilogue="kstage")
    dev, runs = _planned_launchers(monkeypatch)
    for D, dtype in ((128, torch.float16), (64, torch.float16), (128, torch.float8_e4m3fn)):
        q = randn(1, 256, 2, D, dtype=torch.float16, device=dev)
        opts = {}
        if dtype == torch.float8_e4m3fn:
            q, qd = tileattn.quantize_fp8(q, dtype=dtype)
            opts = dict(q_descale=qd, k_descale=qd, v_descale=qd)
        plans.clear_plans()
        with force_backend("dense.sm90", config=dataclasses.replace(sm90_config(D, dtype), epilogue="kstage")):
            if dtype == torch.float8_e4m3fn:
                with pytest.raises(ValueError, match="kstage"):
                    tileattn.attention(q, q, q, **opts)
                continue
            tileattn.attention(q, q, q, **opts)
        launcher = runs.pop()
        assert _epilogue_of(launcher) == "kstage", (D, dtype)
    plans.clear_plans()
    p = types.SimpleNamespace(head_dim=128, head_dim_v=128, device="cuda", dtype=torch.float16, out_dtype=torch.float16,
                              q_block=flex_sm90.BLOCK, kv_block=flex_sm90.BLOCK, fp8=False, seqlen_k=256, tma=True)
    assert flex_sm90.Sm90Backend().supports(p)[0]
    with force_backend(config=dataclasses.replace(sm90_config(128, torch.float16), epilogue="kstage")):
        ok, why = flex_sm90.Sm90Backend().supports(p)
    assert not ok and "kstage" in why


def test_sm90_dense_config_kstage_rule():
    """The table takes "kstage" for 16-bit D = 128 below SM90_KSTAGE_BELOW's query rows (causal or not), and
    nowhere else: D = 64 keeps "deferred", fp8 its own epilogue, long problems the table's entry."""
    from tileattn.ops.common.configs import SM90_KSTAGE_BELOW, sm90_dense_config
    below = SM90_KSTAGE_BELOW[(128, 2)]
    for dtype in (torch.float16, torch.bfloat16):
        for n, masked in ((1, False), (1024, True), (below - 1, False)):
            assert sm90_dense_config(128, dtype, n, masked).epilogue == "kstage", (dtype, n)
        assert sm90_dense_config(128, dtype, below, False) == sm90_config(128, dtype)
        assert sm90_dense_config(64, dtype, 1024, False).epilogue == sm90_config(64, dtype).epilogue != "kstage"
    assert sm90_dense_config(128, torch.float8_e4m3fn, 1024, False).epilogue != "kstage"


def test_sm90_table_epilogue_reaches_kernel(monkeypatch):
    """Unforced, the table's epilogue reaches the D = 128 16-bit kernel by query length: "kstage" below
    SM90_KSTAGE_BELOW's rows, "tma" from there."""
    from tileattn.ops.common.configs import SM90_KSTAGE_BELOW
    dev, runs = _planned_launchers(monkeypatch)
    below = SM90_KSTAGE_BELOW[(128, 2)]
    for n, want in ((1024, "kstage"), (below - 128, "kstage"), (below, "tma")):
        q = randn(1, n, 2, 128, dtype=torch.float16, device=dev)
        plans.clear_plans()
        with force_backend("dense.sm90"):
            tileattn.attention(q, q, q, causal=True)
        launcher = runs.pop()
        assert _epilogue_of(launcher) == want, n
    plans.clear_plans()
