"""`tileattn bench cp`: both modes run end to end on the CPU at tiny sizes (kernels through the Triton interpreter,
gloo instead of NCCL; the times mean nothing there, the code paths and the output checks do), and the command's
option handling."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tileattn import cli
from tileattn.bench import cp

TINY = dict(seqlens=(32,), heads=2, head_dim=32, dtype="fp16", worlds=(2, 4), check_seqlen=16, check_heads=2,
            iters=1, device="cpu")


CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU runs of the suite (interpreter, gloo); on a GPU "
                              "machine `tileattn bench cp` itself runs")


@CPU_ONLY
def test_simulate_runs(tmp_path):
    lines = []
    doc = cp.run(cp.Grid(**TINY), simulate=True, out_json=str(tmp_path / "cp.json"), log=lines.append)
    s = doc["summary"]
    assert s["check_failures"] == 0, "\n".join(lines)
    for key in ("simulated_scaling_efficiency_fwd_w2", "simulated_scaling_efficiency_fwdbwd_w4",
                "predicted_scaling_efficiency_fwdbwd_w4", "predicted_scaling_efficiency_fwdbwd_w4_nvlink",
                "min_step_overlap_fwdbwd"):
        assert s[key] > 0, key
    assert json.loads((tmp_path / "cp.json").read_text())["summary"] == s
    assert {r["provider"] for r in doc["rows"]} == {"single", "sim-ring-w2", "sim-ring-w4"}
    assert len(doc["check"]) == 2 * 2 * 3  # causal and full, ranks 0 and W - 1, out / lse / dq


@CPU_ONLY
def test_multi_gpu_mode_runs_over_gloo(tmp_path):
    """The multi-GPU mode's processes (spawned as on a GPU machine), over gloo on the CPU."""
    code = ("from tileattn.bench import cp\n"
            "if __name__ == '__main__':\n"
            f"    cp.run(cp.Grid(**{TINY!r}), world=2, out_json={str(tmp_path / 'cp.json')!r})\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.loads((tmp_path / "cp.json").read_text())["summary"]
    assert s["check_failures"] == 0 and s["world_size"] == 2
    assert s["scaling_efficiency_fwdbwd"] > 0 and s["scaling_efficiency_fwd"] > 0
    assert "scaling_efficiency_fwdbwd_w2" in s


def test_torchrun_detection(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not cp.launched_by_torchrun()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert cp.launched_by_torchrun() and cp.gpus_for_multi() == 4


@pytest.mark.parametrize("argv, needle", [
    (("bench", "cp", "--quick"), "--quick does not apply to `bench cp`"),
    (("bench", "dense", "--simulate"), "--simulate does not apply to `bench dense`"),
])
def test_options(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        cli.main(list(argv))
    assert e.value.code == 2 and needle in capsys.readouterr().err
