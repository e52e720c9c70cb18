"""The 2-CTA cluster forward prototype (ops/dense/gluon_cluster_sm90.py, launch_cluster_sm90.py) against the float32
reference, under the tolerance rule. GPU only (a Hopper GPU and triton 3.9); compiled but never run as of its
writing: `python scripts/compile_cluster.py` checks the sm90 compile without a GPU."""
import pytest
import torch
import triton

from tileattn.ops.dense.reference import attention_ref

from tests.helpers import assert_close, randn

# (B, Sq, Sk, Hq, Hkv): whole pair tiles, a ragged last pair (one warpgroup without rows: Sq = 800), one pair,
# Sq != Sk both ways, GQA groups of 1, 2 and 8
SHAPES = [
    (1, 1024, 1024, 4, 4), (2, 1000, 1000, 8, 2), (1, 800, 800, 2, 1), (1, 200, 200, 2, 2),
    (1, 256, 1024, 4, 4), (1, 1024, 256, 4, 1), (2, 4096, 4096, 16, 2), (1, 1, 513, 8, 8),
]


def _hopper_39():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and \
        triton.__version__.startswith("3.9.")


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-Sq{}-Sk{}-H{}-Hkv{}".format(*s))
def test_gpu_cluster_forward(shape, causal, dtype, device):
    from tileattn.ops.dense.launch_cluster_sm90 import attention_cluster_sm90
    B, Sq, Sk, Hq, Hkv = shape
    D = 128
    q = randn(B, Sq, Hq, D, dtype=dtype, device=device)
    k, v = randn(B, Sk, Hkv, D, dtype=dtype, device=device), randn(B, Sk, Hkv, D, dtype=dtype, device=device)
    out = torch.full_like(q, float("nan"))  # an element the kernel never writes fails the comparison
    attention_cluster_sm90(q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    mode = "top_left" if causal else False
    ref, _ = attention_ref(q, k, v, causal=mode)
    ref_lp, _ = attention_ref(q, k, v, causal=mode, dtype=dtype)
    assert_close("out", out, ref, ref_lp)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper_39(), reason="needs a Hopper GPU and triton 3.9 (Gluon clusters)")
def test_gpu_cluster_repeatable(device):
    """Bitwise the same output over repeated launches (a race in the pair's barrier protocol tends to show as
    run-to-run differences before it shows as a wrong mean)."""
    from tileattn.ops.dense.launch_cluster_sm90 import attention_cluster_sm90
    q = randn(2, 2048, 16, 128, dtype=torch.float16, device=device)
    k, v = randn(2, 2048, 4, 128, dtype=torch.float16, device=device), randn(2, 2048, 4, 128, dtype=torch.float16,
                                                                              device=device)
    first = attention_cluster_sm90(q, k, v, causal=True)
    for _ in range(20):
        assert torch.equal(attention_cluster_sm90(q, k, v, causal=True), first)


def test_cluster_reason_checks_out():
    """The launcher refuses an output buffer of another shape or dtype before any launch (a stray descriptor
    would write out of bounds)."""
    from tileattn.ops.dense.launch_cluster_sm90 import reason
    if not triton.__version__.startswith("3.9."):
        pytest.skip("the cluster prototype is written for triton 3.9")
    q = torch.zeros(1, 256, 2, 128, dtype=torch.float16)
    assert reason(q, q, q) == "" and reason(q, q, q, torch.empty_like(q)) == ""
    for bad in (torch.empty(1, 255, 2, 128, dtype=torch.float16), torch.empty_like(q, dtype=torch.bfloat16)):
        assert reason(q, q, q, bad).startswith("out:")
