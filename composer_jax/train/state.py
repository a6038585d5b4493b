"""Training state: everything that must be checkpointed to resume bit-for-bit.

`TrainState` is a pytree (NamedTuple) so one `jax.jit` with `donate_argnums=0` updates it
in place and one orbax `StandardSave` writes it. The data-iterator position and the run
config are stored beside it by `composer_jax.train.checkpointing`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from composer_jax.model import transformer
from composer_jax.model.config import ModelConfig


class TrainState(NamedTuple):
  """One training run's mutable state.

  Attributes:
    step: int32 scalar, optimizer steps taken so far.
    params: trainable parameters (the `'params'` collection of the model).
    router: aux-loss-free router selection bias `{'moe_layers': {'moe': {'bias': [Lm, E]}}}`;
      updated from router counts outside the optimizer (DeepSeek-V3 §2.1.2).
    opt_state: optax state of `optimizer`.
    rng: uint32[2] PRNG key; split once per step for stochastic components.
  """

  step: jax.Array
  params: Any
  router: Any
  opt_state: Any
  rng: jax.Array


def _state(variables: Any, step: Any, opt_init, rng: Any) -> TrainState:
  """The state's fields from `{'params', 'router'}` (arrays or shapes, both callers)."""
  params = variables["params"]
  return TrainState(
    step=step,
    params=params,
    router=variables.get("router", {}),
    opt_state=opt_init(params),
    rng=rng,
  )


def init_state(
  model_cfg: ModelConfig,
  optimizer: optax.GradientTransformation,
  key: jax.Array,
  variables: Any = None,
) -> TrainState:
  """Builds the step-0 state: random init from `key`, or the given `variables`.

  Args:
    model_cfg: the model architecture.
    optimizer: an optax transformation whose state is initialized from the params.
    key: uint32[2] PRNG key; its first half initializes the model, the second is the run's rng.
    variables: optional `{'params', 'router'}` (e.g. an imported HF checkpoint) used instead
      of a random init.
  """
  init_key, rng = jax.random.split(key)
  if variables is None:
    variables = transformer.init(model_cfg, init_key)
  return _state(variables, jnp.zeros((), jnp.int32), optimizer.init, rng)


def abstract_state(
  model_cfg: ModelConfig, optimizer: optax.GradientTransformation, key: jax.Array
) -> TrainState:
  """Shapes and dtypes of `init_state` without allocating (`jax.eval_shape`).

  The model's shapes come from `transformer.shapes` (traced once per config and shared
  with `logical_axes`), so only the optimizer's init is traced here.
  """
  return _state(
    transformer.shapes(model_cfg),
    jax.ShapeDtypeStruct((), jnp.int32),
    lambda params: jax.eval_shape(optimizer.init, params),
    jax.eval_shape(lambda k: jax.random.split(k)[1], key),
  )
