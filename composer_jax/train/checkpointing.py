"""Orbax checkpoints of a training run: state, data-iterator position and config.

Layout: `<workdir>/checkpoints/<step>/{state,data,config}`. `state` is the `TrainState`
pytree (params, optimizer state, router bias, step, PRNG key) written by orbax's
`StandardSave` (tensorstore, exact bytes); `data` is the grain iterator position, one JSON
file per process (grain's orbax handler; its state is taken when `save` is called);
`config` is the resolved `ModelConfig` plus the run config, JSON. Saves are
asynchronous (training continues while files are written), keep the newest `keep`
checkpoints, and are atomic (orbax writes a temporary directory and renames it on commit),
so an interrupted save never leaves a half-written step behind.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import grain
import orbax.checkpoint as ocp

from composer_jax.model.config import ModelConfig

# Fields that change numerics or memory but not the parameter tree: a checkpoint written
# under one value restores under another.
_RUNTIME_FIELDS = ("dtype", "remat_policy", "moe_dispatch", "capacity_factor",
                   "ep_capacity_factor", "moe_grouped_matmul", "moe_tile_rows")


def model_config_diff(saved: ModelConfig, current: ModelConfig,
                      ignore: Sequence[str] = ()) -> list[str]:
  """`['hidden_size (checkpoint 64, config 128)', ...]` over the architecture fields."""
  diffs = []
  for f in dataclasses.fields(ModelConfig):
    a, b = getattr(saved, f.name), getattr(current, f.name)
    if f.name not in _RUNTIME_FIELDS + tuple(ignore) and a != b:
      diffs.append(f"{f.name} (checkpoint {a}, config {b})")
  return diffs


def check_same_model(saved: ModelConfig, current: ModelConfig, where: str,
                     ignore: Sequence[str] = ()) -> None:
  """Raises a one-line ValueError naming the differing fields, if any."""
  diffs = model_config_diff(saved, current, ignore)
  if diffs:
    raise ValueError(f"{where} holds a checkpoint of a different model config: "
                     f"{', '.join(diffs)}; use a fresh --workdir or the matching model config")


class Checkpointer:
  """Saves and restores `(TrainState, data-iterator state, config)` under a workdir."""

  def __init__(self, workdir: str, *, keep: int):
    self.directory = os.path.join(os.path.abspath(workdir), "checkpoints")
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           enable_async_checkpointing=True)
    self._mngr = ocp.CheckpointManager(self.directory, options=options,
                                       item_names=("state", "data", "config"))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """True when the JAX distributed runtime has a preemption notice (multi-host jobs)."""
    return self._mngr.reached_preemption(step)

  def save(self, step: int, state: Any, data_iterator: grain.DatasetIterator,
           model_cfg: ModelConfig, run_config: dict) -> None:
    """Starts an asynchronous save; `state` and the iterator position are captured before
    it returns, so training may go on (and donate `state`'s buffers) right away."""
    config = {"model": model_cfg.to_dict(), "run": run_config}
    self._mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(data_iterator),
        config=ocp.args.JsonSave(config)), force=True)

  def saved_model_config(self, step: int) -> ModelConfig:
    """The model config a checkpoint was written with."""
    restored = self._mngr.restore(step, args=ocp.args.Composite(config=ocp.args.JsonRestore()))
    return ModelConfig.from_dict(restored["config"]["model"])

  def restore(self, step: int, abstract_state: Any,
              data_iterator: grain.DatasetIterator | None = None) -> Any:
    """Returns the state (`abstract_state` gives shapes, dtypes and shardings) and moves
    `data_iterator`, if given, to the saved position."""
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    return self._mngr.restore(step, args=ocp.args.Composite(**items))["state"]

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are committed."""
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()
