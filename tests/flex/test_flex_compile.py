"""flex_attention under torch.compile(fullgraph=True): the registered ops (ops/flex/custom_ops.py) and the mods'
host and traced halves (ops/flex/captures.py).

aot_eager (no C++ compiler needed on the CPU) runs the same kernels as an eager call, so compiled outputs and
gradients must equal eager ones exactly; eager flex_attention is checked against references in test_flex*.py.
The GPU test compiles a model step with inductor.
"""
import pytest
import torch
import torch._dynamo.testing

import tileattn
from tileattn import mods
from tileattn.ops.flex import captures
from tileattn.ops.flex.problem import FlexOptions

from tests.flex.test_flex import DT, qkv
from tests.helpers import assert_close, randn


def make_alibi(slopes):
    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)
    return alibi


def counted(fn, **kw):
    """(torch.compile(fn, fullgraph=True) on aot_eager, its compile counter)."""
    cnt = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    return torch.compile(fn, backend=cnt, fullgraph=True, **kw), cnt


def block_mask(mask_mod, B, H, S, device, block=(16, 32)):
    return tileattn.create_block_mask(mask_mod, B, H, S, S, device=device, BLOCK_SIZE=block)


def assert_equal(name, got, ref):
    assert got.dtype == ref.dtype and got.shape == ref.shape, name
    assert not got.isnan().any(), f"{name}: NaN"
    assert torch.equal(got, ref), f"{name}: max difference {(got.float() - ref.float()).abs().max().item():.3e}"


def test_compile_captured_score_mod(device):
    """(a) A score mod reading a captured float32 tensor (ALiBi): out and lse equal to eager. New values in
    the captured tensor, and a new tensor behind a new function of the same code, change the compiled output
    without a recompile."""
    H = 2
    q, k, v = qkv(1, H, 40, 40, 16, DT, device)
    slopes = mods.alibi_slopes(H, device=device)

    def fn(q, k, v, score_mod):
        out, lse = tileattn.flex_attention(q, k, v, score_mod=score_mod, return_lse=True)
        return out * 2, lse
    compiled, cnt = counted(fn)
    alibi = make_alibi(slopes)
    outs = []
    for mod in (alibi, alibi, make_alibi(randn(H, dtype=torch.float32, device=device))):
        got, ref = compiled(q, k, v, mod), fn(q, k, v, mod)
        assert_equal("out", got[0], ref[0])
        assert_equal("lse", got[1], ref[1])
        outs.append(got[0])
        slopes.mul_(-3.0)  # the next call reads these values
    assert cnt.frame_count == 1
    assert not torch.equal(outs[0], outs[1]) and not torch.equal(outs[1], outs[2])


def test_compile_block_mask_backward(device):
    """(b) A block mask whose mask_mod reads captured document ids, ALiBi, GQA, a ragged length, the lse in the
    loss: compiled out, lse and gradients (dq, dk, dv) equal to eager."""
    B, H, S = 1, 4, 72
    q, k, v = qkv(B, H, S, S, 16, DT, device, hkv=2)
    docs = mods.document_ids_from_lengths([30, 42], device=device)
    bm = block_mask(mods.document(docs, causal=True), B, 1, S, device)
    alibi = make_alibi(mods.alibi_slopes(H, device=device))
    w = randn(B, H, S, 16, dtype=torch.float32, device=device)
    w_lse = randn(B, H, S, dtype=torch.float32, device=device)

    def loss(q, k, v, bm):
        out, lse = tileattn.flex_attention(q, k, v, score_mod=alibi, block_mask=bm, enable_gqa=True,
                                           return_lse=True)
        return (out.float() * w).sum() + (lse * w_lse).sum(), out, lse
    compiled, cnt = counted(loss)
    results = []
    for f in (loss, compiled):
        x = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        val, out, lse = f(*x, bm)
        results.append((out, lse, *torch.autograd.grad(val, x)))
    for name, got, ref in zip(("out", "lse", "dq", "dk", "dv"), results[1], results[0]):
        assert_equal(name, got, ref)
    assert cnt.frame_count == 1


def test_compile_new_block_mask_no_recompile(device):
    """A new block mask per batch (new document ids, new lists, a new mask_mod function of the same code): the
    compiled graph reads them, no recompile."""
    B, H, S = 1, 2, 48
    q, k, v = qkv(B, H, S, S, 16, DT, device)

    def fn(q, k, v, bm):
        return tileattn.flex_attention(q, k, v, block_mask=bm)
    compiled, cnt = counted(fn)
    for lengths in ([20, 28], [5, 30, 13], [48]):
        bm = block_mask(mods.document(mods.document_ids_from_lengths(lengths, device=device)), B, H, S, device)
        assert_equal("out", compiled(q, k, v, bm), fn(q, k, v, bm))
    assert cnt.frame_count == 1


def test_compile_guards_mod_constants(device):
    """A number a mod bakes into its kernel (tanh_softcap's cap, composed after ALiBi) is guarded: another value
    recompiles and gives its own result; the first value's graph serves it again."""
    H = 2
    q, k, v = qkv(1, H, 32, 32, 16, DT, device)
    slopes = mods.alibi_slopes(H, device=device)

    def fn(q, k, v, score_mod):
        return tileattn.flex_attention(q, k, v, score_mod=score_mod)
    compiled, cnt = counted(fn)
    counts = []
    for cap in (0.5, 2.0, 0.5):
        mod = mods.compose_scores(mods.alibi(slopes), mods.tanh_softcap(cap))
        assert_equal(f"out cap={cap}", compiled(q, k, v, mod), fn(q, k, v, mod))
        counts.append(cnt.frame_count)
    assert counts[0] == 1 and counts[1] > 1 and counts[2] == counts[1]


WINDOW = 9  # read by band_mask as globals (the test sets them)
BAND_TABLE = None


def band_mask(b, h, q_idx, kv_idx):
    return ((q_idx - kv_idx).abs() <= WINDOW) | BAND_TABLE[kv_idx // 8]


class ScoredAttention(torch.nn.Module):
    """A score mod made in __init__ that reads the module's buffer and a number attribute through `self`."""

    def __init__(self, heads, device):
        super().__init__()
        self.register_buffer("bias", randn(heads, dtype=torch.float32, device=device))
        self.temperature = 0.5

        def score_mod(score, b, h, q_idx, kv_idx):
            return score * self.temperature + self.bias[h]
        self.score_mod = score_mod

    def forward(self, q, k, v, bm):
        return tileattn.flex_attention(q, k, v, score_mod=self.score_mod, block_mask=bm)


def test_compile_module_attributes_and_globals(device, monkeypatch):
    """Tensors reached through a captured module's attributes and through globals are graph inputs (new values:
    no recompile); a number attribute and a global number the kernels bake in are guarded (a new value
    recompiles and is used)."""
    B, H, S = 1, 2, 40
    q, k, v = qkv(B, H, S, S, 16, DT, device)
    monkeypatch.setitem(globals(), "BAND_TABLE", torch.rand(S // 8 + 1, device=device) < 0.5)
    model = ScoredAttention(H, device)
    compiled, cnt = counted(model)

    def check(name):
        bm = block_mask(band_mask, B, H, S, device)
        got = compiled(q, k, v, bm)
        fresh = ScoredAttention(H, device)  # eager, with nothing cached for its mod
        fresh.bias.copy_(model.bias)
        fresh.temperature = model.temperature
        assert_equal(name, got, fresh(q, k, v, bm))
    check("first")
    model.bias.mul_(-2.0)
    BAND_TABLE.logical_not_()
    check("new tensor values")
    assert cnt.frame_count == 1
    model.temperature = 0.25
    check("new attribute")
    monkeypatch.setitem(globals(), "WINDOW", 3)
    check("new global")


def test_compile_dynamic_shapes(device):
    """dynamic=True: symbolic lengths (and the block mask's BLOCK_SIZE, which Dynamo makes symbols too) serve
    several lengths with one graph."""
    H = 2
    alibi = mods.alibi(mods.alibi_slopes(H, device=device))

    def fn(q, k, v, bm):
        return tileattn.flex_attention(q, k, v, score_mod=alibi, block_mask=bm)
    compiled, cnt = counted(fn, dynamic=True)
    for S in (40, 57):
        q, k, v = qkv(1, H, S, S, 16, DT, device)
        bm = block_mask(mods.causal, 1, H, S, device)
        assert_equal(f"out S={S}", compiled(q, k, v, bm), fn(q, k, v, bm))
    assert cnt.frame_count == 1


def test_compile_errors(device):
    q, k, v = qkv(1, 2, 32, 32, 16, DT, device)
    slopes = mods.alibi_slopes(2, device=device)

    def inner_mod(q, k, v):
        def alibi(score, b, h, q_idx, kv_idx):
            return score + slopes[h] * (kv_idx - q_idx)
        return tileattn.flex_attention(q, k, v, score_mod=alibi)
    # (torch 2.11's Dynamo stops earlier, converting the function to a constant: "failed to convert closure
    # cell to Python constant")
    with pytest.raises(Exception, match="made outside the compiled function|closure cell"):
        torch.compile(inner_mod, backend="aot_eager", fullgraph=True)(q, k, v)

    def power(score, b, h, q_idx, kv_idx):
        return score ** score

    def no_derivative(q, k, v):
        return tileattn.flex_attention(q, k, v, score_mod=power)
    x = [t.requires_grad_() for t in (q, k, v)]
    with pytest.raises(Exception, match="differentiate"):
        torch.compile(no_derivative, backend="aot_eager", fullgraph=True)(*x)


def test_mod_plan_carries_dynamos_constant_mark():
    """captures.mod_plan sets by hand what torch._dynamo.assume_constant_result sets (no Dynamo import at load
    time): the decorator must still do just that."""
    def f():
        pass
    torch._dynamo.assume_constant_result(f)
    marks = vars(f)
    assert marks and all(getattr(captures.mod_plan, name, None) == val for name, val in marks.items())


def test_opcheck(device):
    """torch.library's consistency checks of flex_fwd (schema, fake against real) with captures and a full
    block mask's lists."""
    B, H, S = 1, 2, 48
    q, k, v = qkv(B, H, S, S, 16, DT, device)
    slopes = mods.alibi_slopes(H, device=device)
    bm = block_mask(mods.causal, B, H, S, device)
    lists = [getattr(bm, name) for name in FlexOptions.LISTS[:4]]
    digest = captures.mod_plan(make_alibi(slopes), "score", False)[0]  # traced and registered, as under Dynamo
    opts = FlexOptions(score=digest, n_score=1, q_block=16, kv_block=32,
                       lists="1111", scale=0.3, return_lse=True)
    torch.library.opcheck(torch.ops.tileattn.flex_fwd.default, (q, k, v, [slopes, *lists], opts.encode()),
                          test_utils=("test_schema", "test_faketensor"))


def test_options_round_trip():
    opts = FlexOptions(score="0123abcd", n_score=2, mask="ffee", n_mask=1, q_block=16, kv_block=64,
                       lists="11001100", scale=0.1 + 0.2, return_lse=True)
    assert FlexOptions.decode(opts.encode()) == opts
    assert FlexOptions.decode(FlexOptions().encode()) == FlexOptions()


@pytest.mark.gpu
def test_gpu_compiled_model_step(device):
    """A model compiled with inductor (fullgraph; its backward compiled with it): a linear projection to q, k,
    v, flex_attention with ALiBi (slopes a buffer the mod captures) and a causal block mask, an output
    projection, then loss.backward(): output, input and weight gradients as eager's (the rounding floor
    apart). A second step with new slopes reuses the graph."""
    B, S, H, D = 2, 256, 4, 64
    dtype = torch.bfloat16

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(H * D, 3 * H * D, bias=False, dtype=dtype, device=device)
            self.proj = torch.nn.Linear(H * D, H * D, bias=False, dtype=dtype, device=device)
            self.register_buffer("slopes", mods.alibi_slopes(H, device=device))
            self.score_mod = mods.alibi(self.slopes)

        def forward(self, x, bm):
            q, k, v = self.qkv(x).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
            o = tileattn.flex_attention(q, k, v, score_mod=self.score_mod, block_mask=bm)
            return self.proj(o.transpose(1, 2).reshape(B, S, H * D))

    model = Attention()
    bm = tileattn.create_block_mask(mods.causal, B, H, S, S, device=device)
    w = randn(B, S, H * D, dtype=torch.float32, device=device)

    cnt = torch._dynamo.testing.CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=cnt, fullgraph=True)
    for _ in range(2):
        x = randn(B, S, H * D, dtype=dtype, device=device)
        results = []
        for f in (model, compiled):
            model.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_()
            out = f(xi, bm)
            (out.float() * w).sum().backward()
            results.append((out.detach(), xi.grad, model.qkv.weight.grad, model.proj.weight.grad))
        for name, got, ref in zip(("out", "dx", "dw_qkv", "dw_proj"), results[1], results[0]):
            assert_close(name, got, ref, ref)
        model.slopes.mul_(0.5)
    assert cnt.frame_count == 1


def make_two(a, c):
    def two(score, b, h, q_idx, kv_idx):
        return score + a[h] * 3.0 - c[h]
    return two


class _Slotted:
    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w


def make_slotted(cfg):
    def windowed(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx - kv_idx <= cfg.w, score, score * 0.5)
    return windowed


@pytest.mark.parametrize("case", ["aliased-captures", "slots-number"])
def test_compile_guards_what_the_kernel_bakes_in(case, device):
    """A graph compiled for one mod must not serve a mod whose kernel differs: one tensor in two cells at compile
    time, then two tensors; a number read through a __slots__ object, then another number. Compiled equals eager
    (a recompile where needed)."""
    H = 2
    q, k, v = qkv(1, H, 40, 40, 16, DT, device)
    t1, t2 = (randn(H, dtype=torch.float32, device=device) for _ in range(2))
    first, second = ((make_two(t1, t1), make_two(t1, t2)) if case == "aliased-captures" else
                     (make_slotted(_Slotted(2)), make_slotted(_Slotted(20))))

    def fn(q, k, v, score_mod):
        return tileattn.flex_attention(q, k, v, score_mod=score_mod)
    compiled, _ = counted(fn)
    for mod in (first, second):
        assert_equal("out", compiled(q, k, v, mod), fn(q, k, v, mod))
