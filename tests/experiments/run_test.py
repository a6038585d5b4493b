"""`python -m experiments.run` turns bad input into one clear line on stderr and exit code 1."""

import os
import subprocess
import sys

import grain
import numpy as np
import pytest

from composer_jax.model.config import get_preset
from composer_jax.train import checkpointing

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run(*args):
  proc = subprocess.run([sys.executable, "-m", "experiments.run", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  return proc.returncode, proc.stderr.strip().splitlines()[-1], proc.stderr


def _workdir_of_other_model(path) -> str:
  """A workdir whose checkpoint was written by a tiny model with hidden_size 32."""
  ckpt = checkpointing.Checkpointer(str(path), keep=1)
  ckpt.save(1, {"x": np.zeros(2, np.float32)}, iter(grain.MapDataset.range(4).to_iter_dataset()),
            get_preset("tiny", hidden_size=32), {})
  ckpt.close()
  return str(path)


@pytest.mark.parametrize("case", ["unknown_field", "unknown_config", "bad_value", "empty_data",
                                  "other_model"])
def test_bad_input_is_one_line_error(case, tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  args, expected = {
      "unknown_field": (["--config.train.stepz=1"],
                        "unknown config field 'stepz' in --config.train.stepz=1. Did you mean "
                        "\"steps\""),
      "unknown_config": (["--config=experiments/configs/nope.py"],
                         "cannot load config file 'experiments/configs/nope.py': no such file; "
                         "configs in experiments/configs/: "),
      "bad_value": (["--config.train.steps=0"], "train.steps=0 must be >= 1"),
      "empty_data": ([f"--config.data.paths={empty}"], "has no"),
      "other_model": ([f"--workdir={_workdir_of_other_model(tmp_path / 'w')}"],
                      "different model config: hidden_size (checkpoint 32, config 64)"),
  }[case]
  if case != "other_model":
    args.append(f"--workdir={tmp_path / 'work'}")
  rc, last, stderr = _run(*args)
  assert rc == 1, stderr
  assert last.startswith("error: ") and expected in last, stderr
  assert "Traceback" not in stderr, stderr


def test_dry_run_prints_memory_plan():
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run",
       "--config=experiments/configs/kimi_k2_continued.py", "--config.train.dry_run=True"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "Memory plan on 1024 devices" in proc.stdout
  assert "params" in proc.stdout and "opt_state" in proc.stdout and "GiB" in proc.stdout
