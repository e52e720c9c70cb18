"""ring_attention's checks, and a one-rank group in this process: the ring of one rank is plain attention, bit
for bit (forward and backward), and unshard_sequence of a tensor gathers over the group."""
import pytest
import torch
import torch.distributed as dist

import tileattn

from tests.helpers import randn

DT = torch.float16


def _qkv(device, B=1, S=16, Hq=4, Hkv=2, D=32, Sk=None, dtype=DT):
    return (randn(B, S, Hq, D, dtype=dtype, device=device), randn(B, Sk or S, Hkv, D, dtype=dtype, device=device),
            randn(B, Sk or S, Hkv, D, dtype=dtype, device=device))


def test_needs_an_initialized_group(device):
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    q, k, v = _qkv(device)
    with pytest.raises(ValueError, match="torch.distributed"):
        tileattn.ring_attention(q, k, v)
    with pytest.raises(ValueError, match="not initialized"):
        tileattn.unshard_sequence(q)


@pytest.mark.parametrize("change, exc, needle", [
    (lambda q, k, v: (q[0], k[0], v[0]), ValueError, "4 dims .*varlen"),
    (lambda q, k, v: (q.float(), k.float(), v.float()), TypeError, "float16 or bfloat16"),
    (lambda q, k, v: (q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)), TypeError,
     "float16 or bfloat16"),
    (lambda q, k, v: (q[:, :, :3], k, v), ValueError, "multiple"),
    (lambda q, k, v: (q, k[:, :8], v[:, :8]), ValueError, "causal ring attention needs q and k shards of one"),
    (lambda q, k, v: (q[:, :15], k[:, :15], v[:, :15]), ValueError, "S_local must be even"),
    (lambda q, k, v: (q[:, :0], k[:, :0], v[:, :0]), ValueError, "non-empty"),
    (lambda q, k, v: (q, k, v[:, :8]), ValueError, "must agree"),
])
def test_input_checks(device, change, exc, needle):
    q, k, v = change(*_qkv(device))
    with pytest.raises(exc, match=needle):
        tileattn.ring_attention(q, k, v, causal=True)


@pytest.mark.parametrize("kwargs, exc, needle", [
    (dict(layout="ring"), ValueError, "layout"),
    (dict(causal=1), TypeError, "causal"),
    (dict(scale=0.0), ValueError, "scale"),
    (dict(scale=float("nan")), ValueError, "scale"),
])
def test_option_checks(device, kwargs, exc, needle):
    with pytest.raises(exc, match=needle):
        tileattn.ring_attention(*_qkv(device), **kwargs)


def test_backward_head_dim_check(device):
    q, k, v = (t.requires_grad_() for t in _qkv(device, D=520))
    with pytest.raises(ValueError, match="head dims up to 512"):
        tileattn.ring_attention(q, k, v)


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is initialized in this process already")
    path = tmp_path_factory.mktemp("ring") / "rendezvous"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_one_rank_is_attention(device, one_rank_group, causal, layout):
    q, k, v = (t.requires_grad_() for t in _qkv(device, B=2, S=24, Hq=4, Hkv=1))
    dout, dlse = torch.randn(2, 24, 4, 32, device=device), torch.randn(2, 4, 24, device=device)

    def run(fn):
        out, lse = fn(q, k, v, causal=causal, return_lse=True)
        return (out, lse, *torch.autograd.grad((out.float() * dout).sum() + (lse * dlse).sum(), (q, k, v)))
    got = run(lambda *a, **kw: tileattn.ring_attention(*a, one_rank_group, layout=layout, **kw))
    want = run(tileattn.attention)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), name


def test_one_rank_strided_inputs(device, one_rank_group):
    """Head-major views ([B, H, S, D] transposed) and a slice of a packed qkv tensor, as attention takes them."""
    qkv = randn(1, 24, 3, 4, 32, dtype=DT, device=device)
    q = randn(1, 4, 24, 32, dtype=DT, device=device).transpose(1, 2).requires_grad_()
    k, v = (qkv[:, :, i].detach().requires_grad_() for i in (1, 2))
    k, v = k[:, :, :2], v[:, :, :2]  # 2 kv heads of 4: strided, last dim contiguous

    def run(fn):
        out = fn(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out.float().square().sum(), (q, k, v)))
    got = run(lambda *a, **kw: tileattn.ring_attention(*a, one_rank_group, **kw))
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, run(tileattn.attention)):
        assert torch.equal(g, w), name


def test_one_rank_no_grad_and_gather(device, one_rank_group):
    q, k, v = _qkv(device, S=16)
    out = tileattn.ring_attention(q, k, v, causal=True)
    assert out.shape == q.shape and torch.equal(out, tileattn.attention(q, k, v, causal=True))
    assert torch.equal(tileattn.unshard_sequence(q, layout="contiguous"), q)
    assert torch.equal(tileattn.unshard_sequence(q), q)


def test_merge_of_unseen_rows_stays_finite(device):
    """Rows that have seen no key on either side keep out = 0 and lse = -inf (never NaN)."""
    from tileattn.ops.distributed.ring import merge
    acc = torch.zeros(1, 8, 2, 32, device=device)
    lse_acc = torch.full((1, 2, 8), float("-inf"), device=device)
    lse_acc[:, :, :4] = torch.randn(1, 2, 4, device=device)
    acc[:, :4] = torch.randn(1, 4, 2, 32, device=device)
    o = randn(1, 6, 2, 32, dtype=DT, device=device)
    lse = torch.full((1, 2, 6), float("-inf"), device=device)
    lse[:, :, :2] = torch.randn(1, 2, 2, device=device)  # block rows 0, 1 (acc rows 2, 3) saw keys
    want_lse = lse_acc.clone()
    want_lse[:, :, 2:] = torch.logaddexp(lse_acc[:, :, 2:], lse)
    w_a = torch.exp(lse_acc[:, :, 2:] - want_lse[:, :, 2:]).nan_to_num(0.0).transpose(1, 2)[..., None]
    w_b = torch.exp(lse - want_lse[:, :, 2:]).nan_to_num(0.0).transpose(1, 2)[..., None]
    want = acc.clone()
    want[:, 2:] = acc[:, 2:] * w_a + o.float() * w_b
    merge(acc, lse_acc, o, lse, slice(2, 8))
    assert not acc.isnan().any() and not lse_acc.isnan().any()
    assert torch.equal(lse_acc.isinf(), want_lse.isinf())
    assert torch.allclose(acc, want, atol=1e-6) and torch.allclose(lse_acc, want_lse, atol=1e-6)
