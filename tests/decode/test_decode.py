"""Attention over a KV cache (kvcache_attention, KVCachePlan) against the float32 gather reference, under the
tolerance rule.

Pages are shuffled (never contiguous), and every cache slot no sequence uses holds NaN (spare pages, the tail
of each last page, the contiguous cache's tail), so a kernel that reads a token it should not fails. CPU runs
(interpreter) use small shapes and float16 (the interpreter's bf16 dots are wrong); `gpu` ones the bench's.
"""
import pytest
import torch

import tileattn
from tileattn import mods
from tileattn.ops.common.paging import gather_tokens as gather
from tileattn.ops.decode import plan as plan_mod
from tileattn.ops.decode.reference import kvcache_attention_ref

from tests.helpers import assert_close, paged_caches, randn

F16, BF16, FP8 = torch.float16, torch.bfloat16, torch.float8_e4m3fn


def make_cache(lens, page_size, hkv, d, dtype, device, spare_pages=2):
    """(k, v, block_table): shuffled pages ([num_pages, page_size, hkv, d]; page_size None: a contiguous
    [B, max + 3, hkv, d] cache), every slot no sequence uses NaN, unused table entries -1."""
    if page_size is None:
        k = torch.full((len(lens), max(lens) + 3, hkv, d), float("nan"), dtype=dtype, device=device)
        v = k.clone()
        for b, n in enumerate(lens):
            k[b, :n] = randn(n, hkv, d, dtype=dtype, device=device)
            v[b, :n] = randn(n, hkv, d, dtype=dtype, device=device)
        return k, v, None
    (k, v), table = paged_caches(lens, page_size, [(hkv, d), (hkv, d)], dtype, device, spare_pages, table_pad=1)
    return k, v, table


def check(out, lse, q, k, v, seqlens, table, **kw):
    ref, ref_lse = kvcache_attention_ref(q, k, v, seqlens, table, **kw)
    ref_lp, ref_lse_lp = kvcache_attention_ref(q, k, v, seqlens, table, dtype=q.dtype, **kw)
    assert_close("out", out, ref, ref_lp)
    if lse is not None:
        assert_close("lse", lse, ref_lse, ref_lse_lp.float())


def run_case(device, lens, q_len, hq, hkv, d, page_size, dtype=F16, plan_form=False, **opts):
    k, v, table = make_cache(lens, page_size, hkv, d, dtype, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = randn(len(lens), q_len, hq, d, dtype=dtype, device=device)
    ref_opts = {n: opts[n] for n in ("causal", "window", "softcap", "alibi_slopes", "sinks", "scale") if n in opts}
    if plan_form:
        plan_opts = {n: opts[n] for n in ("causal", "window", "softcap", "scale") if n in opts}
        plan = tileattn.KVCachePlan(seqlens, num_heads=hq, num_kv_heads=hkv, head_dim=d, page_size=page_size,
                                    q_len=q_len, dtype=dtype, **plan_opts)
        plan.out.fill_(float("nan"))
        plan.lse.fill_(float("nan"))
        out, lse = plan.run(q, k, v, table, alibi_slopes=opts.get("alibi_slopes"), sinks=opts.get("sinks"),
                            return_lse=True)
    else:
        out, lse = tileattn.kvcache_attention(q, k, v, seqlens, table, return_lse=True, **opts)
    check(out, lse, q, k, v, seqlens, table, **ref_opts)


@pytest.mark.parametrize("page_size", [1, 5, 16, None])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_matrix(device, page_size, hq, hkv, q_len):
    run_case(device, [37, 3, 70], q_len, hq, hkv, 64, page_size)


@pytest.mark.parametrize("d", [128, 256])
def test_decode_head_dims(device, d):
    run_case(device, [20, 45], 2, 4, 2, d, 16, plan_form=True)


@pytest.mark.parametrize("opts", [
    {"causal": False}, {"window": (8, 0)}, {"window": (5, 2), "causal": False}, {"softcap": 2.0},
    {"scale": 0.3}, {"alibi": True}, {"sinks": True}, {"sinks": True, "window": (4, 0), "softcap": 3.0},
], ids=lambda o: "-".join(o))
@pytest.mark.parametrize("plan_form", [False, True])
def test_decode_options(device, opts, plan_form):
    opts = dict(opts)
    if opts.pop("alibi", False):
        opts["alibi_slopes"] = mods.alibi_slopes(8, device=device)
    if opts.pop("sinks", False):
        opts["sinks"] = torch.randn(8, device=device) * 2
    run_case(device, [50, 9, 0 if not plan_form else 1], 4, 8, 2, 64, 16, plan_form=plan_form, **opts)


def test_decode_sink_alone(device):
    """A sequence with no tokens: out = 0 and lse = the sink's logit."""
    k, v, table = make_cache([5, 0], 4, 2, 64, F16, device)
    seqlens = torch.tensor([0, 0], dtype=torch.int32, device=device)
    q = randn(2, 1, 4, 64, dtype=F16, device=device)
    sinks = torch.randn(4, device=device)
    out, lse = tileattn.kvcache_attention(q, k, v, seqlens, table, sinks=sinks, return_lse=True)
    assert torch.equal(out, torch.zeros_like(out))
    torch.testing.assert_close(lse, sinks[None, :, None].expand(2, 4, 1))


@pytest.mark.parametrize("page_size", [8, None])
def test_decode_append(device, page_size):
    """k_new / v_new land at cache_seqlens.. (FlashAttention's convention) and are attended to."""
    lens, new = [30, 7, 16], 3
    cap = [n + new for n in lens]
    k, v, table = make_cache(cap, page_size, 2, 64, F16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = randn(3, new, 4, 64, dtype=F16, device=device)
    kn, vn = randn(3, new, 2, 64, dtype=F16, device=device), randn(3, new, 2, 64, dtype=F16, device=device)
    out, lse = tileattn.kvcache_attention(q, k, v, seqlens, table, k_new=kn, v_new=vn, return_lse=True)
    total = seqlens + new
    for b in range(3):
        assert torch.equal(gather(k, table, b, cap[b])[lens[b]:], kn[b])
        assert torch.equal(gather(v, table, b, cap[b])[lens[b]:], vn[b])
    check(out, lse, q, k, v, total, table)


def test_decode_chunked_prefill(device):
    """Packed queries (cu_seqlens_q) against each sequence's paged cache, new keys appended, an empty query
    sequence among them, a tile boundary inside a sequence (64 rows)."""
    lens, qlens = [40, 12, 90, 5], [3, 0, 40, 5]
    k, v, table = make_cache(lens, 16, 2, 64, F16, device)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=device)
    q = randn(sum(qlens), 4, 64, dtype=F16, device=device)
    kn, vn = randn(sum(qlens), 2, 64, dtype=F16, device=device), randn(sum(qlens), 2, 64, dtype=F16, device=device)
    cache_seqlens = torch.tensor([n - m for n, m in zip(lens, qlens)], dtype=torch.int32, device=device)
    out, lse = tileattn.kvcache_attention(q, k, v, cache_seqlens, table, k_new=kn, v_new=vn, cu_seqlens_q=cu,
                                          window=(30, 0), return_lse=True)
    assert lse.shape == (4, sum(qlens))
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    check(out, lse, q, k, v, seqlens, table, cu_seqlens_q=cu, window=(30, 0))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("v_scale_shape", [(1,), (1, 1), ()], ids=["v1", "v1x1", "v0d"])
def test_decode_fp8_cache(device, per_head, v_scale_shape):
    """k_scale a number or one per KV head; v_scale one element of any shape ([1, 1] too, as attention's
    descales): the value of every KV head."""
    lens = [33, 60]
    k, v, table = make_cache(lens, 16, 2, 64, F16, device)
    k8, v8 = (k.float() / 2).to(FP8), (v.float() * 4).to(FP8)
    ks = torch.tensor([2.0, 1.0], device=device) if per_head else 2.0
    vs = torch.full(v_scale_shape, 0.25, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = randn(2, 2, 4, 64, dtype=F16, device=device)
    out, lse = tileattn.kvcache_attention(q, k8, v8, seqlens, table, k_scale=ks, v_scale=vs, return_lse=True)
    check(out, lse, q, k8, v8, seqlens, table, k_scale=ks, v_scale=vs)


def test_decode_fp8_append(device):
    """New keys are divided by the scale and saturated into an fp8 cache."""
    k, v, table = make_cache([20], 8, 1, 64, F16, device)
    k8, v8 = k.to(FP8), v.to(FP8)
    kn = randn(1, 1, 1, 64, dtype=F16, device=device) * 3
    kn[0, 0, 0, 0] = 5000.0  # saturates to 448 * scale
    vn = randn(1, 1, 1, 64, dtype=F16, device=device)
    q = randn(1, 1, 2, 64, dtype=F16, device=device)
    seqlens = torch.tensor([19], dtype=torch.int32, device=device)
    tileattn.kvcache_attention(q, k8, v8, seqlens, table, k_new=kn, v_new=vn, k_scale=2.0, v_scale=1.0)
    row = gather(k8, table, 0, 20)[19, 0].float()
    want = (kn[0, 0, 0].float() / 2).clamp(-448, 448).to(FP8).float()
    assert row[0] == 448.0
    torch.testing.assert_close(row, want, rtol=0.125, atol=2 ** -9)  # within one e4m3 step (rounding may differ)


def test_decode_split_and_update(device, monkeypatch):
    """A long sequence among short ones is split into many items and combined; update re-plans in place."""
    monkeypatch.setattr(plan_mod, "MIN_STEPS", 1)
    lens = [700, 7, 130]
    k, v, table = make_cache(lens, 16, 2, 64, F16, device)
    q = randn(3, 2, 4, 64, dtype=F16, device=device)
    sinks = torch.randn(4, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    plan = tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64, page_size=16, q_len=2,
                                dtype=F16)
    assert plan.num_slots >= 4, plan
    out, lse = plan.run(q, k, v, table, sinks=sinks, return_lse=True)
    check(out, lse, q, k, v, seqlens, table, sinks=sinks)
    shorter = torch.tensor([300, 2, 129], dtype=torch.int32, device=device)
    plan.update(shorter)
    out, lse = plan.run(q, k, v, table, return_lse=True)
    check(out, lse, q, k, v, shorter, table)


def test_decode_errors(device):
    k, v, table = make_cache([20, 9], 8, 2, 64, F16, device)
    seqlens = torch.tensor([20, 9], dtype=torch.int32, device=device)
    q = randn(2, 1, 4, 64, dtype=F16, device=device)
    bad = table.clone()
    bad[0, 1] = 10_000
    with pytest.raises(ValueError, match="block_table"):
        tileattn.kvcache_attention(q, k, v, seqlens, bad)
    with pytest.raises(ValueError, match="does not fit a block table"):
        tileattn.kvcache_attention(q, k, v, torch.tensor([20, 40], dtype=torch.int32, device=device), table)
    with pytest.raises(ValueError, match="num_heads, num_kv_heads"):
        tileattn.kvcache_attention(randn(2, 1, 3, 64, dtype=F16, device=device), k, v, seqlens, table)
    with pytest.raises(TypeError, match="k_cache"):
        tileattn.kvcache_attention(q, k.to(BF16), v, seqlens, table)
    with pytest.raises(ValueError, match="head_dim"):
        tileattn.kvcache_attention(randn(2, 1, 4, 96, dtype=F16, device=device), k, v, seqlens, table)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        tileattn.kvcache_attention(q, k, v, torch.tensor([20, -3], dtype=torch.int32, device=device), table)
    with pytest.raises(ValueError, match="cache_seqlens"):
        tileattn.kvcache_attention(q, k, v, seqlens.long(), table)
    with pytest.raises(ValueError, match="window"):
        tileattn.kvcache_attention(q, k, v, seqlens, table, window=(3,))
    with pytest.raises(ValueError, match="sinks"):
        tileattn.kvcache_attention(q, k, v, seqlens, table, sinks=torch.zeros(3, device=device))
    with pytest.raises(ValueError, match="k_scale"):
        tileattn.kvcache_attention(q, k, v, seqlens, table, k_scale=torch.ones(3, device=device))
    with pytest.raises(ValueError, match=r"k_scale: .*one per KV head \[num_kv_heads=2\]"):  # a 1-D tensor
        tileattn.kvcache_attention(q, k, v, seqlens, table, k_scale=torch.ones(1, 2, device=device))
    plan = tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64, page_size=8, dtype=F16)
    with pytest.raises(ValueError, match="page_size=8"):
        plan.run(q, k[:, :4], v[:, :4], table)
    with pytest.raises(ValueError, match="q: expected"):
        plan.run(randn(3, 1, 4, 64, dtype=F16, device=device), k, v, table)
    with pytest.raises(ValueError, match="k_new, v_new"):
        plan.run(q, k, v, table, k_new=randn(2, 1, 2, 64, dtype=F16, device=device))
    with pytest.raises(ValueError, match="seqlens: the plan is for a batch of 2"):
        plan.update(torch.tensor([1], dtype=torch.int32, device=device))
    with pytest.raises(NotImplementedError, match="no backward"):
        plan.run(q.clone().requires_grad_(), k, v, table)


def test_decode_knew_needs_room(device):
    """With k_new every length must be >= its q_len (the new tokens are the sequence's last q_len positions):
    a shorter one would be written before its first position, into another sequence's page."""
    k, v, table = make_cache([10, 10], 16, 2, 64, F16, device)
    k0 = k.clone()
    q, kn = randn(2, 2, 4, 64, dtype=F16, device=device), randn(2, 2, 2, 64, dtype=F16, device=device)
    plan = tileattn.KVCachePlan(torch.tensor([0, 10], dtype=torch.int32, device=device), num_heads=4,
                                num_kv_heads=2, head_dim=64, page_size=16, q_len=2, dtype=F16)
    plan.run(q, k, v, table)  # without k_new a short sequence is fine (its rows see nothing)
    with pytest.raises(ValueError, match="seqlens: with k_new.*sequence 0 has 0 < 2"):
        plan.run(q, k, v, table, k_new=kn, v_new=kn)
    plan.update(torch.tensor([5, 1], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="sequence 1 has 1 < 2"):
        plan.run(q, k, v, table, k_new=kn, v_new=kn)
    with pytest.raises(ValueError, match="cache_seqlens must be >= 0"):
        tileattn.kvcache_attention(q, k, v, torch.tensor([-1, 5], dtype=torch.int32, device=device), table,
                                   k_new=kn, v_new=kn)
    assert torch.equal(k.isnan(), k0.isnan()) and torch.equal(k.nan_to_num(), k0.nan_to_num())


def test_decode_host_seqlens_checked(device):
    """host_seqlens holds one int per sequence (a short list left sequences uncomputed)."""
    seqlens = torch.tensor([20, 5], dtype=torch.int32, device=device)
    kw = dict(num_heads=4, num_kv_heads=2, head_dim=64, page_size=16, dtype=F16)
    with pytest.raises(ValueError, match=r"host_seqlens: expected one length per sequence \(batch 2\), got 1"):
        tileattn.KVCachePlan(seqlens, host_seqlens=[20], **kw)
    plan = tileattn.KVCachePlan(seqlens, host_seqlens=[20, 5], **kw)
    with pytest.raises(ValueError, match="host_seqlens"):
        plan.update(seqlens, host_seqlens=[20, 5, 1])
    with pytest.raises(TypeError, match="host_seqlens: expected a list of ints"):
        plan.update(seqlens, host_seqlens="ab")
    np = pytest.importorskip("numpy")
    for lens in (torch.tensor([20, 5]), (20, 5), [np.int64(20), np.int64(5)]):  # a CPU tensor, numpy's ints
        assert plan.update(seqlens, host_seqlens=lens).max_len == 20
    with pytest.raises(TypeError, match="host_seqlens: expected a 1-D integer tensor on the CPU"):
        plan.update(seqlens, host_seqlens=torch.tensor([20.0, 5.0]))
    plan = tileattn.KVCachePlan(seqlens, host_seqlens=[20, 5], **(kw | dict(head_dim=np.int64(64))))
    assert type(plan.head_dim) is int


@pytest.mark.parametrize("kw,match", [
    ({"window": (True, 0)}, "window"), ({"window": (-2, 0)}, "window"), ({"scale": float("inf")}, "scale"),
    ({"scale": True}, "scale"), ({"scale": "0.1"}, "scale"),
    ({"softcap": float("inf")}, "softcap"), ({"softcap": "1"}, "softcap"),
    ({"k_scale": True}, "k_scale"), ({"causal": "False"}, "causal"),
    ({"alibi_slopes": torch.rand(8)}, "alibi_slopes: expected a contiguous"),
    ({"sinks": torch.randn(8)}, "sinks: expected a contiguous"),
], ids=["window_bool", "window_negative", "scale_inf", "scale_bool",
        "scale_str", "softcap_inf", "softcap_str", "k_scale_bool", "causal_str", "alibi_strided", "sinks_strided"])
def test_decode_bad_options(device, kw, match):
    """Numbers must be finite numbers (not bools or strings), window bounds fit int32, causal a bool, the per-head
    vectors contiguous: each raised before, or ran with a silent wrong answer (zeros, NaN, a stride ignored)."""
    k, v, table = make_cache([20, 9], 8, 2, 64, F16, device)
    seqlens = torch.tensor([20, 9], dtype=torch.int32, device=device)
    q = randn(2, 1, 4, 64, dtype=F16, device=device)
    # tensor options are given at twice their length and strided on the device (a strided tensor's .to() copy
    # is contiguous)
    kw = {n: x.to(device)[::2] if isinstance(x, torch.Tensor) else x for n, x in kw.items()}
    with pytest.raises((ValueError, TypeError), match=match):
        tileattn.kvcache_attention(q, k, v, seqlens, table, **kw)
    plan_kw = {n: x for n, x in kw.items() if n in ("window", "scale", "softcap", "causal")}
    if plan_kw:
        with pytest.raises((ValueError, TypeError), match=match):
            tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64, page_size=8, dtype=F16, **plan_kw)


def test_decode_huge_window_is_unbounded(device):
    """A window bound >= 2^30 is -1 (unbounded), as in `attention`: passed on, 2^63 (Triton's uint64) gave zeros,
    near 2^31 the kernel's int32 bounds overflowed, 2^64 did not fit the launch."""
    k, v, table = make_cache([20, 9], 8, 2, 64, F16, device)
    seqlens = torch.tensor([20, 9], dtype=torch.int32, device=device)
    q = randn(2, 3, 4, 64, dtype=F16, device=device)
    for causal in (False, True):
        want = tileattn.kvcache_attention(q, k, v, seqlens, table, causal=causal)
        for window in ((2 ** 63, 0 if causal else -1), (2 ** 64, 2 ** 31 - 1), (2 ** 30, 2 ** 31)):
            assert torch.equal(tileattn.kvcache_attention(q, k, v, seqlens, table, causal=causal, window=window), want)


def test_decode_numpy_bool_causal(device):
    np = pytest.importorskip("numpy")
    run_case(device, [20, 9], 1, 4, 2, 64, 8, causal=np.bool_(False))


def test_decode_plan_int_args(device):
    seqlens = torch.tensor([20, 9], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="head_dim"):
        tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64.0, page_size=8, dtype=F16)
    with pytest.raises(ValueError, match="page_size"):
        tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64, page_size=True, dtype=F16)


def test_decode_overlapping_outputs(device):
    """An out / lse whose elements share memory (expand) would be written by several rows: rejected."""
    k, v, table = make_cache([20, 9], 8, 2, 64, F16, device)
    seqlens = torch.tensor([20, 9], dtype=torch.int32, device=device)
    q = randn(2, 1, 4, 64, dtype=F16, device=device)
    plan = tileattn.KVCachePlan(seqlens, num_heads=4, num_kv_heads=2, head_dim=64, page_size=8, dtype=F16)
    with pytest.raises(ValueError, match="out: its elements overlap"):
        plan.run(q, k, v, table, out=torch.empty(2, 1, 1, 64, dtype=F16, device=device).expand(2, 1, 4, 64))
    with pytest.raises(ValueError, match="lse: its elements overlap"):
        plan.run(q, k, v, table, lse=torch.empty(2, 1, 1, device=device).expand(2, 4, 1), return_lse=True)


def test_decode_cu_seqlens_q_list(device):
    """cu_seqlens_q given as a list with k_new: a clear error (it was subtracted before being checked)."""
    k, v, table = make_cache([20, 9], 8, 2, 64, F16, device)
    seqlens = torch.tensor([17, 7], dtype=torch.int32, device=device)
    kn = randn(5, 2, 64, dtype=F16, device=device)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected an int32 tensor"):
        tileattn.kvcache_attention(randn(5, 4, 64, dtype=F16, device=device), k, v, seqlens, table,
                                   cu_seqlens_q=[0, 3, 5], k_new=kn, v_new=kn)


# ---- GPU -------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64, None])
@pytest.mark.parametrize("hq,hkv,q_len", [(32, 8, 1), (64, 8, 1), (32, 32, 1), (32, 8, 4), (64, 8, 16)])
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_gpu_decode(device, page_size, hq, hkv, q_len, dtype):
    run_case(device, [3000, 17, 1, 1500], q_len, hq, hkv, 128, page_size, dtype=dtype, plan_form=True)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 256])
def test_gpu_decode_head_dims(device, d):
    run_case(device, [2000, 700], 4, 16, 4, d, 32, dtype=BF16, window=(500, 0), softcap=30.0,
             sinks=torch.randn(16, device=device))


@pytest.mark.gpu
def test_gpu_decode_fp8(device):
    lens = [4000, 33, 1000]
    k, v, table = make_cache(lens, 16, 8, 128, BF16, device)
    k8, v8 = k.to(FP8), v.to(FP8)
    ks = torch.linspace(0.5, 1.5, 8, device=device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = randn(3, 1, 32, 128, dtype=BF16, device=device)
    out, lse = tileattn.kvcache_attention(q, k8, v8, seqlens, table, k_scale=ks, v_scale=0.7, return_lse=True)
    check(out, lse, q, k8, v8, seqlens, table, k_scale=ks, v_scale=0.7)


@pytest.mark.gpu
def test_gpu_decode_cuda_graph(device):
    """plan.run captured in a CUDA graph; update() (same buffers) then a replay gives the new lengths' result."""
    lens = [5000, 40, 900, 3]
    k, v, table = make_cache(lens, 16, 8, 128, BF16, device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    q = randn(4, 1, 32, 128, dtype=BF16, device=device)
    sinks = torch.randn(32, device=device)
    plan = tileattn.KVCachePlan(seqlens, num_heads=32, num_kv_heads=8, head_dim=128, page_size=16, dtype=BF16)
    plan.run(q, k, v, table, sinks=sinks)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = plan.run(q, k, v, table, sinks=sinks)
    g.replay()
    torch.cuda.synchronize()
    check(out, None, q, k, v, seqlens, table, sinks=sinks)
    shorter = torch.tensor([4000, 1, 900, 2], dtype=torch.int32, device=device)
    plan.update(shorter)
    q.copy_(randn(4, 1, 32, 128, dtype=BF16, device=device))
    g.replay()
    torch.cuda.synchronize()
    check(out, None, q, k, v, shorter, table, sinks=sinks)


@pytest.mark.gpu
def test_gpu_decode_cuda_graph_number_scales(device):
    """k_scale / v_scale given as numbers: a replay uses the numbers of its capture, whatever eager runs passed
    in between (each run writes its numbers; none is skipped as unchanged)."""
    lens = [3000, 70]
    k, v, table = make_cache(lens, 16, 2, 128, BF16, device)
    q = randn(2, 1, 8, 128, dtype=BF16, device=device)
    plan = tileattn.KVCachePlan(torch.tensor(lens, dtype=torch.int32, device=device), num_heads=8, num_kv_heads=2,
                                head_dim=128, page_size=16, dtype=BF16)
    expected = plan.run(q, k, v, table, k_scale=2.0, v_scale=0.5).clone()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = plan.run(q, k, v, table, k_scale=2.0, v_scale=0.5)
    other = plan.run(q, k, v, table, k_scale=0.25, v_scale=3.0).clone()
    g.replay()
    torch.cuda.synchronize()
    assert not torch.equal(other, expected)
    assert torch.equal(out, expected)


@pytest.mark.gpu
def test_gpu_decode_append_prefill(device):
    """Chunked prefill of a 2K-token chunk per sequence over a paged cache, appended in place."""
    lens, qlens = [6000, 2048, 3000], [2048, 2048, 100]
    k, v, table = make_cache(lens, 64, 8, 128, BF16, device)
    cu = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device=device)
    q = randn(sum(qlens), 32, 128, dtype=BF16, device=device)
    kn, vn = randn(sum(qlens), 8, 128, dtype=BF16, device=device), randn(sum(qlens), 8, 128, dtype=BF16,
                                                                         device=device)
    cache_seqlens = torch.tensor([n - m for n, m in zip(lens, qlens)], dtype=torch.int32, device=device)
    out, lse = tileattn.kvcache_attention(q, k, v, cache_seqlens, table, k_new=kn, v_new=vn, cu_seqlens_q=cu,
                                          return_lse=True)
    check(out, lse, q, k, v, torch.tensor(lens, dtype=torch.int32, device=device), table, cu_seqlens_q=cu)


# ---- attention(...) with Sq = 1 takes the split-KV route ----------------------------------------------------------
@pytest.mark.parametrize("opts", [{}, {"causal": True, "window": (40, 0)}, {"softcap": 5.0, "scale": 0.2},
                                  {"scale": -0.3}], ids=lambda o: "-".join(o) or "plain")
def test_dense_decode_route(device, opts):
    from tileattn.ops.dense import dispatch
    from tileattn.ops.dense.problem import AttnOptions, AttnProblem
    from tileattn.ops.dense.reference import attention_ref
    B, Sk, Hq, Hkv, D = 2, 150, 8, 2, 64
    q = randn(B, 1, Hq, D, dtype=F16, device=device)
    k = randn(B, Sk, Hkv, D, dtype=F16, device=device)
    v = randn(B, Sk, Hkv, D, dtype=F16, device=device)
    p = AttnProblem(B, 1, Sk, Hq, Hkv, D, D, F16, F16, torch.device(device), AttnOptions(scale=0.125))
    assert dispatch.select(p)[0].name == "dense.decode"
    if opts.get("scale", 1) < 0:  # the decode kernels take a positive scale: the dense kernels serve it
        p = AttnProblem(B, 1, Sk, Hq, Hkv, D, D, F16, F16, torch.device(device), AttnOptions(scale=-0.3))
        assert dispatch.select(p)[0].name != "dense.decode"
    out, lse = tileattn.attention(q, k, v, return_lse=True, **opts)
    ref, ref_lse = attention_ref(q, k, v, **opts)
    ref_lp, ref_lse_lp = attention_ref(q, k, v, dtype=F16, **opts)
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, ref_lse, ref_lse_lp)
