"""After an update the sampler scores its tokens as the trainer does: the importance weight
pi_trainer / pi_sampler of every sampled token is 1 (`is_weight_mean`, `is_weight_max` of the
RL steps after the first, on `ToyEnv`, whose random-init rewards give non-zero updates), and a
sampler left on stale weights is caught by the same metric."""

import jax
import numpy as np
import pytest

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.rl import rollout
from composer_jax.rl import run as rl_run
from experiments.configs import rl_tool_feedback
from tests.rl.toy_env import ToyEnv


def _records(workdir) -> list[dict]:
  c = rl_tool_feedback.get_config("rl")
  c.train.update(steps=3, ckpt_every=10, log_every=1)
  c.optim.adam_lr = 1e-2  # large updates: stale weights score the tokens differently
  c.rl.update(
    groups=2, group_size=2, seq_len=8, prompt_len=4, teacher_seq_len=16, teacher_rows=4,
    probe_count=0,
  )  # fmt: skip
  init = jax.device_get(transformer.init(model_config(c.model), jax.random.key(0)))
  return rl_run.run(c, str(workdir), ToyEnv(), init)


@pytest.mark.slow
def test_sampler_logprobs_after_updates_equal_the_trainers(tmp_path, monkeypatch):
  records = _records(tmp_path / "live")
  assert all(r["grad_norm"] > 0 for r in records)  # the weights did move
  for r in records[1:]:  # sampled with the weights after 1 and 2 updates
    assert r["is_weight_mean"] == pytest.approx(1.0, abs=1e-3), r
    assert r["is_weight_max"] == pytest.approx(1.0, abs=1e-2), r
  push = rollout.RolloutWorker.push

  def stale(self, params, version):  # the sampler keeps the initial weights
    return push(self, params, version) if version == 0 else {}

  monkeypatch.setattr(rollout.RolloutWorker, "push", stale)
  broken = _records(tmp_path / "stale")
  assert max(abs(np.log(r["is_weight_max"])) for r in broken[1:]) > 0.05
