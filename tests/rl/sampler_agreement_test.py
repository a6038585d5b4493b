"""After an update the sampler scores its tokens as the trainer does: the importance weight
pi_trainer / pi_sampler of every sampled token is 1 (`is_weight_mean`, `is_weight_max` of the
RL steps after the first), and a sampler left on stale weights is caught by the same metric."""

import numpy as np
import pytest

from composer_jax.rl import rollout
from composer_jax.rl import run as rl_run
from experiments.coding import program as coding_program
from experiments.configs import rl_tool_feedback
from experiments.tool_feedback import program


def _records(workdir) -> list[dict]:
  c = rl_tool_feedback.get_config("rl")
  c.train.update(steps=3, ckpt_every=10, log_every=1)
  c.optim.adam_lr = 1e-2  # large updates: stale weights would score tokens differently
  c.rl.update(groups=2, group_size=2, teacher_rows=4, probe_count=0)
  return rl_run.run(c, str(workdir), program.make_env(c), coding_program.initial_variables(c))


@pytest.mark.slow
def test_sampler_logprobs_after_updates_equal_the_trainers(tmp_path, monkeypatch):
  records = _records(tmp_path / "live")
  for r in records[1:]:  # sampled with the weights of 1 and 2 updates
    assert r["is_weight_mean"] == pytest.approx(1.0, abs=2e-3), r
    assert r["is_weight_max"] == pytest.approx(1.0, abs=2e-2), r
  push = rollout.RolloutWorker.push

  def stale(self, params, version):  # the sampler keeps the initial weights
    return push(self, params, version) if version == 0 else {}

  monkeypatch.setattr(rollout.RolloutWorker, "push", stale)
  broken = _records(tmp_path / "stale")
  deviation = max(abs(np.log(r["is_weight_mean"])) for r in broken[1:])
  assert deviation > 1e-2 or max(r["is_weight_max"] for r in broken[1:]) > 1.1
