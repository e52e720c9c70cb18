"""The traced-mod cache (ops/flex/trace.py): what it keeps alive, when a cached trace is reused, and the registry
the registered ops name mods by (compile path)."""
import gc
import types
import weakref

import pytest
import torch

from tileattn.ops.flex import captures, trace
from tileattn.ops.flex.trace import compile_mod

WINDOW = 5  # read by a mod below through this module


def _bias_mod(bias):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[h]
    return score_mod


class _Bias(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("slopes", torch.arange(n, dtype=torch.float32))

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + self.slopes[h]
        self.score_mod = score_mod


def test_cache_keeps_no_captured_tensor_alive():
    """A mod made per call with a large captured tensor: after the caller drops both, the tensor is freed and
    the cache entry goes with it (it used to pin up to 256 of them)."""
    n0 = len(trace._TRACES)
    refs = []
    for i in range(3):
        bias = torch.randn(1000 + i)
        spec = compile_mod(_bias_mod(bias), "score")
        assert spec.captures[0] is bias
        refs.append(weakref.ref(bias))
        del bias, spec
    m = _Bias(4)
    compile_mod(m.score_mod, "score")
    refs.append(weakref.ref(m.slopes))
    del m
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(trace._TRACES) <= n0  # ours went with their objects (and gc may take earlier tests' entries too)


def test_new_object_with_a_freed_ones_id_is_traced_again():
    for i in range(20):
        bias = torch.full((4,), float(i))
        spec = compile_mod(_bias_mod(bias), "score")
        assert spec.captures[0] is bias  # never a freed tensor's trace
        del bias, spec


def test_reassigned_attribute_is_a_new_trace():
    """`module.slopes = new` (old tensor alive or not) and a module global changed: a new key each, so an eager
    call never reads the old tensor or the old number."""
    m = _Bias(4)
    old = m.slopes
    s1 = compile_mod(m.score_mod, "score")
    m.slopes = torch.ones(4)
    s2 = compile_mod(m.score_mod, "score")
    assert s1.captures[0] is old and s2.captures[0] is m.slopes

    mod = types.ModuleType("cfg")
    mod.WINDOW = 3

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < mod.WINDOW
    a = compile_mod(mask_mod, "mask")
    mod.WINDOW = 4
    b = compile_mod(mask_mod, "mask")
    assert a is not b and "3" in a.source and "4" in b.source
    assert compile_mod(mask_mod, "mask") is b


def test_spec_key_covers_the_derivative():
    """Two mods with one forward source but different derivative code get different registry keys, so that
    the registered backward never runs one's derivative for the other."""
    def clamped(score, b, h, q_idx, kv_idx):
        return torch.clamp(score, min=q_idx.float())

    def maxed(score, b, h, q_idx, kv_idx):
        return torch.maximum(score, q_idx.float())
    a, m = compile_mod(clamped, "score"), compile_mod(maxed, "score")
    assert a.source == m.source and a.key != m.key
    assert captures.mod_plan(clamped, "score", True)[0] == a.key
    assert captures.mod_plan(maxed, "score", True)[0] == m.key
    assert trace.spec_of(a.key).gm.code == a.gm.code and trace.spec_of(m.key).gm.code == m.gm.code


def test_registry_holds_no_tensor():
    bias = torch.randn(5000)
    captures.mod_plan(_bias_mod(bias), "score", True)
    r = weakref.ref(bias)
    del bias
    gc.collect()
    assert r() is None


def test_global_vs_attribute_names():
    """A name the code uses as an attribute (self.WINDOW) is not looked up as a global (the module's WINDOW),
    so changing the global does not recompile a mod that never reads it."""
    class Cfg:
        WINDOW = 7

    cfg = Cfg()

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx - kv_idx < cfg.WINDOW
    _, _, scalars, _ = captures.mod_plan(mask_mod, "mask", False)
    paths = [p for p, _ in scalars]
    assert (("cell", 0), ("attr", "WINDOW")) in paths
    assert not any(step == ("global", "WINDOW") for p in paths for step in p)


def test_captured_index_arithmetic_int32():
    """A captured tensor whose offsets fit int32 is indexed in int32 (clamped in the index's type first); a tensor
    passed for it later (the registered op's: same shape) with offsets past 2^31 is refused, not read wrongly."""
    table = torch.zeros(4, 8)
    spec = compile_mod(lambda b, h, q_idx, kv_idx: table[h, kv_idx] > 0, "mask")
    assert ".to(tl.int32) * c0_s1" in spec.source and "tl.int64" not in spec.source
    spec.check_captures((torch.zeros(4, 8), ))
    spec.check_captures((torch.zeros(8, 4).t(), ))
    wide = torch.empty_strided((4, 8), (2 ** 30, 1), device="meta")
    with pytest.raises(ValueError, match="captured tensor 0"):
        spec.check_captures((wide, ))
