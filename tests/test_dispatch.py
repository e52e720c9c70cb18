"""Backend choice (ops/common/backend.py and each op's dispatch.py), without a GPU: the routes an H100 takes,
forcing (force_backend, TILEATTN_BACKEND, the former TILEATTN_SM90) and its errors, `tileattn info`.

The H100 is emulated: hw reports a Hopper GPU with its SM count and shared memory, and the Gluon kernels'
Triton version check passes; problems are described, never launched.
"""
import dataclasses
import subprocess
import sys
import threading
import types
import warnings

import pytest
import torch

import tileattn
from tileattn import hw, knobs
from tileattn.ops.common import backend, tma
from tileattn.ops.common.configs import BwdConfig, Sm90Config, bwd_config
from tileattn.ops.dense import dispatch as dense
from tileattn.ops.dense.configs import AttnConfig, LargeDConfig
from tileattn.ops.dense.problem import AttnOptions, AttnProblem
from tileattn.ops.flex import dispatch as flex
from tileattn.ops.flex.problem import FlexProblem
from tileattn.ops.mla import dispatch as mla
from tileattn.ops.mla.configs import MLAConfig

CUDA = torch.device("cuda")


@pytest.fixture
def h100(monkeypatch):
    monkeypatch.setattr(hw, "interpreter_enabled", lambda: False)
    monkeypatch.setattr(hw, "is_hopper", lambda device: True)
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(90, 132, 232448))
    monkeypatch.setattr(tma, "gluon_available", lambda: True)
    for name in ("TILEATTN_BACKEND", "TILEATTN_SM90"):
        monkeypatch.delenv(name, raising=False)


def _dense(d, dv=None, causal=False, window=(-1, -1), dtype=torch.float16, varlen=False, softcap=0.0, scale=None,
           tma_ok=True):
    right = 0 if causal else window[1]
    opts = AttnOptions(scale=d ** -0.5 if scale is None else scale, window=(window[0], right), softcap=softcap)
    odt = torch.bfloat16 if dtype.itemsize == 1 else dtype
    return AttnProblem(4, 4096, 4096, 32, 8, d, dv or d, dtype, odt, CUDA, opts, varlen=varlen, tma=(tma_ok,) * 4)


F16, BF16, E4M3 = torch.float16, torch.bfloat16, torch.float8_e4m3fn
ROUTES = [  # (problem kwargs, backend on an H100)
    (dict(d=64), "dense.sm90"),
    (dict(d=128, causal=True), "dense.sm90"),
    (dict(d=128, window=(256, 16), softcap=30.0), "dense.sm90"),
    (dict(d=128, scale=-0.1), "dense.triton"),  # the Gluon kernel folds a positive scale into exp2
    (dict(d=128, tma_ok=False), "dense.triton"),
    (dict(d=96), "dense.triton"),  # no Gluon config for D = 96
    (dict(d=128, dv=64), "dense.triton"),
    (dict(d=128, varlen=True), "dense.triton"),
    (dict(d=64, dtype=E4M3, causal=True), "dense.sm90"),
    (dict(d=256, dtype=E4M3), "dense.sm90"),
    (dict(d=256), "dense.large_d_sm90"),  # Q resident: cuDNN's plan at D = 256
    (dict(d=256, causal=True), "dense.large_d_sm90"),
    (dict(d=200, dv=256), "dense.large_d_sm90"),
    (dict(d=256, window=(100, -1)), "dense.sm90"),  # a window keeps the large-D kernel out
    (dict(d=256, window=(100, 20)), "dense.triton"),  # a right bound at D = 256: the Triton kernel measured faster
    (dict(d=256, softcap=20.0, causal=True), "dense.triton"),
    (dict(d=320), "dense.large_d_sm90"),
    (dict(d=448), "dense.large_d"),  # between Q resident (<= 384) and the streamed config (Dv >= 512)
    (dict(d=512, causal=True), "dense.large_d_sm90"),
    (dict(d=128, dv=512), "dense.large_d_sm90"),
    (dict(d=1024, window=(64, 0)), "dense.large_d"),
    (dict(d=512, dtype=BF16, varlen=True), "dense.large_d"),
]


@pytest.mark.parametrize("kw,expected", ROUTES, ids=lambda x: "-".join(f"{k}{v}" for k, v in x.items())
                         if isinstance(x, dict) else x)
def test_dense_routes_on_h100(kw, expected, h100):
    assert dense.select(_dense(**kw))[0].name == expected


@pytest.mark.parametrize("kw", [dict(d=128), dict(d=256), dict(d=512, causal=True)], ids=["D128", "D256", "D512"])
def test_triton_only_and_small_budgets(kw, h100, monkeypatch):
    """TILEATTN_BACKEND=triton, the former TILEATTN_SM90=0 (with a warning) and an emulated sm89 budget keep
    every problem on the Triton kernels."""
    triton_backend = "dense.large_d" if kw["d"] > 256 else "dense.triton"
    monkeypatch.setenv("TILEATTN_BACKEND", "triton")
    chosen, skipped = dense.select(_dense(**kw))
    assert chosen.name == triton_backend
    assert all("TILEATTN_BACKEND" in why for name, why in skipped if "sm90" in name)
    monkeypatch.delenv("TILEATTN_BACKEND")
    monkeypatch.setenv("TILEATTN_SM90", "0")
    knobs._warned.discard("TILEATTN_SM90")
    with pytest.warns(FutureWarning, match="TILEATTN_BACKEND=triton"):
        assert dense.select(_dense(**kw))[0].name == triton_backend
    monkeypatch.delenv("TILEATTN_SM90")
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(89, 128, 99 * 1024))
    assert dense.select(_dense(**kw))[0].name == triton_backend


def test_forcing(h100, monkeypatch):
    p = _dense(128, causal=True)
    with tileattn.force_backend("dense.triton"):
        assert dense.select(p)[0].name == "dense.triton"
        assert backend.forced_key() is not None
    assert backend.forced_key() is None
    with tileattn.force_backend(config=AttnConfig(64, 64, 4, 2)):  # the config's class names its backend
        assert dense.select(p)[0].name == "dense.triton"
        assert backend.forced_config(AttnConfig) == AttnConfig(64, 64, 4, 2)
        assert backend.forced_config(LargeDConfig) is None
    with tileattn.force_backend("dense.sm90"):  # forced: prefers() is not asked (causal D = 256 runs there)
        assert dense.select(_dense(256, window=(100, 20)))[0].name == "dense.sm90"
    with pytest.raises(ValueError, match="does not serve this problem: head dims D=96"):
        with tileattn.force_backend("dense.sm90"):
            dense.select(_dense(96))
    with pytest.raises(ValueError, match="not a backend of dense"):
        with tileattn.force_backend("dense.cudnn"):
            dense.select(p)
    with pytest.raises(ValueError, match="is for backend dense.triton"):
        with tileattn.force_backend("dense.sm90", config=AttnConfig(64, 64, 4, 2)):
            pass
    with pytest.raises(TypeError, match="force_backend\\(config\\): expected a config"):  # was silently ignored
        with tileattn.force_backend(config=object()):
            pass
    with pytest.raises(TypeError, match="force_backend\\(name\\): expected a str"):  # was an AttributeError
        with tileattn.force_backend(123):
            pass
    with pytest.raises(ValueError, match="TILEATTN_BACKEND: expected"):
        monkeypatch.setenv("TILEATTN_BACKEND", "sm90")
        dense.select(p)
    monkeypatch.setenv("TILEATTN_BACKEND", "dense.large_d,mla.triton")
    assert dense.select(_dense(512))[0].name == "dense.large_d"
    with tileattn.force_backend("dense.sm90"):  # the context manager wins over the environment
        assert dense.select(p)[0].name == "dense.sm90"


def test_forced_configs_reach_their_readers(h100):
    """A forced config reaches its readers, on other threads too: autograd runs the backward of CUDA tensors
    on a thread of its own."""
    assert bwd_config(128) == BwdConfig((64, 64, 4, 2), (64, 64, 4, 2))
    forced = BwdConfig((32, 32, 4, 1), (16, 16, 4, 1))
    seen = []
    with tileattn.force_backend(config=forced):
        assert bwd_config(64) == forced and backend.forced_config(Sm90Config) is None
        worker = threading.Thread(target=lambda: seen.append(bwd_config(64)))
        worker.start()
        worker.join()
    assert seen == [forced] and bwd_config(64) == BwdConfig((64, 64, 4, 3), (64, 64, 4, 3))


def test_flex_and_mla_routes(h100):
    def fp(d, q_block=128, seqlen=8192, dtype=BF16):
        return FlexProblem(2, 8, 8, seqlen, seqlen, d, d, dtype, BF16, CUDA, 0.1, q_block=q_block,
                           has_block_mask=True, tma=True)
    assert flex.select(fp(128))[0].name == "flex.sm90"
    assert flex.select(fp(64, dtype=E4M3))[0].name == "flex.sm90"
    assert flex.select(fp(256))[0].name == "flex.triton"
    assert flex.select(fp(128, q_block=64))[0].name == "flex.triton"
    assert flex.select(fp(128, seqlen=1000))[0].name == "flex.sm90"  # the last blocks partly padding
    assert flex.select(fp(128, seqlen=1, dtype=E4M3))[0].name == "flex.triton"  # fp8, a single key

    def mp(hq, cache=BF16, page=64):
        return types.SimpleNamespace(device=CUDA, rows=hq, dc=512, dr=64, page_size=page, cache_dtype=cache,
                                     first_chunk=None)
    assert mla.select(mp(64))[0].name == "mla.sm90"
    assert mla.select(mp(16))[0].name == "mla.sm90"  # configs.MIN_ROWS: measured faster from 16 rows up
    assert mla.select(mp(8))[0].name == "mla.triton"  # fewer: the Gluon kernel's 64-row tile is mostly padding
    assert mla.select(mp(64, cache=E4M3))[0].name == "mla.sm90"  # fp8 caches: the consumers widen the steps
    assert mla.select(mp(64, cache=E4M3, page=16))[0].name == "mla.triton"
    assert mla.select(mp(64, page=16))[0].name == "mla.triton"  # pages must hold whole 32-token steps
    with tileattn.force_backend("mla.sm90"):  # forced: the row preference is not asked
        assert mla.select(mp(8))[0].name == "mla.sm90"
    with tileattn.force_backend(config=MLAConfig(32, 4, 2, 1)):
        assert mla.select(mp(64))[0].name == "mla.triton"


def test_no_gluon_without_hopper(monkeypatch):
    """Off an H100 (here: the interpreter or a CPU device) the Gluon backends say why they are skipped."""
    p = AttnProblem(1, 128, 128, 2, 2, 128, 128, F16, F16, torch.device("cpu"), AttnOptions(scale=0.1))
    rows, chosen = dense.explain(p)
    assert chosen == "dense.triton"
    assert [name for name, ok, _ in rows if ok] == ["dense.triton"]
    assert all(why for name, ok, why in rows if not ok)


def test_info_command():
    res = subprocess.run([sys.executable, "-m", "tileattn", "info", "--all"], capture_output=True, text=True,
                         timeout=300, env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "dense B=4 H=32 N=4096 D=128 float16: dense." in res.stdout and "mla Hq=16" in res.stdout


def test_mla_config_argument_still_works_and_warns(device):
    """MLADecodePlan(config=...), the former way to force a config, warns once and keeps working."""
    from tileattn.ops.mla import plan as plan_mod
    plan_mod._warned.discard("config")
    seqlens = torch.tensor([5, 70], dtype=torch.int32, device=device)
    with pytest.warns(FutureWarning, match="force_backend"):
        plan = tileattn.MLADecodePlan(seqlens, num_heads=2, head_dim_ckv=32, head_dim_kpe=16, page_size=16,
                                      dtype=torch.float16, config=MLAConfig(16, 4, 1, 1))
    assert plan.portable == MLAConfig(16, 4, 1, 1) and plan.sm90 is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tileattn.MLADecodePlan(seqlens, num_heads=2, head_dim_ckv=32, head_dim_kpe=16, page_size=16,
                               dtype=torch.float16)


@pytest.mark.parametrize("mode, n, taken", [("", 4096, True), ("", 1024, True), ("", 512, False), ("1", 512, True),
                                            ("0", 4096, False)], ids=["auto-4K", "auto-1K", "auto-512", "on-512",
                                                                      "off-4K"])
def test_backward_route(mode, n, taken, h100, monkeypatch):
    """The dense backward takes the Hopper kernel by default where it measured faster (both sequences >= 1K),
    everywhere it serves with TILEATTN_SM90_BWD=1, nowhere with =0."""
    from tileattn.ops.dense import launch_bwd_sm90
    monkeypatch.setenv("TILEATTN_SM90_BWD", mode)
    p = dataclasses.replace(_dense(128, causal=True), seqlen_q=n, seqlen_k=n)
    t = torch.empty(1, 8, 8, 128, dtype=torch.float16)
    lse = torch.empty(1, 8, n)
    why = launch_bwd_sm90.reason(p, t, t, t, t, lse)
    assert (why == "") == taken, why
    if not taken:
        assert ("TILEATTN_SM90_BWD=0" if mode == "0" else "shorter than 1024") in why
    if taken:  # delta takes lse's strides in the kernel's allocation: a transposed lse goes to the Triton kernels
        assert "non-contiguous lse" in launch_bwd_sm90.reason(p, t, t, t, t, lse.transpose(1, 2))


def _cluster(n=8192, sk=None, causal=True, bottom_right=True, return_lse=False, **kw):
    """A D = 128 fp16 problem of B=4, Hq=32, Hkv=8 (kw: AttnProblem fields and AttnOptions window / softcap)."""
    opts = AttnOptions(scale=kw.pop("scale", 0.088), window=kw.pop("window", (-1, 0 if causal else -1)),
                       softcap=kw.pop("softcap", 0.0), bottom_right=bottom_right, return_lse=return_lse)
    fields = dict(batch=4, seqlen_q=n, seqlen_k=sk or n, heads_q=32, heads_kv=8, head_dim=128, head_dim_v=128,
                  dtype=F16, device=CUDA, opts=opts, tma=(True,) * 4)
    fields.update(kw)
    fields["out_dtype"] = BF16 if fields["dtype"].itemsize == 1 else fields["dtype"]
    return AttnProblem(**fields)


CLUSTER_ROUTES = [  # (problem kwargs, backend on an H100 under triton 3.9): configs.CLUSTER_FROM, causal from 8K
    (dict(), "dense.sm90_cluster"),
    (dict(n=16384, dtype=BF16), "dense.sm90_cluster"),
    (dict(heads_kv=32), "dense.sm90_cluster"),
    (dict(n=4096), "dense.sm90"),  # below the threshold: the 1-CTA kernel measured faster
    (dict(n=16384, causal=False), "dense.sm90"),  # non-causal: never measured faster
    # the lse, asked for or kept for a gradient (api.py asks for it whenever one is tracked): the same rule
    (dict(return_lse=True), "dense.sm90_cluster"),
    (dict(n=16384, return_lse=True, dtype=BF16), "dense.sm90_cluster"),
    (dict(n=4096, return_lse=True), "dense.sm90"),
    (dict(n=16384, causal=False, return_lse=True), "dense.sm90"),
    (dict(sk=16384, return_lse=True), "dense.sm90"),
    (dict(sk=16384, bottom_right=False, return_lse=True), "dense.sm90_cluster"),
    (dict(window=(1024, 0)), "dense.sm90"),
    (dict(softcap=30.0), "dense.sm90"),
    (dict(head_dim=64, head_dim_v=64), "dense.sm90"),
    (dict(dtype=E4M3), "dense.sm90"),
    (dict(sk=16384), "dense.sm90"),  # causal bottom-right with Sq != Sk: the kernel's mask is top-left
    (dict(sk=16384, bottom_right=False), "dense.sm90_cluster"),  # top-left asked (scaled_dot_product_attention)
    (dict(tma=(True, True, False, True)), "dense.triton"),
    (dict(varlen=True), "dense.triton"),
]


@pytest.mark.parametrize("kw,expected", CLUSTER_ROUTES, ids=lambda x: "-".join(f"{k}{v}" for k, v in x.items())
                         if isinstance(x, dict) else x)
def test_cluster_route(kw, expected, h100, monkeypatch):
    import triton
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    assert dense.select(_cluster(**kw))[0].name == expected


def test_cluster_needs_triton_39_and_its_budget(h100, monkeypatch):
    """Under triton 3.6 (the Gluon kernels' other version), TILEATTN_BACKEND=triton or a smaller shared-memory budget
    the cluster kernel is skipped with its reason; forced there, or on a problem it cannot serve, it raises."""
    import triton
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    chosen, skipped = dense.select(_cluster())
    assert chosen.name == "dense.sm90" and "triton 3.6.0" in dict(skipped)["dense.sm90_cluster"]
    with pytest.raises(ValueError, match="dense.sm90_cluster, which does not serve this problem: triton 3.6.0"):
        with tileattn.force_backend("dense.sm90_cluster"):
            dense.select(_cluster())
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    monkeypatch.setenv("TILEATTN_BACKEND", "triton")
    assert dense.select(_cluster())[0].name == "dense.triton"
    monkeypatch.delenv("TILEATTN_BACKEND")
    with tileattn.force_backend("dense.sm90_cluster"):  # forced: the preference is not asked (non-causal 1K)
        assert dense.select(_cluster(n=1024, causal=False))[0].name == "dense.sm90_cluster"
        assert dense.select(_cluster(n=1024, causal=False, return_lse=True))[0].name == "dense.sm90_cluster"
        with pytest.raises(ValueError, match="the kernel's causal mask is top-left"):
            dense.select(_cluster(sk=16384))
    monkeypatch.setattr(hw, "device_info", lambda device: hw.DeviceInfo(90, 132, 200 * 1024))
    assert "bytes of shared memory" in dict(dense.select(_cluster())[1])["dense.sm90_cluster"]


@pytest.mark.parametrize("kw,why", [
    (dict(window=(-1, 64)), "a window"),  # a right bound the kernel would drop: full attention instead
    (dict(window=(64, -1)), "a window"),
    (dict(scale=-0.088), "a negative scale"),
    (dict(softcap=30.0), "a softcap"),
    (dict(varlen=True), "packed"),
    (dict(tma=(True, True, True, False)), "not aligned"),
], ids=["right", "left", "scale", "softcap", "varlen", "tma"])
def test_cluster_forced_refuses(kw, why, h100, monkeypatch):
    """Forced, the cluster kernel refuses (ValueError with the reason) every problem its mask and scale cannot
    express, rather than compute another attention."""
    import triton
    monkeypatch.setattr(triton, "__version__", "3.9.0")
    with tileattn.force_backend("dense.sm90_cluster"), pytest.raises(ValueError, match=why):
        dense.select(_cluster(**kw))
