"""The coding agent's supervised warm-up through the one supervised loop (`experiments/coding/
warmup.py`): loss on the assistant's tokens, metrics with the greedy well-formedness check, and
a bit-for-bit resume."""

import jax
import numpy as np
import pytest

from composer_jax.envs.coding.agent import scripts as agent_scripts
from composer_jax.train.metrics import read_metrics
from experiments.coding import program, warmup
from experiments.configs import rl_coding
from tests.envs.coding.agent.append_test import deletion_task

STEPS = 2


def _config():
  c = rl_coding.get_config("micro")
  c.model.num_layers = 1
  c.rl.update(max_new_tokens=8)  # the greedy check's turn length (CI size)
  c.warmup.update(
    steps=STEPS,
    batch_size=2,
    seq_len=768,
    log_every=1,
    ckpt_every=1,
    check_every=STEPS,
    check_tasks=1,
  )
  c.warmup.optim.update(total_steps=STEPS, warmup_steps=0)
  return c


@pytest.mark.slow
def test_warmup_metrics_and_bit_for_bit_resume(tmp_path):
  config = _config()
  tasks = [deletion_task("pkg-t1"), deletion_task("pkg-t2")]
  env = program.make_env(config, str(tmp_path / "full"), tasks)
  full = warmup.warmup(config, str(tmp_path / "full"), env, tasks)
  records = read_metrics(str(tmp_path / "full" / "warmup"))
  assert [r["step"] for r in records] == [1, 2]
  assert all(np.isfinite(r["ce"]) and r["ce"] > 0 for r in records)
  # The greedy check ran at the last step: a random 1-layer model writes no valid call.
  assert records[-1]["check/malformed"] == 1.0 and records[-1]["check/exact"] == 0.0
  # Every loss token is the policy's (the batch's loss mask is the trajectory's model mask).
  examples = [agent_scripts.oracle_trajectory(env, t) for t in tasks]
  data = next(warmup.batches(examples, config, env.pad_id))
  written = env.tokenizer.decode(data["targets"][0][data["loss_mask"][0] > 0])
  assert "functions.append:0" in written and "# function b" not in written
  rng = np.random.default_rng([0, 0])  # the batch's examples, drawn one after the other
  assert data["loss_mask"].sum() == sum(
    examples[rng.integers(2)].model_mask.sum() for _ in range(2)
  )
  # Stopped after step 1 (a 1-step run with the same schedule), then run again: it resumes
  # to the same weights, bit for bit.
  short = _config()
  short.warmup.steps = 1
  warmup.warmup(short, str(tmp_path / "split"), env, tasks)
  resumed = warmup.warmup(config, str(tmp_path / "split"), env, tasks)
  assert [r["step"] for r in read_metrics(str(tmp_path / "split" / "warmup"))] == [1, 2]
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(resumed), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A finished warm-up is restored, not run again.
  again = warmup.warmup(config, str(tmp_path / "split"), env, tasks)
  assert len(read_metrics(str(tmp_path / "split" / "warmup"))) == 2
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(again), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
