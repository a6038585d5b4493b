"""RL with targeted text feedback on any environment (`rl.env.Env`): the RL update and steps.

    update_program(config, model_cfg)
        the jitted RL update on the run's mesh, built from the supervised trainer's programs
        (`train.programs.extend`: same layout, optimizer — sharded Muon or AdamW — shardings,
        dual mesh with EP / CP layers, one compile cache):
        `update(params, opt_state, router, batch, teacher_params, teacher_batch)` ->
        (params, opt_state, metrics); loss = RL + sd_coef * SD (`rl.losses.make_loss_fn`), the
        teacher forward on the teacher weights (`rl.teacher_weights`) under stop_gradient.
    RLSteps(config, env, init, state)
        one RL step per call: a batch from the sampler (`rl.rollout`: colocated, or a
        disaggregated sampler thread on its own devices), placed on the trainer's mesh
        (`rl.mesh.place_batch`), one update; the EMA teacher then moves towards the new params;
        every `rl.probe_every` steps the probes (`rl.sd_probes`, with `rl.probe_count` > 0) on the
        environment's held-out `probe_set`, against this arm's teacher kind. With
        `loss.log_term_grads` the update also logs the RL and SD gradient norms and cosine.
        `train` runs all steps in memory, `rl.run` through the training driver.
The router bias is not trained during RL (it has no gradient and RL has no router-count
update). Both arms of an experiment see the same tasks and sampling keys for the same seed
and the same number of episodes per step: only the update differs.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig
from composer_jax.parallel import context_mesh
from composer_jax.parallel import rules as rules_lib
from composer_jax.rl import epochs as epochs_lib
from composer_jax.rl import losses, sd_probes, teacher, teacher_weights
from composer_jax.rl import mesh as rl_mesh
from composer_jax.rl import rollout as rollout_lib
from composer_jax.rl.env import Env
from composer_jax.train import loop, programs

MODES = ("colocated", "disaggregated")


def make_update(model_cfg: ModelConfig, loss_cfg, optimizer: optax.GradientTransformation):
  """(`update`, `old_policy`), not jitted.

  `update(params, opt_state, router, batch, teacher_params, teacher_batch)` ->
  (params, opt_state, metrics): one optimizer step on `batch`. `teacher_params` =
  `teacher_weights.teacher_variables(...)` (a tuple of param trees) and `teacher_batch` from
  `build_teacher_batch` (full rows, or extension rows over the student's prefix cache:
  `teacher.teacher_hidden`), or both None (RL only).
  `old_policy(params, router, batch)` -> {'old_logprobs' [B, L], 'advantage' [B]}: what K
  minibatch epochs hold fixed (`losses.make_old_policy_fn`).
  """
  loss_fn = losses.make_loss_fn(loss_cfg)
  old_policy_fn = losses.make_old_policy_fn(loss_cfg)

  def hidden(params, router, b):
    h, _ = transformer.forward(model_cfg, {"params": params, "router": router}, b["tokens"],
                               segment_ids=b["segment_ids"], positions=b["positions"])
    return h

  def objective(params, router, batch, teacher_params, teacher_batch):
    teacher_out = None
    if teacher_batch is not None:
      teacher_out = tuple(
        jax.lax.stop_gradient(
          (teacher.teacher_hidden(model_cfg, {"params": p, "router": router}, batch,
                                  teacher_batch),
           transformer.output_head(model_cfg, p)))
        for p in teacher_params)
    return loss_fn(hidden(params, router, batch), transformer.output_head(model_cfg, params),
                   batch, teacher_out, teacher_batch)

  def _term_grads(params, router, batch, teacher_params, teacher_batch):
    """Total gradient and metrics with `sd_probes.term_grad_stats` of the RL part (loss minus
    sd_coef * SD) and the SD term: one forward, two backward passes."""

    def terms(p):
      loss, metrics = objective(p, router, batch, teacher_params, teacher_batch)
      sd = metrics.get("sd_loss", jnp.zeros_like(loss))
      return jnp.stack([loss - loss_cfg.sd_coef * sd, sd]), metrics

    _, vjp, metrics = jax.vjp(terms, params, has_aux=True)
    (g_rl,), (g_sd,) = vjp(jnp.array([1.0, 0.0])), vjp(jnp.array([0.0, 1.0]))
    metrics.update(sd_probes.term_grad_stats(g_rl, g_sd))
    return jax.tree.map(lambda a, b: a + loss_cfg.sd_coef * b, g_rl, g_sd), metrics

  def update(params, opt_state, router, batch, teacher_params=None, teacher_batch=None):
    if loss_cfg.log_term_grads:
      grads, metrics = _term_grads(params, router, batch, teacher_params, teacher_batch)
    else:
      (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(
        params, router, batch, teacher_params, teacher_batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    metrics["grad_norm"] = optax.tree.norm(grads)
    return optax.apply_updates(params, updates), opt_state, metrics

  def old_policy(params, router, batch):
    return old_policy_fn(hidden(params, router, batch),
                         transformer.output_head(model_cfg, params), batch)

  return update, old_policy


class UpdateProgram(NamedTuple):
  """The RL update on the run's mesh. `progs`: the run's `train.programs.Programs` (mesh,
  optimizer, `target` shardings, `init`); `update`: jitted `make_update` on a whole batch;
  `minibatch_update(params, opt_state, router, batch, rows [B / M], staleness [B / M],
  teacher_params, teacher_batch)`: the same on the batch's rows `rows` (`rl.mesh.select_rows`;
  the teacher batch restricted to them); `old_policy`: jitted; `per_token`: the `[rows, L]`
  batch sharding; `replicated`: for the router bias."""

  progs: programs.Programs
  update: Any
  minibatch_update: Any
  old_policy: Any
  per_token: rl_mesh.BatchLayout
  replicated: NamedSharding


def update_program(config, model_cfg: ModelConfig) -> UpdateProgram:
  """The (cached) RL update of `config` on its layout (`config.mesh`, `config.rules`)."""
  loss_cfg = ml_collections.FrozenConfigDict(config.loss)

  def build(progs: programs.Programs) -> UpdateProgram:
    update, old_policy = make_update(model_cfg, loss_cfg, progs.optimizer)
    per_token = rl_mesh.batch_layout(progs.mesh, config.rules)

    def minibatch_update(params, opt_state, router, batch, rows, staleness, teacher_params,
                         teacher_batch):
      mini = dict(rl_mesh.select_rows(batch, rows, per_token), staleness=staleness)
      if teacher_batch is not None:
        teacher_batch = teacher.restrict_to_rows(teacher_batch, rows)
      return update(params, opt_state, router, mini, teacher_params, teacher_batch)

    target = progs.target
    out = (jax.tree.map(lambda t: t.sharding, target.params),
           jax.tree.map(lambda t: t.sharding, target.opt_state), None)
    on_mesh = lambda f, **kw: jax.jit(context_mesh.with_mesh(progs.mesh, config.rules, f), **kw)
    return UpdateProgram(
      progs=progs,
      update=on_mesh(update, out_shardings=out),
      minibatch_update=on_mesh(minibatch_update, out_shardings=out),
      old_policy=on_mesh(old_policy),
      per_token=per_token,
      replicated=NamedSharding(progs.mesh.dense, rules_lib.logical_to_spec(
        (), config.rules.dense, progs.mesh.dense)))

  return programs.extend("rl_update", config, model_cfg, config.loss.to_dict(), build)


def epoch_updates(prog: UpdateProgram, params, opt_state, router, batch: dict,
                  teacher_params_fn, teacher_batch: dict | None, *, epochs: int,
                  minibatches: int, key: jax.Array, staleness: int):
  """K epochs of M minibatch updates on one batch (`rl.epochs.run_epochs`, PPO's convention):
  pi_old and the advantages from `prog.old_policy` at `params`, held fixed; the truncated
  importance weight min(pi_old / pi_sampler, C) against the batch's behaviour log-probs.

  Args:
    batch, teacher_batch: on the trainer's mesh (`rl.mesh.place_batch`).
    teacher_params_fn: params -> `teacher_weights.teacher_variables` of the current params.
    staleness: optimizer updates between the weights that sampled the batch and `params`.

  Returns:
    (params, opt_state, metrics: name -> `[K * M]` array in update order).
  """
  batch = {**batch, **prog.old_policy(params, router, batch)}
  rows = np.shape(batch["valid"])[0]
  index = {"rows": np.arange(rows, dtype=np.int32),
           "staleness": np.full((rows,), staleness, np.int32)}

  def update_fn(carry, mini):
    p, o = carry
    teacher_params = None if teacher_batch is None else teacher_params_fn(p)
    p, o, metrics = prog.minibatch_update(p, o, router, batch, np.asarray(mini["rows"]),
                                          np.asarray(mini["staleness"]), teacher_params,
                                          teacher_batch)
    return (p, o), metrics

  (params, opt_state), history = epochs_lib.run_epochs(
    update_fn, (params, opt_state), index, epochs=epochs, minibatches=minibatches, key=key)
  return params, opt_state, history


def probe_program(config, model_cfg: ModelConfig):
  """The (cached, like the update) jitted probe of `config` on its layout:
  `rl.sd_probes.make_probe_fn`."""

  def build(progs: programs.Programs):
    fn = sd_probes.make_probe_fn(model_cfg, config.loss)
    return jax.jit(context_mesh.with_mesh(progs.mesh, config.rules, fn))

  return programs.extend("rl_probe", config, model_cfg, config.loss.to_dict(), build)


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
  """Step 0 from `init` = {'params', 'router'}, placed on the run's mesh."""
  prog = update_program(config, loop.model_config(config))
  state = prog.progs.init(jax.random.PRNGKey(config.train.seed), init)
  ema = teacher_weights.ema_init(state.params) if config.loss.teacher == "ema" else None
  return RLState(0, state.params, state.opt_state, ema,
                 np.random.default_rng([config.train.seed, 1]))


def sampler_devices(config, trainer_ids: list[int]) -> list[int]:
  """The sampler's device ids: the trainer's (colocated) or `rl.sampler_devices`
  (disaggregated, disjoint from the trainer's); one-line ValueErrors otherwise."""
  r = config.rl
  if r.mode not in MODES:
    raise ValueError(f"rl.mode={r.mode!r}; valid: {MODES}")
  if r.mode == "colocated":
    if r.sampler_devices:
      raise ValueError(f"rl.sampler_devices={tuple(r.sampler_devices)} needs "
                       "rl.mode='disaggregated' (colocated samples on the trainer's devices)")
    return trainer_ids
  ids, known = list(r.sampler_devices), [d.id for d in jax.devices()]
  count = len(known)
  if not ids or any(i not in known for i in ids) or len(set(ids)) != len(ids):
    # Ids are 0..n-1 in one process; a multi-process run numbers each process's devices apart.
    valid = f"in [0, {count})" if known == list(range(count)) else f"of this run {tuple(known)}"
    raise ValueError(f"rl.sampler_devices={tuple(ids)} must be distinct device ids {valid} "
                     "for rl.mode='disaggregated'")
  overlap = sorted(set(ids) & set(trainer_ids))
  if overlap:
    raise ValueError(
      f"rl.mode='disaggregated': sampler devices {tuple(ids)} overlap the trainer's devices "
      f"{tuple(trainer_ids)} (layout {config.layout!r}) on {overlap}; give the trainer a "
      f"mesh on other devices (e.g. --config.mesh.fsdp={count - len(ids)}) or other "
      "rl.sampler_devices")
  return ids


class RLSteps:
  """`steps(state) -> (state, row)`: one RL step on `env` (see the module docstring).

  `init` (e.g. the warmed-up variables) gives the router bias, fixed during RL, and the
  weights of the 'frozen' teacher. Call `close()` when done (stops a sampler thread).
  """

  def __init__(self, config, env: Env, init: dict, state: RLState):
    self._config, self._start = config, state.step
    model_cfg = loop.model_config(config)
    self._prog = update_program(config, model_cfg)
    dm = self._prog.progs.mesh
    trainer_ids = rl_mesh.trainer_mesh_devices(dm)
    ids = sampler_devices(config, trainer_ids)
    by_id = {d.id: d for d in jax.devices()}
    self._router = jax.device_put(init["router"], self._prog.replicated)
    target = self._prog.progs.target
    self._initial = jax.device_put(init["params"], jax.tree.map(lambda t: t.sharding,
                                                                target.params))
    sampler = rollout_lib.RolloutWorker(config, env, model_cfg,
                                  rl_mesh.SamplerMesh([by_id[i] for i in ids],
                                                      config.rules.sampler), init["router"])
    self._async = None
    if config.rl.mode == "disaggregated":
      self._async = rollout_lib.AsyncRolloutWorker(
        sampler, state.rng, start=state.step, steps=config.train.steps,
        max_staleness=config.rl.max_staleness)
      self._async.push(state.params, state.step)
    self._sampler = sampler
    self._epoch_key = jax.random.fold_in(jax.random.key(config.train.seed), 2)  # minibatch order
    self._probe = None
    r = config.rl
    if r.probe_count > 0:
      if not hasattr(env, "probe_set"):
        raise ValueError(f"rl.probe_count={r.probe_count} needs an environment with "
                         f"probe_set(...) (rl.env); {type(env).__name__} has none: set "
                         "rl.probe_count=0")
      held_out = env.probe_set(np.random.default_rng([config.train.seed, 2]), r.probe_count,
                               seq_len=r.seq_len, teacher_seq_len=r.teacher_seq_len,
                               turn_len=r.max_new_tokens)
      self._probe_set = dict(
        batch=rl_mesh.place_batch(held_out["batch"], self._prog.per_token),
        teacher_batch=rl_mesh.place_batch(held_out["teacher_batch"], self._prog.per_token,
                                          student_length=r.seq_len))
      self._probe = probe_program(config, model_cfg)

  def __call__(self, state: RLState) -> tuple[RLState, dict]:
    t0 = time.perf_counter()
    loss_cfg, r = self._config.loss, self._config.rl
    if self._async is None:
      push = self._sampler.push(state.params, state.step)
      roll = self._sampler.rollout(state.step, state.rng)
      roll.row.update(push)
    else:
      roll = self._async.next()
    rng = np.random.default_rng()
    rng.bit_generator.state = roll.rng_state
    batch = rl_mesh.place_batch(roll.batch, self._prog.per_token)
    teacher_batch = None
    if roll.teacher_batch is not None:
      teacher_batch = rl_mesh.place_batch(roll.teacher_batch, self._prog.per_token,
                                          student_length=r.seq_len)
    teachers = lambda params: teacher_weights.teacher_variables(
      loss_cfg, params, ema=state.ema, initial=self._initial)
    t1 = time.perf_counter()
    if r.epochs * r.minibatches == 1:  # one update on the batch: pi_old = pi_theta, ratio 1
      params, opt_state, metrics = self._prog.update(
        state.params, state.opt_state, self._router, batch,
        None if teacher_batch is None else teachers(state.params), teacher_batch)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    else:
      updates = r.epochs * r.minibatches
      params, opt_state, history = epoch_updates(
        self._prog, state.params, state.opt_state, self._router, batch, teachers,
        teacher_batch, epochs=r.epochs, minibatches=r.minibatches,
        key=jax.random.fold_in(self._epoch_key, state.step),
        staleness=(roll.step - roll.version) * updates)
      metrics = {k: float(v.max() if k.endswith("_max") else v.mean())
                 for k, v in history.items() if k not in ("epoch", "minibatch")}
      metrics.update(updates=float(updates), loss_last=float(history["loss"][-1]))
    ema = state.ema
    if ema is not None:
      ema = teacher_weights.ema_update(ema, params, loss_cfg.ema_rate)
    if self._async is not None:
      self._async.push(params, state.step + 1)
    row = dict(step=state.step, **roll.row, staleness=float(roll.step - roll.version))
    row.update(metrics)
    done = state.step + 1
    if self._probe is not None and (done % r.probe_every == 0 or done == self._config.train.steps):
      # The probe teacher is this arm's teacher kind (also for arms without the SD term).
      probe_teacher = teacher_weights.teacher_variables(loss_cfg, params, ema=ema,
                                                        initial=self._initial)
      row.update({k: float(v) for k, v in jax.device_get(self._probe(
        params, self._router, probe_teacher, self._probe_set)).items()})
    row.update({"train_seconds": time.perf_counter() - t1, "seconds": time.perf_counter() - t0})
    return RLState(state.step + 1, params, opt_state, ema, rng), row

  def close(self) -> None:
    if self._async is not None:
      self._async.close()


def rl_steps(config, env: Env, init: dict, state: RLState | None = None
             ) -> Iterator[tuple[dict, RLState]]:
  """RL steps on `env` from `state` (default `initial_state`) up to `config.train.steps`;
  yields each step's metrics row and the state after it."""
  state = state or initial_state(config, init)
  steps = RLSteps(config, env, init, state)
  try:
    while state.step < config.train.steps:
      state, row = steps(state)
      yield row, state
  finally:
    steps.close()


def train(config, env: Env, init: dict) -> list[dict]:
  """All RL steps on `env` from `init` = {'params', 'router'}, in memory (no checkpoints:
  `rl.run` is the resumable driver); returns one metrics dict per step."""
  rows = []
  for row, state in rl_steps(config, env, init):
    rows.append(row)
    if state.step % config.train.log_every == 0 or state.step == config.train.steps:
      logging.info("rl step %d reward %.3f loss %.4f", state.step, row["reward"], row["loss"])
  return rows
