"""The RL run driver: bit-exact resume (of the RL steps and of the supervised warm-up), warm-up
reuse, SIGTERM save, bad input before any work."""

import itertools
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from composer_jax.rl.steps import RLSteps
from composer_jax.train import loop
from composer_jax.train.metrics import read_metrics
from experiments.configs import rl_tool_feedback
from experiments.tool_feedback import program

STEPS = 4


def _config(steps=STEPS, **model_overrides):
  c = rl_tool_feedback.get_config("sd")
  c.warmup.update(steps=3, batch_size=8, ckpt_every=2, log_every=1)
  c.warmup.optim.warmup_steps = 1
  c.train.update(steps=steps, ckpt_every=2, log_every=2)
  c.optim.total_steps = STEPS  # one LR schedule for runs stopped early and resumed
  c.rl.update(groups=2, group_size=2, teacher_rows=4, gap_rows=4)
  c.loss.teacher = "ema"  # the EMA weights are part of the checkpointed state
  c.model.update(model_overrides)
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

  # The warm-up is a supervised run of its own: 3 steps, metrics, checkpoints at 2 and 3.
  warmup = read_metrics(os.path.join(full_dir, "warmup"))
  assert [r["step"] for r in warmup] == [1, 2, 3] and all(np.isfinite(r["ce"]) for r in warmup)

  workdir = str(tmp_path)
  first = program.run(_config(steps=2), workdir)
  monkeypatch.setattr(loop, "train", lambda *a: pytest.fail("warm-up was recomputed"))
  step = RLSteps.step

  def unfetched(self, state, k):  # the driver fetches a step's metrics after the next step
    state, metrics = step(self, state, k)
    assert all(isinstance(metrics[m], jax.Array) for m in ("loss", "grad_norm", "probe_kl"))
    return state, metrics

  monkeypatch.setattr(RLSteps, "step", unfetched)
  second = program.run(_config(), workdir)
  # The first run stopped after 2 of 4 steps, the second resumed at step 2.
  assert [r["step"] for r in first] == [1, 2] and [r["step"] for r in second] == [3, 4]
  # Same sampled episodes (rewards), losses and gradient norms at every step: float equality.
  assert _comparable(first + second) == _comparable(full)


_STOP_FLAG = loop.StopFlag


def _signalled_from(first: int):
  """A StopFlag whose event is set at once from the `first`-th one made (0-based): a SIGTERM
  arriving in that run's first step (the warm-up and the RL run each make one)."""
  made = itertools.count()

  class Signalled(_STOP_FLAG):
    def __init__(self):
      super().__init__()
      if next(made) >= first:
        self.event.set()

  return Signalled


@pytest.mark.slow
def test_sigterm_in_the_warmup_or_in_rl_saves_and_resumes_bit_exact(
  full_run, tmp_path, monkeypatch
):
  full_dir, full = full_run
  monkeypatch.setattr(loop, "StopFlag", _signalled_from(0))  # in the warm-up's first step
  with pytest.raises(loop.Preempted, match=r"warmup stopped at step 1 of 3"):
    program.run(_config(), str(tmp_path))
  assert os.listdir(tmp_path / "warmup" / "checkpoints") == ["1"]  # saved, not periodic
  assert not os.path.exists(tmp_path / "checkpoints")  # RL never started
  monkeypatch.setattr(loop, "StopFlag", _signalled_from(1))  # warm-up resumes; RL signalled
  records = program.run(_config(), str(tmp_path))
  assert [r["step"] for r in records] == [1]  # stopped after the first RL step...
  assert os.listdir(tmp_path / "checkpoints") == ["1"]  # ...which was saved (not a periodic one)
  monkeypatch.undo()
  rest = program.run(_config(), str(tmp_path))
  assert [r["step"] for r in rest] == [2, 3, 4]
  assert _comparable(records + rest) == _comparable(full)
  # The warm-up resumed from its step-1 checkpoint on the batches it would have drawn.
  untimed = lambda rs: [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rs]
  assert untimed(read_metrics(str(tmp_path / "warmup"))) == untimed(
    read_metrics(os.path.join(full_dir, "warmup"))
  )


@pytest.mark.slow
def test_checkpoint_of_another_model_warmup_or_teacher_is_rejected(full_run):
  with pytest.raises(ValueError, match=r"different model config: num_layers \(checkpoint 3"):
    program.run(_config(num_layers=2), full_run[0])
  config = _config()
  config.warmup.hint_prob = 0.25
  with pytest.raises(
    ValueError,
    match=r"warmup holds a warm-up made with warmup.hint_prob=0.5 "
    r"\(this config: 0.25\)",
  ):
    program.run(config, full_run[0])
  config = _config()
  config.loss.teacher = "frozen"
  with pytest.raises(ValueError, match=r"made with loss.teacher='ema' \(this config: 'frozen'\)"):
    program.run(config, full_run[0])


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("loss.divergence", "kl", "loss.divergence='kl'; valid: ('reverse_kl', 'forward_kl', 'jsd')"),
    (
      "loss.teacher",
      "teacher",
      "loss.teacher='teacher'; valid: ('live', 'ema', 'frozen', 'trust_region')",
    ),
    ("loss.support", "top", "loss.support='top'; valid: ('full', 'topk', 'sampled')"),
    ("rl.top_p", 0.0, "rl.top_p=0.0 must be in (0, 1] (1 = no nucleus truncation)"),
    (
      "rl.group_size",
      1,
      "rl.group_size=1 must be >= 2 (group-relative advantages of a group of 1 are 0: no "
      "reward signal)",
    ),
    (
      "optim.lr",
      -0.02,
      "optim.lr=-0.02 must be finite and >= 0 (a negative rate would ascend the loss)",
    ),
    # A NaN coefficient ran the warm-up, then stopped at RL step 1 naming no field (#23).
    ("loss.sd_coef", float("nan"), "loss.sd_coef=nan must be finite and >= 0"),
    ("loss.ref_kl_coef", -0.1, "loss.ref_kl_coef=-0.1 must be finite and >= 0"),
    (
      "loss.ema_rate",
      0.0,
      "loss.ema_rate=0.0 must be in (0, 1] (the EMA teacher's step towards the policy)",
    ),
    (
      "optim.warmup_steps",
      90,
      "optim: Need 0 <= warmup_steps < total_steps, got "
      "warmup_steps=90, total_steps=80 (optim.total_steps 0 = train.steps)",
    ),
  ],
)
def test_bad_settings_are_one_line_before_any_work(field, value, message, tmp_path, monkeypatch):
  """Found before the warm-up (which would otherwise run first, for minutes at full size)."""
  monkeypatch.setattr(loop, "train", lambda *a: pytest.fail("the warm-up started"))
  config = rl_tool_feedback.get_config("sd")
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ValueError) as e:
    program.run(config, str(tmp_path))
  assert str(e.value) == message
  assert not os.listdir(tmp_path)


def test_bad_settings_exit_with_one_line_from_the_cli(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.run",
      "--config=experiments/configs/rl_tool_feedback.py:rl",
      f"--workdir={tmp_path}",
      "--config.train.ckpt_every=0",
    ],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
  )
  assert proc.returncode == 1
  assert proc.stderr.strip().splitlines()[-1] == "error: train.ckpt_every=0 must be >= 1"
