"""fp8 inputs of attention (dense and flex): quantization, the sequence-major V layout, the checks of the fp8 options.

Conventions (FlashAttention-3's): q, k, v are stored in one fp8 dtype (float8_e4m3fn or float8_e5m2); the real
value of an element is the stored value times its descale (float32, a scalar or one per [batch, kv head]).
The scores are q.k * q_descale * k_descale * scale; the output is (P V) * v_descale in `out_dtype`.

P (the softmax probabilities, in [0, 1]) is rounded to V's fp8 dtype for the P V product after a scaling by
2 ** P_SHIFT, folded into the exponent of exp2 (no extra instruction) and cancelled by the row sum. The scaling
keeps probabilities down to 2 ** -14 (e4m3) out of the subnormal range, where fp8 keeps fewer bits or
flushes them to 0; above that the relative rounding error is the dtype's own (2 ** -4 for e4m3). It costs no
instruction. Measured (docs/design/fp8.md, D = 128, random inputs): for e4m3 the mean output error drops
7-20x (N = 2048 non-causal: 0.0154 -> 0.0008; most probabilities there are near 1/N = 2^-11, subnormal in
e4m3); for e5m2 (normal down to 2^-14) it changes nothing.

Layout: the Hopper kernel's fp8 P V product reads V sequence-major (fp8 tensor-core operands must be
K-major), with the keys of each group of 16 in the order the P operand's registers hold them (`Fp8V`).
`fp8_v_layout(v)` returns V that way, and attention uses it without a copy; any other V is re-laid out once
per call inside attention (a read and a write of V, counted in the benchmark: see attention's docstring).
"""
from __future__ import annotations

import math

import torch
import triton

from .fp8_kernels import pack_v_kernel, packed_key_pos

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# a descale argument (q_descale, k_descale, v_descale): None (1), a positive number, or a float32 tensor
Descale = float | torch.Tensor | None
P_SHIFT = 8  # log2 of the factor P is scaled by before its fp8 rounding
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
PACK_ALIGN = 64  # Fp8V's row pitch: a multiple of the key tiles' 32-key groups and of TMA's 16 bytes


def is_fp8(dtype) -> bool:
    return dtype in FP8_DTYPES


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype = torch.float8_e4m3fn,
                 group: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a float tensor to fp8 with one scale per (batch, group of heads).

    Args:
        x: [B, S, H, D] (the `attention` layout) or [total, H, D] (varlen; one scale for the whole tensor),
            float16 / bfloat16 / float32.
        dtype: torch.float8_e4m3fn or torch.float8_e5m2.
        group: heads per scale (4-D x). attention takes q's descale per kv head: for GQA quantize q with
            group = Hq // Hkv.

    Returns:
        (x_fp8, descale): x_fp8 in `dtype`, x's shape, contiguous; descale float32 [B, H // group] (4-D x) or
        a 0-dim tensor (3-D x), with x ~= x_fp8 * descale (the attention descale convention). Groups whose
        values are all 0 (or that hold none) get descale 1.
    """
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if not isinstance(x, torch.Tensor) or x.dim() not in (3, 4) or not x.dtype.is_floating_point:
        raise ValueError("x must be a floating-point tensor [B, S, H, D] or [total, H, D]")
    if x.dim() == 3:
        xf = x.float()
        amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())  # (no tokens: descale 1)
        descale = torch.where(amax > 0, amax / _FP8_MAX[dtype], torch.ones_like(amax))
        return (xf / descale).to(dtype).contiguous(), descale
    B, S, H, D = x.shape
    if not isinstance(group, int) or group < 1 or H % group:
        raise ValueError(f"group must be a positive divisor of the {H} heads, got {group!r}")
    xf = x.float().reshape(B, S, H // group, group * D)
    amax = xf.abs().amax(dim=(1, 3)) if S * D else xf.new_zeros(B, H // group)  # (no tokens: descale 1)
    descale = torch.where(amax > 0, amax / _FP8_MAX[dtype], torch.ones_like(amax))
    x8 = (xf / descale[:, None, :, None]).to(dtype).reshape(B, S, H, D)
    return x8, descale


def is_seq_major(v) -> bool:
    """V [B, S, H, D] / [total, H, D] whose sequence dimension is contiguous."""
    return v.stride(-3) == 1 and v.stride(-1) != 1


class Fp8V:
    """fp8 V in the layout tileattn's fp8 kernels read without a copy (made by `fp8_v_layout`): pass it to
    `attention` as v.

    `data` is a [B, Hkv, Dv, S'] tensor, S' = Sk rounded up to 64: sequence-major (fp8 tensor-core operands
    must be K-major, and the K of the P V product is the key index), keys reordered within each group of 16
    into the order the P operand's registers take them (packed_key_pos), zeros past Sk. Its values
    are not V's in plain order: read V back with `unpack()`.
    """
    __slots__ = ("data", "seqlen")

    def __init__(self, data: torch.Tensor, seqlen: int) -> None:
        self.data, self.seqlen = data, seqlen

    @property
    def shape(self) -> torch.Size:
        B, H, D, _ = self.data.shape
        return torch.Size((B, self.seqlen, H, D))

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def view(self) -> torch.Tensor:
        """The [B, Sk, Hkv, Dv] sequence-major view the kernels take (keys in packed order)."""
        return self.data[..., :self.seqlen].permute(0, 3, 1, 2)

    def unpack(self) -> torch.Tensor:
        """V as a plain [B, Sk, Hkv, Dv] tensor (keys in order)."""
        pos = packed_key_pos(torch.arange(self.seqlen, device=self.data.device))
        return self.data[..., pos].permute(0, 3, 1, 2).contiguous()

    def __repr__(self) -> str:
        return f"Fp8V(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"


def fp8_v_layout(v: torch.Tensor | Fp8V) -> Fp8V:
    """fp8 V [B, Sk, Hkv, Dv] (any strides) in the layout tileattn's fp8 attention reads without a copy.

    Returns an `Fp8V` to pass as attention's v. Keep V (e.g. an fp8 KV cache) this way to save attention a
    re-layout per call: a read and a write of V, which costs 1-5% of an fp8 attention call at N = 4K-16K,
    D = 128 on the H100, up to 24% at N = 1K (bench/results/h100/fp8.json: tileattn-e4m3 against
    tileattn-e4m3-vrow).
    """
    if isinstance(v, Fp8V):
        return v
    if not isinstance(v, torch.Tensor) or v.dim() != 4 or v.dtype not in FP8_DTYPES:
        raise ValueError("v must be an fp8 tensor [B, Sk, Hkv, Dv] (float8_e4m3fn or float8_e5m2)")
    B, S, H, D = v.shape
    pitch = max(PACK_ALIGN, triton.cdiv(S, PACK_ALIGN) * PACK_ALIGN)
    data = torch.empty(B, H, D, pitch, dtype=v.dtype, device=v.device)
    if data.numel():
        block_s = PACK_ALIGN
        grid = (pitch // block_s * B * H,)
        pack_v_kernel[grid](v, data, S, H, v.stride(0), v.stride(1), v.stride(2), v.stride(3), data.stride(0),
                            data.stride(1), data.stride(2), pitch // block_s, D=D, BLOCK_S=block_s,
                            BLOCK_D=triton.next_power_of_2(D))
    return Fp8V(data, S)


def packed_pitch(v) -> int:
    """S' of the Fp8V whose view() is v (the stride of its head-dim axis)."""
    return v.stride(3)


# ---------------------------------------------------------------------------------------------------------
# checks of the fp8 options (the tensor checks are in each op's problem.py)
# ---------------------------------------------------------------------------------------------------------
def check_fp8_options(q, k, q_descale, k_descale, v_descale, out_dtype, batch):
    """Descales and out_dtype: only with fp8 inputs; a descale is a finite positive number, or a float32
    tensor with one element or of shape [B, Hkv] on q's device."""
    descales = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    if not is_fp8(q.dtype):
        for name, d in descales:
            if d is not None:
                raise ValueError(f"{name} only applies to fp8 inputs; q is {q.dtype}")
        if out_dtype is not None and out_dtype != q.dtype:
            raise ValueError(f"out_dtype only applies to fp8 inputs (the output of {q.dtype} attention is "
                             f"{q.dtype}), got {out_dtype}")
        return
    if out_dtype is not None and out_dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"out_dtype must be torch.float16 or torch.bfloat16 (default bfloat16), got {out_dtype!r}")
    hkv = k.shape[-2]
    for name, d in descales:
        if d is None:
            continue
        if isinstance(d, torch.Tensor):
            if d.dtype != torch.float32:
                raise TypeError(f"{name} must be float32, got {d.dtype}")
            if d.device != q.device:
                raise ValueError(f"{name} must be on q's device {q.device}, got {d.device}")
            if d.numel() != 1 and tuple(d.shape) != (batch, hkv):
                raise ValueError(f"{name} must have shape [B, Hkv] = [{batch}, {hkv}] or hold one value, got "
                                 f"shape {tuple(d.shape)}")
        elif type(d) is bool or not isinstance(d, (int, float)) or not math.isfinite(d) or d <= 0:
            raise ValueError(f"{name} must be a finite positive number or a float32 tensor, got {d!r}")


_ONES = {}


def _ones(device):
    """A [1, 1] float32 tensor of 1 on `device` (kept: made once per device)."""
    t = _ONES.get(device)
    if t is None:
        t = _ONES[device] = torch.ones(1, 1, dtype=torch.float32, device=device)
    return t


def split_descales(q_descale, k_descale, v_descale):
    """(qk factor, v factor, (q, k, v) tensors or Nones): numbers fold into the scale and the output factor;
    tensors go to the kernel. When any is a tensor the kernel reads all three: the others are a tensor of 1."""
    qk, vf = 1.0, 1.0
    tensors = []
    for i, d in enumerate((q_descale, k_descale, v_descale)):
        if isinstance(d, torch.Tensor):
            tensors.append(d)
            continue
        tensors.append(None)
        if d is not None:
            if i < 2:
                qk *= float(d)
            else:
                vf = float(d)
    if any(t is not None for t in tensors):
        dev = next(t for t in tensors if t is not None).device
        tensors = [_ones(dev) if t is None else t for t in tensors]
    return qk, vf, tuple(tensors)


def descale_strides(d):
    """(stride over batch, stride over kv heads) of a descale tensor as the kernels read it (0: broadcast)."""
    if d is None:
        return 0, 0
    return (0, 0) if d.numel() == 1 else (d.stride(0), d.stride(1))
