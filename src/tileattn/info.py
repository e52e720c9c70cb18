"""`tileattn info`: versions, the device, the environment switches, and which backend of each op serves typical
problems on this machine (with the reason each other backend was skipped)."""
import types

import torch

from . import __version__, hw, knobs


def _dense_examples(device, every):
    from .ops.dense.problem import AttnOptions, AttnProblem
    dims = (64, 128, 256, 512, 1024) if every else (128, 256, 512)
    out = []
    for d in dims:
        for causal in (False, True):
            for dtype in ((torch.float16, torch.float8_e4m3fn) if every and d <= 256 else (torch.float16,)):
                odt = torch.bfloat16 if dtype.itemsize == 1 else dtype
                opts = AttnOptions(scale=d ** -0.5, window=(-1, 0 if causal else -1))
                name = f"B=4 H=32 N=4096 D={d} {str(dtype).split('.')[-1]}{' causal' if causal else ''}"
                out.append((name, AttnProblem(4, 4096, 4096, 32, 32, d, d, dtype, odt, device, opts,
                                              tma=(True,) * 4)))
    opts = AttnOptions(scale=0.088, window=(-1, 0))
    out.append(("decode step Sq=1 Sk=8192 B=32 H=32/8 D=128", AttnProblem(
        32, 1, 8192, 32, 8, 128, 128, torch.bfloat16, torch.bfloat16, device, opts, tma=(True,) * 4)))
    opts = AttnOptions(scale=0.088, window=(-1, 0), max_seqlen_q=4096, max_seqlen_k=4096)
    out.append(("varlen D=128 causal", AttnProblem(8, 4096, 4096, 32, 8, 128, 128, torch.bfloat16, torch.bfloat16,
                                                   device, opts, varlen=True, tma=(True,) * 4)))
    return out


def _flex_examples(device):
    from .ops.flex.problem import FlexProblem
    return [(f"B=4 H=16 N=8192 D={d} block mask 128", FlexProblem(4, 16, 16, 8192, 8192, d, d, torch.bfloat16,
                                                                 torch.bfloat16, device, d ** -0.5,
                                                                 has_block_mask=True, tma=True))
            for d in (64, 128, 256)]


def _mla_examples(device):
    return [(f"Hq={hq} q_len=1 page 64 {str(dt).split('.')[-1]} cache",
             types.SimpleNamespace(device=device, rows=hq, dc=512, dr=64, page_size=64, cache_dtype=dt,
                                   first_chunk=None))
            for hq in (16, 128) for dt in (torch.bfloat16, torch.float8_e4m3fn)]


def _decode_examples(device):
    from .ops.decode.plan import KVCachePlan
    out = []
    for q_len, page, cache in ((1, 16, torch.bfloat16), (4, None, torch.bfloat16), (1, 16, torch.float8_e4m3fn)):
        name = (f"B=32 Hq=32 Hkv=8 D=128 kv 8192 q_len={q_len} {'page ' + str(page) if page else 'contiguous'} "
                f"{str(cache).split('.')[-1]} cache")
        seqlens = torch.full((32,), 8192, dtype=torch.int32, device=device)
        out.append((name, KVCachePlan(seqlens, num_heads=32, num_kv_heads=8, head_dim=128, page_size=page,
                                      q_len=q_len, cache_dtype=cache, host_seqlens=[8192] * 32)))
    return out


def _table(op, explain, examples):
    for name, p in examples:
        rows, chosen = explain(p)
        print(f"  {op} {name}: {chosen}")
        for backend, ok, why in rows:
            if backend != chosen:
                print(f"      {backend:20s} {'serves it (later in the order)' if ok else why}")


def print_info(every=False):
    import triton
    print(f"tileattn {__version__}, torch {torch.__version__}, triton {triton.__version__}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    if cuda:
        print(f"{torch.cuda.get_device_name()}: {hw.device_info(device)}")
    else:
        print("no CUDA GPU" + (" (the Triton interpreter is on)" if hw.interpreter_enabled() else ""))
    from .ops.common.tma import GLUON_TRITON, gluon_available
    verified = " and ".join(v.rstrip(".") for v in GLUON_TRITON)
    print(f"Hopper (Gluon) kernels: {'available' if gluon_available() else 'off'} with triton {triton.__version__} "
          f"(run-verified on triton {verified})")
    print("environment switches:\n" + knobs.describe())
    if not cuda and not hw.interpreter_enabled():
        print("kernels run on CUDA GPUs, or on the CPU through the Triton interpreter (TRITON_INTERPRET=1)")
        return
    print("which kernel serves what (first that serves, in order; the others with the reason they were skipped):")
    from .ops.decode import dispatch as decode
    from .ops.dense import dispatch as dense
    from .ops.flex import dispatch as flex
    from .ops.mla import dispatch as mla
    _table("dense", dense.explain, _dense_examples(device, every))
    _table("decode", decode.explain, _decode_examples(device))
    _table("flex", flex.explain, _flex_examples(device))
    _table("mla", mla.explain, _mla_examples(device))
