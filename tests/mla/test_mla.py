"""MLA decode over a paged cache against the float32 reference, under the tolerance rule.

Pages are shuffled (never contiguous), and unused page slots and unused pages hold NaN, so a kernel that
reads a token it should not, or a page of another sequence, fails. The CPU runs (interpreter) use a small
Dc / Dr; the `gpu` ones DeepSeek's 512 / 64.
"""
import contextlib
import dataclasses

import pytest
import torch

import tileattn
from tileattn import hw
from tileattn.ops.mla.configs import (
    PLAIN_BELOW_CHUNK,
    SM90_FP8,
    SM90_FP8_CONFIGS,
    SM90_PAIR,
    SM90_SHARD,
    SM90_SHARD_FP8,
    MLASm90Config,
    smem_bytes,
)
from tileattn.ops.mla.reference import mla_decode_ref

from tests.helpers import assert_close, paged_caches, plan_only_device, randn


def make_cache(lens, page_size, dc, dr, dtype, device, spare_pages=3):
    """Shuffled pages for sequences of `lens` tokens; every slot no sequence uses is NaN."""
    (ckv, kpe), table = paged_caches(lens, page_size, [(dc,), (dr,)], dtype, device, spare_pages)
    return ckv, kpe, table, torch.tensor(lens, dtype=torch.int32, device=device)


def run_case(lens, page_size, hq, sq, dc, dr, dtype, device, causal=True, scale=None, plan_form=False,
             portable=False, cache_dtype=None, kv_scale=1.0, programs=None, config=None):
    """Checks one problem; returns the plan when plan_form (portable: the plan gets the portable kernel's
    config, so the Hopper kernel is not used; config: this config forced on the plan). cache_dtype: an fp8
    cache (the values quantized, NaN kept)."""
    ckv, kpe, table, seqlens = make_cache(lens, page_size, dc, dr, dtype, device)
    if cache_dtype is not None:
        ckv, kpe = ckv.to(cache_dtype), kpe.to(cache_dtype)
    qn = randn(len(lens), sq, hq, dc, dtype=dtype, device=device)
    qp = randn(len(lens), sq, hq, dr, dtype=dtype, device=device)
    if plan_form:
        force = tileattn.force_backend("mla.triton") if portable else \
            tileattn.force_backend(config=config) if config is not None else contextlib.nullcontext()
        with force:
            plan = tileattn.MLADecodePlan(seqlens, num_heads=hq, q_len=sq, head_dim_ckv=dc, head_dim_kpe=dr,
                                          page_size=page_size, dtype=dtype, causal=causal, scale=scale,
                                          cache_dtype=cache_dtype)
        plan.out.fill_(float("nan"))
        plan.lse.fill_(float("nan"))
        plan.programs = programs
        out, lse = plan.run(qn, qp, ckv, kpe, table, kv_scale=kv_scale, return_lse=True)
    else:
        out, lse = tileattn.mla_decode(qn, qp, ckv, kpe, table, seqlens, causal=causal, scale=scale,
                                       return_lse=True, kv_scale=kv_scale)
    ks = float(kv_scale)
    ref, lse_ref = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens, causal=causal, scale=scale, kv_scale=ks)
    ref_lp, lse_lp = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens, causal=causal, scale=scale, dtype=dtype,
                                    kv_scale=ks)
    assert out.shape == (len(lens), sq, hq, dc) and out.dtype == dtype
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp.float())
    return plan if plan_form else None


# (lens, page_size, Hq, Sq)
CPU_CASES = [
    ([1, 63, 64, 65, 0, 100], 16, 16, 1),
    ([5, 0, 33], 1, 4, 4),
    ([70, 3], 64, 16, 4),
    ([130], 32, 2, 1),
]


@pytest.mark.parametrize("case", CPU_CASES, ids=lambda c: f"lens{'_'.join(map(str, c[0]))}-p{c[1]}-h{c[2]}-sq{c[3]}")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_mla_small(case, causal, device):
    lens, page, hq, sq = case
    run_case(lens, page, hq, sq, 64, 16, torch.float16, device, causal=causal)


@pytest.mark.parametrize("plan_form", [False, True], ids=["function", "plan"])
def test_mla_fp8_cache(plan_form, device):
    """An e4m3 cache with a float32 scale (a number, or a tensor read in the kernel)."""
    kv_scale = 0.37 if not plan_form else torch.tensor([0.37], device=device)
    run_case([1, 40, 0, 65], 16, 4, 2, 64, 16, torch.float16, device, plan_form=plan_form,
             cache_dtype=torch.float8_e4m3fn, kv_scale=kv_scale)


def test_mla_plan_form_and_split(device, monkeypatch):
    """One long sequence among short ones is split into several work items and combined."""
    from tileattn.ops.mla import plan as plan_mod
    monkeypatch.setattr(plan_mod, "_WAVES", 1)
    plan = run_case([300, 7, 0, 45], 16, 4, 2, 64, 16, torch.float16, device, plan_form=True, scale=0.3)
    assert plan.num_slots >= 2, plan  # the long sequence was split


def test_mla_plan_without_combine(device):
    """Every sequence one work item and none empty: the combine launch is skipped (outputs and lse pre-filled
    with NaN by run_case must all be written by the split kernel), and a later update that splits or empties
    sequences brings it back."""
    lens = [33, 7, 90, 64, 5, 17, 40] * 20  # more sequences than SMs: none is split
    plan = run_case(lens, 16, 4, 1, 64, 16, torch.float16, device, plan_form=True)
    assert plan.num_slots == 0 and not plan.has_empty, plan
    ckv, kpe, table, seqlens = make_cache(lens, 16, 64, 16, torch.float16, device)
    qn = randn(len(lens), 1, 4, 64, dtype=torch.float16, device=device)
    qp = randn(len(lens), 1, 4, 16, dtype=torch.float16, device=device)
    plan.update(torch.tensor([33, 0] + lens[2:], dtype=torch.int32, device=device))
    plan.out.fill_(float("nan"))
    out = plan.run(qn, qp, ckv, kpe, table)
    assert plan.has_empty and torch.equal(out[1], torch.zeros_like(out[1])), plan


def test_mla_plan_replays_checked_runs(device):
    """A plan checks a run's tensors once per layout and replays the launches after that: new tensors of the
    same layout give their own results, a new layout (q head-major, lse requested) is checked and launched
    afresh, and after update() the tensors are checked against the new lengths again."""
    lens, hq, sq, dc, dr, dtype = [40, 7, 0, 90], 4, 2, 64, 16, torch.float16
    plan = tileattn.MLADecodePlan(torch.tensor(lens, dtype=torch.int32, device=device), num_heads=hq, q_len=sq,
                                  head_dim_ckv=dc, head_dim_kpe=dr, page_size=16, dtype=dtype)

    def check(qn, qp, ckv, kpe, table, lens, **kw):
        seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
        got = plan.run(qn, qp, ckv, kpe, table, **kw)
        out = got[0] if isinstance(got, tuple) else got
        ref, _ = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens)
        ref_lp, _ = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens, dtype=dtype)
        assert_close("out", out, ref, ref_lp)

    for _ in range(2):  # the second set of tensors takes the replayed launches
        ckv, kpe, table, _ = make_cache(lens, 16, dc, dr, dtype, device)
        qn, qp = (randn(len(lens), sq, hq, d, dtype=dtype, device=device) for d in (dc, dr))
        check(qn, qp, ckv, kpe, table, lens)
    assert plan.launchers
    qn_t = randn(len(lens), hq, sq, dc, dtype=dtype, device=device).transpose(1, 2)  # a new layout
    check(qn_t, qp, ckv, kpe, table, lens, return_lse=True)
    longer = [40, 7, 0, 2000]
    plan.update(torch.tensor(longer, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="block table"):
        plan.run(qn, qp, ckv, kpe, table)  # the same tensors as before, but the table is now too narrow
    ckv, kpe, table, _ = make_cache(longer, 16, dc, dr, dtype, device)
    check(qn, qp, ckv, kpe, table, longer)


def test_mla_chunk_choice():
    from tileattn.ops.common.paging import choose_chunk
    assert choose_chunk([32768] * 16, 64, 132) == 4096  # 128 pieces: one wave of 132 SMs
    assert choose_chunk([1024] * 768, 64, 132) == 1024  # more sequences than SMs: no split
    assert choose_chunk([8192], 64, 132) == 128  # at least two steps per piece
    assert choose_chunk([0, 0], 64, 4) == 64


def test_mla_schedule_covers_every_token():
    from tileattn.ops.mla.plan import schedule
    lens = [0, 1, 64, 65, 1000, 129]
    items, splits, slots = schedule(lens, 64)
    covered = {b: [] for b in range(len(lens))}
    for b, s, e, _slot in items:
        covered[b].append((s, e))
        assert 0 < e - s <= 64
    for b, n in enumerate(lens):
        spans = sorted(covered[b])
        assert sum(e - s for s, e in spans) == n and all(a[1] == c[0] for a, c in zip(spans, spans[1:]))
        first, count = splits[b]
        assert count == len(spans) and (count <= 1 or first >= 0)
    assert slots == sum(c for _, c in splits if c > 1)
    assert [e - s for _, s, e, _ in items] == sorted((e - s for _, s, e, _ in items), reverse=True)


def test_mla_bad_inputs(device):
    ckv, kpe, table, seqlens = make_cache([10, 20], 16, 64, 16, torch.float16, device)
    qn = randn(2, 1, 4, 64, dtype=torch.float16, device=device)
    qp = randn(2, 1, 4, 16, dtype=torch.float16, device=device)
    with pytest.raises(ValueError, match="block_table"):
        bad = table.clone()
        bad[1, 0] = ckv.shape[0]
        tileattn.mla_decode(qn, qp, ckv, kpe, bad, seqlens)
    with pytest.raises(ValueError, match="cache_seqlens"):
        tileattn.mla_decode(qn, qp, ckv, kpe, table, torch.tensor([10, 40], dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="cache_seqlens"):
        tileattn.mla_decode(qn, qp, ckv, kpe, table, seqlens.long())
    with pytest.raises(ValueError, match="kpe_cache"):
        tileattn.mla_decode(qn, qp, ckv, kpe[..., :8], table, seqlens)
    with pytest.raises(ValueError, match="ckv_cache"):
        tileattn.mla_decode(qn, qp, ckv[..., :32], kpe, table, seqlens)
    with pytest.raises(TypeError, match="ckv_cache"):
        tileattn.mla_decode(qn, qp, ckv.float(), kpe, table, seqlens)
    with pytest.raises(TypeError, match="kpe_cache"):
        tileattn.mla_decode(qn, qp, ckv.to(torch.float8_e4m3fn), kpe, table, seqlens)
    with pytest.raises(ValueError, match="kv_scale"):
        tileattn.mla_decode(qn, qp, ckv, kpe, table, seqlens, kv_scale=-1.0)
    with pytest.raises(ValueError, match="kv_scale"):
        tileattn.mla_decode(qn, qp, ckv, kpe, table, seqlens, kv_scale=torch.ones(2, device=device))
    with pytest.raises(TypeError, match="cache_dtype"):
        tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=16,
                               dtype=torch.float16, cache_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="num_heads"):
        tileattn.MLADecodePlan(seqlens, num_heads=129, head_dim_ckv=64, head_dim_kpe=16, page_size=16)
    with pytest.raises(ValueError, match="page_size"):
        tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=24)
    with pytest.raises(ValueError, match="Dc"):
        tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=96, head_dim_kpe=16, page_size=16)
    plan = tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=16,
                                  dtype=torch.float16)
    with pytest.raises(ValueError, match="q_nope"):
        plan.run(qn[:, :, :2], qp, ckv, kpe, table)
    with pytest.raises(ValueError, match="batch"):
        plan.update(torch.tensor([1, 2, 3], dtype=torch.int32, device=device))


@pytest.mark.parametrize("kw,match", [
    ({"scale": float("inf")}, "scale"), ({"scale": True}, "scale"), ({"scale": "0.1"}, "scale"),
    ({"kv_scale": True}, "kv_scale"), ({"causal": "False"}, "causal"),
], ids=["scale_inf", "scale_bool", "scale_str", "kv_scale_bool", "causal_str"])
def test_mla_bad_options(device, kw, match):
    """scale / kv_scale finite numbers (not bools or strings), causal a bool: these ran with all-NaN output,
    a bool read as a number, "False" read as True, or an unclear TypeError."""
    ckv, kpe, table, seqlens = make_cache([10, 20], 16, 64, 16, torch.float16, device)
    qn = randn(2, 1, 4, 64, dtype=torch.float16, device=device)
    qp = randn(2, 1, 4, 16, dtype=torch.float16, device=device)
    with pytest.raises((ValueError, TypeError), match=match):
        tileattn.mla_decode(qn, qp, ckv, kpe, table, seqlens, **kw)
    if "kv_scale" not in kw:
        with pytest.raises((ValueError, TypeError), match=match):
            tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=16,
                                   dtype=torch.float16, **kw)


@pytest.mark.parametrize("kw,name", [({"num_heads": 4.0}, "num_heads"), ({"q_len": 1.5}, "q_len"),
                                     ({"q_len": True}, "q_len"), ({"page_size": 16.0}, "page_size"),
                                     ({"head_dim_ckv": 64.0}, "head_dim_ckv")])
def test_mla_plan_int_args(device, kw, name):
    seqlens = torch.tensor([4], dtype=torch.int32, device=device)
    args = dict(num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=16, dtype=torch.float16) | kw
    with pytest.raises(TypeError, match=f"{name}.*: expected an int"):
        tileattn.MLADecodePlan(seqlens, **args)
    np = pytest.importorskip("numpy")  # numpy's ints are ints
    plan = tileattn.MLADecodePlan(seqlens, **(args | {name: np.int64(4 if name in ("num_heads", "q_len") else 16
                                                                        if name == "page_size" else 64)}))
    assert type(getattr(plan, {"head_dim_ckv": "dc"}.get(name, name))) is int


def test_mla_overlapping_outputs(device):
    """An out / lse whose elements share memory (expand) would be written by several rows: rejected."""
    ckv, kpe, table, seqlens = make_cache([10, 20], 16, 64, 16, torch.float16, device)
    qn = randn(2, 1, 4, 64, dtype=torch.float16, device=device)
    qp = randn(2, 1, 4, 16, dtype=torch.float16, device=device)
    plan = tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=16,
                                  dtype=torch.float16)
    with pytest.raises(ValueError, match="out: its elements overlap"):
        plan.run(qn, qp, ckv, kpe, table, out=torch.empty(2, 1, 1, 64, dtype=torch.float16,
                                                           device=device).expand(2, 1, 4, 64))
    with pytest.raises(ValueError, match="lse: its elements overlap"):
        plan.run(qn, qp, ckv, kpe, table, lse=torch.empty(2, 1, 1, device=device).expand(2, 4, 1), return_lse=True)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("hq,sq", [(16, 1), (128, 1), (16, 4), (128, 4)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_mla(page_size, hq, sq, dtype, device):
    run_case([1, 63, 64, 65, 0, 1000, 4097, 17], page_size, hq, sq, 512, 64, dtype, device)


def _sm90(device):
    from tileattn.ops.mla import dispatch
    plan = tileattn.MLADecodePlan(torch.full((2,), 100, dtype=torch.int32, device=device), num_heads=64)
    return dispatch.SM90.supports(plan)[0]


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [64, 128])
@pytest.mark.parametrize("hq,sq", [(64, 1), (32, 2), (20, 3), (128, 2)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_mla_sm90(page_size, hq, sq, causal, device):
    """The Hopper kernel (when the GPU has it) and the portable one on the same problems: lengths around the
    step and page sizes, an empty sequence, a sequence split over many work items, rows past Sq * Hq in a tile.
    """
    for force_portable in (False, True):
        plan = run_case([1, 63, 64, 65, 0, 129, 5000, 191], page_size, hq, sq, 512, 64, torch.bfloat16, device,
                        causal=causal, plan_form=True, portable=force_portable, kv_scale=0.75)
        assert (plan.sm90 is not None) == (_sm90(device) and not force_portable), plan


SHARD = SM90_SHARD  # the table's QK_SHARD config
FP8 = SM90_FP8  # the fp8 table's config without QK_SHARD


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [32, 64, 128])
@pytest.mark.parametrize("hq,sq", [(128, 1), (64, 1), (32, 2), (20, 3), (128, 2)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_mla_sm90_qk_shard(page_size, hq, sq, causal, device):
    """The QK_SHARD kernel (warpgroups alternating the steps' scores): tiles of one step (warpgroup 1 owns
    none), of odd and even step counts, lengths around the 32-token step, an empty sequence, split items."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    plan = run_case([1, 31, 32, 33, 63, 64, 65, 0, 96, 129, 5000, 191], page_size, hq, sq, 512, 64,
                    torch.bfloat16, device, causal=causal, plan_form=True, kv_scale=0.75, config=SHARD)
    assert plan.sm90 == SHARD, plan


@pytest.mark.gpu
@pytest.mark.parametrize("hq,sq", [(128, 1), (64, 1), (64, 2), (20, 3)])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gpu_mla_sm90_seesaw(hq, sq, causal, dtype, device):
    """The seesaw kernel's pair schedule (64-token blocks owned alternately and taken in pairs, output split by
    columns, a 2-block ring freed per half): tiles of one block (warpgroup 1 owns none), of odd and even block
    counts (odd counts end on a lone block), lengths around the block and the page, an empty sequence, split items
    (start / end inside a sequence: 3000 tokens)."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    plan = run_case([1, 63, 64, 65, 0, 127, 128, 129, 3000, 191], 64, hq, sq, 512, 64, dtype, device,
                    causal=causal, plan_form=True, kv_scale=0.75, config=SM90_PAIR)
    assert plan.sm90 == SM90_PAIR, plan


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [0, 1, 3])
@pytest.mark.parametrize("page_size", [64, 128])
def test_gpu_mla_sm90_seesaw_few_ctas(programs, page_size, device):
    """The seesaw kernel with 1 or 3 CTAs walking every tile (0: one per SM, the plan's): the ring's slot and
    parity and the phases of the P and row-maxima exchanges carry across tiles of odd and even block counts, two
    row tiles per item."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    run_case([1, 64, 128, 192, 0, 3000, 65, 4097, 63, 129, 256], page_size, 128, 1, 512, 64, torch.bfloat16, device,
             plan_form=True, programs=programs or None, config=SM90_PAIR)


def test_mla_sm90_seesaw_config():
    """The seesaw config (the pair schedule) refuses what its kernel does not serve; its shared memory fits the
    sm90 budget."""
    assert smem_bytes(SM90_PAIR, 512, 64) == 231936 <= 232448
    for kw, match in ((dict(block_n=32), "block_n=64"), (dict(stages=3), "stages=2"),
                      (dict(qk_shard=True), "qk_shard"), (dict(fp8_stages=2), "fp8")):
        with pytest.raises(ValueError, match=match):
            MLASm90Config(**{**dict(block_n=64, stages=2, seesaw=True), **kw})


def test_mla_sm90_seesaw_backend_config(monkeypatch):
    """Forced on a plan, the seesaw config reaches the Hopper backend only where its kernel serves the plan: pages
    of whole 64-token blocks, Dr <= 64 (the rope part of Q in registers), 16-bit caches, the sm90 budget."""
    import types

    from tileattn.ops.mla import launch_sm90
    monkeypatch.setattr(launch_sm90.hw, "device_info", lambda device: hw.DeviceInfo(90, 132, 232448))

    def plan(page_size=64, dr=64, cache_dtype=torch.bfloat16):
        return types.SimpleNamespace(device=torch.device("cpu"), page_size=page_size, dc=512, dr=dr, rows=128,
                                     cache_dtype=cache_dtype, first_chunk=None)
    with tileattn.force_backend(config=SM90_PAIR):
        assert launch_sm90.Sm90Backend().config(plan()) == SM90_PAIR
        assert launch_sm90.Sm90Backend().config(plan(page_size=128)) == SM90_PAIR
        for bad in (plan(page_size=32), plan(dr=128), plan(cache_dtype=torch.float8_e4m3fn)):
            assert launch_sm90.Sm90Backend().config(bad) is None


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 2, 3])
def test_gpu_mla_sm90_qk_shard_few_ctas(programs, device):
    """Few CTAs walking every tile with the QK_SHARD kernel: the barriers' phases carry across tiles of odd and
    even step counts (two CTAs: each sees every other tile)."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    run_case([1, 32, 64, 96, 128, 160, 0, 3000, 33, 4097, 65, 31], 64, 128, 1, 512, 64, torch.bfloat16, device,
             plan_form=True, programs=programs, config=SHARD)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3])
def test_gpu_mla_sm90_few_ctas(programs, device):
    """Few CTAs walking every tile of the persistent grid: the ring wraps inside tiles, tiles shorter than,
    equal to and longer than the ring."""
    run_case([1, 32, 64, 96, 128, 160, 0, 3000, 33, 4097], 64, 64, 2, 512, 64, torch.bfloat16, device,
             plan_form=True, programs=programs)


@pytest.mark.gpu
def test_gpu_mla_sm90_fallback(device):
    """A plan made for the Hopper kernel whose run gets tensors TMA cannot take (q head-major, rows not
    mergeable) runs the portable kernel on the plan's schedule: split items whose ends are not multiples of
    the portable kernel's step."""
    lens = [6000, 100, 0]
    ckv, kpe, table, seqlens = make_cache(lens, 64, 512, 64, torch.bfloat16, device)
    qn = randn(len(lens), 64, 2, 512, dtype=torch.bfloat16, device=device).transpose(1, 2)
    qp = randn(len(lens), 64, 2, 64, dtype=torch.bfloat16, device=device).transpose(1, 2)
    plan = tileattn.MLADecodePlan(seqlens, num_heads=64, q_len=2, page_size=64)
    out, lse = plan.run(qn, qp, ckv, kpe, table, return_lse=True)
    ref, lse_ref = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens)
    ref_lp, lse_lp = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens, dtype=torch.bfloat16)
    assert_close("out", out, ref, ref_lp)
    assert_close("lse", lse, lse_ref, lse_lp.float())


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("hq,sq", [(16, 1), (64, 1), (20, 3), (128, 2)])
def test_gpu_mla_fp8_cache(page_size, hq, sq, device):
    """e4m3 caches: on the Hopper kernels (the consumers widen the steps) where pages hold whole steps, else the
    portable kernel; a scale tensor and a number."""
    plan = run_case([1, 63, 64, 65, 0, 1000, 4097], page_size, hq, sq, 512, 64, torch.bfloat16, device,
                    cache_dtype=torch.float8_e4m3fn, kv_scale=torch.tensor([0.05], device=device), plan_form=True)
    assert (plan.sm90 is not None) == (_sm90(device) and page_size == 64), plan
    assert plan.sm90 is None or plan.sm90.fp8_stages > 0, plan
    run_case([3, 700], page_size, hq, sq, 512, 64, torch.bfloat16, device, cache_dtype=torch.float8_e4m3fn,
             kv_scale=2.5)


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [1, 3])
@pytest.mark.parametrize("hq", [64, 128])
def test_gpu_mla_sm90_fp8_few_ctas(programs, hq, device):
    """The fp8 ring's phases over many tiles per CTA (tiles of 1-94 steps; fp16 q: the widening to fp16)."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    plan = run_case([1, 31, 32, 33, 0, 96, 129, 3000, 191], 64, hq, 2, 512, 64, torch.float16, device,
                    plan_form=True, programs=programs, config=FP8, cache_dtype=torch.float8_e4m3fn, kv_scale=0.3)
    assert plan.sm90 == FP8, plan


@pytest.mark.gpu
@pytest.mark.parametrize("programs", [0, 1, 3])
@pytest.mark.parametrize("hq,sq,causal", [(128, 1, False), (64, 1, False), (20, 3, True), (128, 2, True)])
def test_gpu_mla_sm90_qk_shard_fp8(programs, hq, sq, causal, device):
    """e4m3 caches on the QK_SHARD kernel (SM90_SHARD_FP8: each warpgroup widens its half of every step at its
    turns): tiles of 1, 2, 3 and more steps (the widening before a tile's first turn), odd and even step counts,
    an empty sequence, split items; one CTA or three walking every tile (the fp8 ring's and the 16-bit ring's
    phases across tiles), bf16 and fp16 q."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    for dtype in (torch.bfloat16, torch.float16):
        plan = run_case([1, 31, 32, 33, 64, 65, 96, 0, 129, 3000, 191], 64, hq, sq, 512, 64, dtype, device,
                        causal=causal, plan_form=True, programs=programs, config=SM90_SHARD_FP8,
                        cache_dtype=torch.float8_e4m3fn, kv_scale=0.3)
        assert plan.sm90 == SM90_SHARD_FP8, plan


# the fp8 widening's switches (MLASm90Config.widen_once / fence_late), every combination: the tables hold one
# each (configs.SM90_SHARD_FP8, SM90_FP8), a forced config any
WIDEN = [dict(widen_once=o, fence_late=f) for o in (False, True) for f in (False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("switches", WIDEN, ids=["off", "late", "once", "once_late"])
@pytest.mark.parametrize("base", [SM90_SHARD_FP8, FP8], ids=["qk_shard", "plain"])
def test_gpu_mla_sm90_fp8_widen(base, switches, device):
    """The widening switches on both fp8 kernels, checked as test_gpu_mla_sm90_qk_shard_fp8: tiles of 1, 2, 3 and
    more steps (ragged lengths, an empty sequence, split items); two row tiles per item (Hq 128) walked by one
    CTA, bf16 q; causal rows of Sq 3 over three CTAs, fp16 q (the widening to fp16)."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    cfg = dataclasses.replace(base, **switches)
    for dtype, hq, sq, causal, programs in ((torch.bfloat16, 128, 1, False, 1), (torch.float16, 20, 3, True, 3)):
        plan = run_case([1, 31, 32, 33, 64, 65, 96, 0, 129, 3000, 191], 64, hq, sq, 512, 64, dtype, device,
                        causal=causal, plan_form=True, programs=programs, config=cfg,
                        cache_dtype=torch.float8_e4m3fn, kv_scale=0.3)
        assert plan.sm90 == cfg, plan


@pytest.mark.gpu
@pytest.mark.parametrize("budget", ["sm89", "sm80"])
def test_gpu_mla_smem_budget(budget, device, monkeypatch):
    monkeypatch.setenv("TILEATTN_SMEM_BUDGET", budget)
    for hq in (16, 128):
        plan = run_case([1, 65, 3000, 0, 200], 64, hq, 2, 512, 64, torch.bfloat16, device, plan_form=True)
        # the configuration chosen for the emulated budget must itself fit it
        assert plan.compiled.metadata.shared <= hw.device_info(plan.device).smem_per_block, plan


def test_mla_sm90_16bit_configs(monkeypatch):
    """The Hopper backend's config for a 16-bit plan: the pair schedule at every row count it serves (16 rows and up:
    one partial tile, one tile, two) unless one row tile has short items (configs.PLAIN_BELOW_CHUNK: the plain kernel
    first); QK_SHARD where pages hold 32-token steps but not 64-token blocks; a config without either where neither
    fits (Dr > 64: their rope Q lives in registers); none where no config divides the page size (16: the portable
    kernel serves)."""
    from types import SimpleNamespace

    from tileattn import hw
    from tileattn.ops.mla.configs import PLAIN_BELOW_CHUNK, SM90_CONFIGS, SM90_PAIR
    from tileattn.ops.mla.launch_sm90 import Sm90Backend
    monkeypatch.setattr(hw, "device_info", lambda d: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    backend = Sm90Backend()

    def plan(rows=64, page_size=64, dr=64, chunk=None, cache_dtype=None):
        return SimpleNamespace(page_size=page_size, dc=512, dr=dr, cache_dtype=cache_dtype, rows=rows, device="cuda",
                               first_chunk=chunk)
    for rows in (16, 32, 64, 128, 256):
        assert backend.config(plan(rows)) == SM90_PAIR, rows
        assert backend.config(plan(rows, page_size=128)) == SM90_PAIR, rows
        assert backend.config(plan(rows, page_size=32)) == SM90_SHARD, rows
    cfg = backend.config(plan(dr=128))
    assert not cfg.qk_shard and not cfg.seesaw and cfg in SM90_CONFIGS
    assert backend.config(plan(page_size=16)) is None
    # one row tile of short items (configs.PLAIN_BELOW_CHUNK): the plain kernel first; more rows, or long items: the
    # pair
    for rows, chunk, first in ((64, 256, SM90_CONFIGS[0]), (16, 64, SM90_CONFIGS[0]),
                               (64, PLAIN_BELOW_CHUNK, SM90_PAIR), (128, 256, SM90_PAIR), (16, 4096, SM90_PAIR)):
        assert backend.config(plan(rows, chunk=chunk)) == first, (rows, chunk)
    # fp8 caches keep their table
    assert backend.config(plan(chunk=64, cache_dtype=torch.float8_e4m3fn)) == SM90_SHARD_FP8


@pytest.mark.parametrize("batch,kv,hq,sq,short", [(4, 8192, 64, 1, True), (1, 32768, 64, 1, True),
                                                  (32, 1024, 16, 4, True), (128, 1024, 64, 1, False),
                                                  (768, 1024, 16, 1, False), (16, 8192, 64, 1, False),
                                                  (4, 0, 64, 1, None)])
def test_mla_plan_first_chunk(batch, kv, hq, sq, short, monkeypatch):
    """The plan's first_chunk (what chooses the Gluon kernel's config) on a 132-SM Hopper: the bench's rows where
    the long-item kernels measured slower (items of 256 tokens: batch 4 x 8K, 1 x 32K, 32 x 1K at Sq 4) are short,
    the others not; all-zero (placeholder) lengths give None, so the pair schedule."""
    from tileattn import hw
    from tileattn.ops.mla.configs import PLAIN_BELOW_CHUNK
    monkeypatch.setattr(hw, "device_info", lambda d: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    dev = plan_only_device(monkeypatch)
    plan = tileattn.MLADecodePlan(torch.full((batch,), kv, dtype=torch.int32, device=dev), num_heads=hq, q_len=sq)
    if short is None:
        assert plan.first_chunk is None
        return
    assert plan.first_chunk % 64 == 0 and (plan.first_chunk < PLAIN_BELOW_CHUNK) == short, plan.first_chunk


def test_mla_sm90_fp8_configs(monkeypatch):
    """The Hopper backend's config for an fp8 plan: the fp8 table's first (QK_SHARD), the one without QK_SHARD where
    only it fits the shared memory; a forced QK_SHARD one needs >= 3 16-bit and >= 2 fp8 steps (its widening
    order needs both: gluon_sm90_shard._consumer); all within the H100's shared memory."""
    from types import SimpleNamespace

    from tileattn import hw
    from tileattn.ops.mla.configs import smem_bytes
    from tileattn.ops.mla.launch_sm90 import Sm90Backend
    monkeypatch.setattr(hw, "device_info", lambda d: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    plan = SimpleNamespace(page_size=64, dc=512, dr=64, cache_dtype=torch.float8_e4m3fn, rows=128, device="cuda",
                           first_chunk=None)
    backend = Sm90Backend()
    assert SM90_FP8_CONFIGS[0] == SM90_SHARD_FP8 and backend.config(plan) == SM90_SHARD_FP8
    monkeypatch.setattr(hw, "device_info", lambda d: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=222800))
    assert backend.config(plan) == FP8  # (QK_SHARD's fp8 config needs 223,232 bytes, this one 222,208)
    monkeypatch.setattr(hw, "device_info", lambda d: hw.DeviceInfo(arch=90, num_sms=132, smem_per_block=232448))
    assert smem_bytes(SM90_SHARD_FP8, 512, 64) <= 232448
    with tileattn.force_backend(config=SM90_SHARD_FP8):
        assert backend.config(plan) == SM90_SHARD_FP8
    for bad in (dict(fp8_stages=1), dict(stages=2)):
        with tileattn.force_backend(config=dataclasses.replace(SM90_SHARD_FP8, **bad)):
            assert backend.config(plan) is None, bad
    for cfg in (dataclasses.replace(base, **switches) for base in (SM90_SHARD_FP8, FP8) for switches in WIDEN):
        with tileattn.force_backend(config=cfg):  # the widening switches change no fit
            assert backend.config(plan) == cfg
    # the switches on a 16-bit config (which never passes them to a kernel) or with steps too large to hold whole
    # (each switch alone: SM90_SHARD_FP8 has widen_once on, so fence_late's case turns it off)
    for bad in (dict(fp8_stages=0, widen_once=True, fence_late=False),
                dict(fp8_stages=0, widen_once=False, fence_late=True),
                dict(block_n=64, widen_once=True)):
        with pytest.raises(ValueError, match="MLASm90Config"):
            dataclasses.replace(SM90_SHARD_FP8, **bad)


def test_mla_plan_kv_scale_changes(device, monkeypatch):
    """A plan's runs with a number kv_scale: the fill of its scale buffer is skipped while the number stays the
    same, and the output follows every change (a, a, b, a, then a tensor, then a again)."""
    lens = [40, 7]
    ckv, kpe, table, seqlens = make_cache(lens, 16, 64, 16, torch.float16, device)
    ckv, kpe = ckv.to(torch.float8_e4m3fn), kpe.to(torch.float8_e4m3fn)
    qn = randn(len(lens), 1, 4, 64, dtype=torch.float16, device=device)
    qp = randn(len(lens), 1, 4, 16, dtype=torch.float16, device=device)
    plan = tileattn.MLADecodePlan(seqlens, num_heads=4, head_dim_ckv=64, head_dim_kpe=16, page_size=16,
                                  dtype=torch.float16, cache_dtype=torch.float8_e4m3fn)
    fills = []
    real = torch.Tensor.fill_
    monkeypatch.setattr(torch.Tensor, "fill_", lambda t, v: (fills.append(v) if t is plan.kv_scale else None,
                                                             real(t, v))[1])
    for ks in (0.5, 0.5, 2.0, 0.5, torch.tensor([2.0], device=device), 0.5):
        out = plan.run(qn, qp, ckv, kpe, table, kv_scale=ks)
        ref, _ = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens, kv_scale=float(ks))
        ref_lp, _ = mla_decode_ref((qn, qp), (ckv, kpe), table, seqlens, dtype=torch.float16, kv_scale=float(ks))
        assert_close("out", out, ref, ref_lp)
    assert fills == [0.5, 2.0, 0.5]  # (the tensor run leaves the buffer alone: 0.5 is still in it)


@pytest.mark.gpu
def test_gpu_mla_cuda_graph(device):
    """run() captured in a CUDA graph replays to the eager output; update() re-plans into the same buffers."""
    lens = [5, 3000, 64, 0, 777]
    ckv, kpe, table, seqlens = make_cache(lens, 64, 512, 64, torch.bfloat16, device)
    qn = randn(len(lens), 1, 64, 512, dtype=torch.bfloat16, device=device)
    qp = randn(len(lens), 1, 64, 64, dtype=torch.bfloat16, device=device)
    plan = tileattn.MLADecodePlan(seqlens, num_heads=64, page_size=64)
    eager = plan.run(qn, qp, ckv, kpe, table).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run(qn, qp, ckv, kpe, table)  # warm-up (compiles) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = plan.run(qn, qp, ckv, kpe, table)
    plan.out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    shorter = torch.tensor([4, 2000, 64, 0, 700], dtype=torch.int32, device=device)
    plan.update(shorter)
    graph.replay()
    ref, _ = mla_decode_ref((qn, qp), (ckv, kpe), table, shorter)
    ref_lp, _ = mla_decode_ref((qn, qp), (ckv, kpe), table, shorter, dtype=torch.bfloat16)
    assert_close("out", out, ref, ref_lp)
    # a number kv_scale after the capture: each eager run writes its own into the scale buffer, which the
    # replays overwrite with the captured 1.0
    scaled = plan.run(qn, qp, ckv, kpe, table, kv_scale=0.5).clone()
    graph.replay()
    replayed = out.clone()  # (out is plan.out, which the eager runs write too)
    again = plan.run(qn, qp, ckv, kpe, table, kv_scale=0.5)
    torch.cuda.synchronize()
    assert torch.equal(again, scaled) and not torch.equal(replayed, scaled)


@pytest.mark.gpu
@pytest.mark.parametrize("hq,sq", [(16, 1), (64, 1), (16, 4), (128, 1)])
def test_gpu_mla_table_long_items(hq, sq, device):
    """The default table on one row tile or two with items of 512+ tokens: on Hopper the pair schedule (the other
    default-table tests have short items, which take the plain kernel)."""
    lens = [9000, 8191, 0, 8257, 1, 9100, 8500, 8800, 8704, 9001]
    plan = run_case(lens, 64, hq, sq, 512, 64, torch.bfloat16, device, plan_form=True)
    if _sm90(device):
        assert plan.config == SM90_PAIR and plan.first_chunk >= PLAIN_BELOW_CHUNK, plan


@pytest.mark.gpu
@pytest.mark.parametrize("dc,dr", [(256, 32), (128, 64), (64, 16)])
@pytest.mark.parametrize("hq,sq", [(64, 1), (128, 2)])
def test_gpu_mla_pair_head_dims(dc, dr, hq, sq, device):
    """The pair schedule (the table's first on Hopper for pages of 64-token blocks and Dr <= 64) at other head dims
    than DeepSeek's 512 / 64: ckv boxes of min(64, Dc / 2) columns, a narrower rope part; causal, ragged lengths, an
    empty sequence, split items."""
    if not _sm90(device):
        pytest.skip("no Hopper kernel on this GPU")
    run_case([1, 63, 64, 65, 0, 129, 3000, 191], 64, hq, sq, dc, dr, torch.bfloat16, device, plan_form=True,
             config=SM90_PAIR)
