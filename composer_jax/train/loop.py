"""The training driver: `drive(steps, ...)`, and the supervised run `train(config, workdir, data)`.

`drive` runs any `Steps` (supervised here, RL in `composer_jax.rl.run`) step by step with
the same guarantees: each step's metrics fetched only after the next step is dispatched;
metrics to the console, `metrics.jsonl` and TensorBoard (`metrics`);
checkpoints through one `checkpointing.Checkpointer` every `ckpt_every` steps, at the end and
on SIGTERM (or a multi-host preemption notice), after which it exits; a stop, without
checkpointing, when the loss or the update becomes NaN/inf; a one-screen summary at the end
(`summary`). Every run first logs one line saying what will run (`announce`). It first
makes the C heap keep freed memory (`host_memory`). Side effects live here and in the
run's own host code, nowhere else.

`train` resumes from the newest checkpoint in `workdir` when there is one (bit-for-bit: params,
optimizer state, router bias, step, PRNG key and data-iterator position are all restored),
else starts from `train.init_from` (an HF or imported checkpoint) or a random init. Its `Data`
is the text corpus of `config.data` by default, or any resumable batch iterator: an RL
experiment's warm-up trains on scripted episodes (`rl.scripted`) and takes its result from
`trained_variables`. The config schema is assembled in `experiments/configs/base.py` (the
`train` section: `train.config.default_config`).
"""

from __future__ import annotations

import itertools
import math
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np
from absl import logging

from composer_jax import data as data_lib
from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig, model_config
from composer_jax.optim import make_schedule
from composer_jax.optim.builder import OPTIMIZERS
from composer_jax.train import (
  checkpointing,
  compile_cache,
  host_memory,
  init_from,
  memory_plan,
  placement,
  summary,
)
from composer_jax.train import config as train_config
from composer_jax.train import programs as programs_lib
from composer_jax.train.metrics import MetricsWriter, quiet_library_logs


class NonFiniteLossError(FloatingPointError):
  """The loss or the update became NaN/inf; the bad state was not checkpointed."""


def validate(config) -> None:
  """One-line ValueErrors for `train`, `optim` and `data` numbers out of range
  (`train.config.RANGES`) and inconsistent settings."""
  train_config.check_ranges(config, train_config.RANGES)
  t = config.train
  if t.batch_size % (t.grad_accum * jax.process_count()):
    raise ValueError(
      f"train.batch_size={t.batch_size} must be divisible by train.grad_accum="
      f"{t.grad_accum} x process count {jax.process_count()}"
    )
  optim = train_config.optim_config(config)
  if optim.name not in OPTIMIZERS:
    raise ValueError(f"optim.name={optim.name!r}; valid: {OPTIMIZERS}")
  try:
    make_schedule(optim, optim.lr)
  except ValueError as e:
    raise ValueError(f"optim: {e} (optim.total_steps 0 = train.steps)") from None


class Preempted(RuntimeError):
  """A preemption signal stopped a run that others build on (`trained_variables`) after its
  checkpoint was saved: the run stops too, and a rerun resumes."""


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


class Data(NamedTuple):
  """What the supervised run trains on (default `corpus_data`: the text of `config.data`).

  Attributes:
    train: iterator of [B, L] numpy batches (tokens, targets, segment_ids, positions int32;
      loss_mask float32) with `get_state`/`set_state`, e.g. a grain `DatasetIterator`: its
      position is checkpointed with the state and restored on resume.
    whole: every process's `train` yields the whole global batch (the same in each, e.g.
      generated from one seed) instead of its own rows.
    validation: `() -> iterable` of this process's [B, L] batches, the same at every call,
      whose mean cross-entropy is `eval_loss`; None: none.
    evaluate: `state -> {name: float}`, more metrics of the state (e.g. a warm-up's greedy
      check of what the policy writes); None: none.
  Both run every `train.eval_every` steps and at the end.
  """

  train: Any
  whole: bool = False
  validation: Callable[[], Any] | None = None
  evaluate: Callable[[Any], dict] | None = None


def _make_iterator(config, split: str):
  t = config.train
  return data_lib.make_iterator(
    config.data,
    seq_len=t.seq_len,
    batch_size=t.batch_size // jax.process_count(),
    split=split,
    seed=t.seed,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )


def corpus_data(config) -> Data:
  """The packed text corpus of `config.data`: its train split, shuffled, and the first
  `train.eval_batches` batches of its validation split."""
  return Data(
    train=_make_iterator(config, "train"),
    validation=lambda: itertools.islice(
      _make_iterator(config, "validation"), config.train.eval_batches
    ),
  )


class _Evaluator:
  """Mean cross-entropy over `validation()`'s batches (read once, the same each time)."""

  def __init__(self, progs: programs_lib.Programs, validation: Callable[[], Any]):
    self._progs, self._validation = progs, validation
    self._batches = None

  def __call__(self, state) -> float:
    if self._batches is None:
      self._batches = list(self._validation())
    total, count = 0.0, 0.0
    for b in self._batches:
      batch = placement.to_global(b, self._progs.eval_batch_sharding)
      s, n = jax.device_get(self._progs.eval_step(state, batch))
      total, count = total + float(s), count + float(n)
    return total / max(count, 1.0)


def restore_newest(model_cfg, ckpt, restore, workdir):
  """`restore(step)` of the newest checkpoint that restores completely, or None when there
  is none. Newer ones that do not restore are reported in one line each and renamed aside
  (`Checkpointer.set_aside`); if none restores, all stay in place. Every run resumes
  through this (supervised: state and data-iterator position; RL: `rl.run`).

  Raises:
    CorruptCheckpointError: checkpoints exist but none restores.
    ValueError: the newest readable checkpoint is of a different model.
  """
  corrupt = []
  for step in sorted(ckpt.all_steps(), reverse=True):
    try:
      saved = ckpt.saved_model_config(step)
      checkpointing.check_same_model(saved, model_cfg, f"--workdir {workdir}")
      state = restore(step)
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
      f"{corrupt[0][1]}; move them aside to start afresh"
    )
  return None


def _fresh_state(config, model_cfg, progs):
  """`train.init_from`'s variables, else a random init, as a step-0 state."""
  variables = None
  if config.train.init_from:
    variables = init_from.load(
      config.train.init_from,
      model_cfg,
      {"params": progs.target.params, "router": progs.target.router},
    )
  return progs.init(jax.random.PRNGKey(config.train.seed), variables)


def announce(driver: str, config, model_cfg: ModelConfig, start_step: int, workdir: str) -> None:
  """Logs (process 0) the one line saying what will run (`summary.start_line`; `driver`
  'supervised' or 'rl'): called by both drivers once they know their start step, before
  their long work (init, compiling)."""
  if jax.process_index() == 0:
    n = placement.num_devices(config.mesh)
    counts = transformer.param_counts(model_cfg)
    line = summary.start_line(
      driver, config.to_dict(), counts, jax.devices()[:n], start_step, workdir
    )
    logging.info(line)


class Steps(Protocol):
  """One training run's steps, as `drive` runs them (supervised: `_SupervisedSteps`; RL:
  `rl.steps.RLSteps`)."""

  def step(self, state: Any, step: int) -> tuple[Any, dict]:
    """Dispatches optimizer step `step + 1` from `state` -> (new state, metrics: device
    scalars or Python floats; the driver fetches them only after the next step is dispatched,
    so the host never waits on the device before queueing it)."""

  def record(self, step: int, metrics: dict, state: Any) -> dict | None:
    """The metrics record after step `step` (with 'step'), or None to log nothing. Values may
    be device scalars (e.g. `metrics`' own): the driver fetches and writes the record after
    the next step is dispatched."""

  def checkpoint(self, state: Any) -> tuple[Any, Any]:
    """(arrays pytree, data: a grain iterator or a JSON-able dict) that a checkpoint holds."""


def _check_finite(metrics: dict[str, float], step: int, ckpt) -> None:
  """NonFiniteLossError unless the loss (and the gradient and update norms, when logged) is
  finite. A state that turns NaN/inf with none of these showing it is refused by the
  checkpoint save (`checkpointing.NonFiniteStateError`)."""
  if all(math.isfinite(metrics[k]) for k in ("loss", "grad_norm", "update_norm") if k in metrics):
    return
  ckpt.wait()
  last = (ckpt.committed_steps() or [None])[-1]
  values = ", ".join(
    f"{k}={metrics[k]}" for k in ("loss", "grad_norm", "update_norm") if k in metrics
  )
  raise NonFiniteLossError(
    f"Non-finite training loss/update at step {step} ({values}); stopped without "
    f"checkpointing it. Last good checkpoint: "
    f"{f'{ckpt.directory}/{last}' if last is not None else 'none'}"
  )


def _host(value):
  """A fetched record value: device and numpy scalars as Python floats."""
  return float(value) if isinstance(value, (jax.Array, np.ndarray, np.generic)) else value


class _Pending:
  """One dispatched step's metrics and record, fetched (metrics checked finite) once."""

  def __init__(self, step: int, metrics: dict, record: dict | None, ckpt):
    self.step, self._metrics, self._record, self._ckpt = step, metrics, record, ckpt

  def fetch(self) -> dict | None:
    """The record with host values (None if the step logs none)."""
    _check_finite(
      {k: _host(v) for k, v in jax.device_get(self._metrics).items()}, self.step, self._ckpt
    )
    if self._record is None:
      return None
    return {k: _host(v) for k, v in jax.device_get(self._record).items()}


def drive(
  steps: Steps,
  state: Any,
  step: int,
  ckpt: checkpointing.Checkpointer,
  *,
  workdir: str,
  total_steps: int,
  ckpt_every: int,
  console_every: int,
  model_cfg: ModelConfig,
  run_config: dict,
  started: float | None = None,
) -> list[dict]:
  """Runs `steps` from `state` after `step` steps up to `total_steps`; returns the records
  written (every record goes to the files, every `console_every`-th step's to the console).
  Logs a one-screen summary at the end (`train.summary`; wall time since `started`, the
  run's `time.perf_counter()` at its start, default this call's). Closes `ckpt`.

  Raises:
    NonFiniteLossError: NaN/inf loss, gradient or update; checkpoints before it are intact.
    NonFiniteStateError: the state to checkpoint holds NaN/inf; checkpoints before it are
      intact.
    CheckpointSaveError: a checkpoint could not be written (disk full, read-only).
  """
  host_memory.keep_freed_memory()  # else XLA:CPU faults its temporaries in every step
  # Metrics are global (every process computes the same values): process 0 writes them.
  writer = MetricsWriter(workdir, total_steps, step) if jax.process_index() == 0 else None
  start_step, saved = step, None
  started = time.perf_counter() if started is None else started
  stop = StopFlag()
  records, pending = [], None

  def write_pending():
    nonlocal pending
    record, done = pending.fetch(), pending.step
    pending = None
    if record is not None:
      if writer:
        writer.write(record, console=done % console_every == 0 or done == total_steps)
      records.append(record)

  try:
    while step < total_steps:
      state, metrics = steps.step(state, step)
      if pending is not None:  # The previous step's, with this one already dispatched.
        write_pending()
      step += 1
      pending = _Pending(step, metrics, steps.record(step, metrics, state), ckpt)
      preempted = stop.event.is_set() or ckpt.reached_preemption(step)
      if step % ckpt_every == 0 or step == total_steps or preempted:
        write_pending()  # Never checkpoint a non-finite state.
        ckpt.save(step, *steps.checkpoint(state), model_cfg, run_config)
        saved = step
      if preempted:
        ckpt.wait()
        logging.info("Preemption signal: saved checkpoint %s/%d; exiting", ckpt.directory, step)
        break
  finally:
    stop.restore()
    if writer:
      writer.close()
    ckpt.close()
  if writer:
    for line in summary.summary_lines(
      records,
      run_config,
      start_step=start_step,
      end_step=step,
      total_steps=total_steps,
      wall_s=time.perf_counter() - started,
      workdir=workdir,
      checkpoint=None if saved is None else f"{ckpt.directory}/{saved}",
    ):
      logging.info(line)
  return records


class _SupervisedSteps:
  """The supervised `Steps`: next-token loss on `data`, periodic evaluation."""

  def __init__(self, config, progs: programs_lib.Programs, data: Data, start: float):
    self._t, self._progs, self._data = config.train, progs, data
    self._eval_loss = data.validation and _Evaluator(progs, data.validation)
    self._window = (time.perf_counter(), 0)  # tokens/s since the last record
    # `train`'s start (perf_counter) until the run's first step has run: tracing and
    # compiling, or loading compiled programs from the cache, restoring, that step. Put in
    # the first train record as `startup_s`.
    self._start, self._startup = start, None

  def step(self, state, step):
    t = self._t
    batch = _split_micro(next(self._data.train), t.grad_accum)
    if step + 1 == t.nan_at_step:  # Testing aid: a corrupt batch, same compiled program.
      batch["loss_mask"] = batch["loss_mask"] * np.float32(np.nan)
    state, metrics = self._progs.train_step(
      state, placement.to_global(batch, self._progs.train_batch_sharding, self._data.whole)
    )
    if self._start is not None:  # the run's first step: waits for it once, to time it
      jax.block_until_ready(metrics)
      self._startup, self._start = time.perf_counter() - self._start, None
    self._window = (self._window[0], self._window[1] + 1)
    return state, metrics

  def record(self, step, metrics, state):
    t, record = self._t, {}
    tokens_per_step = t.batch_size * t.seq_len
    if step % t.log_every == 0 or step == t.steps:
      start, steps = self._window
      jax.block_until_ready(metrics)  # the window ends when this step has run
      record.update(metrics, tokens_per_s=steps * tokens_per_step / (time.perf_counter() - start))
      if self._startup is not None:
        record["startup_s"], self._startup = self._startup, None
    if (t.eval_every and step % t.eval_every == 0) or step == t.steps:
      if self._eval_loss:
        record["eval_loss"] = self._eval_loss(state)
      if self._data.evaluate:
        record.update(self._data.evaluate(state))
    if not record:
      return None
    # Eval and logging time stays out of the next tokens/s window.
    self._window = (time.perf_counter(), 0)
    return {"step": step, "tokens": step * tokens_per_step, **record}

  def checkpoint(self, state):
    return state, self._data.train


def train(config, workdir: str, data: Data | None = None) -> list[dict]:
  """Trains `config` in `workdir` on `data` (default `corpus_data(config)`); returns the
  metric records written (train and eval).

  With `train.dry_run`, prints the per-device memory plan for `train.dry_run_devices`
  devices instead (nothing is allocated) and returns [].

  Raises:
    ValueError: bad config, `workdir` holds a checkpoint of a different model, or none of
      its checkpoints restores (`CorruptCheckpointError`).
    CheckpointSaveError: a checkpoint could not be written (disk full, read-only).
    NonFiniteLossError: NaN/inf loss or update; checkpoints before it are intact.
  """
  start = time.perf_counter()
  validate(config)
  quiet_library_logs()
  t = config.train
  model_cfg = model_config(config.model)
  if t.dry_run:
    plan = memory_plan.memory_plan(config, model_cfg, t.dry_run_devices)
    print(memory_plan.format_plan(plan, t.dry_run_devices))
    return []
  compile_cache.enable(compile_cache.cache_dir(t.compile_cache_dir, workdir))
  data = data or corpus_data(config)
  progs = programs_lib.programs(config, model_cfg)
  ckpt = checkpointing.Checkpointer(workdir, keep=t.keep)
  state = restore_newest(
    model_cfg, ckpt, lambda step: ckpt.restore(step, progs.target, data.train), workdir
  )
  step = 0 if state is None else int(state.step)
  if step >= t.steps:
    logging.info("Checkpoint step %d >= train.steps=%d: nothing to do", step, t.steps)
    ckpt.close()
    return []
  announce("supervised", config, model_cfg, step, workdir)
  if state is None:
    state = _fresh_state(config, model_cfg, progs)

  return drive(
    _SupervisedSteps(config, progs, data, start),
    state,
    step,
    ckpt,
    workdir=workdir,
    total_steps=t.steps,
    ckpt_every=t.ckpt_every,
    console_every=1,
    model_cfg=model_cfg,
    run_config=config.to_dict(),
    started=start,
  )


def trained_variables(config, workdir: str, data: Data | None = None) -> dict:
  """{'params', 'router'} after `train.steps` supervised steps of `config` in `workdir`
  (e.g. an RL experiment's warm-up on scripted episodes): trained by `train` (resuming what is
  there), or read from the last checkpoint when that is at `train.steps` already (its data
  position is then not read: a run on another process count restores it too). Placed on the
  run's mesh.

  Raises:
    Preempted: a preemption signal stopped the training (its checkpoint is saved).
    (and what `train` raises)
  """
  ckpt = checkpointing.Checkpointer(workdir, keep=config.train.keep)
  try:
    done = (ckpt.latest_step() or 0) >= config.train.steps
  finally:
    ckpt.close()
  if not done:
    train(config, workdir, data)
  model_cfg = model_config(config.model)
  progs = programs_lib.programs(config, model_cfg)
  ckpt = checkpointing.Checkpointer(workdir, keep=config.train.keep)
  try:
    step = ckpt.latest_step()
    if step is None or step < config.train.steps:  # `train` stopped at a preemption signal
      raise Preempted(
        f"{workdir} stopped at step {step} of {config.train.steps} (preemption "
        "signal, checkpoint saved); run again to resume"
      )
    checkpointing.check_same_model(ckpt.saved_model_config(step), model_cfg, workdir)
    state = ckpt.restore(step, progs.target)
  finally:
    ckpt.close()
  logging.info("Trained variables of %s/%d", ckpt.directory, step)
  return {"params": state.params, "router": state.router}
