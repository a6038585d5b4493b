"""RL with targeted text feedback on any environment (`rl.env.Env`): the RL program.

    rl_steps(config, env, init, state)
                            RL steps from the `init` variables (e.g. after a supervised
                            warm-up; and `state`, an `RLState`, when resuming), yielding each
                            step's metrics and state; `train` runs them all in memory,
                            `rl.run` with checkpoints:
      1. sample `groups` tasks, each played `group_size` times (GRPO groups) by the sampler
         (`rl.sampler`, temperature/top-p from the config) through `rl.episodes.run_episodes`;
      2. pack the trajectories (`rl.trajectory.pack_batch`, one static length);
      3. the environment's feedback (`Env.feedback`) flags faulty model turns with their hints;
         with sd_coef > 0 they become the teacher batch (`rl.teacher.build_teacher_batch`,
         a fixed number of rows: extra targets beyond `teacher_rows` are dropped and counted);
      4. one jitted update: loss = RL + sd_coef * SD (`rl.losses.make_loss_fn`), teacher
         forward on the teacher weights (`rl.teacher_weights`) under stop_gradient; the EMA
         teacher is then moved towards the new params.
    The router bias is not trained during RL (it has no gradient and RL has no router-count
    update). Both arms of an experiment see the same tasks and sampling keys for the same seed
    and the same number of episodes per step: only the update differs.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.optim import build_optimizer
from composer_jax.rl import advantages, losses, sampler, teacher_weights
from composer_jax.rl.env import Env, distill_targets
from composer_jax.rl.episodes import run_episodes
from composer_jax.rl.teacher import build_teacher_batch
from composer_jax.rl.trajectory import pack_batch
from composer_jax.train import loop


def _optimizer(optim_cfg, model_cfg: ModelConfig):
  axes = transformer.logical_axes(model_cfg)["params"]
  return build_optimizer(optim_cfg, axes), axes


@functools.lru_cache(maxsize=4)
def make_update(model_cfg: ModelConfig, loss_cfg, optimizer: optax.GradientTransformation):
  """Cached per (model, loss config, optimizer): jitted
  `update(params, opt_state, router, batch, teacher_params, teacher_batch)` ->
  (params, opt_state, metrics). `teacher_params` = `teacher_weights.teacher_variables(...)`
  (a tuple of param trees) and `teacher_batch` from `build_teacher_batch`, or both None (RL only).
  """
  loss_fn = losses.make_loss_fn(loss_cfg)

  def hidden(params, router, b):
    h, _ = transformer.forward(
      model_cfg,
      {"params": params, "router": router},
      b["tokens"],
      segment_ids=b["segment_ids"],
      positions=b["positions"],
    )
    return h

  def objective(params, router, batch, teacher_params, teacher_batch):
    teacher = None
    if teacher_batch is not None:
      teacher = tuple(
        jax.lax.stop_gradient(
          (hidden(p, router, teacher_batch), transformer.output_head(model_cfg, p))
        )
        for p in teacher_params
      )
    return loss_fn(
      hidden(params, router, batch),
      transformer.output_head(model_cfg, params),
      batch,
      teacher,
      teacher_batch,
    )

  @jax.jit
  def update(params, opt_state, router, batch, teacher_params=None, teacher_batch=None):
    (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(
      params, router, batch, teacher_params, teacher_batch
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  return update


@functools.lru_cache(maxsize=4)
def _rl_optimizer(model_cfg: ModelConfig, optim_cfg: ml_collections.FrozenConfigDict):
  return _optimizer(optim_cfg, model_cfg)[0]


def _empty_teacher_batch(rows: int, length: int, slots: int) -> dict[str, np.ndarray]:
  """A teacher batch of padding rows only (all slot_mask 0): the SD term and its gradient are 0,
  so steps without flagged turns run the same compiled update."""
  i32 = lambda *s: np.zeros(s, np.int32)
  return dict(
    tokens=i32(rows, length),
    targets=i32(rows, length),
    positions=i32(rows, length),
    segment_ids=i32(rows, length),
    student_row=i32(rows),
    target_turn=np.full((rows,), -1, np.int32),
    dropped_tokens=i32(rows),
    slot_student_pos=i32(rows, slots),
    slot_teacher_pos=i32(rows, slots),
    slot_target=i32(rows, slots),
    slot_mask=np.zeros((rows, slots), np.float32),
  )


def make_policy(model_cfg: ModelConfig, rl_cfg, stop_ids: tuple[int, ...], pad_id: int):
  """`policy(variables, prompts [B, P], prompt_lens [B], key) -> (tokens, logprobs, lengths)`."""

  def policy(variables, prompts, prompt_lens, key):
    out = sampler.sample(
      model_cfg,
      variables,
      jnp.asarray(prompts),
      jnp.asarray(prompt_lens),
      key,
      max_new_tokens=rl_cfg.max_new_tokens,
      temperature=rl_cfg.temperature,
      top_p=rl_cfg.top_p,
      stop_ids=tuple(stop_ids),
      pad_id=pad_id,
    )
    return out.tokens, out.logprobs, out.lengths

  return policy


@dataclasses.dataclass
class RLState:
  """What an RL run carries from one step to the next, i.e. what a checkpoint holds.

  `step` counts finished RL steps; `ema` is the EMA teacher (None unless `loss.teacher` is
  'ema'); `rng` draws the tasks (the sampling keys are `fold_in(key(seed), step)`).
  """

  step: int
  params: Any
  opt_state: Any
  ema: Any
  rng: np.random.Generator


def initial_state(config, init: dict) -> RLState:
  """Step 0 from the warmed-up `init` = {'params', 'router'}."""
  tx = _rl_optimizer(loop.model_config(config), ml_collections.FrozenConfigDict(config.rl.optim))
  params = init["params"]
  ema = teacher_weights.ema_init(params) if config.loss.teacher == "ema" else None
  return RLState(0, params, tx.init(params), ema, np.random.default_rng([config.seed, 1]))


def rl_steps(config, env: Env, init: dict, state: RLState | None = None
             ) -> Iterator[tuple[dict, RLState]]:
  """RL steps on `env` from `state` (default `initial_state`) up to `config.rl.steps`; yields
  each step's metrics row and the state after it. `init` (e.g. the warmed-up variables) gives
  the router bias, fixed during RL, and the weights of the 'frozen' teacher."""
  model_cfg, r = loop.model_config(config), config.rl
  loss_cfg = config.loss
  distill = loss_cfg.sd_coef > 0
  tx = _rl_optimizer(model_cfg, ml_collections.FrozenConfigDict(r.optim))
  update = make_update(model_cfg, ml_collections.FrozenConfigDict(loss_cfg), tx)
  policy = make_policy(model_cfg, r, env.stop_ids, env.pad_id)
  state = state or initial_state(config, init)
  params, opt_state, ema, rng = state.params, state.opt_state, state.ema, state.rng
  router = init["router"]
  key = jax.random.fold_in(jax.random.key(config.seed), 1)
  rows = r.groups * r.group_size
  group_ids = np.repeat(np.arange(r.groups), r.group_size)
  for step in range(state.step, r.steps):
    t0 = time.time()
    tasks = [env.sample_task(rng) for _ in range(r.groups)]
    episodes = run_episodes(
      env,
      [tasks[g] for g in group_ids],
      group_ids,
      functools.partial(policy, {"params": params, "router": router}),
      jax.random.fold_in(key, step),
      prompt_len=r.prompt_len,
      pad_id=env.pad_id,
    )
    trajs = [e.trajectory for e in episodes]
    batch = pack_batch(trajs, [r.seq_len], batch_size=rows, pad_id=env.pad_id)
    advantages.check_groups(batch["group_index"], batch["valid"], rows)
    targets = distill_targets(env, episodes)
    row = dict(step=step, **env.episode_metrics(episodes), flagged_turns=len(targets))
    teacher_params = teacher_batch = None
    if distill:
      kept = targets[: r.teacher_rows]
      row["flagged_turns_dropped"] = len(targets) - len(kept)
      teacher_batch = (
        build_teacher_batch(
          trajs,
          batch,
          kept,
          buckets=[r.teacher_seq_len],
          turn_buckets=[r.max_new_tokens],
          num_rows=r.teacher_rows,
          pad_id=env.pad_id,
        )
        if kept
        else _empty_teacher_batch(r.teacher_rows, r.teacher_seq_len, r.max_new_tokens)
      )
      teacher_params = teacher_weights.teacher_variables(
        loss_cfg, params, ema=ema, initial=init["params"]
      )
    params, opt_state, metrics = update(
      params, opt_state, router, batch, teacher_params, teacher_batch
    )
    if ema is not None:
      ema = teacher_weights.ema_update(ema, params, loss_cfg.ema_rate)
    row.update({k: float(v) for k, v in metrics.items()}, seconds=time.time() - t0)
    yield row, RLState(step + 1, params, opt_state, ema, rng)


def train(config, env: Env, init: dict) -> list[dict]:
  """All RL steps on `env` from `init` = {'params', 'router'}, in memory (no checkpoints:
  `rl.run` is the resumable driver); returns one metrics dict per step."""
  rows = []
  for row, state in rl_steps(config, env, init):
    rows.append(row)
    if state.step % config.rl.log_every == 0 or state.step == config.rl.steps:
      logging.info("rl step %d reward %.3f unavailable %.3f loss %.4f", state.step,
                   row["reward"], row["unavailable_rate"], row["loss"])
  return rows
