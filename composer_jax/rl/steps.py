"""The RL steps that the training driver runs (`train.loop.drive`, through `rl.run`).

    RLSteps(config, model_cfg, env, init, state)
        one RL step per `step` call: a batch from the sampler (`rl.rollout`: colocated, or a
        disaggregated sampler thread on its own devices), placed on the trainer's mesh
        (`rl.mesh.place_batch`), one update (or K epochs of M minibatch updates,
        `epoch_updates`); the EMA teacher then moves towards the new params; every
        `rl.probe_every` steps the probes (`rl.sd_probes`, with `rl.probe_count` > 0) on the
        environment's held-out `probe_set`, against this arm's teacher kind. The step's
        metrics stay on the device: the driver fetches them after the next step is dispatched.

Both arms of an experiment see the same tasks and sampling keys for the same seed and the same
number of episodes per step: only the update differs.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from composer_jax.model.config import ModelConfig
from composer_jax.rl import epochs as epochs_lib
from composer_jax.rl import mesh as rl_mesh
from composer_jax.rl import rollout as rollout_lib
from composer_jax.rl import teacher_weights
from composer_jax.rl.env import Env
from composer_jax.rl.programs import UpdateProgram, probe_program, update_program
from composer_jax.rl.state import RLState

MODES = ("colocated", "disaggregated")


def sampler_devices(config, trainer_ids: list[int]) -> list[int]:
  """The sampler's device ids: the trainer's (colocated) or `rl.sampler_devices`
  (disaggregated, disjoint from the trainer's); one-line ValueErrors otherwise."""
  r = config.rl
  if r.mode not in MODES:
    raise ValueError(f"rl.mode={r.mode!r}; valid: {MODES}")
  if r.mode == "colocated":
    if r.sampler_devices:
      raise ValueError(
        f"rl.sampler_devices={tuple(r.sampler_devices)} needs "
        "rl.mode='disaggregated' (colocated samples on the trainer's devices)"
      )
    return trainer_ids
  ids, known = list(r.sampler_devices), [d.id for d in jax.devices()]
  count = len(known)
  if not ids or any(i not in known for i in ids) or len(set(ids)) != len(ids):
    # Ids are 0..n-1 in one process; a multi-process run numbers each process's devices apart.
    valid = f"in [0, {count})" if known == list(range(count)) else f"of this run {tuple(known)}"
    raise ValueError(
      f"rl.sampler_devices={tuple(ids)} must be distinct device ids {valid} "
      "for rl.mode='disaggregated'"
    )
  overlap = sorted(set(ids) & set(trainer_ids))
  if overlap:
    raise ValueError(
      f"rl.mode='disaggregated': sampler devices {tuple(ids)} overlap the trainer's devices "
      f"{tuple(trainer_ids)} (layout {config.layout!r}) on {overlap}; give the trainer a "
      f"mesh on other devices (e.g. --config.mesh.fsdp={count - len(ids)}) or other "
      "rl.sampler_devices"
    )
  return ids


def epoch_updates(
  prog: UpdateProgram,
  params,
  opt_state,
  router,
  batch: dict,
  teacher_params_fn,
  teacher_batch: dict | None,
  *,
  epochs: int,
  minibatches: int,
  key: jax.Array,
  staleness: int,
):
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
  index = {
    "rows": np.arange(rows, dtype=np.int32),
    "staleness": np.full((rows,), staleness, np.int32),
  }

  def update_fn(carry, mini):
    p, o = carry
    teacher_params = None if teacher_batch is None else teacher_params_fn(p)
    p, o, metrics = prog.minibatch_update(
      p,
      o,
      router,
      batch,
      np.asarray(mini["rows"]),
      np.asarray(mini["staleness"]),
      teacher_params,
      teacher_batch,
    )
    return (p, o), metrics

  (params, opt_state), history = epochs_lib.run_epochs(
    update_fn, (params, opt_state), index, epochs=epochs, minibatches=minibatches, key=key
  )
  return params, opt_state, history


class RLSteps:
  """The RL `train.loop.Steps` on `env` (see the module docstring).

  `init` (e.g. the warmed-up variables) gives the router bias, fixed during RL, and the
  weights of the 'frozen' teacher. Call `close()` when done (stops a sampler thread).
  """

  def __init__(self, config, model_cfg: ModelConfig, env: Env, init: dict, state: RLState):
    self._config, self._env = config, env
    self._prog = update_program(config, model_cfg)
    trainer_ids = rl_mesh.trainer_mesh_devices(self._prog.progs.mesh)
    ids = sampler_devices(config, trainer_ids)
    by_id = {d.id: d for d in jax.devices()}
    self._router = jax.device_put(init["router"], self._prog.replicated)
    target = self._prog.progs.target
    self._initial = jax.device_put(
      init["params"], jax.tree.map(lambda t: t.sharding, target.params)
    )
    sampler = rollout_lib.RolloutWorker(
      config,
      env,
      model_cfg,
      rl_mesh.SamplerMesh([by_id[i] for i in ids], config.rules.sampler),
      init["router"],
    )
    self._async = None
    if config.rl.mode == "disaggregated":
      self._async = rollout_lib.AsyncRolloutWorker(
        sampler,
        state.rng,
        start=state.step,
        steps=config.train.steps,
        max_staleness=config.rl.max_staleness,
      )
      self._async.push(state.params, state.step)
    self._sampler = sampler
    self._epoch_key = jax.random.fold_in(jax.random.key(config.train.seed), 2)  # minibatch order
    self._probe = None
    r = config.rl
    if r.probe_count > 0:
      if not hasattr(env, "probe_set"):
        raise ValueError(
          f"rl.probe_count={r.probe_count} needs an environment with "
          f"probe_set(...) (rl.env); {type(env).__name__} has none: set "
          "rl.probe_count=0"
        )
      held_out = env.probe_set(
        np.random.default_rng([config.train.seed, 2]),
        r.probe_count,
        seq_len=r.seq_len,
        teacher_seq_len=r.teacher_seq_len,
        turn_len=r.max_new_tokens,
      )
      self._probe_set = dict(
        batch=rl_mesh.place_batch(held_out["batch"], self._prog.per_token),
        teacher_batch=rl_mesh.place_batch(
          held_out["teacher_batch"], self._prog.per_token, student_length=r.seq_len
        ),
      )
      self._probe = probe_program(config, model_cfg)

  def step(self, state: RLState, step: int) -> tuple[RLState, dict]:
    """RL step `step + 1` from `state` (`state.step` == `step`) -> (state, metrics: the
    episodes' and the sampler's as floats, the update's and the probes' on the device)."""
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
      teacher_batch = rl_mesh.place_batch(
        roll.teacher_batch, self._prog.per_token, student_length=r.seq_len
      )
    teachers = lambda params: teacher_weights.teacher_variables(
      loss_cfg, params, ema=state.ema, initial=self._initial
    )
    if r.epochs * r.minibatches == 1:  # one update on the batch: pi_old = pi_theta, ratio 1
      params, opt_state, metrics = self._prog.update(
        state.params,
        state.opt_state,
        self._router,
        batch,
        None if teacher_batch is None else teachers(state.params),
        teacher_batch,
      )
    else:
      updates = r.epochs * r.minibatches
      params, opt_state, history = epoch_updates(
        self._prog,
        state.params,
        state.opt_state,
        self._router,
        batch,
        teachers,
        teacher_batch,
        epochs=r.epochs,
        minibatches=r.minibatches,
        key=jax.random.fold_in(self._epoch_key, state.step),
        staleness=(roll.step - roll.version) * updates,
      )
      metrics = {
        k: v.max() if k.endswith("_max") else v.mean()
        for k, v in history.items()
        if k not in ("epoch", "minibatch")
      }
      metrics.update(updates=float(updates), loss_last=history["loss"][-1])
    ema = state.ema
    if ema is not None:
      ema = teacher_weights.ema_update(ema, params, loss_cfg.ema_rate)
    if self._async is not None:
      self._async.push(params, state.step + 1)
    out = dict(**roll.row, staleness=float(roll.step - roll.version))
    out.update(metrics)
    done = state.step + 1
    if self._probe is not None and (done % r.probe_every == 0 or done == self._config.train.steps):
      # The probe teacher is this arm's teacher kind (also for arms without the SD term).
      probe_teacher = teacher_weights.teacher_variables(
        loss_cfg, params, ema=ema, initial=self._initial
      )
      out.update(self._probe(params, self._router, probe_teacher, self._probe_set))
    # Host time of the step: sampling (colocated: after waiting for the previous update,
    # `sampler/reshard_seconds`) and dispatching this update.
    out["seconds"] = time.perf_counter() - t0
    return RLState(done, params, opt_state, ema, rng), out

  def record(self, step: int, metrics: dict, state: RLState) -> dict:
    del state
    return {**metrics, "step": step}

  def checkpoint(self, state: RLState) -> tuple[dict, dict]:
    # Both are read now: the next step advances the same generator and environment.
    arrays = {"params": state.params, "opt_state": state.opt_state}
    if state.ema is not None:
      arrays["ema"] = state.ema
    env = self._env.state_dict() if hasattr(self._env, "state_dict") else {}
    return arrays, {"rng": state.rng.bit_generator.state, "env": env}

  def close(self) -> None:
    if self._async is not None:
      self._async.close()
