"""The fp8 suites' output check (`tileattn bench fp8`, and the fp8 columns of `tileattn bench dense --long`): the
float32 reference of the dequantized inputs on a slice (batch 0, heads 0-1, some query rows) and the tolerance
rule's allowed error, with P rounded to the inputs' fp8 as the kernels round it."""
import torch

from ..ops.dense.reference import attention_ref
from ..tolerance import allowed_error
from .common import error_text, max_abs

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def quantized(q16, k16, v16, name, causal, rows=slice(None)):
    """16-bit [B, S, H, D] values quantized to fp8 `name` per (batch, head), and the reference of the check slice
    (query `rows`): (q8, k8, v8, (q, k, v descales), ref, allowed error)."""
    import tileattn
    (q8, qd), (k8, kd), (v8, vd) = (tileattn.quantize_fp8(t, dtype=FP8[name]) for t in (q16, k16, v16))
    return (q8, k8, v8, (qd, kd, vd), *reference(q8, k8, v8, qd, kd, vd, causal, rows))


def call(q8, k8, v, descales, causal):
    """fn() running tileattn.attention on fp8 inputs (v plain or in fp8_v_layout) with their descales."""
    import tileattn
    qd, kd, vd = descales
    return lambda: tileattn.attention(q8, k8, v, causal=causal, q_descale=qd, k_descale=kd, v_descale=vd)


def dequant(x8, descale, rows=slice(None)):
    """float32 values of the check slice (batch 0, heads 0-1, `rows` of the sequence) of an fp8 [B, S, H, D]
    tensor."""
    return x8[:1, rows, :2].float() * descale[:1, None, :2, None]


def reference(q8, k8, v8, qd, kd, vd, causal, rows=slice(None)):
    """float32 reference of the slice (query `rows`: the last ones keep the whole problem's causal rows, as
    attention_ref aligns bottom-right) and the rule's allowed error (ref_lp: P rounded to the inputs' fp8)."""
    qs, ks, vs = dequant(q8, qd, rows), dequant(k8, kd), dequant(v8, vd)
    ref, _ = attention_ref(qs, ks, vs, causal=causal)
    ref_lp, _ = attention_ref(qs, ks, vs, causal=causal, dtype=q8.dtype)
    return ref, allowed_error(max_abs(ref_lp, ref), ref, torch.bfloat16)


def check(fn, ref, tol, rows=slice(None)):
    """Tolerance rule on the slice (query `rows`, as reference's); a call that raises fails the check."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - a provider that refuses the case is reported, not fatal
        return False, {"error": error_text(e)}
    err = max_abs(out[:1, rows, :2], ref)
    finite = bool(torch.isfinite(out).all())
    return finite and err <= tol, {"err_vs_fp32": err, "allowed": tol, "finite": finite}
