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
