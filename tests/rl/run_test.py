"""The RL run driver: bit-exact resume, warm-up reuse, SIGTERM save, bad input."""

import os
import subprocess
import sys

import numpy as np
import pytest

from composer_jax.train import loop
from composer_jax.train.metrics import read_metrics
from experiments.configs import rl_tool_feedback
from experiments.tool_feedback import program

STEPS = 4


def _config(steps=STEPS, **model_overrides):
  c = rl_tool_feedback.get_config("sd")
  c.warmup.update(steps=3, batch_size=8)
  c.train.update(steps=steps, ckpt_every=2, log_every=2)
  c.optim.total_steps = STEPS  # one LR schedule for runs stopped early and resumed
  c.rl.update(groups=2, group_size=2, teacher_rows=4)
  c.loss.teacher = "ema"  # the EMA weights are part of the checkpointed state
  c.model.overrides.update(model_overrides)
  return c


def _comparable(records):
  """Records without wall-clock times."""
  return [{k: v for k, v in r.items() if "seconds" not in k} for r in records]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("rl_full"))
  return workdir, program.run(_config(), workdir)


@pytest.mark.slow
def test_resume_is_bit_exact_and_reuses_the_warmup(full_run, tmp_path, monkeypatch):
  full_dir, full = full_run
  assert [r["step"] for r in full] == [1, 2, 3, 4]
  assert _comparable(read_metrics(full_dir)) == _comparable(full)
  # The probes (held-out flagged contexts) and the RL / SD gradient stats, at every step.
  for key in ("probe_kl", "probe_p_good", "probe_p_good_hint", "rl_sd_grad_cos", "sd_grad_norm"):
    assert all(np.isfinite(r[key]) for r in full), key
  assert sorted(os.listdir(os.path.join(full_dir, "checkpoints"))) == ["2", "4"]

  workdir = str(tmp_path)
  first = program.run(_config(steps=2), workdir)
  monkeypatch.setattr(program, "warmup", lambda _: pytest.fail("warm-up was recomputed"))
  second = program.run(_config(), workdir)
  assert [r["step"] for r in first + second] == [1, 2, 3, 4]
  # Same sampled episodes (rewards), losses and gradient norms at every step: float equality.
  assert _comparable(first + second) == _comparable(full)


@pytest.mark.slow
def test_sigterm_saves_the_current_step(full_run, tmp_path, monkeypatch):
  class Signalled(loop.StopFlag):
    def __init__(self):
      super().__init__()
      self.event.set()

  monkeypatch.setattr(loop, "StopFlag", Signalled)
  records = program.run(_config(), str(tmp_path))
  assert [r["step"] for r in records] == [1]  # stopped after the first step...
  assert os.listdir(tmp_path / "checkpoints") == ["1"]  # ...which was saved (not a periodic one)
  monkeypatch.undo()
  rest = program.run(_config(), str(tmp_path))
  assert _comparable(records + rest) == _comparable(full_run[1])


@pytest.mark.slow
def test_checkpoint_of_another_model_warmup_or_teacher_is_rejected(full_run):
  with pytest.raises(ValueError, match=r"different model config: num_layers \(checkpoint 3"):
    program.run(_config(num_layers=2), full_run[0])
  config = _config()
  config.warmup.hint_prob = 0.25
  with pytest.raises(ValueError, match="warmup was made with other warmup settings"):
    program.run(config, full_run[0])
  config = _config()
  config.loss.teacher = "frozen"
  with pytest.raises(ValueError, match="made with loss.teacher='ema', this config has 'frozen'"):
    program.run(config, full_run[0])


def test_bad_settings_exit_with_one_line_from_the_cli(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.run",
       "--config=experiments/configs/rl_tool_feedback.py:rl", f"--workdir={tmp_path}",
       "--config.train.ckpt_every=0"],
      capture_output=True, text=True, timeout=300,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == "error: train.ckpt_every=0 must be >= 1"
