"""Supervised batches of scripted episodes: an RL experiment's warm-up data, trained on by the
one supervised loop (`train.loop.train(config, workdir, data=scripted.data(...))`).

    EpisodeBatches(episode, rng, batch_size=B, seq_len=L, pad_id=p)
        a grain `DatasetIterator` of [B, L] batches: B episodes `episode(rng) -> Trajectory`
        drawn one after another from the numpy Generator `rng`, packed one per row
        (`rl.trajectory.pack_batch`), the loss on the model's tokens (`loss_mask` =
        `model_mask`). Its state is the generator's, checkpointed with the run's (grain's
        orbax handler), so a resumed warm-up trains on the batches it would have.
    data(batches, evaluate=None) -> train.loop.Data
        the supervised loop's data: every process draws the same whole batch (one generator,
        one seed) and keeps its rows; `evaluate(state)`: metrics of the policy, if any.
    warmup_config(config) -> run config
        an RL config's `warmup` section as a supervised run config of its own.

Any environment plugs in through `episode`: the tool environment's scripted agent
(`envs.toolcall.warmup`), or scripted coding episodes rendered to tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import grain
import ml_collections
import numpy as np

from composer_jax.model.config import model_config
from composer_jax.rl.trajectory import Trajectory, pack_batch
from composer_jax.train import loop

_KEYS = ("tokens", "targets", "segment_ids", "positions")


class EpisodeBatches(grain.DatasetIterator):
  """[batch_size, seq_len] supervised batches of scripted episodes (module docstring)."""

  def __init__(
    self,
    episode: Callable[[np.random.Generator], Trajectory],
    rng: np.random.Generator,
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
  ):
    super().__init__()
    self._episode, self._rng = episode, rng
    self._batch_size, self._seq_len, self._pad_id = batch_size, seq_len, pad_id

  def __next__(self) -> dict[str, np.ndarray]:
    trajectories = [self._episode(self._rng) for _ in range(self._batch_size)]
    packed = pack_batch(trajectories, [self._seq_len], pad_id=self._pad_id)
    return {k: packed[k] for k in _KEYS} | {"loss_mask": packed["model_mask"]}

  def get_state(self) -> dict:
    return self._rng.bit_generator.state

  def set_state(self, state: dict) -> None:
    self._rng.bit_generator.state = state


def data(batches: EpisodeBatches, evaluate=None) -> loop.Data:
  """`batches` as the supervised loop's data (module docstring)."""
  return loop.Data(train=batches, whole=True, evaluate=evaluate)


def warmup_config(config) -> ml_collections.ConfigDict:
  """The supervised warm-up of an RL config as a run config of its own: `config` with the
  `warmup` section's optimizer (`warmup.optim`), steps, batch size, sequence length, logging,
  checkpoints (`ckpt_every`, `keep`: 1 if absent), evaluation (`check_every`: 0 if absent, only
  at the end) and router-bias rate; one micro-batch, full-vocabulary loss chunks, no z-loss.
  `train.init_from` and `train.seed` are the RL run's."""
  w = config.warmup
  c = ml_collections.ConfigDict(config.to_dict())
  c.optim = ml_collections.ConfigDict(w.optim.to_dict())
  c.train.update(
    dict(
      steps=w.steps,
      batch_size=w.batch_size,
      seq_len=w.seq_len,
      grad_accum=1,
      loss_chunk=model_config(config.model).vocab_size,
      z_loss=0.0,
      router_bias_rate=w.router_bias_rate,
      log_every=w.log_every,
      ckpt_every=w.ckpt_every,
      keep=w.get("keep", 1),
      eval_every=w.get("check_every", 0),
    )
  )
  return c
