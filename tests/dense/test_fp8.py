"""fp8 attention forward (q, k, v in float8_e4m3fn / float8_e5m2 with descales) against the float32 reference
of the dequantized inputs.

Tolerance (the rule of engineering.md, with FlashAttention-3's fp8 reference): `ref` is the float32 reference
on the dequantized inputs; `ref_lp` is the same computation with the probabilities P rounded to V's fp8 dtype
as the kernels round them (attention_ref(dtype=<fp8 dtype>)): out must be within 2 * max|ref_lp - ref| plus the
rounding floor of the output dtype. The log-sum-exp has no fp8 rounding in it (scores are exact fp8 products
summed in float32, up to the tensor cores' fp8 accumulation); it is held to the error of the same scores
computed in bfloat16 (the output dtype).
"""
import dataclasses

import pytest
import torch

import tileattn
from tileattn.ops.common.configs import sm90_config
from tileattn.ops.common.fp8 import fp8_v_layout, quantize_fp8
from tileattn.ops.common.fp8_kernels import packed_key_pos
from tileattn.ops.common.tma import gluon_sm90_reason
from tileattn.ops.dense import dispatch, plans
from tileattn.ops.dense.reference import attention_ref, varlen_attention_ref

from tests.helpers import assert_close, randn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _quant(x, dtype, kind, group=1):
    """(x_fp8, the descale argument of that kind, the dequantized float32 x); group: heads per descale."""
    x8, d = quantize_fp8(x, dtype, group)
    deq = x8.float() * d.repeat_interleave(group, dim=1)[:, None, :, None]
    if kind == "tensor":
        return x8, d, deq
    x8 = (x.float() / 2.5).to(dtype)  # one scale for the whole tensor
    deq = x8.float() * 2.5
    if kind == "number":
        return x8, 2.5, deq
    if kind == "scalar":
        return x8, torch.tensor(2.5, device=x.device), deq
    if kind in ("one", "one1x1"):  # one element of shape [1] / [1, 1]: the value of every (batch, kv head)
        return x8, torch.full((1,) if kind == "one" else (1, 1), 2.5, device=x.device), deq
    x8 = x.float().to(dtype)  # "none": descale 1
    return x8, None, x8.float()


def _check(q, k, v, dtype, kind, v_layout, out_dtype=None, **kw):
    q8, qd, qf = _quant(q, dtype, kind, q.shape[2] // k.shape[2])  # q's descale is per kv head
    k8, kd, kf = _quant(k, dtype, kind)
    v8, vd, vf = _quant(v, dtype, kind)
    if v_layout == "packed":
        v8 = fp8_v_layout(v8)
    elif v_layout == "seq":  # sequence-major, not packed
        v8 = v8.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    out, lse = tileattn.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=out_dtype,
                                  return_lse=True, **kw)
    ref, lse_ref = attention_ref(qf, kf, vf, **kw)
    ref_lp, _ = attention_ref(qf, kf, vf, dtype=dtype, **kw)
    _, lse_lp = attention_ref(qf, kf, vf, dtype=torch.bfloat16, **kw)
    assert out.dtype == (out_dtype or torch.bfloat16) and out.shape == ref.shape
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)  # lse -inf exactly where the reference's is
    empty = torch.isinf(lse_ref)  # [B, Hq, Sq]: rows that see no key get out = 0 exactly
    assert (out.transpose(1, 2)[empty] == 0).all(), "a row that sees no key is not 0"


# (B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, dtype, descale kind, V layout)
CPU_CASES = [
    (1, 70, 70, 2, 2, 64, True, (-1, -1), 0.0, E4M3, "tensor", "row"),
    (1, 70, 70, 2, 2, 64, True, (-1, -1), 0.0, E4M3, "tensor", "packed"),
    (2, 33, 57, 4, 2, 64, False, (-1, -1), 0.0, E5M2, "scalar", "row"),  # GQA 2, Sq < Sk
    (1, 127, 40, 4, 1, 32, True, (-1, -1), 0.0, E4M3, "number", "packed"),  # MQA, first rows see nothing
    (1, 50, 50, 2, 2, 64, True, (-1, -1), 20.0, E4M3, "tensor", "row"),  # softcap
    (1, 90, 90, 2, 2, 64, False, (16, 8), 0.0, E5M2, "tensor", "packed"),  # window
    (1, 17, 17, 2, 2, 96, False, (-1, -1), 0.0, E4M3, "none", "seq"),  # padded head dim, no descale
    # a single key (on the H100, the Hopper kernel compiled with Sk a run-time value: gluon_sm90.py)
    (2, 64, 1, 4, 2, 64, False, (-1, -1), 0.0, E4M3, "tensor", "packed"),
    (2, 64, 1, 4, 2, 64, True, (-1, -1), 0.0, E4M3, "tensor", "row"),  # all rows but the last see nothing
    (2, 33, 1, 4, 2, 64, False, (-1, -1), 0.0, E5M2, "one", "row"),
    # rows that see no key: out = 0, lse = -inf (the window leaves the first 70 rows nothing)
    (1, 100, 30, 2, 2, 64, False, (5, 0), 0.0, E4M3, "tensor", "packed"),
    (1, 100, 30, 4, 2, 64, False, (3, 0), 20.0, E5M2, "number", "row"),
    # one-element descale tensors of any shape: the value of every (batch, kv head)
    (2, 40, 72, 4, 2, 64, True, (-1, -1), 0.0, E4M3, "one1x1", "packed"),
]


def _id(c):
    B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, dt, kind, lay = c
    s = f"B{B}-Sq{Sq}-Sk{Sk}-H{Hq}-Hkv{Hkv}-D{D}-{'e4m3' if dt == E4M3 else 'e5m2'}-{kind}-v{lay}"
    s += "-causal" if causal else ""
    s += f"-win{window[0]}_{window[1]}" if window != (-1, -1) else ""
    return s + (f"-cap{softcap:g}" if softcap else "")


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_fp8(case, device):
    B, Sq, Sk, Hq, Hkv, D, causal, window, softcap, dt, kind, lay = case
    q, k, v = (randn(B, s, h, D, dtype=torch.float32, device=device) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
    _check(q, k, v, dt, kind, lay, causal=causal, window=window, softcap=softcap)


def test_fp8_out_dtype_fp16(device):
    q, k, v = (randn(1, 40, 2, 64, dtype=torch.float32, device=device) for _ in range(3))
    _check(q, k, v, E4M3, "tensor", "row", out_dtype=torch.float16, causal=True)


@pytest.mark.parametrize("k_kind", ["number", "one1x1"])
def test_fp8_varlen(device, k_kind):
    """Packed sequences (an empty one among them), per-sequence descales [B, Hkv] and one-element ones ([1],
    [1, 1]: the value of every sequence)."""
    lens_q, lens_k = [5, 0, 40], [9, 3, 40]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device=device)
    q = randn(sum(lens_q), 4, 64, dtype=torch.float32, device=device)
    k, v = (randn(sum(lens_k), 2, 64, dtype=torch.float32, device=device) for _ in range(2))
    q8, k8, v8 = ((t / 2.0).to(E4M3) for t in (q, k, v))
    qd = torch.full((3, 2), 2.0, device=device)  # [B, Hkv]
    kd = 2.0 if k_kind == "number" else torch.full((1, 1), 2.0, device=device)
    out = tileattn.varlen_attention(q8, k8, v8, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                    q_descale=qd, k_descale=kd, v_descale=torch.tensor([2.0], device=device))
    qf, kf, vf = (t.float() * 2.0 for t in (q8, k8, v8))
    ref, _ = varlen_attention_ref(qf, kf, vf, cu_q, cu_k, causal=True)
    ref_lp, _ = varlen_attention_ref(qf, kf, vf, cu_q, cu_k, causal=True, dtype=E4M3)
    assert_close("out", out, ref, ref_lp)


def test_quantize_fp8_and_v_layout(device):
    x = randn(2, 37, 3, 64, dtype=torch.float32, device=device)
    for dt in (E4M3, E5M2):
        x8, d = quantize_fp8(x, dt)
        assert x8.dtype == dt and d.shape == (2, 3) and d.dtype == torch.float32
        rel = 2.0 ** -(3 if dt == E4M3 else 2)  # half an ulp of the mantissa, relative
        assert ((x8.float() * d[:, None, :, None] - x).abs() <= rel * x.abs() + d.max() * 2.0 ** -9).all()
        v = fp8_v_layout(x8)
        assert isinstance(v, tileattn.Fp8V) and v.shape == x8.shape and v.dtype == dt
        assert v.data.shape == (2, 3, 64, 64) and v.view().stride(1) == 1
        assert torch.equal(v.unpack().float(), x8.float())
        pos = packed_key_pos(torch.arange(37, 64, device=device))  # the keys past Sk are zeros
        assert (v.data[..., pos].float() == 0).all()
        assert fp8_v_layout(v) is v
        assert not torch.equal(v.view().float(), x8.float())  # keys are reordered within groups of 16
    q8, qd = quantize_fp8(randn(1, 5, 8, 32, dtype=torch.float32, device=device), group=4)
    assert qd.shape == (1, 2)
    for empty in (torch.zeros(2, 0, 4, 64, device=device), torch.zeros(0, 4, 64, device=device)):  # no tokens
        e8, ed = quantize_fp8(empty)  # (amax of nothing raised from torch)
        assert e8.shape == empty.shape and (ed == 1).all() and ed.shape == ((2, 4) if empty.dim() == 4 else ())


def test_fp8_bad_inputs(device):
    q, k, v = (randn(2, 16, 4, 64, dtype=torch.float32, device=device).to(E4M3) for _ in range(3))
    with pytest.raises(ValueError, match=r"q_descale must have shape \[B, Hkv\] = \[2, 4\]"):
        tileattn.attention(q, k, v, q_descale=torch.ones(4, device=device))
    with pytest.raises(TypeError, match="k_descale must be float32"):
        tileattn.attention(q, k, v, k_descale=torch.ones(2, 4, dtype=torch.float16, device=device))
    with pytest.raises(ValueError, match="v_descale must be a finite positive number"):
        tileattn.attention(q, k, v, v_descale=-1.0)
    with pytest.raises(TypeError, match="out_dtype must be torch.float16 or torch.bfloat16"):
        tileattn.attention(q, k, v, out_dtype=torch.float32)
    with pytest.raises(TypeError, match="fp8 attention takes q, k and v in one fp8 dtype"):
        tileattn.attention(q.float().half(), k, v)
    with pytest.raises(TypeError, match="q, k, v must share one dtype"):
        tileattn.attention(q, k, v.float().to(E5M2))
    h = q.float().half()
    with pytest.raises(ValueError, match="q_descale only applies to fp8 inputs"):
        tileattn.attention(h, h, h, q_descale=1.0)
    with pytest.raises(ValueError, match="out_dtype only applies to fp8 inputs"):
        tileattn.attention(h, h, h, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="v must have a contiguous last dimension"):
        tileattn.attention(q, k, v.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1))  # H contiguous
    with pytest.raises(TypeError, match="scaled_dot_product_attention takes float16 or bfloat16"):
        tileattn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


# ---------------------------------------------------------------------------------------------------------
# GPU: the Hopper Gluon kernel (D = 64 / 128 / 256) and the portable one (other head dims, varlen)
# ---------------------------------------------------------------------------------------------------------
GPU_SHAPES = [(2, 127, 127, 4, 4), (1, 1, 300, 8, 2), (1, 1024, 1024, 4, 1), (2, 300, 1000, 4, 2),
              (1, 1000, 300, 2, 2)]


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 96, 256])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "B{}-Sq{}-Sk{}-H{}-Hkv{}".format(*s))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant", ["e4m3-tensor-packed", "e4m3-number-row", "e5m2-tensor-row", "e4m3-none-seq"])
def test_gpu_fp8_matrix(D, shape, causal, variant):
    B, Sq, Sk, Hq, Hkv = shape
    name, kind, lay = variant.split("-")
    q, k, v = (randn(B, s, h, D, dtype=torch.float32, device="cuda") for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
    _check(q, k, v, E4M3 if name == "e4m3" else E5M2, kind, lay, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("opts", [dict(softcap=30.0, causal=True), dict(window=(100, 0)),
                                  dict(window=(64, 64), softcap=10.0)], ids=["softcap", "window", "both"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_fp8_options(D, opts):
    q, k, v = (randn(2, 517, 4, D, dtype=torch.float32, device="cuda") for _ in range(3))
    _check(q, k, v, E4M3, "tensor", "packed", **opts)


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_gpu_fp8_takes_sm90_kernel(D):
    """On an H100 both V layouts run the Gluon kernel (row-major V through the per-call transpose)."""
    if gluon_sm90_reason(torch.device("cuda")):
        pytest.skip("the Gluon kernels need a Hopper GPU and triton 3.6")
    q, k, v = (randn(1, 256, 2, D, dtype=torch.float32, device="cuda").to(E4M3) for _ in range(3))
    causal = sm90_config(D, E4M3).serves_causal
    assert dispatch.select(plans.describe(q, k, v, causal=causal)[0])[0].name == "dense.sm90"
    a = tileattn.attention(q, k, v, causal=causal)
    b = tileattn.attention(q, k, fp8_v_layout(v), causal=causal)
    assert torch.equal(a, b)  # the same kernel on the same values


@pytest.mark.gpu
def test_gpu_fp8_compile():
    """torch.compile traces fp8 calls (descale tensors, out_dtype) through the registered op."""
    q, k, v = (randn(2, 200, 4, 128, dtype=torch.float32, device="cuda") for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (quantize_fp8(t) for t in (q, k, v))

    def f(q8, k8, v8, qd, kd, vd):
        return tileattn.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                                  out_dtype=torch.float16)
    eager = f(q8, k8, v8, qd, kd, vd)
    compiled = torch.compile(f, fullgraph=True)(q8, k8, v8, qd, kd, vd)
    assert compiled.dtype == torch.float16 and torch.equal(compiled, eager)


def test_fp8_descale_one_element_any_shape(device):
    """A one-element descale of any shape ([1, 1] too) is the one value for every (batch, kv head)."""
    q, k, v = (randn(1, 40, 2, 32, dtype=torch.float32, device=device) for _ in range(3))
    q8, k8, v8 = ((t / 2.5).to(E4M3) for t in (q, k, v))
    outs = [tileattn.attention(q8, k8, v8, q_descale=d, k_descale=d, v_descale=d, out_dtype=torch.float16)
            for d in (2.5, torch.full((1, 1), 2.5, device=device), torch.full((1,), 2.5, device=device))]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_fp8_flex_one_element_descales(device):
    """flex_attention reads one-element descales as attention does: [1, 1], [1] and [] tensors are the value of
    every (batch, kv head): the same output bit for bit whichever shape each descale has, and the reference's
    (on a Hopper GPU the Gluon kernel serves it, with P rounded to e4m3: the reference rounds P too)."""
    from tileattn.ops.flex.reference import flex_ref
    q, k, v = (randn(2, 4, 40, 64, dtype=torch.float32, device=device) for _ in range(3))  # [B, H, S, D]
    q8, k8, v8 = ((t / 2.5).to(E4M3) for t in (q, k, v))
    shapes = ((1, 1), (1,), ())
    runs = [tileattn.flex_attention(q8, k8, v8, return_lse=True, out_dtype=torch.float16,
                                    **{n: torch.full(shapes[(i + j) % 3], 2.5, device=device)
                                       for j, n in enumerate(("q_descale", "k_descale", "v_descale"))})
            for i in range(3)]
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])
    out, lse = runs[0]
    qf, kf, vf = (t.float() * 2.5 for t in (q8, k8, v8))  # exact in float16
    ref, lse_ref = flex_ref(qf, kf, vf)
    ref_lp, lse_lp = flex_ref(qf, kf, vf, dtype=torch.float16, quantize_p=E4M3)
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


EDGES = {  # (B, Sq, Sk, Hq, Hkv), options
    "Sk1": ((2, 64, 1, 4, 2), dict()),
    "Sk1-causal": ((2, 64, 1, 4, 2), dict(causal=True)),  # every row but the last sees nothing
    "Sk1-Sq1": ((3, 1, 1, 8, 1), dict()),
    "rows-see-none": ((1, 300, 40, 4, 1), dict(causal=True)),
    "window-rows-see-none": ((2, 300, 40, 4, 2), dict(window=(8, 0))),  # rows < 260: whole tiles see nothing
}


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("edge", list(EDGES))
@pytest.mark.parametrize("variant", ["e4m3-packed", "e4m3-row", "e5m2-row"])
def test_gpu_fp8_edges(D, edge, variant):
    """A single key, and rows that see no key (bottom-right causal or a window with Sq > Sk): out = 0 and
    lse = -inf there, never NaN or unwritten rows, and the reference elsewhere. On an H100 the Hopper kernel
    takes every head dim here (a single key: its variant compiled with Sk a run-time value, gluon_sm90.py; before
    it, 2-38 of 512 rows were NaN in every trial), except D = 256 with a causal mask or window if its config does
    not serve those."""
    (B, Sq, Sk, Hq, Hkv), opts = EDGES[edge]
    name, lay = variant.split("-")
    dt = E4M3 if name == "e4m3" else E5M2
    q, k, v = (randn(B, s, h, D, dtype=torch.float32, device="cuda") for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
    if not gluon_sm90_reason(q.device) and (sm90_config(D, dt).serves_causal or not opts):
        p, _ = plans.describe(q.to(dt), k.to(dt), v.to(dt), **opts)  # (a Hopper GPU, a triton Gluon runs on)
        assert dispatch.select(p)[0].name == "dense.sm90"
    _check(q, k, v, dt, "tensor", lay, **opts)


@pytest.mark.gpu
@pytest.mark.parametrize("field,value", [("exp2_fma", 0), ("exp2_fma", 1), ("exp2_fma", 2), ("pingpong", False),
                                         ("pingpong", True)])
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_fp8_config_fields(D, field, value):
    """fp8 on the Hopper kernel with 0, 1 or 2 of every 4 softmax exp2s on the FMA pipe (Sm90Config.exp2_fma), and
    with the consumers' wgmmas in strict turns or not (pingpong), whatever the table holds: causal, a window whose
    first rows see no key, softcap, and a single key."""
    if gluon_sm90_reason(torch.device("cuda")):
        pytest.skip("the Gluon kernels need a Hopper GPU and triton 3.6")
    cfg = dataclasses.replace(sm90_config(D, E4M3), **{field: value})
    plans.clear_plans()
    with tileattn.force_backend("dense.sm90", config=cfg):
        _check_config_cases(D, 300)
    plans.clear_plans()


def _check_config_cases(D, n):
    """The cases a forced Hopper config must pass: e4m3 causal, softcap and plain at n rows (GQA 4:2), then e5m2
    with rows that see no key and with a single key (EDGES)."""
    q, k, v = (randn(2, n, h, D, dtype=torch.float32, device="cuda") for h in (4, 2, 2))
    for opts in (dict(causal=True), dict(softcap=30.0), dict()):
        _check(q, k, v, E4M3, "tensor", "packed", **opts)
    for edge in ("window-rows-see-none", "Sk1-causal"):
        (B, Sq, Sk, Hq, Hkv), opts = EDGES[edge]
        q, k, v = (randn(B, s, h, D, dtype=torch.float32, device="cuda") for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
        _check(q, k, v, E5M2, "tensor", "row", **opts)


@pytest.mark.gpu
@pytest.mark.parametrize("D,consumers", [(64, 2), (64, 3), (128, 2), (256, 2)])
def test_gpu_fp8_epilogue(D, consumers, monkeypatch):
    """fp8 with Sm90Config.epilogue "deferred" (the O buffer's store waited for before the next tile stages its O;
    D = 256 has one Q slot, which its own O buffers make no obstacle), two and three consumers: one CTA and 7 walking
    every tile, causal, softcap, plain, rows that see no key and a single key; outputs filled with NaN first."""
    if gluon_sm90_reason(torch.device("cuda")):
        pytest.skip("the Gluon kernels need a Hopper GPU and triton 3.6")
    monkeypatch.setenv("TILEATTN_DEBUG_FILL_NAN", "1")
    cfg = dataclasses.replace(sm90_config(D, E4M3), epilogue="deferred")
    if consumers == 3:
        cfg = dataclasses.replace(cfg, consumers=3, consumer_regs=160, pingpong=False)
    plans.clear_plans()
    for programs in (1, 7):
        with tileattn.force_backend("dense.sm90", config=dataclasses.replace(cfg, max_programs=programs)):
            _check_config_cases(D, 400)
    plans.clear_plans()


@pytest.mark.gpu
def test_gpu_fp8_three_consumers():
    """fp8 (e4m3 / e5m2) at D = 64 on three consumer warpgroups (Sm90Config.consumers = 3): causal, softcap, plain,
    rows that see no key and a single key, as test_gpu_fp8_config_fields."""
    if gluon_sm90_reason(torch.device("cuda")):
        pytest.skip("the Gluon kernels need a Hopper GPU and triton 3.6")
    cfg = dataclasses.replace(sm90_config(64, E4M3), consumers=3, consumer_regs=160, pingpong=False)
    plans.clear_plans()
    with tileattn.force_backend("dense.sm90", config=cfg):
        _check_config_cases(64, 400)
    plans.clear_plans()


def test_bench_fp8_check_on_query_row_slices(device):
    """The benches' fp8 check (bench/fp8_check.py) on the last query rows of a causal problem, as the dense suite
    checks N past 16K: the kernel's output passes, the same output moved by a tenth fails."""
    from tileattn.bench import fp8_check
    q, k, v = (randn(2, 96, 4, 64, dtype=torch.float32, device=device).to(torch.float16) for _ in range(3))
    rows = slice(64, 96)
    q8, k8, v8, descales, ref, tol = fp8_check.quantized(q, k, v, "e4m3", True, rows)
    assert ref.shape == (1, 32, 2, 64)
    fn = fp8_check.call(q8, k8, fp8_v_layout(v8), descales, True)
    ok, info = fp8_check.check(fn, ref, tol, rows)
    assert ok, info
    out = fn()
    ok, info = fp8_check.check(lambda: out + 0.1, ref, tol, rows)
    assert not ok and info["err_vs_fp32"] > tol
