"""Input validation, torch.compile support, config tables and the budget emulation."""
import dataclasses

import pytest
import torch

import tileattn
from tileattn import hw
from tileattn.ops.dense.configs import triton_candidates as candidates
from tileattn.ops.dense.problem import AttnOptions

from tests.helpers import randn


def _qkv(device, B=1, S=16, H=2, D=64, dtype=torch.float16):
    return tuple(randn(B, S, H, D, dtype=dtype, device=device) for _ in range(3))


BAD = [
    ("rank", lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dims"),
    ("dtype", lambda q, k, v: (q.float(), k.float(), v.float()), TypeError, "must be float16, bfloat16"),
    ("mixed", lambda q, k, v: (q, k.to(torch.bfloat16), v), TypeError, "share one dtype"),
    ("heads", lambda q, k, v: (torch.cat([q, q[:, :, :1]], 2), k, v), ValueError, "multiple of the number"),
    ("headdim", lambda q, k, v: (q[..., :36], k[..., :36], v), ValueError, "multiple of 8"),
    ("headdim-large", lambda q, k, v: (q.repeat(1, 1, 1, 17), k.repeat(1, 1, 1, 17), v), ValueError, "1024"),
    ("v-headdim-large", lambda q, k, v: (q, k, v.repeat(1, 1, 1, 17)), ValueError, "v head dim"),
    ("qk-dim", lambda q, k, v: (q, k[..., :32], v), ValueError, "head dims differ"),
    ("batch", lambda q, k, v: (q, k[:0], v[:0]), ValueError, "batch sizes differ"),
    ("kv-len", lambda q, k, v: (q, k, v[:, :3]), ValueError, "must agree"),
    ("stride", lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), ValueError,
     "contiguous last"),
    ("type", lambda q, k, v: (q.tolist(), k, v), TypeError, "torch.Tensor"),
]


@pytest.mark.parametrize("name,mutate,exc,msg", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_raise(name, mutate, exc, msg, device):
    q, k, v = mutate(*_qkv(device))
    with pytest.raises(exc, match=msg):
        tileattn.attention(q, k, v)


@pytest.mark.parametrize("kw,msg", [
    (dict(window=(-2, 0)), "window bounds"), (dict(window=(1,)), "pair of ints"), (dict(softcap=-1.0), "softcap"),
    (dict(scale=float("nan")), "scale"), (dict(causal=1), "causal must be a bool"),
    (dict(causal="False"), "causal must be a bool"), (dict(scale=True), "scale"), (dict(softcap=True), "softcap"),
])
def test_bad_options_raise(kw, msg, device):
    with pytest.raises((ValueError, TypeError), match=msg):
        tileattn.attention(*_qkv(device), **kw)


def test_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        tileattn.attention(*_qkv("cpu"))


@pytest.mark.parametrize("cu_q,cu_k,maxq,msg", [
    ([0, 5, 3], [0, 5, 10], 5, "non-decreasing"),
    ([1, 5, 10], [0, 5, 10], 5, "start at 0"),
    ([0, 5, 99], [0, 5, 10], 94, "exceeds the packed length"),
    ([0, 2, 10], [0, 5, 10], 4, "smaller than the longest"),
])
def test_bad_cu_seqlens_raise(cu_q, cu_k, maxq, msg, device):
    q = randn(10, 2, 64, dtype=torch.float16, device=device)
    cq = torch.tensor(cu_q, dtype=torch.int32, device=device)
    ck = torch.tensor(cu_k, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=msg):
        tileattn.varlen_attention(q, q, q, cq, ck, maxq, 5)


def test_cu_seqlens_noncontiguous_raises(device):
    """The kernels read cu_seqlens[b] at offset b: a strided view (values [0, 10, 16] here) is refused."""
    q = randn(16, 2, 32, dtype=torch.float16, device=device)
    cu = torch.tensor([0, 99, 10, 99, 16], dtype=torch.int32, device=device)[::2]
    ok = cu.contiguous()
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be contiguous \(stride\(0\) == 1\), got stride 2"):
        tileattn.varlen_attention(q, q, q, cu, ok, 10, 10)
    with pytest.raises(ValueError, match="cu_seqlens_k must be contiguous"):
        tileattn.varlen_attention(q, q, q, ok, cu, 10, 10)


@pytest.mark.parametrize("maxq,maxk", [(17, 10), (2 ** 31, 10), (10, 2 ** 40)])
def test_max_seqlen_above_packed_length(maxq, maxk, device):
    """max_seqlen sizes the launch grid: one longer than the packed tensor (a model's maximum, which FlashAttention
    takes; 2^31 was a grid that never ends) counts as the packed length."""
    q = randn(16, 2, 32, dtype=torch.float16, device=device)
    cu = torch.tensor([0, 10, 16], dtype=torch.int32, device=device)
    want = tileattn.varlen_attention(q, q, q, cu, cu, 10, 10)
    assert torch.equal(tileattn.varlen_attention(q, q, q, cu, cu, maxq, maxk), want)


def test_huge_window_is_unbounded(device):
    """A window bound >= 2^30 is -1 (unbounded): passed on, 2^63 (Triton's uint64) gave all zeros, 2^31 - 2 (int32
    overflow in the bounds) and 2^64 (OverflowError) failed."""
    q = randn(1, 24, 2, 32, dtype=torch.float16, device=device)
    k, v = (randn(1, 16, 2, 32, dtype=torch.float16, device=device) for _ in range(2))
    causal = tileattn.attention(q, k, v, causal=True)
    assert torch.equal(tileattn.attention(q, k, v, causal=True, window=(2 ** 63, 0)), causal)
    assert torch.equal(tileattn.attention(q, k, v, causal=True, window=[2 ** 64, 2 ** 30]), causal)
    assert torch.equal(tileattn.attention(q, k, v, window=(2 ** 31 - 2, 2 ** 31 - 2)), tileattn.attention(q, k, v))


def test_flags_take_bools_only(device):
    """A truthy non-bool (is_causal="False") is refused as torch refuses it; numpy bools are bools."""
    np = pytest.importorskip("numpy")
    q = randn(1, 2, 16, 32, dtype=torch.float16, device=device)
    with pytest.raises(TypeError, match="is_causal must be a bool, got str"):
        tileattn.scaled_dot_product_attention(q, q, q, is_causal="False")
    with pytest.raises(TypeError, match="enable_gqa must be a bool, got str"):
        tileattn.scaled_dot_product_attention(q, q, q, enable_gqa="no")
    ref = tileattn.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.equal(tileattn.scaled_dot_product_attention(q, q, q, is_causal=np.bool_(True)), ref)
    qb = q.transpose(1, 2)
    ref = tileattn.attention(qb, qb, qb, causal=True)
    assert torch.equal(tileattn.attention(qb, qb, qb, causal=np.bool_(True)), ref)
    for _ in range(2):  # the first call of a shape and a later one (checked on separate paths)
        with pytest.raises(TypeError, match="return_lse must be a bool, got str"):
            tileattn.attention(qb, qb, qb, return_lse="no")


def test_cu_seqlens_dtype_raises(device):
    q = randn(10, 2, 64, dtype=torch.float16, device=device)
    cq = torch.tensor([0, 10], dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="int32"):
        tileattn.varlen_attention(q, q, q, cq, cq, 10, 10)


def test_sdpa_gqa_needs_enable_gqa(device):
    q = randn(1, 4, 8, 32, dtype=torch.float16, device=device)
    k = randn(1, 2, 8, 32, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="enable_gqa"):
        tileattn.scaled_dot_product_attention(q, k, k)


def test_backward_fills_every_gradient(device):
    """(The gradients' values are checked in test_backward.py.)"""
    q, k, v = (t.requires_grad_() for t in _qkv(device))
    tileattn.attention(q, k, v).float().sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_torch_compile_fullgraph(device):
    """The custom op and its fake implementation trace without graph breaks (fullgraph=True)."""
    q, k, v = _qkv(device, S=24)

    def f(q, k, v):
        o, lse = tileattn.attention(q, k, v, causal=True, return_lse=True)
        return o * 2, lse

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    o, lse = compiled(q, k, v)
    o_ref, lse_ref = f(q, k, v)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    s = tileattn.scaled_dot_product_attention
    q4 = q.transpose(1, 2)
    out = torch.compile(lambda a: s(a, a, a, is_causal=True), backend="aot_eager", fullgraph=True)(q4)
    assert out.shape == q4.shape and torch.equal(out, s(q4, q4, q4, is_causal=True))


def test_varlen_compile_packed_lengths_change(device):
    """varlen_attention under torch.compile with a max_seqlen above the packed length, the packed length changing
    between calls (dynamic shapes): no graph break (clamping it at the API broke the graph on a symbol)."""
    def f(q, cu, m):
        return tileattn.varlen_attention(q, q, q, cu, cu, m, m)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    for total in (20, 28, 36):
        q = randn(total, 2, 32, dtype=torch.float16, device=device)
        cu = torch.tensor([0, 7, total], dtype=torch.int32, device=device)
        assert torch.equal(compiled(q, cu, 64), f(q, cu, 64))


def test_opcheck(device):
    """torch.library's own consistency checks of the registration (schema, fake vs real)."""
    from tileattn.ops.dense import custom_ops  # noqa: F401 - registers the ops (lazily imported by the package)
    q, k, v = _qkv(device, S=20)
    opts = AttnOptions(scale=0.125, window=(-1, 0), return_lse=True)
    torch.library.opcheck(torch.ops.tileattn.attn_fwd.default, (q, k, v, None, None, opts.encode()),
                          test_utils=("test_schema", "test_faketensor"))
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=device)
    opts = AttnOptions(scale=0.125, window=(-1, 0), return_lse=True, max_seqlen_q=13, max_seqlen_k=13)
    torch.library.opcheck(torch.ops.tileattn.attn_fwd.default, (q[0], k[0], v[0], cu, cu, opts.encode()),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("opts", [
    AttnOptions(scale=0.1), AttnOptions(scale=-0.3, window=(5, 0), softcap=2.5, bottom_right=False, return_lse=True),
    AttnOptions(scale=1e-3, max_seqlen_q=7, max_seqlen_k=9, out_scale=0.25, out_dtype=torch.bfloat16, v_packed=True)],
    ids=["plain", "masks", "fp8-varlen"])
def test_options_round_trip(opts):
    """The registered op carries the options as a string: decode(encode(o)) == o, exactly (floats too)."""
    assert AttnOptions.decode(opts.encode()) == opts


@pytest.mark.parametrize("budget,expect", [("sm89", 99 * 1024), ("sm80", 163 * 1024), ("64k", 64 * 1024)])
def test_budget_override(budget, expect, monkeypatch):
    monkeypatch.setenv("TILEATTN_SMEM_BUDGET", budget)
    assert hw.device_info(torch.device("cpu")).smem_per_block == min(expect, hw.INTERPRETER_SMEM)


def test_budget_override_rejects_garbage(monkeypatch):
    monkeypatch.setenv("TILEATTN_SMEM_BUDGET", "lots")
    with pytest.raises(ValueError, match="TILEATTN_SMEM_BUDGET"):
        hw.device_info(torch.device("cpu"))


@pytest.mark.parametrize("arch", [80, 89, 90])
@pytest.mark.parametrize("budget", [99 * 1024, 163 * 1024, 227 * 1024])
@pytest.mark.parametrize("bd", [32, 64, 128, 256])
def test_candidates_fit_budget(arch, budget, bd):
    for causal, seqlen in ((False, 1), (True, 1000), (False, 4096), (True, 100000)):
        cands = candidates(arch, bd, bd, causal, 2, budget, seqlen)
        assert cands
        assert all(c.smem_bytes(bd, bd, 2) <= budget for c in cands)
        assert all(not c.use_tma for c in cands) or arch >= 90


def test_options_with_lse():
    opts = AttnOptions(scale=0.3, window=(4, 0), softcap=2.0, bottom_right=False, max_seqlen_q=5, max_seqlen_k=6,
                       out_scale=0.5, out_dtype=torch.float16, v_packed=True)
    assert opts.with_lse() == dataclasses.replace(opts, return_lse=True)
