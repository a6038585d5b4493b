"""One full train step under every named layout on 8 fake devices == the single-device step.

The trainer's own programs (`composer_jax.train.programs`) are used on both sides, so each
layout runs whatever the trainer does there: sharded Muon, expert-parallel MoE dispatch
(layouts with experts over `expert`), context-parallel attention (`cp2_ep8`); the reference
is the same config on one device (plain per-leaf Muon, dropless MoE, no collectives).
"""

import chex
import jax
import numpy as np
import pytest

from composer_jax.model import transformer
from composer_jax.optim import param_labels
from composer_jax.parallel import rules as rules_lib
from composer_jax.train import loop, placement, programs
from experiments.configs import base, layouts
from tests.train.conftest import tiny_config

B, L = 8, 16  # batch over up to 8 data shards; L divisible by 2 x context (4 in cp2_ep8)
# Level-0 backend optimization halves XLA:CPU compile time; the HLO (and its math) is the
# same, only LLVM's code generation is cheaper.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
TOL = 1e-5


def _config(layout):
  c = tiny_config(batch_size=B, seq_len=L)
  c.optim.update(dict(warmup_steps=0, weight_decay=0.1))  # step 0 moves every weight
  base.set_layout(c, layout)
  # Layouts whose rules shard routed experts over `expert` run expert-parallel dispatch
  # (shard_map + all-to-all); `fsdp` keeps the default dropless dispatch under GSPMD. On one
  # device expert-parallel dispatch is dropless.
  if layout != "single" and dict(map(tuple, c.rules.expert))["experts"] == "expert":
    c.model.overrides = dict(moe_dispatch="expert_parallel")
  return c


def _batch(vocab):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab, (1, B, L), dtype=np.int32)
  mask = (rng.random((1, B, L)) < 0.8).astype(np.float32)  # uneven token counts per shard
  return {"tokens": tokens, "targets": np.roll(tokens, -1, -1), "loss_mask": mask,
          "segment_ids": np.ones((1, B, L), np.int32),
          "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (1, B, L)).copy()}


def _step(layout, state0):
  """(state before, state after, metrics, programs) of one train step of `layout`."""
  config = _config(layout)
  model_cfg = loop.model_config(config)
  progs = programs.programs(config, model_cfg)
  state = jax.device_put(state0, jax.tree.map(lambda t: t.sharding, progs.target))
  batch = placement.to_global(_batch(model_cfg.vocab_size), progs.train_batch_sharding)
  step = progs.train_step.lower(state, batch).compile(compiler_options=_FAST_COMPILE)
  before = jax.device_get(state)  # the step donates `state`
  new_state, metrics = step(state, batch)
  return before, new_state, jax.device_get(metrics), progs


@pytest.fixture(scope="module")
def reference():
  config = _config("single")
  progs = programs.programs(config, loop.model_config(config))
  state0 = jax.device_get(progs.init(jax.random.PRNGKey(0), None))
  _, new_state, metrics, _ = _step("single", state0)
  return state0, jax.device_get(new_state), metrics


@pytest.mark.slow  # 12-25 s of CPU per layout (one compile of the sharded train step)
@pytest.mark.parametrize("layout", sorted(layouts.LAYOUTS))
def test_train_step_matches_single_device(reference, layout):
  state0, want, want_metrics = reference
  before, got, metrics, progs = _step(layout, state0)
  chex.assert_trees_all_equal(before, state0)  # the layout's inputs are the reference's
  for k in ("loss", "ce", "grad_norm", "update_norm", "update_rms/muon", "update_rms/adamw",
            "moe/dropped_tokens"):
    np.testing.assert_allclose(metrics[k], want_metrics[k], rtol=TOL, err_msg=k)
  chex.assert_trees_all_close(jax.device_get(got), want, atol=TOL, rtol=TOL)
  axes = transformer.logical_axes(loop.model_config(_config(layout)))["params"]
  # Per Muon weight, this step's change (orthogonalized direction x LR) agrees to 1e-4 of its
  # size: Newton-Schulz multiplies the gradients' float32 summation-order differences on small
  # singular values by up to a^steps (3.4445^5), e.g. ~1.1e-5 of the update for an expert
  # that received few tokens. (AdamW's first step, lr·g/(|g|+eps), is ill-conditioned where
  # |g| ~ eps, so its weights are held to the absolute 1e-5 above only.)
  labels = param_labels(_config(layout).optim, axes)
  for (path, new), ref, old, label in zip(
      jax.tree_util.tree_leaves_with_path(jax.device_get(got.params)), jax.tree.leaves(want.params),
      jax.tree.leaves(state0.params), jax.tree.leaves(labels)):
    if label == "muon":
      np.testing.assert_allclose(new - old, ref - old, atol=1e-4 * np.abs(ref - old).max(),
                                 rtol=0, err_msg=jax.tree_util.keystr(path))
  # Outputs keep their input shardings: parameters (and their optimizer moments) exactly as
  # the layout's logical-axis rules place them.
  expected = rules_lib.param_shardings(axes, progs.mesh, _config(layout).rules)
  for (path, x), s in zip(jax.tree_util.tree_leaves_with_path(got.params),
                          jax.tree.leaves(expected)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)
  for x, t in zip(jax.tree.leaves(got), jax.tree.leaves(progs.target)):
    assert x.sharding.is_equivalent_to(t.sharding, x.ndim)
