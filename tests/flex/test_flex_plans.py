"""Launch plans of eager flex calls (ops/flex/plans.py) and their replayed launches (tileattn.launcher).

On the CPU the kernels run through the interpreter, so these tests check the plan cache: a repeated call gives
bit for bit what an unplanned call gives, a call that differs in anything the kernel, the traced mods or the
checks depend on gets its own plan, new tensors (and new values in a captured tensor) are read, and bad
inputs still raise once a plan exists. The replay of the Hopper kernel's C launch is checked without a GPU too
(a stand-in driver records what reaches the C launcher; `python -m tests.flex.test_flex_plans`), and on the
GPU against Triton's normal launch.
"""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import triton

import tileattn
from tileattn import launcher_raw
from tileattn.ops.flex import plans

from tests.helpers import randn, same_tensors

flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")
warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_plans():
    plans.clear_plans()
    yield
    plans.clear_plans()


def _qkv(device, B=1, H=2, Hkv=None, Sq=80, Sk=96, D=32, dtype=torch.float16, grad=False):
    t = (randn(B, H, Sq, D, dtype=dtype, device=device), randn(B, Hkv or H, Sk, D, dtype=dtype, device=device),
         randn(B, Hkv or H, Sk, D, dtype=dtype, device=device))
    return tuple(x.requires_grad_() for x in t) if grad else t


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _block_mask(device, Sq=80, Sk=96, mask=_causal, H=None, block=(32, 32)):
    return flex_mod.create_block_mask(mask, None, H, Sq, Sk, device=device, BLOCK_SIZE=block)


def _uncached(*args, **kw):
    with plans.uncached():
        return tileattn.flex_attention(*args, **kw)


def test_repeated_calls_match_uncached(device):
    slopes = torch.rand(2, device=device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    bm = _block_mask(device)
    cases = [dict(), dict(block_mask=bm), dict(block_mask=bm, score_mod=alibi, return_lse=True),
             dict(score_mod=alibi, scale=0.3)]
    for kw in cases:
        for _trial in range(3):  # first call: planned (normal launch); then replayed, on new tensors
            q, k, v = _qkv(device)
            got = tileattn.flex_attention(q, k, v, **kw)
            assert same_tensors(got, _uncached(q, k, v, **kw))
    assert plans.count_plans() == len(cases)


def test_changes_get_their_own_plan(device):
    q, k, v = _qkv(device)
    bm = _block_mask(device)
    slope = [0.5]

    def bias(score, b, h, q_idx, kv_idx):
        return score + slope[0] * (kv_idx - q_idx)
    calls = [dict(block_mask=bm), dict(block_mask=bm, return_lse=True), dict(block_mask=bm, scale=0.25),
             dict(block_mask=_block_mask(device, mask=lambda b, h, qi, ki: qi >= ki - 8)),  # another mask_mod
             dict(block_mask=bm, score_mod=bias)]
    for kw in calls:
        tileattn.flex_attention(q, k, v, **kw)
    assert plans.count_plans() == len(calls)
    out = tileattn.flex_attention(q, k, v, block_mask=bm, score_mod=bias)
    assert plans.count_plans() == len(calls)
    slope[0] = -0.25  # a number in the closure: traced again, its own plan
    out2 = tileattn.flex_attention(q, k, v, block_mask=bm, score_mod=bias)
    assert plans.count_plans() == len(calls) + 1 and not torch.equal(out, out2)
    assert same_tensors(out2, _uncached(q, k, v, block_mask=bm, score_mod=bias))
    q2 = randn(1, 2, 80, 32, dtype=torch.float16, device=device).transpose(1, 2).contiguous().transpose(1, 2)
    assert same_tensors(tileattn.flex_attention(q2, k, v, block_mask=bm), _uncached(q2, k, v, block_mask=bm))  # strides
    hq = randn(1, 4, 80, 32, dtype=torch.float16, device=device)  # GQA
    assert same_tensors(tileattn.flex_attention(hq, k, v, enable_gqa=True), _uncached(hq, k, v, enable_gqa=True))
    assert plans.count_plans() == len(calls) + 3


def test_captured_tensor_values_are_read(device):
    bias = torch.zeros(96, device=device)

    def key_bias(score, b, h, q_idx, kv_idx):
        return score + bias[kv_idx]
    q, k, v = _qkv(device)
    first = tileattn.flex_attention(q, k, v, score_mod=key_bias)
    bias[40:] = -1e4  # in place: the same plan, the new values
    second = tileattn.flex_attention(q, k, v, score_mod=key_bias)
    assert plans.count_plans() == 1 and not torch.equal(first, second)
    assert same_tensors(second, _uncached(q, k, v, score_mod=key_bias))


@pytest.mark.parametrize("case", ["scale", "dtype", "heads", "not a block mask", "lengths", "device"])
def test_bad_inputs_raise_after_caching(case, device):
    q, k, v = _qkv(device)
    bm = _block_mask(device)
    tileattn.flex_attention(q, k, v, block_mask=bm)
    tileattn.flex_attention(q, k, v, block_mask=bm, scale=0.5)
    if case == "scale":
        with pytest.raises(ValueError, match="scale"):
            tileattn.flex_attention(q, k, v, block_mask=bm, scale=-0.5)
    elif case == "dtype":
        with pytest.raises(TypeError, match="key / value"):
            tileattn.flex_attention(q, k.float().half().bfloat16(), v, block_mask=bm)
    elif case == "heads":
        with pytest.raises(ValueError, match="enable_gqa"):
            tileattn.flex_attention(randn(1, 4, 80, 32, dtype=torch.float16, device=device), k, v, block_mask=bm)
    elif case == "not a block mask":
        with pytest.raises(TypeError, match="block_mask"):
            tileattn.flex_attention(q, k, v, block_mask=object())
    elif case == "lengths":
        with pytest.raises(ValueError, match="block_mask"):
            tileattn.flex_attention(q, k, v, block_mask=_block_mask(device, Sq=64))
    elif case == "device":
        if device != "cpu":
            pytest.skip("checks the interpreter's per-call device check")
        os.environ.pop("TRITON_INTERPRET")
        try:
            with pytest.raises(Exception, match="TRITON_INTERPRET|GPU|device"):
                tileattn.flex_attention(q, k, v, block_mask=bm)
        finally:
            os.environ["TRITON_INTERPRET"] = "1"


def test_fp8_calls_are_planned(device):
    """fp8: descale numbers and out_dtype key the plan (numbers fold into the kernel's scale), descale tensors
    vary; the interpreter runs the portable kernel on dequantized inputs (no kept launch)."""
    q, k, v = (x.to(torch.float8_e4m3fn) for x in _qkv(device, D=64))
    per_head = torch.rand(1, 2, device=device) + 0.5
    calls = [dict(), dict(q_descale=0.5), dict(q_descale=0.25), dict(k_descale=per_head),
             dict(v_descale=per_head, out_dtype=torch.bfloat16)]
    if device == "cpu":  # bf16 dots are wrong in the interpreter
        calls[-1] = dict(v_descale=0.5)
    for kw in calls:
        kw.setdefault("out_dtype", torch.float16)
    for kw in calls:
        for _trial in range(2):
            assert same_tensors(tileattn.flex_attention(q, k, v, **kw), _uncached(q, k, v, **kw))
    assert plans.count_plans() == len(calls)
    other = per_head * 2  # a new descale tensor of the same layout: the same plan, its values read
    kw = dict(k_descale=other, out_dtype=torch.float16)
    assert same_tensors(tileattn.flex_attention(q, k, v, **kw), _uncached(q, k, v, **kw))
    assert plans.count_plans() == len(calls)
    with pytest.raises(ValueError, match="q_descale"):
        tileattn.flex_attention(q, k, v, q_descale=-1.0, out_dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="no backward"):
        tileattn.flex_attention(q, k, v.float().to(torch.float8_e4m3fn).requires_grad_(), out_dtype=torch.float16)


def test_flex_forward_config_without_pingpong():
    """The flex Hopper forward runs the dense table's config with ping-pong off (fp8 at D=64 has it on for dense:
    flex measured slower), unless a config is forced, which is run as given."""
    import dataclasses

    from tileattn.ops.common.configs import sm90_config
    from tileattn.ops.flex.launch_sm90 import _table_config
    e4m3 = torch.float8_e4m3fn
    assert sm90_config(64, e4m3).pingpong and not _table_config(64, e4m3).pingpong
    assert _table_config(64, e4m3) == dataclasses.replace(sm90_config(64, e4m3), pingpong=False)
    assert _table_config(128, torch.bfloat16) == sm90_config(128, torch.bfloat16)
    forced = dataclasses.replace(sm90_config(64, e4m3), pingpong=True)
    with tileattn.force_backend("flex.sm90", config=forced):
        assert _table_config(64, e4m3) is forced


def test_gradients_through_a_plan(device):
    bm = _block_mask(device)
    grads = []
    for _trial in range(2):
        torch.manual_seed(3)
        q, k, v = _qkv(device, grad=True)
        out, lse = tileattn.flex_attention(q, k, v, block_mask=bm, return_lse=True)
        grads.append(torch.autograd.grad((out.float().sum() + lse.sum()), (q, k, v)))
    assert plans.count_plans() == 1
    assert same_tensors(grads[0], grads[1])
    with torch.no_grad():  # no gradient tracked: another plan (no transposed lists)
        tileattn.flex_attention(q, k, v, block_mask=bm)
    assert plans.count_plans() == 2


_REPLAY_VERSION = pytest.mark.skipif(launcher_raw.VERSION is None,
                                     reason=f"direct replay targets triton 3.6 and 3.9 (this is {triton.__version__})")


@_REPLAY_VERSION
def test_sm90_replay_matches_normal_path():
    """The Hopper flex kernel (compiled for sm90 on the CPU, stand-in driver): a replayed launch passes the C
    launcher what Triton's normal path passes (descriptors, lists, captures in tuples), for new tensors too."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "src"), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "tests.flex.test_flex_plans"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0 and "PTXASError" in r.stderr and "ok  " not in r.stdout:
        pytest.skip("ptxas (shipped with Triton) cannot run here")
    assert r.returncode == 0 and "CHECK OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def _sm90_replay_checks():
    from scripts.host_overhead import _cpu_setup, normalized, replayed
    launches = _cpu_setup(record=True)
    from tileattn import hw
    from tileattn.ops.common import launch_sm90
    hw.check_interpreter_dtype = lambda *a, **k: None  # bf16 compiles for sm90; nothing runs
    hw.is_hopper = lambda device: True
    launch_sm90.gluon_sm90_reason = lambda device: ""

    B, H, S, D = 1, 2, 200, 128  # a ragged length: the tail mode
    slopes = torch.rand(H)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    bm = flex_mod.create_block_mask(_causal, B, H, S, S, device="cpu")

    def norm(call, out):  # the fresh output of each call by name (in the stand-in's tensor maps too)
        return normalized(call, {out.data_ptr(): "out"})

    def bf16():
        return tuple(torch.randn(B, H, S, D).to(torch.bfloat16) for _ in range(3))

    def fp8():
        q, k, v = (torch.randn(B, H, S, D).to(torch.float8_e4m3fn) for _ in range(3))
        return q, k, tileattn.fp8_v_layout(v.transpose(1, 2))
    per_head = torch.rand(B, H) + 0.5
    for name, make, kw in (("causal", bf16, dict(block_mask=bm)), ("alibi", bf16, dict(block_mask=bm, score_mod=alibi)),
                           ("no mask", bf16, {}),
                           ("fp8", fp8, dict(block_mask=bm, q_descale=per_head, k_descale=0.5, v_descale=per_head))):
        plans.clear_plans()
        inputs = [make() for _ in range(2)]  # (fp8_v_layout launches its packing kernel)
        launches.clear()
        outs = [tileattn.flex_attention(*inputs[i], **kw) for i in (0, 0, 1)]
        assert not replayed(launches[0]) and replayed(launches[1]) and replayed(launches[2]), \
            "replayed launches expected"
        planned = [norm(a, o) for a, o in zip(launches, outs)]
        launches.clear()
        with plans.uncached():
            outs = [tileattn.flex_attention(*inputs[i], **kw) for i in (0, 1)]
        normal = [norm(a, o) for a, o in zip(launches, outs)]
        assert planned[0] == planned[1] == normal[0], f"{name}: replay differs from the normal path"
        assert planned[2] == normal[1], f"{name}: replay with new tensors differs from the normal path"
        print(f"ok  {name}: {len(launches[0].args)} kernel arguments")
    print("CHECK OK")


if __name__ == "__main__":
    _sm90_replay_checks()


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1000, 2048])
def test_gpu_sm90_plans_match_normal_launch(S, device, sm90_fwd):
    """Planned (replayed) launches of the Hopper flex kernel give what its normal launch gives, forward and
    backward, with a score mod's capture and GQA."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the Gluon kernel serves sm90 only")
    slopes = torch.rand(4, device=device)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    bm = flex_mod.create_block_mask(_causal, None, None, S, S, device=device)
    for kw in (dict(block_mask=bm), dict(block_mask=bm, score_mod=alibi, return_lse=True), dict()):
        for _trial in range(3):
            q = randn(2, 4, S, 128, dtype=torch.bfloat16, device=device)
            k, v = (randn(2, 2, S, 128, dtype=torch.bfloat16, device=device) for _ in range(2))
            got = tileattn.flex_attention(q, k, v, enable_gqa=True, **kw)
            assert same_tensors(got, _uncached(q, k, v, enable_gqa=True, **kw))
    assert plans.count_plans() == 3 and sm90_fwd
    grads = []
    for _trial in range(2):
        torch.manual_seed(5)
        q, k, v = _qkv(device, B=2, H=4, Hkv=2, Sq=S, Sk=S, D=128, dtype=torch.bfloat16, grad=True)
        out = tileattn.flex_attention(q, k, v, block_mask=bm, score_mod=alibi, enable_gqa=True)
        grads.append(torch.autograd.grad(out.float().square().sum(), (q, k, v)))
    assert same_tensors(grads[0], grads[1])
