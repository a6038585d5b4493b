"""Colocated vs disaggregated RL (4 trainer + 4 sampler devices of 8), staleness, bad input.

Disaggregated with max_staleness 0 must reproduce the colocated run (same episodes, losses and
params); with staleness 1 the sampler plays batch k + 1 with the weights of step k, and the
steps log their staleness and truncated importance weights (which differ from 1 once the
weights that sampled differ from the ones trained).
"""

import chex
import jax
import pytest

from composer_jax.model import transformer
from composer_jax.rl import run as rl_run
from composer_jax.rl import train as rl_train
from composer_jax.train import loop
from experiments.configs import rl_tool_feedback
from tests.rl.toy_env import ToyEnv

STEPS = 3
TRAINER = 4  # devices 0-3 (layout fsdp, mesh.fsdp=4); the sampler's are 4-7 when disaggregated


def _config(mode="colocated", staleness=0):
  c = rl_tool_feedback.get_config("sd,fsdp")
  c.mesh.fsdp = TRAINER
  c.train.steps = STEPS
  c.optim.lr = c.optim.adam_lr = 1e-2  # large steps: stale weights sample differently
  c.rl.update(dict(groups=2, group_size=2, seq_len=8, prompt_len=4, teacher_seq_len=16,
                   teacher_rows=4, mode=mode, max_staleness=staleness, probe_count=0,
                   sampler_devices=(4, 5, 6, 7) if mode == "disaggregated" else ()))
  return c


def _run(config):
  """(per-step rows without wall-clock times, final params) of RL from a random init."""
  init = jax.device_get(transformer.init(loop.model_config(config), jax.random.key(0)))
  rows, states = [], []
  for row, state in rl_train.rl_steps(config, ToyEnv(), init):
    rows.append({k: v for k, v in row.items() if "seconds" not in k and "bytes" not in k})
    states.append(state)
  return rows, jax.device_get(states[-1].params)


@pytest.fixture(scope="module")
def colocated():
  return _run(_config())


@pytest.mark.slow
def test_disaggregated_with_staleness_0_equals_colocated(colocated):
  rows, params = _run(_config("disaggregated", 0))
  assert [r["staleness"] for r in rows] == [0.0] * STEPS
  assert rows == colocated[0]  # same episodes, rewards, losses and metrics: float equality
  chex.assert_trees_all_equal(params, colocated[1])


@pytest.mark.slow
def test_staleness_1_samples_with_the_previous_weights(colocated):
  rows, _ = _run(_config("disaggregated", 1))
  # Batch 0 waits for the initial weights; batch k >= 1 was sampled with step k - 1's.
  assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0]
  assert rows[0] == colocated[0][0]
  # Importance weights min(pi_theta / pi_sampler, C) are logged; off-policy they move off 1.
  assert rows[0]["tis_weight"] == pytest.approx(1.0, abs=1e-5)
  assert all(abs(r["tis_weight"] - 1.0) > 1e-4 for r in rows[1:])


@pytest.mark.parametrize("change,message", [
  (dict(mode="disaggregated", sampler_devices=(2, 3, 4, 5)),
   "rl.mode='disaggregated': sampler devices (2, 3, 4, 5) overlap the trainer's devices "
   "(0, 1, 2, 3) (layout 'fsdp') on [2, 3]"),
  (dict(mode="disaggregated", max_staleness=-1), "rl.max_staleness=-1 must be >= 0"),
  (dict(max_staleness=1), "rl.max_staleness=1 needs rl.mode='disaggregated'"),
  (dict(mode="disaggregated", sampler_devices=()), "rl.sampler_devices=() must be distinct"),
  (dict(mode="async"), "rl.mode='async'; valid: ('colocated', 'disaggregated')"),
])
def test_bad_mode_settings_are_one_line(change, message):
  config = _config()
  config.rl.update(change)
  with pytest.raises(ValueError) as e:
    rl_run.validate(config)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_trajectory_longer_than_the_sampler_cache_is_one_line():
  config = _config()
  config.mesh.fsdp = 1
  config.rl.prompt_len = 2  # the first turn has 3 tokens
  init = jax.device_get(transformer.init(loop.model_config(config), jax.random.key(0)))
  with pytest.raises(ValueError, match=r"an episode history has \d+ tokens > prompt_len 2; "
                                       r"raise prompt_len") as e:
    rl_train.train(config, ToyEnv(), init)
  assert "\n" not in str(e.value)
