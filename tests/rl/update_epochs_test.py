"""The RL step's K minibatch epochs (`rl.epochs`, `rl.minibatches`) and teacher prefix reuse
(`rl.teacher_prefix_reuse`) as the run config wires them (`rl.steps.epoch_updates`,
`update_program`), against a float64 numpy clipped objective and the full teacher recompute."""

import functools

import chex
import jax
import numpy as np
import pytest
from scipy import special

from composer_jax.model import transformer
from composer_jax.model.config import model_config
from composer_jax.parallel import rules as rules_lib
from composer_jax.rl import epochs, run
from composer_jax.rl import mesh as rl_mesh
from composer_jax.rl.programs import update_program
from composer_jax.rl.state import initial_state
from composer_jax.rl.steps import epoch_updates
from tests.rl import layouts_test

K, M, STALE, CAP = 4, 2, 3, 1.5


def _config(arm="rl", layout="single", lr=0.03):
  c = layouts_test._config(layout, "adamw")
  c.loss.sd_coef = 0.0 if arm == "rl" else 1.0
  c.loss.tis_cap = CAP
  c.optim.update(dict(lr=lr, adam_lr=lr))  # big steps: the ratio leaves the clip range
  c.rl.update(dict(epochs=K, minibatches=M))
  return c


_log_softmax = functools.partial(special.log_softmax, axis=-1)


@functools.cache
def _setup(layout="single", lr=0.03):
  config = _config(layout=layout, lr=lr)
  model_cfg = model_config(config.model)
  init = jax.device_get(transformer.init(model_cfg, jax.random.key(0)))
  prog = update_program(config, model_cfg)
  state = initial_state(config, model_cfg, init)
  batch, _ = layouts_test._batches()
  # Behaviour log-probs around the random model's (~ -log 64): pi_old / pi_sampler in
  # (0.6, 2.2), truncated at CAP = 1.5 on part of the tokens.
  noise = np.random.default_rng(1).uniform(-0.5, 0.8, batch["tokens"].shape)
  batch["sampler_logprobs"] = np.where(batch["model_mask"] > 0, -np.log(64) - noise, 0).astype(
    np.float32
  )
  router = jax.device_put(init["router"], prog.replicated)
  return config, model_cfg, init, prog, state, batch, router


_KEY = 5


@functools.cache
def _epochs(layout="single", lr=0.03):
  """(params, opt_state, history) of K epochs of M minibatch updates under `layout`."""
  _, _, _, prog, state, batch, router = _setup(layout, lr)
  return epoch_updates(
    prog,
    state.params,
    state.opt_state,
    router,
    rl_mesh.place_batch(batch, prog.per_token),
    None,
    None,
    epochs=K,
    minibatches=M,
    key=jax.random.key(_KEY),
    staleness=STALE,
  )


@functools.cache
def _forward(model_cfg):
  return jax.jit(functools.partial(transformer.forward, model_cfg))


def _np_logp(model_cfg, params, router, b):
  """float64 log pi(targets) [R, L] from the model's hidden states and head."""
  h, _ = _forward(model_cfg)(
    {"params": params, "router": router}, b["tokens"], b["segment_ids"], b["positions"]
  )
  head = np.asarray(transformer.output_head(model_cfg, params), np.float64)
  logits = np.asarray(h, np.float64) @ head
  return np.take_along_axis(_log_softmax(logits), np.asarray(b["targets"])[..., None], -1)[..., 0]


def _np_advantages(b, eps=1e-6):
  adv = np.zeros(len(b["reward"]))
  for g in np.unique(b["group_index"][b["valid"] > 0]):
    idx = (b["group_index"] == g) & (b["valid"] > 0)
    r = b["reward"][idx].astype(np.float64)
    adv[idx] = (r - r.mean()) / (r.std() + eps)
  return adv


@pytest.mark.slow  # ~25 s on 2 cores: 3 compiles of the tiny model's update, 8 numpy checks
def test_k_epochs_match_the_numpy_clipped_objective():
  config, model_cfg, _, prog, state, batch, router = _setup()
  key = jax.random.key(_KEY)
  placed = rl_mesh.place_batch(batch, prog.per_token)
  params, opt_state, history = _epochs()
  # The same updates replayed by hand in minibatch_indices' order, each checked at the params
  # before it against numpy.
  old = _np_logp(model_cfg, state.params, router, batch)
  adv = _np_advantages(batch)
  mask = batch["model_mask"] * batch["valid"][:, None] > 0
  fixed = dict(placed, **prog.old_policy(state.params, router, placed))
  np.testing.assert_allclose(fixed["old_logprobs"], np.where(mask, old, 0), atol=2e-5)
  np.testing.assert_allclose(fixed["advantage"], adv, rtol=1e-5, atol=1e-6)
  p, o = state.params, state.opt_state
  order = epochs.minibatch_indices(key, len(batch["valid"]), epochs=K, minibatches=M)
  for u, rows in enumerate(order.reshape(K * M, -1)):
    mini = {k: v[rows] for k, v in batch.items()}
    w = np.exp(_np_logp(model_cfg, p, router, mini) - old[rows])
    a = adv[rows][:, None]
    surrogate = np.minimum(w * a, np.clip(w, 1 - 0.2, 1 + 0.28) * a)
    tis = np.minimum(np.exp(old[rows] - batch["sampler_logprobs"][rows]), CAP)
    m = mask[rows]
    np.testing.assert_allclose(
      history["loss"][u],
      (-tis * surrogate)[m].sum() / m.sum(),
      rtol=1e-5,
      atol=5e-6,
      err_msg=f"update {u}",
    )
    clipped = ((a < 0) & (w < 1 - 0.2)) | ((a > 0) & (w > 1 + 0.28))
    np.testing.assert_allclose(history["clip_frac"][u], clipped[m].mean(), atol=1e-6)
    np.testing.assert_allclose(history["staleness_mean"][u], STALE + u)
    p, o, _ = prog.minibatch_update(
      p,
      o,
      router,
      fixed,
      rows.astype(np.int32),
      np.full(len(rows), STALE + u, np.int32),
      None,
      None,
    )
  chex.assert_trees_all_equal(jax.device_get(params), jax.device_get(p))
  np.testing.assert_allclose(history["ratio_max"][0], 1.0, atol=1e-5)
  assert history["clip_frac"][0] == 0 and history["clip_frac"][-M:].min() > 0
  assert 0 < history["is_truncated_frac"][0] < 1


# Smaller steps than the numpy check's: float32 summation-order differences grow with the
# step size (at lr 0.03, 2e-4 relative in the entropy by update 6; at 3e-3, 1.4e-5 in an
# AdamW weight whose gradient is ~eps).
SHARDED_LR = 1e-3


@pytest.mark.slow  # ~60 s on 2 cores: the minibatch update and old policy, sharded and not
def test_k_epochs_on_a_sharded_layout_equal_one_device():
  """K = 4 epochs x M = 2 minibatches under fsdp_ep (8 fake devices: sharded AdamW, EP
  dispatch) == on one device: every update's metrics, the new params and optimizer state;
  shardings kept."""
  want_params, want_opt, want = _epochs("single", SHARDED_LR)
  params, opt_state, history = _epochs("fsdp_ep", SHARDED_LR)
  config, model_cfg, _, prog, _, _, _ = _setup("fsdp_ep", SHARDED_LR)
  # Off-policy: pi_theta has left pi_old.
  assert history["ratio_max"][-1] > 1 + 1e-4, (history["ratio_max"], history["clip_frac"])
  assert set(history) == set(want)
  for k, v in want.items():
    np.testing.assert_allclose(history[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
  # 8 AdamW updates of lr 1e-3: a weight whose gradient is ~eps moves by up to 1.2e-5 with
  # the reduction order; a layout bug moves weights by ~lr per update.
  chex.assert_trees_all_close(
    jax.device_get(params), jax.device_get(want_params), atol=3e-5, rtol=1e-5
  )
  chex.assert_trees_all_close(
    jax.device_get(opt_state), jax.device_get(want_opt), atol=1e-5, rtol=1e-5
  )
  axes = transformer.logical_axes(model_cfg)["params"]
  expected = rules_lib.param_shardings(axes, prog.progs.mesh, config.rules)
  for (path, x), s in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(expected)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (jax.tree_util.keystr(path), x.sharding, s)
  for x, t in zip(jax.tree.leaves(opt_state), jax.tree.leaves(prog.progs.target.opt_state)):
    assert x.sharding.is_equivalent_to(t.sharding, x.ndim)


@pytest.mark.slow  # ~25 s on 2 cores: two compiles of the SD update
def test_teacher_prefix_reuse_equals_full_recompute_in_the_update():
  """The SD arm's update with teacher rows over the student's prefix cache == with full rows."""
  config = _config("sd")
  config.rl.update(dict(epochs=1, minibatches=1))
  config.optim.update(dict(lr=1e-4, adam_lr=1e-4))  # as tests/rl/layouts_test.py (AdamW, 1e-5)
  model_cfg = model_config(config.model)
  _, _, init, _, _, _, _ = _setup()
  prog = update_program(config, model_cfg)
  state = initial_state(config, model_cfg, init)
  router = jax.device_put(init["router"], prog.replicated)
  batch, full = layouts_test._batches()
  _, reuse = layouts_test._batches(reuse_prefix=True)
  placed = rl_mesh.place_batch(batch, prog.per_token)
  out = {}
  for name, teacher in (("full", full), ("reuse", reuse)):
    frozen = (state.params,)
    t = rl_mesh.place_batch(teacher, prog.per_token, student_length=layouts_test.L)
    args = (state.params, state.opt_state, router, placed, frozen, t)
    compiled = prog.update.lower(*args).compile()
    out[name] = jax.device_get(compiled(*args))
  assert out["full"][2]["num_distilled_tokens"] > 0
  for k, v in out["full"][2].items():
    np.testing.assert_allclose(out["reuse"][2][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
  chex.assert_trees_all_close(out["reuse"][0], out["full"][0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(epochs=0), "rl.epochs=0 must be >= 1"),
    (dict(minibatches=0), "rl.minibatches=0 must be >= 1"),
    (
      dict(minibatches=3),
      "rl.minibatches=3 does not divide the batch of 8 rows; valid: [1, 2, 4, 8]",
    ),
  ],
)
def test_bad_epochs_are_one_line(change, message):
  config = _config()
  config.rl.update(change)
  with pytest.raises(ValueError) as e:
    run.validate(config)
  assert message in str(e.value) and "\n" not in str(e.value)
