"""The fp8 suites' output check (`tileattn bench fp8`, and the fp8 columns of `tileattn bench dense --long`): the
float32 reference of the dequantized inputs on a slice (batch 0, heads 0-1, some query rows) and the tolerance
rule's allowed error, with P rounded to the inputs' fp8 as the kernels round it."""
import torch

from ..ops.dense.reference import attention_ref
from ..tolerance import allowed_error
from .common import max_abs

FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _err(e):
    return f"{type(e).__name__}: {str(e)[:200]}"


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
        return False, {"error": _err(e)}
    err = max_abs(out[:1, rows, :2], ref)
    finite = bool(torch.isfinite(out).all())
    return finite and err <= tol, {"err_vs_fp32": err, "allowed": tol, "finite": finite}
