"""`python -m experiments.plot` renders workdirs to one PNG with a panel per logged metric; a
directory without metrics is one error line. Rendering a real run's workdir, beside an RL one:
`tests/train/loop_test.py::test_plot_command_renders_the_run` (on the trainer tests' run)."""

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_RL = [  # as an RL program logs them (`rl.steps`): no tokens, reward and flag rates
  {
    "step": s,
    "loss": 0.5 / s,
    "grad_norm": 1.0 / s,
    "reward": 0.1 * s,
    "unavailable_rate": 0.5 - 0.1 * s,
    "verbose_rate": 0.2,
    "flagged_turns": 4 - s,
  }  # fmt: skip
  for s in (1, 2, 3)
]


def write_rl_workdir(path) -> str:
  os.makedirs(path)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in _RL)
  return str(path)


def plot_cli(*args):
  return subprocess.run(
    [sys.executable, "-m", "experiments.plot", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_workdir_without_metrics_is_one_line(tmp_path):
  proc = plot_cli(str(tmp_path), f"--out={tmp_path}/x.png")
  assert proc.returncode == 1
  assert proc.stderr.strip() == (
    f"error: {tmp_path} has no metrics.jsonl: pass a run directory (a --workdir of "
    "experiments.run) that has logged a step"
  )
  assert not os.path.exists(tmp_path / "x.png")


def test_tokens_axis_of_an_rl_run_is_one_line(tmp_path):
  rl = write_rl_workdir(tmp_path / "rl")
  proc = plot_cli(rl, f"--out={tmp_path}/x.png", "--x=tokens")
  assert proc.returncode == 1
  assert proc.stderr.strip() == (
    f"error: {rl}/metrics.jsonl has no 'tokens' (RL runs log steps only: --x=step)"
  )
