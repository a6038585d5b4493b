"""RL state: what an RL run carries from one step to the next, i.e. what a checkpoint holds."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from composer_jax.model.config import ModelConfig
from composer_jax.rl import teacher_weights
from composer_jax.rl.programs import update_program


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


def initial_state(config, model_cfg: ModelConfig, init: dict) -> RLState:
  """Step 0 of `model_cfg` (the run's `model_config(config.model)`) from `init` = {'params',
  'router'}, placed on the run's mesh."""
  prog = update_program(config, model_cfg)
  state = prog.progs.init(jax.random.PRNGKey(config.train.seed), init)
  ema = teacher_weights.ema_init(state.params) if config.loss.teacher == "ema" else None
  return RLState(
    0, state.params, state.opt_state, ema, np.random.default_rng([config.train.seed, 1])
  )
