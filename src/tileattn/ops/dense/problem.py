"""The description of one dense attention forward, and its checks.

    AttnOptions   the call's non-tensor arguments, normalised (causal folded into the window): what the
                  registered op carries (as a string, `encode`) and what a launch plan is made for
    AttnProblem   the whole validated problem (shapes, dtypes, layout facts, options): what dispatch and
                  every backend take, with the tensors of a call (`Call`)
    Call          one call's tensors and per-call values (scale, softcap and the fp8 output factor may change
                  between calls of one plan; their signs may not)

Checks: check_inputs() does every check that needs no tensor values (it is safe under torch.compile
tracing); check_cu_seqlens() reads the cumulative lengths (one small device-to-host copy) and runs inside the
registered op. Every check raises TypeError / ValueError naming the argument, before any launch.
"""
import functools
import math
from dataclasses import dataclass, fields

import torch

from ... import hw
from ..common.args import is_bool
from ..common.fp8 import FP8_DTYPES, is_fp8, is_seq_major
from ..common.masking import UNBOUNDED_WINDOW
from ..common.softmax import LOG2E
from ..common.tma import tma_ok


@dataclass(frozen=True)
class AttnOptions:
    """The non-tensor arguments of one call, normalised."""
    scale: float  # the q.k multiplier (fp8: number descales of q and k folded in)
    window: tuple = (-1, -1)  # effective (left, right), -1 unbounded; causal is right = 0 (effective_window)
    softcap: float = 0.0  # > 0: scores s -> softcap * tanh(s / softcap)
    bottom_right: bool = True  # the window's alignment: bottom-right (FlashAttention) or top-left (torch SDPA)
    return_lse: bool = False  # also write the log-sum-exp (a tracked gradient asks for it)
    max_seqlen_q: int = 0  # varlen: the longest sequences (they size the grid)
    max_seqlen_k: int = 0
    out_scale: float = 1.0  # fp8: the output factor (a number v descale)
    out_dtype: torch.dtype | None = None  # fp8: the output dtype (None: q's)
    v_packed: bool = False  # fp8: v is the view of an Fp8V

    def with_lse(self) -> "AttnOptions":
        """The same options with return_lse (written out field by field: torch.compile traces this)."""
        return AttnOptions(self.scale, self.window, self.softcap, self.bottom_right, True, self.max_seqlen_q,
                           self.max_seqlen_k, self.out_scale, self.out_dtype, self.v_packed)

    def encode(self) -> str:
        """The options as the registered op's string argument ("name=value;..."; decode reverses it)."""
        return ";".join(f"{f.name}={_enc(getattr(self, f.name))}" for f in fields(self))

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def decode(text: str) -> "AttnOptions":
        vals = dict(item.split("=", 1) for item in text.split(";"))
        return AttnOptions(scale=float(vals["scale"]), window=tuple(int(x) for x in vals["window"].split(",")),
                           softcap=float(vals["softcap"]), bottom_right=vals["bottom_right"] == "1",
                           return_lse=vals["return_lse"] == "1", max_seqlen_q=int(vals["max_seqlen_q"]),
                           max_seqlen_k=int(vals["max_seqlen_k"]), out_scale=float(vals["out_scale"]),
                           out_dtype=None if vals["out_dtype"] == "None" else getattr(torch, vals["out_dtype"]),
                           v_packed=vals["v_packed"] == "1")


def _enc(x):
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, tuple):
        return ",".join(str(int(v)) for v in x)
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "")
    return repr(x)


@dataclass(frozen=True)
class AttnProblem:
    """One dense attention forward, validated. Shapes are the kernels' view: q [B, Sq, Hq, D], k [B, Sk, Hkv, D],
    v [B, Sk, Hkv, Dv] (varlen: B sequences of at most seqlen_q / seqlen_k rows, packed). GQA: query head h
    reads kv head h // (Hq // Hkv)."""
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    dtype: torch.dtype
    out_dtype: torch.dtype
    device: torch.device
    opts: AttnOptions
    varlen: bool = False
    descale: bool = False  # fp8: per-(batch, kv head) descale tensors are read on the device
    tma: tuple = (False, False, False, False)  # q, k, v, out suit tensor descriptors (tma_ok)

    @property
    def left(self) -> int:
        return self.opts.window[0]

    @property
    def right(self) -> int:
        return self.opts.window[1]

    @property
    def fp8(self) -> bool:
        return is_fp8(self.dtype)

    @property
    def elem_bytes(self) -> int:
        return self.dtype.itemsize

    @classmethod
    def of(cls, c, opts):
        """The problem of a call `c` (kernel views of checked tensors, out allocated) with options `opts`."""
        q, k, v, out = c.q, c.k, c.v, c.out
        varlen = c.cu_q is not None
        if varlen:
            # (no sequence is longer than the packed rows: a larger max_seqlen, a model's maximum as FlashAttention
            # takes it, would only size a larger grid; 2^31 one that never ends)
            batch = c.cu_q.shape[0] - 1
            seqlen_q, seqlen_k = min(opts.max_seqlen_q, q.shape[0]), min(opts.max_seqlen_k, k.shape[0])
        else:
            batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        return cls(batch, seqlen_q, seqlen_k, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.dtype, out.dtype,
                   q.device, opts, varlen=varlen, descale=c.descales is not None,
                   tma=(tma_ok(q), tma_ok(k), tma_ok(v), tma_ok(out)))


@dataclass(slots=True)
class Call:
    """One call's tensors, as the kernels see them ([B, S, H, D] views; varlen [total, H, D]), and its per-call
    values. lse is an empty placeholder when the call returns none; descales None, or fp8's three float32
    descale tensors (fp8.split_descales)."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    out: torch.Tensor
    lse: torch.Tensor
    cu_q: torch.Tensor | None
    cu_k: torch.Tensor | None
    descales: tuple | None
    scale: float
    softcap: float
    out_scale: float


class AttnLaunch:
    """A planned launch (grid, launcher.KernelLauncher) of a Gluon kernel whose call-varying arguments are a Call's
    q, k, v, out, lse and scale * log2 e, in that order: run(c) launches it on call c, compile(c) returns the
    compiled kernel. The large-D and cluster forwards' plans."""
    __slots__ = ("grid", "launcher")

    def __init__(self, grid, launcher):
        self.grid, self.launcher = grid, launcher

    def run(self, c):
        self.launcher(self.grid, *self._varying(c))

    def compile(self, c):
        return self.launcher.compile(self.grid, *self._varying(c))

    @staticmethod
    def _varying(c):
        return c.q, c.k, c.v, c.out, c.lse, c.scale * LOG2E


# ---------------------------------------------------------------------------------------------------------
# the outputs' layout
# ---------------------------------------------------------------------------------------------------------
def out_layout(q, v_head_dim, varlen):
    """(shape to allocate, head_major): a head-major q ([B, H, S, D] seen through a transpose, as
    scaled_dot_product_attention passes it) gets a head-major output, allocated [B, H, S, Dv] and returned
    transposed, so the result is contiguous in torch's layout."""
    shape = tuple(q.shape[:-1]) + (v_head_dim,)
    if not varlen and q.dim() == 4 and q.stride(1) < q.stride(2):
        B, S, H, _ = shape
        return (B, H, S, v_head_dim), True
    return shape, False


def lse_shape(q, varlen):
    """[B, Hq, Sq] (varlen: [Hq, total_q])."""
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def out_shape_strides(q, v_head_dim, varlen):
    """Shape and strides of alloc_out's result, without allocating."""
    shape, head_major = out_layout(q, v_head_dim, varlen)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    if head_major:  # allocated [B, H, S, Dv], seen as [B, S, H, Dv]
        return (shape[0], shape[2], shape[1], shape[3]), (strides[0], strides[2], strides[1], strides[3])
    return shape, tuple(strides)


def alloc_out(q, v_head_dim, varlen, dtype=None):
    """Output in q's layout family: [B, Sq, Hq, Dv] (see out_layout for head-major inputs), in `dtype`
    (default q's)."""
    shape, head_major = out_layout(q, v_head_dim, varlen)
    out = torch.empty(shape, dtype=dtype or q.dtype, device=q.device)
    return out.transpose(1, 2) if head_major else out


def alloc_lse(q, varlen, return_lse):
    shape = lse_shape(q, varlen) if return_lse else (0,)
    return torch.empty(shape, dtype=torch.float32, device=q.device)


# ---------------------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------------------
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16) + FP8_DTYPES
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 1024
MAX_GRAD_HEAD_DIM = 512  # bwd.py's paths (the split backward and the varlen slice kernels) stop here
MAX_FP8_HEAD_DIM = 256  # fp8 kernels: the dense kernel's head dims (the large-D kernels take 16-bit inputs)


def _check_tensor(name, t, ndim, layout):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims {layout}, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float8_e4m3fn or float8_e5m2, got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1 and not (name == "v" and is_fp8(t.dtype) and is_seq_major(t)):
        extra = " or, for fp8, a contiguous sequence dimension (tileattn.fp8_v_layout)" if name == "v" else ""
        raise ValueError(f"{name} must have a contiguous last dimension (stride(-1) == 1){extra}, got "
                         f"strides {t.stride()}")


def _check_head_dim(name, d):
    if d % 8 != 0 or not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{name} head dim must be a multiple of 8 in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], got {d}")


def check_device(*tensors, name="q"):
    """q, k, v (and cu_seqlens) on one device the kernels run on; not bfloat16 under the Triton interpreter (its
    bfloat16 dots are wrong: hw.check_interpreter_dtype). `name`: q's name in the error (sdpa: "query")."""
    dev = tensors[0].device
    for other, t in zip(("k", "v", "cu_seqlens_q", "cu_seqlens_k"), tensors[1:]):
        if t is not None and t.device != dev:
            raise ValueError(f"all tensors must be on one device: q is on {dev}, {other} on {t.device}")
    hw.check_kernel_device(dev, "q, k, v")
    hw.check_interpreter_dtype(tensors[0].dtype, name)


def check_options(causal, scale, window, softcap, return_lse=False):
    # runs on every call (the tensor checks only once per problem key): no generator, no tuple building
    if not is_bool(causal):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if return_lse is not False and return_lse is not True and not is_bool(return_lse):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale) or scale == 0):
        raise ValueError(f"scale must be a finite non-zero number or None, got {scale!r}")
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    left, right = window
    if type(left) is bool or type(right) is bool or not (isinstance(left, int) and isinstance(right, int)):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    if left < -1 or right < -1:
        raise ValueError(f"window bounds must be >= 0, or -1 for unbounded, got {tuple(window)}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0 disables it), got {softcap!r}")


def check_sdpa_inputs(query, key, value, enable_gqa):
    """scaled_dot_product_attention's own checks, on the [B, H, S, D] tensors (check_inputs follows)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-dim tensor [B, H, S, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if is_fp8(t.dtype):
            raise TypeError(f"scaled_dot_product_attention takes float16 or bfloat16 ({name} is {t.dtype}); "
                            f"for fp8 use tileattn.attention, which takes descales")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass enable_gqa=True for "
                         f"grouped-query attention")


def check_inputs(q, k, v, *, varlen):
    """Shape / dtype / layout / device checks. Raises TypeError or ValueError naming the argument."""
    ndim = 3 if varlen else 4
    lay_q = "[total_q, Hq, D]" if varlen else "[B, Sq, Hq, D]"
    lay_k = "[total_k, Hkv, D]" if varlen else "[B, Sk, Hkv, D]"
    lay_v = "[total_k, Hkv, Dv]" if varlen else "[B, Sk, Hkv, Dv]"
    _check_tensor("q", q, ndim, lay_q)
    _check_tensor("k", k, ndim, lay_k)
    _check_tensor("v", v, ndim, lay_v)
    if not (q.dtype == k.dtype == v.dtype):
        hint = ""
        if any(is_fp8(t.dtype) for t in (q, k, v)):
            hint = (" (fp8 attention takes q, k and v in one fp8 dtype; with an fp8 KV cache, quantize q too: "
                    "tileattn.quantize_fp8)")
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}{hint}")
    if not varlen and not (q.shape[0] == k.shape[0] == v.shape[0]):
        raise ValueError(f"batch sizes differ: q {q.shape[0]}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[-3] != v.shape[-3] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must agree on sequence length and heads")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv != 0:
        raise ValueError(f"the number of query heads ({hq}) must be a positive multiple of the number of "
                         f"key/value heads ({hkv})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: {q.shape[-1]} vs {k.shape[-1]}")
    _check_head_dim("q/k", q.shape[-1])
    _check_head_dim("v", v.shape[-1])
    if is_fp8(q.dtype) and max(q.shape[-1], v.shape[-1]) > MAX_FP8_HEAD_DIM:
        raise ValueError(f"fp8 attention takes head dims up to {MAX_FP8_HEAD_DIM}, got D={q.shape[-1]}, "
                         f"Dv={v.shape[-1]} (larger head dims run in float16 or bfloat16)")


def check_cu_seqlens(cu_q, cu_k, total_q, total_k, max_q, max_k):
    """Checks of the cumulative lengths that need their values (one device-to-host copy)."""
    for name, cu, total, mx in (("cu_seqlens_q", cu_q, total_q, max_q), ("cu_seqlens_k", cu_k, total_k, max_k)):
        vals = cu.tolist()
        if vals[0] != 0:
            raise ValueError(f"{name} must start at 0, got {vals[0]}")
        lens = [b - a for a, b in zip(vals[:-1], vals[1:])]
        if any(n < 0 for n in lens):
            raise ValueError(f"{name} must be non-decreasing, got {vals}")
        if vals[-1] > total:
            raise ValueError(f"{name}[-1] = {vals[-1]} exceeds the packed length {total}")
        if lens and max(lens) > mx:
            raise ValueError(f"max_seqlen {mx} is smaller than the longest sequence in {name} ({max(lens)})")


def check_cu_seqlens_meta(cu_q, cu_k, max_q, max_k):
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} must be a 1-D int32 tensor of length B + 1 >= 2, got {cu.dtype} "
                             f"shape {tuple(cu.shape)}")
        if cu.stride(0) != 1:  # the kernels read cu[b] at offset b
            raise ValueError(f"{name} must be contiguous (stride(0) == 1), got stride {cu.stride(0)}; pass "
                             f"{name}.contiguous()")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]}")
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise ValueError(f"{name} must be an int >= 0, got {m!r}")


def effective_window(causal, window):
    """(left, right) with -1 = unbounded (a bound >= UNBOUNDED_WINDOW becomes -1); causal clips the right bound
    to 0 (the diagonal)."""
    left, right = int(window[0]), int(window[1])
    if left >= UNBOUNDED_WINDOW:
        left = -1
    if right >= UNBOUNDED_WINDOW:
        right = -1
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right
