"""The prepared GPU check runs end to end on CPU, so a lent GPU's few minutes go to measuring."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from composer_jax.model import config as model_config
from composer_jax.model import flops

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_peak_and_train_stages_give_mfu_against_the_measured_peak(tmp_path):
  # 89 s: both stages fit, and under 90 s are left for vs_hf, so it is skipped as on a short
  # budget; the cuDNN variants need a GPU, so only the preset's own variant runs.
  args = ["--preset=tiny", "--seq_len=32", "--matmul_n=256", "--variants=preset", "--steps=2"]
  proc = subprocess.run(
    [sys.executable, "-m", "experiments.bench.gpu_check", f"--out={tmp_path}", "--budget_s=89"]
    + args,
    cwd=REPO,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "skipped vs_hf" in proc.stdout
  results = json.loads((tmp_path / "gpu_check.json").read_text())
  (peak,) = [r for r in results if r["stage"] == "peak" and r["framework"] == "jax"]
  (train,) = [r for r in results if r["stage"] == "train"]
  assert peak["tflops"] > 0
  # experiments/configs/small.py's batch at the given length, in its 4 micro-batches.
  assert (train["variant"], train["batch"], train["seq"], train["grad_accum"]) == (
    "preset",
    64,
    32,
    4,
  )
  tokens = 64 * 32
  assert train["tokens_per_s"] == pytest.approx(tokens / train["step_s"])
  model_tflops = (
    tokens * flops.train_flops_per_token(model_config.get_preset("tiny"), 32) / train["step_s"]
  ) / 1e12
  assert train["model_tflops"] == pytest.approx(model_tflops)
  assert train["mfu_vs_measured"] == pytest.approx(model_tflops / peak["tflops"])
  assert 0 < train["loss_last"] < 2 * train["loss_first"]
  assert "MFU" in proc.stdout.split("=== summary")[1]
