"""One rank of the multi-process ring tests (test_ring.py starts W of these with the spawn method).

Every rank makes the same whole-sequence inputs of a case (a generator seeded by the case), takes its shards,
runs ring_attention forward and backward (device "cpu": a gloo group, kernels through the Triton interpreter;
"cuda": GPU `rank` over NCCL), and saves its outputs and gradients (on the CPU) to out_dir/rank<r>.pt; a failure
is saved as its traceback in out_dir/error<r>.txt (the test reports it) before the process exits non-zero.
"""
import datetime
import os
import pathlib
import traceback

import torch

# the CPU path by design, also on a GPU machine: CPU tensors, gloo, kernels through the Triton interpreter. A
# spawned rank inherits the environment its parent has at start(): test_ring sets these around the starts only
# (set here at import, they took the GPU from every pytest process that collected test_ring)
CHILD_ENV = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}

GROUP_TIMEOUT_S = 90  # gloo / NCCL: a rank whose peer died stops waiting after this (the test's join timeout is longer)


def case_id(c):
    lay = f"{c['layout']}-{'causal' if c['causal'] else 'full'}"
    extra = ("-lse" if c.get("lse_grad") else "") + ("-repeat" if c.get("repeat") else "")
    return f"W{c['world']}-{lay}-B{c['B']}-S{c['S']}-Sk{c['Sk']}-H{c['Hq']}/{c['Hkv']}-D{c['D']}/{c['Dv']}{extra}"


def make_inputs(c):
    """The whole-sequence q, k, v, the output weights (dout) and lse weights (dlse) of case c, float16."""
    g = torch.Generator().manual_seed(c["seed"])

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(torch.float16)
    q, k, v = randn(c["B"], c["S"], c["Hq"], c["D"]), randn(c["B"], c["Sk"], c["Hkv"], c["D"]), \
        randn(c["B"], c["Sk"], c["Hkv"], c["Dv"])
    dout = torch.randn(c["B"], c["S"], c["Hq"], c["Dv"], generator=g)
    dlse = torch.randn(c["B"], c["Hq"], c["S"], generator=g)
    return q, k, v, dout, dlse


def _run_case(c, rank, world, device):
    import tileattn
    q, k, v, dout, dlse = (t.to(device) for t in make_inputs(c))
    shard = dict(rank=rank, world_size=world, layout=c["layout"])
    ql, kl, vl = (tileattn.shard_sequence(x, **shard).requires_grad_() for x in (q, k, v))
    dout_l, dlse_l = tileattn.shard_sequence(dout, **shard), tileattn.shard_sequence(dlse, seq_dim=2, **shard)
    out, lse = tileattn.ring_attention(ql, kl, vl, causal=c["causal"], scale=c.get("scale"), layout=c["layout"],
                                       return_lse=True)
    loss = (out.float() * dout_l).sum()
    if c.get("lse_grad"):
        loss = loss + (lse * dlse_l).sum()
    dq, dk, dv = torch.autograd.grad(loss, (ql, kl, vl))
    return {"out": out.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_rank(rank, world, rendezvous, cases, out_dir, device="cpu"):
    """The process body: init the group (gloo on the CPU, NCCL on GPU `rank`), run every case of this world
    size, save the results."""
    out_dir = pathlib.Path(out_dir)
    try:
        torch.set_num_threads(1)  # W processes share the machine's cores
        import torch.distributed as dist
        if device == "cuda":
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{rendezvous}",
                                rank=rank, world_size=world, timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
        results = {}
        for c in cases:
            res = _run_case(c, rank, world, device)
            if c.get("repeat"):  # the same call again: bit-identical outputs and gradients
                again = _run_case(c, rank, world, device)
                res["identical"] = {name: bool(torch.equal(res[name], again[name])) for name in again}
            results[case_id(c)] = {name: t.cpu() if isinstance(t, torch.Tensor) else t for name, t in res.items()}
        dist.barrier()  # nobody tears the group down while a peer still talks to it
        dist.destroy_process_group()
        torch.save(results, out_dir / f"rank{rank}.pt")
    except BaseException:  # noqa: BLE001 - any failure (KeyboardInterrupt too) is written out for the test
        (out_dir / f"error{rank}.txt").write_text(traceback.format_exc())
        os._exit(1)
