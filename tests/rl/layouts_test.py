"""The RL update under every named layout on 8 fake devices == the single-device update.

The RL update (`rl.programs.update_program`: policy forward on the trajectories, teacher forward
on the teacher rows, RL + SD loss, optimizer) is built from the supervised trainer's programs,
so each layout runs what the trainer does there: sharded Muon, expert-parallel MoE dispatch,
context-parallel attention (`cp2_ep8`: rows in zig-zag order, slot positions remapped). The
reference is the same config on one device.
"""

import chex
import jax
import numpy as np
import pytest

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.optim import param_labels
from composer_jax.parallel import rules as rules_lib
from composer_jax.rl import mesh as rl_mesh
from composer_jax.rl.programs import update_program
from composer_jax.rl.state import initial_state
from composer_jax.rl.teacher import DistillTarget, build_teacher_batch
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch
from experiments.configs import base, rl_tool_feedback

ROWS, L = 8, 16  # rows over up to 8 data shards; L divisible by 2 x context (4 in cp2_ep8)
TOL = 1e-5


def _config(layout, optim="muon"):
  c = rl_tool_feedback.get_config("sd")
  c.rl.update(dict(groups=4, group_size=2, seq_len=L, teacher_seq_len=L, teacher_rows=ROWS))
  c.optim.update(dict(name=optim, warmup_steps=0, weight_decay=0.1))  # step 0 moves every weight
  if optim == "adamw":
    # AdamW's first step, lr g / (|g| + eps), is ill-conditioned where |g| ~ eps: a small LR
    # keeps its float32 summation-order differences under the absolute 1e-5.
    c.optim.update(dict(lr=1e-4, adam_lr=1e-4))
  c.loss.teacher = "frozen"
  c.loss.log_term_grads = False  # one backward pass: the layouts compare the update itself
  base.set_layout(c, layout)
  if layout != "single" and dict(map(tuple, c.rules.expert))["experts"] == "expert":
    c.model.moe_dispatch = "expert_parallel"
  return c


def _episodes():
  """8 ragged trajectories (4 GRPO groups) and 5 distillation targets."""
  rng = np.random.default_rng(0)
  trajs = []
  for i in range(ROWS):
    turns = [Turn(rng.integers(3, 64, 4 + i % 3).tolist())]
    for _ in range(1 + i % 2):
      n = int(rng.integers(2, 4))
      turns += [
        Turn(rng.integers(3, 64, n).tolist(), (-rng.random(n) - 0.1).tolist()),
        Turn(rng.integers(3, 64, 2).tolist()),
      ]
    trajs.append(Trajectory.from_turns(turns, float(rng.random()), i // 2))
  return trajs, [DistillTarget(i, 1, rng.integers(3, 64, 2).tolist()) for i in range(5)]


def _batches(reuse_prefix=False):
  """The packed batch and the teacher batch of `_episodes` (with `reuse_prefix`, extension
  rows of 1 + hint + turn <= 6 tokens over the student's prefix cache)."""
  trajs, targets = _episodes()
  batch = pack_batch(trajs, [L], batch_size=ROWS)
  teacher = build_teacher_batch(
    trajs,
    batch,
    targets,
    buckets=[8 if reuse_prefix else L],
    turn_buckets=[3],
    num_rows=ROWS,
    reuse_prefix=reuse_prefix,
  )
  return batch, teacher


def _update(layout, init, optim="muon"):
  """(metrics, new params, new opt_state, program) of one RL update under `layout`."""
  config = _config(layout, optim)
  model_cfg = model_config(config.model)
  prog = update_program(config, model_cfg)
  state = initial_state(config, model_cfg, init)
  batch, teacher = _batches()
  batch_g = rl_mesh.place_batch(batch, prog.per_token)
  teacher_g = rl_mesh.place_batch(teacher, prog.per_token, student_length=L)
  shardings = jax.tree.map(lambda t: t.sharding, prog.progs.target.params)
  frozen = (jax.device_put(init["params"], shardings),)
  router = jax.device_put(init["router"], prog.replicated)
  args = (state.params, state.opt_state, router, batch_g, frozen, teacher_g)
  compiled = prog.update.lower(*args).compile()
  params, opt_state, metrics = compiled(*args)
  return jax.device_get(metrics), params, opt_state, prog


@pytest.fixture(scope="module")
def init():
  return jax.device_get(transformer.init(model_config(_config("single").model), jax.random.key(0)))


@pytest.fixture(scope="module")
def reference(init):
  return {o: jax.device_get(_update("single", init, o)[:3]) for o in ("muon", "adamw")}


# The RL update adds only layout-free code (loss, teacher, advantages) to the sharded forward,
# backward and optimizer (sharded Muon included) that tests/train/layouts_test.py checks on
# every layout; here: the dual mesh with context and expert parallelism (Muon), the
# replicated HSDP mesh (Muon) and FSDP+EP with AdamW. ~15-30 s of CPU each (one compile).
@pytest.mark.slow
@pytest.mark.parametrize(
  "layout,optim", [("cp2_ep8", "muon"), ("hsdp", "muon"), ("fsdp_ep", "adamw")]
)
def test_rl_update_matches_single_device(init, reference, layout, optim):
  want_metrics, want_params, want_opt = reference[optim]
  metrics, params, opt_state, prog = _update(layout, init, optim)
  assert want_metrics["num_distilled_tokens"] > 0 and want_metrics["sd_loss"] > 0
  assert set(metrics) == set(want_metrics)
  for k in want_metrics:
    np.testing.assert_allclose(metrics[k], want_metrics[k], rtol=TOL, atol=1e-6, err_msg=k)
  chex.assert_trees_all_close(jax.device_get(params), want_params, atol=TOL, rtol=TOL)
  chex.assert_trees_all_close(jax.device_get(opt_state), want_opt, atol=TOL, rtol=TOL)
  config = _config(layout, optim)
  axes = transformer.logical_axes(model_config(config.model))["params"]
  # Muon weights: this step's change agrees to 1e-4 of its size (see tests/train/layouts_test).
  for (path, new), ref, old, label in zip(
    jax.tree_util.tree_leaves_with_path(jax.device_get(params)),
    jax.tree.leaves(want_params),
    jax.tree.leaves(init["params"]),
    jax.tree.leaves(param_labels(config.optim, axes)),
  ):
    if label == "muon":
      np.testing.assert_allclose(
        new - old,
        ref - old,
        atol=1e-4 * np.abs(ref - old).max(),
        rtol=0,
        err_msg=jax.tree_util.keystr(path),
      )
  # Shardings kept: params as the layout's logical-axis rules place them, optimizer state as
  # the trainer's target.
  expected = rules_lib.param_shardings(axes, prog.progs.mesh, config.rules)
  for (path, x), s in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(expected)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)
  for x, t in zip(jax.tree.leaves(opt_state), jax.tree.leaves(prog.progs.target.opt_state)):
    assert x.sharding.is_equivalent_to(t.sharding, x.ndim)
