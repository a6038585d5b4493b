"""Orbax checkpoints of a training run: state, data-iterator position and config.

Layout: `<workdir>/checkpoints/<step>/{state,data,config}`. `state` is the program's array
pytree (supervised: the `TrainState` — params, optimizer state, router bias, step, PRNG key;
RL: params, optimizer state, EMA teacher) written by orbax's `StandardSave` (tensorstore,
exact bytes); `data` is where the program's data stands: a grain iterator position, one JSON
file per process (grain's orbax handler; its state is taken when `save` is called), or a
JSON-able dict (RL: the task generator's state); `config` is the resolved `ModelConfig` plus the
run config, JSON. Saves are
asynchronous (training continues while files are written), keep the newest `keep`
checkpoints, and are atomic (orbax writes a temporary directory and renames it on commit),
so an interrupted save never leaves a half-written step behind.

Faults end in one line: a checkpoint whose files do not read back, or whose arrays hold
NaN/inf, raises `CorruptCheckpointError` naming the step and the file or array (the loop then
falls back to the previous one and `set_aside` renames the bad one to `<step>.corrupt`); a
state holding NaN/inf is never saved (`NonFiniteStateError` names the first such array, and
the checkpoints before it stay); a save that cannot be written (disk full, read-only) raises
`CheckpointSaveError`, checked for free space before the write starts and re-raised from the
async writer's thread without its traceback. Its message lists the checkpoints committed on
disk (a step still being written, or left half-written as an `.orbax-checkpoint-tmp` directory,
is not one; such leftovers are removed by the next run in the workdir, before its first save).

Checkpoints from elsewhere: a step whose orbax step metadata (`<step>/_CHECKPOINT_METADATA`)
does not read with this orbax (e.g. written by a newer one, with fields this one does not
know) is found when the `Checkpointer` opens: with an older step that reads, it is renamed
aside like a corrupt one, in one line naming the step and file, and the run falls back to the
older step; without one, `CorruptCheckpointError` names them and says what to do. A
`checkpoints` path that is not a directory is refused when the `Checkpointer` opens (and by
`experiments.run` at start, `check_directory`), before any step's work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging as py_logging
import os
import shutil
import sys
from collections.abc import Sequence
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from composer_jax.host import files
from composer_jax.model.config import ModelConfig

# Fields that change numerics or memory but not the parameter tree: a checkpoint written
# under one value restores under another.
_RUNTIME_FIELDS = (
  "dtype",
  "remat_policy",
  "moe_dispatch",
  "capacity_factor",
  "ep_capacity_factor",
  "moe_grouped_matmul",
  "moe_tile_rows",
  "scan_layers",
  "attention_impl",
  "attention_block",
)


def model_config_diff(
  saved: ModelConfig, current: ModelConfig, ignore: Sequence[str] = ()
) -> list[str]:
  """`['hidden_size (checkpoint 64, config 128)', ...]` over the architecture fields."""
  diffs = []
  for f in dataclasses.fields(ModelConfig):
    a, b = getattr(saved, f.name), getattr(current, f.name)
    if f.name not in _RUNTIME_FIELDS + tuple(ignore) and a != b:
      diffs.append(f"{f.name} (checkpoint {a}, config {b})")
  return diffs


def check_same_model(
  saved: ModelConfig, current: ModelConfig, where: str, ignore: Sequence[str] = ()
) -> None:
  """Raises a one-line ValueError naming the differing fields, if any."""
  diffs = model_config_diff(saved, current, ignore)
  if diffs:
    raise ValueError(
      f"{where} holds a checkpoint of a different model config: "
      f"{', '.join(diffs)}; use a fresh --workdir or the matching model config"
    )


def _at(tree, path: tuple[str, ...]):
  return functools.reduce(lambda t, k: t.get(k, {}) if isinstance(t, dict) else {}, path, tree)


def _leaves(tree, path: str) -> dict:
  if isinstance(tree, dict):
    return {k: v for name, sub in tree.items() for k, v in _leaves(sub, f"{path}.{name}").items()}
  return {path: tree}


def check_same_settings(
  saved_run: dict, config, paths: Sequence[tuple[str, ...]], where: str
) -> None:
  """Raises a one-line ValueError naming every setting under `paths` (paths into the run
  config, e.g. ('loss', 'teacher') or a whole section ('env',)) whose value in `saved_run` (a
  checkpoint's saved run config) differs from `config`'s."""
  current = json.loads(json.dumps(config.to_dict()))  # tuples -> lists, as saved
  diffs = []
  for path in paths:
    name = ".".join(path)
    was, now = _leaves(_at(saved_run, path), name), _leaves(_at(current, path), name)
    diffs += [
      f"{k}={was.get(k)!r} (this config: {now.get(k)!r})"
      for k in sorted(set(was) | set(now))
      if was.get(k) != now.get(k)
    ]
  if diffs:
    raise ValueError(
      f"{where} made with {', '.join(diffs)}; use a fresh --workdir or the saved values"
    )


class CorruptCheckpointError(ValueError):
  """A checkpoint whose files do not read back completely."""


class CheckpointSaveError(OSError):
  """A checkpoint that could not be written (disk full, read-only, ...)."""


class NonFiniteStateError(FloatingPointError):
  """A state holding NaN/inf, refused as a checkpoint."""


@jax.jit
def _count_and_first_nonfinite(arrays: list) -> tuple[jax.Array, jax.Array]:
  finite = jnp.stack([jnp.all(jnp.isfinite(x)) for x in arrays])
  return jnp.sum(~finite), jnp.argmin(finite)  # argmin: the first False


def nonfinite_arrays(state: Any) -> tuple[int, int, str | None]:
  """(arrays holding NaN/inf, float arrays, the first bad one's path, e.g. 'params/embed').

  One jitted reduction over every floating-point array of `state`; only two scalars come
  back to the host."""
  named = [
    (jax.tree_util.keystr(path, simple=True, separator="/"), x)
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
    if isinstance(x, (jax.Array, np.ndarray, np.generic)) and jnp.issubdtype(x.dtype, jnp.inexact)
  ]
  if not named:
    return 0, 0, None
  bad, first = jax.device_get(_count_and_first_nonfinite([x for _, x in named]))
  return int(bad), len(named), named[int(first)][0] if bad else None


def _root_cause(e: BaseException) -> BaseException:
  seen = {id(e)}
  while (nxt := e.__cause__ or e.__context__) is not None and id(nxt) not in seen:
    seen.add(id(nxt))
    e = nxt
  return e


def _first_line(e: BaseException, limit: int = 300) -> str:
  text = str(e).strip().splitlines()
  line = text[0].strip() if text else type(e).__name__
  return line if len(line) <= limit else line[:limit] + "..."


def _unreadable_metadata(step_dir: str) -> str | None:
  """The first JSON metadata file under `step_dir` that does not parse (array data, in
  `ocdbt.*/d/` and `d/`, is binary and read by tensorstore instead)."""
  for root, dirs, names in os.walk(step_dir):
    dirs[:] = sorted(d for d in dirs if d != "d" and not d.startswith("ocdbt."))
    for name in sorted(names):
      if name == "commit_success.txt" or name.endswith(".ocdbt"):
        continue
      path = os.path.join(root, name)
      try:
        with open(path) as f:
          json.load(f)
      except (OSError, ValueError):
        return path
  return None


class _DropReraisedThreadErrors(py_logging.Filter):
  """Orbax logs an async writer thread's failure with its traceback, then re-raises it to
  the caller of save/wait, which reports it in one line: drop the logged copy."""

  _SAVE_THREAD_FAILURES = (
    "raised an exception",
    "in background save thread",
    "Save Finalize thread",
  )

  def filter(self, record):
    return not (
      "orbax" in record.pathname
      and record.exc_info is not None
      and any(m in record.getMessage() for m in self._SAVE_THREAD_FAILURES)
    )


def _ignore_closed_loop_callbacks(unraisable) -> None:
  """After one tensorstore write of a save fails, orbax closes the writer's event loop while
  the other writes are still in flight; their completion callbacks then fail with
  'Event loop is closed', reported as unraisable exceptions (a traceback each). The save's
  own error is reported once; these are dropped, everything else goes to the default hook."""
  e = unraisable.exc_value
  if not (isinstance(e, RuntimeError) and str(e) == "Event loop is closed"):
    sys.__unraisablehook__(unraisable)


def _quiet_failed_saves() -> None:
  absl_logger = py_logging.getLogger("absl")  # Orbax logs through absl.
  if not any(isinstance(f, _DropReraisedThreadErrors) for f in absl_logger.filters):
    absl_logger.addFilter(_DropReraisedThreadErrors())
  sys.unraisablehook = _ignore_closed_loop_callbacks


def check_directory(workdir: str) -> str:
  """`<workdir>/checkpoints`; CheckpointSaveError (one line) when it is not, and cannot be
  made, a directory (a file there, or above it)."""
  directory = os.path.join(os.path.abspath(workdir), "checkpoints")
  if why := files.not_a_directory(directory):
    raise CheckpointSaveError(
      errno.ENOTDIR,
      f"cannot keep checkpoints in {directory}: {why}; move it away or pass another --workdir",
    )
  return directory


def _unreadable_steps(directory: str) -> dict[int, str]:
  """Committed step -> why its orbax step metadata does not read with this orbax."""
  bad = {}
  for m in ocp.step.standard_name_format().find_all(directory):
    try:
      ocp.metadata.get_step_metadata(m.path)
    except Exception as e:
      bad[m.step] = (
        f"{os.path.join(str(m.path), '_CHECKPOINT_METADATA')} does not read with orbax "
        f"{ocp.__version__} ({_first_line(e).rstrip('.')}; written by a newer orbax?)"
      )
  return bad


class _WithoutSteps(ocp.step.NameFormat):
  """orbax's standard step names, less `hidden` steps (unreadable ones, until renamed)."""

  def __init__(self, hidden):
    self._base, self._hidden = ocp.step.standard_name_format(), frozenset(hidden)

  def build_name(self, step):
    return self._base.build_name(step)

  def find_step(self, base_path, step):
    if step in self._hidden:
      raise ValueError(f"checkpoint step {step} is set aside (unreadable)")
    return self._base.find_step(base_path, step)

  def find_all(self, base_path):
    return (m for m in self._base.find_all(base_path) if m.step not in self._hidden)


def _free_name(path: str) -> str:
  """`path`, else `path.1`, `path.2`, ...: the first name not taken."""
  dst, n = path, 1
  while os.path.lexists(dst):
    dst, n = f"{path}.{n}", n + 1
  return dst


class Checkpointer:
  """Saves and restores `(state arrays, data state, config)` under a workdir."""

  def __init__(self, workdir: str, *, keep: int):
    self.directory = check_directory(workdir)
    bad = _unreadable_steps(self.directory) if os.path.isdir(self.directory) else {}
    self._set_aside_unreadable(bad)
    # cleanup_tmp_directories: a save cut short (kill, full disk) leaves a temporary
    # directory, not a step; the next run removes it (in the background, done before its
    # first save).
    options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      create=True,
      enable_async_checkpointing=True,
      cleanup_tmp_directories=True,
      step_name_format=_WithoutSteps(bad),
    )
    self._mngr = ocp.CheckpointManager(
      self.directory, options=options, item_names=("state", "data", "config")
    )
    self._save_error: CheckpointSaveError | None = None
    _quiet_failed_saves()

  def _set_aside_unreadable(self, bad: dict[int, str]) -> None:
    """Falls back from unreadable steps to the newest older one that reads (renaming them
    aside on process 0), or raises CorruptCheckpointError when none does."""
    if not bad:
      return
    steps = sorted(m.step for m in ocp.step.standard_name_format().find_all(self.directory))
    good = [s for s in steps if s not in bad]
    if not good:
      raise CorruptCheckpointError(
        f"no checkpoint in {self.directory} reads (steps {sorted(bad)}); newest: checkpoint "
        f"step {max(bad)}: {bad[max(bad)]}; upgrade orbax-checkpoint to read them, or move "
        "them aside to start afresh"
      )
    for step in sorted(bad, reverse=True):
      if jax.process_index() == 0:
        src = os.path.join(self.directory, str(step))
        aside = _free_name(f"{src}.corrupt")
        os.rename(src, aside)
      else:
        aside = "(process 0 renames it)"
      logging.warning(
        "checkpoint step %d: %s; renamed it to %s and falling back to step %d",
        step,
        bad[step],
        aside,
        max(good),
      )

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """True when the JAX distributed runtime has a preemption notice (multi-host jobs)."""
    return self._mngr.reached_preemption(step)

  def save(
    self,
    step: int,
    state: Any,
    data: grain.DatasetIterator | dict,
    model_cfg: ModelConfig,
    run_config: dict,
  ) -> None:
    """Starts an asynchronous save; `state` and the data position (a grain iterator, or a
    JSON-able dict) are captured before it returns, so training may go on (and donate
    `state`'s buffers) right away.

    Raises:
      NonFiniteStateError: `state` holds NaN/inf (nothing is written; earlier checkpoints
        stay).
      CheckpointSaveError: too little free space for this checkpoint, or an earlier
        asynchronous save failed.
    """
    bad, total, first = nonfinite_arrays(state)
    if bad:
      self.wait()  # An earlier save still in flight commits (or fails: that error) first.
      raise NonFiniteStateError(
        f"checkpoint step {step} not written: the state is not finite ({bad} of {total} "
        f"arrays hold NaN/inf, the first is {first}); {self._kept()}"
      )
    self._check_free_space(step, state)
    config = {"model": model_cfg.to_dict(), "run": run_config}
    data_args = (
      ocp.args.JsonSave(data) if isinstance(data, dict) else grain.checkpoint.CheckpointSave(data)
    )
    with self._save_errors(step):
      self._mngr.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), data=data_args, config=ocp.args.JsonSave(config)
        ),
        force=True,
      )

  def _check_free_space(self, step: int, state: Any) -> None:
    # Each process writes its own shards: its addressable bytes (+ metadata headroom).
    need = sum(
      sh.data.nbytes
      for x in jax.tree.leaves(state)
      if isinstance(x, jax.Array)
      for sh in x.addressable_shards
    )
    need = int(need * 1.1) + (1 << 20)
    free = shutil.disk_usage(self.directory).free
    if free < need:
      self.wait()  # An earlier save still in flight commits (or fails: that error) first.
      self._save_error = CheckpointSaveError(
        errno.ENOSPC,
        f"cannot write checkpoint step {step}: it needs ~{need / 2**20:.1f} "
        f"MiB, {free / 2**20:.1f} MiB free in {self.directory}; free space or use "
        f"another --workdir ({self._intact()})",
      )
      raise self._save_error

  def committed_steps(self) -> list[int]:
    """The steps whose checkpoint is committed on disk (`all_steps` also lists a save in
    flight; a failed or interrupted one is only a temporary directory, not a step)."""
    return sorted(m.step for m in ocp.step.standard_name_format().find_all(self.directory))

  def _intact(self) -> str:
    steps = self.committed_steps()
    return f"checkpoints {steps} are intact" if steps else "no checkpoint was committed yet"

  def _kept(self) -> str:
    steps = self.committed_steps()
    return (
      f"the last good checkpoint, {self.directory}/{steps[-1]}, is kept"
      if steps
      else "no checkpoint was committed yet"
    )

  @contextlib.contextmanager
  def _save_errors(self, step: int | None):
    """An orbax write failure (this save or an earlier async one) -> one line."""
    try:
      yield
    except CheckpointSaveError:
      raise
    except Exception as e:
      # The failure may be an earlier async save's (orbax waits for it first): the message
      # of the root cause names the step directory being written.
      root = _first_line(_root_cause(e), limit=1000)
      code = getattr(_root_cause(e), "errno", None) or (
        errno.ENOSPC if "No space left" in root else errno.EIO
      )
      when = f" (while saving step {step})" if step is not None else ""
      self._save_error = CheckpointSaveError(
        code, f"a checkpoint save in {self.directory} failed{when}: {root}; {self._intact()}"
      )
      raise self._save_error from None

  def saved_config(self, step: int) -> dict:
    """`{'model': ModelConfig dict, 'run': run config dict}` a checkpoint was written with.

    Raises:
      CorruptCheckpointError: its config file does not read back.
    """
    try:
      return self._mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))[
        "config"
      ]
    except Exception as e:
      raise self._corrupt(step, e) from None

  def saved_model_config(self, step: int) -> ModelConfig:
    """The model config a checkpoint was written with.

    Raises:
      CorruptCheckpointError: its config file does not read back.
    """
    return ModelConfig.from_dict(self.saved_config(step)["model"])

  def restore_data(self, step: int) -> dict:
    """The JSON data item of a checkpoint saved with a dict as `data`.

    Raises:
      CorruptCheckpointError: it does not read back.
    """
    try:
      return self._mngr.restore(step, args=ocp.args.Composite(data=ocp.args.JsonRestore()))["data"]
    except Exception as e:
      raise self._corrupt(step, e) from None

  def restore(
    self, step: int, abstract_state: Any, data_iterator: grain.DatasetIterator | None = None
  ) -> Any:
    """Returns the state (`abstract_state` gives shapes, dtypes and shardings) and moves
    `data_iterator`, if given, to the saved position.

    Raises:
      CorruptCheckpointError: a file of the checkpoint does not read back completely, or
        an array holds NaN/inf.
    """
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    try:
      state = self._mngr.restore(step, args=ocp.args.Composite(**items))["state"]
      state = jax.block_until_ready(state)  # Read errors surface here, not at first use.
    except Exception as e:
      raise self._corrupt(step, e) from None
    bad, total, first = nonfinite_arrays(state)
    if bad:  # Saved by an older version that did not check: not a good checkpoint.
      raise CorruptCheckpointError(
        f"checkpoint step {step} does not restore: {bad} of {total} arrays hold NaN/inf, "
        f"the first is {first}"
      )
    return state

  def _corrupt(self, step: int, e: Exception) -> CorruptCheckpointError:
    step_dir = os.path.join(self.directory, str(step))
    where = _unreadable_metadata(step_dir) or step_dir
    return CorruptCheckpointError(
      f"checkpoint step {step} does not restore: {where}: {_first_line(_root_cause(e))}"
    )

  def set_aside(self, step: int) -> str:
    """Renames checkpoint `step` to `<step>.corrupt[.N]` (kept, no longer a checkpoint)."""
    src = os.path.join(self.directory, str(step))
    dst = _free_name(f"{src}.corrupt")
    os.rename(src, dst)
    self._mngr.reload()
    return dst

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are committed.

    Raises:
      CheckpointSaveError: an asynchronous save failed.
    """
    with self._save_errors(None):
      self._mngr.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and closes; a save error already raised is not raised again."""
    reported = self._save_error is not None
    try:
      self.wait()
    except CheckpointSaveError:
      if not reported:
        raise
    finally:
      try:
        self._mngr.close()
      except Exception:
        if self._save_error is None:
          raise
