"""flex_attention against torch's flex_attention on the same functions (float32 reference, tolerance rule).

torch's flex_attention runs eagerly here (its unfused path: it materialises the scores), in float32 for the
reference and in the input dtype for the input-precision error of the tolerance rule. Block masks come from
torch's create_block_mask, so empty, partial and full blocks all occur.
"""
import warnings

import pytest
import torch

import tileattn
from tileattn import mods

from tests.helpers import assert_close, randn

flex_mod = pytest.importorskip("torch.nn.attention.flex_attention")
warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")


def torch_flex(q, k, v, score_mod, block_mask, scale, gqa, dtype):
    out, lse = flex_mod.flex_attention(q.to(dtype), k.to(dtype), v.to(dtype), score_mod=score_mod,
                                       block_mask=block_mask, scale=scale, enable_gqa=gqa, return_lse=True)
    return out, lse


def check(q, k, v, score_mod=None, mask_mod=None, scale=None, gqa=False, block=(128, 128), mask_b=None,
          mask_h=None):
    B, H, Sq, _ = q.shape
    Sk = k.shape[2]
    bm = None
    if mask_mod is not None:
        bm = flex_mod.create_block_mask(mask_mod, mask_b if mask_b is not None else B,
                                        mask_h if mask_h is not None else H, Sq, Sk, device=q.device,
                                        BLOCK_SIZE=block)
    out, lse = tileattn.flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, scale=scale, enable_gqa=gqa,
                                       return_lse=True)
    ref, lse_ref = torch_flex(q, k, v, score_mod, bm, scale, gqa, torch.float32)
    # the input-precision computation: torch's eager flex on the inputs with the scores rounded to their dtype
    # (as a 16-bit q.k would give them) before score_mod
    def rounded(score, b, h, q_idx, kv_idx):
        score = score.to(q.dtype).to(torch.float32)
        return score if score_mod is None else score_mod(score, b, h, q_idx, kv_idx)
    ref_lp, lse_lp = torch_flex(q, k, v, rounded, bm, scale, gqa, q.dtype)
    assert out.shape == ref.shape and out.dtype == q.dtype
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


def qkv(B, H, Sq, Sk, D, dtype, device, hkv=None, dv=None):
    hkv = hkv or H
    return (randn(B, H, Sq, D, dtype=dtype, device=device), randn(B, hkv, Sk, D, dtype=dtype, device=device),
            randn(B, hkv, Sk, dv or D, dtype=dtype, device=device))


DT = torch.float16  # bf16 dots are wrong in the CPU interpreter: bf16 is covered by the GPU tests


def ready_mods(S, H, device):
    docs = mods.document_ids_from_lengths([S // 3, 1, S - S // 3 - 1], device=device)
    table = randn(H, 2 * 32 + 1, dtype=torch.float32, device=device)
    return {
        "causal": (None, mods.causal),
        "sliding_window": (None, mods.sliding_window(37)),
        "prefix_lm": (None, mods.prefix_lm(50)),
        "document": (None, mods.document(docs)),
        "document_causal": (None, mods.document(docs, causal=True)),
        "alibi_causal": (mods.alibi(mods.alibi_slopes(H, device=device)), mods.causal),
        "softcap_causal": (mods.tanh_softcap(3.0), mods.causal),
        "rel_bias": (mods.relative_position_bias(table, 32), None),
        "alibi_softcap": (mods.compose_scores(mods.alibi(mods.alibi_slopes(H, device=device)),
                                              mods.tanh_softcap(5.0)), None),
    }


@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm", "document", "document_causal",
                                  "alibi_causal", "softcap_causal", "rel_bias", "alibi_softcap"])
def test_ready_mods(name, device):
    S = 131
    q, k, v = qkv(2, 2, S, S, 32, DT, device)
    score_mod, mask_mod = ready_mods(S, 2, device)[name]
    check(q, k, v, score_mod, mask_mod, block=(32, 32))


def test_user_mods_with_captures(device):
    """User-written mods reading captured tensors (per-batch document ids, a per-head bias, a position bias) and
    scalars; changing a captured tensor's values gives new results without a new trace."""
    B, H, S = 2, 3, 96
    q, k, v = qkv(B, H, S, S, 32, DT, device)
    doc = torch.randint(0, 3, (B, S), device=device).sort(dim=1).values.to(torch.int32)
    head_bias = randn(H, dtype=torch.float32, device=device)
    pos_bias = randn(2 * S, dtype=torch.float32, device=device)
    two = 2.0

    def score_mod(score, b, h, q_idx, kv_idx):
        return score * two + head_bias[h] + pos_bias[q_idx - kv_idx + S] * 0.5

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[b, q_idx] == doc[b, kv_idx]) & ((q_idx >= kv_idx) | (kv_idx % 7 == 0))

    check(q, k, v, score_mod, mask_mod, block=(32, 32))
    from tileattn.ops.flex.trace import compile_mod
    spec = compile_mod(score_mod, "score")
    head_bias.mul_(-3.0)  # new values, same tensor: same compiled mod, new result
    check(q, k, v, score_mod, mask_mod, block=(32, 32))
    assert compile_mod(score_mod, "score") is spec


@pytest.mark.parametrize("sq,sk", [(77, 77), (40, 100), (100, 33)])
@pytest.mark.parametrize("gqa", [False, True])
def test_odd_lengths_gqa_block_masks(sq, sk, gqa, device):
    """Sq != Sk, ragged lengths, GQA, a mask that empties whole rows and blocks, block masks broadcast over
    batch / heads, a 16 x 32 block size."""
    H = 4
    q, k, v = qkv(2, H, sq, sk, 32, DT, device, hkv=2 if gqa else H, dv=48)

    def band(b, h, q_idx, kv_idx):
        return ((kv_idx - q_idx) % 5 == 0) & (q_idx > 9) & (kv_idx < 70 + h * 3)

    check(q, k, v, mods.alibi(mods.alibi_slopes(H, device=device)), band, gqa=gqa, block=(16, 32))
    check(q, k, v, None, band if not gqa else mods.causal, gqa=gqa, block=(32, 16), mask_b=1, mask_h=1)
    check(q, k, v, None, None, gqa=gqa, scale=0.3)


def test_bad_inputs(device):
    q, k, v = qkv(1, 2, 40, 40, 32, DT, device)
    with pytest.raises(tileattn.FlexCompileError, match="control flow"):
        def branchy(score, b, h, q_idx, kv_idx):
            return score if q_idx > 3 else -score
        tileattn.flex_attention(q, k, v, score_mod=branchy)
    with pytest.raises(tileattn.FlexCompileError, match="cannot compile"):
        tileattn.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: torch.erf(s))
    with pytest.raises(tileattn.FlexCompileError, match="indexed by 2"):
        t = torch.zeros(4, 4, device=device)
        tileattn.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + t[h])
    with pytest.raises(ValueError, match="key"):
        tileattn.flex_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(TypeError, match="query"):
        tileattn.flex_attention(q.float(), k, v)
    with pytest.raises(ValueError, match="block_mask"):
        bm = flex_mod.create_block_mask(mods.causal, 1, 2, 64, 64, device=device, BLOCK_SIZE=32)
        tileattn.flex_attention(q, k, v, block_mask=bm)



def test_bad_arguments_raise(device):
    """Arguments that ran before as something else: an infinite or bool scale (all-NaN rows, or 1.0), a truthy
    enable_gqa, an empty captured tensor (the kernel read past it), a capture on another device, a mask_mod
    returning floats (torch refuses them)."""
    q, k, v = qkv(1, 2, 32, 32, 32, DT, device)
    for scale in (float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match="scale: expected a finite positive number"):
            tileattn.flex_attention(q, k, v, scale=scale)
    with pytest.raises(TypeError, match="scale: expected a finite positive number, got str"):
        tileattn.flex_attention(q, k, v, scale="0.1")
    with pytest.raises(TypeError, match="enable_gqa must be a bool, got str"):
        tileattn.flex_attention(q, k, v, enable_gqa="no")
    empty = torch.zeros(0, device=device)
    with pytest.raises(tileattn.FlexCompileError, match=r"captured tensor .* of shape \(0,\) is empty"):
        tileattn.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + empty[h])
    elsewhere = torch.zeros(2, device="meta")
    with pytest.raises(ValueError, match="score_mod's captured tensor 0 .* is on meta"):
        tileattn.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + elsewhere[h])
    bm = flex_mod.create_block_mask(mods.causal, None, None, 32, 32, device=device, BLOCK_SIZE=16)
    bm = flex_mod.BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, BLOCK_SIZE=16, seq_lengths=(32, 32),
                                           mask_mod=lambda b, h, qi, kv: (qi - kv).float())
    with pytest.raises(tileattn.FlexCompileError, match="mask_mod .*must return a bool tensor"):
        tileattn.flex_attention(q, k, v, block_mask=bm)

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm", "document", "alibi_causal",
                                  "softcap_causal", "rel_bias"])
def test_gpu_ready_mods(name, D, dtype, device):
    """The portable kernel on the GPU (forced: on sm90 the Hopper kernel would take these)."""
    S = 1000
    q, k, v = qkv(2, 4, S, S, D, dtype, device)
    score_mod, mask_mod = ready_mods(S, 4, device)[name]
    with tileattn.force_backend("flex.triton"):
        check(q, k, v, score_mod, mask_mod)


@pytest.mark.gpu
def test_gpu_gqa_odd(device):
    q, k, v = qkv(2, 8, 333, 517, 128, torch.bfloat16, device, hkv=2)
    check(q, k, v, mods.tanh_softcap(20.0), mods.sliding_window(100), gqa=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["causal", "sliding_window", "prefix_lm", "document", "document_causal",
                                  "alibi_causal", "softcap_causal", "rel_bias", "alibi_softcap"])
def test_gpu_sm90_ready_mods(name, D, dtype, device, sm90_fwd):
    """Whole 128 x 128 mask blocks on the Hopper kernel, checked to take it on sm90."""
    S = 1024
    q, k, v = qkv(2, 4, S, S, D, dtype, device)
    score_mod, mask_mod = ready_mods(S, 4, device)[name]
    check(q, k, v, score_mod, mask_mod)
    assert len(sm90_fwd) == (1 if on_sm90() else 0)


def on_sm90():
    return torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.parametrize("sq,sk", [(1000, 1000), (333, 517), (1024, 1000), (1000, 1024), (200, 129)])
@pytest.mark.parametrize("name", ["causal", "document", "alibi_causal", "softcap_causal", "alibi"])
def test_gpu_sm90_ragged_lengths(name, sq, sk, device, sm90_fwd):
    """Lengths that are not multiples of the mask's 128-blocks on the Hopper kernel: the last key block's padding
    keys are hidden (ALiBi without a mask would give them the largest scores), the last query block's padding
    rows are not stored."""
    H = 4
    q, k, v = qkv(2, H, sq, sk, 128, torch.bfloat16, device)
    mods_ = ready_mods(max(sq, sk), H, device)
    mods_["alibi"] = (mods.alibi(mods.alibi_slopes(H, device=device)), None)
    score_mod, mask_mod = mods_[name]
    check(q, k, v, score_mod, mask_mod)
    assert len(sm90_fwd) == (1 if on_sm90() else 0)


def ragged_full_block_case(H, device, sq=300, sk=333):
    """(block mask, visible [Sq, Sk], ALiBi slopes, ALiBi bias [H, Sq, Sk]) of a BlockMask made from block lists
    (BlockMask.from_kv_blocks, torch's default noop mask_mod: listed blocks are wholly visible) whose full lists
    hold the last, ragged key block first, in the middle and last, with and without partial blocks (torch's
    create_block_mask never makes it full)."""
    i32 = dict(dtype=torch.int32, device=device)
    num, idx = torch.tensor([[[1, 0, 1]]], **i32), torch.tensor([[[[0, 0, 0], [0, 0, 0], [1, 0, 0]]]], **i32)
    fnum = torch.tensor([[[1, 3, 2]]], **i32)
    fidx = torch.tensor([[[[2, 0, 0], [0, 2, 1], [0, 2, 0]]]], **i32)
    bm = flex_mod.BlockMask.from_kv_blocks(num, idx, fnum, fidx, BLOCK_SIZE=128, seq_lengths=(sq, sk))
    visible = torch.zeros(384, 384, dtype=torch.bool, device=device)
    for n, ix in ((num, idx), (fnum, fidx)):
        for i, row in enumerate(ix[0, 0].tolist()):
            for j in row[:n[0, 0, i]]:
                visible[128 * i:128 * (i + 1), 128 * j:128 * (j + 1)] = True
    slopes = mods.alibi_slopes(H, device=device)
    bias = slopes[:, None, None] * (torch.arange(sk, device=device)[None, :] -
                                    torch.arange(sq, device=device)[:, None])[None]
    return bm, visible[:sq, :sk], slopes, bias


@pytest.mark.gpu
def test_gpu_sm90_ragged_full_block(device, sm90_fwd):
    """A block mask whose full lists hold the last, ragged key block: its padding keys stay hidden though no
    mask_mod runs there, under an ALiBi score mod that would give them the largest scores."""
    sq, sk, H = 300, 333, 2
    q, k, v = qkv(1, H, sq, sk, 64, torch.float16, device)
    bm, visible, slopes, bias = ragged_full_block_case(H, device, sq, sk)
    out, lse = tileattn.flex_attention(q, k, v, score_mod=mods.alibi(slopes), block_mask=bm, return_lse=True)

    def ref(dtype):
        s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)).float() * 64 ** -0.5 + bias
        s = s.masked_fill(~visible, float("-inf"))
        return (torch.softmax(s, -1).to(dtype) @ v.to(dtype)).float(), torch.logsumexp(s, -1)
    (r, rl), (lp, lpl) = ref(torch.float32), ref(torch.float16)
    assert_close("out", out, r, lp)
    assert_close("lse", lse, rl, lpl)
    assert len(sm90_fwd) == (1 if on_sm90() else 0)


@pytest.mark.gpu
def test_gpu_sm90_gqa_broadcast_mask(device):
    q, k, v = qkv(2, 8, 512, 1024, 128, torch.bfloat16, device, hkv=2)

    def mask(b, h, q_idx, kv_idx):
        return ((kv_idx // 128) % 3 != 1) & (kv_idx <= q_idx + 512) & (q_idx % 5 != 3)
    check(q, k, v, mods.alibi(mods.alibi_slopes(8, device=device)), mask, gqa=True, mask_b=1, mask_h=1)
    check(q, k, v, mods.tanh_softcap(10.0), None, gqa=True)


def check_fp8(B, H, S, D, score_mod, mask_mod, device, hkv=None, packed_v=False, out_dtype=None,
              fp8=torch.float8_e4m3fn):
    """fp8 inputs (per-(batch, kv head) descales) against the reference on the dequantized values, P rounded to
    fp8 in the input-precision reference as the fp8 kernel rounds it."""
    from tileattn.ops.flex.reference import flex_ref
    hkv = hkv or H
    q, k, v = qkv(B, H, S, S, D, torch.float32, device, hkv=hkv)
    q8, qd = tileattn.quantize_fp8(q.transpose(1, 2), fp8, group=H // hkv)
    k8, kd = tileattn.quantize_fp8(k.transpose(1, 2), fp8)
    v8, vd = tileattn.quantize_fp8(v.transpose(1, 2), fp8)
    value = tileattn.fp8_v_layout(v8) if packed_v else v8.transpose(1, 2)
    bm = flex_mod.create_block_mask(mask_mod, B, H, S, S, device=device) if mask_mod else None
    out, lse = tileattn.flex_attention(q8.transpose(1, 2), k8.transpose(1, 2), value, score_mod=score_mod,
                                       block_mask=bm, enable_gqa=hkv != H, return_lse=True, q_descale=qd,
                                       k_descale=kd, v_descale=vd, out_dtype=out_dtype)
    deq = [(x.float() * d.repeat_interleave(g, dim=1)[:, None, :, None]).transpose(1, 2)
           for x, d, g in ((q8, qd, H // hkv), (k8, kd, 1), (v8, vd, 1))]
    ref, lse_ref = flex_ref(*deq, score_mod, mask_mod)
    lp = out_dtype or torch.bfloat16
    ref_lp, lse_lp = flex_ref(*deq, score_mod, mask_mod, dtype=lp if device != "cpu" else torch.float16,
                              quantize_p=fp8 if device != "cpu" else None)
    assert out.dtype == (out_dtype or torch.bfloat16)
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp)


def test_fp8_dequantized_path(device):
    """fp8 inputs where the Hopper kernel does not serve them (here: the interpreter, ragged lengths): the
    inputs are dequantized and the portable kernel runs."""
    if device != "cpu":
        pytest.skip("the CPU run covers the dequantized path")
    check_fp8(1, 2, 70, 32, mods.alibi(mods.alibi_slopes(2)), mods.causal, device, out_dtype=torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("packed_v", [False, True], ids=["plain_v", "fp8v"])
@pytest.mark.parametrize("name", ["causal", "document", "alibi_causal", "softcap_causal"])
def test_gpu_fp8_flex(name, packed_v, fp8, device):
    S = 1024
    score_mod, mask_mod = ready_mods(S, 4, device)[name]
    check_fp8(2, 4, S, 128, score_mod, mask_mod, device, hkv=2, packed_v=packed_v, fp8=fp8)


@pytest.mark.gpu
@pytest.mark.parametrize("packed_v", [False, True], ids=["plain_v", "fp8v"])
@pytest.mark.parametrize("S", [1000, 77])
@pytest.mark.parametrize("name", ["causal", "alibi_causal"])
def test_gpu_fp8_flex_ragged(name, S, packed_v, device, sm90_fwd):
    """fp8 on the Hopper kernel at lengths that are not multiples of the mask's blocks (D = 64 and 128)."""
    score_mod, mask_mod = ready_mods(S, 4, device)[name]
    for D in (64, 128):
        check_fp8(2, 4, S, D, score_mod, mask_mod, device, hkv=2, packed_v=packed_v)
    assert len(sm90_fwd) == (2 if on_sm90() else 0)


@pytest.mark.parametrize("block", [32, 128])
def test_random_block_mask(block, device):
    """A mask_mod reading a random table of blocks (empty, full and partial blocks in the block mask: the table
    is per 16-key group, finer than the mask's blocks), and a score_mod from a random bias table by head."""
    if device == "cpu" and block == 128:
        pytest.skip("128-blocks: the GPU run")
    S = 256 if device == "cpu" else 1024
    H = 2
    table = torch.rand(S // 16, S // 16, device=device) < 0.6
    table[3] = False  # a query group that sees only its own 64-key block
    bias = randn(H, 4, dtype=torch.float32, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        return table[q_idx // 16, kv_idx // 16] | ((q_idx // 64) == (kv_idx // 64))

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h, kv_idx % 4]
    q, k, v = qkv(2, H, S, S, 64, DT if device == "cpu" else torch.bfloat16, device)
    check(q, k, v, score_mod, mask_mod, block=(block, block))


POWER_MODS = {  # `**` with negative bases: whole constant exponents, a negative one, a fractional one, a tensor one
    "square_of_distance": lambda s, b, h, qi, kv: s - 0.01 * (qi - kv).float() ** 2,
    "int_cube": lambda s, b, h, qi, kv: s + 1e-5 * ((qi - kv) ** 3).float(),
    "inverse": lambda s, b, h, qi, kv: s + 0.1 * ((qi - kv).float() + 0.5) ** -1,
    "fractional": lambda s, b, h, qi, kv: s + 0.01 * (qi - kv).abs().float() ** 1.5,
    "tensor_exponent": lambda s, b, h, qi, kv: s + 0.01 * ((qi - kv).float() ** (qi % 3).float()).clamp(-5, 5),
    "score_squared": lambda s, b, h, qi, kv: s - 0.1 * s ** 2,
}


@pytest.mark.parametrize("name", list(POWER_MODS))
def test_power_with_negative_base(name, device):
    """`**` follows torch's signs (a negative base to a whole power keeps or flips its sign) instead of the NaN
    that exp2(log2(a) * b) gives."""
    q, k, v = qkv(1, 2, 64, 64, 32, DT, device)
    out = tileattn.flex_attention(q, k, v, score_mod=POWER_MODS[name])
    assert not out.isnan().any()
    check(q, k, v, POWER_MODS[name], None)


def test_power_keeps_integer_dtype():
    """An integer base to a constant whole power stays an integer product, as in torch (exact, no float round
    trip)."""
    from tileattn.ops.flex.trace import _int_power
    assert _int_power("x", 5) == "(x * ((x * x) * (x * x)))"
    assert _int_power("x", 0) == "(x * 0 + 1)"
    assert _int_power("x", -2) == "(1.0 / ((x * x)))"
    assert _int_power("x", 2.0) == "(((x).to(tl.float32) * (x).to(tl.float32)))"


def test_index_differences_in_float32(device):
    """An index difference that meets a float (ALiBi's slope * (kv_idx - q_idx)) is evaluated in float32 from the
    converted index vectors (one float add per score instead of an integer add and a conversion), with the
    same results; lengths past 2^24, where float32 positions would round, are refused."""
    from tileattn.ops.flex.trace import compile_mod
    H = 2
    slopes = mods.alibi_slopes(H, device=device)
    assert "(kv_idx_f - q_idx_f)" in compile_mod(mods.alibi(slopes), "score").source

    def mixed(s, b, h, qi, kv):
        return s + slopes[h] * (kv - qi) + (qi - 5).float() * 0.01 - (kv - qi) / 7 + (-kv).float() * 1e-3

    src = compile_mod(mixed, "score").source
    assert "(q_idx_f - 5.0)" in src and "(0.0 - kv_idx_f)" in src
    # a float16 value computes with an integer in float16, not float32: no float form there
    half = slopes.half()
    fp16_src = compile_mod(lambda s, b, h, qi, kv: s + half[h] * (kv - qi), "score").source
    assert "(kv_idx_f - q_idx_f)" not in fp16_src
    q, k, v = qkv(1, H, 80, 96, 32, DT, device)
    check(q, k, v, mixed, mods.causal, block=(32, 32))
    check(q, k, v, mods.alibi(slopes), None)
    long = torch.empty(1, H, 1, 32, dtype=DT, device=device).expand(1, H, 2 ** 24 + 1, 32)
    with pytest.raises(ValueError, match="sequence lengths"):
        tileattn.flex_attention(q, long, long)


def bias_mods(H, S, device):
    """Score mods of the form a(b, h) * s + R(b, h, q_idx) + C(b, h, kv_idx): ALiBi, per-key and per-query biases,
    a per-head temperature, a constant derivative with respect to the score."""
    slopes = mods.alibi_slopes(H, device=device)
    kb = randn(S + 16, dtype=torch.float32, device=device)
    qb = randn(2, S, dtype=torch.float32, device=device)
    temp = torch.rand(H, device=device) + 0.5
    return {
        "alibi": mods.alibi(slopes),
        "key_bias": lambda s, b, h, qi, kv: s + kb[kv] * 2.0,
        "query_bias": lambda s, b, h, qi, kv: s - qb[b, qi] + (qi // 3).float(),
        "temperature": lambda s, b, h, qi, kv: -(s / temp[h]) + 1.5,
        "mixed": lambda s, b, h, qi, kv: (s * 2 + (kv - qi) * slopes[h] - qi * 0.25) / 3.0 + kv,
    }


def test_bias_score_mods(device):
    """Score mods adding per-query and per-key terms (and a per-head temperature): the same output and lse as
    torch's flex_attention, rows that see no key included."""
    H, S = 2, 72
    q, k, v = qkv(2, H, S, S + 9, 32, DT, device)

    def rows_cut(b, h, q_idx, kv_idx):  # rows 0-9 see no key
        return (q_idx > 9) & (kv_idx <= q_idx + 3)
    for name, fn in bias_mods(H, S, device).items():
        check(q, k, v, fn, rows_cut if name in ("alibi", "query_bias") else None, block=(16, 32))


def test_block_mask_from_kv_blocks_default_mask_mod(device):
    """A BlockMask built from block lists alone (BlockMask.from_kv_blocks: torch's default noop mask_mod) runs:
    its listed blocks are wholly visible, the same as a block-causal mask_mod's."""
    S = 256
    q, k, v = qkv(1, 2, S, S, 32, DT, device)
    num = torch.tensor([1, 2], dtype=torch.int32, device=device).expand(1, 2, 2).contiguous()
    idx = torch.tensor([[0, 1], [0, 1]], dtype=torch.int32, device=device).expand(1, 2, 2, 2).contiguous()
    bm = flex_mod.BlockMask.from_kv_blocks(num, idx)
    out = tileattn.flex_attention(q, k, v, block_mask=bm)
    check(q, k, v, None, lambda b, h, qi, kv: kv // 128 <= qi // 128, block=(128, 128))
    same = tileattn.flex_attention(q, k, v, block_mask=flex_mod.create_block_mask(
        lambda b, h, qi, kv: kv // 128 <= qi // 128, 1, 2, S, S, device=device))
    torch.testing.assert_close(out, same, rtol=0, atol=0)


def test_create_block_mask_exported():
    """tileattn.create_block_mask (named in flex_attention's docstring) is torch's: its masks serve both."""
    assert tileattn.create_block_mask is flex_mod.create_block_mask
    assert "create_block_mask" in tileattn.__all__


def test_mod_cache_no_stale_ids(device):
    """Mods made per call that capture an object whose number they bake in (a module's attribute, keyed by the
    object's identity): a freed object's id taken by a new one must not hit the old trace (the cache holds the
    functions it keys)."""
    from tileattn.ops.flex.reference import flex_ref

    class Scaled(torch.nn.Module):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

            def score_mod(score, b, h, q_idx, kv_idx):
                return score * self.factor
            self.score_mod = score_mod
    q, k, v = qkv(1, 2, 32, 32, 16, DT, device)
    for i in range(12):
        m = Scaled(0.25 * (i + 1))
        out = tileattn.flex_attention(q, k, v, score_mod=m.score_mod)
        ref, ref_lp = (flex_ref(q, k, v, m.score_mod, dtype=dt)[0] for dt in (torch.float32, DT))
        assert_close(f"out factor={m.factor}", out, ref, ref_lp)
        del m
