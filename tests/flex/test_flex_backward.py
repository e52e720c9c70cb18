"""flex_attention's backward against autograd through the materialised reference (ops/flex/reference.py) in
float32, with the same reference in the inputs' dtype as the input-precision error (tolerance rule)."""
import warnings

import pytest
import torch

import tileattn
from tileattn import mods
from tileattn.ops.flex.reference import flex_ref

from tests.flex.test_flex import DT, qkv, ready_mods
from tests.helpers import assert_close, randn

flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")
warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def check_grads(q, k, v, score_mod=None, mask_mod=None, scale=None, gqa=False, block=(128, 128), with_lse=False,
                mask_b=None, mask_h=None):
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    bm = None
    if mask_mod is not None:
        bm = flex_mod.create_block_mask(mask_mod, mask_b if mask_b is not None else B,
                                        mask_h if mask_h is not None else H, Sq, Sk, device=q.device,
                                        BLOCK_SIZE=block)
    w = randn(B, H, Sq, v.shape[3], dtype=torch.float32, device=q.device)
    w_lse = randn(B, H, Sq, dtype=torch.float32, device=q.device)

    def loss(out, lse):
        val = (out.float() * w).sum()
        if with_lse:
            val = val + torch.where(torch.isfinite(lse), lse.float() * w_lse, 0.0).sum()
        return val

    x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = tileattn.flex_attention(*x, score_mod=score_mod, block_mask=bm, scale=scale, enable_gqa=gqa,
                                       return_lse=True)
    got = torch.autograd.grad(loss(out, lse), x)

    def ref(dtype):
        xr = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o, l = flex_ref(*xr, score_mod=score_mod, mask_mod=mask_mod, scale=scale, dtype=dtype)
        return torch.autograd.grad(loss(o, l), xr)
    r32, rlp = ref(torch.float32), ref(q.dtype)
    for name, g, r, rl in zip(("dq", "dk", "dv"), got, r32, rlp):
        assert g.dtype == q.dtype and g.shape == r.shape
        assert_close(name, g, r, rl)


@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm", "document_causal", "alibi_causal",
                                  "softcap_causal", "rel_bias", "alibi_softcap"])
def test_ready_mods_backward(name, device):
    S = 131
    q, k, v = qkv(1, 2, S, S, 32, DT, device)
    score_mod, mask_mod = ready_mods(S, 2, device)[name]
    check_grads(q, k, v, score_mod, mask_mod, block=(32, 64))


def test_user_mod_backward(device):
    """A score mod mixing where, exp, division, clamp and a captured per-head bias; a returned lse in the loss;
    GQA with a block mask broadcast over batch and heads; odd Sq != Sk."""
    H = 4
    q, k, v = qkv(2, H, 45, 70, 32, DT, device, hkv=2, dv=48)
    bias = randn(H, dtype=torch.float32, device=device)

    def score_mod(score, b, h, q_idx, kv_idx):
        s = torch.where(kv_idx > q_idx, score * 0.5 - 1.0, torch.exp(score / 4.0) + bias[h])
        return s.clamp(min=-4.0) / 1.5

    def mask_mod(b, h, q_idx, kv_idx):
        return ((kv_idx - q_idx) % 3 != 1) & (q_idx > 4)

    check_grads(q, k, v, score_mod, mask_mod, gqa=True, block=(16, 32), with_lse=True, mask_b=1, mask_h=1)


def test_even_shapes_backward(device):
    """Lengths that are multiples of the mask's blocks and a power-of-two head dim: no bounds masks at all."""
    q, k, v = qkv(1, 2, 128, 128, 32, DT, device)
    check_grads(q, k, v, mods.alibi(mods.alibi_slopes(2, device=device)), mods.causal, block=(32, 32))
    check_grads(q, k, v, None, None)


def test_dense_backward_with_lse(device):
    """No block mask (every block full), a score mod, lse in the loss, a ragged length."""
    q, k, v = qkv(1, 2, 50, 50, 32, DT, device)
    check_grads(q, k, v, mods.tanh_softcap(2.0), None, scale=0.4, with_lse=True)


def test_backward_errors(device):
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 40, 40, 32, DT, device))
    with pytest.raises(tileattn.FlexCompileError, match="differentiate"):
        tileattn.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s ** s)
    # without a gradient the same mod is fine
    with torch.no_grad():
        tileattn.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s ** 1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "document", "prefix_lm", "alibi_causal",
                                  "softcap_causal"])
def test_gpu_flex_backward(name, D, dtype, device):
    S = 1024
    q, k, v = qkv(2, 4, S, S, D, dtype, device)
    score_mod, mask_mod = ready_mods(S, 4, device)[name]
    check_grads(q, k, v, score_mod, mask_mod, with_lse=True)


@pytest.mark.gpu
def test_gpu_flex_backward_odd_gqa(device):
    q, k, v = qkv(2, 8, 333, 517, 128, torch.bfloat16, device, hkv=2)
    check_grads(q, k, v, mods.tanh_softcap(20.0), mods.sliding_window(100), gqa=True)


@pytest.mark.gpu
def test_gpu_flex_backward_deterministic(device):
    q, k, v = (t.requires_grad_() for t in qkv(2, 8, 1024, 1024, 128, torch.bfloat16, device, hkv=2))
    bm = flex_mod.create_block_mask(mods.causal, 2, 8, 1024, 1024, device=device)
    dout = randn(2, 8, 1024, 128, dtype=torch.bfloat16, device=device)
    runs = [torch.autograd.grad(tileattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=True), (q, k, v), dout)
            for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


def test_power_backward(device):
    """The gradient through `score ** 2` and a negative-base distance power (whole exponents: products)."""
    q, k, v = qkv(1, 2, 48, 48, 32, DT, device)
    check_grads(q, k, v, lambda s, b, h, qi, kv: s - 0.1 * s ** 2 - 0.001 * (qi - kv).float() ** 2, None)
