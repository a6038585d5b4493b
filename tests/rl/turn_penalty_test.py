"""The per-turn penalty baseline (losses, turn_penalty) and its token mask, by hand."""

import jax
import ml_collections
import numpy as np
import pytest

from composer_jax.rl import losses
from composer_jax.rl.config import default_loss_config
from composer_jax.rl.trajectory import Trajectory, Turn, pack_batch, turn_token_mask

D, V = 4, 9


def _batch():
  turns = [Turn([1, 2]), Turn([3, 4], [-1.0, -1.0]), Turn([5]), Turn([6, 7, 8], [-1.0] * 3)]
  trajs = [Trajectory.from_turns(turns, 1.0, 0), Trajectory.from_turns(turns[:2], 1.0, 0)]
  return pack_batch(trajs, [8])


def test_turn_token_mask_marks_the_sampled_tokens_of_those_turns():
  batch = _batch()
  mask = turn_token_mask(batch, [(0, 3), (1, 1)])
  # targets of row 0: 2 3 4 5 6 7 8 pad -> turn 3's tokens 6 7 8 sit at target positions 4 5 6.
  np.testing.assert_array_equal(mask[0], [0, 0, 0, 0, 1, 1, 1, 0])
  np.testing.assert_array_equal(mask[1], [0, 1, 1, 0, 0, 0, 0, 0])


def test_turn_penalty_value_and_gradient_by_hand():
  """Equal rewards (A = 0), no clip/IS effects (w = 1, tis_cap 0): per-token loss = c on the
  flagged tokens, token mean over the 7 model tokens; d loss / d logp_t = c m_t / 7, so
  d loss / d h_t = (c m_t / 7) W (onehot(y_t) - softmax(h_t W))."""
  batch = _batch()
  batch["flagged_mask"] = turn_token_mask(batch, [(0, 3)])
  cfg = default_loss_config()
  cfg.update(turn_penalty=0.5, tis_cap=0.0, vocab_chunk_size=4)
  fn = losses.make_loss_fn(ml_collections.FrozenConfigDict(cfg))
  rng = np.random.default_rng(0)
  h, w = rng.normal(size=(2, 8, D)).astype(np.float32), rng.normal(size=(D, V)).astype(np.float32)
  loss, metrics = fn(h, w, batch)
  n_model = batch["model_mask"].sum()
  assert n_model == 7 and metrics["penalized_tokens"] == 3
  np.testing.assert_allclose(loss, 0.5 * 3 / 7, rtol=1e-6)
  grad = jax.grad(lambda x: fn(x, w, batch)[0])(h)
  z = h.astype(np.float64) @ w
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  onehot = np.eye(V)[batch["targets"]]
  want = (0.5 * batch["flagged_mask"] / 7)[..., None] * ((onehot - p) @ w.T)
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-7)


def test_turn_penalty_needs_the_mask_and_a_sign():
  cfg = default_loss_config()
  cfg.turn_penalty = 1.0
  fn = losses.make_loss_fn(ml_collections.FrozenConfigDict(cfg))
  with pytest.raises(ValueError, match="flagged_mask"):
    fn(np.zeros((2, 8, D), np.float32), np.zeros((D, V), np.float32), _batch())
  cfg.turn_penalty = -1.0
  with pytest.raises(ValueError, match="turn_penalty=-1.0 must be finite and >= 0"):
    losses.validate(cfg)
