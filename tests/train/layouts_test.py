"""One full train step under every named layout on 8 fake devices == the single-device step.

The trainer's own programs (`composer_jax.train.programs`) are used on both sides, so each
layout runs whatever the trainer does there: sharded Muon, context-parallel attention
(`cp2_ep8`), the MoE dispatch of a plain run of the layout (dropless under GSPMD) and, for
layouts with experts over `expert`, also expert-parallel dispatch; the reference is the same
config on one device (plain per-leaf Muon, dropless MoE, no collectives). Each compile's XLA
log (file descriptor 2) must hold no "Involuntary full rematerialization": GSPMD replicating
a whole tensor because it cannot reshard it efficiently.
"""

import contextlib
import os
import sys
import tempfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.optim import param_labels
from composer_jax.parallel import rules as rules_lib
from composer_jax.train import placement, programs
from experiments.configs import base, layouts
from tests.train.conftest import tiny_config

B, L = 8, 16  # batch over up to 8 data shards; L divisible by 2 x context (4 in cp2_ep8)
TOL = 1e-5
REMAT = "Involuntary full rematerialization"


def _expert_parallel(layout) -> bool:
  """Whether the layout's rules shard routed experts over `expert` (all but `fsdp`)."""
  return dict(map(tuple, layouts.get_config(layout).rules.expert))["experts"] == "expert"


# (layout, MoE dispatch): a plain run of each layout, and expert-parallel dispatch (shard_map +
# all-to-all) where the rules allow it.
CASES = [(name, "dropless") for name in sorted(layouts.LAYOUTS)] + [
  (name, "expert_parallel") for name in sorted(layouts.LAYOUTS) if _expert_parallel(name)
]


def _config(layout, dispatch="dropless"):
  c = tiny_config(batch_size=B, seq_len=L)
  c.optim.update(dict(warmup_steps=0, weight_decay=0.1))  # step 0 moves every weight
  base.set_layout(c, layout)
  if dispatch != "dropless":
    c.model.moe_dispatch = dispatch
  return c


@contextlib.contextmanager
def _fd2(log: list):
  """Appends to `log` what is written to file descriptor 2 (XLA's C++ log) in the block."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as f:
    os.dup2(f.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      f.seek(0)
      log.append(f.read().decode(errors="replace"))


def _compile(lowered):
  """(compiled, its XLA log lines that report an involuntary full rematerialization)."""
  log = []
  with _fd2(log):
    compiled = lowered.compile()
  return compiled, [line for line in log[0].splitlines() if REMAT in line]


def _batch(vocab):
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, vocab, (1, B, L), dtype=np.int32)
  mask = (rng.random((1, B, L)) < 0.8).astype(np.float32)  # uneven token counts per shard
  return {
    "tokens": tokens,
    "targets": np.roll(tokens, -1, -1),
    "loss_mask": mask,
    "segment_ids": np.ones((1, B, L), np.int32),
    "positions": np.broadcast_to(np.arange(L, dtype=np.int32), (1, B, L)).copy(),
  }


def _step(layout, state0, dispatch="dropless"):
  """(state before, state after, metrics, programs, remat log lines) of one train step."""
  config = _config(layout, dispatch)
  model_cfg = model_config(config.model)
  progs = programs.programs(config, model_cfg)
  state = jax.device_put(state0, jax.tree.map(lambda t: t.sharding, progs.target))
  batch = placement.to_global(_batch(model_cfg.vocab_size), progs.train_batch_sharding)
  step, remat = _compile(progs.train_step.lower(state, batch))
  before = jax.device_get(state)  # the step donates `state`
  new_state, metrics = step(state, batch)
  return before, new_state, jax.device_get(metrics), progs, remat


@pytest.fixture(scope="module")
def reference():
  config = _config("single")
  progs = programs.programs(config, model_config(config.model))
  state0 = jax.device_get(progs.init(jax.random.PRNGKey(0), None))
  _, new_state, metrics, _, _ = _step("single", state0)
  return state0, jax.device_get(new_state), metrics


def test_the_log_check_sees_an_involuntary_rematerialization():
  # [B, L, D] split 8 ways on D -> 4 x 2 ways on B and L of a (4, 2) mesh: GSPMD cannot
  # reshard this with an all-to-all and replicates (the embedding gather's case in `cp2_ep8`
  # before the table was constrained), so XLA logs the warning and `_compile` returns it.
  mesh = Mesh(np.asarray(jax.devices()).reshape(4, 2), ("a", "b"))
  fn = jax.jit(
    lambda x: jax.lax.with_sharding_constraint(
      x * 2, NamedSharding(mesh, PartitionSpec("a", "b", None))
    )
  )
  x = jax.ShapeDtypeStruct(
    (16, 8, 64), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec(None, None, ("a", "b")))
  )
  _, remat = _compile(fn.lower(x))
  assert remat


@pytest.mark.slow  # 12-25 s of CPU per case (one compile of the sharded train step)
@pytest.mark.parametrize("layout, dispatch", CASES)
def test_train_step_matches_single_device(reference, layout, dispatch):
  state0, want, want_metrics = reference
  before, got, metrics, progs, remat = _step(layout, state0, dispatch)
  chex.assert_trees_all_equal(before, state0)  # the layout's inputs are the reference's
  for k in (
    "loss",
    "ce",
    "grad_norm",
    "update_norm",
    "update_rms/muon",
    "update_rms/adamw",
    "moe/dropped_tokens",
  ):
    np.testing.assert_allclose(metrics[k], want_metrics[k], rtol=TOL, err_msg=k)
  chex.assert_trees_all_close(jax.device_get(got), want, atol=TOL, rtol=TOL)
  config = _config(layout, dispatch)
  axes = transformer.logical_axes(model_config(config.model))["params"]
  # Per Muon weight, this step's change (orthogonalized direction x LR) agrees to 1e-4 of its
  # size: Newton-Schulz multiplies the gradients' float32 summation-order differences on small
  # singular values by up to a^steps (3.4445^5), e.g. ~1.1e-5 of the update for an expert
  # that received few tokens. (AdamW's first step, lr·g/(|g|+eps), is ill-conditioned where
  # |g| ~ eps, so its weights are held to the absolute 1e-5 above only.)
  labels = param_labels(config.optim, axes)
  for (path, new), ref, old, label in zip(
    jax.tree_util.tree_leaves_with_path(jax.device_get(got.params)),
    jax.tree.leaves(want.params),
    jax.tree.leaves(state0.params),
    jax.tree.leaves(labels),
  ):
    if label == "muon":
      np.testing.assert_allclose(
        new - old,
        ref - old,
        atol=1e-4 * np.abs(ref - old).max(),
        rtol=0,
        err_msg=jax.tree_util.keystr(path),
      )
  # Outputs keep their input shardings: parameters (and their optimizer moments) exactly as
  # the layout's logical-axis rules place them.
  expected = rules_lib.param_shardings(axes, progs.mesh, config.rules)
  for (path, x), s in zip(
    jax.tree_util.tree_leaves_with_path(got.params), jax.tree.leaves(expected)
  ):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)
  for x, t in zip(jax.tree.leaves(got), jax.tree.leaves(progs.target)):
    assert x.sharding.is_equivalent_to(t.sharding, x.ndim)
  assert not remat, remat
