"""K minibatch epochs on a tiny transformer against a float64 numpy clipped objective."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import special

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.rl import epochs, losses
from composer_jax.rl.config import default_loss_config
from tests.model.random_variables import random_variables

_CFG = ModelConfig(num_layers=1, first_k_dense_replace=1, vocab_size=64)
B, L, K, M = 8, 12, 4, 2
EPS_LO, EPS_HI, CAP = 0.2, 0.28, 1.5


_log_softmax = functools.partial(special.log_softmax, axis=-1)


@functools.cache
def _setup():
  variables = random_variables(_CFG)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, _CFG.vocab_size, (B, L)).astype(np.int32)
  lens = rng.integers(6, L + 1, B)
  seg = (np.arange(L) < lens[:, None]).astype(np.int32)
  model_mask = (seg * (np.arange(L) >= 3))[:, :] * (np.arange(L) < lens[:, None] - 1)
  batch = dict(
    tokens=tokens,
    targets=np.concatenate([tokens[:, 1:], np.zeros((B, 1), np.int32)], 1) * seg,
    segment_ids=seg,
    positions=np.where(seg > 0, np.arange(L), 0).astype(np.int32),
    model_mask=model_mask.astype(np.float32),
    reward=rng.normal(size=B).astype(np.float32),
    valid=np.array([1] * (B - 1) + [0], np.float32),  # one padding row
    group_index=np.repeat(np.arange(2), B // 2).astype(np.int32),
    staleness=np.ones(B, np.int32),
  )
  cfg = default_loss_config()
  cfg.update(clip_eps_low=EPS_LO, clip_eps_high=EPS_HI, tis_cap=CAP, vocab_chunk_size=64)
  return variables, batch, cfg


def _hidden(variables, b):
  return transformer.forward(_CFG, variables, b["tokens"], b["segment_ids"], b["positions"])[0]


def _np_logp(variables, b):
  """float64 log pi(targets) [R, L] from the model's hidden states and head."""
  h = np.asarray(jax.jit(_hidden)(variables, b), np.float64)
  head = np.asarray(transformer.output_head(_CFG, variables["params"]), np.float64)
  return np.take_along_axis(_log_softmax(h @ head), np.asarray(b["targets"])[..., None], -1)[..., 0]


def _np_advantages(batch):
  adv = np.zeros(B)
  for g in (0, 1):
    idx = (batch["group_index"] == g) & (batch["valid"] > 0)
    r = batch["reward"][idx].astype(np.float64)
    adv[idx] = (r - r.mean()) / (r.std() + 1e-6)
  return adv


@functools.cache
def _run():
  variables, batch, cfg = _setup()
  router = variables["router"]
  old_policy = losses.make_old_policy_fn(cfg)
  loss_fn = losses.make_loss_fn(cfg)
  head = lambda p: transformer.output_head(_CFG, p)
  old = old_policy(jax.jit(_hidden)(variables, batch), head(variables["params"]), batch)
  # Behaviour log-probs: the old policy's plus noise (a stale, numerically different sampler).
  noise = np.random.default_rng(1).normal(0, 0.3, (B, L)).astype(np.float32)
  batch = dict(
    batch,
    sampler_logprobs=np.where(
      batch["model_mask"] > 0, np.asarray(old["old_logprobs"]) + noise, 0.0
    ),
  )
  full = dict(batch, **old)
  tx = optax.adam(0.03)

  @jax.jit
  def update(state, mini):
    params, opt_state = state

    def objective(p):
      return loss_fn(_hidden({"params": p, "router": router}, mini), head(p), mini)

    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), metrics

  seen = []

  def recording_update(state, mini):
    seen.append((state[0], mini))
    return update(state, mini)

  params = variables["params"]
  _, metrics = epochs.run_epochs(
    recording_update,
    (params, tx.init(params)),
    full,
    epochs=K,
    minibatches=M,
    key=jax.random.key(3),
  )
  return full, seen, metrics


def test_k_epochs_clip_and_loss_match_numpy():
  full, seen, metrics = _run()
  variables = _setup()[0]
  adv = _np_advantages(full)
  old = _np_logp(variables, full)
  mask_full = full["model_mask"] * full["valid"][:, None]
  np.testing.assert_allclose(full["old_logprobs"], np.where(mask_full > 0, old, 0), atol=2e-5)
  np.testing.assert_allclose(full["advantage"], adv, rtol=1e-5, atol=1e-6)
  assert len(seen) == K * M and metrics["loss"].shape == (K * M,)
  order = epochs.minibatch_indices(jax.random.key(3), B, epochs=K, minibatches=M)
  for u, (params, mini) in enumerate(seen):
    e, j = divmod(u, M)
    rows = order[e, j]
    logp = _np_logp({"params": params, "router": variables["router"]}, mini)
    w = np.exp(logp - old[rows])
    a = adv[rows][:, None]
    surrogate = np.minimum(w * a, np.clip(w, 1 - EPS_LO, 1 + EPS_HI) * a)
    tis = np.minimum(np.exp(old[rows] - full["sampler_logprobs"][rows]), CAP)
    mask = mask_full[rows] > 0
    want = (-tis * surrogate)[mask].sum() / mask.sum()  # DAPO: over all tokens of the minibatch
    clipped = ((a < 0) & (w < 1 - EPS_LO)) | ((a > 0) & (w > 1 + EPS_HI))
    np.testing.assert_allclose(metrics["loss"][u], want, rtol=1e-5, atol=1e-6, err_msg=f"{u}")
    np.testing.assert_allclose(metrics["clip_frac"][u], clipped[mask].mean(), atol=1e-6)
    np.testing.assert_allclose(metrics["staleness_mean"][u], 1 + u, rtol=1e-6)
  # The first update runs at the old policy (ratio 1, nothing clipped); later ones clip.
  np.testing.assert_allclose(metrics["ratio_max"][0], 1.0, atol=1e-5)
  assert metrics["clip_frac"][0] == 0 and metrics["clip_frac"][-M:].min() > 0
  assert 0 < metrics["is_truncated_frac"][0] < 1 and metrics["is_weight_max"][0] > CAP


def test_minibatches_cover_each_epoch_once():
  order = epochs.minibatch_indices(jax.random.key(0), 12, epochs=3, minibatches=4)
  assert order.shape == (3, 4, 3)
  for e in range(3):
    np.testing.assert_array_equal(np.sort(order[e].ravel()), np.arange(12))
  assert not np.array_equal(order[0], order[1])
  np.testing.assert_array_equal(
    order, epochs.minibatch_indices(jax.random.key(0), 12, epochs=3, minibatches=4)
  )


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(epochs=0, minibatches=1), r"epochs=0 must be an integer >= 1"),
    (dict(epochs=2, minibatches=0), r"minibatches=0 must be an integer >= 1"),
    (
      dict(epochs=1, minibatches=3),
      r"minibatches=3 does not divide the batch of 4 rows; "
      r"valid: \[1, 2, 4\]",
    ),
  ],
)
def test_bad_epochs_or_minibatches(kwargs, match):
  batch = dict(x=jnp.zeros((4, 2)))
  with pytest.raises(ValueError, match=match):
    epochs.run_epochs(lambda s, b: (s, {}), 0, batch, key=jax.random.key(0), **kwargs)
