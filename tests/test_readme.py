"""The README tells the truth: its figures are those of the committed results (scripts/readme_figures.py), its
prose states no figure of its own, and every Python snippet runs as pasted.

Snippets run in a fresh namespace each. On a CUDA GPU they run as written; without one, through the Triton
interpreter with three changes: device "cuda" -> "cpu", bfloat16 -> float16 (the interpreter's bf16 dots are
wrong, so tileattn refuses bf16 there), and a line ending in `# sizes; small: a, b, ...` takes the small
values. A snippet whose first line is `# needs a CUDA GPU` is skipped without one.
"""
import importlib.util
import pathlib
import re

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
_spec = importlib.util.spec_from_file_location("readme_figures", ROOT / "scripts" / "readme_figures.py")
figures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(figures)

SNIPPETS = re.findall(r"```python\n(.*?)```", README, re.S)
GPU = torch.cuda.is_available()


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
        if not code.startswith("# needs a CUDA GPU"):
            assert "cuda" not in _small(code).replace('device="cpu"', ""), \
                "a snippet names the GPU other than as device=\"cuda\": the CPU run could not move it"


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippet_runs(index):
    code = SNIPPETS[index]
    if code.startswith("# needs a CUDA GPU") and not GPU:
        pytest.skip("the snippet needs a CUDA GPU")
    if not GPU:
        code = _small(code)
    exec(compile(code, f"README.md snippet {index}", "exec"), {"__name__": f"readme_snippet_{index}"})
