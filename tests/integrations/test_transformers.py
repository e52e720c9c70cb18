"""tileattn as a transformers attention implementation (tileattn.integrations.transformers).

Each model is built three times with one set of random weights: ours (attn_implementation="tileattn", float16 or
bfloat16), the reference in float32 ("sdpa", or "eager" where SDPA has no softcap: Gemma 2), and the reference in
our dtype. Logits and gradients follow the tolerance rule: max|ours - ref32| <= 2 * max|ref_lp - ref32| + the
rounding floor. Greedy tokens must equal the float32 reference's, unless they part at a step where its top-2 logits
are within twice the allowed logit error (a tie that rounding may break either way).

Runs without a GPU (Triton interpreter) take tiny models in float16 (the interpreter's bf16 dots are wrong); the
gpu-marked tests take Llama, Qwen2 and Gemma 2 models of hidden size 256 in float16 and bfloat16.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, Qwen2Config, masking_utils  # noqa: E402

import tileattn  # noqa: E402
from tileattn.integrations import transformers as tileattn_hf  # noqa: E402
from tileattn.tolerance import allowed_error  # noqa: E402

from tests.helpers import assert_close  # noqa: E402

NAME = tileattn_hf.register()
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, vocab_size=128, max_position_embeddings=128, pad_token_id=0)


def _models(cfg, dtype, device, ref="sdpa"):
    """(ours, ref32, ref_lp): one set of random weights; ours switched with set_attn_implementation."""
    ref32 = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=ref).to(device).eval()
    ref_lp = copy.deepcopy(ref32).to(dtype)
    ours = copy.deepcopy(ref_lp)
    ours.set_attn_implementation(NAME)
    return ours, ref32, ref_lp


@torch.no_grad()
def _check_logits(name, models, ids, mask=None):
    """The tolerance rule on the logits of the real tokens; returns the allowed error."""
    ours, ref32, ref_lp = (m(ids, attention_mask=mask).logits for m in models)
    keep = (slice(None),) if mask is None else (mask.bool(),)
    assert_close(name, ours[keep], ref32[keep], ref_lp[keep])
    return allowed_error((ref_lp[keep].float() - ref32[keep]).abs().max().item(), ref32[keep], ours.dtype)


@torch.no_grad()
def _decode_logits(model, ids, prefix, mask=None):
    """The logits of positions prefix - 1 .. S - 1 as generation computes them: ids[:, :prefix] prefilled into the
    model's own cache (a DynamicCache, sliding-window layers included), then one token per step."""
    part = (lambda t: None) if mask is None else (lambda t: mask[:, :t])
    out = model(ids[:, :prefix], attention_mask=part(prefix), use_cache=True)
    logits = [out.logits[:, -1:]]
    for t in range(prefix, ids.shape[1]):
        out = model(ids[:, t:t + 1], attention_mask=part(t + 1), past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits)
    return torch.cat(logits, 1)


def _check_decode(name, models, ids, prefix, mask=None):
    """Cached decode of ours against the float32 reference's full forward; ref_lp's cached decode as the error."""
    ours, ref_lp = (_decode_logits(m, ids, prefix, mask) for m in (models[0], models[2]))
    with torch.no_grad():
        ref32 = models[1](ids, attention_mask=mask).logits[:, prefix - 1:]
    keep = (slice(None),) if mask is None else (mask[:, prefix - 1:].bool(),)
    assert_close(name, ours[keep], ref32[keep], ref_lp[keep])


def _check_generate_logits(name, models, ids, new_tokens, **gen_kw):
    """The logits of ours' greedy steps (prefill, then decode over the cache generate makes) against the full
    forward of the tokens it chose. Inputs without padding: generate and forward then agree on the positions."""
    out = models[0].generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True, **gen_kw)
    ref_lp = _decode_logits(models[2], out.sequences[:, :-1], ids.shape[1])  # the same tokens, decoded by ref_lp
    with torch.no_grad():
        ref32 = models[1](out.sequences[:, :-1]).logits[:, ids.shape[1] - 1:]
    assert_close(name, torch.stack(out.logits, 1).to(ref_lp.dtype), ref32, ref_lp)


def _check_greedy(ours, ref32, ids, mask, new_tokens, tol, **gen_kw):
    """Greedy tokens of ours equal ref32's up to each row's first difference, where ref32's top-2 logits must be
    within tol (a near tie that rounding may break either way); later tokens follow different prefixes."""
    kw = dict(attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
              pad_token_id=0, **gen_kw)
    got = ours.generate(ids, **kw)[:, ids.shape[1]:]
    ref = ref32.generate(ids, output_scores=True, return_dict_in_generate=True, **kw)
    want = ref.sequences[:, ids.shape[1]:]
    assert got.shape == want.shape
    for b in range(len(got)):
        diff = (got[b] != want[b]).nonzero()
        if len(diff):
            t = int(diff[0])
            top2 = ref.scores[t][b].float().topk(2).values
            gap = (top2[0] - top2[1]).item()
            assert gap <= tol, (f"row {b}: greedy token {t} is {int(got[b, t])}, the reference's {int(want[b, t])}, "
                                f"whose top-2 logits are {gap:.3e} apart (> {tol:.3e})")


@pytest.fixture
def calls(monkeypatch):
    """Counts the tileattn calls the integration makes (a test must not pass on the SDPA fallback)."""
    seen = {"attention": 0, "varlen_attention": 0}

    def counted(name, fn):
        def spy(*args, **kw):
            seen[name] += 1
            return fn(*args, **kw)
        return spy
    for name in seen:
        monkeypatch.setattr(tileattn, name, counted(name, getattr(tileattn, name)))
    return seen


def test_register_is_idempotent():
    from transformers import AttentionInterface
    assert tileattn_hf.register() == tileattn_hf.register() == "tileattn"
    assert AttentionInterface._global_mapping["tileattn"] is tileattn_hf.attention_forward
    assert masking_utils.AttentionMaskInterface._global_mapping["tileattn"] is tileattn_hf.build_mask


def test_llama_gqa_prefill_and_greedy_decode(device, calls):
    models = _models(LlamaConfig(**TINY), torch.float16, device)
    ids = torch.randint(1, 128, (2, 12), device=device)
    tol = 2 * _check_logits("logits", models, ids)
    assert calls == {"attention": 2, "varlen_attention": 0}
    _check_greedy(models[0], models[1], ids, None, 4, tol)
    # a static cache: its empty slots after the last query are cut off (compiling generate is not what is tested)
    _check_generate_logits("static cache logits", models, ids, 3, cache_implementation="static", disable_compile=True)


def test_qwen2_padding_and_sliding_window(device, calls):
    """Left and right padding through varlen_attention; a sliding-window layer (w = 4: HF's SDPA mask keeps
    kv_idx > q_idx - 4) in prefill and in decode over the sliding cache (it keeps w - 1 tokens)."""
    cfg = Qwen2Config(**TINY, use_sliding_window=True, sliding_window=4, max_window_layers=0,
                      layer_types=["sliding_attention", "full_attention"])
    models = _models(cfg, torch.float16, device)
    assert models[0].model.layers[0].self_attn.sliding_window == 4
    assert models[0].model.layers[1].self_attn.sliding_window is None
    ids = torch.randint(1, 128, (2, 12), device=device)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0   # left padding
    mask[1, 9:] = 0   # right padding
    _check_logits("logits, no padding", models, ids)
    _check_logits("logits, padded", models, ids, mask)
    assert calls["varlen_attention"] == 2
    mask[1] = 1
    mask[1, :2] = 0
    tol = 2 * _check_logits("logits, left padding", models, ids, mask)
    _check_greedy(models[0], models[1], ids, mask, 4, tol)
    _check_greedy(models[0], models[1], ids, mask, 6, tol, cache_implementation="static", disable_compile=True)


def test_gemma2_softcap_window_scaling_decode(device, calls):
    """Gemma 2: softcap 1 (scores of a few units: the cap bites), window 4, scaling 16 ** -0.5 (not D ** -0.5);
    reference "eager" (SDPA has no softcap). Prefill logits, then decode steps over the cache."""
    cfg = Gemma2Config(**TINY, sliding_window=4, query_pre_attn_scalar=16, attn_logit_softcapping=1.0,
                       initializer_range=0.2, layer_types=["sliding_attention", "full_attention"])
    models = _models(cfg, torch.float16, device, ref="eager")
    ids = torch.randint(1, 128, (2, 12), device=device)
    _check_logits("logits", models, ids)
    _check_decode("decode logits", models, ids, 8)
    assert calls["varlen_attention"] == 0 and calls["attention"] == 2 + 2 * 5


def _check_training(models, ids, masks, names):
    """One training step per attention mask (labels -100 on padding): the gradients of `names` under the rule; the
    loss within twice the logits' allowed error (a cross-entropy moves at most 2x its logits' largest change)."""
    results = []
    for m in models:
        m.train()
        params = dict(m.named_parameters())
        steps = []
        for mask in masks:
            m.zero_grad(set_to_none=True)
            labels = ids if mask is None else ids.masked_fill(mask == 0, -100)
            out = m(ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            steps.append((out.loss.item(), out.logits.detach(), [params[n].grad.clone() for n in names]))
        results.append(steps)
    for i, mask in enumerate(masks):
        (loss, logits, grads), (loss_ref, logits_ref, grads_ref), (loss_lp, logits_lp, grads_lp) = (
            steps[i] for steps in results)
        what = "dense batch" if mask is None else "padded batch"
        tol = 2 * allowed_error((logits_lp.float() - logits_ref).abs().max().item(), logits_ref, logits.dtype)
        assert abs(loss - loss_ref) <= tol, f"{what}: loss {loss} vs {loss_ref} (> {tol:.3e} apart)"
        for n, g, g_ref, g_lp in zip(names, grads, grads_ref, grads_lp):
            assert_close(f"{what}: grad {n}", g, g_ref, g_lp)


def test_training_step(device, calls):
    """Loss and gradients of a padded batch (varlen forward and backward) against SDPA's."""
    models = _models(LlamaConfig(**TINY), torch.float16, device)
    ids = torch.randint(1, 128, (2, 12), device=device)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    _check_training(models, ids, [mask], ["model.layers.0.self_attn.q_proj.weight", "model.embed_tokens.weight",
                                          "model.layers.0.self_attn.k_proj.weight",
                                          "model.layers.1.self_attn.v_proj.weight"])
    assert calls["varlen_attention"] == 2


def test_bert_encoder_padding(device, calls):
    """A non-causal encoder (BERT, right padding): every query row attends to the sequence's tokens, as in SDPA."""
    if not hasattr(masking_utils, "bidirectional_mask_function"):
        pytest.skip("transformers < 5 builds BERT's masks outside masking_utils")
    from transformers import AutoModel, BertConfig
    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                     vocab_size=128, max_position_embeddings=64)
    ref32 = AutoModel.from_config(cfg, attn_implementation="sdpa").to(device).eval()
    ref_lp = copy.deepcopy(ref32).half()
    ours = copy.deepcopy(ref_lp)
    ours.set_attn_implementation(NAME)
    ids = torch.randint(1, 128, (2, 12), device=device)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        out, ref, lp = (m(ids, attention_mask=mask).last_hidden_state for m in (ours, ref32, ref_lp))
    keep = mask.bool()
    assert_close("last_hidden_state", out[keep], ref[keep], lp[keep])
    assert calls == {"attention": 0, "varlen_attention": 2}


class _Attn(torch.nn.Module):
    """The attributes transformers' attention functions read from an attention module."""
    def __init__(self, causal, groups):
        super().__init__()
        self.is_causal, self.num_key_value_groups = causal, groups


# (causal, Sq, Sk, padding [left, right] per row, or "packed", or None, sliding_window)
DIRECT_CASES = [(False, 6, 6, None, None), (False, 6, 6, [(0, 2), (1, 0)], None),
                (False, 5, 9, [(0, 3), (0, 0)], None), (True, 1, 9, [(3, 0), (0, 0)], 4),
                (True, 3, 9, [(2, 0), (0, 0)], None), (True, 7, 7, [(0, 3), (2, 0)], 3), (True, 8, 8, "packed", 3)]


def _case_id(c):
    return f"c{c[0]:d}-Sq{c[1]}-Sk{c[2]}-pad{int(bool(c[3]))}-w{c[4]}"


@pytest.mark.parametrize("case", DIRECT_CASES, ids=_case_id)
def test_attention_forward_direct(case, device):
    """attention_forward as transformers calls it (encoders, cross-attention, decode, chunked prefill), on
    tileattn's path and on the SDPA fallback (a dropout of 1e-9 takes it), against a masked float32 SDPA."""
    causal, Sq, Sk, pads, w = case
    q = torch.randn(2, 4, Sq, 32, device=device).half()
    k, v = (torch.randn(2, 2, Sk, 32, device=device).half() for _ in range(2))
    mask = None
    if pads == "packed":  # row 0: sequences of 3 and 5 tokens; row 1: one of 8
        mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0] * 8], device=device)
    elif pads:
        mask = torch.ones(2, Sk, dtype=torch.bool, device=device)
        for b, (left, right) in enumerate(pads):
            mask[b, :left] = False
            mask[b, Sk - right:] = False
    i = torch.arange(Sq, device=device)[:, None] + Sk - Sq
    j = torch.arange(Sk, device=device)[None, :]
    vis = (j <= i) if causal else torch.ones(Sq, Sk, dtype=torch.bool, device=device)
    if w is not None:
        vis = vis & (j > i - w) & ((j < i + w) if not causal else True)
    if pads == "packed":
        vis, mask_q = vis[None, None] & (mask[:, None, :, None] == mask[:, None, None, :]), None
    else:
        vis, mask_q = vis[None, None] & (True if mask is None else mask[:, None, None, :]), mask
    # query rows that see no key, and (causal) padding query rows, read 0
    live = vis.any(-1)[:, 0, :, None, None]
    if mask_q is not None and causal:
        live = live & mask_q[:, Sk - Sq:, None, None]
    ref32, ref_lp = (torch.where(live, F.scaled_dot_product_attention(
        q.to(dt), k.to(dt).repeat_interleave(2, 1), v.to(dt).repeat_interleave(2, 1), attn_mask=vis,
        scale=0.3).transpose(1, 2), 0) for dt in (torch.float32, torch.float16))
    for dropout in (0.0, 1e-9):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, weights = tileattn_hf.attention_forward(_Attn(causal, 2), q, k, v, mask, scaling=0.3, dropout=dropout,
                                                         sliding_window=w, softcap=None)
        assert weights is None and out.shape == (2, Sq, 4, 32) and out.is_contiguous()
        assert_close(f"out (dropout {dropout})", out, ref32, ref_lp)


def test_packed_sequences(device, calls):
    """Sequences packed in a row (position_ids restart, no mask, no cache): one varlen call, as SDPA's packed mask."""
    models = _models(LlamaConfig(**TINY), torch.float16, device)
    ids = torch.randint(1, 128, (2, 12), device=device)
    pos = torch.stack([torch.cat([torch.arange(5), torch.arange(7)]), torch.arange(12)]).to(device)
    with torch.no_grad():
        got, ref, lp = (m(ids, position_ids=pos, use_cache=False).logits for m in models)
        unpacked = models[1](ids, use_cache=False).logits
    assert_close("packed logits", got, ref, lp)
    assert calls == {"attention": 0, "varlen_attention": 2}
    assert (unpacked - ref).abs().max() > 0.1  # the packing matters


def test_fallbacks_and_errors(device, calls, monkeypatch):
    monkeypatch.setattr(tileattn_hf, "_warned", set())  # each fallback warns once a process
    cfg = LlamaConfig(**TINY)
    ours, ref32, ref_lp = models = _models(cfg, torch.float16, device)
    ids = torch.randint(1, 128, (2, 12), device=device)
    # a custom 4-D mask (causal, and no key 3): SDPA runs it, with a warning
    mask = torch.ones(12, 12, dtype=torch.bool, device=device).tril()
    mask[4:, 3] = False
    mask = mask.expand(2, 1, 12, 12)
    with pytest.warns(UserWarning, match="4-D attention mask"), torch.no_grad():
        got, ref, lp = (m(ids, attention_mask=mask).logits for m in models)
    assert_close("4-D mask logits", got, ref, lp)
    assert calls == {"attention": 0, "varlen_attention": 0}
    with pytest.raises(ValueError, match="output_attentions"), torch.no_grad():
        ours(ids, output_attentions=True)
    fp32 = copy.deepcopy(ref32)
    fp32.set_attn_implementation(NAME)
    with pytest.raises(TypeError, match="float16 / bfloat16"), torch.no_grad():
        fp32(ids)
    with torch.no_grad():
        ref, lp = ref32(ids).logits, ref_lp(ids).logits
        with torch.autocast(device, dtype=torch.float16):  # float32 weights, float32 queries cast to float16
            got = fp32(ids).logits
    assert_close("autocast logits", got, ref, lp)
    assert calls["attention"] == 2


def test_build_mask():
    causal = masking_utils.causal_mask_function
    pad = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)  # generate's mask of a static cache
    kw = dict(batch_size=2, mask_function=causal, q_length=1, q_offset=torch.tensor(3))
    assert tileattn_hf.build_mask(kv_length=6, attention_mask=pad, **kw).tolist() == pad[:, :4].tolist()
    assert tileattn_hf.build_mask(kv_length=2, attention_mask=pad, kv_offset=2, **kw) is None  # a sliding layer
    # no mask: a static cache's keys after the last query are empty slots (transformers >= 5 says where it is)
    assert tileattn_hf.build_mask(kv_length=6, **kw).tolist() == [[True] * 4] * 2
    assert tileattn_hf.build_mask(kv_length=4, **{**kw, "q_offset": 3}) is None
    assert tileattn_hf.build_mask(batch_size=2, kv_length=6, mask_function=causal, attention_mask=pad) is not None


def test_mask_patterns():
    mu, pattern = masking_utils, tileattn_hf._pattern
    packed = torch.tensor([[0, 0, 1, 1]])
    assert pattern(mu.causal_mask_function) == pattern(mu.sliding_window_causal_mask_function(4)) == ("causal", None)
    kind, seq = pattern(mu.and_masks(mu.sliding_window_causal_mask_function(4),
                                     mu.packed_sequence_mask_function(packed)))
    assert kind == "causal" and seq is packed
    assert pattern(mu.or_masks(mu.causal_mask_function, lambda b, h, q, kv: q >= 0)) == (None, None)
    assert pattern(mu.and_masks(mu.causal_mask_function, lambda b, h, q, kv: q >= 0)) == (None, None)
    assert pattern(mu.packed_sequence_mask_function(packed)) == (None, packed)


# --- GPU: Llama, Qwen2 (MQA, attention bias, sliding-window layers), Gemma 2 (softcap, sliding window, scaling) ---

GPU = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
           head_dim=64, vocab_size=1024, max_position_embeddings=1024, pad_token_id=0)
SLIDING = ["sliding_attention", "full_attention"] * 2
GPU_MODELS = {
    "llama": (lambda: LlamaConfig(**GPU), "sdpa"),
    "qwen2": (lambda: Qwen2Config(**{**GPU, "num_key_value_heads": 1}, use_sliding_window=True, sliding_window=32,
                                  max_window_layers=0, layer_types=SLIDING), "sdpa"),
    # init 0.05: scores of a few units, so the softcap of 5 changes the logits (by ~0.4 of ~5)
    "gemma2": (lambda: Gemma2Config(**GPU, sliding_window=32, query_pre_attn_scalar=48, attn_logit_softcapping=5.0,
                                    initializer_range=0.05, layer_types=SLIDING), "eager"),
}
GPU_DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("model", list(GPU_MODELS))
def test_gpu_inference(model, dtype, device, calls):
    make_cfg, ref = GPU_MODELS[model]
    models = _models(make_cfg(), dtype, device, ref=ref)
    ids = torch.randint(1, 1024, (3, 128), device=device)
    _check_logits("logits", models, ids)
    assert calls["attention"] == 4
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    mask[2, :90] = 0  # left padding, as generation pads
    tol = 2 * _check_logits("padded logits", models, ids, mask)
    assert calls["varlen_attention"] == 4
    _check_decode("decode logits", models, ids, 112)
    _check_decode("padded decode logits", models, ids, 112, mask)
    _check_greedy(models[0], models[1], ids, mask, 16, tol)
    _check_generate_logits("static cache logits", models, ids[:, :100], 16, cache_implementation="static",
                           disable_compile=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("model", list(GPU_MODELS))
def test_gpu_training_step(model, dtype, device, calls):
    make_cfg, ref = GPU_MODELS[model]
    ids = torch.randint(1, 1024, (2, 128), device=device)
    mask = torch.ones_like(ids)
    mask[1, 100:] = 0  # right padding, as training batches pad
    _check_training(_models(make_cfg(), dtype, device, ref=ref), ids, [None, mask],
                    ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                     "model.layers.3.self_attn.v_proj.weight", "model.embed_tokens.weight"])
    assert calls["attention"] == 4 and calls["varlen_attention"] == 4
