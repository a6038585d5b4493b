"""The training loop: `train(config, workdir)`.

Resumes from the newest checkpoint in `workdir` when there is one (bit-for-bit: params,
optimizer state, router bias, step, PRNG key and data-iterator position are all restored),
else starts from `train.init_from` (an HF or imported checkpoint) or a random init.
Side effects live here, nowhere else: checkpoints (`checkpointing`), metrics (`metrics`),
SIGTERM handling. The config schema is documented in `experiments/configs/base.py`.
"""

from __future__ import annotations

import itertools
import math
import signal
import threading
import time

import jax
import numpy as np
from absl import logging

from composer_jax import data as data_lib
from composer_jax.model.config import ModelConfig, get_preset
from composer_jax.train import checkpointing, compile_cache, init_from, memory_plan, placement
from composer_jax.train import programs as programs_lib
from composer_jax.train.metrics import MetricsWriter, quiet_library_logs


class NonFiniteLossError(FloatingPointError):
  """The loss or the update became NaN/inf; the bad state was not checkpointed."""


def model_config(config) -> ModelConfig:
  """`config.model.preset` with `config.model.overrides` applied."""
  base = get_preset(config.model.preset)
  overrides = config.model.overrides.to_dict()
  return ModelConfig.from_dict({**base.to_dict(), **overrides}) if overrides else base


def validate(config) -> None:
  """One-line ValueErrors for inconsistent `train` settings."""
  t = config.train
  for name in ("steps", "batch_size", "seq_len", "grad_accum", "log_every", "ckpt_every",
               "keep", "eval_batches", "loss_chunk"):
    if t[name] < 1:
      raise ValueError(f"train.{name}={t[name]} must be >= 1")
  if t.batch_size % (t.grad_accum * jax.process_count()):
    raise ValueError(f"train.batch_size={t.batch_size} must be divisible by train.grad_accum="
                     f"{t.grad_accum} x process count {jax.process_count()}")
  if t.eval_every < 0:
    raise ValueError(f"train.eval_every={t.eval_every} must be >= 0 (0 = only at the end)")


class StopFlag:
  """Set by SIGTERM (preemption); checked once per step. Installs only in the main thread of
  a single-process run: with several processes, JAX's preemption service takes SIGTERM and
  `Checkpointer.reached_preemption` stops every process at the same step."""

  def __init__(self):
    self.event = threading.Event()
    self._previous = None
    if threading.current_thread() is threading.main_thread() and jax.process_count() == 1:
      self._previous = signal.signal(signal.SIGTERM, lambda *_: self.event.set())

  def restore(self):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _split_micro(batch: dict, grad_accum: int) -> dict:
  """[B, L] -> [G, B/G, L] host-side, so the G axis is never sharded."""
  return {k: np.asarray(v).reshape(grad_accum, -1, *np.shape(v)[1:]) for k, v in batch.items()}


def _make_iterator(config, split: str):
  t = config.train
  return data_lib.make_iterator(
      config.data, seq_len=t.seq_len, batch_size=t.batch_size // jax.process_count(),
      split=split, seed=t.seed, process_index=jax.process_index(),
      process_count=jax.process_count())


class _Evaluator:
  """Mean cross-entropy over the first `eval_batches` validation batches (the same each time)."""

  def __init__(self, config, progs: programs_lib.Programs):
    self._config, self._progs = config, progs
    self._batches = None

  def __call__(self, state) -> float:
    if self._batches is None:
      it = _make_iterator(self._config, "validation")
      self._batches = list(itertools.islice(it, self._config.train.eval_batches))
    total, count = 0.0, 0.0
    for b in self._batches:
      batch = placement.to_global(b, self._progs.eval_batch_sharding)
      s, n = jax.device_get(self._progs.eval_step(state, batch))
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)


def _restore_newest(model_cfg, ckpt, progs, train_iter, workdir):
  """The newest checkpoint that restores completely (moving `train_iter` to its position),
  or None when there is none. Newer ones that do not restore are reported in one line each
  and renamed aside (`Checkpointer.set_aside`); if none restores, all stay in place.

  Raises:
    CorruptCheckpointError: checkpoints exist but none restores.
    ValueError: the newest readable checkpoint is of a different model.
  """
  corrupt = []
  for step in sorted(ckpt.all_steps(), reverse=True):
    try:
      saved = ckpt.saved_model_config(step)
      checkpointing.check_same_model(saved, model_cfg, f"--workdir {workdir}")
      state = ckpt.restore(step, progs.target, train_iter)
    except checkpointing.CorruptCheckpointError as e:
      corrupt.append((step, e))
      continue
    for bad, e in corrupt:
      aside = ckpt.set_aside(bad) if jax.process_index() == 0 else "(process 0 renames it)"
      logging.warning("%s; renamed it to %s and resuming from step %d", e, aside, step)
    logging.info("Resuming from %s/%d", ckpt.directory, step)
    return state
  if corrupt:
    raise checkpointing.CorruptCheckpointError(
        f"no checkpoint in {ckpt.directory} restores (steps {[s for s, _ in corrupt]}); newest: "
        f"{corrupt[0][1]}; move them aside to start afresh")
  return None


def _initial_state(config, model_cfg, ckpt, progs, train_iter, workdir):
  """The newest checkpoint that restores, else `train.init_from`, else a random init."""
  state = _restore_newest(model_cfg, ckpt, progs, train_iter, workdir)
  if state is not None:
    return state
  variables = None
  if config.train.init_from:
    variables = init_from.load(config.train.init_from, model_cfg,
                               {"params": progs.target.params, "router": progs.target.router})
  return progs.init(jax.random.PRNGKey(config.train.seed), variables)


def train(config, workdir: str) -> list[dict]:
  """Trains `config` in `workdir`; returns the metric records written (train and eval).

  With `train.dry_run`, prints the per-device memory plan for `train.dry_run_devices`
  devices instead (nothing is allocated) and returns [].

  Raises:
    ValueError: bad config, `workdir` holds a checkpoint of a different model, or none of
      its checkpoints restores (`CorruptCheckpointError`).
    CheckpointSaveError: a checkpoint could not be written (disk full, read-only).
    NonFiniteLossError: NaN/inf loss or update; checkpoints before it are intact.
  """
  validate(config)
  quiet_library_logs()
  t = config.train
  model_cfg = model_config(config)
  if t.dry_run:
    plan = memory_plan.memory_plan(config, model_cfg, t.dry_run_devices)
    print(memory_plan.format_plan(plan, t.dry_run_devices))
    return []
  compile_cache.enable(compile_cache.cache_dir(t.compile_cache_dir, workdir))
  train_iter = _make_iterator(config, "train")
  progs = programs_lib.programs(config, model_cfg)
  ckpt = checkpointing.Checkpointer(workdir, keep=t.keep)
  state = _initial_state(config, model_cfg, ckpt, progs, train_iter, workdir)
  step = int(state.step)
  if step >= t.steps:
    logging.info("Checkpoint step %d >= train.steps=%d: nothing to do", step, t.steps)
    ckpt.close()
    return []

  evaluate = _Evaluator(config, progs)
  # Metrics are global (every process computes the same values): process 0 writes them.
  writer = MetricsWriter(workdir, t.steps, step) if jax.process_index() == 0 else None
  stop = StopFlag()
  tokens_per_step = t.batch_size * t.seq_len
  run_config = config.to_dict()
  records, window_start, window_steps = [], time.perf_counter(), 0
  pending = None  # (step, device metrics) of the newest step, fetched after the next dispatch

  def check(done_step, device_metrics):
    """Fetches a step's metrics (blocks until it ran); raises on a non-finite loss/update."""
    metrics = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    if not (math.isfinite(metrics["loss"]) and math.isfinite(metrics["update_norm"])):
      last = ckpt.latest_step()
      raise NonFiniteLossError(
          f"Non-finite training loss/update at step {done_step} (loss={metrics['loss']}, "
          f"grad_norm={metrics['grad_norm']}, update_norm={metrics['update_norm']}); stopped "
          f"without checkpointing it. Last good checkpoint: "
          f"{f'{ckpt.directory}/{last}' if last is not None else 'none'}")
    return metrics

  try:
    while step < t.steps:
      batch = _split_micro(next(train_iter), t.grad_accum)
      if step + 1 == t.nan_at_step:  # Testing aid: a corrupt batch, same compiled program.
        batch["loss_mask"] = batch["loss_mask"] * np.float32(np.nan)
      state, device_metrics = progs.train_step(
          state, placement.to_global(batch, progs.train_batch_sharding))
      # The previous step's metrics are fetched only now, with this step already dispatched,
      # so the host never waits on the device before queueing the next step.
      if pending is not None:
        check(*pending)
      step += 1
      window_steps += 1
      pending = (step, device_metrics)
      record = {}
      if step % t.log_every == 0 or step == t.steps:
        elapsed = time.perf_counter() - window_start
        record.update(check(*pending), tokens_per_s=window_steps * tokens_per_step / elapsed)
      if (t.eval_every and step % t.eval_every == 0) or step == t.steps:
        record["eval_loss"] = evaluate(state)
      if record:
        record = {"step": step, "tokens": step * tokens_per_step, **record}
        if writer:
          writer.write(record)
        records.append(record)
        # Eval and logging time stays out of the next tokens/s window.
        window_start, window_steps = time.perf_counter(), 0
      preempted = stop.event.is_set() or ckpt.reached_preemption(step)
      if step % t.ckpt_every == 0 or step == t.steps or preempted:
        check(*pending)  # Never checkpoint a non-finite state.
        ckpt.save(step, state, train_iter, model_cfg, run_config)
      if preempted:
        ckpt.wait()
        logging.info("Preemption signal: saved checkpoint %s/%d; exiting", ckpt.directory, step)
        break
  finally:
    stop.restore()
    if writer:
      writer.close()
    ckpt.close()
  return records

