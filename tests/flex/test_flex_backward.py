"""flex_attention's backward against autograd through the materialised reference (ops/flex/reference.py) in
float32, with the same reference in the inputs' dtype as the input-precision error (tolerance rule)."""
import warnings

import pytest
import torch
import triton
import triton.language as tl

import tileattn
from tileattn import mods
from tileattn.ops.common.bwd_kernels import chain_group
from tileattn.ops.flex.reference import flex_ref

from tests.flex.test_flex import DT, bias_mods, qkv, ready_mods
from tests.helpers import assert_close, randn

flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")
warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def check_grads(q, k, v, score_mod=None, mask_mod=None, scale=None, gqa=False, block=(128, 128), with_lse=False,
                mask_b=None, mask_h=None, ref_score_mod=None):
    """ref_score_mod: the reference's score mod when it must differ (equal where the mask shows the score)."""
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
        o, l = flex_ref(*xr, score_mod=ref_score_mod or score_mod, mask_mod=mask_mod, scale=scale, dtype=dtype)
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


# ---- the Hopper backward (ops/flex/launch_bwd_sm90.py), forced with TILEATTN_SM90_BWD=1 -------------------------
@pytest.fixture
def sm90_bwd(monkeypatch):
    """Forces the flex Hopper backward and counts its launches (a test that expects it checks the count)."""
    from tileattn.ops.flex import launch_bwd_sm90
    monkeypatch.setenv("TILEATTN_SM90_BWD", "1")
    ran = []
    real = launch_bwd_sm90.flex_bwd_sm90
    monkeypatch.setattr(launch_bwd_sm90, "flex_bwd_sm90", lambda *a: (ran.append(1), real(*a))[1])
    return ran


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "document", "prefix_lm", "alibi_causal",
                                  "softcap_causal", "rel_bias", "alibi_softcap"])
def test_gpu_flex_backward_sm90(name, D, dtype, device, sm90_bwd):
    S = 1024
    q, k, v = qkv(2, 4, S, S, D, dtype, device)
    score_mod, mask_mod = ready_mods(S, 4, device)[name]
    check_grads(q, k, v, score_mod, mask_mod, with_lse=True)
    assert sm90_bwd


@pytest.mark.gpu
@pytest.mark.parametrize("sq,sk", [(1000, 1000), (333, 517), (1024, 1000), (1000, 1024)])
@pytest.mark.parametrize("name", ["causal", "document", "alibi_causal", "softcap_causal", "alibi", "rel_bias"])
def test_gpu_flex_backward_sm90_ragged(name, sq, sk, device, sm90_bwd):
    """Lengths that are not multiples of the mask's 128-blocks on the Hopper backward (its padding rows and keys
    masked; ALiBi without a mask would give the padding keys the largest scores), through a returned lse."""
    H = 4
    q, k, v = qkv(2, H, sq, sk, 128, torch.bfloat16, device)
    found = ready_mods(max(sq, sk), H, device)
    found["alibi"] = (mods.alibi(mods.alibi_slopes(H, device=device)), None)
    score_mod, mask_mod = found[name]
    check_grads(q, k, v, score_mod, mask_mod, with_lse=True)
    assert sm90_bwd


@pytest.mark.gpu
@pytest.mark.parametrize("sq,sk", [(64, 1), (300, 200)])
def test_gpu_flex_sm90_ragged_edges(sq, sk, device, sm90_fwd, sm90_bwd):
    """A single key, and rows that see no key (out 0, lse -inf; zero gradients), on the Hopper forward and backward
    at ragged lengths, GQA, through the lse."""
    from tests.flex.test_flex import check, on_sm90
    q, k, v = qkv(2, 4, sq, sk, 128, torch.bfloat16, device, hkv=2)
    score_mod = mods.alibi(mods.alibi_slopes(4, device=device))

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx % 7 != 3) & (kv_idx <= q_idx)
    check(q, k, v, score_mod, mask_mod, gqa=True)
    check_grads(q, k, v, score_mod, mask_mod, gqa=True, with_lse=True)
    assert len(sm90_fwd) == (2 if on_sm90() else 0) and sm90_bwd


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_ragged_d64_gqa(device, sm90_bwd):
    """D = 64 (128-row steps), GQA and a mask broadcast over batch and heads, ragged lengths."""
    q, k, v = qkv(2, 8, 700, 900, 64, torch.float16, device, hkv=2)
    score_mod, mask_mod = ready_mods(900, 8, device)["alibi_causal"]
    check_grads(q, k, v, score_mod, mask_mod, gqa=True, with_lse=True, mask_b=1, mask_h=1)
    check_grads(q, k, v, mods.tanh_softcap(4.0), None, gqa=True)
    assert len(sm90_bwd) == 2


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_ragged_full_block(device, sm90_bwd):
    """The last, ragged key and query blocks in the mask's full list (from_kv_blocks): no mask_mod runs there, the
    padding is masked all the same."""
    from tests.flex.test_flex import ragged_full_block_case
    sq, sk, H = 300, 333, 2
    q, k, v = qkv(1, H, sq, sk, 128, torch.bfloat16, device)
    bm, visible, slopes, bias = ragged_full_block_case(H, device, sq, sk)
    x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    dout = randn(1, H, sq, 128, dtype=torch.bfloat16, device=device)
    got = torch.autograd.grad(tileattn.flex_attention(*x, score_mod=mods.alibi(slopes), block_mask=bm), x, dout)

    def ref(dtype):
        xr = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        s = (xr[0] @ xr[1].transpose(-1, -2)).float() * 128 ** -0.5 + bias
        o = torch.softmax(s.masked_fill(~visible, float("-inf")), -1).to(dtype) @ xr[2]
        return torch.autograd.grad(o, xr, dout.to(dtype))
    for name, g, r, rl in zip(("dq", "dk", "dv"), got, ref(torch.float32), ref(torch.bfloat16)):
        assert_close(name, g, r, rl)
    assert sm90_bwd


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_gqa_rows_unseen(device, sm90_bwd):
    """GQA with a mask broadcast over batch and heads, Sq != Sk, query blocks that see no key at all (their dQ
    sums are never written: the conversion zeroes them) and a score mod whose derivative is not finite where
    the mask hides it."""
    q, k, v = qkv(2, 8, 512, 768, 128, torch.bfloat16, device, hkv=2)

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= 200) & (kv_idx <= q_idx + 100)

    def score_mod(score, b, h, q_idx, kv_idx):  # d / d score is NaN where the mask hides the score
        return score * (1.0 + 0.01 * torch.sqrt((q_idx + 100 - kv_idx).float()))

    def ref_mod(score, b, h, q_idx, kv_idx):  # (autograd through torch.where would turn its NaN into the grads)
        return score * (1.0 + 0.01 * torch.sqrt((q_idx + 100 - kv_idx).clamp(min=0).float()))

    check_grads(q, k, v, score_mod, mask_mod, gqa=True, with_lse=True, mask_b=1, mask_h=1, ref_score_mod=ref_mod)
    assert sm90_bwd


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_no_block_mask_and_noop(device, sm90_bwd):
    """A score mod without a block mask (every block full), and a mask from BlockMask.from_kv_blocks (torch's
    default noop mask_mod: its partial blocks are not masked)."""
    q, k, v = qkv(1, 4, 384, 384, 64, torch.float16, device)
    check_grads(q, k, v, mods.alibi(mods.alibi_slopes(4, device=device)), None)
    num = torch.tensor([[[1, 2, 1]]], dtype=torch.int32, device=device)
    idx = torch.tensor([[[[2, 0, 0], [0, 1, 0], [1, 0, 0]]]], dtype=torch.int32, device=device)
    bm = flex_mod.BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=128, seq_lengths=(384, 384))
    x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    dout = randn(1, 4, 384, 64, dtype=torch.float16, device=device)
    got = torch.autograd.grad(tileattn.flex_attention(*x, block_mask=bm), x, dout)
    visible = torch.zeros(384, 384, dtype=torch.bool, device=device)
    for i, row in enumerate(idx[0, 0].tolist()):
        for j in row[:num[0, 0, i]]:
            visible[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] = True
    xr = [t.detach().float().requires_grad_() for t in (q, k, v)]
    s = (xr[0] @ xr[1].transpose(-1, -2)) * 64 ** -0.5
    ref = torch.autograd.grad(torch.softmax(s.masked_fill(~visible, float("-inf")), -1) @ xr[2], xr, dout.float())
    xl = [t.detach().requires_grad_() for t in (q, k, v)]
    sl = (xl[0] @ xl[1].transpose(-1, -2)) * 64 ** -0.5
    low = torch.autograd.grad(torch.softmax(sl.float().masked_fill(~visible, float("-inf")), -1).half() @ xl[2], xl,
                              dout)
    for name, g, r, rl in zip(("dq", "dk", "dv"), got, ref, low):
        assert_close(name, g, r, rl)
    assert len(sm90_bwd) == 2


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_poisoned_counters(device, sm90_bwd, monkeypatch):
    """The kernel's counters come from torch.empty and only the preprocess zeroes them: filled with a large count
    before the call (as reused memory may be), the gradients still match the reference."""
    from tileattn.ops.flex import launch_bwd_sm90
    real = launch_bwd_sm90.alloc_counters
    monkeypatch.setattr(launch_bwd_sm90, "alloc_counters", lambda p: real(p).fill_(1 << 20))
    q, k, v = qkv(2, 4, 1024, 1024, 128, torch.bfloat16, device)
    score_mod, mask_mod = ready_mods(1024, 4, device)["document"]
    check_grads(q, k, v, score_mod, mask_mod, with_lse=True)
    assert sm90_bwd


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_deterministic(device, sm90_bwd):
    q, k, v = (t.requires_grad_() for t in qkv(2, 8, 2048, 2048, 128, torch.bfloat16, device, hkv=2))
    bm = flex_mod.create_block_mask(mods.document(mods.document_ids_from_lengths([700, 1000, 348], device=device),
                                                  causal=True), 2, 8, 2048, 2048, device=device)
    dout = randn(2, 8, 2048, 128, dtype=torch.bfloat16, device=device)
    runs = [torch.autograd.grad(tileattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=True), (q, k, v), dout)
            for _ in range(3)]
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))
    assert len(sm90_bwd) == 3


@pytest.mark.gpu
def test_gpu_flex_backward_sm90_head_groups(device, sm90_bwd, monkeypatch):
    """Work items of several heads interleaved (launch_bwd_sm90.FLEX_HEAD_GROUP: 6 (batch, kv head) pairs in groups of
    4 and 2) on a document mask (non-causal inside: every key block of a document starts at its first query
    block) change only when the programs start: gradients bit-identical to head-by-head order's."""
    from tileattn.ops.common import launch_bwd_sm90 as pipeline
    from tileattn.ops.flex import plans
    q, k, v = (t.requires_grad_() for t in qkv(3, 4, 2048, 2048, 128, torch.bfloat16, device, hkv=2))
    bm = flex_mod.create_block_mask(mods.document(mods.document_ids_from_lengths([700, 1000, 348], device=device)),
                                    3, 4, 2048, 2048, device=device)
    dout = randn(3, 4, 2048, 128, dtype=torch.bfloat16, device=device)

    def grads(group):
        monkeypatch.setattr(pipeline, "FLEX_HEAD_GROUP", group)
        plans.clear_plans()  # (a plan keeps its backward's launches)
        return torch.autograd.grad(tileattn.flex_attention(q, k, v, block_mask=bm, enable_gqa=True), (q, k, v),
                                   dout)
    ref = grads(1)
    assert all(torch.equal(a, b) for a, b in zip(ref, grads(4)))
    assert len(sm90_bwd) == 2


@triton.jit
def _chain_probe(out, chain):
    tl.store(out, chain_group(*chain))


@pytest.mark.parametrize("name,group", [("document", 4), ("full", 4), ("causal", 1), ("sliding_window", 1),
                                        ("prefix_lm", 1)])
def test_chain_group(name, group, device):
    """bwd_kernels.chain_group (the flex Hopper backward's work-item order, computed by the preprocess): the head
    group where most key blocks start their walks at the query block where the next key block starts (a document
    mask's, no mask at all), 1 where the starts rise with the key blocks (causal-like masks; prefix-LM: only its 8
    prefix key blocks tie)."""
    from tileattn.ops.flex import launch_bwd_sm90
    from tileattn.ops.flex.problem import FlexCall
    N = 4096
    mask = {"document": mods.document(mods.document_ids_from_lengths([700, 1500, 1000, 896], device=device)),
            "full": None, "causal": mods.causal, "sliding_window": mods.sliding_window(512),
            "prefix_lm": mods.prefix_lm(1024)}[name]
    p = type("P", (), dict(seqlen_q=N, seqlen_k=N, device=torch.device(device)))
    tlists = None
    if mask is not None:
        bm = flex_mod.create_block_mask(mask, None, None, N, N, device=device)
        tlists = (bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices)
    out = torch.zeros(1, dtype=torch.int32, device=device)
    _chain_probe[(1,)](out, launch_bwd_sm90.chain_args(p, FlexCall(None, None, None, tlists=tlists)))
    assert out.item() == (launch_bwd_sm90.pipeline.FLEX_HEAD_GROUP if group > 1 else 1)


def test_mod_derivative_not_finite_where_masked(device):
    """A score mod whose value and derivative are NaN where the mask hides the score (times the sqrt of a
    negative distance) gives finite gradients: hidden scores contribute nothing."""
    q, k, v = qkv(1, 2, 64, 64, 32, DT, device)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score * (1.0 + 0.01 * torch.sqrt((q_idx - kv_idx).float()))

    def ref_mod(score, b, h, q_idx, kv_idx):  # (autograd through torch.where would turn its NaN into the grads)
        return score * (1.0 + 0.01 * torch.sqrt((q_idx - kv_idx).clamp(min=0).float()))

    check_grads(q, k, v, score_mod, mods.causal, block=(32, 32), ref_score_mod=ref_mod)


def test_bias_score_mods_backward(device):
    """Gradients of score mods adding per-query and per-key terms, through a returned lse too, with rows that see
    no key."""
    S = 70
    q, k, v = qkv(1, 2, S, S, 32, DT, device)
    found = bias_mods(2, S, device)

    def rows_cut(b, h, q_idx, kv_idx):
        return (q_idx > 9) & (kv_idx <= q_idx)
    for name in ("alibi", "query_bias", "mixed"):
        check_grads(q, k, v, found[name], rows_cut, block=(32, 32), with_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["alibi", "key_bias", "query_bias", "temperature", "mixed"])
def test_gpu_bias_mods_sm90(name, device, sm90_bwd):
    """Score mods adding per-query and per-key terms on the Hopper forward (output and lse against torch's
    flex_attention) and backward (through the returned lse too, its derivative a constant), with rows 0-127 seeing
    no key."""
    from tests.flex.test_flex import check
    S = 1024
    q, k, v = qkv(2, 4, S, S, 128, torch.bfloat16, device)
    fn = bias_mods(4, S, device)[name]

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= 128) & (kv_idx <= q_idx)
    check(q, k, v, fn, mask_mod)
    check_grads(q, k, v, fn, mask_mod, with_lse=True)
    assert sm90_bwd
