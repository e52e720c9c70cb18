"""bfloat16 under the Triton interpreter: its bf16 dots are wrong (errors of ~1e8, silently), so every op whose kernels
take bf16 operands into a dot refuses them there with a ValueError naming the argument, before any launch
(hw.check_interpreter_dtype). What runs no bf16 dot stays allowed: fp8 quantization, an fp8 KV cache (the decode
kernel's dots take float16), fp8 dense attention's bf16 output. On a GPU there is nothing to refuse."""
import pytest
import torch

import tileattn

from tests.conftest import INTERPRET
from tests.helpers import randn

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the refusal is the interpreter's (a GPU computes bf16)")

BF16, F16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn
DEV = "cpu"


def _refused(name):
    return pytest.raises(ValueError, match=rf"^{name} is bfloat16: the Triton interpreter \(TRITON_INTERPRET=1\) "
                                           r"computes bfloat16 dots wrongly; use float16 or run on a GPU")


def _qkv(*shape, dtype=BF16):
    return tuple(randn(*shape, dtype=dtype, device=DEV) for _ in range(3))


def test_helper_is_a_no_op_without_the_interpreter(monkeypatch):
    from tileattn import hw
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    hw.check_interpreter_dtype(BF16, "q")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    hw.check_interpreter_dtype(F16, "q")
    with _refused("q"):
        hw.check_interpreter_dtype(BF16, "q")


# ---- dense -----------------------------------------------------------------------------------------------------
def test_attention():
    from tileattn.ops.dense import plans
    q, k, v = _qkv(1, 16, 2, 32)
    before = plans.count_plans()
    with _refused("q"):
        tileattn.attention(q, k, v, causal=True)
    with _refused("q"):  # a second call (the eager path's cache) refuses too
        tileattn.attention(q, k, v)
    with _refused("q"):
        tileattn.attention(q, k, v, return_lse=True)
    assert plans.count_plans() == before  # nothing planned, nothing launched


def test_attention_with_gradient():
    q, k, v = (t.requires_grad_() for t in _qkv(1, 16, 2, 32))
    with _refused("q"):
        tileattn.attention(q, k, v)


def test_varlen_attention():
    q, k, v = _qkv(20, 2, 32)
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    with _refused("q"):
        tileattn.varlen_attention(q, k, v, cu, cu, 13, 13, causal=True)


def test_scaled_dot_product_attention():
    q, k, v = _qkv(1, 2, 16, 32)
    with _refused("query"):
        tileattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    with _refused("query"):
        tileattn.scaled_dot_product_attention(q, k, v)
    with _refused("query"):
        tileattn.scaled_dot_product_attention(*(t.requires_grad_() for t in (q, k, v)))


def test_registered_backward_op():
    """tileattn::attn_bwd can be called on its own (the forward refuses bf16 before there is a graph)."""
    from tileattn.ops.dense.problem import AttnOptions
    q, k, v = _qkv(1, 16, 2, 32)
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 16)
    opts = AttnOptions(scale=32 ** -0.5, return_lse=True).encode()
    with _refused("q"):
        torch.ops.tileattn.attn_bwd(torch.zeros_like(q), None, [q, k, v, out, lse], opts)
    f16 = [t.to(F16) for t in (q, k, v, out)]
    with _refused("grad_out"):
        torch.ops.tileattn.attn_bwd(torch.zeros_like(q), None, [*f16, lse], opts)


def test_fp8_attention_bf16_output_is_allowed():
    """fp8 dense attention's dots take fp8 operands; bfloat16 is only its (default) output dtype."""
    q, k, v = _qkv(1, 16, 2, 32, dtype=torch.float32)
    out = tileattn.attention(q.to(FP8), k.to(FP8), v.to(FP8))
    assert out.dtype == BF16 and torch.isfinite(out).all()


def test_quantize_fp8_of_bf16_is_allowed():
    x = randn(1, 16, 2, 32, dtype=BF16, device=DEV)
    x8, descale = tileattn.quantize_fp8(x)
    assert x8.dtype == FP8
    torch.testing.assert_close(x8.float() * descale.float()[:, None, :, None], x.float(), rtol=0.07, atol=1e-3)


# ---- flex ------------------------------------------------------------------------------------------------------
def test_flex_attention():
    q, k, v = _qkv(1, 2, 32, 32)
    with _refused("query"):
        tileattn.flex_attention(q, k, v)
    with _refused("query"):
        tileattn.flex_attention(q, k, v, score_mod=tileattn.mods.tanh_softcap(5.0), return_lse=True)
    with _refused("query"):
        tileattn.flex_attention(*(t.requires_grad_() for t in (q, k, v)))


def test_flex_attention_fp8_dequantized_to_bf16():
    """fp8 flex runs dequantized to out_dtype under the interpreter: a bf16 out_dtype (the default) means bf16 dots."""
    q, k, v = (t.to(FP8) for t in _qkv(1, 2, 32, 32, dtype=torch.float32))
    with _refused(r"out_dtype \(default for fp8 inputs\)"):
        tileattn.flex_attention(q, k, v)
    with _refused("out_dtype"):
        tileattn.flex_attention(q, k, v, out_dtype=BF16)
    assert tileattn.flex_attention(q, k, v, out_dtype=F16).dtype == F16


# ---- MLA -------------------------------------------------------------------------------------------------------
def _mla(dtype, cache_dtype=None):
    lens = [5, 20]
    ckv = randn(4, 16, 32, dtype=dtype, device=DEV)
    kpe = randn(4, 16, 16, dtype=dtype, device=DEV)
    if cache_dtype is not None:
        ckv, kpe = ckv.to(cache_dtype), kpe.to(cache_dtype)
    table = torch.tensor([[0, -1], [2, 1]], dtype=torch.int32)
    seqlens = torch.tensor(lens, dtype=torch.int32)
    qn, qp = randn(2, 1, 4, 32, dtype=dtype, device=DEV), randn(2, 1, 4, 16, dtype=dtype, device=DEV)
    return qn, qp, ckv, kpe, table, seqlens


@pytest.mark.parametrize("cache_dtype", [None, FP8], ids=["bf16_cache", "fp8_cache"])
def test_mla_decode(cache_dtype):
    with _refused("q_nope"):
        tileattn.mla_decode(*_mla(BF16, cache_dtype))


def test_mla_plan_refuses_at_run():
    """A bf16 plan is made (nothing launches; `tileattn info` describes such plans on the CPU); its run refuses."""
    qn, qp, ckv, kpe, table, seqlens = _mla(BF16)
    plan = tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=32, head_dim_kpe=16, page_size=16,
                                  dtype=BF16)
    plan.out.fill_(float("nan"))
    with _refused("q_nope"):
        plan.run(qn, qp, ckv, kpe, table)
    assert plan.out.isnan().all()


# ---- attention over a KV cache ---------------------------------------------------------------------------------
def _kv(dtype, cache_dtype=None):
    k_cache, v_cache = randn(2, 16, 2, 64, dtype=dtype, device=DEV), randn(2, 16, 2, 64, dtype=dtype, device=DEV)
    if cache_dtype is not None:
        k_cache, v_cache = k_cache.to(cache_dtype), v_cache.to(cache_dtype)
    return randn(2, 1, 4, 64, dtype=dtype, device=DEV), k_cache, v_cache, torch.tensor([9, 14], dtype=torch.int32)


def test_kvcache_attention():
    q, k_cache, v_cache, seqlens = _kv(BF16)
    with _refused("q"):
        tileattn.kvcache_attention(q, k_cache, v_cache, seqlens)
    table = torch.tensor([[1], [0]], dtype=torch.int32)
    with _refused("q"):
        tileattn.kvcache_attention(q, k_cache, v_cache, seqlens, table, return_lse=True)


def test_kvcache_append_refused_before_any_write():
    """With k_new / v_new the append (a copy, no dot) would run first: the refusal comes before it."""
    q, k_cache, v_cache, seqlens = _kv(BF16)
    k_new, v_new = randn(2, 1, 2, 64, dtype=BF16, device=DEV), randn(2, 1, 2, 64, dtype=BF16, device=DEV)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    with _refused("q"):
        tileattn.kvcache_attention(q, k_cache, v_cache, seqlens, k_new=k_new, v_new=v_new)
    assert torch.equal(k_cache, k_before) and torch.equal(v_cache, v_before)


def test_kvcache_plan_refuses_at_run():
    q, k_cache, v_cache, seqlens = _kv(BF16)
    plan = tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64, dtype=BF16)
    plan.out.fill_(float("nan"))
    with _refused("q"):
        plan.run(q, k_cache, v_cache)
    assert plan.out.isnan().all()


def test_kvcache_bf16_queries_over_fp8_cache_are_allowed():
    """With an fp8 cache the decode kernel converts q and the cache to float16 for its dots: bf16 q is exact there."""
    from tileattn.ops.decode.reference import kvcache_attention_ref
    q, k_cache, v_cache, seqlens = _kv(BF16, FP8)
    out, lse = tileattn.kvcache_attention(q, k_cache, v_cache, seqlens, k_scale=0.5, return_lse=True)
    ref, ref_lse = kvcache_attention_ref(q, k_cache, v_cache, seqlens, None, k_scale=0.5)
    assert out.dtype == BF16
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.02, atol=0.02)
    torch.testing.assert_close(lse.float(), ref_lse.float(), rtol=1e-3, atol=1e-3)
