"""The `tileattn` command: version, option validation, the GPU suites' refusal without a GPU, the demo."""
import pytest
import torch

from tileattn import __version__, cli


def _run(capsys, *argv):
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:  # argparse's errors and --version
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_version(capsys):
    rc, text = _run(capsys, "--version")
    assert rc == 0 and text.strip() == f"tileattn {__version__}"


@pytest.mark.parametrize("argv, needle", [
    (("bench", "--providers", "bogus"), "--providers"),
    (("bench", "--providers", ""), "--providers"),
    (("bench", "--head-dims", "abc"), "--head-dims"),
    (("bench", "--head-dims", "64,-1"), "--head-dims"),
    (("bench", "--seqlens", "1k"), "--seqlens"),
    (("bench", "fp8", "--fp8-dtypes", "e4m3,e3m4"), "--fp8-dtypes"),
    (("bench", "nosuchsuite"), "invalid choice"),
    (("bench", "mla", "--quick"), "--quick does not apply to `bench mla`"),
    (("bench", "decode", "--dtype", "bf16"), "--dtype does not apply to `bench decode`"),
    (("bench", "flex", "--seqlens", "1024"), "--seqlens does not apply"),
    (("bench", "large-d", "--providers", "cudnn"), "--providers does not apply"),
    (("bench", "demo", "--out", "x.json"), "do not apply to `bench demo`"),
    (("bench", "fp8", "--append", "x.json"), "--append does not apply"),
    (("bench", "bwd", "--cluster"), "--cluster does not apply"),
    (("bench", "--long", "--append", "/nonexistent/dense.json"), "no such results file"),
])
def test_bad_options_exit_2(capsys, argv, needle):
    rc, text = _run(capsys, *argv)
    assert rc == 2
    assert needle in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
@pytest.mark.parametrize("suite", cli.GPU_SUITES)
def test_gpu_suites_refuse_without_gpu(capsys, suite, tmp_path):
    rc, text = _run(capsys, "bench", suite, "--out", str(tmp_path / "x.json"))
    assert rc == 2
    assert "no CUDA GPU" in text and "bench demo" in text
    assert not (tmp_path / "x.json").exists()


def test_every_suite_documents_its_options():
    assert set(cli.SUITE_OPTIONS) == set(cli.SUITES)
    for options in cli.SUITE_OPTIONS.values():
        assert options <= set(cli.OPTION_FLAGS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU: through the interpreter (the GPU suite runs it too)")
def test_demo_runs_and_passes(capsys):
    rc, text = _run(capsys, "bench", "demo")
    assert rc == 0, text
    assert "all within the tolerance rule" in text


def _row(N, provider, tflops, D=128):
    return {"case": {"B": 4, "H": 32, "N": N, "D": D, "causal": False, "dtype": "float16"}, "provider": provider,
            "ms": 1.0, "tflops": tflops, "gbps": None}


def test_dense_summary_s0_keys():
    """The seed's rows (N past 16K, fp8, one CTA per tile) get their own keys; the grid's keys stay over 1K-16K."""
    from tileattn.bench import dense
    rows = [_row(4096, "tileattn", 500), _row(4096, "cudnn", 550), _row(4096, "fa2", 350), _row(4096, "flex", 400),
            _row(4096, "tileattn-persistent", 500), _row(4096, "tileattn-1cta", 480), _row(65536, "tileattn", 640),
            _row(65536, "tileattn-persistent", 600), _row(65536, "cudnn", 500), _row(65536, "tileattn-1cta", 640),
            _row(65536, "tileattn-e4m3", 900), _row(65536, "tileattn-e5m2", None)]
    s = dense.summarize(rows)
    assert s["geomean_vs_cudnn"] == pytest.approx(500 / 550) and s["min_vs_fa2"] == pytest.approx(500 / 350)
    assert s["long_min_vs_cudnn"] == pytest.approx(1.28)
    assert s["long_e4m3_vs_fp16_min"] == pytest.approx(900 / 640)
    assert s["long_e5m2_vs_fp16_min"] == 0.0  # a row that failed its check counts as 0
    assert s["persistent_vs_one_cta_min"] == pytest.approx(600 / 640)
    assert s["persistent_vs_one_cta_max"] == pytest.approx(500 / 480)
    assert "long_min_vs_cudnn" not in dense.summarize(rows[:6])


def test_dense_s0_columns_only_when_asked():
    """The S0 grid's forced-config columns look the head dim's Hopper config up only when they are asked for: the
    default columns run at any head dim (D = 96 has no Hopper entry), and an S0 column forces the shipped
    per-shape config with its grid fields."""
    from tileattn.bench import dense
    from tileattn.ops.common.configs import sm90_dense_config
    q = torch.randn(1, 256, 4, 96)  # [B, N, H, D]
    fns, checks, contexts = dense._s0_providers(dense.PROVIDERS, q, q, q, False, torch.float16, 96)
    assert (fns, checks, contexts) == ({}, {}, {})
    q = torch.randn(1, 4096, 4, 64)
    fns, _, contexts = dense._s0_providers(("tileattn-1cta",), q, q, q, False, torch.float16, 64)
    assert list(contexts) == ["tileattn-1cta"]
    from tileattn.ops.common.backend import forced_config
    from tileattn.ops.common.configs import Sm90Config
    with contexts["tileattn-1cta"]():
        forced = forced_config(Sm90Config)
    assert forced.consumers == sm90_dense_config(64, torch.float16, 4096, False).consumers == 3
    assert not forced.persistent


def test_dense_append_replaces_same_case_rows(tmp_path):
    import json

    from tileattn.bench import dense
    path = tmp_path / "dense.json"
    old = [_row(4096, "tileattn", 500), _row(4096, "cudnn", 550), _row(65536, "tileattn", None)]
    old[2]["error"] = dense.NOT_TIMED  # the failed row this run replaces
    old.append(dict(_row(2048, "cudnn", None), error=dense.NOT_TIMED))  # one it keeps
    path.write_text(json.dumps({"suite": "dense", "commit": "abc", "date": "d", "rows": old}))
    doc = {}
    rows, failed = dense._merge(dense._load_appended(str(path), torch.float16), [_row(65536, "tileattn", 600)], doc)
    assert [(r["case"]["N"], r["provider"], r["tflops"]) for r in rows] == [
        (2048, "cudnn", None), (4096, "tileattn", 500), (4096, "cudnn", 550), (65536, "tileattn", 600)]
    assert len(failed) == 1 and doc == {"appended_to": [{"commit": "abc", "date": "d", "triton": None}]}
    with pytest.raises(ValueError, match="not a dense"):
        dense._load_appended(str(path), torch.bfloat16)


def _crow(N, causal, provider, tflops, triton="3.9.0"):
    row = dict(_row(N, provider, tflops), case={**_row(N, provider, tflops)["case"], "causal": causal})
    if provider in ("tileattn-sm90", "tileattn-cluster"):
        row["triton"] = triton
    return row


def test_dense_summary_cluster_keys():
    """cluster_vs_one_cta_best / _min are over the shapes where dispatch takes the cluster (causal from
    configs.CLUSTER_FROM); cluster_rows lists every shape that ran both, a failed cluster row as ratio 0."""
    from tileattn.bench import dense
    rows = []
    for causal, N, one, cl in [(False, 4096, 586, 591), (False, 16384, 610, 598), (True, 4096, 528, 496),
                               (True, 8192, 556, 566), (True, 16384, 580, 607), (True, 2048, 460, None)]:
        rows += [_crow(N, causal, "tileattn-sm90", one), _crow(N, causal, "tileattn-cluster", cl)]
    s = dense.summarize(rows)
    assert s["cluster_vs_one_cta_best"] == pytest.approx(607 / 580)
    assert s["cluster_vs_one_cta_min"] == pytest.approx(566 / 556)
    table = {(t["causal"], t["N"]): t for t in s["cluster_rows"]}
    assert len(table) == 6 and table[(False, 4096)]["ratio"] == pytest.approx(591 / 586)
    assert [k for k, t in table.items() if t["kept"]] == [(True, 8192), (True, 16384)]
    assert table[(True, 2048)]["ratio"] == 0.0 and table[(True, 8192)]["triton"] == "3.9.0"
    rows.append(_crow(32768, True, "tileattn-cluster", 300))  # a shape without its 1-CTA row: not listed
    assert len(dense.summarize(rows)["cluster_rows"]) == 6
    s = dense.summarize(rows[:6])  # only shapes dispatch keeps on the 1-CTA kernel: rows, but no best
    assert "cluster_rows" in s and "cluster_vs_one_cta_best" not in s
    assert not {"cluster_rows", "cluster_vs_one_cta_best"} & set(dense.summarize([_row(4096, "tileattn", 500)]))


def test_dense_cluster_rows_append_to_a_36_file(tmp_path):
    """Cluster rows measured under triton 3.9 merge into a dense.json made under 3.6: its rows stay (the S0 grid's
    tileattn-1cta too: the cluster's comparison is tileattn-sm90), the summary has both grids' keys, and the file
    records which triton made which rows."""
    import json

    from tileattn.bench import dense
    path = tmp_path / "dense.json"
    old = [_crow(16384, True, p, t) for p, t in (("tileattn", 590), ("cudnn", 560), ("fa2", 400),
                                                  ("tileattn-persistent", 570), ("tileattn-1cta", 590))]
    path.write_text(json.dumps({"suite": "dense", "commit": "abc", "date": "d", "triton": "3.6.0", "rows": old}))
    new = [_crow(16384, True, "tileattn-sm90", 580), _crow(16384, True, "tileattn-cluster", 607)]
    doc = {}
    rows, failed = dense._merge(dense._load_appended(str(path), torch.float16), new, doc)
    assert [r["provider"] for r in rows] == ["tileattn", "cudnn", "fa2", "tileattn-persistent", "tileattn-1cta",
                                             "tileattn-sm90", "tileattn-cluster"]
    assert failed == [] and doc["appended_to"] == [{"commit": "abc", "date": "d", "triton": "3.6.0"}]
    s = dense.summarize(rows)
    assert s["geomean_vs_cudnn"] == pytest.approx(590 / 560)
    assert s["persistent_vs_one_cta_min"] == pytest.approx(570 / 590)
    assert s["cluster_vs_one_cta_best"] == pytest.approx(607 / 580)
    assert "triton" not in rows[0] and rows[-1]["triton"] == "3.9.0"


def test_dense_cluster_columns(monkeypatch):
    """--cluster runs only the two cluster providers at D = 128; the default grid adds them where the cluster
    kernel can run (cluster_available); each forces its backend (the 1-CTA one with its table config)."""
    from tileattn.bench import dense
    from tileattn.ops.common import backend
    grids = []
    monkeypatch.setattr(dense, "run", lambda grid, **kw: grids.append(grid) or {"summary": {"check_failures": 0}})
    for argv, available in ((["bench", "--cluster"], False), (["bench"], False), (["bench"], True),
                            (["bench", "--cluster", "--head-dims", "64,128"], False)):
        monkeypatch.setattr(dense, "cluster_available", lambda available=available: available)
        cli._run_suite(cli._parser().parse_args(argv), "x.json", "x.png")
    assert [(g.providers, g.head_dims) for g in grids] == [
        (dense.CLUSTER_PROVIDERS, (128,)), (dense.PROVIDERS, (64, 128)),
        (dense.PROVIDERS + dense.CLUSTER_PROVIDERS, (64, 128)), (dense.CLUSTER_PROVIDERS, (64, 128))]
    q = torch.randn(1, 256, 4, 128)
    fns, contexts = dense._cluster_providers(dense.PROVIDERS, q, q, q, True)
    assert (fns, contexts) == ({}, {})
    fns, contexts = dense._cluster_providers(dense.CLUSTER_PROVIDERS, q, q, q, True)
    forced = {}
    for p, ctx in contexts.items():
        with ctx():
            forced[p] = (backend._forced.names, backend.forced_config(object))
    assert forced == {"tileattn-sm90": ({"dense": "dense.sm90"}, None),
                      "tileattn-cluster": ({"dense": "dense.sm90_cluster"}, None)}


def test_dense_cluster_refused_where_it_cannot_run(capsys, monkeypatch, tmp_path):
    """--cluster where the kernel cannot run (triton 3.6, the H100 image's) exits 2 before any GPU work: its rows
    would all be errors, and --append would put them over the measured cluster rows of the results file."""
    from tileattn.bench import dense
    path = tmp_path / "dense.json"
    path.write_text("{}")
    runs = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dense, "cluster_reason", lambda: "triton 3.6.0: the cluster kernel is written for triton 3.9")
    monkeypatch.setattr(dense, "run", lambda grid, **kw: runs.append(grid) or {"summary": {"check_failures": 0}})
    rc, text = _run(capsys, "bench", "--cluster", "--append", str(path), "--out", str(tmp_path / "x.json"))
    assert rc == 2 and "triton 3.6.0" in text and runs == []
