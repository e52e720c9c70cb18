"""The README tells the truth: its figures are those of the committed results (scripts/readme_figures.py), its
prose states no figure of its own, and every Python snippet runs as pasted.

Snippets run in a fresh namespace each. On a CUDA GPU they run as written; without one, through the Triton
interpreter with three changes: device "cuda" -> "cpu", bfloat16 -> float16 (the interpreter's bf16 dots are
wrong, so tileattn refuses bf16 there), and a line ending in `# sizes; small: a, b, ...` takes the small
values. A snippet whose first line is `# needs a CUDA GPU` is skipped without one. One whose first line starts
with `# needs several processes` is a torchrun script: without a GPU it runs as two processes of
torch.distributed.run with, beyond the changes above, the "nccl" backend -> "gloo" and no torch.cuda.set_device;
on a GPU machine it is skipped (it may have a single GPU).
"""
import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)

SNIPPETS = re.findall(r"```python\n(.*?)```", README, re.S)
GPU = torch.cuda.is_available()
MULTI_PROCESS = "# needs several processes"


def test_figures_match_results():
    block = figures.current(README)
    assert block is not None, "README.md lost its figures block"
    assert block == figures.render(), "README.md's figures differ from bench/results: " \
                                      "run python scripts/readme_figures.py --write"


def test_prose_states_no_figures():
    """Figures live in the generated block only: a speed ratio, TFLOPS or GB/s written by hand goes stale."""
    block = figures.current(README)
    prose = README.replace(block, "")
    stated = re.findall(r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b(?! ?\w)|\b\d+ ?(?:TFLOPS|GB/s)\b", prose)
    assert not stated, f"figures written by hand outside the generated block: {stated}"


def _small(code):
    def sizes(m):
        return f"{m.group(1)}= {m.group(2)}"
    code = re.sub(r"^(.*?)=[^#\n]*# sizes; small: ([^\n]*)$", sizes, code, flags=re.M)
    return code.replace('device="cuda"', 'device="cpu"').replace("torch.bfloat16", "torch.float16")


def test_snippets_found():
    assert len(SNIPPETS) >= 6
    for code in SNIPPETS:
        if not code.startswith(("# needs a CUDA GPU", MULTI_PROCESS)):
            assert "cuda" not in _small(code).replace('device="cpu"', ""), \
                "a snippet names the GPU other than as device=\"cuda\": the CPU run could not move it"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index, tmp_path):
    code = SNIPPETS[index]
    if code.startswith(MULTI_PROCESS):
        _run_multi_process(code, index, tmp_path)
        return
    if code.startswith("# needs a CUDA GPU") and not GPU:
        pytest.skip("the snippet needs a CUDA GPU")
    if not GPU:
        code = _small(code)
    exec(compile(code, f"README.md snippet {index}", "exec"), {"__name__": f"readme_snippet_{index}"})


def _run_multi_process(code, index, tmp_path):
    if GPU:
        pytest.skip("a torchrun snippet: on a GPU machine it needs several GPUs (tests/distributed runs the ring)")
    code = "\n".join(line for line in _small(code).replace('"nccl"', '"gloo"').splitlines()
                     if "torch.cuda.set_device" not in line)
    script = tmp_path / f"readme_snippet_{index}.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          str(script)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"README.md snippet {index} under torchrun:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
