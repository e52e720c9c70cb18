"""ring_attention over 2 and 4 processes (gloo, kernels through the Triton interpreter) against the float32
reference on the whole sequence: outputs, lse and gradients under the tolerance rule (the input-precision error
is the same reference computed in float16), causal and not, zigzag and contiguous, GQA / MQA, Sq != Sk and
Dv != D (not causal), the lse in the loss, and bit-identical repeats. On a machine with two or more GPUs the
same cases, and larger ones that take the GPU kernels, run over NCCL (test_ring_attention_gpu_matches_reference).

All cases of one world size run in one set of processes (tests/distributed/ring_worker.py), which saves each
rank's shards; this process compares. A child that fails is reported with its traceback; one that hangs is
killed after JOIN_TIMEOUT_S and reported.
"""
import multiprocessing
import os
import time

import pytest
import torch

import tileattn
from tileattn.ops.dense.reference import attention_ref

from tests.distributed.ring_worker import CHILD_ENV, case_id, make_inputs, run_rank
from tests.helpers import assert_close

# the CPU ranks run CPU tensors over gloo through the interpreter (the CI path); the GPU test runs one rank per
# GPU over NCCL
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU multi-process tests (gloo, interpreter)")
GPU_COUNT = torch.cuda.device_count() if torch.cuda.is_available() else 0

JOIN_TIMEOUT_S = 240


def _case(world, layout, causal, seed, *, B=1, S, Sk=None, Hq=2, Hkv=2, D=32, Dv=32, **extra):
    return dict(world=world, layout=layout, causal=causal, seed=seed, B=B, S=S, Sk=Sk or S, Hq=Hq, Hkv=Hkv, D=D,
                Dv=Dv, **extra)


CASES = {
    2: [_case(2, "zigzag", True, 1, B=2, S=32, Hq=4, Hkv=2, lse_grad=True),
        _case(2, "contiguous", True, 2, S=24, Hq=2, Hkv=1),
        _case(2, "zigzag", False, 3, S=32, Sk=48, Hq=4, Hkv=1, Dv=48, scale=0.3),
        _case(2, "contiguous", False, 4, S=16, Sk=40, Hq=2, Hkv=2)],
    4: [_case(4, "zigzag", True, 5, S=64, Hq=4, Hkv=2, repeat=True),
        _case(4, "contiguous", True, 6, S=36, Hq=2, Hkv=1, lse_grad=True),
        _case(4, "zigzag", False, 7, S=48, Hq=2, Hkv=2)],
}

# the GPU test adds shapes the Hopper kernels serve (D 64 / 128, blocks of 128 and more, ragged shards)
GPU_CASES = {
    w: [_case(w, "zigzag", True, 10 + w, B=2, S=1024 * w, Hq=8, Hkv=2, D=128, Dv=128, lse_grad=True, repeat=True),
        _case(w, "contiguous", True, 20 + w, S=768 * w, Hq=4, Hkv=4, D=64, Dv=64),
        _case(w, "zigzag", False, 30 + w, S=512 * w, Sk=640 * w, Hq=8, Hkv=1, D=128, Dv=128, scale=0.1),
        _case(w, "contiguous", False, 40 + w, S=200 * w, Sk=1000 * w, Hq=4, Hkv=2, D=128, Dv=64)]
    for w in (2, 4)
}


def _spawn(world, cases, tmp_path, device="cpu"):
    """Run run_rank on `world` processes; returns each rank's results, or fails with the children's errors."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=run_rank, args=(r, world, str(tmp_path / "rendezvous"), cases, str(tmp_path),
                                                device), daemon=True) for r in range(world)]
    child_env = CHILD_ENV if device == "cpu" else {}
    saved = {k: os.environ.get(k) for k in child_env}
    os.environ.update(child_env)
    try:
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    errors = {path.name: path.read_text() for path in sorted(tmp_path.glob("error*.txt"))}
    codes = [p.exitcode for p in procs]
    if hung or errors or any(code != 0 for code in codes):
        text = "\n".join(f"--- {name}\n{tb}" for name, tb in errors.items())
        pytest.fail(f"ring test processes failed: exit codes {codes}, still running after {JOIN_TIMEOUT_S} s "
                    f"(killed): ranks {hung}\n{text}", pytrace=False)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _reference(c, dtype, device):
    """(out, lse, (dq, dk, dv)) of the whole sequence through attention_ref in `dtype`, same loss as the ranks."""
    q, k, v, dout, dlse = (t.to(device) for t in make_inputs(c))
    x = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*x, causal=c["causal"], scale=c.get("scale"), dtype=dtype)
    loss = (out.float() * dout).sum()
    if c.get("lse_grad"):
        loss = loss + (lse.float() * dlse).sum()
    return out.detach().cpu(), lse.detach().cpu(), [t.cpu() for t in torch.autograd.grad(loss, x)]


def _check_case(c, ranks, device="cpu"):
    got = {name: tileattn.unshard_sequence([r[case_id(c)][name] for r in ranks], layout=c["layout"],
                                           seq_dim=2 if name == "lse" else 1)
           for name in ("out", "lse", "dq", "dk", "dv")}
    ref, ref_lp = _reference(c, torch.float32, device), _reference(c, torch.float16, device)
    for name, r, rl in (("out", ref[0], ref_lp[0]), ("lse", ref[1], ref_lp[1]),
                        *zip(("dq", "dk", "dv"), ref[2], ref_lp[2])):
        assert got[name].shape == r.shape, f"{name}: shape {tuple(got[name].shape)} != {tuple(r.shape)}"
        assert got[name].dtype == (torch.float32 if name == "lse" else torch.float16), f"{name}: {got[name].dtype}"
        assert_close(name, got[name], r, rl)
    if c.get("repeat"):
        for rank, r in enumerate(ranks):
            differ = [name for name, same in r[case_id(c)]["identical"].items() if not same]
            assert not differ, f"rank {rank}: a second identical call gave different {differ}"


def _run_and_check(world, cases, tmp_path, device):
    ranks = _spawn(world, cases, tmp_path, device)
    failures = []
    for c in cases:
        try:
            _check_case(c, ranks, device)
        except AssertionError as e:
            failures.append(f"{case_id(c)}: {e}")
    assert not failures, "\n".join(failures)


@CPU_ONLY
@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"W{w}")
def test_ring_attention_matches_reference(world, tmp_path):
    _run_and_check(world, CASES[world], tmp_path, "cpu")


@pytest.mark.parametrize("world", sorted(CASES), ids=lambda w: f"W{w}")
def test_ring_attention_gpu_matches_reference(world, tmp_path):
    """One rank per GPU over NCCL: the CPU cases and the GPU_CASES (Hopper-kernel shapes)."""
    if GPU_COUNT < world:
        pytest.skip(f"needs {world} GPUs (this machine: {GPU_COUNT})")
    _run_and_check(world, CASES[world] + GPU_CASES[world], tmp_path, "cuda")
